//! The work a stream queues: kernels, event records and waits, host functions, copies,
//! memsets and stream-ordered frees ([`Op`]), with the byte movers that run copies and
//! memsets ([`Copy3D`], [`Memset`]). Apart because it is the vocabulary that the API, graphs,
//! streams and the executor share, and holds no state of its own.

use super::Event;
use gpuslice_abi::*;
use std::ffi::c_void;

/// `cuStreamAddCallback`'s callback type.
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

/// A 3D copy between linear byte ranges with pitches.
#[derive(Clone, Copy, Debug)]
pub struct Copy3D {
    pub dst: usize,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub src: usize,
    pub src_pitch: usize,
    pub src_height: usize,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

impl Copy3D {
    /// Move the bytes.
    ///
    /// # Safety
    /// Both ranges must be mapped for the whole extent.
    pub unsafe fn run(&self) {
        for z in 0..self.depth {
            for y in 0..self.height {
                let s = self.src + (z * self.src_height + y) * self.src_pitch;
                let d = self.dst + (z * self.dst_height + y) * self.dst_pitch;
                // SAFETY: the caller guarantees both ranges; memmove tolerates overlap.
                unsafe { std::ptr::copy(s as *const u8, d as *mut u8, self.width) };
            }
        }
    }

    /// A flat copy of `len` bytes.
    pub fn flat(dst: usize, src: usize, len: usize) -> Copy3D {
        Copy3D {
            dst,
            dst_pitch: len,
            dst_height: 1,
            src,
            src_pitch: len,
            src_height: 1,
            width: len,
            height: 1,
            depth: 1,
        }
    }
}

/// A memset of `height` rows of `width` elements of `elem` bytes, `pitch` bytes apart.
#[derive(Clone, Copy, Debug)]
pub struct Memset {
    pub dst: usize,
    pub pitch: usize,
    pub width: usize,
    pub height: usize,
    pub elem: u8,
    pub value: u32,
}

impl Memset {
    /// Write the values.
    ///
    /// # Safety
    /// The range must be mapped.
    pub unsafe fn run(&self) {
        for y in 0..self.height {
            let row = self.dst + y * self.pitch;
            // SAFETY: the caller guarantees the range; the element writes are unaligned-safe.
            unsafe {
                match self.elem {
                    1 => std::ptr::write_bytes(row as *mut u8, self.value as u8, self.width),
                    2 => (0..self.width).for_each(|i| {
                        ((row + 2 * i) as *mut u16).write_unaligned(self.value as u16)
                    }),
                    _ => (0..self.width)
                        .for_each(|i| ((row + 4 * i) as *mut u32).write_unaligned(self.value)),
                }
            }
        }
    }
}

/// One unit of queued work.
#[derive(Clone, Debug)]
pub enum Op {
    /// A kernel taking this many ns of engine time.
    Kernel(u64),
    /// Record an event (its record generation).
    Record(&'static Event, u64),
    /// Wait until an event's record generation completes.
    Wait(&'static Event, u64),
    /// `cuLaunchHostFunc`.
    Host(unsafe extern "C" fn(*mut c_void), usize),
    /// `cuStreamAddCallback` (callback, stream handle, user data).
    Callback(
        unsafe extern "C" fn(CUstream, CUresult, *mut c_void),
        usize,
        usize,
    ),
    /// Copy bytes.
    Copy(Copy3D),
    /// Set bytes.
    Set(Memset),
    /// `cuMemFreeAsync` reaching the stream.
    Free(u64),
}

// SAFETY: the raw addresses inside are plain integers or `'static` references to Sync
// structures; host functions are called on the executor thread as CUDA calls them on its own.
unsafe impl Send for Op {}

impl Op {
    pub(super) fn touches_memory(&self) -> bool {
        matches!(self, Op::Copy(_) | Op::Set(_) | Op::Free(_))
    }
}
