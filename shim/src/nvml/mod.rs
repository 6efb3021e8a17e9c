//! What NVML tells a program inside a slice (`nvidia-smi`, `nvitop`, pynvml, PyTorch): the
//! slice, exactly as its CUDA processes are told it, never the neighbours.
//!
//! - Memory (`nvmlDeviceGetMemoryInfo`, `_v2`): the quota as the total, the slice's usage as
//!   used, the rest as free (never negative, never more than the device has free), with the
//!   formula of the driver hooks (`report::view_of`).
//! - Running processes (compute v1/v2/v3, graphics and MPS v1/v2/v3, the detail list): only
//!   the slice's live processes, with what the ledger charges them and their pids as the
//!   caller sees them (`PidMap`); NVML's count protocol (`*infoCount` too small →
//!   `NVML_ERROR_INSUFFICIENT_SIZE` and the count needed). Graphics and MPS lists are empty
//!   inside a slice: slices hold CUDA processes, which the compute lists show.
//! - Accounting (`nvmlDeviceGetAccountingPids`, `nvmlDeviceGetAccountingStats`): while NVML
//!   has accounting on, the pids of the slice's live processes (as the caller sees them), and
//!   stats only for those: any other pid is `NVML_ERROR_NOT_FOUND`, as is one the shim cannot
//!   name to NVML (a process in another PID namespace asked about from a third one: NVML
//!   knows the host's pids only).
//! - Utilisation (`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetProcessUtilization`,
//!   `nvmlDeviceGetProcessesUtilizationInfo`): the slice's own `compute_used` (the scheduler's
//!   measured share of the device over its window), per-process samples only of its processes.
//!
//! Where the answers come from:
//! - a process that went through `cuInit` uses its own ledger mapping and accounts (the very
//!   numbers CUDA reports, so NVML and CUDA never disagree in one process);
//! - an NVML-only process (every monitoring tool) maps the ledger **read-only**
//!   (`ledger::view`), never creates it or takes a process slot, and finds its slice by the
//!   name its configuration gives (`GPUSLICE_SLICE`, or HAMi's shared-cache path), parsed by
//!   the same `Config` as `cuInit`. A slice already in the ledger gives its values (an
//!   operator's quota wins, as at `cuInit`); before any CUDA process made it, the configured
//!   quota and nothing used; a ledger that appears later is picked up within 200 ms.
//! - A process with no slice settings, `GPUSLICE_DISABLE=1`, or a device CUDA cannot see,
//!   gets the real device.
//!
//! Cost: one uncontended lock and a few atomic loads per call once warm. NVML handles are
//! cached by address, slice lookups by the ledger's generation, pid translations for the life
//! of each process; nothing here allocates per call (the first call builds the cache).
//!
//! The cache's lock is one a child made by `fork()` can always take: a thread of the parent
//! that held it does not exist in the child, so the child's `pthread_atfork` handler frees the
//! lock and drops (without freeing) a cache that thread may have been changing.
//!
//! One file a job: `cache.rs` (what the hooks remember, behind a lock a forked child can take),
//! `place.rs` (where the caller stands on a device, and its slice's live processes: the one
//! way in of every hook), then one file a family of answers: `memory.rs`, `processes.rs` (the
//! process lists and accounting), `utilization.rs`.
//!
//! Every `pub unsafe fn` here is a handler of the hook table, relying on the handler contract
//! of `hooks.rs`: `real` is NVML's function, the arguments are the program's, and each
//! pointer is null or valid as `nvml.h` documents it (arrays hold the count the program says).

mod cache;
mod memory;
mod place;
mod processes;
mod utilization;

pub use memory::memory_info;
pub use processes::{
    accounting_pids, accounting_stats, compute_processes, process_detail_list, unlisted_processes,
};
pub use utilization::{process_utilization, processes_utilization_info, utilization_rates};
