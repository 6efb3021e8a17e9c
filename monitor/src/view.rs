//! One consistent picture of the node, as every view shows it: devices, slices, processes.
//!
//! [`NodeView`] is plain data, built from the ledger by `LedgerWindow::snapshot` (`ledger_window/snapshot.rs`) and
//! rendered by `table.rs` for people, [`NodeView::to_json`] for `status --json` (the
//! contract's field names, sizes in bytes, fractions 0..1) and `prom.rs` for Prometheus. It
//! imports none of them.

use serde_json::{json, Value};

/// A device as the ledger knows it (keyed by UUID; `index` is NVML's where known).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceView {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub memory_total: u64,
    /// Sum of the memory limits of the slices on this device.
    pub memory_reserved: u64,
    /// Sum of what the slices on this device hold.
    pub memory_used: u64,
    /// Sum of the guaranteed compute shares on this device (0..1).
    pub compute_reserved: f64,
    /// Node mode: what one CUDA context is charged to its slice's quota (0: not charged).
    pub context_bytes: u64,
}

/// A slice on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceView {
    pub name: String,
    pub device_uuid: String,
    /// Quota in bytes; `None` for a best-effort slice (no quota: it takes from what the
    /// device has left unreserved).
    pub memory_limit: Option<u64>,
    pub memory_used: u64,
    /// Of `memory_used`, what its live processes' CUDA contexts are charged (node mode; the
    /// rest is allocations).
    pub memory_contexts: u64,
    /// Of `memory_used`, what VMM allocations its processes exported hold after their
    /// exporter let go or exited, because another process still maps them.
    pub memory_held_for_importers: u64,
    /// Guaranteed share, 0..1; 0 means best effort.
    pub compute_share: f64,
    /// Hard ceiling, 0..1; 1 means none.
    pub compute_cap: f64,
    /// COMPUTE USED: the slice's part of the device's busy time over the last second (a
    /// device's slices sum to at most 1; `crate::compute::shares_of_busy_time`).
    pub compute_used: f64,
    /// Live processes attached to the slice.
    pub pids: Vec<u32>,
    /// Created by an operator (`gpuslice slice create`) rather than by a process.
    pub operator: bool,
    /// Allocations refused because the slice was full (counter).
    pub allocations_denied: u64,
    /// Kernel and graph launches (counter).
    pub launches: u64,
    /// Seconds launches of this slice waited for their turn (counter).
    pub throttled_seconds: f64,
    /// The operator's label (Kubernetes `namespace/name`), if any.
    pub claim: Option<String>,
    /// Node mode: the uid it belongs to (a tenant's slice is its maker's: names are namespaced
    /// by owner); `None`: open to every uid (an operator slice without `--owner`).
    pub owner: Option<u32>,
    /// Its ledger record (two tenants' slices may share a name). Not part of the JSON.
    pub index: usize,
    /// The audit (monitor): NVML reports more for its processes than its quota.
    pub over_quota: bool,
    /// The audit: bytes NVML last reported for its processes.
    pub audit_observed: u64,
    /// The audit: times it went over its quota.
    pub violations_total: u64,
    /// Priority class: `latency` or `normal`.
    pub priority: &'static str,
}

/// A process attached to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessView {
    pub pid: u32,
    pub slice: String,
    /// Device memory it holds, over all devices.
    pub memory_used: u64,
    /// Whether the process still exists (a dead one is listed until the monitor reaps it).
    pub alive: bool,
    /// Start time of `pid` (clock ticks since boot), which tells a process apart from another
    /// with the same pid in another PID namespace or after reuse. Not part of the JSON.
    pub start_time: u64,
    /// Node mode: its uid (from the kernel at admission).
    pub uid: u32,
    /// What it has charged per device (UUID, bytes), for the audit. Not part of the JSON.
    pub charged: Vec<(String, u64)>,
    /// The slice it is in on each device (UUID, slice index), for the audit: pids do not tell
    /// slices apart (every pod's first process is pid 1 in its namespace). Not part of the JSON.
    pub in_slices: Vec<(String, usize)>,
    /// Node mode: its pid in the monitor's (the host's) PID namespace, from the kernel at
    /// admission; 0 when unknown. Not part of the JSON.
    pub host_pid: u32,
}

/// The node at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    pub devices: Vec<DeviceView>,
    pub slices: Vec<SliceView>,
    pub processes: Vec<ProcessView>,
    /// Ledger records that made no sense and were skipped (see `Ledger::snapshot`).
    pub problems: Vec<String>,
    /// Exported memory whose exporter has let go or exited, kept charged to a slice for the
    /// importers or descriptors that still hold it.
    pub orphans: Vec<OrphanView>,
}

/// An exported allocation with no exporter left (`layout::Shared`), charged to its slice.
#[derive(Debug, Clone, PartialEq)]
pub struct OrphanView {
    /// The slice it stays charged to (`None`: a best-effort allowance).
    pub slice: Option<String>,
    pub device_uuid: String,
    /// Bytes it holds there.
    pub bytes: u64,
    /// Live importers holding it (0: only descriptors, found by the monitor's scan).
    pub importers: usize,
}

