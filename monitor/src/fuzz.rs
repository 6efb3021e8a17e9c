//! Fuzzing the ledger reader and the CLI's views with hostile files (docs/security.md).
//!
//! A template ledger is built through the real API (devices, operator, named, private and
//! best-effort slices, processes charged on them); each case copies it, scribbles over fields
//! of its records (or writes a random file), then runs everything that reads a ledger a
//! tenant could have written: `Ledger::open`, `snapshot`, `reap_dead`, `attach`, `join`,
//! charging, `detach`, and the views `status --json`, the tables and `metrics` render. No case
//! may panic, hang or fault. The header's mutex is left alone: in node mode it lives in the
//! policy, which only root writes, and a personal ledger trusts its one user.
//!
//! `the_ledger_reader_survives_hostile_files` runs a short fuzz in every test run;
//! `GPUSLICE_FUZZ_SECONDS=600 cargo test -p gpuslice --bin gpuslice fuzz -- --nocapture`
//! runs it for as long as asked and prints the executions.

use crate::ledger_window::LedgerWindow;
use gpuslice_ledger::layout::*;
use gpuslice_ledger::{Cap, Ledger, OperatorSlice, Share, SliceRequest, PPM};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MI: u64 = 1 << 20;

/// A scribble: which record kind, which record, which 4- or 8-byte field, what value.
#[derive(Debug, Clone)]
enum Scribble {
    Field {
        kind: u8,
        record: usize,
        offset: usize,
        wide: bool,
        value: u64,
    },
    Raw {
        offset: usize,
        bytes: Vec<u8>,
    },
}

fn interesting() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(15),
        Just(16),
        Just(255),
        Just(256),
        Just(511),
        Just(512),
        Just(9999),
        Just(70000),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 - 1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(1 << 40),
        any::<u64>(),
    ]
}

fn scribble() -> impl Strategy<Value = Scribble> {
    prop_oneof![
        4 => (0u8..4, prop_oneof![0usize..6, 0usize..512], 0usize..4096, any::<bool>(), interesting())
            .prop_map(|(kind, record, offset, wide, value)| Scribble::Field {
                kind,
                record,
                offset,
                wide,
                value
            }),
        1 => (4096usize..FILE_SIZE, proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(offset, bytes)| Scribble::Raw { offset, bytes }),
    ]
}

#[derive(Debug, Clone)]
enum Case {
    Mutated(Vec<Scribble>),
    /// A file of random bytes, with the real header's first bytes or not.
    Random {
        keep_header: bool,
        bytes: Vec<u8>,
    },
}

fn case() -> impl Strategy<Value = Case> {
    prop_oneof![
        8 => proptest::collection::vec(scribble(), 1..48).prop_map(Case::Mutated),
        1 => (any::<bool>(), proptest::collection::vec(any::<u8>(), 0..8192))
            .prop_map(|(keep_header, bytes)| Case::Random { keep_header, bytes }),
    ]
}

fn record_base(kind: u8, record: usize) -> Option<(usize, usize)> {
    let (off, size, max) = match kind {
        0 => (DEVICES_OFFSET, size_of::<Device>(), MAX_DEVICES),
        1 => (SLICES_OFFSET, size_of::<Slice>(), MAX_SLICES),
        2 => (PROCS_OFFSET, size_of::<Proc>(), MAX_PROCS),
        _ => (SHARED_OFFSET, size_of::<Shared>(), MAX_SHARED),
    };
    (record < max).then_some((off + record * size, size))
}

