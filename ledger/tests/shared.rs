//! Exported VMM allocations (`layout::Shared`) through real processes: the exporter's slice
//! stays charged while a live importer holds the memory, past the exporter's release and its
//! SIGKILL, and the charge goes back when the last importer lets go or dies.
//!
//! The exporter and importer are `ledger-test-child` processes (`tests/helpers/child.rs`,
//! modes `export` and `import`), keyed by the identity of a scratch file as the shim keys a
//! VMM descriptor; this test process reaps, as the monitor does.

mod common;
use common::{fresh_dir, Scratch};
use gpuslice_ledger::{Import, Ledger, LetGo, ProcHandle, ShareKey, SliceRequest};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};

const MI: u64 = 1 << 20;
const UUID: &str = "GPU-00000000-1111-2222-3333-444444444444";

fn child(dir: &Scratch, mode: &str, key: &std::path::Path) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ledger-test-child"))
        .arg(&**dir)
        .arg(mode)
        .arg(key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut l = String::new();
    while out.read_line(&mut l).unwrap_or(0) > 0 && !l.contains("ready") {
        l.clear();
    }
    assert!(l.contains("ready"), "{mode} child never became ready");
    c
}

fn kill(c: &mut Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

/// Slice `name`'s bytes in use, `None` once the slice is gone.
fn used(l: &Ledger, name: &str) -> Option<u64> {
    l.snapshot()
        .slices
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.memory_used)
}

fn setup(tag: &str) -> (Scratch, Ledger, std::path::PathBuf) {
    let d = fresh_dir("shared-test", tag);
    let l = Ledger::open_or_create(&d).unwrap();
    l.ensure_device(UUID, "test", 64 << 30).unwrap();
    let key = d.join("descriptor");
    std::fs::write(&key, b"").unwrap();
    (d, l, key)
}

#[test]
fn a_killed_exporter_stays_charged_until_its_last_importer_dies() {
    let (d, l, key) = setup("killed-exporter");
    let mut x = child(&d, "export", &key);
    let mut i1 = child(&d, "import", &key);
    let mut i2 = child(&d, "import", &key);
    assert_eq!(used(&l, "x"), Some(256 * MI));
    assert_eq!(
        used(&l, "y"),
        Some(0),
        "importing charges the importer nothing"
    );
    kill(&mut x);
    let r = l.reap_dead().unwrap();
    assert_eq!(r.processes.len(), 1);
    assert_eq!(used(&l, "x"), Some(256 * MI), "two importers hold it");
    let snap = l.snapshot();
    assert_eq!(snap.shared.len(), 1);
    assert_eq!(
        (snap.shared[0].exporter, snap.shared[0].held),
        (None, 256 * MI)
    );
    kill(&mut i1);
    l.reap_dead().unwrap();
    assert_eq!(used(&l, "x"), Some(256 * MI), "one importer holds it");
    kill(&mut i2);
    let r = l.reap_dead().unwrap();
    assert_eq!(
        used(&l, "x"),
        None,
        "the charge went, and the slice it kept: {r:?}"
    );
    assert!(r.slices_removed.iter().any(|s| s.name == "x"), "{r:?}");
    assert!(l.snapshot().shared.is_empty());
}

#[test]
fn an_exporter_that_lets_go_hands_its_charge_to_the_record() {
    let (d, l, key) = setup("let-go");
    let (me, dev) = joined(&l, "x", 1 << 30);
    let a = l.account(me, dev).unwrap();
    assert!(a.try_charge(256 * MI));
    let k = key_of(&key);
    let rec = l.share_export(me, dev, k, 256 * MI).unwrap().unwrap();
    assert_eq!(
        l.share_export(me, dev, k, 256 * MI).unwrap(),
        Some(rec),
        "exported twice"
    );
    let mut i = child(&d, "import", &key);
    assert_eq!(l.share_let_go(me, rec).unwrap(), LetGo::HandedOver);
    assert_eq!(
        (a.charged(), a.used()),
        (0, 256 * MI),
        "the record holds it now"
    );
    kill(&mut i);
    l.reap_dead().unwrap();
    assert_eq!(a.used(), 0, "the importer died: the driver freed it");
    assert!(l.snapshot().shared.is_empty());
    // Never imported: kept on the exporter (a descriptor may be on its way), until it goes.
    assert!(a.try_charge(64 * MI));
    let rec = l.share_export(me, dev, k, 64 * MI).unwrap().unwrap();
    assert_eq!(l.share_let_go(me, rec).unwrap(), LetGo::Keep);
    assert_eq!(a.charged(), 64 * MI);
}

