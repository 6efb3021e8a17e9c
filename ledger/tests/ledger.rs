//! The ledger through real processes and threads: creation races, version checks, admission,
//! exact quotas under contention, exact reclamation after SIGKILL at arbitrary instructions,
//! and a lock holder that dies.
//!
//! Child processes are `ledger-test-child` (`tests/helpers/child.rs`, a helper binary of this
//! crate), so they run the real ledger code in a separate process.

mod common;
use common::{fresh_dir, Scratch};
use gpuslice_ledger::{Cap, Ledger, LedgerError, OperatorSlice, Share, SliceRequest};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const MI: u64 = 1 << 20;
const UUID: &str = "GPU-00000000-1111-2222-3333-444444444444";

fn dir(tag: &str) -> Scratch {
    fresh_dir("ledger-test", tag)
}

/// A new ledger in [`dir`]`(tag)` with the one device [`UUID`] of `total` bytes.
fn ledger(tag: &str, total: u64) -> (Scratch, Ledger, usize) {
    let d = dir(tag);
    let l = Ledger::open_or_create(&d).unwrap();
    let dev = l.ensure_device(UUID, "test", total).unwrap();
    (d, l, dev)
}

/// Operator slice `name` on [`UUID`] with the quota `memory`, no guarantee and no cap.
fn operator(name: &str, memory: u64) -> OperatorSlice {
    OperatorSlice {
        name: name.into(),
        device: UUID.into(),
        memory,
        compute_share: Share::NONE,
        compute_cap: Cap::NONE,
        claim: None,
    }
}

fn child(dir: &Path, mode: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ledger-test-child"))
        .arg(dir)
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Wait (at most 60 s) for the child to print `ready`.
fn wait_line(c: &mut Child) {
    use std::io::BufRead;
    let out = c.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = std::io::BufReader::new(out);
        let mut l = String::new();
        while out.read_line(&mut l).unwrap_or(0) > 0 {
            if l.contains("ready") {
                let _ = tx.send(());
                return;
            }
            l.clear();
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = c.kill();
        panic!("child never became ready");
    }
}

#[test]
fn creation_races_end_with_one_ledger() {
    let d = dir("race");
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let d = d.to_path_buf();
            std::thread::spawn(move || {
                let l = Ledger::open_or_create(&d).unwrap();
                l.ensure_device(UUID, "test", 8 << 30).unwrap()
            })
        })
        .collect();
    let idx: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        idx.iter().all(|&i| i == idx[0]),
        "one device record for one UUID: {idx:?}"
    );
    let names: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ledger"], "no temporary files left");
}

#[test]
fn a_foreign_or_other_version_file_is_a_clear_error() {
    use std::os::unix::fs::FileExt;
    let d = dir("version");
    drop(Ledger::open_or_create(&d).unwrap());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("ledger"))
        .unwrap();
    f.write_all_at(&99u32.to_ne_bytes(), 8).unwrap();
    let e = Ledger::open(&d).err().expect("refused");
    assert!(matches!(e, LedgerError::Incompatible { .. }), "{e}");
    assert!(e.to_string().contains("layout version 99"), "{e}");
    f.write_all_at(b"NOTALEDG", 0).unwrap();
    let e = Ledger::open_or_create(&d).err().expect("refused");
    assert!(e.to_string().contains("not a gpuslice ledger"), "{e}");
    f.set_len(10).unwrap();
    assert!(Ledger::open(&d).is_err());
    let e = Ledger::open(&dir("missing")).err().unwrap();
    assert!(matches!(e, LedgerError::NotFound(_)), "{e}");
}

#[test]
fn admission_reservations_and_best_effort() {
    let (_d, l, dev) = ledger("admission", 1000 * MI);
    let p1 = l.attach("").unwrap();
    l.join(p1, dev, &SliceRequest::new(None, Some(600 * MI)))
        .unwrap();
    let p2 = l.attach("").unwrap();
    let e = l
        .join(p2, dev, &SliceRequest::new(None, Some(500 * MI)))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("memory: requested 500 MiB, available 400 MiB on {UUID}")
    );
    // Best effort: capped at what is not reserved.
    l.join(p2, dev, &SliceRequest::new(None, None)).unwrap();
    let be = l.account(p2, dev).unwrap();
    assert!(!be.is_quota());
    assert_eq!(be.limit(), 400 * MI);
    assert!(be.try_charge(300 * MI));
    assert!(!be.try_charge(101 * MI));
    // A new reservation cannot take what best effort holds.
    let p3 = l.attach("").unwrap();
    let e = l
        .join(p3, dev, &SliceRequest::new(None, Some(200 * MI)))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("requested 200 MiB, available 100 MiB"),
        "{e}"
    );
    // Compute guarantees add up to at most 1.
    let mut r = SliceRequest::new(Some("cpu"), None);
    r.compute_share = Share::from_ppm(700_000);
    l.join(p3, dev, &r).unwrap();
    let p4 = l.attach("").unwrap();
    let mut r = SliceRequest::new(Some("cpu2"), None);
    r.compute_share = Share::from_ppm(400_000);
    let e = l.join(p4, dev, &r).unwrap_err();
    assert!(
        e.to_string()
            .contains("compute share: requested 0.40, available 0.30"),
        "{e}"
    );
    // Leaving returns reservations.
    l.detach(p1).unwrap();
    l.join(p4, dev, &SliceRequest::new(None, Some(500 * MI)))
        .unwrap();
}

