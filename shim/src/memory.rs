//! Quota enforcement on every path that takes device memory.
//!
//! Every allocation: charge the slice first (one CAS against the quota, `Account::try_charge`),
//! then call the driver, then record the handle's size for its free; undo the charge when the
//! driver fails. Over quota: `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver, nothing
//! changed. Frees forget the handle *before* the real free (re-recording it if that fails), and
//! return the charge after it succeeds.
//!
//! Stream-ordered pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`): memory a program frees
//! back to a pool stays reserved by the driver until the pool trims (release threshold, sync
//! points, `cuMemPoolTrimTo`), so it keeps counting: a pool free moves the bytes to the pool's
//! *retained* credit instead of returning them, and the next allocation from that pool spends
//! the credit first. When a charge would fail, and after `cuMemPoolTrimTo`, we ask the driver
//! what the pool really still reserves (`RESERVED_MEM_CURRENT - USED_MEM_CURRENT`) and return
//! whatever credit exceeds it: so the quota covers what the pool holds, without polling the
//! driver on the fast path.
//!
//! Arrays are charged what their descriptor implies (width × height × depth × channels ×
//! element size, summed over mip levels). Graph memory (memory nodes, and stream-ordered
//! allocations captured into a graph) is charged when the node is made and held by the graph
//! and every executable instantiated from it: it comes back when the last of them is destroyed.

use crate::hooks::{pfn, real};
use crate::init::{state, DevState, State};
use crate::log::log;
use crate::pointers::{self, Kind};
use core::ffi::c_uint;
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use gpuslice_abi::*;
use std::sync::Mutex;

/// Pool bookkeeping slots: 0 = not pool memory, 1..=16 = the device's current (default) pool
/// by ordinal, 17.. = explicit pools by handle.
const POOL_SLOTS: usize = 64;
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

/// Pack (bytes, pool slot, device) into a pointer-table value: bytes < 2^48.
#[inline]
fn pack(bytes: u64, pool: usize, dev: u8) -> (u64, u8) {
    (bytes << 8 | pool as u64, dev)
}

#[inline]
fn unpack(v: u64) -> (u64, usize) {
    (v >> 8, (v & 0xff) as usize)
}

