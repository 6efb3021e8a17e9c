//! Stream-ordered pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`):
//! memory a program frees back to a pool stays reserved by the driver, mapped to the process,
//! until the pool releases it: at a synchronize (stream, event, context) when the pool holds
//! more than its release threshold (default 0), at `cuMemPoolTrimTo`, and at the pool's
//! destruction. So it keeps counting: a pool free moves the bytes to the pool's *retained*
//! credit instead of returning them, and the next allocation from that pool spends the credit
//! first.
//!
//! What each pool is charged (`live + retained`: its live allocations as charged, plus the
//! credit) must cover what the driver says it reserves (`RESERVED_MEM_CURRENT`), so that the
//! processes of a slice together never hold more device memory than the quota:
//! - credit is returned only down to `reserved - live` ([`kept`]), at a synchronize, after
//!   `cuMemPoolTrimTo`, in `cuMemGetInfo`, and when a charge would fail. The driver's
//!   `USED_MEM_CURRENT` is never the measure: a block freed with `cuMemFreeAsync` leaves it
//!   at once while the pool still holds the block (until the stream reaches the free, and
//!   after it until the pool is trimmed);
//! - an allocation from a pool that holds credit may be served from a freed block or make the
//!   pool grow (no freed block fits: pools grow lazily). While the slice has room for the
//!   whole request it is charged in full and the pool reconciled right after (one question
//!   to the driver). At the quota's edge it spends the credit instead, asks the driver what
//!   the pool reserves before and after, and charges the growth the credit did not cover
//!   ([`shortfall`]). When that does not fit, the pool's unused blocks are released
//!   (`cuMemPoolTrimTo`, what the driver itself does when the device runs short) and, if the
//!   pool still holds too much (frees its stream has not reached), the new block is freed
//!   (waiting for its stream) and the allocation tried once more as new memory. Only in that
//!   edge case does the device hold more than the quota, for the microseconds between the
//!   driver's growth and the shim's trim or free.
//!
//! Allocations from a pool without credit ask the driver nothing (the fast path).
//!
//! State: one preallocated table of pool slots (handle, retained credit, live bytes, device).
//! Each pool's memory is charged to and credited on the pool's own device, whatever the
//! calling thread's current device is: a device's pools are reconciled only against that
//! device.

use super::{allocated, charge, free_and_uncharge, graph, oom, record, written};
use crate::admit::DevState;
use crate::init::State;
use crate::pointers::{Charge, Handle};
use crate::real;
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// Pool bookkeeping slots: 0 = not pool memory, 1..=16 = the device's current (default) pool
/// by ordinal, 17.. = explicit pools by handle.
pub(super) const POOL_SLOTS: usize = 64;
const DEFAULT_POOLS: usize = 16;

pub(super) struct PoolSlot {
    /// Explicit pool handle (0: free slot). Unused for default-pool slots.
    pub(super) handle: AtomicUsize,
    /// Bytes freed into the pool that are still charged (to the pool's device).
    pub(super) retained: AtomicU64,
    /// Bytes of the pool's live allocations, as their pointers were charged.
    live: AtomicU64,
    /// The CUDA ordinal of the pool's device (explicit pools; -1 until known). Allocations
    /// from the pool are charged there and its credit is returned there, whatever the
    /// calling thread's current device.
    pub(super) ordinal: AtomicI32,
}

