//! The memory audit: what NVML says each slice's processes hold on each device, matched to
//! the ledger's processes by pid and start time (or by the slice their environment names),
//! compared with the slice's quota; a slice over it is logged once, flagged in the ledger and,
//! with `--on-violation kill`, its processes there are killed. Apart because it is the one
//! part of the monitor that looks past the ledger, at the driver's own figures.

use super::{Monitor, OnViolation};
use crate::prom::AuditRow;
use crate::view::NodeView;
use std::collections::{HashMap, HashSet};

impl Monitor {
    /// Compare what NVML says the slices' processes hold with their quotas (the policy's,
    /// which no tenant can write in node mode). A process that holds device memory without
    /// being in the ledger (`GPUSLICE_DISABLE=1`, no `LD_PRELOAD`) is counted in the slice its
    /// environment names (`GPUSLICE_SLICE`, read from `/proc/<pid>/environ` by the monitor).
    /// A slice over its quota is a violation: logged once, flagged in the ledger for `status`
    /// and metrics, and with `--on-violation kill` its processes on that device are killed.
    pub(super) fn audit(&mut self) {
        let (Some(nvml), Some(node)) = (&self.nvml, &self.node) else {
            return;
        };
        let Ok(devs) = nvml.devices() else { return };
        let held: Vec<(String, Vec<Held>)> = devs
            .iter()
            .filter_map(|d| match nvml.processes(d.index) {
                Ok(Some(p)) => Some((
                    d.uuid.clone(),
                    p.into_iter()
                        .map(|(pid, bytes)| Held {
                            pid,
                            key: proc_key(pid),
                            bytes,
                            env_slice: env_slice(pid),
                        })
                        .collect(),
                )),
                _ => None,
            })
            .collect();
        let rows = audit_rows(&node.snapshot(), &held);
        for line in audit_transitions(&mut self.over, &rows) {
            log!("{line}");
        }
        node.record_audit(&rows);
        if self.on_violation == OnViolation::Kill {
            for r in rows.iter().filter(|r| r.over_quota()) {
                for &pid in &r.pids {
                    // SAFETY: kill() on a pid NVML reports on the device right now, attributed
                    // to the slice over its quota; checked against reuse by its start time.
                    let ok = unsafe { libc::kill(pid as i32, libc::SIGKILL) } == 0;
                    log!(
                        "audit: --on-violation kill: {} pid {pid} of slice {:?} on {}",
                        if ok { "killed" } else { "could not kill" },
                        r.slice,
                        r.device_uuid
                    );
                }
            }
        }
        if let Ok(mut f) = self.facts.lock() {
            f.audit = rows;
            f.device_observed = devs
                .iter()
                .map(|d| (d.uuid.clone(), d.memory_used))
                .collect();
        }
    }
}

/// One process NVML reports on a device.
#[derive(Debug, Clone)]
struct Held {
    /// pid as NVML (the monitor's namespace) sees it.
    pid: u32,
    key: ProcKey,
    bytes: u64,
    /// `GPUSLICE_SLICE` in its environment, for processes the ledger does not know.
    env_slice: Option<String>,
}