#[inline]
fn oom(dev: &DevState, bytes: u64) -> CUresult {
    if crate::log::enabled(crate::log::Level::Debug) {
        log!(
            Debug,
            "allocation of {bytes} bytes on device {} refused: {} of {} used",
            dev.ordinal,
            dev.account.used(),
            dev.account.limit()
        );
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

/// Charge `n` bytes; when they do not fit, first take back pool credit the driver released.
#[inline]
unsafe fn charge(dev: &DevState, n: u64) -> bool {
    dev.account.try_charge(n) || (reclaim_pools(dev) && dev.account.try_charge(n))
}

/// Charge, allocate, record. `alloc` returns the driver's status and the new handle.
#[inline]
unsafe fn charge_and_alloc(
    dev: &DevState,
    kind: Kind,
    bytes: u64,
    pool: usize,
    alloc: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    let from_credit = take_credit(pool, bytes);
    let need = bytes - from_credit;
    if need > 0 && !charge(dev, need) {
        give_credit(pool, from_credit);
        return oom(dev, bytes);
    }
    let (r, h) = alloc();
    if r != CUDA_SUCCESS {
        dev.account.uncharge(need);
        give_credit(pool, from_credit);
        return r;
    }
    let (v, d) = pack(bytes, pool, dev.ordinal as u8);
    if !pointers::insert(kind, h, v, d) {
        // Cannot happen short of half a million live allocations; the charge stays (never an
        // undercount), returned when the process exits.
        log!(
            Error,
            "allocation table full: {bytes} bytes stay charged until the process exits"
        );
    }
    r
}

/// Forget `h`, call the real free, return the charge (or retain it in its pool).
#[inline]
unsafe fn free_and_uncharge(
    st: &State,
    kind: Kind,
    h: u64,
    free: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some((v, d)) = pointers::remove(kind, h) else {
        return free();
    };
    let r = free();
    if r != CUDA_SUCCESS {
        pointers::insert(kind, h, v, d);
        return r;
    }
    let (bytes, pool) = unpack(v);
    if pool != 0 {
        POOLS[pool].retained.fetch_add(bytes, SeqCst);
    } else if let Some(dev) = st.device(d as CUdevice) {
        dev.account.uncharge(bytes);
    }
    r
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

fn default_slot(dev: &DevState) -> usize {
    if (dev.ordinal as usize) < DEFAULT_POOLS {
        1 + dev.ordinal as usize
    } else {
        0
    }
}

/// What the driver says pool `p` holds beyond live allocations; `None` if it cannot say.
unsafe fn pool_slack(p: CUmemoryPool) -> Option<u64> {
    let get = real::cuMemPoolGetAttribute()?;
    let (mut reserved, mut used) = (0u64, 0u64);
    if get(
        p,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        (&mut reserved as *mut u64).cast(),
    ) != CUDA_SUCCESS
        || get(
            p,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            (&mut used as *mut u64).cast(),
        ) != CUDA_SUCCESS
    {
        return None;
    }
    Some(reserved.saturating_sub(used))
}

/// Return retained credit of `slot` beyond what pool `p` still reserves. A driver that cannot
/// tell is taken to have released it (never a permanent loss of quota).
unsafe fn reconcile(dev: &DevState, slot: usize, p: CUmemoryPool) -> bool {
    let slack = if p.is_null() { Some(0) } else { pool_slack(p) }.unwrap_or(0);
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
        let p = default_pool_of(dev).unwrap_or(core::ptr::null_mut());
        any |= reconcile(dev, d, p);
    }
    // The explicit pools of this device whose credit is positive (another device's credit
    // would never make room here).
    for (i, p) in explicit_pools() {
        let h = p.handle.load(Acquire);
        if h != 0 && p.ordinal.load(Acquire) == dev.ordinal && p.retained.load(SeqCst) > 0 {
            any |= reconcile(dev, i, h as CUmemoryPool);
        }
    }
    any
}

macro_rules! ready {
    () => {
        match state() {
            Ok(s) => s,
            Err(e) => return e,
        }
    };
}

macro_rules! current {
    ($st:expr, $fallback:expr) => {
        match $st.current() {
            Some(d) => d,
            // No context: let the driver report it.
            None => return $fallback,
        }
    };
}

/// `cuMemAlloc_v2`. Inlined into its wrapper: the hottest pair of calls.
#[inline]
pub unsafe fn mem_alloc(
    real: pfn::cuMemAlloc_v2,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return real(dptr, bytes);
    }
    let dev = current!(st, real(dptr, bytes));
    charge_and_alloc(dev, Kind::Ptr, bytes as u64, 0, || {
        (real(dptr, bytes), *dptr)
    })
}

/// `cuMemAllocPitch_v2`: charged an upper estimate first (rows padded to 512 bytes), then
/// corrected to `pitch × height` once the driver has chosen the pitch.
pub unsafe fn mem_alloc_pitch(
    real: pfn::cuMemAllocPitch_v2,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    w: usize,
    h: usize,
    elem: c_uint,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || pitch.is_null() || w == 0 || h == 0 {
        return real(dptr, pitch, w, h, elem);
    }
    let dev = current!(st, real(dptr, pitch, w, h, elem));
    let Some(est) = (w as u64)
        .checked_next_multiple_of(512)
        .and_then(|r| r.checked_mul(h as u64))
    else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if !charge(dev, est) {
        return oom(dev, est);
    }
    let r = real(dptr, pitch, w, h, elem);
    if r != CUDA_SUCCESS {
        dev.account.uncharge(est);
        return r;
    }
    let actual = (*pitch as u64).saturating_mul(h as u64);
    if actual > est && !dev.account.try_charge(actual - est) {
        if let Some(free) = real::cuMemFree_v2() {
            free(*dptr);
        }
        dev.account.uncharge(est);
        return oom(dev, actual);
    } else if actual < est {
        dev.account.uncharge(est - actual);
    }
    let (v, d) = pack(actual, 0, dev.ordinal as u8);
    pointers::insert(Kind::Ptr, *dptr, v, d);
    r
}

/// `cuMemAllocManaged`: counted against the current device.
pub unsafe fn mem_alloc_managed(
    real: pfn::cuMemAllocManaged,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return real(dptr, bytes, flags);
    }
    let dev = current!(st, real(dptr, bytes, flags));
    charge_and_alloc(dev, Kind::Ptr, bytes as u64, 0, || {
        (real(dptr, bytes, flags), *dptr)
    })
}

