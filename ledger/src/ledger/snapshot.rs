//! Taking a [`Snapshot`]: plain copies of the device, slice and process records, read without
//! the lock and checked record by record (the types are `crate::snapshot`'s). Apart because
//! it writes nothing and trusts nothing it reads.

use super::Ledger;
use crate::layout::*;
use crate::snapshot::*;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};

/// Tries at a snapshot taken between cold-path changes (each waits 0.5 ms after a busy one).
const SNAPSHOT_TRIES: usize = 40;

impl Ledger {
    /// A consistent-enough copy of everything, for display and decisions (no lock taken).
    ///
    /// Every index, count and name comes from shared memory and is checked before use: a
    /// record that does not make sense (a slice on a device past the table, a process joined
    /// to a slice index past it) is skipped and described in [`Snapshot::problems`]; sums
    /// saturate. Nothing here panics or reads outside the mapping, whatever the file holds.
    ///
    /// Taken while no cold-path change is under way (the lock free before and after, and no
    /// unlock in between: every unlock bumps `generation`), so a process the reaper freed is
    /// never missing while its memory still counts; after `SNAPSHOT_TRIES` busy tries (a lock
    /// held that long) it is taken as the records stand.
    pub fn snapshot(&self) -> Snapshot {
        let h = self.header();
        let quiet = || h.lock_holder.load(SeqCst) == 0;
        for _ in 0..SNAPSHOT_TRIES {
            let before = h.generation.load(SeqCst);
            if quiet() {
                let snap = self.snapshot_as_it_stands();
                if quiet() && h.generation.load(SeqCst) == before {
                    return snap;
                }
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        self.snapshot_as_it_stands()
    }

    /// The records as they stand, checked, with no regard for changes under way.
    fn snapshot_as_it_stands(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        for (i, d) in self.devices().iter().enumerate() {
            if d.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            snap.devices.push(DeviceInfo {
                index: i,
                uuid: d.uuid.get(),
                name: d.name.get(),
                memory_total: d.memory_total.load(SeqCst),
                memory_reserved: d.memory_reserved.load(SeqCst),
                memory_used: 0,
                best_effort_used: d.best_effort_used.load(SeqCst),
                compute_reserved_ppm: d.compute_reserved.load(SeqCst).min(u32::MAX as u64) as u32,
                context_bytes: d.context_bytes.load(SeqCst),
            });
        }
        let alive: Vec<bool> = (0..MAX_PROCS)
            .map(|i| self.procs()[i].state.load(SeqCst) == STATE_ACTIVE && self.is_alive(i))
            .collect();
        let mut good_slice = [false; MAX_SLICES];
        for (si, s) in self.slices().iter().enumerate() {
            if s.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let dev = s.device.load(SeqCst) as usize;
            let Some(device) = self.devices().get(dev) else {
                snap.problems.push(format!(
                    "slice record {si} ({:?}): device index {dev} is past the device table; skipped",
                    s.name.get()
                ));
                continue;
            };
            good_slice[si] = true;
            let limit = s.memory_limit.load(SeqCst);
            let members: Vec<&Proc> = self
                .procs()
                .iter()
                .filter(|p| {
                    p.state.load(SeqCst) != STATE_FREE
                        && p.devices[dev].slice.load(SeqCst) as usize == si
                })
                .collect();
            let used = if limit == NO_LIMIT {
                members.iter().fold(0u64, |a, p| {
                    a.saturating_add(p.devices[dev].charged.load(SeqCst))
                })
            } else {
                s.memory_used.0.load(SeqCst)
            };
            snap.slices.push(SliceInfo {
                index: si,
                name: s.name.get(),
                device: dev,
                device_uuid: device.uuid.get(),
                operator_defined: s.operator_defined.load(SeqCst) != 0,
                private: s.private.load(SeqCst) != 0,
                memory_limit: (limit != NO_LIMIT).then_some(limit),
                memory_used: used,
                context_used: s.context_used.load(SeqCst).min(used),
                compute_share: s.share(),
                compute_cap: s.cap(),
                attached: s.attached.load(SeqCst),
                pids: members.iter().map(|p| p.pid.load(SeqCst)).collect(),
                alloc_total: s.alloc_total.load(Relaxed),
                alloc_denied_total: s.alloc_denied_total.load(Relaxed),
                claim: Some(s.claim.get()).filter(|c| !c.is_empty()),
                owner: Some(s.owner_uid.load(SeqCst)).filter(|&u| u != ANY_UID),
                over_quota: s.over_quota.load(SeqCst) != 0,
                audit_observed: s.audit_observed.load(SeqCst),
                violations_total: s.violations_total.load(SeqCst),
                priority: s
                    .sched
                    .class
                    .load(SeqCst)
                    .min(gpuslice_sched::CLASS_LATENCY),
            });
        }
        for d in &mut snap.devices {
            let quota = snap
                .slices
                .iter()
                .filter(|s| s.device == d.index && s.memory_limit.is_some())
                .fold(0u64, |a, s| a.saturating_add(s.memory_used));
            d.memory_used = quota.saturating_add(d.best_effort_used);
        }
        for (i, p) in self.procs().iter().enumerate() {
            if p.state.load(SeqCst) == STATE_FREE {
                continue;
            }
            let mut devices: Vec<ProcDeviceInfo> = vec![];
            for (d, pd) in p.devices.iter().enumerate() {
                let slice = pd.slice.load(SeqCst);
                if slice == ACCOUNT_NONE {
                    continue;
                }
                if !good_slice.get(slice as usize).copied().unwrap_or(false) {
                    snap.problems.push(format!(
                        "process record {i} (pid {}): slice index {slice} on device {d} is not \
                         a usable slice; that part skipped",
                        p.pid.load(SeqCst)
                    ));
                    continue;
                }
                devices.push(ProcDeviceInfo {
                    device: d,
                    slice: slice as usize,
                    charged: pd.charged.load(SeqCst),
                });
            }
            snap.processes.push(ProcInfo {
                slot: i,
                pid: p.pid.load(SeqCst),
                start_time: p.start_time.load(SeqCst),
                pid_ns: p.pid_ns.load(SeqCst),
                host_pid: p.host_pid.load(SeqCst),
                slice: p.slice_name.get(),
                uid: p.uid.load(SeqCst),
                alive: alive[i],
                memory_used: devices
                    .iter()
                    .fold(0u64, |a, d| a.saturating_add(d.charged)),
                devices,
            });
        }
        for r in self.shared() {
            if r.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let (device, account) = (r.device.load(SeqCst) as usize, r.account.load(SeqCst));
            let slot = |x: u32| ((x as usize) < MAX_PROCS).then_some(x as usize);
            snap.shared.push(SharedInfo {
                device,
                slice: good_slice
                    .get(account as usize)
                    .copied()
                    .unwrap_or(false)
                    .then_some(account as usize),
                exporter: slot(r.exporter.load(SeqCst)),
                bytes: r.bytes.load(SeqCst),
                held: r.held.load(SeqCst),
                importers: r
                    .importers
                    .iter()
                    .filter_map(|x| slot(x.load(SeqCst)))
                    .collect(),
            });
        }
        snap
    }
}