#[test]
fn operator_slices_persist_and_win() {
    let (_d, l, dev) = ledger("operator", 1000 * MI);
    let spec = |m| operator("team", m);
    l.create_operator_slice(&spec(100 * MI)).unwrap();
    assert!(matches!(
        l.create_operator_slice(&spec(100 * MI)),
        Err(LedgerError::Exists(_))
    ));
    assert!(l
        .create_operator_slice(&OperatorSlice {
            memory: 2000 * MI,
            name: "big".into(),
            ..spec(0)
        })
        .is_err());
    let p = l.attach("team").unwrap();
    let j = l
        .join(p, dev, &SliceRequest::new(Some("team"), Some(900 * MI)))
        .unwrap();
    assert_eq!(
        j.memory_limit,
        Some(100 * MI),
        "the operator's quota, not the process's"
    );
    assert_eq!(j.warnings.len(), 1);
    l.detach(p).unwrap();
    assert_eq!(l.snapshot().slices.len(), 1, "persists when empty");
    assert_eq!(l.remove_slice("team").unwrap(), 1);
    assert!(l.snapshot().slices.is_empty());
    assert_eq!(l.snapshot().devices[0].memory_reserved, 0);
    assert!(matches!(
        l.remove_slice("team"),
        Err(LedgerError::NoSuchSlice(_))
    ));
}

#[test]
fn threads_of_many_processes_never_exceed_the_quota() {
    let d = dir("contend");
    let quota = 64 * MI;
    let stop = AtomicBool::new(false);
    {
        let l = Ledger::open_or_create(&d).unwrap();
        l.ensure_device(UUID, "test", 1 << 40).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let (d, stop) = (&d, &stop);
            s.spawn(move || {
                // Each thread its own open file description: as separate processes would be.
                let l = Ledger::open_or_create(d).unwrap();
                let dev = l.find_device(UUID).unwrap();
                let me = l.attach("shared").unwrap();
                l.join(me, dev, &SliceRequest::new(Some("shared"), Some(quota)))
                    .unwrap();
                let a = l.account(me, dev).unwrap();
                let mut held = vec![];
                let mut x = t * 7919 + 1;
                while !stop.load(Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if (x >> 33) % 2 == 0 {
                        let n = 1 + (x >> 20) % (8 * MI);
                        if a.try_charge(n) {
                            held.push(n);
                        }
                    } else if let Some(n) = held.pop() {
                        a.uncharge(n);
                    }
                }
                for n in held {
                    a.uncharge(n);
                }
                l.detach(me).unwrap();
            });
        }
        let l = Ledger::open(&d).unwrap();
        let t = Instant::now();
        let mut max = 0;
        while t.elapsed() < Duration::from_millis(800) {
            for s in l.snapshot().slices {
                assert!(s.memory_used <= quota, "{} above {quota}", s.memory_used);
                max = max.max(s.memory_used);
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(max > quota / 2, "contention reached the quota: {max}");
    });
    let l = Ledger::open(&d).unwrap();
    assert!(
        l.snapshot().slices.is_empty(),
        "the last leaver removed the slice"
    );
    assert_eq!(l.snapshot().devices[0].memory_reserved, 0);
}