pub(super) static POOLS: [PoolSlot; POOL_SLOTS] = [const {
    PoolSlot {
        handle: AtomicUsize::new(0),
        retained: AtomicU64::new(0),
        live: AtomicU64::new(0),
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
fn take_credit(pool: usize, bytes: u64) -> u64 {
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
fn give_credit(pool: usize, bytes: u64) {
    if pool != 0 && bytes != 0 {
        POOLS[pool].retained.fetch_add(bytes, SeqCst);
    }
}

/// The pool slot of an explicit pool handle, claiming one on first use (0 if none is free:
/// that pool's memory is then returned at free, like plain memory).
pub(super) fn explicit_slot(pool: CUmemoryPool) -> usize {
    let h = pool as usize;
    if h == 0 {
        return 0;
    }
    if let Some((i, _)) = explicit_pools().find(|(_, p)| p.handle.load(Acquire) == h) {
        return i;
    }
    // A destroyed pool's slot is claimed again only once its last allocation is freed.
    explicit_pools()
        .find(|(_, p)| {
            p.live.load(SeqCst) == 0 && p.handle.compare_exchange(0, h, AcqRel, Acquire).is_ok()
        })
        .map_or(0, |(i, _)| i)
}

/// The slots of explicit pools, with their indices.
pub(super) fn explicit_pools() -> impl Iterator<Item = (usize, &'static PoolSlot)> {
    POOLS.iter().enumerate().skip(DEFAULT_POOLS + 1)
}

pub(super) fn default_slot(dev: &DevState) -> usize {
    if (dev.ordinal as usize) < DEFAULT_POOLS {
        1 + dev.ordinal as usize
    } else {
        0
    }
}

/// What the driver says pool `p` reserves (`RESERVED_MEM_CURRENT`); `None` if it cannot say.
///
/// # Safety
/// `p` is a pool handle the driver gave (a program's, or a device's default pool).
unsafe fn pool_reserved(p: CUmemoryPool) -> Option<u64> {
    let get = real::cuMemPoolGetAttribute()?;
    let mut reserved = 0u64;
    // SAFETY: the real cuMemPoolGetAttribute on a driver's pool handle; the attribute is a
    // `cuuint64_t`, written to our own u64.
    let ok = unsafe {
        get(
            p,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut reserved as *mut u64).cast(),
        )
    } == CUDA_SUCCESS;
    ok.then_some(reserved)
}

/// The credit a pool keeps when it reserves `reserved` bytes and its live allocations were
/// charged `live`: what covers the rest of the reservation, never more than it had.
#[inline]
fn kept(retained: u64, reserved: u64, live: u64) -> u64 {
    retained.min(reserved.saturating_sub(live))
}

/// What an allocation that spent `credit` and charged `need` left uncharged, when its pool
/// reserved `before` bytes before it and `after` after: the growth beyond `need`, up to the
/// credit (growth beyond the request itself is the driver's rounding, which no allocation is
/// charged).
#[inline]
fn shortfall(before: u64, after: u64, need: u64, credit: u64) -> u64 {
    after
        .saturating_sub(before)
        .saturating_sub(need)
        .min(credit)
}

/// Return retained credit of `slot` beyond what pool `p` still reserves for it. A driver that
/// cannot tell is taken to have released it (never a permanent loss of quota).
///
/// # Safety
/// `p` is null or a pool handle the driver gave.
pub(super) unsafe fn reconcile(dev: &DevState, slot: usize, p: CUmemoryPool) -> bool {
    let reserved = if p.is_null() {
        Some(0)
    } else {
        // SAFETY: a driver's pool handle (this function's contract).
        unsafe { pool_reserved(p) }
    }
    .unwrap_or(0);
    // `live` is read after the driver's answer: an allocation under way has taken its credit
    // before it counts as live, a free counts as credit only after it stopped being live, so
    // a race leaves more credit, never less than the pool holds.
    let live = POOLS[slot].live.load(SeqCst);
    let mut excess = 0;
    let _ = POOLS[slot].retained.fetch_update(SeqCst, SeqCst, |r| {
        excess = r - kept(r, reserved, live);
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

/// Charge, allocate from pool `slot` (driver handle from `pool`), record: the pool form of
/// `charge_and_alloc` (module comment). Slot 0 (no slot free): charged like plain memory.
///
/// # Safety
/// `dev` is a device of the started state, the one whose memory the pool holds; `pool`
/// answers a driver's pool handle (or `None`); `alloc` is the program's allocation on
/// `stream`.
unsafe fn alloc_from(
    dev: &DevState,
    slot: usize,
    pool: impl FnOnce() -> Option<CUmemoryPool>,
    bytes: u64,
    stream: CUstream,
    mut alloc: impl FnMut() -> (CUresult, u64),
) -> CUresult {
    if slot == 0 || POOLS[slot].retained.load(SeqCst) == 0 {
        // No credit, the fast path: new memory, and the driver is asked nothing.
        // SAFETY: this function's contract.
        return unsafe { in_full(dev, slot, bytes, false, None, alloc) };
    }
    // The pool holds freed memory it may reuse, or grow beside. While the slice has room for
    // the whole request, charge it in full (growth of any kind is covered), then return what
    // the pool did not need.
    if dev.account.try_charge(bytes) {
        // SAFETY: this function's contract.
        return unsafe { in_full(dev, slot, bytes, true, pool(), alloc) };
    }
    // The quota's edge: spend the credit, and measure whether the pool grew anyway.
    let credit = take_credit(slot, bytes);
    let need = bytes - credit;
    // SAFETY: dev is the started state's (this function's contract).
    if need > 0 && !unsafe { charge(dev, need) } {
        give_credit(slot, credit);
        return oom(dev, bytes);
    }
    // SAFETY: `pool` answers a driver's handle (this function's contract).
    let measured = (credit > 0)
        .then(pool)
        .flatten()
        .and_then(|p| unsafe { pool_reserved(p) }.map(|before| (p, before)));
    let h = match allocated(dev, bytes, need, &mut alloc) {
        Ok(h) => h,
        Err(r) => {
            give_credit(slot, credit);
            return r;
        }
    };
    POOLS[slot].live.fetch_add(bytes, SeqCst);
    if let Some((p, before)) = measured {
        // SAFETY: a driver's pool handle, live: an allocation was just made from it.
        let after = unsafe { pool_reserved(p) }.unwrap_or(before);
        let short = shortfall(before, after, need, credit);
        // SAFETY: as above; dev is the started state's.
        if short > 0 && !unsafe { cover(dev, slot, p, short) } {
            // The pool grew past the quota: the block goes back, and the allocation is tried
            // once more as new memory (charged in full, so no growth is left uncovered).
            // SAFETY: h is the block just allocated on `stream`; p its pool; then this
            // function's contract.
            unsafe {
                give_back(dev, slot, p, h, bytes, stream);
                return in_full(dev, slot, bytes, false, None, alloc);
            }
        }
    }
    record(Handle::Ptr, h, Charge::new(bytes, dev, slot));
    CUDA_SUCCESS
}

/// Allocate `bytes` from pool `slot` charged in full (`charged`: already; else charge them
/// now), record them, and reconcile the pool with `then` (its driver handle) when given.
///
/// # Safety
/// As [`alloc_from`].
#[inline]
unsafe fn in_full(
    dev: &DevState,
    slot: usize,
    bytes: u64,
    charged: bool,
    then: Option<CUmemoryPool>,
    alloc: impl FnMut() -> (CUresult, u64),
) -> CUresult {
    // SAFETY: dev is the started state's (this function's contract).
    if !charged && !unsafe { charge(dev, bytes) } {
        return oom(dev, bytes);
    }
    let h = match allocated(dev, bytes, bytes, alloc) {
        Ok(h) => h,
        Err(r) => return r,
    };
    if slot != 0 {
        POOLS[slot].live.fetch_add(bytes, SeqCst);
    }
    if let Some(p) = then {
        // SAFETY: a driver's pool handle, live: an allocation was just made from it.
        unsafe { reconcile(dev, slot, p) };
    }
    record(Handle::Ptr, h, Charge::new(bytes, dev, slot));
    CUDA_SUCCESS
}

/// Charge `short` bytes more for pool `slot` (as credit: memory the pool holds). When they do
/// not fit, release the pool's unused blocks first and charge what it then still holds beyond
/// its charge. False if even that does not fit.
///
/// # Safety
/// `p` is the live driver pool of `slot`; `dev` is the started state's.
#[cold]
unsafe fn cover(dev: &DevState, slot: usize, p: CUmemoryPool, short: u64) -> bool {
    if dev.account.try_charge(short) {
        give_credit(slot, short);
        return true;
    }
    if let Some(trim) = real::cuMemPoolTrimTo() {
        // SAFETY: the real cuMemPoolTrimTo on a live pool: releases only what no allocation
        // (and no free not yet reached) still uses.
        unsafe { trim(p, 0) };
    }
    // SAFETY: as above.
    unsafe { reconcile(dev, slot, p) };
    // SAFETY: as above.
    let Some(reserved) = (unsafe { pool_reserved(p) }) else {
        // It answered before the allocation (the growth was measured) and cannot now: nothing
        // to go by but the charge already there.
        return true;
    };
    let charged = POOLS[slot].live.load(SeqCst) + POOLS[slot].retained.load(SeqCst);
    let short = reserved.saturating_sub(charged).min(short);
    if short == 0 {
        return true;
    }
    let ok = dev.account.try_charge(short);
    if ok {
        give_credit(slot, short);
    }
    ok
}

/// Free block `h` (`bytes` from pool `slot`, allocated on `stream`) back into its pool, wait
/// for the free on that stream (not capturing: captured allocations never come here), release
/// the pool's unused blocks and return their credit.
///
/// # Safety
/// `h` is a live allocation of pool `p` made on `stream`, not yet recorded; `dev` is the
/// started state's.
#[cold]
unsafe fn give_back(
    dev: &DevState,
    slot: usize,
    p: CUmemoryPool,
    h: u64,
    bytes: u64,
    stream: CUstream,
) {
    // The block becomes pool memory, still charged (its credit and its new charge): the same
    // order as a free, so its charge always covers what the pool holds.
    retain(slot, bytes);
    // SAFETY: the real driver functions, on the block just allocated on `stream`, that
    // stream, and the block's pool.
    unsafe {
        if let Some(free) = real::cuMemFreeAsync() {
            free(h, stream);
        }
        if let Some(sync) = real::cuStreamSynchronize() {
            sync(stream);
        }
        if let Some(trim) = real::cuMemPoolTrimTo() {
            trim(p, 0);
        }
        reconcile(dev, slot, p);
    }
}

/// After a successful synchronize: pools may have released what they held above their
/// release threshold; return the credit they no longer hold. Nothing to do (one load per
/// pool slot) while no pool has credit.
pub(crate) fn synchronized() {
    if POOLS.iter().all(|p| p.retained.load(Relaxed) == 0) {
        return;
    }
    let Some(st) = crate::init::state_if_ready() else {
        return;
    };
    for dev in &st.devices {
        // SAFETY: dev is the started state's.
        unsafe { reclaim_pools(dev) };
    }
}

/// A stream-ordered allocation of `bytes` into `*dptr` from pool `slot` of `dev` (driver
/// handle from `pool`): graph memory while `stream` is capturing (`graph::graph_alloc`), pool
/// memory otherwise ([`alloc_from`]).
///
/// # Safety
/// As [`alloc_from`]; `dptr` is the program's non-null out-pointer, which `alloc`, the
/// program's allocation on `stream`, writes when it succeeds.
#[inline]
unsafe fn stream_alloc(
    dev: &DevState,
    slot: usize,
    pool: impl FnOnce() -> Option<CUmemoryPool>,
    bytes: usize,
    dptr: *mut CUdeviceptr,
    stream: CUstream,
    alloc: impl Fn() -> CUresult,
) -> CUresult {
    // SAFETY: the program's stream (this function's contract).
    if let Some(g) = unsafe { crate::capturing::capture_graph(stream) } {
        // SAFETY: dev is the started state's (this function's contract).
        return unsafe { graph::graph_alloc(dev, g, bytes as u64, alloc) };
    }
    // SAFETY: this function's contract; `written` reads `dptr` only after the driver succeeded.
    unsafe {
        alloc_from(dev, slot, pool, bytes as u64, stream, || {
            let r = alloc();
            (r, written(r, dptr).unwrap_or(0))
        })
    }
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
    // SAFETY: dev is the started state's; dptr is non-null (checked above), the program's
    // out-pointer; `pass` is the program's allocation on `stream`.
    unsafe {
        stream_alloc(
            dev,
            default_slot(dev),
            || default_pool_of(dev),
            bytes,
            dptr,
            stream,
            pass,
        )
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
    // SAFETY: dev is the started state's; dptr is non-null (checked above), the program's
    // out-pointer; `pass` is the program's allocation on `stream`.
    unsafe { stream_alloc(dev, slot, || Some(pool), bytes, dptr, stream, pass) }
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
    free_and_uncharge(st, Handle::Ptr, dptr, pass)
}

/// The device's current default pool, as the driver says.
///
/// # Safety
/// Calls the real driver; `dev` is a device of the started state.
pub(super) unsafe fn default_pool_of(dev: &DevState) -> Option<CUmemoryPool> {
    let mut p: CUmemoryPool = core::ptr::null_mut();
    let f = real::cuDeviceGetMemPool()?;
    // SAFETY: the real cuDeviceGetMemPool, writing to our local, for a device ordinal the
    // driver reported.
    (unsafe { f(&mut p, dev.ordinal) } == CUDA_SUCCESS).then_some(p)
}

/// A pool free: `bytes` freed into pool `slot` stay charged as the pool's retained credit.
/// False (nothing moved) if the slot's pool was destroyed: the caller returns the bytes.
#[inline]
pub(super) fn retain(slot: usize, bytes: u64) -> bool {
    let p = &POOLS[slot];
    // No longer live first, credit second: the pool's charge never dips below what it holds.
    p.live.fetch_sub(bytes, SeqCst);
    if slot > DEFAULT_POOLS && p.handle.load(Acquire) == 0 {
        return false;
    }
    p.retained.fetch_add(bytes, SeqCst);
    true
}

#[cfg(test)]
mod tests {
    use super::{kept, shortfall};

    const MI: u64 = 1 << 20;

    #[test]
    fn credit_is_kept_while_the_pool_still_reserves_it() {
        // 768 MiB freed into a pool that still reserves them: all kept, whatever the driver's
        // USED says (a free its stream has not reached still counts there on some drivers).
        assert_eq!(kept(768 * MI, 768 * MI, 0), 768 * MI);
        // Trimmed: nothing left to cover.
        assert_eq!(kept(768 * MI, 0, 0), 0);
        // Partly released, with 100 MiB live: the credit covers the rest of the reservation.
        assert_eq!(kept(500 * MI, 300 * MI, 100 * MI), 200 * MI);
        // Credit is never created: a pool reserving more than its charge keeps what it had.
        assert_eq!(kept(10 * MI, 900 * MI, 100 * MI), 10 * MI);
        // Live beyond the reservation (the driver's answer raced a new allocation): none kept.
        assert_eq!(kept(10 * MI, 100 * MI, 200 * MI), 0);
    }

    #[test]
    fn growth_the_credit_paid_for_is_charged_again() {
        // 100 MiB paid from credit, the pool reused a freed block: nothing short.
        assert_eq!(shortfall(600 * MI, 600 * MI, 0, 100 * MI), 0);
        // ... it grew by the request instead: the whole credit is short.
        assert_eq!(shortfall(600 * MI, 700 * MI, 0, 100 * MI), 100 * MI);
        // 60 paid from credit, 40 charged, the pool grew by 100: 60 short.
        assert_eq!(shortfall(0, 100 * MI, 40 * MI, 60 * MI), 60 * MI);
        // Growth beyond the request is rounding, never charged; a shrinking pool (a trim in
        // another thread) leaves nothing short.
        assert_eq!(shortfall(0, 102 * MI, 0, 100 * MI), 100 * MI);
        assert_eq!(shortfall(700 * MI, 100 * MI, 0, 100 * MI), 0);
    }
}
