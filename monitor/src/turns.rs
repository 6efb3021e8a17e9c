//! Node mode: the monitor grants compute turns (docs/security.md, "Compute in node mode").
//!
//! One thread ([`spawn`]) serves every device: each pass it finds the processes of each device
//! and their words in their regions, and runs that device's [`DeviceTurns`] (the grantor, in
//! the scheduler: `sched/src/turns.rs`, which makes every write into the policy's
//! records). It also refreshes the policy's `monitor_beat_ns`: while it is stale (the monitor
//! is down) tenants launch unthrottled (`sched::MONITOR_STALE_NS`).

use core::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;

use gpuslice_ledger::layout::STATE_FREE;
use gpuslice_ledger::region::{Region, Regions};
use gpuslice_ledger::tenants::LedgerTenants;
use gpuslice_ledger::{Ledger, MAX_DEVICES};
use gpuslice_sched::{
    self as sched, DeviceTurns, GrantProc, Lease, Member, Os, Rings, Tenant, Tenants,
    MONITOR_BEAT_NS,
};

use crate::error::Error;
use crate::regions::RegionTable;

/// Shortest time between two passes of the turns thread (a bound on what ringing its bell costs).
pub const MIN_PASS_NS: u64 = 50_000;
/// How often the members of the devices are looked up again even without a policy change.
const REFRESH_NS: u64 = 100_000_000;

/// The policy's slices of one device, restricted to a few ids.
struct Listed<'a> {
    all: LedgerTenants<'a>,
    ids: Vec<u32>,
}

impl Tenants for Listed<'_> {
    fn each(&self, f: &mut dyn FnMut(Tenant<'_>)) {
        for &id in &self.ids {
            if let Some(t) = self.all.get(id) {
                f(t);
            }
        }
    }
    fn get(&self, id: u32) -> Option<Tenant<'_>> {
        self.all.get(id)
    }
}

/// The member cache: (slot, device, slice id, region).
type Cache = Vec<(usize, usize, u32, Arc<Region>)>;

fn members_of(ledger: &Ledger, regions: &RegionTable) -> Cache {
    ledger
        .members()
        .filter_map(|m| {
            let r = regions.get(m.region?)?;
            Some((m.slot, m.device, m.slice? as u32 + 1, r))
        })
        .collect()
}

/// The grant words of the cache's processes, in its order.
fn words(cache: &Cache) -> impl Iterator<Item = Option<&GrantProc>> {
    cache
        .iter()
        .map(|(slot, _, _, r)| r.proc_(*slot).map(|p| &p.grant))
}

/// Start the turns thread (node mode): it runs until the process exits.
pub fn spawn(ledger: Arc<Ledger>, regions: Arc<RegionTable>) -> Result<(), Error> {
    std::thread::Builder::new()
        .name("turns".into())
        .spawn(move || run(&ledger, &regions))
        .map(|_| ())
        .map_err(|e| Error::os("start the compute turns thread", None, e))
}

fn run(ledger: &Ledger, regions: &RegionTable) {
    // Grants are due at lease ends: ask the kernel to run this thread ahead of ordinary work
    // (root may; nothing breaks when refused).
    // SAFETY: setpriority on this thread's own id; no memory is passed.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10);
    }
    let os = &sched::SYSTEM;
    let mut turns: Vec<DeviceTurns> = (0..MAX_DEVICES).map(|_| DeviceTurns::default()).collect();
    let mut cache: Cache = vec![];
    let mut generation = u64::MAX;
    let mut refreshed = 0u64;
    let mut rings = Rings::default();
    loop {
        let now = os.now_ns();
        sched::beat(&ledger.header().monitor_beat_ns, now);
        let g = ledger.header().generation.load(Acquire);
        if g != generation || now.saturating_sub(refreshed) > REFRESH_NS {
            generation = g;
            refreshed = now;
            cache = members_of(ledger, regions);
        }
        rings.pass(&mut words(&cache));
        let mut next = now + MONITOR_BEAT_NS;
        for (d, dt) in turns.iter_mut().enumerate() {
            let dev = &ledger.devices()[d];
            if dev.state.load(Acquire) == STATE_FREE {
                continue;
            }
            let members: Vec<Member> = cache
                .iter()
                .filter(|c| c.1 == d)
                .filter_map(|(slot, _, id, r)| {
                    Some(Member {
                        slot: *slot,
                        slice: *id,
                        words: &r.proc_(*slot)?.grant,
                    })
                })
                .collect();
            // Only the slices with processes here (and the holder) can compete: the policy has
            // 8192 slice records, and the policy's functions visit every slice they are shown.
            let mut ids: Vec<u32> = members.iter().map(|m| m.slice).collect();
            ids.push(Lease::unpack(dev.sched.lease.load(Acquire)).holder);
            ids.sort_unstable();
            ids.dedup();
            let t = Listed {
                all: ledger.tenants(d),
                ids,
            };
            next = next.min(dt.step(os, &dev.sched, &t, &members, now));
        }
        // Sleep until the next deadline or a hand-back's wake (tenants ring the policy's bell:
        // they can wake this thread, never write anything it reads without clamping). A wake
        // sooner than MIN_PASS_NS after the last pass waits out the rest, so a tenant ringing
        // without pause costs at most one pass per MIN_PASS_NS.
        let began = now;
        let now = os.now_ns();
        if rings.missed(&mut words(&cache)) {
            // A ring that came in the pass woke nobody: pass again (at most one per
            // MIN_PASS_NS), not a poll (1 ms) later.
            let at = began.saturating_add(MIN_PASS_NS);
            if at > now {
                std::thread::sleep(Duration::from_nanos(at - now));
            }
            continue;
        }
        if next > now {
            let bell = &ledger.header().turns_bell;
            os.futex_wait(bell, bell.load(Acquire), next - now);
            let since = os.now_ns().saturating_sub(now);
            if since < MIN_PASS_NS {
                std::thread::sleep(Duration::from_nanos(MIN_PASS_NS - since));
            }
        }
    }
}
