//! The ledger's snapshot as the node every view shows ([`NodeView`]): ledger indices to
//! NVML's, ppm to fractions, and processes that have exited already gone with what they held.

use super::LedgerWindow;
use crate::view::{DeviceView, NodeView, ProcessView, SliceView};
use gpuslice_ledger::{ProcInfo, Snapshot, PPM};
use std::collections::HashMap;
use std::path::Path;

fn ratio(ppm: u32) -> f64 {
    ppm as f64 / PPM as f64
}

impl LedgerWindow {
    /// The node as every view shows it. Device indices are NVML's where NVML is available
    /// (what `nvidia-smi` shows), else the ledger's.
    pub fn snapshot(&self) -> NodeView {
        let mut s = self.ledger.snapshot();
        let node_mode = self.ledger.is_node();
        let own_ns = gpuslice_ledger::procfs::own_pid_identity().0;
        as_reaped(&mut s, node_mode, &|p| exited(p, node_mode, own_ns));
        let nvml = crate::nvml::indices();
        let index = |uuid: &str, ledger_index: usize| {
            nvml.get(uuid).copied().unwrap_or(ledger_index as u32)
        };
        let devices = s
            .devices
            .iter()
            .map(|d| DeviceView {
                uuid: d.uuid.clone(),
                index: index(&d.uuid, d.index),
                name: d.name.clone(),
                memory_total: d.memory_total,
                memory_reserved: d.memory_reserved,
                memory_used: d.memory_used,
                compute_reserved: ratio(d.compute_reserved_ppm),
                context_bytes: d.context_bytes,
            })
            .collect();
        let slice_names: HashMap<usize, &str> = s
            .slices
            .iter()
            .map(|sl| (sl.index, sl.name.as_str()))
            .collect();
        let alive: HashMap<u32, bool> = s.processes.iter().map(|p| (p.pid, p.alive)).collect();
        // Every slice's compute figures at one moment, so a device's `compute_used` sum to at
        // most 1.
        let now = gpuslice_sched::now_ns();
        let mut compute: Vec<_> = s
            .slices
            .iter()
            .map(|sl| {
                let c = crate::compute::slice_compute(&self.ledger, sl.index, now);
                (sl.device_uuid.as_str(), c)
            })
            .collect();
        crate::compute::shares_of_busy_time(&mut compute);
        let slices = s
            .slices
            .iter()
            .zip(compute)
            .map(|(sl, (_, compute))| {
                SliceView {
                    name: sl.name.clone(),
                    device_uuid: sl.device_uuid.clone(),
                    memory_limit: sl.memory_limit,
                    memory_used: sl.memory_used,
                    memory_contexts: sl.context_used,
                    memory_held_for_importers: s
                        .shared
                        .iter()
                        .filter(|r| r.exporter.is_none() && r.slice == Some(sl.index))
                        .fold(0u64, |a, r| a.saturating_add(r.held))
                        .min(sl.memory_used),
                    compute_share: sl.compute_share.fraction(),
                    compute_cap: sl.compute_cap.fraction(),
                    compute_used: compute.used,
                    // Only the living: a dead process awaiting the reaper is in `processes`.
                    pids: {
                        let mut v: Vec<u32> = sl
                            .pids
                            .iter()
                            .copied()
                            .filter(|p| alive.get(p).copied().unwrap_or(false))
                            .collect();
                        v.sort_unstable();
                        v
                    },
                    operator: sl.operator_defined,
                    allocations_denied: sl.alloc_denied_total,
                    launches: compute.launches,
                    throttled_seconds: compute.throttled_seconds,
                    claim: sl.claim.clone(),
                    owner: sl.owner,
                    index: sl.index,
                    over_quota: sl.over_quota,
                    audit_observed: sl.audit_observed,
                    violations_total: sl.violations_total,
                    priority: compute.priority,
                }
            })
            .collect();
        let mut processes: Vec<ProcessView> = s
            .processes
            .iter()
            .map(|p| ProcessView {
                pid: p.pid,
                start_time: p.start_time,
                // The slice it joined (a private one is `pid-N`), else the name it asked for.
                slice: p
                    .devices
                    .first()
                    .and_then(|d| slice_names.get(&d.slice))
                    .map_or_else(|| p.slice.clone(), |n| n.to_string()),
                memory_used: p.memory_used,
                alive: p.alive,
                uid: p.uid,
                charged: p
                    .devices
                    .iter()
                    .filter_map(|d| {
                        let uuid = s.devices.iter().find(|x| x.index == d.device)?;
                        Some((uuid.uuid.clone(), d.charged))
                    })
                    .collect(),
                in_slices: p
                    .devices
                    .iter()
                    .filter_map(|d| {
                        let uuid = s.devices.iter().find(|x| x.index == d.device)?;
                        Some((uuid.uuid.clone(), d.slice))
                    })
                    .collect(),
                host_pid: p.host_pid,
            })
            .collect();
        processes.sort_by_key(|p| p.pid);
        let live: Vec<usize> = s.processes.iter().map(|p| p.slot).collect();
        let orphans = s
            .shared
            .iter()
            .filter(|r| r.exporter.is_none() && r.held > 0)
            .filter_map(|r| {
                let uuid = s.devices.iter().find(|x| x.index == r.device)?;
                Some(crate::view::OrphanView {
                    slice: r
                        .slice
                        .and_then(|i| slice_names.get(&i))
                        .map(|n| n.to_string()),
                    device_uuid: uuid.uuid.clone(),
                    bytes: r.held,
                    importers: r.importers.iter().filter(|i| live.contains(i)).count(),
                })
            })
            .collect();
        NodeView {
            devices,
            slices,
            processes,
            problems: s.problems,
            orphans,
        }
    }
}

