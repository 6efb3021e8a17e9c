//! Device memory proper: counted allocations (`cuMemAlloc`, pitch, managed, an array's
//! backing store), reserved against the node-wide device total and mapped lazily, and the frees
//! every kind of range ends in (`cuMemFree`, the executor's stream-ordered frees, a context's
//! destruction). Apart from the registry because this is where bytes are counted on the device
//! and given back.

use super::pool::{pool_of, pools};
use super::ranges::{map_reserved, phys, ranges, unmap, Kind, Range};
use crate::runtime::{rt, rt_unchecked, Ctx, CuResult};
use gpuslice_abi::*;
use std::sync::atomic::Ordering::*;

/// Allocate `size` counted bytes on `ctx`'s device.
pub fn alloc(ctx: &'static Ctx, size: u64, kind: Kind) -> CuResult<u64> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let node = rt()?.node;
    let p = phys(ctx.dev);
    if !node.reserve_or_reap(p, size) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let (ptr, map_len) = map_reserved(node, p, size)?;
    ranges().insert(ptr, Range::new(Some(ctx), size, map_len, kind));
    Ok(ptr)
}

/// `cuMemFree`: the pointer must be the start of a live device allocation.
pub fn free(ptr: u64) -> CuResult<()> {
    rt()?;
    let r = *ranges().get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match r.kind {
        Kind::Device | Kind::Managed | Kind::Pool(_) | Kind::Graph(_) => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    // Queued copies may still read or write it; the driver's free waits for them as well.
    let dev = &rt_unchecked().devices[r.dev];
    if dev.exec.pending_mem.load(Acquire) > 0 {
        if let Some(c) = Ctx::from_handle(r.ctx as CUcontext) {
            let _ = crate::exec::ctx_synchronize(c);
        }
    }
    free_now(ptr);
    Ok(())
}

/// Free a live range now (stream-ordered frees reach here from the executor).
pub fn free_now(ptr: u64) {
    let Some(r) = ranges().get(&ptr).copied() else {
        // A pool block freed with cuMemFreeAsync: the stream has reached its free.
        for p in pools() {
            if p.complete_pending(ptr) {
                break;
            }
        }
        return;
    };
    match r.kind {
        Kind::Pool(pool) => pool_of(pool).give_back(ptr, r.size),
        Kind::Graph(true) => {
            ranges().insert(
                ptr,
                Range {
                    kind: Kind::Graph(false),
                    ..r
                },
            );
            rt_unchecked().node.unreserve(phys(r.dev), r.size);
            // SAFETY: the range is ours; dropping its pages keeps the address reserved.
            unsafe { libc::madvise(ptr as *mut libc::c_void, r.map_len, libc::MADV_DONTNEED) };
        }
        Kind::Graph(false) => {}
        _ => {
            ranges().remove(&ptr);
            // Exported memory stays counted while another process maps it (`ipc.rs`).
            if r.counted() && !super::ipc::exported_freed(ptr) {
                rt_unchecked().node.unreserve(phys(r.dev), r.size);
            }
            if r.kind != Kind::Registered {
                unmap(ptr, r.map_len);
            }
            if r.kind == Kind::Imported {
                super::ipc::imported_gone(ptr);
            }
        }
    }
}

/// Free everything context `c` allocated (context destruction, primary context reset).
pub fn free_all_of(c: &'static Ctx) {
    let me = c as *const Ctx as usize;
    let mine: Vec<u64> = ranges()
        .iter()
        .filter(|(_, r)| r.ctx == me)
        .map(|(&p, _)| p)
        .collect();
    for p in mine {
        let Some(r) = ranges().get(&p).copied() else {
            continue;
        };
        free_now(p);
        // A graph range outlives its frees (the address is the graph's); its context does not.
        if let Kind::Graph(_) = r.kind {
            ranges().remove(&p);
            unmap(p, r.map_len);
        }
    }
    for pool in pools().iter().filter(|p| p.dev == c.dev) {
        pool.complete_all_pending();
        pool.trim(0);
    }
}