/// `cuMemAllocAsync(_ptsz)`: from the device's current pool.
pub unsafe fn mem_alloc_async(
    real: pfn::cuMemAllocAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return real(dptr, bytes, stream);
    }
    let dev = current!(st, real(dptr, bytes, stream));
    if let Some(g) = capture_graph(stream) {
        return graph_alloc(dev, g, bytes as u64, || real(dptr, bytes, stream));
    }
    charge_and_alloc(dev, Kind::Ptr, bytes as u64, default_slot(dev), || {
        (real(dptr, bytes, stream), *dptr)
    })
}

/// `cuMemAllocFromPoolAsync(_ptsz)`.
pub unsafe fn mem_alloc_from_pool(
    real: pfn::cuMemAllocFromPoolAsync,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let st = ready!();
    if dptr.is_null() || bytes == 0 {
        return real(dptr, bytes, pool, stream);
    }
    let current = current!(st, real(dptr, bytes, pool, stream));
    let slot = explicit_slot(pool);
    // The pool's device, not the calling thread's: that is where the driver takes the memory.
    let dev = pool_device(st, slot, current);
    if let Some(g) = capture_graph(stream) {
        return graph_alloc(dev, g, bytes as u64, || real(dptr, bytes, pool, stream));
    }
    charge_and_alloc(dev, Kind::Ptr, bytes as u64, slot, || {
        (real(dptr, bytes, pool, stream), *dptr)
    })
}

/// `cuMemFree_v2`. Inlined into its wrapper, as `mem_alloc`.
#[inline]
pub unsafe fn mem_free(real: pfn::cuMemFree_v2, dptr: CUdeviceptr) -> CUresult {
    let st = ready!();
    if dptr == 0 {
        return real(dptr);
    }
    free_and_uncharge(st, Kind::Ptr, dptr, || real(dptr))
}

/// `cuMemFreeAsync(_ptsz)`.
pub unsafe fn mem_free_async(
    real: pfn::cuMemFreeAsync,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    let st = ready!();
    if dptr == 0 {
        return real(dptr, stream);
    }
    free_and_uncharge(st, Kind::Ptr, dptr, || real(dptr, stream))
}

/// `cuMemPoolTrimTo`: after the trim, return the credit the pool no longer holds.
pub unsafe fn pool_trim_to(
    real: pfn::cuMemPoolTrimTo,
    pool: CUmemoryPool,
    keep: usize,
) -> CUresult {
    let r = real(pool, keep);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(st) = crate::init::state_if_ready() else {
        return r;
    };
    if let Some((i, p)) = explicit_pools().find(|(_, p)| p.handle.load(Acquire) == pool as usize) {
        if let Some(dev) = st.device(p.ordinal.load(Acquire)) {
            reconcile(dev, i, pool);
        }
        return r;
    }
    // Not an explicit pool we know: the default pool of whichever device it is.
    for dev in &st.devices {
        if default_pool_of(dev) == Some(pool) {
            let slot = default_slot(dev);
            if slot != 0 {
                reconcile(dev, slot, pool);
            }
        }
    }
    r
}

/// The device's current default pool, as the driver says.
unsafe fn default_pool_of(dev: &DevState) -> Option<CUmemoryPool> {
    let mut p: CUmemoryPool = core::ptr::null_mut();
    let f = real::cuDeviceGetMemPool()?;
    (f(&mut p, dev.ordinal) == CUDA_SUCCESS).then_some(p)
}

