//! Plain device memory: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemAllocManaged` and
//! `cuMemFree_v2`, charged to the calling thread's current device. No state of its own: what
//! each pointer was charged lives in the pointer table.

use super::{charge_and_alloc, free_and_uncharge, oom, reserved, written};
use crate::pointers::{self, Charge, Handle};
use crate::real;
use core::ffi::c_uint;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// `cuMemAlloc_v2`. Inlined into its wrapper: the hottest pair of calls.
#[inline]
pub unsafe fn mem_alloc(
    real: pfn::cuMemAlloc_v2,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { alloc_ptr(dptr, bytes, || real(dptr, bytes)) }
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
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dptr, pitch, w, h, elem) };
    let st = ready!();
    if dptr.is_null() || pitch.is_null() || w == 0 || h == 0 {
        return pass();
    }
    let dev = current!(st, pass());
    let Some(est) = (w as u64)
        .checked_next_multiple_of(512)
        .and_then(|r| r.checked_mul(h as u64))
    else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    // SAFETY: dev is a device of the started state.
    if let Err(r) = unsafe { reserved(dev, est, || (pass(), ())) } {
        return r;
    }
    // SAFETY: both are the program's out-pointers, non-null (checked above), written by the
    // driver's successful call.
    let (ptr, pitch) = unsafe { (*dptr, *pitch) };
    let actual = (pitch as u64).saturating_mul(h as u64);
    if actual > est && !dev.account.try_charge(actual - est) {
        if let Some(free) = real::cuMemFree_v2() {
            // SAFETY: the real cuMemFree_v2, freeing the pointer the driver just allocated.
            unsafe { free(ptr) };
        }
        dev.account.uncharge(est);
        return oom(dev, actual);
    } else if actual < est {
        dev.account.uncharge(est - actual);
    }
    pointers::insert(Handle::Ptr, ptr, Charge::new(actual, dev, 0));
    CUDA_SUCCESS
}

/// `cuMemAllocManaged`: counted against the current device.
pub unsafe fn mem_alloc_managed(
    real: pfn::cuMemAllocManaged,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { alloc_ptr(dptr, bytes, || real(dptr, bytes, flags)) }
}

/// A linear allocation of `bytes` into `*dptr` made by `pass` (the driver's call), charged to
/// the current device as it is made; passed through untouched before start-up, without a
/// context, or for a null pointer or zero bytes (the driver answers those).
///
/// # Safety
/// `pass` is the real driver call with the program's arguments; `dptr` is the program's
/// out-pointer.
#[inline]
unsafe fn alloc_ptr(dptr: *mut CUdeviceptr, bytes: usize, pass: impl Fn() -> CUresult) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return pass();
    }
    let dev = current!(st, pass());
    // SAFETY: dev is the started state's; dptr is non-null (checked above), the program's
    // out-pointer.
    unsafe {
        charge_and_alloc(dev, Handle::Ptr, bytes as u64, || {
            let r = pass();
            (r, written(r, dptr).unwrap_or(0))
        })
    }
}

/// `cuMemFree_v2`. Inlined into its wrapper, as `mem_alloc`.
#[inline]
pub unsafe fn mem_free(real: pfn::cuMemFree_v2, dptr: CUdeviceptr) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dptr) };
    let st = ready!();
    if dptr == 0 {
        return pass();
    }
    free_and_uncharge(st, Handle::Ptr, dptr, pass)
}
