//! Join secrets of operator slices through the ledger API (what the monitor runs for its
//! socket): a slice made with a secret admits a non-root process only with it; root joins
//! without; the secret lives in a root-only file, never in the policy tenants read, survives a
//! reopen (a monitor restart), and goes with the last slice of its name. A node policy needs
//! root; without it these tests print why and pass vacuously (CI runs as root).

mod common;
use common::{fresh_dir, node_policy, open_node, peer};
use gpuslice_ledger::node::{Admitted, DeviceAsk, Limits, Policy};
use gpuslice_ledger::secret::{Secret, SECRETS_FILE};
use gpuslice_ledger::{Cap, Ledger, LedgerError, OperatorSlice, Share, SliceRequest};
use std::os::unix::fs::PermissionsExt;

const GI: u64 = 1 << 30;
const UUID: &str = "GPU-00000000-0000-0000-0000-00000000005a";
const UUID2: &str = "GPU-00000000-0000-0000-0000-00000000005b";

/// Process `pid` of `uid` asking for slice `name` on `uuid`, with `secret`.
fn join(
    l: &Policy,
    pid: u32,
    uid: u32,
    name: &str,
    uuid: &str,
    secret: Option<&Secret>,
) -> Result<Admitted, LedgerError> {
    l.admit_with_secret(
        &peer(pid, uid),
        name,
        &ask(name, uuid),
        &Limits::default(),
        secret.map(Secret::expose),
    )
}

/// The same through the request of before join secrets (no secret field): [`Policy::admit`].
fn admit(l: &Policy, pid: u32, uid: u32, name: &str, uuid: &str) -> Result<Admitted, LedgerError> {
    l.admit(&peer(pid, uid), name, &ask(name, uuid), &Limits::default())
}

fn op(name: &str, device: &str) -> OperatorSlice {
    OperatorSlice {
        name: name.into(),
        device: device.into(),
        memory: 2 * GI,
        compute_share: Share::NONE,
        compute_cap: Cap::NONE,
        claim: None,
    }
}

/// A new secret and the operator slice `name` on [`UUID`] made with it.
fn secret_slice(l: &Ledger, name: &str) -> Secret {
    let s = Secret::generate().unwrap();
    l.create_operator_slice_with_secret(&op(name, UUID), Some(&s))
        .unwrap();
    s
}

fn ask(name: &str, uuid: &str) -> Vec<DeviceAsk> {
    vec![DeviceAsk {
        uuid: uuid.into(),
        req: SliceRequest::new(Some(name), None),
    }]
}

#[test]
fn a_secret_slice_admits_only_with_its_secret_and_root() {
    let Some((l, _, d)) = node_policy("secret", "admit", &[UUID, UUID2]) else {
        return;
    };
    let s = secret_slice(&l, "claim");
    // Without, and with a wrong secret: refused, naming the slice and the variable.
    let e = join(&l, 10, 1000, "claim", UUID, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("slice \"claim\" requires its secret")
            && e.contains("GPUSLICE_SLICE_SECRET is not set"),
        "{e}"
    );
    let wrong = Secret::generate().unwrap();
    let e = join(&l, 11, 1000, "claim", UUID, Some(&wrong))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match"), "{e}");
    // The old request (no secret field) is the same as none.
    assert!(admit(&l, 12, 1000, "claim", UUID).is_err());
    // Naming it on another device (a new slice of that name) is refused the same way.
    assert!(join(&l, 13, 1000, "claim", UUID2, None).is_err());
    // The right secret: admitted, into the operator's slice with its quota.
    let a = join(&l, 14, 1000, "claim", UUID, Some(&s)).unwrap();
    assert_eq!(a.devices[0].memory_limit, Some(2 * GI));
    // Root joins without it.
    join(&l, 15, 0, "claim", UUID, None).unwrap();
    // A slice without a secret stays open to every uid that names it (as before).
    l.create_operator_slice(&op("open", UUID)).unwrap();
    admit(&l, 16, 2000, "open", UUID).unwrap();

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
    let (l, _) = open_node(&d, &[UUID, UUID2]);
    assert!(join(&l, 17, 1000, "claim", UUID, None).is_err());
    join(&l, 18, 1000, "claim", UUID, Some(&s)).unwrap();
}

#[test]
fn a_secret_goes_with_the_last_slice_of_its_name() {
    let Some((l, t, _d)) = node_policy("secret", "prune", &[UUID, UUID2]) else {
        return;
    };
    let s = secret_slice(&l, "c");
    join(&l, 20, 1000, "c", UUID, Some(&s)).unwrap();
    // Removed while a process uses it: the slice lingers with its process, and so does the
    // secret (a newcomer cannot slip in without it).
    assert_eq!(l.remove_slice("c").unwrap(), 0);
    assert!(join(&l, 21, 1000, "c", UUID, None).is_err());
    // Its process gone and reaped: the slice and the secret go.
    l.reap_node(&|_| false, t.as_ref()).unwrap();
    assert_eq!(l.slice_secret("c").unwrap(), None);
    // A new slice of that name without a secret is open again.
    l.create_operator_slice(&op("c", UUID)).unwrap();
    admit(&l, 22, 2000, "c", UUID).unwrap();
    // A failed creation (it does not fit) leaves no secret behind.
    let mut big = op("big", UUID2);
    big.memory = 64 * GI;
    assert!(l.create_operator_slice_with_secret(&big, Some(&s)).is_err());
    assert_eq!(l.slice_secret("big").unwrap(), None);
}

#[test]
fn personal_mode_has_no_secrets() {
    let d = fresh_dir("secret", "personal");
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
}
