//! The memory audit: what NVML says each slice's processes hold on each device, matched to
//! the ledger's processes by pid and start time, compared with the slice's quota; a slice over
//! it is logged once and flagged in the ledger and, with `--on-violation kill`, the processes
//! that are themselves over (that hold more than they charged) are killed. Apart because it is
//! the one part of the monitor that looks past the ledger, at the driver's own figures.
//!
//! It acts only on what it knows (docs/security.md, "Detection of bypass"): a process the
//! ledger does not know is attributed by its uid, which the kernel gives, never by what its
//! environment claims. It counts in the slice its `GPUSLICE_SLICE` names only when that slice
//! is one its uid would join (its own, or an operator slice open to it); otherwise it is a
//! bypass of its own user, attributed to no slice, reported, and with `kill` ended.

use super::{Monitor, OnViolation};
use crate::prom::AuditRow;
use crate::view::NodeView;
use std::collections::HashSet;

impl Monitor {
    /// Compare what NVML says the slices' processes hold with their quotas (the policy's,
    /// which no tenant can write in node mode), and find bypasses (processes the ledger does
    /// not know, [`audit_rows`]). A slice over its quota is a violation: logged once, flagged
    /// in the ledger for `status` and metrics; with `--on-violation kill` the processes that
    /// are themselves over ([`AuditRow::to_kill`]) and every bypass of a tenant are killed.
    pub(super) fn audit(&mut self) {
        let (Some(nvml), Some(node)) = (&self.nvml, &self.node) else {
            return;
        };
        let Ok(devs) = nvml.devices() else { return };
        let me = std::process::id();
        let held: Vec<(String, Vec<Held>)> = devs
            .iter()
            .filter_map(|d| match nvml.processes(d.index) {
                Ok(Some(p)) => Some((
                    d.uuid.clone(),
                    p.into_iter()
                        // The monitor's own memory (balloons) is the node's, not a tenant's.
                        .filter(|&(pid, _)| pid != me)
                        .map(|(pid, bytes)| Held {
                            pid,
                            key: proc_key(pid),
                            uid: uid_of(pid),
                            bytes,
                            env_slice: env_slice(pid),
                        })
                        .collect(),
                )),
                _ => None,
            })
            .collect();
        let (rows, bypasses) = audit_rows(&node.snapshot(), &held, self.context_allowance);
        for line in audit_transitions(&mut self.over, &rows) {
            log!("{line}");
        }
        let kill = self.on_violation == OnViolation::Kill;
        let mut seen = HashSet::new();
        for b in &bypasses {
            seen.insert((b.pid, b.key.1));
            if self.bypassing.insert((b.pid, b.key.1)) || kill {
                log!(
                    "audit: pid {} of uid {} holds {} on {} outside gpuslice (not admitted{}); \
                     not counted in any slice{}",
                    b.pid,
                    b.uid.map_or("?".into(), |u| u.to_string()),
                    crate::table::size(b.bytes),
                    b.device_uuid,
                    match &b.named {
                        Some(n) => format!("; it names slice {n:?}, which is not its uid's"),
                        None => String::new(),
                    },
                    if kill {
                        ""
                    } else {
                        "; --on-violation kill would end it"
                    }
                );
            }
        }
        self.bypassing.retain(|k| seen.contains(k));
        node.record_audit(&rows);
        if kill {
            let victims = rows
                .iter()
                .filter(|r| r.over_quota())
                .flat_map(|r| r.to_kill().into_iter().map(move |pid| (pid, r)))
                .map(|(pid, r)| (pid, format!("of slice {:?} on {}", r.slice, r.device_uuid)))
                .chain(
                    bypasses
                        .iter()
                        .map(|b| (b.pid, format!("(a bypass) on {}", b.device_uuid))),
                );
            for (pid, what) in victims {
                // SAFETY: kill() on a pid NVML reports on the device right now and the audit
                // found over (checked against reuse by its start time when matched).
                let ok = unsafe { libc::kill(pid as i32, libc::SIGKILL) } == 0;
                log!(
                    "audit: --on-violation kill: {} pid {pid} {what}",
                    if ok { "killed" } else { "could not kill" },
                );
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
    /// Its effective uid, from `/proc/<pid>/status` (`None`: gone, or unreadable).
    uid: Option<u32>,
    bytes: u64,
    /// `GPUSLICE_SLICE` in its environment, for processes the ledger does not know.
    env_slice: Option<String>,
}

/// A process the ledger does not know, holding device memory, that no slice of its uid
/// accounts for: its user's bypass.
#[derive(Debug, Clone, PartialEq)]
struct Bypass {
    pid: u32,
    key: ProcKey,
    uid: Option<u32>,
    device_uuid: String,
    bytes: u64,
    /// The slice its environment names, which its uid may not use.
    named: Option<String>,
}

/// `GPUSLICE_SLICE` from `/proc/<pid>/environ` (root reads any process's).
fn env_slice(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"GPUSLICE_SLICE="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The effective uid of `pid` (the second `Uid:` field of `/proc/<pid>/status`).
pub(crate) fn uid_of(pid: u32) -> Option<u32> {
    gpuslice_ledger::procfs::uids_of(pid).map(|[_, euid, ..]| euid)
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

/// Per slice and device NVML reports on: what the slice's live processes hold there by NVML,
/// and the bypasses. A process the ledger knows is matched by its pid and start time (or by
/// pid alone where the start time could not be read) and counted in its slice with what it
/// charged there. One the ledger does not know counts in the slice its environment names only
/// if that slice is one its uid would join: an operator slice open to it, or its own (names
/// are namespaced by owner); anything else is a [`Bypass`] of its user. Root's processes
/// outside the ledger are the node's own and are neither.
///
/// NVML counts each process's CUDA context, which the driver takes and no quota counts (the
/// shim's quota is what the program allocates): every counted process is allowed `allowance`
/// beyond what it charged, so a slice at its full quota is not over, and a process is over
/// only past what it charged plus its allowance.
fn audit_rows(
    snap: &NodeView,
    held: &[(String, Vec<Held>)],
    allowance: u64,
) -> (Vec<AuditRow>, Vec<Bypass>) {
    let live: Vec<&crate::view::ProcessView> = snap.processes.iter().filter(|p| p.alive).collect();
    // Node mode: by the host pid the monitor recorded at admission (NVML reports host pids);
    // otherwise by the pid in the process's own namespace. Either with the start time; one
    // unknown on either side matches by pid.
    let matches = |h: &Held, p: &crate::view::ProcessView| {
        let pid = if p.host_pid != 0 {
            h.pid == p.host_pid
        } else {
            h.key.0 == p.pid
        };
        pid && (h.key.1 == p.start_time || h.key.1 == 0 || p.start_time == 0)
    };
    let known = |h: &Held| live.iter().any(|p| matches(h, p));
    let mut rows = Vec::new();
    let mut bypasses = Vec::new();
    for (uuid, procs) in held {
        let here: Vec<&crate::view::SliceView> = snap
            .slices
            .iter()
            .filter(|s| &s.device_uuid == uuid)
            .collect();
        for s in &here {
            let mut row = AuditRow {
                slice: s.name.clone(),
                index: s.index,
                device_uuid: s.device_uuid.clone(),
                observed: 0,
                limit: s.memory_limit,
                pids: vec![],
                excess: vec![],
                held: vec![],
                allowance: 0,
            };
            for h in procs {
                let member = live
                    .iter()
                    .find(|p| {
                        p.in_slices.iter().any(|(u, i)| u == uuid && *i == s.index) && matches(h, p)
                    })
                    .map(|p| {
                        p.charged
                            .iter()
                            .find(|(u, _)| u == uuid)
                            .map_or(0, |(_, c)| *c)
                    });
                let unknown = !known(h);
                let named = unknown
                    && h.uid.is_some()
                    && h.env_slice
                        .as_deref()
                        .and_then(|n| slice_of(&here, n, h.uid))
                        == Some(s.index);
                let charged = match (member, named) {
                    (Some(c), _) => c,
                    (None, true) => 0,
                    (None, false) => continue,
                };
                row.observed = row.observed.saturating_add(h.bytes);
                row.pids.push(h.pid);
                row.held.push(h.bytes);
                row.excess
                    .push(h.bytes.saturating_sub(charged.saturating_add(allowance)));
                row.allowance = row.allowance.saturating_add(allowance);
            }
            rows.push(row);
        }
        for h in procs {
            let unknown = !known(h);
            let counted = rows
                .iter()
                .any(|r| &r.device_uuid == uuid && r.pids.contains(&h.pid));
            if unknown && !counted && h.uid != Some(0) && h.bytes > 0 {
                bypasses.push(Bypass {
                    pid: h.pid,
                    key: h.key,
                    uid: h.uid,
                    device_uuid: uuid.clone(),
                    bytes: h.bytes,
                    named: h.env_slice.clone(),
                });
            }
        }
    }
    (rows, bypasses)
}

/// The slice (record index) a process of `uid` naming `name` would be admitted to, of
/// `here` (the slices on its device): the operator's slice of that name when there is one and
/// it is open to `uid`, else the one `uid` owns (`Ledger::slice_for`); a slice of no owner
/// (a personal ledger's) is everyone's.
fn slice_of(here: &[&crate::view::SliceView], name: &str, uid: Option<u32>) -> Option<usize> {
    let open = |x: &&&crate::view::SliceView| x.owner.is_none() || x.owner == uid;
    let mut named = here.iter().filter(|x| x.name == name);
    match named.clone().find(|x| x.operator) {
        Some(op) => Some(op).filter(open).map(|x| x.index),
        None => named.find(open).map(|x| x.index),
    }
}

/// Log lines for slices that went over their quota or came back, updating `over` (the slices
/// flagged now), so a slice that stays over is reported once, not every second.
fn audit_transitions(over: &mut HashSet<(usize, String)>, rows: &[AuditRow]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in rows {
        let key = (r.index, r.device_uuid.clone());
        if r.over_quota() && over.insert(key.clone()) {
            lines.push(format!(
                "audit: slice {:?} on {} holds {} by NVML, over its quota of {} and {} for \
                 its {} processes' CUDA contexts (--context-allowance {} each; memory taken \
                 outside gpuslice's accounting?)",
                r.slice,
                r.device_uuid,
                crate::table::size(r.observed),
                crate::table::size(r.limit.unwrap_or(0)),
                crate::table::size(r.allowance),
                r.pids.len(),
                crate::table::size(r.allowance / (r.pids.len().max(1) as u64)),
            ));
        } else if !r.over_quota() && over.remove(&key) {
            lines.push(format!(
                "audit: slice {:?} on {} is back within its quota",
                r.slice, r.device_uuid
            ));
        }
    }
    // A slice that went away is no longer over anything.
    over.retain(|k| rows.iter().any(|r| r.index == k.0 && r.device_uuid == k.1));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `snap` with each process in the slices whose `pids` name it: how these tests describe
    /// membership (one PID namespace, so pids are unique).
    fn members_by_pid(snap: &NodeView) -> NodeView {
        let mut snap = snap.clone();
        for p in &mut snap.processes {
            p.in_slices = snap
                .slices
                .iter()
                .filter(|s| s.pids.contains(&p.pid))
                .map(|s| (s.device_uuid.clone(), s.index))
                .collect();
        }
        snap
    }

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
        // Honest members: they charged what they hold.
        snap.processes[0].charged = vec![(uuid.clone(), 3 << 30)];
        snap.processes[1].charged = vec![(uuid.clone(), 1 << 30)];
        // train (an open operator slice, 4 GiB quota): pids 100 and 101.
        let held = |a: u64, b: u64| {
            vec![(
                uuid.clone(),
                // 100 matches by pid and start time; 101's start time was unreadable; a process
                // with 100's pid but another start time (another namespace) is not train's.
                // 555 bypasses gpuslice (not in the ledger) but names train, open to its uid.
                [
                    ((100, 7), a, None, 1000),
                    ((101, 0), b, None, 1000),
                    ((100, 8), 1 << 40, None, 1000),
                    ((999, 7), 1 << 40, None, 1000),
                    ((555, 3), 1 << 30, Some("train"), 1000),
                    ((556, 3), 0, None, 0),
                ]
                .into_iter()
                .map(|(key, bytes, env, uid)| Held {
                    // NVML's pid (the host's): another process than 100 for (100, 8).
                    pid: key.0 + if key.1 == 8 { 20_000 } else { 10_000 },
                    key,
                    uid: Some(uid),
                    bytes,
                    env_slice: env.map(String::from),
                })
                .collect::<Vec<_>>(),
            )]
        };
        let (rows, bypasses) = audit_rows(&members_by_pid(&snap), &held(3 << 30, 1 << 30), 0);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].observed, rows[0].over_quota()), (5 << 30, true));
        let mut pids = rows[0].pids.clone();
        pids.sort();
        assert_eq!(pids, [10_100, 10_101, 10_555], "the NVML pids counted");
        assert_eq!(
            rows[0].to_kill(),
            [10_555],
            "kill ends the process that is over, never the members within what they charged"
        );
        let mut by: Vec<u32> = bypasses.iter().map(|b| b.pid).collect();
        by.sort();
        assert_eq!(
            by,
            [10_999, 20_100],
            "unknown processes in no slice of theirs"
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
                && lines[0].contains("5 GiB")
                && lines[0].contains("4 GiB"),
            "{lines:?}"
        );
        assert!(
            audit_transitions(&mut over, &rows).is_empty(),
            "reported once"
        );
        let (back, _) = audit_rows(&members_by_pid(&snap), &held(1 << 30, 1 << 30), 0);
        let back: Vec<AuditRow> = back
            .into_iter()
            .map(|mut r| {
                if r.index == 0 {
                    r.observed -= 1 << 30; // the bypass is gone
                }
                r
            })
            .collect();
        let lines = audit_transitions(&mut over, &back);
        assert!(
            lines.len() == 1 && lines[0].contains("back within"),
            "{lines:?}"
        );
        assert!(over.is_empty());
    }

    /// Two pods' first processes are both pid 1 in their namespaces, and may share a start
    /// second: in node mode each is matched by the host pid the monitor recorded at admission
    /// and counted in its own slice only (found on a real cluster, where the audit counted
    /// both in both slices and `--on-violation kill` killed a pod within its quota).
    #[test]
    fn processes_of_two_pods_with_one_pid_count_in_their_own_slices() {
        let mut snap = crate::view::tests::sample();
        let uuid = snap.devices[0].uuid.clone();
        for (i, host) in [(0usize, 8513u32), (2, 8600)] {
            let p = &mut snap.processes[i];
            p.pid = 1;
            p.start_time = 7;
            p.alive = true;
            p.host_pid = host;
            p.charged = vec![(uuid.clone(), 2 << 30)];
            p.in_slices = vec![(uuid.clone(), snap.slices[if i == 0 { 0 } else { 1 }].index)];
        }
        snap.processes.remove(1);
        snap.slices[0].pids = vec![1];
        snap.slices[1].pids = vec![1];
        snap.slices[0].memory_limit = Some(4 << 30);
        snap.slices[1].memory_limit = Some(4 << 30);
        let h = |pid: u32| Held {
            pid,
            key: (1, 7),
            uid: Some(1000),
            bytes: 2 << 30,
            env_slice: None,
        };
        let held = vec![(uuid, vec![h(8513), h(8600)])];
        let (rows, bypasses) = audit_rows(&snap, &held, 0);
        for r in &rows {
            assert_eq!(r.observed, 2 << 30, "{r:?}");
            assert!(!r.over_quota(), "{r:?}");
        }
        assert_eq!(rows[0].pids, [8513]);
        assert_eq!(rows[1].pids, [8600]);
        assert!(bypasses.is_empty());
    }

    /// Issue #27: a bypass that names another user's slice is that user's own bypass, never
    /// counted in the slice, so the slice is not flagged and its processes are not killed.
    #[test]
    fn a_bypass_naming_another_users_slice_is_its_own() {
        let mut snap = crate::view::tests::sample();
        let uuid = snap.devices[0].uuid.clone();
        // "infer" becomes uid 2's own slice with a quota; uid 1 names it without the shim.
        snap.slices[1].owner = Some(2);
        snap.slices[1].memory_limit = Some(1 << 30);
        snap.slices[1].pids = vec![102];
        snap.processes[2].alive = true;
        snap.processes[2].uid = 2;
        snap.processes[2].charged = vec![(uuid.clone(), 512 << 20)];
        let name = snap.slices[1].name.clone();
        let h = |key: ProcKey, bytes: u64, env: Option<&str>, uid: u32| Held {
            pid: key.0,
            key,
            uid: Some(uid),
            bytes,
            env_slice: env.map(String::from),
        };
        let held = vec![(
            uuid,
            vec![
                h((102, 7), 512 << 20, None, 2),
                h((700, 9), 1 << 30, Some(&name), 1),
            ],
        )];
        let (rows, bypasses) = audit_rows(&members_by_pid(&snap), &held, 0);
        let infer = rows.iter().find(|r| r.index == 1).unwrap();
        assert_eq!((infer.observed, infer.over_quota()), (512 << 20, false));
        assert_eq!(infer.pids, [102]);
        assert_eq!(bypasses.len(), 1);
        assert_eq!(
            (
                bypasses[0].pid,
                bypasses[0].uid,
                bypasses[0].named.as_deref()
            ),
            (700, Some(1), Some(name.as_str()))
        );
        // Its own uid's slice of that name takes it in: uid 2 naming its own slice.
        let held2 = vec![(
            held[0].0.clone(),
            vec![
                h((102, 7), 512 << 20, None, 2),
                h((701, 9), 1 << 30, Some(&name), 2),
            ],
        )];
        let (rows, bypasses) = audit_rows(&members_by_pid(&snap), &held2, 0);
        let infer = rows.iter().find(|r| r.index == 1).unwrap();
        assert!(infer.over_quota() && bypasses.is_empty());
        assert_eq!(infer.to_kill(), [701]);
    }

    /// Issue #26/#27: NVML counts each process's CUDA context, which no quota does. A slice
    /// whose processes fill its quota exactly is within it by the allowance; a process that
    /// holds more than it charged plus its allowance is still over, and the one killed.
    #[test]
    fn each_process_is_allowed_its_context() {
        let mut snap = crate::view::tests::sample();
        let uuid = snap.devices[0].uuid.clone();
        // train: 4 GiB quota; 100 and 101 charged 3 GiB and 1 GiB (the whole quota).
        snap.processes[0].charged = vec![(uuid.clone(), 3 << 30)];
        snap.processes[1].charged = vec![(uuid.clone(), 1 << 30)];
        let ctx = 300 << 20;
        let allowance = 512 << 20;
        let held = |extra: u64| {
            vec![(
                uuid.clone(),
                [
                    ((100, 7), (3 << 30) + ctx),
                    ((101, 0), (1 << 30) + ctx + extra),
                ]
                .into_iter()
                .map(|(key, bytes)| Held {
                    pid: key.0,
                    key,
                    uid: Some(1000),
                    bytes,
                    env_slice: None,
                })
                .collect::<Vec<_>>(),
            )]
        };
        let (rows, _) = audit_rows(&members_by_pid(&snap), &held(0), allowance);
        let train = &rows[0];
        assert_eq!(train.observed, (4 << 30) + 2 * ctx);
        assert_eq!(train.allowance, 2 * allowance);
        assert!(!train.over_quota(), "a full quota and two contexts");
        assert!(train.to_kill().is_empty());
        // Without the allowance the same slice reads as over: what the audit did before.
        let (rows, _) = audit_rows(&members_by_pid(&snap), &held(0), 0);
        assert!(rows[0].over_quota() && rows[0].to_kill() == [101, 100]);
        // 101 takes 1 GiB past its quota outside gpuslice: over, and only it is killed.
        let (rows, _) = audit_rows(&members_by_pid(&snap), &held(1 << 30), allowance);
        assert!(rows[0].over_quota());
        assert_eq!(rows[0].excess, [0, (1 << 30) + ctx - allowance]);
        assert_eq!(rows[0].to_kill(), [101]);
        let mut over = HashSet::new();
        let lines = audit_transitions(&mut over, &rows);
        assert!(
            lines.len() == 1 && lines[0].contains("--context-allowance 512 MiB each"),
            "{lines:?}"
        );
    }
}