/// `cuMemPoolCreate`: remember the pool's device (its location), where allocations from it
/// are charged whatever the calling thread's current device.
pub unsafe fn pool_create(
    real: pfn::cuMemPoolCreate,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    let r = real(pool, props);
    if r != CUDA_SUCCESS || pool.is_null() || props.is_null() {
        return r;
    }
    if (*props).location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        let slot = explicit_slot(*pool);
        if slot != 0 {
            POOLS[slot].ordinal.store((*props).location.id, Release);
        }
    }
    r
}

/// `cuMemPoolDestroy`: everything the pool retained goes back.
pub unsafe fn pool_destroy(real: pfn::cuMemPoolDestroy, pool: CUmemoryPool) -> CUresult {
    let r = real(pool);
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

/// `cuMemCreate`: physical memory for the virtual memory API; charged when the location is a
/// device.
pub unsafe fn mem_create(
    real: pfn::cuMemCreate,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let st = ready!();
    if handle.is_null()
        || prop.is_null()
        || size == 0
        || (*prop).location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return real(handle, size, prop, flags);
    }
    let Some(dev) = st.device((*prop).location.id) else {
        return real(handle, size, prop, flags);
    };
    charge_and_alloc(dev, Kind::Vmm, size as u64, 0, || {
        (real(handle, size, prop, flags), *handle)
    })
}

/// `cuMemRelease`.
pub unsafe fn mem_release(
    real: pfn::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let st = ready!();
    free_and_uncharge(st, Kind::Vmm, handle, || real(handle))
}

/// Bytes per element of an array format (4 for formats we do not know: never an undercount
/// of the common ones).
fn format_bytes(f: CUarray_format) -> u64 {
    match f {
        CU_AD_FORMAT_UNSIGNED_INT8 | CU_AD_FORMAT_SIGNED_INT8 => 1,
        CU_AD_FORMAT_UNSIGNED_INT16 | CU_AD_FORMAT_SIGNED_INT16 | CU_AD_FORMAT_HALF => 2,
        _ => 4,
    }
}

/// Bytes of an array of these extents (0 height/depth means 1), `None` on overflow.
pub fn array_bytes(
    w: usize,
    h: usize,
    d: usize,
    format: CUarray_format,
    channels: c_uint,
) -> Option<u64> {
    (w as u64)
        .checked_mul(h.max(1) as u64)?
        .checked_mul(d.max(1) as u64)?
        .checked_mul(channels.max(1) as u64)?
        .checked_mul(format_bytes(format))
}

/// Bytes of a mipmapped array: every level halves each extent (down to 1).
pub fn mipmapped_bytes(desc: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> Option<u64> {
    let (mut w, mut h, mut d) = (desc.Width, desc.Height, desc.Depth);
    // Layers and cubemap faces are counted in Depth and do not shrink from level to level.
    let depth_is_count = desc.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.checked_add(array_bytes(w, h, d, desc.Format, desc.NumChannels)?)?;
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        if !depth_is_count {
            d = if d == 0 { 0 } else { (d / 2).max(1) };
        }
    }
    Some(total)
}

/// The array creators' common body: null arguments and a missing context go to the driver (it
/// reports them); otherwise the array is charged its size from the descriptor before `create`
/// (the real creator, writing the handle to `out`) runs.
#[inline]
unsafe fn create_array<T, D>(
    kind: Kind,
    out: *mut *mut T,
    desc: *const D,
    bytes: impl FnOnce(&D) -> Option<u64>,
    create: impl Fn() -> CUresult,
) -> CUresult {
    let st = ready!();
    if out.is_null() || desc.is_null() {
        return create();
    }
    let dev = current!(st, create());
    let Some(bytes) = bytes(&*desc) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    charge_and_alloc(dev, kind, bytes, 0, || (create(), *out as u64))
}

/// `cuArrayCreate_v2`.
pub unsafe fn array_create(
    real: pfn::cuArrayCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let bytes =
        |d: &CUDA_ARRAY_DESCRIPTOR| array_bytes(d.Width, d.Height, 1, d.Format, d.NumChannels);
    create_array(Kind::Array, array, desc, bytes, || real(array, desc))
}

