//! Node mode's cold paths through the ledger API (what the monitor runs for its socket):
//! admission with per-user bounds, one record per process, reaping by the monitor's own
//! liveness, the best-effort allowances' grants, and exported allocations on the regions. Creating
//! a node policy needs root; without it these tests print why and pass vacuously (CI runs as
//! root).

mod common;
use common::{node_policy, peer, Scratch, Table};
use gpuslice_ledger::layout::{ALLOWANCE_ACCOUNT_BASE, STATE_ACTIVE};
use gpuslice_ledger::node::{Admitted, DeviceAsk, Limits, Policy};
use gpuslice_ledger::region::Region;
use gpuslice_ledger::{Account, Cap, LedgerError, OperatorSlice, Share, SliceRequest};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

const GI: u64 = 1 << 30;
const UUID: &str = "GPU-00000000-0000-0000-0000-00000000000a";

fn node(tag: &str) -> Option<(Policy, Arc<Table>, Scratch)> {
    node_policy("node", tag, &[UUID])
}

fn ask(name: Option<&str>, memory: Option<u64>) -> Vec<DeviceAsk> {
    vec![DeviceAsk {
        uuid: UUID.into(),
        req: SliceRequest::new(name, memory),
    }]
}

/// Process `pid` of user `uid` admitted under the default per-user bounds, asking for slice
/// `name` (none: the user's best-effort allowance) with `memory`.
fn admit(
    l: &Policy,
    (pid, uid): (u32, u32),
    name: Option<&str>,
    memory: Option<u64>,
) -> Result<Admitted, LedgerError> {
    l.admit(&peer(pid, uid), "", &ask(name, memory), &Limits::default())
}

#[test]
fn admission_bounds_and_one_record_per_process() {
    let Some((l, _t, _d)) = node("bounds") else {
        return;
    };
    assert!(l.is_node());
    let limits = Limits {
        procs_per_uid: 2,
        slices_per_uid: 8,
    };
    let first = l
        .admit(&peer(10, 1000), "", &ask(Some("a"), Some(GI)), &limits)
        .unwrap();
    let e = l
        .admit(&peer(10, 1000), "", &ask(Some("a"), Some(GI)), &limits)
        .unwrap_err();
    assert!(e.to_string().contains("admitted already"), "{e}");
    l.admit(&peer(11, 1000), "", &ask(Some("a"), None), &limits)
        .unwrap();
    let e = l
        .admit(&peer(12, 1000), "", &ask(Some("a"), None), &limits)
        .unwrap_err();
    assert!(e.to_string().contains("its limit"), "{e}");
    // Another user: not blocked by the first, and the same name is its own slice (names are
    // namespaced by owner), never the first's.
    let other = l
        .admit(&peer(20, 2000), "", &ask(Some("a"), Some(GI)), &limits)
        .unwrap();
    assert_ne!(other.devices[0].slice, first.devices[0].slice);
    let snap = l.snapshot();
    let owners: Vec<Option<u32>> = snap
        .slices
        .iter()
        .filter(|s| s.name == "a")
        .map(|s| s.owner)
        .collect();
    assert_eq!(owners, [Some(1000), Some(2000)]);
    // An unknown device is refused, not registered.
    let mut bad = ask(None, None);
    bad[0].uuid = "GPU-ffffffff-0000-0000-0000-000000000000".into();
    let e = l.admit(&peer(21, 2000), "", &bad, &limits).unwrap_err();
    assert!(
        e.to_string().contains("not one the node's monitor knows"),
        "{e}"
    );
}

