//! Streams: the handles clients pass (the legacy and per-thread default streams among them),
//! each a queue of its device's [`Executor`], and what the stream calls do with them: submit,
//! synchronize, query, destroy, and `cuCtxSynchronize` over a context's streams. Apart from
//! the executor because a stream is the client's view: a handle to check, a context to keep
//! current, and a capture (`capture.rs`) that diverts work into a graph instead of the queue.

use super::capture::Capture;
use super::{Executor, HostWait, Op};
use crate::graph;
use crate::runtime::{Ctx, CuResult};
use gpuslice_abi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Mutex;

const STREAM_MAGIC: u64 = 0x5732_EA40_0000_FA4E;

/// A stream. Handles are pointers to leaked `Stream`s.
#[repr(C)]
pub struct Stream {
    magic: u64,
    /// Its context.
    pub ctx: &'static Ctx,
    /// The executor of its device.
    pub exec: &'static Executor,
    id: usize,
    /// Creation flags.
    pub flags: u32,
    /// Priority.
    pub priority: i32,
    /// Whether it is a legacy default stream (which cannot capture).
    pub legacy: bool,
    pub(super) capturing: AtomicBool,
    pub(super) capture: Mutex<Option<Capture>>,
    destroyed: AtomicBool,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Stream {
    const MAGIC: u64 = STREAM_MAGIC;
}

impl Stream {
    /// A new stream of `ctx`.
    pub fn new(ctx: &'static Ctx, flags: u32, priority: i32, legacy: bool) -> &'static Stream {
        let exec = ctx.device().exec;
        let id = exec.new_queue(ctx as *const Ctx as usize);
        Box::leak(Box::new(Stream {
            magic: STREAM_MAGIC,
            ctx,
            exec,
            id,
            flags,
            priority,
            legacy,
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
            destroyed: AtomicBool::new(false),
        }))
    }

    /// The handle of this stream (the legacy default stream's is `CU_STREAM_LEGACY`).
    pub fn handle(&'static self) -> CUstream {
        self as *const Stream as CUstream
    }

    /// The stream a handle names: null/0x1/0x2 are the default streams of the current context
    /// (null is the per-thread one for `_ptsz` entry points).
    pub fn resolve(h: CUstream, per_thread: bool) -> CuResult<&'static Stream> {
        let v = h as usize;
        if v == 0 || v == CU_STREAM_LEGACY || v == CU_STREAM_PER_THREAD {
            let c = crate::runtime::cur_ctx()?;
            return Ok(if v == CU_STREAM_PER_THREAD || (v == 0 && per_thread) {
                c.thread_stream()
            } else {
                c.legacy_stream()
            });
        }
        crate::runtime::rt()?;
        let s = crate::handle::resolve::<Stream>(h as *const c_void)
            .filter(|s| !s.destroyed.load(Acquire))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !s.ctx.active.load(Acquire) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        crate::runtime::usable(s.ctx)?;
        Ok(s)
    }

    /// Queue `op` (or record it into the graph being captured).
    pub fn submit(&'static self, op: Op) -> CuResult<()> {
        if self.is_capturing() {
            let mut c = self.capture.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = c.as_mut() {
                graph::add_op(c.graph, op);
                return Ok(());
            }
        }
        self.exec.submit(self.id, op)
    }

    /// `cuStreamSynchronize`.
    pub fn synchronize(&'static self) -> CuResult<()> {
        if self.is_capturing() {
            self.invalidate_capture();
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let end = self.exec.wait_queue(self.id);
        let more = self.exec.busy_after(end);
        HostWait::of_context(self.ctx.flags.load(Relaxed)).until(end, more);
        crate::mem::after_sync(self.ctx.dev);
        Ok(())
    }

    /// `cuStreamQuery`.
    pub fn query(&self) -> CuResult<()> {
        if self.is_capturing() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if self.exec.queue_idle(self.id) {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }

    /// `cuStreamDestroy`: pending work still runs.
    pub fn destroy(&'static self) -> CuResult<()> {
        if self.legacy {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        self.destroyed.store(true, Release);
        self.exec.retire_queue(self.id);
        Ok(())
    }
}

/// `cuCtxSynchronize`: wait for every stream of `c`.
pub fn ctx_synchronize(c: &'static Ctx) -> CuResult<()> {
    let end = c.device().exec.wait_ctx(c as *const Ctx as usize);
    let ex = &c.device().exec;
    HostWait::of_context(c.flags.load(Relaxed)).until(end, ex.busy_after(end));
    crate::mem::after_sync(c.dev);
    Ok(())
}
