//! Stream-ordered pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`):
//! memory a program frees back to a pool stays reserved by the driver until the pool trims
//! (release threshold, sync points, `cuMemPoolTrimTo`), so it keeps counting: a pool free moves
//! the bytes to the pool's *retained* credit instead of returning them, and the next allocation
//! from that pool spends the credit first. When a charge would fail, and after
//! `cuMemPoolTrimTo`, we ask the driver what the pool really still reserves
//! (`RESERVED_MEM_CURRENT - USED_MEM_CURRENT`) and return whatever credit exceeds it: so the
//! quota covers what the pool holds, without polling the driver on the fast path.
//!
//! State: one preallocated table of pool slots (handle, retained credit, device). Each pool's
//! memory is charged to and credited on the pool's own device, whatever the calling thread's
//! current device is: a device's pools are reconciled only against that device.

use super::{charge_and_alloc, free_and_uncharge, graph, written};
use crate::hooks::{pfn, real};
use crate::init::{DevState, State};
use crate::pointers::Kind;
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use gpuslice_abi::*;

/// Pool bookkeeping slots: 0 = not pool memory, 1..=16 = the device's current (default) pool
/// by ordinal, 17.. = explicit pools by handle.
pub(super) const POOL_SLOTS: usize = 64;
const DEFAULT_POOLS: usize = 16;

struct PoolSlot {
    /// Explicit pool handle (0: free slot). Unused for default-pool slots.
    handle: AtomicUsize,
    /// Bytes freed into the pool that are still charged (to the pool's device).
    retained: AtomicU64,
    /// The CUDA ordinal of the pool's device (explicit pools; -1 until known). Allocations
    /// from the pool are charged there and its credit is returned there, whatever the
    /// calling thread's current device.
    ordinal: AtomicI32,
}

static POOLS: [PoolSlot; POOL_SLOTS] = [const {
    PoolSlot {
        handle: AtomicUsize::new(0),
        retained: AtomicU64::new(0),
        ordinal: AtomicI32::new(-1),
    }
}; POOL_SLOTS];

/// The device pool slot `slot` charges: a default pool's own device, an explicit pool's
/// recorded device, or (a pool made before we could see it) `fallback`, which is then recorded
/// so that the pool's charges and credits always meet on one device.
fn pool_device<'s>(st: &'s State, slot: usize, fallback: &'s DevState) -> &'s DevState {
    if slot == 0 {
        return fallback;
    }
    if slot <= DEFAULT_POOLS {
        return st.device(slot as CUdevice - 1).unwrap_or(fallback);
    }
    let ord = match POOLS[slot]
        .ordinal
        .compare_exchange(-1, fallback.ordinal, AcqRel, Acquire)
    {
        Ok(_) => fallback.ordinal,
        Err(known) => known,
    };
    st.device(ord).unwrap_or(fallback)
}

/// Spend up to `bytes` of a pool's retained credit.
#[inline]
pub(super) fn take_credit(pool: usize, bytes: u64) -> u64 {
    if pool == 0 {
        return 0;
    }
    let mut taken = 0;
    let _ = POOLS[pool].retained.fetch_update(SeqCst, SeqCst, |r| {
        taken = r.min(bytes);
        Some(r - taken)
    });
    taken
}

#[inline]
pub(super) fn give_credit(pool: usize, bytes: u64) {
    if pool != 0 && bytes != 0 {
        POOLS[pool].retained.fetch_add(bytes, SeqCst);
    }
}

/// The pool slot of an explicit pool handle, claiming one on first use (0 if none is free:
/// that pool's memory is then returned at free, like plain memory).
fn explicit_slot(pool: CUmemoryPool) -> usize {
    let h = pool as usize;
    if h == 0 {
        return 0;
    }
    if let Some((i, _)) = explicit_pools().find(|(_, p)| p.handle.load(Acquire) == h) {
        return i;
    }
    explicit_pools()
        .find(|(_, p)| p.handle.compare_exchange(0, h, AcqRel, Acquire).is_ok())
        .map_or(0, |(i, _)| i)
}

/// The slots of explicit pools, with their indices.
fn explicit_pools() -> impl Iterator<Item = (usize, &'static PoolSlot)> {
    POOLS.iter().enumerate().skip(DEFAULT_POOLS + 1)
}

