//! Process-wide state: what the shim keeps for the whole life of the process, in one place, so
//! a reader sees at once what lives across calls. Below every other room of the shim (it
//! imports only [`crate::real`]), so any room may read it and nothing here calls back up.
//!
//! Here: the state start-up publishes once ([`State`], behind [`STATE`], with [`FAILED`],
//! [`INIT`] and [`FORKED`], written by `init.rs`), the log threshold ([`THRESHOLD`],
//! `log.rs`), whether the shim is a pass-through ([`DISABLED`], `config.rs`) and the captures
//! open ([`CAPTURES`], `capture.rs`, `capturing.rs`).
//!
//! The tables a room keeps as its own data structure stay beside the code that keeps them
//! consistent, each a fixed-size or lock-guarded static: the real functions' addresses
//! (`real.rs`: `PTRS`, `HANDLES`, `REAL_DLSYM`), each live pointer's charge (`pointers.rs`:
//! `TABLE`), the stream-ordered pools (`memory/pools.rs`: `POOLS`), graph memory
//! (`memory/graph.rs`: `GRAPHS`), VMM mappings (`memory/vmm.rs`: `MAPS`, `USED`), NVML's
//! answers (`nvml/cache.rs`: `CACHE`), the compute gate (`compute/`: `GATES`, `SINGLE`,
//! `BOUND`), and the once-only warnings (`log.rs`, `memory/balloon.rs`). The hook tables
//! (`real.rs`'s `SYMBOLS`, `hooks.rs`'s `WRAPPERS`) are immutable data.

use crate::real;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize};
use gpuslice_abi::*;
use gpuslice_ledger::{Account, Ledger, ProcHandle};
use std::sync::Mutex;

/// One device as this process sees it.
pub struct DevState {
    /// CUDA ordinal in this process.
    pub ordinal: i32,
    /// Index in the ledger.
    pub ledger_dev: usize,
    /// `GPU-...`.
    pub uuid: String,
    /// Where allocations are charged.
    pub account: Account<'static>,
    /// Node mode: the region of that account (where this process asks for compute turns).
    pub region: Option<&'static gpuslice_ledger::region::Region>,
}

/// Everything the hooks need after start-up.
pub struct State {
    /// The mapped ledger (lives as long as the process).
    pub ledger: &'static Ledger,
    /// Our process record.
    pub me: ProcHandle,
    /// By CUDA ordinal.
    pub devices: Vec<DevState>,
    /// The compute class `GPUSLICE_PRIORITY` asks for (`None`: unset).
    pub priority: Option<u32>,
}

impl State {
    /// The device of the calling thread's current context.
    #[inline]
    pub fn current(&self) -> Option<&DevState> {
        if self.devices.len() == 1 {
            return self.devices.first();
        }
        let mut d: CUdevice = -1;
        let f = real::cuCtxGetDevice()?;
        // SAFETY: d is a valid out-parameter.
        if unsafe { f(&mut d) } != CUDA_SUCCESS {
            return None;
        }
        self.device(d)
    }

    /// The device of CUDA ordinal `d`.
    #[inline]
    pub fn device(&self, d: CUdevice) -> Option<&DevState> {
        usize::try_from(d).ok().and_then(|i| self.devices.get(i))
    }
}

/// The published [`State`] (null until start-up succeeded; never freed once set).
pub(crate) static STATE: AtomicPtr<State> = AtomicPtr::new(core::ptr::null_mut());
/// 0: not failed; otherwise the CUresult every hooked call returns.
pub(crate) static FAILED: AtomicU32 = AtomicU32::new(0);
/// Held while start-up runs: one thread starts, the others wait for its result.
pub(crate) static INIT: Mutex<()> = Mutex::new(());
/// Set in a child made by `fork()` after start-up: such a child is no member of the ledger
/// (CUDA itself does not survive a fork), so its hooked calls fail with
/// `CUDA_ERROR_NOT_INITIALIZED`, saying why once.
pub(crate) static FORKED: AtomicBool = AtomicBool::new(false);

/// `log.rs`'s threshold: a `Level` as `u8`, or [`LOG_UNSET`] until read from `GPUSLICE_LOG`.
pub(crate) static THRESHOLD: AtomicU8 = AtomicU8::new(LOG_UNSET);
/// [`THRESHOLD`] not read from the environment yet.
pub(crate) const LOG_UNSET: u8 = u8::MAX;

/// `config.rs`'s `GPUSLICE_DISABLE`: 0 not read yet, 1 enabled, 2 disabled (pass-through).
pub(crate) static DISABLED: AtomicU8 = AtomicU8::new(0);

/// Captures begun and not yet ended, as the capture hooks saw them: an allocation or a
/// contended launch asks the driver whether its stream is capturing only while this is not
/// zero, so the hot path pays one atomic load when nothing captures.
pub static CAPTURES: AtomicUsize = AtomicUsize::new(0);
