//! Stream memory operations (`cuStreamWaitValue*`, `cuStreamWriteValue64`,
//! `cuStreamBatchMemOp`) and `cuMemPrefetchAsync`. Apart because they are the one kind of
//! stream work that reads and writes device memory as the executor reaches it: a wait polls
//! the word until its condition holds, a write stores it.

use crate::exec::{Op, Stream};
use crate::mem::{self, Kind};
use crate::runtime::{rt, CuResult};
use gpuslice_abi::*;
use std::ffi::{c_uint, c_void};

/// A stream memory operation (`cuStreamWaitValue*`, `cuStreamWriteValue*`,
/// `cuStreamBatchMemOp`), run in stream order on the executor: device memory is host memory,
/// so a wait polls the word and a write stores it.
#[derive(Clone, Copy)]
pub(super) struct MemOp {
    pub(super) addr: u64,
    pub(super) value: u64,
    pub(super) flags: c_uint,
    pub(super) wide: bool,
    pub(super) write: bool,
}

/// The executor's side of a [`MemOp`] (an `Op::Host` body).
///
/// # Safety
/// `p` is a leaked `MemOp` (kept for graph replays) whose address is a live device word.
unsafe extern "C" fn run_mem_op(p: *mut c_void) {
    // SAFETY: the function's contract.
    let op = unsafe { *(p as *const MemOp) };
    // SAFETY: as above: device memory is host memory, mapped while allocated.
    unsafe {
        if op.write {
            if op.wide {
                (op.addr as *mut u64).write_volatile(op.value);
            } else {
                (op.addr as *mut u32).write_volatile(op.value as u32);
            }
            return;
        }
        loop {
            let (cur, want) = if op.wide {
                ((op.addr as *const u64).read_volatile(), op.value)
            } else {
                (
                    (op.addr as *const u32).read_volatile() as u64,
                    op.value as u32 as u64,
                )
            };
            // CU_STREAM_WAIT_VALUE_GEQ (cyclic), _EQ, _AND, _NOR.
            let met = match op.flags & 3 {
                0 if op.wide => (cur.wrapping_sub(want) as i64) >= 0,
                0 => (cur.wrapping_sub(want) as u32 as i32) >= 0,
                1 => cur == want,
                2 => cur & want != 0,
                _ if op.wide => !(cur | want) != 0,
                _ => !((cur | want) as u32) != 0,
            };
            if met {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(5));
        }
    }
}

/// Queue one stream memory operation on `h`. The word must lie in live device memory.
pub(super) fn mem_op(h: CUstream, op: MemOp) -> CuResult<()> {
    rt()?;
    let s = Stream::resolve(h, false)?;
    let width = if op.wide { 8 } else { 4 };
    match mem::lookup(op.addr) {
        Some((start, r)) if op.addr.is_multiple_of(width) && op.addr + width <= start + r.size => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    let p = Box::leak(Box::new(op)) as *mut MemOp;
    s.submit(Op::Host(run_mem_op, p as usize))
}

/// `cuStreamBatchMemOp(_v2)`: `CUstreamBatchMemOpParams` entries of 48 bytes (operation at 0,
/// address at 8, value at 16, flags at 24); barriers and flushes order nothing more here.
///
/// # Safety
/// `params` holds `count` entries (the API contract).
pub(super) unsafe fn batch_mem_op(h: CUstream, count: c_uint, params: *const u8) -> CuResult<()> {
    if count > 0 && params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for k in 0..count as usize {
        // SAFETY: entry k is inside the caller's array (this function's contract).
        let (kind, addr, v32, v64, flags) = unsafe {
            let e = params.add(k * 48);
            (
                (e as *const u32).read_unaligned(),
                (e.add(8) as *const u64).read_unaligned(),
                (e.add(16) as *const u32).read_unaligned() as u64,
                (e.add(16) as *const u64).read_unaligned(),
                (e.add(24) as *const u32).read_unaligned(),
            )
        };
        let op = |value, wide, write| MemOp {
            addr,
            value,
            flags,
            wide,
            write,
        };
        match kind {
            1 => mem_op(h, op(v32, false, false))?, // WAIT_VALUE_32
            2 => mem_op(h, op(v32, false, true))?,  // WRITE_VALUE_32
            4 => mem_op(h, op(v64, true, false))?,  // WAIT_VALUE_64
            5 => mem_op(h, op(v64, true, true))?,   // WRITE_VALUE_64
            3 | 6 => {}                             // FLUSH_REMOTE_WRITES, BARRIER
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

/// `cuMemPrefetchAsync(_v2)`: a hint; the fake's managed memory is host memory, resident for
/// every device. Checks what the driver checks: managed memory, a valid stream.
pub(super) fn prefetch(ptr: CUdeviceptr, n: usize, h: CUstream) -> CuResult<()> {
    rt()?;
    Stream::resolve(h, false)?;
    match mem::lookup(ptr) {
        Some((start, r)) if r.kind == Kind::Managed && ptr + n as u64 <= start + r.size => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
