//! Join secrets of operator slices through the ledger API (what the monitor runs for its
//! socket): a slice made with a secret admits a non-root process only with it; root joins
//! without; the secret lives in a root-only file, never in the policy tenants read, survives a
//! reopen (a monitor restart), and goes with the last slice of its name. A node policy needs
//! root; without it these tests print why and pass vacuously (CI runs as root).

mod common;
use common::{is_root, peer, Table};
use gpuslice_ledger::node::{DeviceAsk, Limits};
use gpuslice_ledger::secret::{Secret, SECRETS_FILE};
use gpuslice_ledger::{Ledger, OperatorSlice, SliceRequest, PPM};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

const GI: u64 = 1 << 30;
const UUID: &str = "GPU-00000000-0000-0000-0000-00000000005a";
const UUID2: &str = "GPU-00000000-0000-0000-0000-00000000005b";

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-secret-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn node(d: &std::path::Path) -> Ledger {
    let l = Ledger::open_or_create_node(d).unwrap();
    l.ensure_device(UUID, "Fake", 16 * GI).unwrap();
    l.ensure_device(UUID2, "Fake", 16 * GI).unwrap();
    l.set_regions(Arc::new(Table::default()));
    l
}

fn op(name: &str, device: &str) -> OperatorSlice {
    OperatorSlice {
        name: name.into(),
        device: device.into(),
        memory: 2 * GI,
        compute_share_ppm: 0,
        compute_cap_ppm: PPM,
        claim: None,
    }
}

fn ask(name: &str, uuid: &str) -> Vec<DeviceAsk> {
    vec![DeviceAsk {
        uuid: uuid.into(),
        req: SliceRequest::new(Some(name), None),
    }]
}

#[test]
fn a_secret_slice_admits_only_with_its_secret_and_root() {
    if !is_root() {
        println!("skipped: a node policy needs root");
        return;
    }
    let d = dir("admit");
    let l = node(&d);
    let lim = Limits::default();
    let s = Secret::generate().unwrap();
    l.create_operator_slice_with_secret(&op("claim", UUID), Some(&s))
        .unwrap();
    // Without, and with a wrong secret: refused, naming the slice and the variable.
    let e = l
        .admit_with_secret(&peer(10, 1000), "claim", &ask("claim", UUID), &lim, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("slice \"claim\" requires its secret")
            && e.contains("GPUSLICE_SLICE_SECRET is not set"),
        "{e}"
    );
    let wrong = Secret::generate().unwrap();
    let e = l
        .admit_with_secret(
            &peer(11, 1000),
            "claim",
            &ask("claim", UUID),
            &lim,
            Some(wrong.expose()),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match"), "{e}");
    // The old request (no secret field) is the same as none.
    assert!(l
        .admit(&peer(12, 1000), "claim", &ask("claim", UUID), &lim)
        .is_err());
    // Naming it on another device (a new slice of that name) is refused the same way.
    assert!(l
        .admit_with_secret(&peer(13, 1000), "claim", &ask("claim", UUID2), &lim, None)
        .is_err());
    // The right secret: admitted, into the operator's slice with its quota.
    let a = l
        .admit_with_secret(
            &peer(14, 1000),
            "claim",
            &ask("claim", UUID),
            &lim,
            Some(s.expose()),
        )
        .unwrap();
    assert_eq!(a.devices[0].memory_limit, Some(2 * GI));
    // Root joins without it.
    l.admit_with_secret(&peer(15, 0), "claim", &ask("claim", UUID), &lim, None)
        .unwrap();
    // A slice without a secret stays open to every uid that names it (as before).
    l.create_operator_slice(&op("open", UUID)).unwrap();
    l.admit(&peer(16, 2000), "open", &ask("open", UUID), &lim)
        .unwrap();

    // The secret is in a root-only file, not in the policy tenants map.
    let f = d.join(SECRETS_FILE);
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let policy = std::fs::read(d.join("ledger")).unwrap();
    assert!(!policy
        .windows(s.expose().len())
        .any(|w| w == s.expose().as_bytes()));
    assert_eq!(l.slice_secret("claim").unwrap().as_ref(), Some(&s));
    assert_eq!(l.slice_secret("open").unwrap(), None);

    // One name, one secret: the same name on a second device needs the same secret.
    let e = l
        .create_operator_slice_with_secret(&op("claim", UUID2), Some(&wrong))
        .unwrap_err()
        .to_string();
    assert!(e.contains("one name has one secret"), "{e}");
    assert!(l.create_operator_slice(&op("claim", UUID2)).is_err());
    l.create_operator_slice_with_secret(&op("claim", UUID2), Some(&s))
        .unwrap();
    let e = l
        .create_operator_slice_with_secret(&op("open", UUID2), Some(&s))
        .unwrap_err()
        .to_string();
    assert!(e.contains("without a secret"), "{e}");

    // Reopened (a monitor restart): the secret still holds.
    drop(l);
    let l = node(&d);
    assert!(l
        .admit_with_secret(&peer(17, 1000), "claim", &ask("claim", UUID), &lim, None)
        .is_err());
    l.admit_with_secret(
        &peer(18, 1000),
        "claim",
        &ask("claim", UUID),
        &lim,
        Some(s.expose()),
    )
    .unwrap();
    drop(l);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_secret_goes_with_the_last_slice_of_its_name() {
    if !is_root() {
        println!("skipped: a node policy needs root");
        return;
    }
    let d = dir("prune");
    let l = node(&d);
    let t = Arc::new(Table::default());
    l.set_regions(t.clone());
    let lim = Limits::default();
    let s = Secret::generate().unwrap();
    l.create_operator_slice_with_secret(&op("c", UUID), Some(&s))
        .unwrap();
    l.admit_with_secret(
        &peer(20, 1000),
        "c",
        &ask("c", UUID),
        &lim,
        Some(s.expose()),
    )
    .unwrap();
    // Removed while a process uses it: the slice lingers with its process, and so does the
    // secret (a newcomer cannot slip in without it).
    assert_eq!(l.remove_slice("c").unwrap(), 0);
    assert!(l
        .admit_with_secret(&peer(21, 1000), "c", &ask("c", UUID), &lim, None)
        .is_err());
    // Its process gone and reaped: the slice and the secret go.
    l.reap_node(&|_| false, t.as_ref()).unwrap();
    assert_eq!(l.slice_secret("c").unwrap(), None);
    // A new slice of that name without a secret is open again.
    l.create_operator_slice(&op("c", UUID)).unwrap();
    l.admit(&peer(22, 2000), "c", &ask("c", UUID), &lim)
        .unwrap();
    // A failed creation (it does not fit) leaves no secret behind.
    let mut big = op("big", UUID2);
    big.memory = 64 * GI;
    assert!(l.create_operator_slice_with_secret(&big, Some(&s)).is_err());
    assert_eq!(l.slice_secret("big").unwrap(), None);
    drop(l);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn personal_mode_has_no_secrets() {
    let d = dir("personal");
    let l = Ledger::open_or_create(&d).unwrap();
    if l.is_node() {
        return;
    }
    l.ensure_device(UUID, "Fake", 16 * GI).unwrap();
    let e = l
        .create_operator_slice_with_secret(&op("p", UUID), Some(&Secret::generate().unwrap()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("node mode only"), "{e}");
    assert!(l.snapshot().slices.is_empty(), "nothing was created");
    assert!(!d.join(SECRETS_FILE).exists());
    drop(l);
    std::fs::remove_dir_all(&d).unwrap();
}