/// `GPUSLICE_SLICE` from `/proc/<pid>/environ` (root reads any process's).
fn env_slice(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"GPUSLICE_SLICE="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// How the audit recognises a process: its pid in its own (innermost) PID namespace, as it
/// recorded itself in the ledger, and its start time; `0` when unknown.
type ProcKey = (u32, u64);

/// The [`ProcKey`] of a pid NVML reports (a pid of the monitor's namespace, normally the
/// host's): the last `NSpid` of `/proc/<pid>/status` and field 22 of `/proc/<pid>/stat`.
fn proc_key(pid: u32) -> ProcKey {
    let inner = gpuslice_ledger::innermost_pid_of(pid).unwrap_or(pid);
    (inner, gpuslice_ledger::start_time_of(&pid.to_string()))
}

/// Per slice and device NVML reports on: what the slice's live processes hold there by NVML.
/// A process is matched by its pid and start time, or by pid alone where the start time could
/// not be read; NVML processes the ledger does not know count in the slice their environment
/// names. Each row keeps the NVML pids it counted (what `--on-violation kill` ends).
fn audit_rows(snap: &NodeView, held: &[(String, Vec<Held>)]) -> Vec<AuditRow> {
    let start: HashMap<u32, u64> = snap
        .processes
        .iter()
        .filter(|p| p.alive)
        .map(|p| (p.pid, p.start_time))
        .collect();
    let known: HashSet<ProcKey> = snap
        .processes
        .iter()
        .filter(|p| p.alive)
        .flat_map(|p| [(p.pid, p.start_time), (p.pid, 0)])
        .collect();
    let mut rows = Vec::new();
    for (uuid, procs) in held {
        for s in snap.slices.iter().filter(|s| &s.device_uuid == uuid) {
            let mut row = AuditRow {
                slice: s.name.clone(),
                device_uuid: s.device_uuid.clone(),
                observed: 0,
                limit: s.memory_limit,
                pids: vec![],
            };
            for h in procs {
                let member = s.pids.iter().any(|pid| {
                    let st = start.get(pid).copied().unwrap_or(0);
                    h.key == (*pid, st) || (h.key.0 == *pid && h.key.1 == 0)
                });
                let named = !known.contains(&h.key)
                    && !known.contains(&(h.key.0, 0))
                    && h.env_slice.as_deref() == Some(s.name.as_str());
                if member || named {
                    row.observed = row.observed.saturating_add(h.bytes);
                    row.pids.push(h.pid);
                }
            }
            rows.push(row);
        }
    }
    rows
}

/// Log lines for slices that went over their quota or came back, updating `over` (the slices
/// flagged now), so a slice that stays over is reported once, not every second.
fn audit_transitions(over: &mut HashSet<(String, String)>, rows: &[AuditRow]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in rows {
        let key = (r.slice.clone(), r.device_uuid.clone());
        if r.over_quota() && over.insert(key.clone()) {
            lines.push(format!(
                "audit: slice {:?} on {} holds {} by NVML, over its quota of {} \
                 (memory taken outside gpuslice's accounting?)",
                r.slice,
                r.device_uuid,
                crate::table::size(r.observed),
                crate::table::size(r.limit.unwrap_or(0))
            ));
        } else if !r.over_quota() && over.remove(&key) {
            lines.push(format!(
                "audit: slice {:?} on {} is back within its quota",
                r.slice, r.device_uuid
            ));
        }
    }
    // A slice that went away is no longer over anything.
    over.retain(|k| rows.iter().any(|r| r.slice == k.0 && r.device_uuid == k.1));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_keyed_as_it_recorded_itself() {
        let me = std::process::id();
        assert_eq!(proc_key(me), (me, gpuslice_ledger::own_start_time()));
    }

    #[test]
    fn the_audit_flags_a_slice_over_its_quota_once_and_its_return() {
        let mut snap = crate::view::tests::sample();
        let uuid = snap.devices[0].uuid.clone();
        snap.slices[1].pids = vec![102];
        // train (4 GiB quota): pids 100 and 101; 102 is in a best-effort slice.
        let held = |a: u64, b: u64| {
            vec![(
                uuid.clone(),
                // 100 matches by pid and start time; 101's start time was unreadable; a process
                // with 100's pid but another start time (another namespace) is not train's.
                // 555 bypasses gpuslice (not in the ledger) but names train in its environment.
                [
                    ((100, 7), a, None),
                    ((101, 0), b, None),
                    ((100, 8), 1 << 40, None),
                    ((102, 7), 9 << 30, None),
                    ((999, 7), 1 << 40, None),
                    ((555, 3), a / 3, Some("train")),
                ]
                .into_iter()
                .map(|(key, bytes, env)| Held {
                    pid: key.0 + 10_000,
                    key,
                    bytes,
                    env_slice: env.map(String::from),
                })
                .collect::<Vec<_>>(),
            )]
        };
        let rows = audit_rows(&snap, &held(3 << 30, 2 << 30));
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].observed, rows[0].over_quota()), (6 << 30, true));
        let mut pids = rows[0].pids.clone();
        pids.sort();
        assert_eq!(
            pids,
            [10_100, 10_101, 10_555],
            "the NVML pids kill would end"
        );
        assert!(
            !rows[1].over_quota(),
            "a best-effort slice has no quota to exceed"
        );
        let mut over = HashSet::new();
        let lines = audit_transitions(&mut over, &rows);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains("\"train\"")
                && lines[0].contains("6 GiB")
                && lines[0].contains("4 GiB"),
            "{lines:?}"
        );
        assert!(
            audit_transitions(&mut over, &rows).is_empty(),
            "reported once"
        );
        let back = audit_rows(&snap, &held(1 << 30, 1 << 30));
        let lines = audit_transitions(&mut over, &back);
        assert!(
            lines.len() == 1 && lines[0].contains("back within"),
            "{lines:?}"
        );
        assert!(over.is_empty());
    }
}
