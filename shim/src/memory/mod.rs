//! Quota enforcement on every path that takes device memory.
//!
//! Every allocation: charge the slice first (one CAS against the quota, `Account::try_charge`),
//! then call the driver, then record what the handle was charged ([`Charge`]: bytes, device,
//! pool) for its free; undo the charge when the driver fails. Over quota:
//! `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver, nothing changed. Frees forget the
//! handle *before* the real free (re-recording it if that fails), and return the charge after
//! it succeeds.
//!
//! One file per kind of memory, each with its own state:
//! - [`plain`]: `cuMemAlloc_v2`, pitch and managed memory (no state: the pointer table);
//! - [`pools`]: stream-ordered allocation and memory pools (the pool table, retained credit);
//! - [`vmm`]: the virtual memory API's physical allocations (`cuMemCreate`), charged until
//!   the driver frees them (released and unmapped; exported ones until their importers let go
//!   too);
//! - [`arrays`]: arrays and mipmapped arrays, charged what their descriptor implies;
//! - [`graph`]: graph memory nodes and captured allocations (held by graphs and executables).
//!
//! This file holds what they share: the charge/allocate/record and forget/free/return steps.
//!
//! Every `pub unsafe fn` in these files is a handler of the hook table, relying on the handler
//! contract of `hooks.rs`: `real` is the driver's function, the arguments are the
//! program's, pointers are null or valid as `cuda.h` documents them.

use crate::admit::DevState;
use crate::init::State;
use crate::log::log;
use crate::pointers::{self, Charge, Handle};
use gpuslice_abi::*;

/// The started state, or return the status start-up failed with.
macro_rules! ready {
    () => {
        match crate::init::state() {
            Ok(s) => s,
            Err(e) => return e,
        }
    };
}

/// The calling thread's current device, or return `$fallback` (no context: let the driver
/// report it).
macro_rules! current {
    ($st:expr, $fallback:expr) => {
        match $st.current() {
            Some(d) => d,
            None => return $fallback,
        }
    };
}

mod arrays;
mod balloon;
mod graph;
mod plain;
mod pool_objects;
pub(crate) mod pools;
mod shared;
mod vmm;

pub use arrays::{
    array3d_create, array_create, array_destroy, mipmapped_create, mipmapped_destroy,
};
pub use graph::{
    capture_ended, graph_add_mem_alloc_node, graph_add_node, graph_add_node_v2, graph_destroy,
    graph_exec_destroy, graph_instantiate, graph_instantiate_with_flags,
    graph_instantiate_with_params, launch_refused,
};
pub use plain::{mem_alloc, mem_alloc_managed, mem_alloc_pitch, mem_free};
pub use pool_objects::{pool_create, pool_destroy, pool_trim_to};
pub use pools::{mem_alloc_async, mem_alloc_from_pool, mem_free_async, reclaim_pools};
pub use vmm::{mem_create, mem_export, mem_import, mem_map, mem_release, mem_retain, mem_unmap};