/// `cuArray3DCreate_v2` (layered arrays: depth = layers).
pub unsafe fn array3d_create(
    real: pfn::cuArray3DCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let bytes = |d: &CUDA_ARRAY3D_DESCRIPTOR| {
        array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels)
    };
    create_array(Kind::Array, array, desc, bytes, || real(array, desc))
}

/// `cuArrayDestroy`.
pub unsafe fn array_destroy(real: pfn::cuArrayDestroy, array: CUarray) -> CUresult {
    let st = ready!();
    free_and_uncharge(st, Kind::Array, array as u64, || real(array))
}

/// `cuMipmappedArrayCreate`.
pub unsafe fn mipmapped_create(
    real: pfn::cuMipmappedArrayCreate,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let bytes = |d: &CUDA_ARRAY3D_DESCRIPTOR| mipmapped_bytes(d, levels);
    create_array(Kind::Mipmapped, array, desc, bytes, || {
        real(array, desc, levels)
    })
}

/// `cuMipmappedArrayDestroy`.
pub unsafe fn mipmapped_destroy(
    real: pfn::cuMipmappedArrayDestroy,
    array: CUmipmappedArray,
) -> CUresult {
    let st = ready!();
    free_and_uncharge(st, Kind::Mipmapped, array as u64, || real(array))
}

/// Who keeps a graph memory charge alive: the graph its nodes belong to, and every executable
/// instantiated from it (an executable takes the graph's memory at each launch, even after its
/// graph is destroyed). Kinds are tagged so a graph and an exec handle never alias.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Holder {
    Graph(usize),
    Exec(usize),
}

/// Graph memory charged on one device, returned when the last of its holders is destroyed.
/// One charge per instantiation generation: nodes added to a graph that is not instantiated
/// join its charge; nodes added after an instantiation get a charge the executable does not
/// hold.
#[derive(Debug)]
struct GraphCharge {
    bytes: u64,
    ordinal: i32,
    holders: Vec<Holder>,
}

/// All graph memory charges. Graph building, instantiation and destruction are cold paths
/// (a lock is fine); `cuGraphLaunch` never looks here.
static GRAPHS: Mutex<Vec<GraphCharge>> = Mutex::new(Vec::new());

fn graphs() -> std::sync::MutexGuard<'static, Vec<GraphCharge>> {
    GRAPHS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Record `bytes` of graph memory on `ordinal`, held by `graph`.
fn graph_charge_add(t: &mut Vec<GraphCharge>, graph: usize, ordinal: i32, bytes: u64) {
    let only = [Holder::Graph(graph)];
    match t
        .iter_mut()
        .find(|c| c.ordinal == ordinal && c.holders[..] == only[..])
    {
        Some(c) => c.bytes += bytes,
        None => t.push(GraphCharge {
            bytes,
            ordinal,
            holders: only.to_vec(),
        }),
    }
}

/// `exec` was instantiated from `graph`: it holds every charge the graph holds.
fn graph_charge_share(t: &mut [GraphCharge], graph: usize, exec: usize) {
    for c in t.iter_mut() {
        if c.holders.contains(&Holder::Graph(graph)) && !c.holders.contains(&Holder::Exec(exec)) {
            c.holders.push(Holder::Exec(exec));
        }
    }
}

/// `h` is destroyed: drop it from every charge; the charges nobody holds any more are removed
/// and handed to `give_back(ordinal, bytes)`.
fn graph_charge_release(t: &mut Vec<GraphCharge>, h: Holder, mut give_back: impl FnMut(i32, u64)) {
    t.retain_mut(|c| {
        c.holders.retain(|&x| x != h);
        if c.holders.is_empty() {
            give_back(c.ordinal, c.bytes);
            return false;
        }
        true
    });
}

/// `to` now holds what `from` held (`from` itself no longer does).
fn graph_charge_rehold(t: &mut [GraphCharge], from: Holder, to: Holder) {
    for c in t.iter_mut() {
        if let Some(i) = c.holders.iter().position(|&h| h == from) {
            if c.holders.contains(&to) {
                c.holders.swap_remove(i);
            } else {
                c.holders[i] = to;
            }
        }
    }
}

