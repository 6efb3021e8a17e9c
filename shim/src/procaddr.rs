//! `cuGetProcAddress` and `cuGetProcAddress_v2`: cudart, PyTorch and cuda-bindings find every
//! driver function through these. We let the real driver choose (version, `_ptsz`/`_ptds`
//! variant, per-thread flags), then swap the pointer it returns for our wrapper when that
//! pointer is the real function of a hooked symbol. Matching by *address* rather than by name
//! is what keeps the driver's choice: `cuMemAllocAsync` with the per-thread flag comes back as
//! the real `cuMemAllocAsync_ptsz`, which maps to our `cuMemAllocAsync_ptsz` wrapper. Asked
//! for `cuGetProcAddress` itself, the driver returns its own, which maps to ours the same way.

use crate::dlsym::{answer_of, log_lookup};
use crate::hooks::{pfn, SYMBOLS};
use crate::log;
use crate::resolve::hooked_by_address;
use core::ffi::{c_char, c_int, c_void, CStr};
use gpuslice_abi::CUDA_SUCCESS;

/// Swap the driver's answer in `*p` for our wrapper when it is a hooked function; at debug level,
/// log the lookup.
///
/// # Safety
/// Called after the real `cuGetProcAddress` succeeded with these arguments: `p` is null or the
/// caller's out-pointer the driver has just written; `symbol` is null or NUL-terminated.
unsafe fn swap_for_wrapper(
    how: &str,
    symbol: *const c_char,
    p: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    if p.is_null() {
        return;
    }
    let mut ours = false;
    // SAFETY: p is non-null (checked above), written by the driver's successful call.
    let found = unsafe { *p };
    let mut answer = found;
    if let Some(i) = hooked_by_address(found) {
        if let Some(w) = SYMBOLS[i].wrapper {
            answer = w.0 as *mut c_void;
            // SAFETY: p is the caller's non-null out-pointer, valid for writes.
            unsafe { *p = answer };
            ours = true;
        }
    }
    if !symbol.is_null() && log::enabled(log::Level::Debug) {
        // SAFETY: the driver accepted `symbol` as a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        log_lookup(how, name, Some((version, flags)), answer_of(answer, ours));
    }
}

/// `cuGetProcAddress` (CUDA 11.3–11.8 signature).
pub unsafe fn get_proc_address(
    real: pfn::cuGetProcAddress,
    symbol: *const c_char,
    p: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> u32 {
    // SAFETY: the handler contract (hooks.rs): `real` with the program's arguments.
    let r = unsafe { real(symbol, p, version, flags) };
    if r == CUDA_SUCCESS {
        // SAFETY: the real call succeeded with these arguments, as swap_for_wrapper needs.
        unsafe { swap_for_wrapper("cuGetProcAddress", symbol, p, version, flags) };
    }
    r
}

/// `cuGetProcAddress_v2` (CUDA 12: with the symbol status).
pub unsafe fn get_proc_address_v2(
    real: pfn::cuGetProcAddress_v2,
    symbol: *const c_char,
    p: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    // SAFETY: the handler contract (hooks.rs): `real` with the program's arguments.
    let r = unsafe { real(symbol, p, version, flags, status) };
    if r == CUDA_SUCCESS {
        // SAFETY: the real call succeeded with these arguments, as swap_for_wrapper needs.
        unsafe { swap_for_wrapper("cuGetProcAddress_v2", symbol, p, version, flags) };
    }
    r
}