fn build_template(dir: &Path) {
    let l = Ledger::open_or_create(dir).unwrap();
    let mut devs = vec![];
    for i in 0..3 {
        devs.push(
            l.ensure_device(
                &format!("GPU-00000000-0000-0000-0000-00000000000{i}"),
                "Fake",
                16 << 30,
            )
            .unwrap(),
        );
    }
    l.create_operator_slice(&OperatorSlice {
        name: "ops".into(),
        device: "0".into(),
        memory: 2 << 30,
        compute_share: Share::from_ppm(PPM / 4),
        compute_cap: Cap::NONE,
        claim: Some("ns/claim".into()),
    })
    .unwrap();
    let mut mes = vec![];
    for (name, mem) in [
        (Some("ops"), None),
        (Some("team"), Some(1 << 30)),
        (None, Some(512 * MI)),
        (None, None),
    ] {
        let me = l.attach(name.unwrap_or("")).unwrap();
        for &d in &devs {
            l.join(me, d, &SliceRequest::new(name, mem)).unwrap();
            assert!(l.account(me, d).unwrap().try_charge(64 * MI));
        }
        mes.push(me);
        // Left attached: the copies hold records of processes that are gone.
    }
    // An exported allocation with an importer (`layout::Shared`), for the reapers to settle.
    let key = gpuslice_ledger::ShareKey { dev: 1, ino: 2 };
    let rec = l.share_export(mes[1], devs[0], key, 64 * MI).unwrap();
    let held = rec.map(gpuslice_ledger::Import::Held);
    assert!(held.is_some_and(|h| l.share_import(mes[2], key).unwrap() == h));
    // And an orphan: imported, left, let go (the next importer of its descriptor pays).
    let key = gpuslice_ledger::ShareKey { dev: 1, ino: 3 };
    let rec = l
        .share_export(mes[1], devs[0], key, 32 * MI)
        .unwrap()
        .unwrap();
    l.share_import(mes[2], key).unwrap();
    l.share_leave(mes[2], rec).unwrap();
    let go = l.share_let_go(mes[1], rec).unwrap();
    assert_eq!(go, gpuslice_ledger::LetGo::Uncharge);
    l.account(mes[1], devs[0]).unwrap().uncharge(32 * MI);
}

fn template() -> &'static [u8] {
    static T: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let d = scratch("template");
        build_template(&d);
        let bytes = std::fs::read(d.join("ledger")).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        bytes
    })
}