#[test]
fn the_monitor_reaps_by_its_own_liveness_into_the_regions() {
    let Some((l, t, _d)) = node("reap") else {
        return;
    };
    let a = admit(&l, (30, 1000), Some("s"), Some(4 * GI)).unwrap();
    let b = admit(&l, (31, 1000), Some("s"), Some(4 * GI)).unwrap();
    let key = a.devices[0].key;
    let r = t.make(key);
    let dev = &l.devices()[a.devices[0].device];
    let slice = &l.slices()[a.devices[0].slice];
    let acc_a = Account::in_region(dev, Some(slice), &r, a.slot).unwrap();
    let acc_b = Account::in_region(dev, Some(slice), &r, b.slot).unwrap();
    assert!(acc_a.try_charge(3 * GI));
    assert!(
        !acc_b.try_charge(2 * GI),
        "the slice's quota holds across its processes"
    );
    assert!(acc_b.try_charge(GI));
    // a dies (the monitor's check says so): its 3 GiB come back, b's stay.
    let dead = a.slot;
    let rp = l
        .reap_node(
            &|p| p.host_pid.load(SeqCst) != 30 || p.state.load(SeqCst) != STATE_ACTIVE,
            t.as_ref(),
        )
        .unwrap();
    assert_eq!(rp.bytes_returned, 3 * GI);
    assert_eq!(r.header().memory_used.load(SeqCst), GI);
    assert_eq!(r.proc_(dead).unwrap().charged.load(SeqCst), 0);
    l.mirror_usage(t.as_ref());
    let snap = l.snapshot();
    assert_eq!(snap.slices[0].memory_used, GI);
}

#[test]
fn best_effort_grants_are_fair_and_a_liar_keeps_at_most_its_grant() {
    let Some((l, t, _d)) = node("allowances") else {
        return;
    };
    let a = admit(&l, (40, 1000), None, None).unwrap();
    let pa = a.devices[0].allowance.unwrap();
    let ra = t.make(ALLOWANCE_ACCOUNT_BASE + pa as u32);
    l.rebalance_allowances().unwrap();
    assert_eq!(
        l.allowances()[pa].grant.load(SeqCst),
        16 * GI,
        "alone: everything unreserved"
    );
    let acc_a = Account::in_allowance(&l.allowances()[pa], &ra, a.slot).unwrap();
    assert!(acc_a.try_charge(4 * GI));
    let b = admit(&l, (41, 2000), None, None).unwrap();
    let pb = b.devices[0].allowance.unwrap();
    assert_ne!(pa, pb, "one allowance per user");
    let rb = t.make(ALLOWANCE_ACCOUNT_BASE + pb as u32);
    l.rebalance_allowances().unwrap();
    let (ga, gb) = (
        l.allowances()[pa].grant.load(SeqCst),
        l.allowances()[pb].grant.load(SeqCst),
    );
    assert_eq!(
        (ga, gb),
        (10 * GI, 6 * GI),
        "each keeps what it holds, the rest is shared"
    );
    // b lies: its counter says it holds everything. It keeps at most its grant, a still grows.
    rb.header().memory_used.store(u64::MAX, SeqCst);
    for _ in 0..5 {
        l.rebalance_allowances().unwrap();
    }
    let (ga, gb) = (
        l.allowances()[pa].grant.load(SeqCst),
        l.allowances()[pb].grant.load(SeqCst),
    );
    assert!(
        gb <= 9 * GI && ga >= 7 * GI && ga + gb <= 16 * GI,
        "{ga} {gb}"
    );
    assert!(acc_a.try_charge(2 * GI), "a's best effort is not starved");
    // A quota slice counts each allowance for at most its grant: admitted while it fits.
    let held = |p: usize, r: &Region| {
        r.header()
            .memory_used
            .load(SeqCst)
            .min(l.allowances()[p].grant.load(SeqCst))
    };
    let before = held(pa, &ra) + held(pb, &rb);
    assert!(before <= 15 * GI, "{before}");
    admit(&l, (42, 3000), Some("q"), Some(GI))
        .expect("1 GiB fits beside what the allowances may hold");
    let grants = l.allowances()[pa].grant.load(SeqCst) + l.allowances()[pb].grant.load(SeqCst);
    assert!(
        grants <= 15 * GI,
        "grants lowered to the new reservation: {grants}"
    );
    // A quota that does not fit beside the allowances is refused, naming what is available.
    let e = admit(&l, (43, 3000), Some("big"), Some(8 * GI)).unwrap_err();
    assert!(e.to_string().contains("requested 8 GiB"), "{e}");
}

