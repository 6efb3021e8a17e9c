//! Plain device memory: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemAllocManaged` and
//! `cuMemFree_v2`, charged to the calling thread's current device. No state of its own: what
//! each pointer was charged lives in the pointer table.

use super::{charge, charge_and_alloc, free_and_uncharge, oom};
use crate::hooks::{pfn, real};
use crate::pointers::{self, Charge, Kind};
use core::ffi::c_uint;
use gpuslice_abi::*;

/// `cuMemAlloc_v2`. Inlined into its wrapper: the hottest pair of calls.
#[inline]
pub unsafe fn mem_alloc(
    real: pfn::cuMemAlloc_v2,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return real(dptr, bytes);
    }
    let dev = current!(st, real(dptr, bytes));
    charge_and_alloc(dev, Kind::Ptr, bytes as u64, 0, || {
        (real(dptr, bytes), *dptr)
    })
}

/// `cuMemAllocPitch_v2`: charged an upper estimate first (rows padded to 512 bytes), then
/// corrected to `pitch × height` once the driver has chosen the pitch.
pub unsafe fn mem_alloc_pitch(
    real: pfn::cuMemAllocPitch_v2,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    w: usize,
    h: usize,
    elem: c_uint,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || pitch.is_null() || w == 0 || h == 0 {
        return real(dptr, pitch, w, h, elem);
    }
    let dev = current!(st, real(dptr, pitch, w, h, elem));
    let Some(est) = (w as u64)
        .checked_next_multiple_of(512)
        .and_then(|r| r.checked_mul(h as u64))
    else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if !charge(dev, est) {
        return oom(dev, est);
    }
    let r = real(dptr, pitch, w, h, elem);
    if r != CUDA_SUCCESS {
        dev.account.uncharge(est);
        return r;
    }
    let actual = (*pitch as u64).saturating_mul(h as u64);
    if actual > est && !dev.account.try_charge(actual - est) {
        if let Some(free) = real::cuMemFree_v2() {
            free(*dptr);
        }
        dev.account.uncharge(est);
        return oom(dev, actual);
    } else if actual < est {
        dev.account.uncharge(est - actual);
    }
    pointers::insert(Kind::Ptr, *dptr, Charge::new(actual, dev, 0));
    r
}

/// `cuMemAllocManaged`: counted against the current device.
pub unsafe fn mem_alloc_managed(
    real: pfn::cuMemAllocManaged,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return real(dptr, bytes, flags);
    }
    let dev = current!(st, real(dptr, bytes, flags));
    charge_and_alloc(dev, Kind::Ptr, bytes as u64, 0, || {
        (real(dptr, bytes, flags), *dptr)
    })
}

/// `cuMemFree_v2`. Inlined into its wrapper, as `mem_alloc`.
#[inline]
pub unsafe fn mem_free(real: pfn::cuMemFree_v2, dptr: CUdeviceptr) -> CUresult {
    let st = ready!();
    if dptr == 0 {
        return real(dptr);
    }
    free_and_uncharge(st, Kind::Ptr, dptr, || real(dptr))
}