/// Graph memory of `bytes` on `dev` for a node of `graph`, around `add` (the driver call that
/// makes the node): charged first, refused with `CUDA_ERROR_OUT_OF_MEMORY` over the quota,
/// held by the graph (and later its executables) once the driver made the node.
#[cold]
unsafe fn graph_alloc(
    dev: &DevState,
    graph: CUgraph,
    bytes: u64,
    add: impl FnOnce() -> CUresult,
) -> CUresult {
    if !charge(dev, bytes) {
        return oom(dev, bytes);
    }
    let r = add();
    if r != CUDA_SUCCESS {
        dev.account.uncharge(bytes);
        return r;
    }
    graph_charge_add(&mut graphs(), graph as usize, dev.ordinal, bytes);
    r
}

/// A memory allocation node described by `p`, on a device: see [`graph_alloc`].
unsafe fn mem_alloc_node(
    graph: CUgraph,
    p: *const CUDA_MEM_ALLOC_NODE_PARAMS,
    add: impl FnOnce() -> CUresult,
) -> CUresult {
    let st = ready!();
    if p.is_null() || (*p).poolProps.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return add();
    }
    match st.device((*p).poolProps.location.id) {
        Some(dev) => graph_alloc(dev, graph, (*p).bytesize as u64, add),
        None => add(),
    }
}

/// `cuGraphAddMemAllocNode`: charged when added (the node's memory is taken at any launch of
/// an executable made from the graph), returned when the graph and all its executables are
/// destroyed.
pub unsafe fn graph_add_mem_alloc_node(
    real: pfn::cuGraphAddMemAllocNode,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    mem_alloc_node(graph, params, || real(node, graph, deps, ndeps, params))
}

/// `cuGraphAddNode` (CUDA 12.2) and `_v2`: a memory allocation node is charged as by
/// `cuGraphAddMemAllocNode`; a child graph moved into its parent (the only way a graph with
/// memory nodes can be a child) hands its graph memory to the parent.
unsafe fn graph_add_any_node(
    graph: CUgraph,
    params: *mut CUgraphNodeParams,
    add: impl FnOnce() -> CUresult,
) -> CUresult {
    if params.is_null() {
        return add();
    }
    match (*params).type_ {
        CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            mem_alloc_node(graph, core::ptr::addr_of!((*params).u.alloc), add)
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            let child = (*params).u.graph;
            let r = add();
            if r == CUDA_SUCCESS && child.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE {
                graph_charge_rehold(
                    &mut graphs(),
                    Holder::Graph(child.graph as usize),
                    Holder::Graph(graph as usize),
                );
            }
            r
        }
        _ => add(),
    }
}

/// `cuGraphAddNode`.
pub unsafe fn graph_add_node(
    real: pfn::cuGraphAddNode,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    graph_add_any_node(graph, params, || real(node, graph, deps, ndeps, params))
}

/// `cuGraphAddNode_v2` (CUDA 12.3: with edge data, passed through unread).
pub unsafe fn graph_add_node_v2(
    real: pfn::cuGraphAddNode_v2,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const core::ffi::c_void,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    graph_add_any_node(graph, params, || {
        real(node, graph, deps, edges, ndeps, params)
    })
}

/// After a successful instantiation: the executable holds the graph's memory charges.
unsafe fn instantiated(r: CUresult, exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if r == CUDA_SUCCESS && !exec.is_null() {
        graph_charge_share(&mut graphs(), graph as usize, *exec as usize);
    }
    r
}

/// `cuGraphInstantiateWithFlags`.
pub unsafe fn graph_instantiate_with_flags(
    real: pfn::cuGraphInstantiateWithFlags,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    instantiated(real(exec, graph, flags), exec, graph)
}

/// `cuGraphInstantiate` (the exported symbol keeps the CUDA 10 signature) and `_v2`.
pub unsafe fn graph_instantiate(
    real: pfn::cuGraphInstantiate_v2,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err: *mut CUgraphNode,
    log: *mut core::ffi::c_char,
    len: usize,
) -> CUresult {
    instantiated(real(exec, graph, err, log, len), exec, graph)
}

