//! Contexts' end: `cuCtxDestroy_v2` and the primary context's release and reset hand the
//! process's compute lease on the device back (`compute/`) before the driver lets go of it.

use crate::compute;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// `cuCtxDestroy_v2`: the process's compute lease on the context's device is handed back
/// first (the current context's device: the usual case of destroying the current context).
#[inline]
pub unsafe fn ctx_destroy(real: pfn::cuCtxDestroy_v2, ctx: CUcontext) -> CUresult {
    if let Some(dev) = compute::current_device() {
        compute::release_device(dev);
    }
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { real(ctx) }
}

/// `cuDevicePrimaryCtxRelease_v2`: as [`ctx_destroy`], for the device's primary context.
#[inline]
pub unsafe fn primary_ctx_release(
    real: pfn::cuDevicePrimaryCtxRelease_v2,
    dev: CUdevice,
) -> CUresult {
    compute::release_device(dev);
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { real(dev) }
}

/// `cuDevicePrimaryCtxReset_v2`: as [`ctx_destroy`], for the device's primary context.
#[inline]
pub unsafe fn primary_ctx_reset(real: pfn::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> CUresult {
    compute::release_device(dev);
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { real(dev) }
}