fn scratch(tag: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = std::env::temp_dir().join(format!("gpuslice-fuzz-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn write_case(dir: &Path, c: &Case) {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join("ledger"))
        .unwrap();
    match c {
        Case::Mutated(scribbles) => {
            f.write_all_at(template(), 0).unwrap();
            for s in scribbles {
                match s {
                    Scribble::Field {
                        kind,
                        record,
                        offset,
                        wide,
                        value,
                    } => {
                        let Some((base, size)) = record_base(*kind, *record) else {
                            continue;
                        };
                        let w = if *wide { 8 } else { 4 };
                        let off = (offset % size) / w * w;
                        let bytes = value.to_ne_bytes();
                        f.write_all_at(&bytes[..w], (base + off) as u64).unwrap();
                    }
                    Scribble::Raw { offset, bytes } => {
                        let n = bytes.len().min(FILE_SIZE - offset);
                        f.write_all_at(&bytes[..n], *offset as u64).unwrap();
                    }
                }
            }
        }
        Case::Random { keep_header, bytes } => {
            if *keep_header {
                f.write_all_at(&template()[..64], 0).unwrap();
                f.write_all_at(bytes, 64).unwrap();
            } else {
                f.write_all_at(bytes, 0).unwrap();
            }
        }
    }
}

/// The node-mode paths over the same file: the monitor's reaper and usage mirror, with
/// regions whose words are as hostile as the file's.
fn exercise_node(dir: &Path, noise: &[u64]) {
    let allowance_key = |i: u32| gpuslice_ledger::layout::ALLOWANCE_ACCOUNT_BASE + i;
    use std::sync::atomic::Ordering::SeqCst;
    let Ok(l) = Ledger::open(dir) else { return };
    let l = gpuslice_ledger::node::Policy::assume(l);
    let regions = std::sync::Arc::new(crate::regions::RegionTable::default());
    l.set_regions(regions.clone());
    for (i, k) in [0u32, 1, 2, 5, allowance_key(0), allowance_key(1)]
        .into_iter()
        .enumerate()
    {
        let r = regions.make_for_test(k);
        let v = |j: usize| noise.get(i * 7 + j).copied().unwrap_or(0);
        r.header().memory_used.store(v(0), SeqCst);
        for slot in [0usize, 1, 2, 3, (v(1) % MAX_PROCS as u64) as usize] {
            if let Some(w) = r.proc_(slot) {
                w.charged.store(v(2), SeqCst);
                w.ops_begun.store(v(3), SeqCst);
                w.ops_ended.store(v(3).wrapping_add(v(4) % 2), SeqCst);
            }
        }
    }
    for (i, p) in l.allowances().iter().enumerate().take(3) {
        p.state.store(STATE_ACTIVE, SeqCst);
        p.device
            .store((noise.get(i).copied().unwrap_or(0) % 3) as u32, SeqCst);
        p.grant
            .store(noise.get(i + 1).copied().unwrap_or(0), SeqCst);
    }
    let _ = l.reap_node(&|p| p.host_pid.load(SeqCst) % 2 == 0, regions.as_ref());
    let _ = l.rebalance_allowances();
    l.mirror_usage(regions.as_ref());
    regions.retain_live(&l);
    let _ = l.snapshot();
}

/// Everything that reads the file; must not panic. Returns whether the ledger opened.
fn exercise(dir: &Path) -> bool {
    let opened = LedgerWindow::open(dir).is_ok();
    if let Ok(node) = LedgerWindow::open(dir) {
        let snap = node.snapshot();
        let _ = snap.to_json().to_string();
        let _ = crate::prom::render(&snap, None);
        let _ = crate::table::render(&snap);
        let _ = node.reap();
        let _ = node.snapshot().to_json();
    }
    if let Ok(l) = Ledger::open(dir) {
        let _ = l.snapshot();
        if let Ok(me) = l.attach("") {
            for d in 0..MAX_DEVICES {
                if l.devices()[d]
                    .state
                    .load(core::sync::atomic::Ordering::SeqCst)
                    == STATE_ACTIVE
                {
                    let req = SliceRequest::new(Some("team"), Some(MI));
                    let _ = l.join(me, d, &req);
                    if let Some(a) = l.account(me, d) {
                        if a.try_charge(4096) {
                            a.uncharge(4096);
                        }
                        let _ = (a.limit(), a.used(), a.charged());
                    }
                    // The shared records' paths, over whatever the records say.
                    for ino in [2, 3] {
                        let key = gpuslice_ledger::ShareKey { dev: 1, ino };
                        if let Ok(gpuslice_ledger::Import::Adopted { rec, .. }) =
                            l.share_import(me, key)
                        {
                            let _ = l.share_let_go(me, rec);
                        }
                    }
                }
            }
            let _ = l.detach(me);
        }
        let _ = l.reap_dead();
        let _ = crate::prom::render(
            &LedgerWindow::open(dir)
                .map(|n| n.snapshot())
                .unwrap_or_default(),
            None,
        );
    }
    opened
}

/// Run the fuzz for `cases` cases, or until `until`; returns the executions and how many
/// opened as a ledger (the rest were refused at open, as they should be).
pub fn run(cases: u32, until: Option<std::time::Instant>) -> (u64, u64) {
    let dir = scratch("cases");
    let mut total = 0u64;
    let opened = std::cell::Cell::new(0u64);
    loop {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let r = runner.run(&case(), |c| {
            write_case(&dir, &c);
            if exercise(&dir) {
                opened.set(opened.get() + 1);
            }
            if let Case::Mutated(s) = &c {
                write_case(&dir, &c);
                let noise: Vec<u64> = s
                    .iter()
                    .map(|x| match x {
                        Scribble::Field { value, .. } => *value,
                        Scribble::Raw { bytes, .. } => bytes.len() as u64,
                    })
                    .collect();
                exercise_node(&dir, &noise);
            }
            Ok(())
        });
        if let Err(e) = r {
            panic!("a hostile ledger broke a reader: {e}");
        }
        total += cases as u64;
        match until {
            Some(t) if std::time::Instant::now() < t => continue,
            _ => break,
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    (total, opened.get())
}

#[test]
fn the_ledger_reader_survives_hostile_files() {
    let secs: u64 = std::env::var("GPUSLICE_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let started = std::time::Instant::now();
    let (n, opened) = if secs > 0 {
        run(256, Some(started + std::time::Duration::from_secs(secs)))
    } else {
        run(48, None)
    };
    println!(
        "fuzz: {n} executions ({opened} opened as a ledger, the rest refused at open) in \
         {:.1} s, no panic",
        started.elapsed().as_secs_f64()
    );
    // Most cases are scribbled copies of a valid ledger: they must get past the open checks,
    // or the fuzz would test nothing but the header check.
    assert!(opened * 2 > n, "only {opened} of {n} cases opened");
}