#[test]
fn sigkill_at_any_instruction_returns_exactly_what_the_dead_held() {
    let (d, l, dev) = ledger("sigkill", 64 << 30);
    l.create_operator_slice(&operator("s", 64 * MI)).unwrap();
    // A live member of the slice keeps churning in this process while others die and are
    // reaped: the reaper must not take anything from it.
    let me = l.attach("s").unwrap();
    l.join(me, dev, &SliceRequest::new(Some("s"), None))
        .unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let live = sc.spawn(|| {
            let a = l.account(me, dev).unwrap();
            let mut held = vec![];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if !i.is_multiple_of(3) {
                    if a.try_charge(MI + i % 1000) {
                        held.push(MI + i % 1000);
                    }
                } else if let Some(n) = held.pop() {
                    a.uncharge(n);
                }
            }
            held.iter().sum::<u64>()
        });
        // Stop the live thread even when an assertion below fails (the scope would wait forever).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let mut seed = 88172645463325252u64;
        for round in 0..40 {
            let mut kids: Vec<Child> = (0..3).map(|_| child(&d, "churn")).collect();
            for k in &mut kids {
                wait_line(k);
            }
            for k in &mut kids {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                std::thread::sleep(Duration::from_micros(seed % 3000));
                k.kill().unwrap();
                k.wait().unwrap();
            }
            // A death the double collect cannot yet tell from the live member's update in
            // flight (that thread preempted mid-update on a busy host) is left for the next
            // reap, never guessed: reap until all three are back (the deadline only stops a
            // hang).
            let mut reaped = vec![];
            let t = Instant::now();
            while reaped.len() < 3 {
                reaped.extend(l.reap_dead().unwrap().processes);
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "round {round}: {reaped:?} of 3 reaped"
                );
                std::thread::yield_now();
            }
            assert_eq!(reaped.len(), 3, "round {round}: {reaped:?}");
            // Exact: the slice counter equals what the live member holds, read while it is
            // between updates (it may be mid-update at any single read, so compare a stable pair).
            let a = l.account(me, dev).unwrap();
            let t = Instant::now();
            loop {
                let (u, c) = (a.used(), a.charged());
                if u == c && a.used() == u {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "round {round}: slice {u} vs live {c}"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        let held = live.join().unwrap();
        let a = l.account(me, dev).unwrap();
        assert_eq!(a.used(), held);
        assert_eq!(a.charged(), held);
    });
}

#[test]
fn a_lock_holder_killed_does_not_hang_anyone() {
    let d = dir("lockdeath");
    let l = Ledger::open_or_create(&d).unwrap();
    let mut k = child(&d, "hold-lock");
    wait_line(&mut k);
    k.kill().unwrap();
    k.wait().unwrap();
    let t = Instant::now();
    let g = l.lock().expect("robust mutex recovered");
    drop(g);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(l.header().mutex_recoveries.load(Ordering::Relaxed), 1);
    // A live holder that never lets go: a timeout error, not a hang.
    let mut k = child(&d, "hold-lock");
    wait_line(&mut k);
    let t = Instant::now();
    let e = l.lock().err().expect("times out");
    assert!(matches!(e, LedgerError::LockTimeout { .. }), "{e}");
    // The message names the holder, so an operator knows what to resume or end.
    assert!(e.to_string().contains(&format!("pid {}", k.id())), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30));
    k.kill().unwrap();
    k.wait().unwrap();
}

/// `members` is the one walk over raw process records: each active process's devices, each
/// once, a slice word out of the table's range read as no slice, a detached process not at all.
#[test]
fn members_walks_active_processes_and_bounds_what_they_wrote() {
    const OTHER: &str = "GPU-99999999-1111-2222-3333-444444444444";
    let (_d, l, a) = ledger("members", 1000 * MI);
    let b = l.ensure_device(OTHER, "test", 1000 * MI).unwrap();
    let p1 = l.attach("").unwrap();
    let s1 = l
        .join(p1, a, &SliceRequest::new(None, Some(100 * MI)))
        .unwrap()
        .slice;
    let s2 = l
        .join(p1, b, &SliceRequest::new(None, Some(100 * MI)))
        .unwrap()
        .slice;
    let p2 = l.attach("").unwrap();
    let s3 = l.join(p2, a, &SliceRequest::new(None, None)).unwrap().slice;
    let gone = l.attach("").unwrap();
    l.join(gone, b, &SliceRequest::new(None, Some(100 * MI)))
        .unwrap();
    l.detach(gone).unwrap();

    let seen = |l: &Ledger| -> Vec<(usize, usize, Option<usize>)> {
        l.members().map(|m| (m.slot, m.device, m.slice)).collect()
    };
    assert_eq!(
        seen(&l),
        vec![
            (p1.slot, a, Some(s1)),
            (p1.slot, b, Some(s2)),
            (p2.slot, a, Some(s3))
        ]
    );
    assert_eq!(l.slice_of(p1.slot, b), Some(s2));
    assert!(l.has_active_pid(std::process::id()));

    // A record scribbled past the slice table names no slice.
    l.procs()[p2.slot].devices[a]
        .slice
        .store(u32::MAX - 7, Ordering::SeqCst);
    assert_eq!(l.slice_of(p2.slot, a), None);
    assert!(seen(&l)
        .iter()
        .all(|&(slot, _, s)| slot != p2.slot || s.is_none()));
    assert_eq!(l.slice_of(usize::MAX, 0), None);
    assert_eq!(l.slice_of(p1.slot, usize::MAX), None);
}
