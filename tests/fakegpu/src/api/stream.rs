//! The bodies the stream exports share: queueing an op on a stream (and waiting for it, for
//! the synchronous calls), stream creation, host functions and callbacks, capture state and
//! its end, and stream-ordered allocation and free (into the capturing graph or the pool) with
//! the device's current pool. Apart because each has a legacy and a per-thread (`_ptsz`)
//! export (or a CUDA 13 twin) that differ only in the stream (or how the device is named).

use super::args::{put, put_opt};
use crate::exec::{Op, Stream};
use crate::graph;
use crate::mem::{self, Kind, Pool};
use crate::runtime::{cur_ctx, device, rt, CuResult};
use gpuslice_abi::*;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering::*;

/// Run `op` on the default stream and wait for it (the synchronous copies and memsets).
pub(super) fn sync_op(per_thread: bool, op: Op) -> CuResult<()> {
    let s = Stream::resolve(std::ptr::null_mut(), per_thread)?;
    s.submit(op)?;
    s.synchronize()
}

pub(super) fn async_op(h: CUstream, per_thread: bool, op: Op) -> CuResult<()> {
    Stream::resolve(h, per_thread)?.submit(op)
}

pub(super) fn stream_create(out: *mut CUstream, flags: c_uint, prio: c_int) -> CuResult<()> {
    let c = cur_ctx()?;
    if out.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    put(
        out,
        Stream::new(c, flags, prio.clamp(-5, 0), false).handle(),
    )
}

/// Queue a host function (`cuLaunchHostFunc`) or a stream callback (`cuStreamAddCallback`),
/// the op `op` makes of the function; a null function is `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn host_call<F>(
    h: CUstream,
    per_thread: bool,
    f: Option<F>,
    op: impl FnOnce(F) -> Op,
) -> CuResult<()> {
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    async_op(h, per_thread, op(f))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn capture_info(
    h: CUstream,
    per_thread: bool,
    status: *mut CUstreamCaptureStatus,
    id: *mut u64,
    graph_out: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    ndeps: *mut usize,
) -> CuResult<()> {
    let s = Stream::resolve(h, per_thread)?;
    let (st, cid, g) = s.capture_info();
    put(status, st)?;
    put_opt(id, cid);
    put_opt(graph_out, g);
    put_opt(deps, std::ptr::null());
    put_opt(edges, std::ptr::null());
    put_opt(ndeps, 0);
    Ok(())
}

pub(super) fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<&'static Pool>,
    h: CUstream,
    per_thread: bool,
) -> CuResult<()> {
    let c = cur_ctx()?;
    let s = Stream::resolve(h, per_thread)?;
    if dptr.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(g) = s.capture_graph() {
        let (_, p) = graph::add_alloc(g, c, size as u64)?;
        return put(dptr, p);
    }
    let pool = match pool {
        Some(p) => p,
        // SAFETY: the device's current pool is always a leaked Pool.
        None => unsafe { &*(c.device().mempool.load(Acquire) as *const Pool) },
    };
    put(dptr, pool.alloc(c, size as u64)?)
}

pub(super) fn free_async(ptr: CUdeviceptr, h: CUstream, per_thread: bool) -> CuResult<()> {
    rt()?;
    let s = Stream::resolve(h, per_thread)?;
    match mem::lookup(ptr) {
        Some((start, r))
            if start == ptr
                && matches!(
                    r.kind,
                    Kind::Device | Kind::Managed | Kind::Pool(_) | Kind::Graph(_)
                ) => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    // Pool memory leaves the pool's used bytes now, before the stream reaches the free.
    mem::free_async_called(ptr);
    s.submit(Op::Free(ptr))
}

/// `cuStreamEndCapture(_ptsz)`: the captured graph, or null and the capture's error.
pub(super) fn end_capture(h: CUstream, per_thread: bool, g: *mut CUgraph) -> CuResult<()> {
    if g.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match Stream::resolve(h, per_thread)?.end_capture() {
        Ok(graph) => put(g, graph.handle()),
        Err(e) => {
            put(g, std::ptr::null_mut())?;
            Err(e)
        }
    }
}

/// Make `p` device `d`'s current pool (`cuDeviceSetMemPool`, CUDA 13's `cuMemSetMemPool`): a
/// pool of another device is `CUDA_ERROR_INVALID_DEVICE`.
pub(super) fn set_mem_pool(d: CUdevice, p: CUmemoryPool) -> CuResult<()> {
    let dev = device(d)?;
    let pool = Pool::resolve(p)?;
    if pool.dev != d as usize {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    dev.mempool.store(p as usize, Release);
    Ok(())
}