/// Whether process `p` has exited, checked now rather than at the reaper's last tick: the
/// ledger says so (personal mode: its liveness lock is gone), or its pid no longer runs with
/// its start time. Node mode keeps a record active until the monitor reaps it; there the pid
/// to look at is the host's (the monitor runs in the host's PID namespace), so only root in
/// that namespace looks (it sees every user's processes, whatever `/proc`'s `hidepid`). In
/// personal mode it is the pid in the process's namespace, when that is ours. A pid whose
/// `/proc` entry exists but cannot be read is not taken for gone. Otherwise the process is as
/// the ledger says.
fn exited(p: &ProcInfo, node_mode: bool, own_ns: u64) -> bool {
    if !p.alive {
        return true;
    }
    // Its pid as this reader's namespace sees it: its own pid when the reader shares its
    // namespace (a node's processes and root's CLI usually do, in a container too), else, in
    // node mode, the host's pid the monitor recorded when the reader is root in the host's.
    let pid = if p.pid_ns != 0 && p.pid_ns == own_ns {
        Some(p.pid)
    } else if node_mode {
        (own_ns == gpuslice_ledger::procfs::INITIAL_PID_NS && gpuslice_ledger::dir::euid() == 0)
            .then_some(p.host_pid)
    } else {
        None
    };
    let Some(pid) = pid.filter(|&pid| pid != 0) else {
        return false;
    };
    match gpuslice_ledger::start_time_of(&pid.to_string()) {
        0 => !Path::new(&format!("/proc/{pid}")).exists(),
        // Another process that took the pid, or this one exited and not yet waited for (a
        // zombie has released its memory: `alive` says what it is, as the reaper will).
        start => start != p.start_time || !gpuslice_ledger::is_running(pid, start),
    }
}

