//! What a process is told about memory: its quota as the total, what is left of it as free
//! (never negative, never more than the device really has free). Without a quota (best
//! effort) the device's size stays the total and free is capped by what is not reserved for
//! slices. Shared by the driver hooks here and the NVML hooks in `nvml/`.

use crate::admit::DevState;
use crate::init::state_if_ready;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// `(total, free)` to report for `dev`, given the driver's own numbers.
pub fn view(dev: &DevState, real_total: u64, real_free: u64) -> (u64, u64) {
    view_of(
        Figures {
            quota: dev.account.is_quota(),
            limit: dev.account.limit(),
            used: dev.account.used(),
            held: dev.account.held_for_it(),
        },
        real_total,
        real_free,
    )
}

/// An account's figures on one device, as the one formula [`view_of`] takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    /// A slice's quota (false: the best-effort allowance).
    pub quota: bool,
    /// The quota, or the allowance's limit.
    pub limit: u64,
    /// What the account holds.
    pub used: u64,
    /// Node mode: what the monitor's balloons hold of the slice's unused reservation.
    pub held: u64,
}

/// The one formula, for an account's figures (a quota or the best-effort allowance); NVML-only
/// processes apply it to what the ledger says (`nvml/memory.rs`). Free is what is left of the
/// limit, as far as the device has it: the driver's free memory, plus what the monitor holds
/// for this very slice (its balloon, handed back on an allocation's slow path; without it a
/// slice whose reservation the balloons hold would be told 0 free, and a framework sizing its
/// pool by free memory, TensorFlow's, would get none).
pub fn view_of(f: Figures, real_total: u64, real_free: u64) -> (u64, u64) {
    let left = f.limit.saturating_sub(f.used);
    let free = left.min(real_free.saturating_add(f.held));
    if f.quota {
        (f.limit, free)
    } else {
        (real_total, free)
    }
}

/// `cuMemGetInfo_v2`.
pub unsafe fn mem_get_info(
    real: pfn::cuMemGetInfo_v2,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    // SAFETY: the handler contract (hooks.rs): `real` with the program's arguments.
    let r = unsafe { real(free, total) };
    if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    let Some(dev) = state_if_ready().and_then(|s| s.current()) else {
        return r;
    };
    // Not a hot path: first return pool credit the driver has released since, so "free" is
    // what an allocation could really get.
    // SAFETY: dev is a device of the started state, as reclaim_pools needs.
    unsafe { crate::memory::reclaim_pools(dev) };
    // SAFETY: both are the caller's out-pointers, non-null (checked above), written by the
    // driver's successful call, and ours to overwrite.
    unsafe {
        let (t, f) = view(dev, *total as u64, *free as u64);
        *total = t as usize;
        *free = f as usize;
    }
    r
}

/// `cuDeviceTotalMem_v2`: the quota, when the process has one on that device.
pub unsafe fn device_total_mem(
    real: pfn::cuDeviceTotalMem_v2,
    bytes: *mut usize,
    d: CUdevice,
) -> CUresult {
    // SAFETY: the handler contract (hooks.rs): `real` with the program's arguments.
    let r = unsafe { real(bytes, d) };
    if r != CUDA_SUCCESS || bytes.is_null() {
        return r;
    }
    if let Some(dev) = state_if_ready().and_then(|s| s.device(d)) {
        if dev.account.is_quota() {
            // SAFETY: the caller's out-pointer, non-null (checked above), written by the
            // driver's successful call.
            unsafe { *bytes = (*bytes as u64).min(dev.account.limit()) as usize };
        }
    }
    r
}
