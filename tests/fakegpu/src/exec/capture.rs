//! Stream capture: while a stream captures, the work submitted to it goes into a graph
//! instead of its queue (`Stream::submit`), and the calls here begin, end, invalidate and
//! describe the capture. Apart from the rest of the stream because a capture is a small state
//! machine of its own (active, invalidated, ended) that never touches the executor.

use super::Stream;
use crate::graph::Graph;
use crate::runtime::CuResult;
use gpuslice_abi::*;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// A stream's capture in progress.
pub(super) struct Capture {
    pub(super) graph: &'static Graph,
    id: u64,
    invalid: bool,
}

static CAPTURE_IDS: AtomicU64 = AtomicU64::new(1);

impl Stream {
    /// Whether it is capturing into a graph.
    pub fn is_capturing(&self) -> bool {
        self.capturing.load(Acquire)
    }

    /// `cuStreamBeginCapture`.
    pub fn begin_capture(&'static self) -> CuResult<()> {
        if self.legacy {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if c.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        *c = Some(Capture {
            graph: Graph::new(),
            id: CAPTURE_IDS.fetch_add(1, Relaxed),
            invalid: false,
        });
        self.capturing.store(true, Release);
        Ok(())
    }

    /// `cuStreamEndCapture`.
    pub fn end_capture(&'static self) -> CuResult<&'static Graph> {
        let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        let cap = c.take().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        self.capturing.store(false, Release);
        if cap.invalid {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        Ok(cap.graph)
    }

    pub(super) fn invalidate_capture(&self) {
        if let Some(c) = self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            c.invalid = true;
        }
    }

    /// (status, id, graph) for `cuStreamGetCaptureInfo`.
    pub fn capture_info(&self) -> (CUstreamCaptureStatus, u64, CUgraph) {
        match self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            None => (CU_STREAM_CAPTURE_STATUS_NONE, 0, std::ptr::null_mut()),
            Some(c) if c.invalid => (CU_STREAM_CAPTURE_STATUS_INVALIDATED, c.id, c.graph.handle()),
            Some(c) => (CU_STREAM_CAPTURE_STATUS_ACTIVE, c.id, c.graph.handle()),
        }
    }

    /// The graph being captured, if any (for memory nodes made by cuMemAllocAsync).
    pub fn capture_graph(&self) -> Option<&'static Graph> {
        self.capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.graph)
    }
}
