//! `ledger-test-child`: the child processes of `tests/ledger.rs`, a helper binary (not a test)
//! so they run the real ledger code in a process of their own, to be killed at any instruction.
//!
//! `ledger-test-child DIR MODE` opens (or creates) the ledger in DIR, prints `ready` when set
//! up, and then, by MODE:
//! - `churn`: joins slice `s` (64 MiB) and charges and uncharges random sizes forever;
//! - `hold-lock`: holds the ledger's cold-path lock for 10 minutes;
//! - `export PATH`: joins slice `x` (1 GiB), is charged 256 MiB and registers them as exported
//!   under the identity of the file PATH (as the shim does for a VMM descriptor), then sleeps;
//! - `import PATH`: joins slice `y` (1 GiB) and registers as an importer of PATH's export, then
//!   sleeps.
//!
//! It dies with the test that started it (`PR_SET_PDEATHSIG`).

use gpuslice_ledger::{Import, Ledger, ShareKey, SliceRequest};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

const MI: u64 = 1 << 20;
const UUID: &str = "GPU-00000000-1111-2222-3333-444444444444";

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(mode)) = (args.next(), args.next()) else {
        eprintln!("usage: ledger-test-child DIR churn|hold-lock");
        std::process::exit(2);
    };
    // Never outlive the test that started us (a failed test must not leave spinners behind).
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let l = Ledger::open_or_create(Path::new(&dir)).unwrap();
    match mode.as_str() {
        "churn" => {
            // Charge and uncharge as fast as possible: a kill lands between any two
            // instructions of the hot path.
            let dev = l.ensure_device(UUID, "test", 64 << 30).unwrap();
            let me = l.attach("s").unwrap();
            l.join(me, dev, &SliceRequest::new(Some("s"), Some(64 * MI)))
                .unwrap();
            let a = l.account(me, dev).unwrap();
            println!("ready");
            let mut held: Vec<u64> = vec![];
            let mut x = std::process::id() as u64 | 1;
            loop {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(2) || held.is_empty() {
                    let n = 1 + x % (4 * MI);
                    if a.try_charge(n) {
                        held.push(n);
                    }
                } else {
                    let n = held.swap_remove((x as usize / 2) % held.len());
                    a.uncharge(n);
                }
            }
        }
        "export" | "import" | "adopt" => {
            let f = std::fs::File::open(args.next().expect("a PATH")).unwrap();
            let key = ShareKey::of_fd(f.as_raw_fd()).unwrap();
            let dev = l.ensure_device(UUID, "test", 64 << 30).unwrap();
            let name = if mode == "export" { "x" } else { "y" };
            let me = l.attach(name).unwrap();
            l.join(me, dev, &SliceRequest::new(Some(name), Some(1 << 30)))
                .unwrap();
            if mode == "export" {
                assert!(l.account(me, dev).unwrap().try_charge(256 * MI));
                assert!(l.share_export(me, dev, key, 256 * MI).unwrap().is_some());
            } else if mode == "import" {
                assert!(matches!(l.share_import(me, key).unwrap(), Import::Held(_)));
            } else {
                // An orphan: charged for it as for an allocation, and its exporter now.
                let got = l.share_import(me, key).unwrap();
                assert!(matches!(got, Import::Adopted { .. }), "{got:?}");
            }
            println!("ready");
            std::thread::sleep(Duration::from_secs(600));
        }
        "hold-lock" => {
            let _g = l.lock().unwrap();
            println!("ready");
            std::thread::sleep(Duration::from_secs(600));
        }
        m => {
            eprintln!("ledger-test-child: unknown mode {m:?}");
            std::process::exit(2);
        }
    }
}
