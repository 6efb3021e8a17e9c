//! Stream capture's hooks: `cuStreamBeginCapture(_v2)(_ptsz)` counted, `cuStreamEndCapture(_ptsz)`
//! uncounted, and what the capture made handed to the graph memory (`memory/graph.rs`). The
//! count and the "is this stream capturing" question are `capturing.rs`, below every room that
//! asks.

use crate::capturing::{capture_graph_query, ended, CAPTURES};
use crate::memory;
use core::sync::atomic::Ordering::*;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// `cuStreamBeginCapture_v2(_ptsz)`: count the capture.
pub unsafe fn begin_capture(
    real: pfn::cuStreamBeginCapture_v2,
    stream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(stream, mode) };
    if r == CUDA_SUCCESS {
        CAPTURES.fetch_add(1, AcqRel);
    }
    r
}

/// `cuStreamBeginCapture(_ptsz)`: the CUDA 10 export, without a mode.
pub unsafe fn begin_capture_v1(real: pfn::cuStreamBeginCapture, stream: CUstream) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(stream) };
    if r == CUDA_SUCCESS {
        CAPTURES.fetch_add(1, AcqRel);
    }
    r
}

/// `cuStreamEndCapture(_ptsz)`: the capture ends even when it fails (invalidated), and then the
/// driver keeps no graph, so the memory captured into it goes back.
pub unsafe fn end_capture(
    real: pfn::cuStreamEndCapture,
    stream: CUstream,
    out: *mut CUgraph,
) -> CUresult {
    let capturing = if CAPTURES.load(Acquire) == 0 {
        None
    } else {
        // SAFETY: the program's stream (handler contract).
        unsafe { capture_graph_query(stream) }
    };
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(stream, out) };
    let Some(g) = capturing else {
        return r;
    };
    ended();
    let made = if r == CUDA_SUCCESS && !out.is_null() {
        // SAFETY: the program's out-pointer, non-null (checked), written by the driver's
        // successful call.
        unsafe { *out }
    } else {
        core::ptr::null_mut()
    };
    memory::capture_ended(g, made);
    r
}