#[test]
fn an_importer_that_leaves_returns_the_charge_and_cannot_take_it_early() {
    let (d, l, key) = setup("leave");
    let mut x = child(&d, "export", &key);
    let (me, _) = joined(&l, "z", 1 << 30);
    let k = key_of(&key);
    let Import::Held(rec) = l.share_import(me, k).unwrap() else {
        panic!("not held")
    };
    // Leaving while the exporter holds it changes nothing but the record; nor can an importer
    // let go in the exporter's place.
    assert_eq!(l.share_let_go(me, rec).unwrap(), LetGo::Keep);
    l.share_leave(me, rec).unwrap();
    assert_eq!(used(&l, "x"), Some(256 * MI));
    assert_eq!(l.share_import(me, k).unwrap(), Import::Held(rec));
    kill(&mut x);
    l.reap_dead().unwrap();
    assert_eq!(used(&l, "x"), Some(256 * MI), "the importer still holds it");
    let removed = l.share_leave(me, rec).unwrap();
    assert_eq!(used(&l, "x"), None, "{removed:?}");
}

#[test]
fn foreign_indices_and_scribbled_records_change_nothing_they_should_not() {
    use core::sync::atomic::Ordering::SeqCst;
    let (d, l, key) = setup("hostile");
    let mut x = child(&d, "export", &key);
    let (me, _) = joined(&l, "z", 1 << 30);
    // Record indices past the table, or of a record this process has no part in.
    for rec in [0, 1, 255, 256, usize::MAX] {
        assert_eq!(l.share_let_go(me, rec).unwrap(), LetGo::Keep);
        l.share_leave(me, rec).unwrap();
    }
    assert_eq!(
        used(&l, "x"),
        Some(256 * MI),
        "nobody but the exporter lets go"
    );
    // A record pointing past the device table or at an account that is not one: freed by
    // the reaper and reported, never used as an index.
    let r = &l.shared()[7];
    r.device.store(99, SeqCst);
    r.account.store(u32::MAX - 7, SeqCst);
    r.exporter.store(3, SeqCst);
    r.held.store(u64::MAX, SeqCst);
    r.state.store(1, SeqCst);
    kill(&mut x);
    let out = l.reap_dead().unwrap();
    assert!(
        out.problems
            .iter()
            .any(|p| p.contains("shared allocation record 7")),
        "{out:?}"
    );
    assert_eq!(l.shared()[7].state.load(SeqCst), 0);
    assert_eq!(
        used(&l, "x"),
        None,
        "never imported: gone with its exporter"
    );
}

/// [`setup`], with the descriptor exported (256 MiB, slice `x`) by a child SIGKILLed since
/// and reaped: an orphan nobody is charged for.
fn orphaned(tag: &str) -> (Scratch, Ledger, std::path::PathBuf) {
    let (d, l, key) = setup(tag);
    let mut x = child(&d, "export", &key);
    kill(&mut x);
    l.reap_dead().unwrap();
    (d, l, key)
}

/// The identity of the file at `p`, as the shim keys a descriptor.
fn key_of(p: &std::path::Path) -> ShareKey {
    let f = std::fs::File::open(p).unwrap();
    ShareKey::of_fd(f.as_raw_fd()).unwrap()
}

/// A process of its own slice `name` with a quota of `quota` bytes on the test device.
fn joined(l: &Ledger, name: &str, quota: u64) -> (ProcHandle, usize) {
    let dev = l.ensure_device(UUID, "test", 64 << 30).unwrap();
    let me = l.attach(name).unwrap();
    l.join(me, dev, &SliceRequest::new(Some(name), Some(quota)))
        .unwrap();
    (me, dev)
}

#[test]
fn a_descriptor_imported_after_its_exporter_died_charges_its_importer() {
    let (_d, l, key) = orphaned("orphan");
    assert_eq!(used(&l, "x"), None, "the exporter's charge went with it");
    let k = key_of(&key);
    // Over its quota, an importer cannot take it (the shim refuses the import); nothing
    // changed.
    let (small, dev) = joined(&l, "small", 128 * MI);
    let bytes = 256 * MI;
    assert_eq!(
        l.share_import(small, k).unwrap(),
        Import::Refused { dev, bytes }
    );
    assert_eq!(used(&l, "small"), Some(0));
    // Two importers: the first is charged and adopts the record, the second is counted as
    // its importer and charged nothing.
    let (a, _) = joined(&l, "a", 1 << 30);
    let (b, _) = joined(&l, "b", 1 << 30);
    let Import::Adopted {
        rec,
        dev: od,
        bytes: ob,
    } = l.share_import(a, k).unwrap()
    else {
        panic!("not adopted")
    };
    assert_eq!((od, ob), (dev, bytes));
    assert_eq!(l.share_import(b, k).unwrap(), Import::Held(rec));
    let aa = l.account(a, dev).unwrap();
    assert_eq!(
        (aa.charged(), used(&l, "a"), used(&l, "b")),
        (bytes, Some(bytes), Some(0))
    );
    // The adopter is its exporter now: letting go while b holds it hands the charge over.
    assert_eq!(l.share_let_go(a, rec).unwrap(), LetGo::HandedOver);
    assert_eq!((aa.charged(), used(&l, "a")), (0, Some(bytes)));
    l.share_leave(b, rec).unwrap();
    assert_eq!(used(&l, "a"), Some(0), "the last holder went");
    // An orphan again: the next import is charged again (and lets go of it: uncharged), and
    // a later export of the same identity (the descriptor is gone, its inode reused)
    // replaces it.
    assert_eq!(
        l.share_import(b, k).unwrap(),
        Import::Adopted { rec, dev, bytes }
    );
    assert_eq!(used(&l, "b"), Some(bytes));
    assert_eq!(l.share_let_go(b, rec).unwrap(), LetGo::Uncharge);
    let ab = l.account(b, dev).unwrap();
    ab.uncharge(bytes);
    assert!(ab.try_charge(64 * MI));
    assert_eq!(l.share_export(b, dev, k, 64 * MI).unwrap(), Some(rec));
    assert_eq!(l.share_import(a, k).unwrap(), Import::Held(rec));
}