/// `cuGraphInstantiateWithParams(_ptsz)`: the parameters pass through unread.
pub unsafe fn graph_instantiate_with_params(
    real: pfn::cuGraphInstantiateWithParams,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut core::ffi::c_void,
) -> CUresult {
    instantiated(real(exec, graph, params), exec, graph)
}

/// Return the charges `h` was the last holder of.
fn graph_released(h: Holder) {
    let Some(st) = crate::init::state_if_ready() else {
        return;
    };
    graph_charge_release(&mut graphs(), h, |ord, bytes| {
        if let Some(dev) = st.device(ord) {
            dev.account.uncharge(bytes);
        }
    });
}

/// `cuGraphDestroy`: the graph's memory goes back unless an executable still holds it.
pub unsafe fn graph_destroy(real: pfn::cuGraphDestroy, graph: CUgraph) -> CUresult {
    let r = real(graph);
    if r == CUDA_SUCCESS {
        graph_released(Holder::Graph(graph as usize));
    }
    r
}

/// `cuGraphExecDestroy`: as `cuGraphDestroy`, for the executable's hold.
pub unsafe fn graph_exec_destroy(real: pfn::cuGraphExecDestroy, exec: CUgraphExec) -> CUresult {
    let r = real(exec);
    if r == CUDA_SUCCESS {
        graph_released(Holder::Exec(exec as usize));
    }
    r
}

/// Captures begun and not yet ended, as the capture hooks saw them: an allocation asks the
/// driver whether its stream is capturing only while this is not zero, so the hot path pays
/// one atomic load when nothing captures.
static CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// The graph `stream` is capturing into, if any. A stream-ordered allocation captured there is
/// a memory node of that graph: charged as its graph memory ([`graph_alloc`]), not as pool
/// memory, and kept out of the pointer table, so the free that pairs with it (captured or not)
/// moves nothing into a pool's retained credit.
#[inline]
unsafe fn capture_graph(stream: CUstream) -> Option<CUgraph> {
    if CAPTURES.load(Acquire) == 0 {
        return None;
    }
    capture_graph_query(stream)
}

#[cold]
unsafe fn capture_graph_query(stream: CUstream) -> Option<CUgraph> {
    let f = real::cuStreamGetCaptureInfo_v2()?;
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    let mut graph: CUgraph = core::ptr::null_mut();
    let mut deps: *const CUgraphNode = core::ptr::null();
    let mut n = 0usize;
    let r = f(stream, &mut status, &mut id, &mut graph, &mut deps, &mut n);
    (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE && !graph.is_null())
        .then_some(graph)
}

/// `cuStreamBeginCapture_v2(_ptsz)`: count the capture.
pub unsafe fn begin_capture(
    real: pfn::cuStreamBeginCapture_v2,
    stream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    let r = real(stream, mode);
    if r == CUDA_SUCCESS {
        CAPTURES.fetch_add(1, AcqRel);
    }
    r
}

/// `cuStreamBeginCapture(_ptsz)`: the CUDA 10 export, without a mode.
pub unsafe fn begin_capture_v1(real: pfn::cuStreamBeginCapture, stream: CUstream) -> CUresult {
    let r = real(stream);
    if r == CUDA_SUCCESS {
        CAPTURES.fetch_add(1, AcqRel);
    }
    r
}

