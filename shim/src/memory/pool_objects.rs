//! The hooks on pool objects: `cuMemPoolCreate` (where a pool's memory is charged),
//! `cuMemPoolTrimTo` (its credit reconciled after the trim) and `cuMemPoolDestroy` (its credit
//! returned). The pool table and the accounting are `pools.rs`'s.

use super::pools::{
    default_pool_of, default_slot, explicit_pools, explicit_slot, reconcile, POOLS,
};
use core::sync::atomic::Ordering::*;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

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
