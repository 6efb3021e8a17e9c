//! Launch hooks: every kernel and graph launch passes the compute gate (`compute/`, owned by
//! the compute engineer) and nothing else happens here: no syscalls, no locks.

use crate::compute;
use core::ffi::{c_uint, c_void};
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// One kernel launch through the gate: `launch` is the real entry point with its arguments.
#[inline(always)]
fn gated(stream: CUstream, launch: impl FnOnce() -> CUresult) -> CUresult {
    let gate = compute::before_launch(stream);
    let r = launch();
    compute::after_launch(gate, stream, r);
    r
}

/// The grid launches take the same grid, block, shared memory, stream and parameters
/// (`cuLaunchKernel` also `extra`): one handler through the gate, written once for both. The
/// hook table checks each against its `pfn` type.
macro_rules! grid_launch {
    ($(#[$doc:meta])* $handler:ident: $pfn:ident $(, $extra:ident)?) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        #[inline]
        pub unsafe fn $handler(
            real: pfn::$pfn,
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shmem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            gated(stream, || {
                // SAFETY: the handler contract: `real` with the program's arguments.
                unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params $(, $extra)?) }
            })
        }
    };
}

grid_launch!(
    /// `cuLaunchKernel` and `cuLaunchKernel_ptsz`.
    launch_kernel: cuLaunchKernel, extra
);
grid_launch!(
    /// `cuLaunchCooperativeKernel` and `_ptsz`.
    launch_cooperative: cuLaunchCooperativeKernel
);

/// `cuLaunchKernelEx` and `_ptsz`: the stream is in the config.
#[inline]
pub unsafe fn launch_kernel_ex(
    real: pfn::cuLaunchKernelEx,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        // SAFETY: the handler contract: `real` with the program's arguments.
        return unsafe { real(config, f, params, extra) }; // the driver reports the error
    }
    // SAFETY: `config` is non-null (checked above), so the program's valid launch config.
    let stream = unsafe { (*config).hStream };
    gated(stream, || {
        // SAFETY: the handler contract: `real` with the program's arguments.
        unsafe { real(config, f, params, extra) }
    })
}

/// `cuGraphLaunch` and `_ptsz`.
#[inline]
pub unsafe fn graph_launch(
    real: pfn::cuGraphLaunch,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    let gate = compute::before_graph_launch(exec, stream);
    // SAFETY: the handler contract: `real` with the program's arguments.
    let launch = || unsafe { real(exec, stream) };
    let mut r = launch();
    if r == CUDA_ERROR_OUT_OF_MEMORY {
        // Graph memory is taken now: the balloons' slow path (memory/balloon.rs).
        r = crate::memory::launch_refused(exec, launch, r);
    }
    compute::after_launch(gate, stream, r);
    r
}