/// `cuStreamEndCapture(_ptsz)`: the capture ends even when it fails (invalidated), and then the
/// driver keeps no graph, so the memory captured into it goes back.
pub unsafe fn end_capture(
    real: pfn::cuStreamEndCapture,
    stream: CUstream,
    out: *mut CUgraph,
) -> CUresult {
    let capturing = if CAPTURES.load(Acquire) == 0 {
        None
    } else {
        capture_graph_query(stream)
    };
    let r = real(stream, out);
    let Some(g) = capturing else {
        return r;
    };
    let _ = CAPTURES.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
    let made = if r == CUDA_SUCCESS && !out.is_null() {
        *out
    } else {
        core::ptr::null_mut()
    };
    if made.is_null() {
        graph_released(Holder::Graph(g as usize));
    } else if made != g {
        // The driver named the finished graph differently from the one it captured into.
        graph_charge_rehold(
            &mut graphs(),
            Holder::Graph(g as usize),
            Holder::Graph(made as usize),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_estimates() {
        assert_eq!(
            array_bytes(1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4),
            Some(16 << 20)
        );
        assert_eq!(
            array_bytes(1024, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1),
            Some(1024)
        );
        assert_eq!(array_bytes(usize::MAX, 2, 1, CU_AD_FORMAT_FLOAT, 1), None);
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 8,
            Height: 8,
            Depth: 0,
            Format: CU_AD_FORMAT_UNSIGNED_INT8,
            NumChannels: 1,
            Flags: 0,
        };
        assert_eq!(mipmapped_bytes(&d, 4), Some(64 + 16 + 4 + 1));
        // Three layers of an 8x8 mipmap: every level keeps all three layers.
        let layered = CUDA_ARRAY3D_DESCRIPTOR {
            Depth: 3,
            Flags: CUDA_ARRAY3D_LAYERED,
            ..d
        };
        assert_eq!(mipmapped_bytes(&layered, 3), Some(3 * (64 + 16 + 4)));
        let cube = CUDA_ARRAY3D_DESCRIPTOR {
            Depth: 6,
            Flags: CUDA_ARRAY3D_CUBEMAP,
            ..d
        };
        assert_eq!(mipmapped_bytes(&cube, 2), Some(6 * (64 + 16)));
        // A true 3D mipmap halves its depth too.
        let vol = CUDA_ARRAY3D_DESCRIPTOR { Depth: 8, ..d };
        assert_eq!(mipmapped_bytes(&vol, 2), Some(512 + 64));
    }

    #[test]
    fn graph_memory_is_held_by_the_graph_and_its_executables() {
        let mut t = Vec::new();
        let mut back = Vec::new();
        graph_charge_add(&mut t, 1, 0, 100);
        graph_charge_add(&mut t, 1, 0, 50);
        graph_charge_share(&mut t, 1, 7);
        graph_charge_share(&mut t, 1, 7);
        // Added after the instantiation: the executable cannot take it.
        graph_charge_add(&mut t, 1, 0, 10);
        graph_charge_release(&mut t, Holder::Graph(1), |o, b| back.push((o, b)));
        assert_eq!(back, [(0, 10)], "the executable still holds the first 150");
        graph_charge_release(&mut t, Holder::Graph(7), |o, b| back.push((o, b)));
        assert_eq!(back.len(), 1, "a graph handle is not an exec handle");
        graph_charge_release(&mut t, Holder::Exec(7), |o, b| back.push((o, b)));
        assert_eq!(back, [(0, 10), (0, 150)]);
        assert!(t.is_empty());
    }

    #[test]
    fn graph_memory_goes_back_with_the_last_of_several_executables() {
        let mut t = Vec::new();
        let mut back = Vec::new();
        graph_charge_add(&mut t, 1, 1, 64);
        graph_charge_share(&mut t, 1, 7);
        graph_charge_share(&mut t, 1, 8);
        graph_charge_release(&mut t, Holder::Exec(7), |o, b| back.push((o, b)));
        graph_charge_release(&mut t, Holder::Graph(1), |o, b| back.push((o, b)));
        assert!(back.is_empty(), "executable 8 still holds it");
        graph_charge_release(&mut t, Holder::Exec(8), |o, b| back.push((o, b)));
        assert_eq!(back, [(1, 64)], "charged once, returned once");
    }

    #[test]
    fn a_moved_child_graph_hands_its_memory_to_the_parent() {
        let mut t = Vec::new();
        let mut back = Vec::new();
        graph_charge_add(&mut t, 2, 0, 32);
        graph_charge_rehold(&mut t, Holder::Graph(2), Holder::Graph(1));
        graph_charge_share(&mut t, 1, 9);
        graph_charge_release(&mut t, Holder::Graph(1), |o, b| back.push((o, b)));
        assert!(back.is_empty(), "the parent's executable holds it");
        graph_charge_release(&mut t, Holder::Exec(9), |o, b| back.push((o, b)));
        assert_eq!(back, [(0, 32)]);
    }
}