/// Issue #27: names are namespaced by owner. A tenant holding a slice called `team` keeps
/// neither another tenant nor the operator from a slice of that name: the operator's is made
/// beside it, and is the one every uid it is open to joins from then on.
#[test]
fn tenants_names_are_their_own_and_operator_names_are_reserved() {
    let Some((l, _t, _d)) = node("names") else {
        return;
    };
    let squat = admit(&l, (50, 1000), Some("team"), Some(GI)).unwrap();
    let theirs = admit(&l, (60, 2000), Some("team"), Some(GI)).unwrap();
    assert_ne!(squat.devices[0].slice, theirs.devices[0].slice);
    let op = l
        .create_operator_slice(&OperatorSlice {
            name: "team".into(),
            device: UUID.into(),
            memory: 2 * GI,
            compute_share: Share::NONE,
            compute_cap: Cap::NONE,
            claim: None,
        })
        .unwrap();
    assert!(
        l.create_operator_slice(&OperatorSlice {
            name: "team".into(),
            device: UUID.into(),
            memory: GI,
            compute_share: Share::NONE,
            compute_cap: Cap::NONE,
            claim: None,
        })
        .is_err(),
        "one operator slice of a name per device"
    );
    l.set_slice_owner("team", UUID, 2000).unwrap();
    let joined = admit(&l, (61, 2000), Some("team"), None).unwrap();
    assert_eq!(joined.devices[0].slice, op);
    assert_eq!(joined.devices[0].memory_limit, Some(2 * GI));
    let e = admit(&l, (51, 1000), Some("team"), None).unwrap_err();
    assert!(e.to_string().contains("belongs to uid 2000"), "{e}");
}

