//! Plain owned copies of the ledger's state, for the monitor, the CLI and tests.

use gpuslice_quantity::{Cap, Share};

/// Everything in the ledger at one moment (read without the lock: each number is exact, the
/// set as a whole may straddle a concurrent change).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Registered devices.
    pub devices: Vec<DeviceInfo>,
    /// Active slices.
    pub slices: Vec<SliceInfo>,
    /// Process records in use (alive or awaiting the reaper).
    pub processes: Vec<ProcInfo>,
    /// Exported VMM allocations registered for their importers (personal ledgers).
    pub shared: Vec<SharedInfo>,
    /// Records that made no sense (scribbled indices) and were skipped, one line each.
    pub problems: Vec<String>,
}

/// A device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Ledger index (not the CUDA ordinal, which differs between processes).
    pub index: usize,
    /// `GPU-...`.
    pub uuid: String,
    /// Marketing name.
    pub name: String,
    /// Bytes on the device.
    pub memory_total: u64,
    /// Σ quotas of its slices.
    pub memory_reserved: u64,
    /// Σ usage of its quota slices + best-effort usage.
    pub memory_used: u64,
    /// What processes without a quota hold.
    pub best_effort_used: u64,
    /// Σ compute guarantees, ppm.
    pub compute_reserved_ppm: u32,
    /// Node mode: what one CUDA context is charged to its slice (0: contexts not charged).
    pub context_bytes: u64,
}

/// A slice on one device.
#[derive(Debug, Clone)]
pub struct SliceInfo {
    /// Slice record index.
    pub index: usize,
    /// Name.
    pub name: String,
    /// Ledger device index.
    pub device: usize,
    /// Device UUID.
    pub device_uuid: String,
    /// Created by an operator.
    pub operator_defined: bool,
    /// A process's private slice.
    pub private: bool,
    /// Quota (`None`: best effort).
    pub memory_limit: Option<u64>,
    /// Bytes held by its processes.
    pub memory_used: u64,
    /// Of `memory_used`, the bytes its live processes' CUDA contexts are charged (node mode).
    pub context_used: u64,
    /// Guarantee.
    pub compute_share: Share,
    /// Cap.
    pub compute_cap: Cap,
    /// Attached processes.
    pub attached: u32,
    /// Their pids (as each saw itself).
    pub pids: Vec<u32>,
    /// Allocations charged.
    pub alloc_total: u64,
    /// Allocations refused for the quota.
    pub alloc_denied_total: u64,
    /// The operator's label for the slice (Kubernetes `namespace/name`), if any.
    pub claim: Option<String>,
    /// Scheduling priority class (`sched::CLASS_NORMAL` or `CLASS_LATENCY`): the scheduler's own
    /// word, `SchedSlice::class`.
    pub priority: u32,
    /// Node mode: the only uid whose processes may join it, which is also the namespace of its
    /// name (a tenant's slice is its maker's); `None`: any uid (an operator slice without
    /// `--owner`, or a personal ledger's).
    pub owner: Option<u32>,
    /// The monitor's audit: NVML reports more for its processes than its quota.
    pub over_quota: bool,
    /// The audit: bytes NVML last reported for its processes.
    pub audit_observed: u64,
    /// The audit: times it went over its quota.
    pub violations_total: u64,
}

/// A process.
#[derive(Debug, Clone)]
pub struct ProcInfo {
    /// Record index.
    pub slot: usize,
    /// pid in its own PID namespace.
    pub pid: u32,
    /// Start time (clock ticks since boot) of that pid.
    pub start_time: u64,
    /// Inode of its PID namespace (0 if unknown): whether `pid` means the same process to a
    /// reader in its own namespace.
    pub pid_ns: u64,
    /// Node mode: its pid in the monitor's (the host's) PID namespace, which `start_time` is
    /// of. Personal mode: its own pid.
    pub host_pid: u32,
    /// Slice name it asked for (empty: private).
    pub slice: String,
    /// Node mode: its uid as the kernel gave it to the monitor (personal mode: 0, unused).
    pub uid: u32,
    /// Whether it still runs (its liveness lock is held).
    pub alive: bool,
    /// Bytes it holds on all devices.
    pub memory_used: u64,
    /// Per device.
    pub devices: Vec<ProcDeviceInfo>,
}

/// What a process holds on one device.
#[derive(Debug, Clone)]
pub struct ProcDeviceInfo {
    /// Ledger device index.
    pub device: usize,
    /// Slice record index.
    pub slice: usize,
    /// Bytes.
    pub charged: u64,
}

/// An exported VMM allocation (`layout::Shared`).
#[derive(Debug, Clone)]
pub struct SharedInfo {
    /// Ledger device index.
    pub device: usize,
    /// The slice record charged (`None`: a best-effort account).
    pub slice: Option<usize>,
    /// The exporter's process slot while it holds the memory.
    pub exporter: Option<usize>,
    /// Bytes of the allocation.
    pub bytes: u64,
    /// Bytes the record holds itself (the exporter let go or died).
    pub held: u64,
    /// Process slots of its importers (alive or awaiting the reaper).
    pub importers: Vec<usize>,
}

/// What `reap_dead` reclaimed.
#[derive(Debug, Clone, Default)]
pub struct Reaped {
    /// The dead processes whose records were freed.
    pub processes: Vec<ReapedProc>,
    /// Bytes returned to slices and best-effort allowances.
    pub bytes_returned: u64,
    /// Slices removed because they became empty (a slice on several devices: one each).
    pub slices_removed: Vec<RemovedSlice>,
    /// Records that made no sense (scribbled indices), skipped, one line each.
    pub problems: Vec<String>,
}

/// A slice record removed because its last process left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedSlice {
    /// Its name.
    pub name: String,
    /// The UUID of its device.
    pub device_uuid: String,
}

/// One reaped process.
#[derive(Debug, Clone)]
pub struct ReapedProc {
    /// Its pid.
    pub pid: u32,
    /// Bytes it held (as its own record said).
    pub bytes: u64,
}