/// The node as the reaper will leave it: processes that have `exited` are gone at once, what
/// they held is returned to their slices and devices, and a process's slice with no process
/// left goes too, with what it reserved. The views show this, so a program that exits is never
/// listed after it (`status` right after `gpuslice run` returns). In node mode (`node_mode`)
/// an exporter's records stay charged after it as the reaper leaves them, for the descriptors
/// that may hold them (the monitor's scan of `/proc/*/fd` lets them go).
fn as_reaped(s: &mut Snapshot, node_mode: bool, exited: &dyn Fn(&ProcInfo) -> bool) {
    let (gone, kept): (Vec<ProcInfo>, Vec<ProcInfo>) =
        s.processes.drain(..).partition(|p| exited(p));
    s.processes = kept;
    // Exported allocations a live importer (node mode: or a descriptor) holds stay charged to
    // their exporter's slice, as the reaper leaves them (`gpuslice_ledger`'s `shared.rs`); the
    // others go.
    let live: Vec<usize> = s.processes.iter().map(|p| p.slot).collect();
    let mut kept_for: Vec<(usize, usize, u64)> = vec![];
    let mut freed: Vec<(Option<usize>, usize, u64)> = vec![];
    s.shared.retain_mut(|r| {
        let imported = node_mode || r.importers.iter().any(|i| live.contains(i));
        match r.exporter {
            Some(_) if !imported => false, // with the exporter's charge, or still its own
            Some(e) if !live.contains(&e) => {
                kept_for.push((e, r.device, r.bytes));
                (r.exporter, r.held) = (None, r.bytes);
                true
            }
            Some(_) => true,
            None if !imported => {
                freed.push((r.slice, r.device, r.held));
                false
            }
            None => true,
        }
    });
    for p in &gone {
        for pd in &p.devices {
            let kept = kept_for
                .iter()
                .filter(|&&(e, d, _)| e == p.slot && d == pd.device)
                .fold(0u64, |a, &(_, _, n)| a.saturating_add(n));
            freed.push((Some(pd.slice), pd.device, pd.charged.saturating_sub(kept)));
        }
    }
    for (slice, device, n) in freed {
        if let Some(sl) = s.slices.iter_mut().find(|sl| Some(sl.index) == slice) {
            sl.memory_used = sl.memory_used.saturating_sub(n);
        }
        if let Some(d) = s.devices.iter_mut().find(|d| d.index == device) {
            d.memory_used = d.memory_used.saturating_sub(n);
        }
    }
    // A slice is emptied when a process left it and none is left (an operator's slice stays);
    // what it reserved on its device is free again.
    let gone_pids: Vec<u32> = gone.iter().map(|p| p.pid).collect();
    let mut kept = Vec::with_capacity(s.slices.len());
    for mut sl in s.slices.drain(..) {
        let before = sl.pids.len();
        sl.pids.retain(|p| !gone_pids.contains(p));
        let charged_shared = s.shared.iter().any(|r| r.slice == Some(sl.index));
        if sl.operator_defined || sl.pids.len() == before || !sl.pids.is_empty() || charged_shared {
            kept.push(sl);
            continue;
        }
        if let Some(d) = s.devices.iter_mut().find(|d| d.index == sl.device) {
            d.memory_reserved = d
                .memory_reserved
                .saturating_sub(sl.memory_limit.unwrap_or(0));
            d.memory_used = d.memory_used.saturating_sub(sl.memory_used);
            d.compute_reserved_ppm = d
                .compute_reserved_ppm
                .saturating_sub(sl.compute_share.ppm());
        }
    }
    s.slices = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::SliceInfo;
    use gpuslice_quantity::{Cap, Share};

    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;

    fn proc_(pid: u32, alive: bool, slice: usize, device: usize, charged: u64) -> ProcInfo {
        ProcInfo {
            slot: pid as usize,
            pid,
            start_time: 1,
            pid_ns: 0,
            host_pid: pid,
            slice: String::new(),
            uid: 1000,
            alive,
            memory_used: charged,
            devices: vec![gpuslice_ledger::ProcDeviceInfo {
                device,
                slice,
                charged,
            }],
        }
    }

    /// Device 0 of 16 GiB, 12 GiB and 0.75 of it reserved, `used` in use.
    fn device_(used: u64) -> gpuslice_ledger::DeviceInfo {
        gpuslice_ledger::DeviceInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "Test".into(),
            memory_total: 16 * GI,
            memory_reserved: 12 * GI,
            memory_used: used,
            best_effort_used: 0,
            compute_reserved_ppm: 750_000,
            context_bytes: 0,
        }
    }

    fn slice_(index: usize, name: &str, operator: bool, pids: Vec<u32>, used: u64) -> SliceInfo {
        SliceInfo {
            index,
            name: name.into(),
            device: 0,
            device_uuid: "GPU-0".into(),
            operator_defined: operator,
            private: false,
            memory_limit: Some(4 * GI),
            memory_used: used,
            context_used: 0,
            compute_share: Share::from_ppm(250_000),
            compute_cap: Cap::NONE,
            attached: pids.len() as u32,
            pids,
            alloc_total: 0,
            alloc_denied_total: 0,
            claim: None,
            owner: None,
            priority: 0,
            over_quota: false,
            audit_observed: 0,
            violations_total: 0,
        }
    }

    #[test]
    fn an_exited_process_is_gone_from_the_view_with_what_it_held_and_its_emptied_slice() {
        let mut s = Snapshot::default();
        s.devices.push(device_(4 * GI));
        // "done": its one process exited. "op": an operator's, one of two processes exited.
        // "busy": its process runs.
        s.slices = vec![
            slice_(0, "done", false, vec![10], GI),
            slice_(1, "op", true, vec![20, 21], 2 * GI),
            slice_(2, "busy", false, vec![30], GI),
        ];
        s.processes = vec![
            proc_(10, false, 0, 0, GI),
            proc_(20, true, 1, 0, GI),
            proc_(21, false, 1, 0, GI),
            proc_(30, true, 2, 0, GI),
        ];
        as_reaped(&mut s, false, &|p| !p.alive);
        let pids: Vec<u32> = s.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [20, 30]);
        let slices: Vec<(&str, &[u32], u64)> = s
            .slices
            .iter()
            .map(|sl| (sl.name.as_str(), sl.pids.as_slice(), sl.memory_used))
            .collect();
        assert_eq!(slices, [("op", &[20][..], GI), ("busy", &[30][..], GI)]);
        let d = &s.devices[0];
        assert_eq!(
            (d.memory_used, d.memory_reserved, d.compute_reserved_ppm),
            (2 * GI, 8 * GI, 500_000)
        );
    }

    #[test]
    fn an_exited_exporter_keeps_what_a_live_importer_holds_in_the_view() {
        let mut s = Snapshot::default();
        s.devices.push(device_(3 * GI + 256 * MI));
        // "x": its exporter (10) exited, charged 1 GiB of which 256 MiB are exported to 20,
        // alive; "y": the importer's. "z": its exporter (30) exited, its importer (31) too.
        s.slices = vec![
            slice_(0, "x", false, vec![10], GI),
            slice_(1, "y", false, vec![20], 0),
            slice_(2, "z", false, vec![30, 31], 2 * GI + 256 * MI),
        ];
        s.processes = vec![
            proc_(10, false, 0, 0, GI),
            proc_(20, true, 1, 0, 0),
            proc_(30, false, 2, 0, 2 * GI),
            proc_(31, false, 2, 0, 0),
        ];
        let shared = |slice, exporter, held, importers| gpuslice_ledger::SharedInfo {
            device: 0,
            slice: Some(slice),
            exporter,
            bytes: 256 * MI,
            held,
            importers,
        };
        s.shared = vec![
            shared(0, Some(10), 0, vec![20]),
            shared(2, None, 256 * MI, vec![31]),
        ];
        as_reaped(&mut s, false, &|p| !p.alive);
        let slices: Vec<(&str, u64)> = s
            .slices
            .iter()
            .map(|sl| (sl.name.as_str(), sl.memory_used))
            .collect();
        assert_eq!(slices, [("x", 256 * MI), ("y", 0)]);
        assert_eq!(s.devices[0].memory_used, 256 * MI);
        assert_eq!(s.shared.len(), 1);
        assert_eq!((s.shared[0].exporter, s.shared[0].held), (None, 256 * MI));
    }
}