impl NodeView {
    /// The `status --json` object of the contract.
    pub fn to_json(&self) -> Value {
        json!({
            "devices": self.devices.iter().map(|d| json!({
                "uuid": d.uuid,
                "index": d.index,
                "name": d.name,
                "memory_total": d.memory_total,
                "memory_reserved": d.memory_reserved,
                "memory_used": d.memory_used,
                "compute_reserved": d.compute_reserved,
                "context_bytes": d.context_bytes,
            })).collect::<Vec<_>>(),
            "slices": self.slices.iter().map(|s| json!({
                "name": s.name,
                "device_uuid": s.device_uuid,
                "memory_limit": s.memory_limit,
                "memory_used": s.memory_used,
                "memory_contexts": s.memory_contexts,
                "memory_held_for_importers": s.memory_held_for_importers,
                "compute_share": s.compute_share,
                "compute_cap": s.compute_cap,
                "compute_used": s.compute_used,
                "priority": s.priority,
                "pids": s.pids,
                "claim": s.claim,
                "owner": s.owner,
                "violations_total": s.violations_total,
            })).collect::<Vec<_>>(),
            // Slices the monitor's NVML audit finds over their quota now (memory taken around
            // gpuslice): docs/security.md.
            "violations": self.slices.iter().filter(|s| s.over_quota).map(|s| json!({
                "slice": s.name,
                "device_uuid": s.device_uuid,
                "memory_limit": s.memory_limit,
                "observed": s.audit_observed,
            })).collect::<Vec<_>>(),
            "processes": self.processes.iter().map(|p| json!({
                "pid": p.pid,
                "slice": p.slice,
                "uid": p.uid,
                "memory_used": p.memory_used,
                "alive": p.alive,
            })).collect::<Vec<_>>(),
            "problems": self.problems,
            "orphans": self.orphans.iter().map(|o| json!({
                "slice": o.slice,
                "device_uuid": o.device_uuid,
                "bytes": o.bytes,
                "importers": o.importers,
            })).collect::<Vec<_>>(),
        })
    }

    /// The device with this UUID.
    pub fn device(&self, uuid: &str) -> Option<&DeviceView> {
        self.devices.iter().find(|d| d.uuid == uuid)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small node: one 16 GiB device, two slices, three processes.
    pub fn sample() -> NodeView {
        const GI: u64 = 1 << 30;
        NodeView {
            devices: vec![DeviceView {
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                index: 0,
                name: "Fake GPU".into(),
                memory_total: 16 * GI,
                memory_reserved: 6 * GI,
                memory_used: 3 * GI,
                compute_reserved: 0.75,
                context_bytes: 512 << 20,
            }],
            slices: vec![
                SliceView {
                    name: "train".into(),
                    device_uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    memory_limit: Some(4 * GI),
                    memory_used: 2 * GI,
                    memory_contexts: GI,
                    memory_held_for_importers: 0,
                    compute_share: 0.5,
                    compute_cap: 1.0,
                    compute_used: 0.42,
                    pids: vec![100, 101],
                    operator: true,
                    allocations_denied: 3,
                    launches: 1000,
                    throttled_seconds: 1.5,
                    claim: None,
                    owner: None,
                    index: 0,
                    over_quota: false,
                    audit_observed: 0,
                    violations_total: 0,
                    priority: "normal",
                },
                SliceView {
                    name: "infer \"a\"".into(),
                    device_uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    memory_limit: None,
                    memory_used: GI,
                    memory_contexts: 0,
                    memory_held_for_importers: 0,
                    compute_share: 0.25,
                    compute_cap: 0.5,
                    compute_used: 0.0,
                    pids: vec![102],
                    operator: false,
                    allocations_denied: 0,
                    launches: 0,
                    throttled_seconds: 0.0,
                    claim: None,
                    owner: None,
                    index: 1,
                    over_quota: false,
                    audit_observed: 0,
                    violations_total: 0,
                    priority: "latency",
                },
            ],
            processes: vec![
                ProcessView {
                    pid: 100,
                    uid: 1000,
                    charged: vec![],
                    slice: "train".into(),
                    memory_used: GI,
                    alive: true,
                    start_time: 7,
                    in_slices: vec![],
                    host_pid: 0,
                },
                ProcessView {
                    pid: 101,
                    uid: 1000,
                    charged: vec![],
                    slice: "train".into(),
                    memory_used: GI,
                    alive: true,
                    start_time: 7,
                    in_slices: vec![],
                    host_pid: 0,
                },
                ProcessView {
                    pid: 102,
                    uid: 1000,
                    charged: vec![],
                    slice: "infer \"a\"".into(),
                    memory_used: GI,
                    alive: false,
                    start_time: 7,
                    in_slices: vec![],
                    host_pid: 0,
                },
            ],
            problems: vec![],
            orphans: vec![],
        }
    }

    #[test]
    fn json_has_the_contract_fields() {
        let v = sample().to_json();
        let d = &v["devices"][0];
        for k in [
            "uuid",
            "index",
            "name",
            "memory_total",
            "memory_reserved",
            "memory_used",
            "compute_reserved",
        ] {
            assert!(!d[k].is_null(), "device field {k}");
        }
        let s = &v["slices"][0];
        for k in [
            "name",
            "device_uuid",
            "memory_limit",
            "memory_used",
            "compute_share",
            "compute_cap",
            "compute_used",
            "priority",
            "pids",
        ] {
            assert!(!s[k].is_null(), "slice field {k}");
        }
        let p = &v["processes"][2];
        for k in ["pid", "slice", "memory_used", "alive"] {
            assert!(!p[k].is_null(), "process field {k}");
        }
        assert_eq!(d["memory_total"], 16u64 << 30);
        assert_eq!(s["pids"], json!([100, 101]));
        assert_eq!(p["alive"], false);
    }
}