#[test]
fn an_export_outlives_its_exporter_on_the_regions_and_one_user_holds_a_quarter_of_the_table() {
    use gpuslice_ledger::layout::SHARED_PER_UID;
    use gpuslice_ledger::{Import, LetGo, ProcHandle, ShareKey};
    let Some((l, t, _d)) = node("shared") else {
        return;
    };
    let x = admit(&l, (40, 1000), Some("x"), Some(4 * GI)).unwrap();
    let y = admit(&l, (41, 2000), Some("y"), Some(GI)).unwrap();
    let r = t.make(x.devices[0].key);
    let ry = t.make(y.devices[0].key);
    let dev = &l.devices()[x.devices[0].device];
    let slice = &l.slices()[x.devices[0].slice];
    assert!(Account::in_region(dev, Some(slice), &r, x.slot)
        .unwrap()
        .try_charge(GI));
    let (xh, yh) = (ProcHandle { slot: x.slot }, ProcHandle { slot: y.slot });
    let k = ShareKey { dev: 7, ino: 1 };
    let rec = l.share_export(xh, x.devices[0].device, k, GI).unwrap();
    assert!(rec.is_some());
    assert_eq!(l.share_import(yh, k).unwrap(), Import::Held(rec.unwrap()));
    // x dies: its slice keeps the gibibyte the importer holds, in its region.
    let rp = l
        .reap_node(&|p| p.host_pid.load(SeqCst) != 40, t.as_ref())
        .unwrap();
    assert_eq!((rp.processes.len(), rp.bytes_returned), (1, 0));
    assert_eq!(r.header().memory_used.load(SeqCst), GI);
    l.share_leave(yh, rec.unwrap()).unwrap();
    // Only descriptors may hold it now: x's slice stays charged until the monitor finds none
    // (`share_release_unheld`), or an import adopts it and the charge moves to y's slice.
    let rec = rec.unwrap();
    assert_eq!(
        r.header().memory_used.load(SeqCst),
        GI,
        "a descriptor may hold it"
    );
    assert_eq!(l.descriptor_held(), vec![(rec, k)]);
    let od = y.devices[0].device;
    let adopted = Import::Adopted {
        rec,
        dev: od,
        bytes: GI,
    };
    assert_eq!(l.share_import(yh, k).unwrap(), adopted);
    assert_eq!(r.header().memory_used.load(SeqCst), 0, "moved to y");
    assert_eq!(ry.header().memory_used.load(SeqCst), GI);
    assert_ne!(
        slice.state.load(SeqCst),
        STATE_ACTIVE,
        "x's slice went with it"
    );
    assert!(l.descriptor_held().is_empty());
    // y lets go: the record holds y's charge for the descriptors that may be left.
    assert_eq!(l.share_let_go(yh, rec).unwrap(), LetGo::HandedOver);
    assert_eq!(ry.header().memory_used.load(SeqCst), GI);
    assert_eq!(l.descriptor_held(), vec![(rec, k)]);
    // A scan that found another record's descriptor gone changes nothing here.
    assert!(l
        .share_release_unheld(rec, ShareKey { dev: 7, ino: 2 })
        .unwrap()
        .is_empty());
    assert_eq!(ry.header().memory_used.load(SeqCst), GI);
    // y's slice has a live process: it stays, uncharged.
    assert!(l.share_release_unheld(rec, k).unwrap().is_empty());
    assert_eq!(
        ry.header().memory_used.load(SeqCst),
        0,
        "no descriptor left"
    );
    assert!(l.descriptor_held().is_empty());
    // An orphan now: importing the descriptor again charges y, in its own region (the
    // monitor charges, not the tenant). A best-effort importer keeps no record: it is told
    // to charge itself.
    let b = admit(&l, (43, 4000), None, None).unwrap();
    let bh = ProcHandle { slot: b.slot };
    assert_eq!(
        l.share_import(bh, k).unwrap(),
        Import::Charge { dev: od, bytes: GI }
    );
    assert_eq!(l.share_import(yh, k).unwrap(), adopted);
    assert_eq!(ry.header().memory_used.load(SeqCst), GI);
    assert_eq!(l.share_let_go(yh, rec).unwrap(), LetGo::HandedOver);
    l.share_release_unheld(rec, k).unwrap();
    assert_eq!(ry.header().memory_used.load(SeqCst), 0);
    // Over its quota (1 GiB, 1 GiB of its own charged): refused, nothing changed.
    let ya = Account::in_region(
        &l.devices()[od],
        Some(&l.slices()[y.devices[0].slice]),
        &ry,
        y.slot,
    );
    assert!(ya.unwrap().try_charge(GI));
    assert_eq!(
        l.share_import(yh, k).unwrap(),
        Import::Refused { dev: od, bytes: GI }
    );
    ya.unwrap().uncharge(GI);
    // One user's exports hold at most a quarter of the table; another's are not blocked.
    for i in 0..SHARED_PER_UID as u64 {
        let k = ShareKey { dev: 8, ino: i };
        assert!(l
            .share_export(yh, y.devices[0].device, k, 1)
            .unwrap()
            .is_some());
    }
    let k = ShareKey { dev: 8, ino: 999 };
    assert_eq!(l.share_export(yh, y.devices[0].device, k, 1).unwrap(), None);
    let z = admit(&l, (42, 3000), Some("z"), Some(GI)).unwrap();
    let zh = ProcHandle { slot: z.slot };
    assert!(l
        .share_export(zh, z.devices[0].device, k, 1)
        .unwrap()
        .is_some());
}

