//! Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemPoolCreate`, ...). A pool keeps freed
//! blocks reserved (counted as used on the device) until a synchronize finds them above the
//! release threshold or `cuMemPoolTrimTo` trims them, as the driver does. A `cuMemFreeAsync`
//! leaves the pool's used bytes at the call; the block is *pending* until the free is reached
//! in its stream (not reusable, not trimmable), then free. Apart because a pool holds device
//! memory that no live range owns.

use super::ranges::{map_reserved, ranges, unmap, Kind, Range};
use crate::runtime::{rt, rt_unchecked, Ctx, CuResult};
use gpuslice_abi::*;
use std::sync::Mutex;

/// A stream-ordered memory pool.
#[repr(C)]
pub struct Pool {
    magic: u64,
    /// CUDA ordinal of its device.
    pub dev: usize,
    phys: usize,
    inner: Mutex<PoolInner>,
    /// Whether it was made by cuMemPoolCreate (destroyable).
    pub created: bool,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Pool {
    const MAGIC: u64 = POOL_MAGIC;
}

#[derive(Default)]
struct PoolInner {
    /// Blocks (pointer, size, mapped length) free for reuse or release.
    free: Vec<(u64, u64, usize)>,
    /// Blocks freed with `cuMemFreeAsync` whose free the stream has not reached yet: no
    /// longer used, still reserved, neither reusable nor releasable.
    pending: Vec<(u64, u64, usize)>,
    reserved: u64,
    used: u64,
    reserved_high: u64,
    used_high: u64,
    threshold: u64,
    destroyed: bool,
}

const POOL_MAGIC: u64 = 0x9001_0000_0000_FA4E;
static POOLS: Mutex<Vec<&'static Pool>> = Mutex::new(Vec::new());

/// Every pool made so far.
pub(super) fn pools() -> Vec<&'static Pool> {
    POOLS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The pool a [`Kind::Pool`] range names.
pub(super) fn pool_of(pool: usize) -> &'static Pool {
    // SAFETY: pools are leaked; the registry holds only pointers to live ones.
    unsafe { &*(pool as *const Pool) }
}