#[inline]
fn oom(dev: &DevState, bytes: u64) -> CUresult {
    if crate::log::enabled(crate::log::Level::Debug) {
        log!(
            Debug,
            "allocation of {bytes} bytes on device {} refused: {} of {} used",
            dev.ordinal,
            dev.account.used(),
            dev.account.limit()
        );
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

/// Charge `n` bytes; when they do not fit, first take back pool credit the driver released.
///
/// # Safety
/// As [`reclaim_pools`]: `dev` is a device of the started state.
#[inline]
unsafe fn charge(dev: &DevState, n: u64) -> bool {
    // SAFETY: dev is a device of the started state (this function's contract).
    dev.account.try_charge(n) || (unsafe { reclaim_pools(dev) } && dev.account.try_charge(n))
}

/// Reserve first, allocate second: charge `bytes`, then make the driver call `alloc`, and
/// undo the charge if the driver fails. `Ok` holds what `alloc` gave beside its status; `Err`
/// is the status to return (`CUDA_ERROR_OUT_OF_MEMORY` over the quota, or the driver's).
///
/// # Safety
/// As [`charge`]: `dev` is a device of the started state.
#[inline]
unsafe fn reserved<T>(
    dev: &DevState,
    bytes: u64,
    alloc: impl FnMut() -> (CUresult, T),
) -> Result<T, CUresult> {
    // SAFETY: dev is a device of the started state (this function's contract).
    if !unsafe { charge(dev, bytes) } {
        return Err(oom(dev, bytes));
    }
    allocated(dev, bytes, bytes, alloc)
}

/// The driver call of an allocation of `bytes` already charged `charged` to `dev`'s account
/// (the second half of [`reserved`], for paths that charge in their own way, as pools spending
/// credit): `Ok` with what `alloc` gave, or the status to return once `charged` is uncharged.
/// Every path that reserves in the slice ends here, so a physically full device takes the
/// balloons' one slow path (`balloon::refused`) whatever the kind of memory.
#[inline]
fn allocated<T>(
    dev: &DevState,
    bytes: u64,
    charged: u64,
    mut alloc: impl FnMut() -> (CUresult, T),
) -> Result<T, CUresult> {
    let (r, out) = alloc();
    if r != CUDA_SUCCESS {
        return balloon::refused(dev, bytes, charged, alloc, r);
    }
    Ok(out)
}

/// A CUDA context's charge (`contexts.rs`): charge `bytes` to `dev`'s account, then make the
/// driver call `create`, with the balloons' slow path and the undo of any allocation.
/// `Err(None)`: the account cannot afford it (nothing changed); `Err(Some(r))`: the driver's
/// status, the charge undone.
///
/// # Safety
/// As [`charge`]: `dev` is a device of the started state.
pub(crate) unsafe fn charge_context<T>(
    dev: &DevState,
    bytes: u64,
    create: impl FnMut() -> (CUresult, T),
) -> Result<T, Option<CUresult>> {
    // SAFETY: dev is a device of the started state (this function's contract).
    if !unsafe { charge(dev, bytes) } {
        return Err(None);
    }
    allocated(dev, bytes, bytes, create).map_err(Some)
}

/// What an allocation closure gives [`charge_and_alloc`]: the driver's status and, only when
/// it succeeded, the handle it wrote to `out` (0 otherwise: never read unwritten memory).
///
/// # Safety
/// `out` is non-null and, once the driver succeeded, holds the handle it wrote (the
/// program's out-pointer, under the handler contract).
#[inline]
unsafe fn written<T: Copy>(r: CUresult, out: *const T) -> Option<T> {
    // SAFETY: read only after success, when the driver has written it (this function's
    // contract).
    (r == CUDA_SUCCESS).then(|| unsafe { *out })
}

/// Charge, allocate, record. `alloc` returns the driver's status and the new handle. Pool
/// memory has its own form, which spends the pool's retained credit first
/// (`pools::alloc_from`).
///
/// # Safety
/// As [`charge`]: `dev` is a device of the started state.
#[inline]
unsafe fn charge_and_alloc(
    dev: &DevState,
    kind: Handle,
    bytes: u64,
    alloc: impl FnMut() -> (CUresult, u64),
) -> CUresult {
    // `bytes` fits a Charge (below 2^48) whenever the charge succeeds: no quota or device
    // reaches 2^48 bytes, so a larger request is refused by `charge`.
    // SAFETY: dev is a device of the started state (this function's contract).
    match unsafe { reserved(dev, bytes, alloc) } {
        Ok(h) => {
            record(kind, h, Charge::new(bytes, dev, 0));
            CUDA_SUCCESS
        }
        Err(r) => r,
    }
}

/// Remember what handle `h` was charged, for its free.
#[inline]
fn record(kind: Handle, h: u64, c: Charge) {
    if !pointers::insert(kind, h, c) {
        // Cannot happen short of half a million live allocations; the charge stays (never an
        // undercount), returned when the process exits.
        log!(
            Error,
            "allocation table full: {} bytes stay charged until the process exits",
            c.bytes
        );
    }
}

/// Forget `h`, call the real free, return the charge (or retain it in its pool).
#[inline]
fn free_and_uncharge(
    st: &State,
    kind: Handle,
    h: u64,
    free: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(c) = pointers::remove(kind, h) else {
        return free();
    };
    let r = free();
    if r != CUDA_SUCCESS {
        pointers::insert(kind, h, c);
        return r;
    }
    // Pool memory stays in its pool (retained credit); a pool we no longer know returns it.
    if c.pool == 0 || !pools::retain(c.pool as usize, c.bytes) {
        if let Some(dev) = st.device(c.device as CUdevice) {
            dev.account.uncharge(c.bytes);
        }
    }
    r
}