pub(super) fn default_slot(dev: &DevState) -> usize {
    if (dev.ordinal as usize) < DEFAULT_POOLS {
        1 + dev.ordinal as usize
    } else {
        0
    }
}

/// What the driver says pool `p` holds beyond live allocations; `None` if it cannot say.
///
/// # Safety
/// `p` is a pool handle the driver gave (a program's, or a device's default pool).
unsafe fn pool_slack(p: CUmemoryPool) -> Option<u64> {
    let get = real::cuMemPoolGetAttribute()?;
    let (mut reserved, mut used) = (0u64, 0u64);
    // SAFETY: the real cuMemPoolGetAttribute on a driver's pool handle; both attributes are
    // `cuuint64_t`, written to our own u64s.
    let ok = unsafe {
        get(
            p,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut reserved as *mut u64).cast(),
        ) == CUDA_SUCCESS
            && get(
                p,
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                (&mut used as *mut u64).cast(),
            ) == CUDA_SUCCESS
    };
    if !ok {
        return None;
    }
    Some(reserved.saturating_sub(used))
}

/// Return retained credit of `slot` beyond what pool `p` still reserves. A driver that cannot
/// tell is taken to have released it (never a permanent loss of quota).
///
/// # Safety
/// `p` is null or a pool handle the driver gave.
unsafe fn reconcile(dev: &DevState, slot: usize, p: CUmemoryPool) -> bool {
    let slack = if p.is_null() {
        Some(0)
    } else {
        // SAFETY: a driver's pool handle (this function's contract).
        unsafe { pool_slack(p) }
    }
    .unwrap_or(0);
    let mut excess = 0;
    let _ = POOLS[slot].retained.fetch_update(SeqCst, SeqCst, |r| {
        excess = r.saturating_sub(slack);
        Some(r - excess)
    });
    if excess > 0 {
        dev.account.uncharge(excess);
    }
    excess > 0
}

/// Before refusing an allocation: reconcile every pool of the device. True if anything came
/// back.
///
/// # Safety
/// Calls the real driver; `dev` must be a device of the started state.
#[cold]
pub unsafe fn reclaim_pools(dev: &DevState) -> bool {
    let mut any = false;
    let d = default_slot(dev);
    if d != 0 && POOLS[d].retained.load(SeqCst) > 0 {
        // SAFETY: dev is the started state's; the pool (or null) is the driver's answer.
        unsafe {
            let p = default_pool_of(dev).unwrap_or(core::ptr::null_mut());
            any |= reconcile(dev, d, p);
        }
    }
    // The explicit pools of this device whose credit is positive (another device's credit
    // would never make room here).
    for (i, p) in explicit_pools() {
        let h = p.handle.load(Acquire);
        if h != 0 && p.ordinal.load(Acquire) == dev.ordinal && p.retained.load(SeqCst) > 0 {
            // SAFETY: h is a handle the driver returned to the program's cuMemPoolCreate or
            // took in an allocation from it; the slot is cleared when the pool is destroyed.
            any |= unsafe { reconcile(dev, i, h as CUmemoryPool) };
        }
    }
    any
}

/// `cuMemAllocAsync(_ptsz)`: from the device's current pool.
pub unsafe fn mem_alloc_async(
    real: pfn::cuMemAllocAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dptr, bytes, stream) };
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return pass();
    }
    let dev = current!(st, pass());
    // SAFETY: the program's stream; dev is the started state's.
    if let Some(g) = unsafe { graph::capture_graph(stream) } {
        // SAFETY: dev is the started state's.
        return unsafe { graph::graph_alloc(dev, g, bytes as u64, pass) };
    }
    // SAFETY: dev is the started state's; dptr is non-null (checked above), the program's
    // out-pointer.
    unsafe {
        charge_and_alloc(dev, Kind::Ptr, bytes as u64, default_slot(dev), || {
            let r = pass();
            (r, written(r, dptr).unwrap_or(0))
        })
    }
}

