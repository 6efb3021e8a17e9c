//! The captures open in this process, as the capture hooks (`capture.rs`) count them, and
//! the question "is this stream capturing, into which graph", asked of the driver only while
//! one is open. Below the hooks and every room that asks: the launch gate (`compute/`) passes
//! captured launches through ungated; stream-ordered allocation (`memory/pools.rs`) charges
//! captured allocations as graph memory.

use crate::real;
use core::sync::atomic::Ordering::*;
use gpuslice_abi::*;

pub use crate::process::CAPTURES;

/// The graph `stream` is capturing into, if any. A stream-ordered allocation captured there is
/// a memory node of that graph: charged as its graph memory (`memory/graph.rs`), not as pool
/// memory, and kept out of the pointer table, so the free that pairs with it (captured or not)
/// moves nothing into a pool's retained credit.
///
/// # Safety
/// `stream` is a stream handle the program passed to the driver (handler contract).
#[inline]
pub(crate) unsafe fn capture_graph(stream: CUstream) -> Option<CUgraph> {
    if CAPTURES.load(Acquire) == 0 {
        return None;
    }
    // SAFETY: the program's stream (this function's contract).
    unsafe { capture_graph_query(stream) }
}

/// Ask the driver which graph `stream` captures into.
///
/// # Safety
/// As [`capture_graph`].
#[cold]
pub(crate) unsafe fn capture_graph_query(stream: CUstream) -> Option<CUgraph> {
    let f = real::cuStreamGetCaptureInfo_v2()?;
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    let mut graph: CUgraph = core::ptr::null_mut();
    let mut deps: *const CUgraphNode = core::ptr::null();
    let mut n = 0usize;
    // SAFETY: the real cuStreamGetCaptureInfo_v2 with the program's stream and out-pointers
    // to our locals.
    let r = unsafe { f(stream, &mut status, &mut id, &mut graph, &mut deps, &mut n) };
    (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE && !graph.is_null())
        .then_some(graph)
}

/// A capture counted by the begin hooks ended (`cuStreamEndCapture`, however it ended).
pub(crate) fn ended() {
    let _ = CAPTURES.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
}
