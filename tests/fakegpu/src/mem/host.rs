//! Host memory the fake registers but never counts on a device: page-locked allocations
//! (`cuMemAllocHost`, `cuMemHostAlloc`, module globals' buffers) and registered client memory
//! (`cuMemHostRegister`). Apart from device memory because none of it is reserved against
//! the device total, and registered memory is not ours to unmap.

use super::ranges::{map_anon, page_round, ranges, unmap, Kind, Range};
use crate::runtime::{Ctx, CuResult};
use gpuslice_abi::*;

/// Allocate uncounted host memory (pinned host allocations, module globals).
pub fn alloc_host(ctx: Option<&'static Ctx>, size: u64, kind: Kind) -> CuResult<u64> {
    let map_len = page_round(size.max(1));
    let ptr = map_anon(map_len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    ranges().insert(ptr, Range::new(ctx, size, map_len, kind));
    Ok(ptr)
}

/// `cuMemFreeHost`.
pub fn free_host(ptr: u64) -> CuResult<()> {
    let mut g = ranges();
    match g.get(&ptr) {
        Some(r) if r.kind == Kind::Host => {
            let r = g.remove(&ptr).expect("present");
            drop(g);
            unmap(ptr, r.map_len);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemHostRegister`.
pub fn host_register(ptr: u64, size: u64) -> CuResult<()> {
    if ptr == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = ranges();
    if g.contains_key(&ptr) {
        return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    g.insert(ptr, Range::new(None, size, size as usize, Kind::Registered));
    Ok(())
}

/// `cuMemHostUnregister`.
pub fn host_unregister(ptr: u64) -> CuResult<()> {
    let mut g = ranges();
    match g.get(&ptr) {
        Some(r) if r.kind == Kind::Registered => {
            g.remove(&ptr);
            Ok(())
        }
        _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
    }
}
