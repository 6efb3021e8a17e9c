//! Synchronization: `cuStreamSynchronize(_ptsz)`, `cuCtxSynchronize(_v2)`, `cuEventSynchronize`.
//! Each is passed to the driver; after one succeeds, the stream-ordered pools may have released
//! what they held above their release threshold, so their credit is reconciled
//! (`memory/pools.rs`, whose module comment says why).

use crate::memory::pools;
use gpuslice_abi::*;

/// `cuStreamSynchronize(_ptsz)`: a point where pools release memory.
pub unsafe fn stream_synchronize(real: pfn::cuStreamSynchronize, stream: CUstream) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(stream) };
    if r == CUDA_SUCCESS {
        pools::synchronized();
    }
    r
}

/// `cuCtxSynchronize`: as `stream_synchronize`.
pub unsafe fn ctx_synchronize(real: pfn::cuCtxSynchronize) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real() };
    if r == CUDA_SUCCESS {
        pools::synchronized();
    }
    r
}

/// `cuCtxSynchronize_v2` (CUDA 13.0: the context is a parameter): as `stream_synchronize`.
pub unsafe fn ctx_synchronize_v2(real: pfn::cuCtxSynchronize_v2, ctx: CUcontext) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(ctx) };
    if r == CUDA_SUCCESS {
        pools::synchronized();
    }
    r
}

/// `cuEventSynchronize`: as `stream_synchronize`.
pub unsafe fn event_synchronize(real: pfn::cuEventSynchronize, event: CUevent) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(event) };
    if r == CUDA_SUCCESS {
        pools::synchronized();
    }
    r
}