#[test]
fn an_adopter_that_imports_its_orphan_again_stays_charged_while_it_holds_either() {
    let (_d, l, key) = orphaned("twice");
    let k = key_of(&key);
    let (a, dev) = joined(&l, "a", 1 << 30);
    let Import::Adopted { rec, bytes, .. } = l.share_import(a, k).unwrap() else {
        panic!("not adopted")
    };
    // A second import of its own record counts it as an importer, charged nothing more.
    assert_eq!(l.share_import(a, k).unwrap(), Import::Held(rec));
    assert_eq!(used(&l, "a"), Some(bytes));
    // Letting go of the first handle hands the charge to the record: the second holds it.
    assert_eq!(l.share_let_go(a, rec).unwrap(), LetGo::HandedOver);
    assert_eq!(
        (l.account(a, dev).unwrap().charged(), used(&l, "a")),
        (0, Some(bytes))
    );
    l.share_leave(a, rec).unwrap();
    assert_eq!(used(&l, "a"), Some(0));
    assert!(matches!(
        l.share_import(a, k).unwrap(),
        Import::Adopted { .. }
    ));
}

#[test]
fn an_adopter_that_dies_or_lets_go_leaves_an_orphan_for_the_next_importer() {
    let (d, l, key) = orphaned("adopter");
    let mut y = child(&d, "adopt", &key);
    assert_eq!(used(&l, "y"), Some(256 * MI), "the adopter is charged");
    let mut i = child(&d, "import", &key);
    assert_eq!(
        used(&l, "y"),
        Some(256 * MI),
        "importing it charges nothing"
    );
    kill(&mut y);
    l.reap_dead().unwrap();
    assert_eq!(used(&l, "y"), Some(256 * MI), "kept for the importer");
    kill(&mut i);
    l.reap_dead().unwrap();
    assert_eq!(used(&l, "y"), None);
    let k = key_of(&key);
    let (z, _) = joined(&l, "z", 1 << 30);
    assert!(matches!(
        l.share_import(z, k).unwrap(),
        Import::Adopted { bytes, .. } if bytes == 256 * MI
    ));
    assert_eq!(used(&l, "z"), Some(256 * MI));
}

#[test]
fn a_table_full_of_orphans_takes_new_exports() {
    use core::sync::atomic::Ordering::SeqCst;
    let (_d, l, key) = setup("full");
    let (me, dev) = joined(&l, "x", 1 << 30);
    for r in l.shared() {
        r.state.store(gpuslice_ledger::layout::STATE_ORPHAN, SeqCst); // identities long gone
        r.key_ino.store(u64::MAX, SeqCst);
    }
    let k = key_of(&key);
    assert!(l.account(me, dev).unwrap().try_charge(MI));
    assert_eq!(l.share_export(me, dev, k, MI).unwrap(), Some(0));
}

#[test]
fn an_operator_slice_removed_while_an_importer_holds_its_export_goes_with_the_importer() {
    let (d, l, key) = setup("operator");
    l.create_operator_slice(&gpuslice_ledger::OperatorSlice {
        name: "x".into(),
        device: UUID.into(),
        memory: 1 << 30,
        compute_share: gpuslice_ledger::Share::NONE,
        compute_cap: gpuslice_ledger::Cap::NONE,
        claim: None,
    })
    .unwrap();
    let mut x = child(&d, "export", &key);
    let mut i = child(&d, "import", &key);
    kill(&mut x);
    l.reap_dead().unwrap();
    assert_eq!(
        l.remove_slice("x").unwrap(),
        0,
        "kept while the importer holds it"
    );
    assert_eq!(used(&l, "x"), Some(256 * MI));
    kill(&mut i);
    let r = l.reap_dead().unwrap();
    assert!(r.slices_removed.iter().any(|s| s.name == "x"), "{r:?}");
    assert_eq!(used(&l, "x"), None);
}