#[test]
fn an_export_only_a_descriptor_may_hold_stays_charged_until_released_or_adopted() {
    use gpuslice_ledger::{Import, LetGo, ProcHandle, ShareKey};
    let Some((l, t, _d)) = node("descriptors") else {
        return;
    };
    let x = admit(&l, (60, 1000), Some("x"), Some(2 * GI)).unwrap();
    let r = t.make(x.devices[0].key);
    let dev = &l.devices()[x.devices[0].device];
    let slice = &l.slices()[x.devices[0].slice];
    assert!(Account::in_region(dev, Some(slice), &r, x.slot)
        .unwrap()
        .try_charge(GI));
    let xh = ProcHandle { slot: x.slot };
    let k = ShareKey { dev: 9, ino: 1 };
    let rec = l
        .share_export(xh, x.devices[0].device, k, GI)
        .unwrap()
        .unwrap();
    // Never imported, the exporter dies: the record keeps its charge for the descriptor.
    let rp = l
        .reap_node(&|p| p.host_pid.load(SeqCst) != 60, t.as_ref())
        .unwrap();
    assert_eq!((rp.processes.len(), rp.bytes_returned), (1, 0));
    assert_eq!(r.header().memory_used.load(SeqCst), GI);
    assert_eq!(slice.state.load(SeqCst), STATE_ACTIVE, "the record keeps x");
    assert_eq!(l.descriptor_held(), vec![(rec, k)]);
    // A process of the same slice imports it: the charge moves to its own words, counted once
    // (2 GiB quota, 1 GiB held: a second count would still fit, so look at the counter).
    let x2 = admit(&l, (61, 1000), Some("x"), Some(2 * GI)).unwrap();
    let x2h = ProcHandle { slot: x2.slot };
    let adopted = Import::Adopted {
        rec,
        dev: x.devices[0].device,
        bytes: GI,
    };
    assert_eq!(l.share_import(x2h, k).unwrap(), adopted);
    assert_eq!(
        r.header().memory_used.load(SeqCst),
        GI,
        "moved, not counted twice"
    );
    assert_eq!(r.proc_(x2.slot).unwrap().charged.load(SeqCst), GI);
    assert!(l.descriptor_held().is_empty());
    // It lets go: held by the record again, until no descriptor is found.
    assert_eq!(l.share_let_go(x2h, rec).unwrap(), LetGo::HandedOver);
    assert_eq!(r.proc_(x2.slot).unwrap().charged.load(SeqCst), 0);
    assert_eq!(r.header().memory_used.load(SeqCst), GI);
    assert!(l.share_release_unheld(rec, k).unwrap().is_empty());
    assert_eq!(r.header().memory_used.load(SeqCst), 0);
    assert_eq!(slice.state.load(SeqCst), STATE_ACTIVE, "x2 is in it");
    // An orphan now: not listed, and a second release changes nothing.
    assert!(l.descriptor_held().is_empty());
    assert!(l.share_release_unheld(rec, k).unwrap().is_empty());
    assert_eq!(r.header().memory_used.load(SeqCst), 0);
}

/// Issue #34: what a restarted monitor makes a lost region again with: per slice and device,
/// the bytes the records hold themselves and each still registered exporter's export (its
/// charge, in its own word), with the slice's quota that bounds it; nothing once they let go.
#[test]
fn the_records_say_what_a_restarted_monitor_charges_again() {
    use gpuslice_ledger::{ProcHandle, RecordCharge, ShareKey};
    let Some((l, t, _d)) = node("record-charges") else {
        return;
    };
    let x = admit(&l, (40, 1000), Some("x"), Some(4 * GI)).unwrap();
    let y = admit(&l, (41, 2000), Some("y"), Some(GI)).unwrap();
    let r = t.make(x.devices[0].key);
    t.make(y.devices[0].key);
    let (dev, slice) = (x.devices[0].device, x.devices[0].slice);
    assert!(
        Account::in_region(&l.devices()[dev], Some(&l.slices()[slice]), &r, x.slot)
            .unwrap()
            .try_charge(GI)
    );
    let (xh, yh) = (ProcHandle { slot: x.slot }, ProcHandle { slot: y.slot });
    let k = ShareKey { dev: 7, ino: 1 };
    let rec = l.share_export(xh, dev, k, GI).unwrap().unwrap();
    l.share_import(yh, k).unwrap();
    let charge = |held, exported| RecordCharge {
        device: dev,
        account: slice as u32,
        held,
        exported,
        limit: 4 * GI,
    };
    assert_eq!(l.record_charges().unwrap(), [charge(0, vec![(x.slot, GI)])]);
    // x dies and is reaped: the record holds its gibibyte.
    l.reap_node(&|p| p.host_pid.load(SeqCst) != 40, t.as_ref())
        .unwrap();
    assert_eq!(l.record_charges().unwrap(), [charge(GI, vec![])]);
    // y leaves, no descriptor is left: nothing to charge again.
    l.share_leave(yh, rec).unwrap();
    l.share_release_unheld(rec, k).unwrap();
    assert_eq!(l.record_charges().unwrap(), []);
}
