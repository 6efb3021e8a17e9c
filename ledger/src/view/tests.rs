use super::*;
use crate::ledger::{OperatorSlice, SliceRequest};
use crate::procfs::own_pid_identity;

/// The directory of one test, not there yet (a leftover of an earlier run is removed).
fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-view-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const UUID: &str = "GPU-00000000-0000-0000-0000-0000000000aa";

/// A new ledger in [`dir`]`(tag)` with the one device [`UUID`] of `total` bytes.
fn ledger(tag: &str, total: u64) -> (std::path::PathBuf, Ledger, usize) {
    let d = dir(tag);
    let l = Ledger::open_or_create(&d).unwrap();
    let dev = l.ensure_device(UUID, "Fake", total).unwrap();
    (d, l, dev)
}

#[test]
fn missing_ledger_is_none_and_nothing_is_created() {
    let d = dir("missing");
    assert!(ReadOnlyLedger::open(&d).unwrap().is_none());
    assert!(!d.exists());
    std::fs::create_dir_all(&d).unwrap();
    assert!(ReadOnlyLedger::open(&d).unwrap().is_none());
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    // A file, not a directory, where the directory should be: refused like a planted
    // symlink (the runtime directory's checks, dir.rs), not read as "no ledger".
    let f = d.join("plain");
    std::fs::write(&f, b"x").unwrap();
    assert!(matches!(
        ReadOnlyLedger::open(&f),
        Err(LedgerError::UnsafeDir { .. })
    ));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sees_slices_usage_and_processes_without_writing() {
    let (d, l, dev) = ledger("slices", 16 << 30);
    l.create_operator_slice(&OperatorSlice {
        name: "op".into(),
        device: UUID.into(),
        memory: 2 << 30,
        compute_share: Share::from_ppm(250_000),
        compute_cap: Cap::NONE,
        claim: None,
    })
    .unwrap();
    let me = l.attach("op").unwrap();
    l.join(me, dev, &SliceRequest::new(Some("op"), None))
        .unwrap();
    assert!(l.account(me, dev).unwrap().try_charge(300 << 20));

    let before = std::fs::read(l.path()).unwrap();
    let ro = ReadOnlyLedger::open(&d).unwrap().unwrap();
    assert!(ro.is_current(&d));
    for v in [ro.view(), View::of(&l)] {
        let di = v.find_device(UUID.as_bytes()).unwrap();
        assert_eq!(di, dev);
        assert!(v.find_device(b"GPU-nope").is_none());
        let dv = v.device(di).unwrap();
        assert_eq!((dv.memory_total, dv.memory_reserved), (16 << 30, 2 << 30));
        let si = v.find_slice(b"op", di).unwrap();
        assert!(v.find_slice(b"o", di).is_none() && v.find_slice(b"op", di + 1).is_none());
        let s = v.slice(si).unwrap();
        assert_eq!(s.memory_limit, Some(2 << 30));
        assert_eq!(s.memory_used, 300 << 20);
        assert_eq!(s.compute_share.ppm(), 250_000);
        assert!(s.operator_defined && !s.private);
        let members: Vec<usize> = v.members(si).collect();
        assert_eq!(members, vec![me.slot]);
        let p = v.process(me.slot, di).unwrap();
        assert_eq!(p.pid, std::process::id());
        assert_eq!(p.slice, Some(si));
        assert_eq!(p.charged, 300 << 20);
        assert_eq!((p.pid_ns, p.outer_pid), own_pid_identity());
        assert!(p.pid_ns != 0);
        assert!(v.is_alive(me.slot));
        assert!(!v.is_alive(me.slot + 1) && !v.is_alive(usize::MAX));
        assert_eq!(PidMap::new().pid_here(&p), Some(std::process::id()));
    }
    drop(ro);
    // Nothing was written: the file is byte for byte what it was (usage unchanged).
    assert_eq!(std::fs::read(l.path()).unwrap(), before);
    l.account(me, dev).unwrap().uncharge(300 << 20);
    l.detach(me).unwrap();
    let ro = ReadOnlyLedger::open(&d).unwrap().unwrap();
    let v = ro.view();
    assert!(!v.is_alive(me.slot));
    assert_eq!(v.members(v.find_slice(b"op", dev).unwrap()).count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_replaced_ledger_is_noticed() {
    let d = dir("replaced");
    drop(Ledger::open_or_create(&d).unwrap());
    let ro = ReadOnlyLedger::open(&d).unwrap().unwrap();
    assert!(ro.is_current(&d));
    std::fs::remove_file(d.join("ledger")).unwrap();
    assert!(!ro.is_current(&d));
    drop(Ledger::open_or_create(&d).unwrap());
    assert!(!ro.is_current(&d));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn hostile_records_are_bounded() {
    let (d, l, dev) = ledger("hostile", 8 << 30);
    let me = l.attach("x").unwrap();
    let j = l
        .join(me, dev, &SliceRequest::new(Some("x"), Some(1 << 30)))
        .unwrap();
    // What a hostile writer could leave: usage past the quota, a slice on device 9999,
    // a process pointing at slice 70000, reserved past the device, a share past 1.0.
    let s = &l.slices()[j.slice];
    s.memory_used.0.store(u64::MAX, Relaxed);
    s.compute_share_ppm.store(u32::MAX, Relaxed);
    l.devices()[dev].memory_reserved.store(u64::MAX, Relaxed);
    l.devices()[dev].best_effort_used.store(u64::MAX, Relaxed);
    l.procs()[me.slot].devices[dev].slice.store(70_000, Relaxed);
    let ro = ReadOnlyLedger::open(&d).unwrap().unwrap();
    let v = ro.view();
    let sv = v.slice(j.slice).unwrap();
    assert_eq!(sv.memory_used, 1 << 30);
    assert_eq!(sv.compute_share.ppm(), PPM);
    let dv = v.device(dev).unwrap();
    assert_eq!((dv.memory_reserved, dv.best_effort_used), (8 << 30, 0));
    assert_eq!(dv.best_effort_free(), 0);
    assert_eq!(v.process(me.slot, dev).unwrap().slice, None);
    assert!(v.process(me.slot, MAX_DEVICES).is_none());
    assert!(v.slice(MAX_SLICES).is_none() && v.device(MAX_DEVICES).is_none());
    assert_eq!(v.members(MAX_SLICES + 3).count(), 0);
    s.device.store(9999, Relaxed);
    assert!(v.slice(j.slice).is_none());
    assert_eq!(v.members(j.slice).count(), 0);
    assert_eq!(v.slice_charged(j.slice), 0);
    // A process record naming a pid that is not the process it claims: never shown.
    let fake = ProcView {
        slot: 0,
        pid: std::process::id(),
        pid_ns: own_pid_identity().0,
        outer_pid: 0,
        start_time: 12345,
        slice: None,
        charged: 0,
    };
    let mut pm = PidMap::new();
    assert_eq!(pm.pid_here(&fake), None);
    let other_ns = ProcView { pid_ns: 1, ..fake };
    assert_eq!(pm.pid_here(&other_ns), None);
    std::fs::remove_dir_all(&d).unwrap();
}