impl Pool {
    /// A new pool on ordinal `dev`.
    pub fn new(dev: usize, phys: usize, created: bool) -> &'static Pool {
        let p: &'static Pool = Box::leak(Box::new(Pool {
            magic: POOL_MAGIC,
            dev,
            phys,
            inner: Mutex::new(PoolInner::default()),
            created,
        }));
        POOLS.lock().unwrap_or_else(|e| e.into_inner()).push(p);
        p
    }

    /// The pool a handle names.
    pub fn resolve(h: CUmemoryPool) -> CuResult<&'static Pool> {
        rt()?;
        crate::handle::resolve::<Pool>(h as *const std::ffi::c_void)
            .filter(|p| !p.lock().destroyed)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUmemoryPool {
        self as *const Pool as CUmemoryPool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocate from the pool: reuse a freed block that fits, else reserve a new one.
    pub fn alloc(&'static self, ctx: &'static Ctx, size: u64) -> CuResult<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        let best = g
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.1 >= size && b.1 <= size.saturating_mul(2))
            .min_by_key(|(_, b)| b.1)
            .map(|(i, _)| i);
        let (ptr, bsize, map_len) = match best {
            Some(i) => g.free.swap_remove(i),
            None => {
                let node = rt()?.node;
                if !node.reserve_or_reap(self.phys, size) {
                    // The driver trims a pool's unused blocks before failing.
                    drop(g);
                    self.trim(0);
                    g = self.lock();
                    if !node.reserve_or_reap(self.phys, size) {
                        return Err(CUDA_ERROR_OUT_OF_MEMORY);
                    }
                }
                let (p, map_len) = map_reserved(node, self.phys, size)?;
                g.reserved += size;
                g.reserved_high = g.reserved_high.max(g.reserved);
                (p, size, map_len)
            }
        };
        g.used += bsize;
        g.used_high = g.used_high.max(g.used);
        drop(g);
        let kind = Kind::Pool(self as *const Pool as usize);
        ranges().insert(ptr, Range::new(Some(ctx), bsize, map_len, kind));
        Ok(ptr)
    }

    /// `cuMemFree` of a pool block (or its context going): the block is free for reuse at once.
    pub(super) fn give_back(&self, ptr: u64, size: u64) {
        let map_len = ranges().remove(&ptr).map_or(0, |r| r.map_len);
        let mut g = self.lock();
        g.used = g.used.saturating_sub(size);
        g.free.push((ptr, size, map_len));
    }

    /// `cuMemFreeAsync` called: the block stops counting as used at once (the driver's
    /// `USED_MEM_CURRENT`), stays reserved, and waits for its stream to reach the free.
    fn free_pending(&self, ptr: u64, size: u64, map_len: usize) {
        let mut g = self.lock();
        g.used = g.used.saturating_sub(size);
        g.pending.push((ptr, size, map_len));
    }

    /// The stream reached the free of `ptr`: the block is free (reusable, releasable). False
    /// if `ptr` is not pending here.
    pub(super) fn complete_pending(&self, ptr: u64) -> bool {
        let mut g = self.lock();
        let Some(i) = g.pending.iter().position(|b| b.0 == ptr) else {
            return false;
        };
        let b = g.pending.swap_remove(i);
        g.free.push(b);
        true
    }

    /// Every pending block is free (its context is going).
    pub(super) fn complete_all_pending(&self) {
        let mut g = self.lock();
        let pending = std::mem::take(&mut g.pending);
        g.free.extend(pending);
    }

    /// Release unused blocks until at most `keep` bytes stay reserved.
    pub fn trim(&self, keep: u64) {
        let node = rt_unchecked().node;
        let mut g = self.lock();
        g.free.sort_by_key(|b| b.1);
        while g.reserved > keep {
            let Some((p, size, map_len)) = g.free.pop() else {
                break;
            };
            g.reserved -= size;
            node.unreserve(self.phys, size);
            unmap(p, map_len);
        }
    }

    /// `cuMemPoolGetAttribute` for the u64 attributes.
    pub fn get(&self, attr: CUmemPool_attribute) -> CuResult<u64> {
        let g = self.lock();
        Ok(match attr {
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => g.threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => g.reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => g.reserved_high,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => g.used,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => g.used_high,
            1..=3 => 1,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemPoolSetAttribute`.
    pub fn set(&self, attr: CUmemPool_attribute, v: u64) -> CuResult<()> {
        let mut g = self.lock();
        match attr {
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => g.threshold = v,
            // Only zero may be written to the high-water marks: it resets them.
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if v == 0 => g.reserved_high = g.reserved,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH if v == 0 => g.used_high = g.used,
            1..=3 => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// `cuMemPoolDestroy`.
    pub fn destroy(&self) -> CuResult<()> {
        if !self.created {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.trim(0);
        self.lock().destroyed = true;
        Ok(())
    }

    fn after_sync(&self) {
        let t = self.lock().threshold;
        self.trim(t);
    }
}

/// At a synchronize, pools give memory above their release threshold back to the device.
pub fn after_sync(dev: usize) {
    for p in pools().iter().filter(|p| p.dev == dev) {
        p.after_sync();
    }
}

/// As [`after_sync`], for the pools of physical device `phys` (an event knows its executor's).
pub fn after_sync_phys(phys: usize) {
    for p in pools().iter().filter(|p| p.phys == phys) {
        p.after_sync();
    }
}

/// `cuMemFreeAsync` of pool memory, at the call: the pointer is gone for the program and the
/// pool no longer counts it as used; the block stays reserved, pending until the stream
/// reaches the free ([`super::free_now`] then makes it free). Other memory: nothing changes yet.
pub fn free_async_called(ptr: u64) {
    let mut g = ranges();
    let Some(&r) = g.get(&ptr) else {
        return;
    };
    if let Kind::Pool(pool) = r.kind {
        g.remove(&ptr);
        drop(g);
        pool_of(pool).free_pending(ptr, r.size, r.map_len);
    }
}
