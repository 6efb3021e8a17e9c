//! Events: recorded in stream order (a record generation the executor marks done with its
//! simulated time), waited on by other streams (`cuStreamWaitEvent`) and by the host, timed
//! with `cuEventElapsedTime`, and recycled through a free list. Apart from streams because an
//! event outlives the stream it was recorded on and is read from any thread without the
//! executor's lock.
//!
//! `cuEventDestroy` returns at once, as the driver's does: the handle is invalid from then on,
//! and the event goes back to the free list when the executor has planned its last record
//! (whichever of the two comes second recycles it). Record generations only grow, across
//! reuse too, so a `cuStreamWaitEvent` queued before the destroy still sees its record done.

use super::{Executor, HostWait, Op, Stream};
use crate::runtime::CuResult;
use crate::shared::now_ns;
use gpuslice_abi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering::*};
use std::sync::Mutex;

const EVENT_MAGIC: u64 = 0xE7E7_0000_0000_FA4E;

/// An event. Handles are pointers to leaked `Event`s, recycled through a free list.
#[derive(Debug)]
#[repr(C)]
pub struct Event {
    magic: u64,
    /// Creation flags.
    pub flags: AtomicU64,
    /// Record generations: the last one submitted, the one it had when (re)created (equal:
    /// never recorded since), the last one the executor planned.
    gen: AtomicU64,
    base: AtomicU64,
    done_gen: AtomicU64,
    ts: AtomicU64,
    exec: AtomicPtr<Executor>,
    destroyed: AtomicBool,
    /// Set by whoever puts it back on the free list, so it goes there once.
    recycled: AtomicBool,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Event {
    const MAGIC: u64 = EVENT_MAGIC;
}

static FREE_EVENTS: Mutex<Vec<&'static Event>> = Mutex::new(Vec::new());

impl Event {
    /// `cuEventCreate`.
    pub fn create(flags: u32) -> &'static Event {
        if let Some(e) = FREE_EVENTS.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            // Its records are all planned (that is when it was recycled); generations and the
            // last record's time go on, for waits queued on another device before the destroy.
            e.flags.store(flags as u64, Relaxed);
            e.base.store(e.gen.load(Acquire), Relaxed);
            e.recycled.store(false, Relaxed);
            e.destroyed.store(false, Release);
            return e;
        }
        Box::leak(Box::new(Event {
            magic: EVENT_MAGIC,
            flags: AtomicU64::new(flags as u64),
            gen: AtomicU64::new(0),
            base: AtomicU64::new(0),
            done_gen: AtomicU64::new(0),
            ts: AtomicU64::new(0),
            exec: AtomicPtr::new(std::ptr::null_mut()),
            destroyed: AtomicBool::new(false),
            recycled: AtomicBool::new(false),
        }))
    }

    /// The event a handle names.
    pub fn resolve(h: CUevent) -> CuResult<&'static Event> {
        crate::runtime::rt()?;
        crate::handle::resolve::<Event>(h as *const c_void)
            .filter(|e| !e.destroyed.load(Acquire))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUevent {
        self as *const Event as CUevent
    }

    /// `cuEventRecord`.
    pub fn record(&'static self, s: &'static Stream) -> CuResult<()> {
        if s.is_capturing() {
            return Ok(());
        }
        let gen = self.gen.fetch_add(1, AcqRel) + 1;
        if self.interprocess() {
            super::ipc_event::recorded(self, gen);
        }
        self.exec
            .store(s.exec as *const Executor as *mut Executor, Release);
        s.submit(Op::Record(self, gen))
    }

    /// `cuStreamWaitEvent`.
    pub fn wait_on(&'static self, s: &'static Stream) -> CuResult<()> {
        if self.opened() {
            return super::ipc_event::synchronize(self);
        }
        let gen = self.gen.load(Acquire);
        if self.never_recorded(gen) || s.is_capturing() {
            return Ok(());
        }
        s.submit(Op::Wait(self, gen))
    }

    /// Whether `gen` (its current generation) means "not recorded since created".
    fn never_recorded(&self, gen: u64) -> bool {
        gen == self.base.load(Acquire)
    }

    /// Whether the executor has planned record generation `gen` (its time may still be ahead).
    pub(super) fn recorded(&self, gen: u64) -> bool {
        self.done_gen.load(Acquire) >= gen
    }

    /// The simulated time of the last planned record.
    pub(super) fn time(&self) -> u64 {
        self.ts.load(Acquire)
    }

    /// The executor planned record generation `gen` at simulated time `at`.
    pub(super) fn set_recorded(&'static self, gen: u64, at: u64) {
        self.ts.store(at, Release);
        self.done_gen.fetch_max(gen, SeqCst);
        if self.interprocess() {
            super::ipc_event::planned(self, gen, at);
        }
        if self.destroyed.load(SeqCst) {
            self.recycle_if_idle();
        }
    }

    /// Created with `CU_EVENT_INTERPROCESS`: its records may be mirrored for other processes.
    fn interprocess(&self) -> bool {
        self.flags.load(Relaxed) & CU_EVENT_INTERPROCESS as u64 != 0
    }

    /// Opened from another process's handle: its state is the exporter's (`ipc_event.rs`).
    fn opened(&self) -> bool {
        self.flags.load(Relaxed) & super::ipc_event::IMPORTED != 0
    }

    /// (records issued, record planned, its time), for an export to start from.
    pub(super) fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.gen.load(Acquire),
            self.done_gen.load(Acquire),
            self.ts.load(Acquire),
        )
    }

    fn complete(&self) -> bool {
        if self.opened() {
            return super::ipc_event::complete(self);
        }
        let gen = self.gen.load(Acquire);
        self.never_recorded(gen) || (self.recorded(gen) && now_ns() >= self.time())
    }

    /// `cuEventQuery`.
    pub fn query(&self) -> CuResult<()> {
        if self.complete() {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }

    /// `cuEventSynchronize`.
    pub fn synchronize(&self) -> CuResult<()> {
        if self.opened() {
            return super::ipc_event::synchronize(self);
        }
        let gen = self.gen.load(Acquire);
        if self.never_recorded(gen) {
            return Ok(());
        }
        let ex = self.exec.load(Acquire);
        // Usually the executor has planned the record already: no lock needed.
        if !ex.is_null() && !self.recorded(gen) {
            // SAFETY: executors are leaked, never freed.
            let ex = unsafe { &*ex };
            ex.wait_for(|| self.recorded(gen));
        }
        let end = self.time();
        // SAFETY: executors are leaked, never freed.
        let more = !ex.is_null() && unsafe { &*ex }.busy_after(end);
        HostWait::of_event(self.flags.load(Relaxed)).until(end, more);
        if !ex.is_null() {
            // SAFETY: executors are leaked, never freed.
            crate::mem::after_sync_phys(unsafe { &*ex }.phys);
        }
        Ok(())
    }

    /// `cuEventElapsedTime`, in ms.
    pub fn elapsed(start: &Event, end: &Event) -> CuResult<f32> {
        if (start.flags.load(Relaxed) | end.flags.load(Relaxed)) & CU_EVENT_DISABLE_TIMING as u64
            != 0
        {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if start.never_recorded(start.gen.load(Acquire))
            || end.never_recorded(end.gen.load(Acquire))
        {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if !start.complete() || !end.complete() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        let (a, b) = (start.ts.load(Acquire) as i64, end.ts.load(Acquire) as i64);
        Ok((b - a) as f32 / 1e6)
    }

    /// `cuEventDestroy`: never waits (a host function or callback may destroy an event
    /// recorded behind it on its own stream). The event is recycled once the executor planned
    /// its last record, here or in `Event::set_recorded`, so no pending record ever lands
    /// on a reused event.
    pub fn destroy(&'static self) {
        if self.interprocess() {
            super::ipc_event::forget(self);
        }
        self.destroyed.store(true, SeqCst);
        self.recycle_if_idle();
    }

    /// Put a destroyed event on the free list once its records are planned; exactly once,
    /// whether `destroy` or the executor's `set_recorded` gets here second (both store, then
    /// load the other's flag with SeqCst, so at least one sees both).
    fn recycle_if_idle(&'static self) {
        if self.done_gen.load(SeqCst) >= self.gen.load(SeqCst) && !self.recycled.swap(true, SeqCst)
        {
            FREE_EVENTS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self);
        }
    }
}
