//! The node-wide ledger: one versioned `#[repr(C)]` file in shared memory through which every
//! gpuslice process on a node agrees on devices, slices, processes, quotas and compute leases.
//!
//! Both the shim (inside each wrapped program) and the monitor (`gpuslice`) map the same file;
//! this crate is the only definition of its layout and the only code that mutates it. The
//! settings grammar (and the `Share` and `Cap` types) is `gpuslice-quantity`, the compute
//! scheduler whose records live in the file `gpuslice-sched`; the node-mode socket protocol
//! (`gpuslice-protocol`) is independent of it: the shim and the monitor translate at its
//! edges.
//!
//! How the parts meet:
//! - [`layout`]: the records (`Header`, `Device`, `Slice`, `Proc`) and their offsets, pinned by
//!   tests; `gpuslice_sched` holds the compute scheduler's part of each record and its policy;
//!   [`tenants`] adapts the ledger's records to it; `sys` holds the OS calls (clock, futex, OFD locks).
//! - [`dir`]: the runtime directory opened once as a descriptor, every file in it opened with
//!   `O_NOFOLLOW` and checked (owner, mode) before use, and the mode decision (personal or
//!   node) from who owns the directory; [`runtime_dir_from_env`] is the one rule for
//!   `GPUSLICE_RUNTIME_DIR` (absolute, or refused).
//! - `file`: creation without races (build under a temporary name, `link()` into place), the
//!   size/version checks, the robust cold-path mutex, and liveness through OFD locks (a process
//!   holds a lock on byte `LIVENESS_LOCK_BASE + slot` of the file; the kernel drops it when the
//!   process dies, whatever its PID namespace).
//! - [`Ledger`]: cold paths under the mutex: [`Ledger::ensure_device`], [`Ledger::attach`],
//!   [`Ledger::join`] (admission: "requested X, available Y"), operator slices
//!   ([`Ledger::create_operator_slice`], [`Ledger::remove_slice`]), [`Ledger::reap_dead`],
//!   [`Ledger::snapshot`].
//! - [`Account`]: the hot path, lock-free: [`Account::try_charge`] (one CAS against the
//!   limit, never above it) and [`Account::uncharge`]; `account.rs` explains why the reaper
//!   returns exactly what a SIGKILLed process held.
//!
//! ```
//! use gpuslice_ledger::{Ledger, SliceRequest};
//! let dir = std::env::temp_dir().join(format!("gpuslice-doctest-{}", std::process::id()));
//! let ledger = Ledger::open_or_create(&dir).unwrap();
//! let dev = ledger.ensure_device("GPU-00000000-0000-0000-0000-000000000001", "Fake", 8 << 30).unwrap();
//! let me = ledger.attach("").unwrap();
//! let req = SliceRequest::new(None, Some(1 << 30)); // a 1 GiB quota, no compute share
//! ledger.join(me, dev, &req).unwrap();
//! let acct = ledger.account(me, dev).unwrap();
//! assert!(acct.try_charge(1 << 30));
//! assert!(!acct.try_charge(1));          // over the quota: refused, nothing changed
//! acct.uncharge(1 << 30);
//! assert_eq!(ledger.snapshot().slices[0].memory_used, 0);
//! ledger.detach(me).unwrap();
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

#![deny(missing_docs)]

mod account;
mod best_effort;
pub mod dir;
mod error;
mod file;
pub mod layout;
mod ledger;
pub mod node;
pub mod pidfd;
pub mod procfs;
pub mod region;
pub mod secret;
mod snapshot;
mod sys;
pub mod tenants;
pub mod view;

pub use account::Account;
pub use dir::{runtime_dir_from_env, RuntimeDir, DEFAULT_RUNTIME_DIR};
pub use error::{human_bytes, FitError, LedgerError};
pub use file::{is_running, live_start_time_of, own_start_time, start_time_of, LOCK_TIMEOUT};
pub use layout::{Cap, Share, MAX_DEVICES, MAX_PROCS, MAX_SLICES, PPM};
pub use ledger::{
    Import, Joined, Ledger, LetGo, LockGuard, Membership, OperatorSlice, ProcHandle, RecordCharge,
    ShareKey, SliceChange, SliceRequest,
};
pub use procfs::innermost_pid_of;
pub use snapshot::{
    DeviceInfo, ProcDeviceInfo, ProcInfo, Reaped, ReapedProc, RemovedSlice, SharedInfo, SliceInfo,
    Snapshot,
};