/// `cuMemAllocFromPoolAsync(_ptsz)`.
pub unsafe fn mem_alloc_from_pool(
    real: pfn::cuMemAllocFromPoolAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dptr, bytes, pool, stream) };
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return pass();
    }
    let current = current!(st, pass());
    let slot = explicit_slot(pool);
    // The pool's device, not the calling thread's: that is where the driver takes the memory.
    let dev = pool_device(st, slot, current);
    // SAFETY: the program's stream.
    if let Some(g) = unsafe { graph::capture_graph(stream) } {
        // SAFETY: dev is the started state's.
        return unsafe { graph::graph_alloc(dev, g, bytes as u64, pass) };
    }
    // SAFETY: dev is the started state's; dptr is non-null (checked above), the program's
    // out-pointer.
    unsafe {
        charge_and_alloc(dev, Kind::Ptr, bytes as u64, slot, || {
            let r = pass();
            (r, written(r, dptr).unwrap_or(0))
        })
    }
}

/// `cuMemFreeAsync(_ptsz)`.
pub unsafe fn mem_free_async(
    real: pfn::cuMemFreeAsync,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dptr, stream) };
    let st = ready!();
    if dptr == 0 {
        return pass();
    }
    free_and_uncharge(st, Kind::Ptr, dptr, pass)
}

/// `cuMemPoolTrimTo`: after the trim, return the credit the pool no longer holds.
pub unsafe fn pool_trim_to(
    real: pfn::cuMemPoolTrimTo,
    pool: CUmemoryPool,
    keep: usize,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(pool, keep) };
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(st) = crate::init::state_if_ready() else {
        return r;
    };
    if let Some((i, p)) = explicit_pools().find(|(_, p)| p.handle.load(Acquire) == pool as usize) {
        if let Some(dev) = st.device(p.ordinal.load(Acquire)) {
            // SAFETY: the driver has just trimmed this pool: a live handle.
            unsafe { reconcile(dev, i, pool) };
        }
        return r;
    }
    // Not an explicit pool we know: the default pool of whichever device it is.
    for dev in &st.devices {
        // SAFETY: dev is the started state's.
        if unsafe { default_pool_of(dev) } == Some(pool) {
            let slot = default_slot(dev);
            if slot != 0 {
                // SAFETY: the driver has just trimmed this pool: a live handle.
                unsafe { reconcile(dev, slot, pool) };
            }
        }
    }
    r
}

/// The device's current default pool, as the driver says.
///
/// # Safety
/// Calls the real driver; `dev` is a device of the started state.
unsafe fn default_pool_of(dev: &DevState) -> Option<CUmemoryPool> {
    let mut p: CUmemoryPool = core::ptr::null_mut();
    let f = real::cuDeviceGetMemPool()?;
    // SAFETY: the real cuDeviceGetMemPool, writing to our local, for a device ordinal the
    // driver reported.
    (unsafe { f(&mut p, dev.ordinal) } == CUDA_SUCCESS).then_some(p)
}

/// `cuMemPoolCreate`: remember the pool's device (its location), where allocations from it
/// are charged whatever the calling thread's current device.
pub unsafe fn pool_create(
    real: pfn::cuMemPoolCreate,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(pool, props) };
    if r != CUDA_SUCCESS || pool.is_null() || props.is_null() {
        return r;
    }
    // SAFETY: both non-null (checked above): the program's properties (readable) and its
    // out-pointer, written by the driver's successful call.
    let (location, pool) = unsafe { ((*props).location, *pool) };
    if location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        let slot = explicit_slot(pool);
        if slot != 0 {
            POOLS[slot].ordinal.store(location.id, Release);
        }
    }
    r
}

/// `cuMemPoolDestroy`: everything the pool retained goes back.
pub unsafe fn pool_destroy(real: pfn::cuMemPoolDestroy, pool: CUmemoryPool) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(pool) };
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(st) = crate::init::state_if_ready() else {
        return r;
    };
    for (_, p) in explicit_pools() {
        if p.handle.load(Acquire) == pool as usize {
            // Credited to the pool's device, where it was charged.
            let n = p.retained.swap(0, SeqCst);
            if let Some(dev) = st.device(p.ordinal.swap(-1, AcqRel)) {
                dev.account.uncharge(n);
            }
            p.handle.store(0, Release);
        }
    }
    r
}

/// A pool free: `bytes` freed into pool `slot` stay charged as the pool's retained credit.
#[inline]
pub(super) fn retain(slot: usize, bytes: u64) {
    POOLS[slot].retained.fetch_add(bytes, SeqCst);
}
