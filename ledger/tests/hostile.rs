//! Values a tenant scribbled into the ledger are untrusted input: the cases (a slice
//! whose device index is 9999, a dead process whose account index is 70000) are skipped and
//! reported, never a panic, and new processes still attach and join.

mod common;
use common::{fresh_dir, Scratch};
use gpuslice_ledger::layout::*;
use gpuslice_ledger::{Ledger, SliceRequest};
use std::sync::atomic::Ordering::SeqCst;

const MI: u64 = 1 << 20;

/// A new ledger in its own directory for test `tag`, with one 8 GiB device of UUID `uuid`.
fn ledger(tag: &str, uuid: &str) -> (Scratch, Ledger, usize) {
    let d = fresh_dir("hostile", tag);
    let l = Ledger::open_or_create(&d).unwrap();
    let dev = l.ensure_device(uuid, "Fake", 8 << 30).unwrap();
    (d, l, dev)
}

/// A newcomer still attaches to `l`, joins a slice with a quota on `dev` and charges it.
fn a_newcomer_works(l: &Ledger, dev: usize) {
    let p = l.attach("").unwrap();
    l.join(p, dev, &SliceRequest::new(None, Some(MI))).unwrap();
    assert!(l.account(p, dev).unwrap().try_charge(MI));
    l.detach(p).unwrap();
}

#[test]
fn a_slice_on_device_9999_is_skipped_and_reported() {
    let (d, l, dev) = ledger("device", "GPU-00000000-0000-0000-0000-000000000001");
    let me = l.attach("").unwrap();
    let j = l
        .join(me, dev, &SliceRequest::new(Some("bad"), Some(MI)))
        .unwrap();
    l.slices()[j.slice].device.store(9999, SeqCst);
    let snap = l.snapshot();
    assert!(snap.slices.is_empty(), "{:?}", snap.slices);
    assert!(
        snap.problems
            .iter()
            .any(|p| p.contains("device index 9999")),
        "{:?}",
        snap.problems
    );
    // Reaping, leaving and a newcomer all keep working.
    l.reap_dead().unwrap();
    l.detach(me).unwrap();
    let other = Ledger::open(&d).unwrap();
    a_newcomer_works(&other, dev);
    drop((l, other));
}

#[test]
fn a_dead_process_with_account_70000_does_not_stop_new_processes() {
    let (_d, l, dev) = ledger("account", "GPU-00000000-0000-0000-0000-000000000002");
    // A record of a process that is gone (no liveness lock), its account scribbled.
    let dead = &l.procs()[7];
    dead.pid.store(4242, SeqCst);
    for pd in &dead.devices {
        pd.slice.store(u32::MAX, SeqCst);
        pd.account.store(u32::MAX, SeqCst);
    }
    dead.devices[dev].account.store(70000, SeqCst);
    dead.devices[dev].slice.store(70001, SeqCst);
    dead.devices[dev].charged.store(u64::MAX, SeqCst);
    dead.state.store(STATE_ACTIVE, SeqCst);
    let snap = l.snapshot();
    assert!(
        snap.problems.iter().any(|p| p.contains("70001")),
        "{:?}",
        snap.problems
    );
    let r = l.reap_dead().unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("account index 70000")),
        "{:?}",
        r.problems
    );
    assert_eq!(
        dead.state.load(SeqCst),
        STATE_FREE,
        "the bad record is freed"
    );
    a_newcomer_works(&l, dev);
}

#[test]
fn an_own_record_with_a_bad_slice_index_is_refused_not_used() {
    let (_d, l, dev) = ledger("own", "GPU-00000000-0000-0000-0000-000000000003");
    let me = l.attach("").unwrap();
    l.procs()[me.slot].devices[dev].slice.store(50_000, SeqCst);
    l.procs()[me.slot].devices[dev]
        .account
        .store(50_000, SeqCst);
    assert!(l.join(me, dev, &SliceRequest::new(None, Some(MI))).is_err());
    assert!(l.account(me, dev).is_none());
    l.detach(me).unwrap();
}
