//! Device memory: host memory reserved lazily (`mmap` with `MAP_NORESERVE`), so the device
//! pointer *is* the host address and copies are plain `memcpy`s, while every byte is counted
//! against the node-wide device total in the shared state (see [`crate::shared`]).
//!
//! One registry of live ranges serves frees, `cuMemGetAddressRange` and pointer attributes.
//! Stream-ordered pools keep freed blocks reserved (counted as used on the device) until a
//! synchronize finds them above the release threshold or `cuMemPoolTrimTo` trims them, as the
//! driver does. A `cuMemFreeAsync` leaves the pool's used bytes at the call; the block is
//! *pending* until the free is reached in its stream (not reusable, not trimmable), then free. VMM handles are memfds mapped into `PROT_NONE` reservations.

use crate::runtime::{rt, rt_unchecked, Ctx, CuResult};
use gpuslice_abi::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

/// What a registered range is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// cuMemAlloc / cuMemAllocPitch.
    Device,
    /// cuMemAllocManaged.
    Managed,
    /// A block handed out by a pool (`*const Pool`).
    Pool(usize),
    /// An array's backing store.
    Array,
    /// A graph memory node's range; `true` while its memory is allocated.
    Graph(bool),
    /// Page-locked host memory (cuMemAllocHost / cuMemHostAlloc).
    Host,
    /// Registered host memory (cuMemHostRegister): not ours to unmap.
    Registered,
    /// A module global's backing buffer.
    Global,
}

/// A live range.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    /// Bytes the client asked for.
    pub size: u64,
    /// Bytes mapped (page-rounded).
    pub map_len: usize,
    /// CUDA ordinal of its device.
    pub dev: usize,
    /// Context that allocated it (`*const Ctx`, 0 for none).
    pub ctx: usize,
    /// What it is.
    pub kind: Kind,
}

impl Range {
    /// Whether its bytes count as device memory.
    fn counted(&self) -> bool {
        matches!(
            self.kind,
            Kind::Device | Kind::Managed | Kind::Array | Kind::Graph(true)
        )
    }
}

static RANGES: Mutex<BTreeMap<u64, Range>> = Mutex::new(BTreeMap::new());

fn ranges() -> std::sync::MutexGuard<'static, BTreeMap<u64, Range>> {
    RANGES.lock().unwrap_or_else(|e| e.into_inner())
}

const PAGE: usize = 4096;

fn map_anon(len: usize) -> Option<u64> {
    // SAFETY: a fresh anonymous mapping; nothing else refers to that address range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

fn unmap(p: u64, len: usize) {
    // SAFETY: `p..p+len` is a mapping this module created and the registry no longer lists.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

fn phys(dev: usize) -> usize {
    rt_unchecked().devices[dev].phys
}

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
    let map_len = (size as usize).div_ceil(PAGE) * PAGE;
    let Some(ptr) = map_anon(map_len) else {
        node.unreserve(p, size);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    ranges().insert(
        ptr,
        Range {
            size,
            map_len,
            dev: ctx.dev,
            ctx: ctx as *const Ctx as usize,
            kind,
        },
    );
    Ok(ptr)
}

/// Allocate uncounted host memory (pinned host allocations, module globals).
pub fn alloc_host(ctx: Option<&'static Ctx>, size: u64, kind: Kind) -> CuResult<u64> {
    let map_len = (size.max(1) as usize).div_ceil(PAGE) * PAGE;
    let ptr = map_anon(map_len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let (dev, ctx) = ctx.map_or((0, 0), |c| (c.dev, c as *const Ctx as usize));
    ranges().insert(
        ptr,
        Range {
            size,
            map_len,
            dev,
            ctx,
            kind,
        },
    );
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
        Kind::Pool(pool) => {
            // SAFETY: pools are leaked; the registry holds only pointers to live ones.
            unsafe { &*(pool as *const Pool) }.give_back(ptr, r.size);
        }
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
            if r.counted() {
                rt_unchecked().node.unreserve(phys(r.dev), r.size);
            }
            if r.kind != Kind::Registered {
                unmap(ptr, r.map_len);
            }
        }
    }
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
    g.insert(
        ptr,
        Range {
            size,
            map_len: size as usize,
            dev: 0,
            ctx: 0,
            kind: Kind::Registered,
        },
    );
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

/// The live range containing `ptr`: (start, range).
pub fn lookup(ptr: u64) -> Option<(u64, Range)> {
    let g = ranges();
    let (&start, r) = g.range(..=ptr).next_back()?;
    (ptr < start + r.size.max(1)).then_some((start, *r))
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

// --- pools --------------------------------------------------------------------------------

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

fn pools() -> Vec<&'static Pool> {
    POOLS.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
                let map_len = (size as usize).div_ceil(PAGE) * PAGE;
                let Some(p) = map_anon(map_len) else {
                    node.unreserve(self.phys, size);
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                };
                g.reserved += size;
                g.reserved_high = g.reserved_high.max(g.reserved);
                (p, size, map_len)
            }
        };
        g.used += bsize;
        g.used_high = g.used_high.max(g.used);
        drop(g);
        let kind = Kind::Pool(self as *const Pool as usize);
        ranges().insert(
            ptr,
            Range {
                size: bsize,
                map_len,
                dev: ctx.dev,
                ctx: ctx as *const Ctx as usize,
                kind,
            },
        );
        Ok(ptr)
    }

    fn give_back(&self, ptr: u64, size: u64) {
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
    fn complete_pending(&self, ptr: u64) -> bool {
        let mut g = self.lock();
        let Some(i) = g.pending.iter().position(|b| b.0 == ptr) else {
            return false;
        };
        let b = g.pending.swap_remove(i);
        g.free.push(b);
        true
    }

    fn complete_all_pending(&self) {
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
/// reaches the free ([`free_now`] then makes it free). Other memory: nothing changes yet.
pub fn free_async_called(ptr: u64) {
    let mut g = ranges();
    let Some(&r) = g.get(&ptr) else {
        return;
    };
    if let Kind::Pool(pool) = r.kind {
        g.remove(&ptr);
        drop(g);
        // SAFETY: pools are leaked; the registry holds only pointers to live ones.
        unsafe { &*(pool as *const Pool) }.free_pending(ptr, r.size, r.map_len);
    }
}

// --- VMM ----------------------------------------------------------------------------------

/// VMM allocation granularity, as on current GPUs.
pub const GRANULARITY: u64 = 2 << 20;

struct Phys {
    fd: i32,
    size: u64,
    dev: usize,
    maps: usize,
    /// cuMemCreate/cuMemImportFromShareableHandle and cuMemRetainAllocationHandle references
    /// not yet released.
    refs: u32,
    /// Whether this handle counted the memory on the device (an imported one did not: its
    /// exporter did).
    counted: bool,
    prop: CUmemAllocationProp,
}

// SAFETY: the prop's one pointer (win32HandleMetaData) is never dereferenced.
unsafe impl Send for Phys {}

static HANDLES: Mutex<Option<HashMap<u64, Phys>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
static MAPPINGS: Mutex<BTreeMap<u64, (u64, u64)>> = Mutex::new(BTreeMap::new());

fn with_handles<T>(f: impl FnOnce(&mut HashMap<u64, Phys>) -> T) -> T {
    let mut g = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// `cuMemCreate`.
pub fn vmm_create(size: u64, prop: &CUmemAllocationProp) -> CuResult<u64> {
    let r = rt()?;
    if size == 0
        || !size.is_multiple_of(GRANULARITY)
        || prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = usize::try_from(prop.location.id)
        .ok()
        .filter(|&d| d < r.devices.len())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let p = r.devices[dev].phys;
    if !r.node.reserve_or_reap(p, size) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: memfd_create with a static name; the fd is checked and owned by the handle.
    let fd = unsafe { libc::memfd_create(c"fakegpu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: sizing the memfd we just created.
    if fd < 0 || unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        r.node.unreserve(p, size);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let h = NEXT_HANDLE.fetch_add(1, Relaxed);
    with_handles(|m| {
        m.insert(
            h,
            Phys {
                fd,
                size,
                dev,
                maps: 0,
                refs: 1,
                counted: true,
                prop: *prop,
            },
        )
    });
    Ok(h)
}

fn drop_phys_if_done(m: &mut HashMap<u64, Phys>, h: u64) {
    if m.get(&h).is_some_and(|p| p.refs == 0 && p.maps == 0) {
        let p = m.remove(&h).expect("present");
        // SAFETY: closing the memfd this handle owned.
        unsafe { libc::close(p.fd) };
        if p.counted {
            let r = rt_unchecked();
            r.node.unreserve(r.devices[p.dev].phys, p.size);
        }
    }
}

/// The allocation of handle `h` while the program still holds it (not released), or
/// `CUDA_ERROR_INVALID_VALUE`.
fn held(m: &mut HashMap<u64, Phys>, h: u64) -> CuResult<&mut Phys> {
    m.get_mut(&h)
        .filter(|p| p.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// `cuMemRelease`: the memory goes when its last mapping does.
pub fn vmm_release(h: u64) -> CuResult<()> {
    rt()?;
    with_handles(|m| {
        held(m, h)?.refs -= 1;
        drop_phys_if_done(m, h);
        Ok(())
    })
}

/// `cuMemExportToShareableHandle`: a POSIX fd of the allocation (a dup of its memfd), if it
/// was created asking for that handle type, as the driver requires.
pub fn vmm_export(h: u64, ty: CUmemAllocationHandleType) -> CuResult<i32> {
    rt()?;
    with_handles(|m| {
        let p = held(m, h)?;
        if ty != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            || p.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: duplicating the memfd this handle owns; the caller owns the copy.
        let fd = unsafe { libc::dup(p.fd) };
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(fd)
    })
}

/// `cuMemImportFromShareableHandle`: a handle to memory another handle (maybe in another
/// process) exported. The memory stays counted to its exporter.
pub fn vmm_import(fd: i32, ty: CUmemAllocationHandleType) -> CuResult<u64> {
    rt()?;
    if ty != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: libc::stat is a plain C struct; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a valid local stat; a bad fd is an error return, not UB.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: our own copy of the caller's fd, owned by the new handle.
    let own = unsafe { libc::dup(fd) };
    if own < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    };
    let h = NEXT_HANDLE.fetch_add(1, Relaxed);
    with_handles(|m| {
        m.insert(
            h,
            Phys {
                fd: own,
                size: st.st_size as u64,
                dev: 0,
                maps: 0,
                refs: 1,
                counted: false,
                prop,
            },
        )
    });
    Ok(h)
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `ptr`, with one more reference.
pub fn vmm_retain(ptr: u64) -> CuResult<u64> {
    rt()?;
    let h = {
        let g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
        let (&s, &(len, h)) = g
            .range(..=ptr)
            .next_back()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ptr >= s + len {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        h
    };
    with_handles(|m| {
        let p = m.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs += 1;
        Ok(h)
    })
}

/// `cuMemGetAllocationPropertiesFromHandle`.
pub fn vmm_properties(h: u64) -> CuResult<CUmemAllocationProp> {
    rt()?;
    with_handles(|m| m.get(&h).map(|p| p.prop).ok_or(CUDA_ERROR_INVALID_VALUE))
}

/// `cuMemAddressReserve`.
pub fn vmm_reserve(size: u64, align: u64) -> CuResult<u64> {
    rt()?;
    if size == 0 || !size.is_multiple_of(GRANULARITY) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let align = align.max(GRANULARITY);
    let len = (size + align) as usize;
    // SAFETY: a fresh PROT_NONE reservation; the unaligned head and tail are unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let base = p as u64;
    let start = base.div_ceil(align) * align;
    if start > base {
        unmap(base, (start - base) as usize);
    }
    let tail = base + len as u64 - (start + size);
    if tail > 0 {
        unmap(start + size, tail as usize);
    }
    Ok(start)
}

/// `cuMemAddressFree`.
pub fn vmm_address_free(ptr: u64, size: u64) -> CuResult<()> {
    rt()?;
    if ptr == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    unmap(ptr, size as usize);
    Ok(())
}

/// `cuMemMap`.
pub fn vmm_map(ptr: u64, size: u64, offset: u64, h: u64) -> CuResult<()> {
    rt()?;
    with_handles(|m| {
        let p = m.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if size == 0
            || offset.checked_add(size).is_none_or(|e| e > p.size)
            || !ptr.is_multiple_of(GRANULARITY)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: replaces part of a reservation the client made with cuMemAddressReserve by
        // the handle's memfd; access stays PROT_NONE until cuMemSetAccess.
        let r = unsafe {
            libc::mmap(
                ptr as *mut libc::c_void,
                size as usize,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                p.fd,
                offset as libc::off_t,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.maps += 1;
        MAPPINGS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr, (size, h));
        Ok(())
    })
}

/// `cuMemSetAccess`.
pub fn vmm_set_access(ptr: u64, size: u64, flags: CUmemAccess_flags) -> CuResult<()> {
    rt()?;
    let prot = match flags {
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE => libc::PROT_READ | libc::PROT_WRITE,
        CU_MEM_ACCESS_FLAGS_PROT_READ => libc::PROT_READ,
        _ => libc::PROT_NONE,
    };
    // SAFETY: changes protection of mapped VMM ranges the client names.
    if unsafe { libc::mprotect(ptr as *mut libc::c_void, size as usize, prot) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuMemUnmap`.
pub fn vmm_unmap(ptr: u64, size: u64) -> CuResult<()> {
    rt()?;
    let gone: Vec<(u64, (u64, u64))> = {
        let mut g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<u64> = g.range(ptr..ptr + size).map(|(&k, _)| k).collect();
        keys.into_iter()
            .filter_map(|k| g.remove(&k).map(|v| (k, v)))
            .collect()
    };
    if gone.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: puts the PROT_NONE reservation back over the unmapped range.
    unsafe {
        libc::mmap(
            ptr as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
    with_handles(|m| {
        for (_, (_, h)) in gone {
            if let Some(p) = m.get_mut(&h) {
                p.maps = p.maps.saturating_sub(1);
            }
            drop_phys_if_done(m, h);
        }
    });
    Ok(())
}

/// The VMM mapping containing `ptr`: (start, size).
pub fn vmm_lookup(ptr: u64) -> Option<(u64, u64)> {
    let g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    let (&s, &(len, _)) = g.range(..=ptr).next_back()?;
    (ptr < s + len).then_some((s, len))
}

// --- arrays -------------------------------------------------------------------------------

const ARRAY_MAGIC: u64 = 0xA77A_0000_0000_FA4E;

/// An array: a counted linear buffer with its descriptor.
#[repr(C)]
pub struct Array {
    magic: u64,
    /// Backing store.
    pub ptr: u64,
    /// Its 3D descriptor.
    pub desc: CUDA_ARRAY3D_DESCRIPTOR,
}

/// Bytes per element of an array format.
pub fn format_bytes(f: CUarray_format) -> Option<u64> {
    Some(match f {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

/// `cuArrayCreate` / `cuArray3DCreate` (`levels` 1) and `cuMipmappedArrayCreate`: the backing
/// store holds every level, each halving every non-zero extent (floor, at least 1), so the
/// count matches what the shim charges for the same descriptor.
pub fn array_create(
    ctx: &'static Ctx,
    d: CUDA_ARRAY3D_DESCRIPTOR,
    levels: u32,
) -> CuResult<&'static Array> {
    let eb = format_bytes(d.Format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if d.Width == 0 || levels == 0 || !matches!(d.NumChannels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let half = |e: usize| if e == 0 { 0 } else { (e / 2).max(1) };
    let (mut w, mut h, mut z) = (d.Width, d.Height, d.Depth);
    let mut bytes = 0u64;
    for _ in 0..levels {
        let level = (w as u64)
            .checked_mul(h.max(1) as u64)
            .and_then(|v| v.checked_mul(z.max(1) as u64))
            .and_then(|v| v.checked_mul(eb * d.NumChannels as u64));
        bytes = level
            .and_then(|l| bytes.checked_add(l))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // Layers and cubemap faces (counted in Depth) stay whole at every level.
        let layers = d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
        (w, h, z) = (half(w), half(h), if layers { z } else { half(z) });
    }
    let ptr = alloc(ctx, bytes, Kind::Array)?;
    Ok(Box::leak(Box::new(Array {
        magic: ARRAY_MAGIC,
        ptr,
        desc: d,
    })))
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Array {
    const MAGIC: u64 = ARRAY_MAGIC;
}

/// The array a handle names (`CUarray` or `CUmipmappedArray`); its backing range shows it has
/// not been destroyed.
pub fn array_of(h: CUarray) -> CuResult<&'static Array> {
    let a = crate::handle::resolve::<Array>(h as *const std::ffi::c_void)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    match ranges().get(&a.ptr) {
        Some(r) if r.kind == Kind::Array => Ok(a),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// `cuArrayDestroy`.
pub fn array_destroy(h: CUarray) -> CuResult<()> {
    let a = array_of(h)?;
    free_now(a.ptr);
    Ok(())
}

/// Row pitch of an array's linear backing store.
pub fn array_pitch(a: &Array) -> usize {
    a.desc.Width * a.desc.NumChannels as usize * format_bytes(a.desc.Format).unwrap_or(1) as usize
}

/// Mark a graph memory node's range as holding (or not holding) device memory.
pub fn set_graph_live(ptr: u64, live: bool) {
    if let Some(r) = ranges().get_mut(&ptr) {
        if r.kind != Kind::Graph(live) && r.dev < MAX_DEVICES {
            if live {
                let now = GRAPH_USED[r.dev].fetch_add(r.size, AcqRel) + r.size;
                GRAPH_HIGH[r.dev].fetch_max(now, AcqRel);
            } else {
                let _ = GRAPH_USED[r.dev]
                    .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(r.size)));
            }
        }
        r.kind = Kind::Graph(live);
    }
}

use crate::config::MAX_DEVICES;
/// Graph memory in use per CUDA ordinal, and its high-water mark (`cuDeviceGetGraphMemAttribute`).
static GRAPH_USED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static GRAPH_HIGH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// `cuDeviceGetGraphMemAttribute`: the fake reserves exactly what graphs use, so the used and
/// reserved figures agree.
pub fn graph_mem_attribute(dev: usize, attr: i32) -> CuResult<u64> {
    let d = dev.min(MAX_DEVICES - 1);
    match attr {
        0 | 2 => Ok(GRAPH_USED[d].load(Acquire)),
        1 | 3 => Ok(GRAPH_HIGH[d].load(Acquire)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuDeviceSetGraphMemAttribute`: only the high-water marks may be reset, with zero.
pub fn set_graph_mem_attribute(dev: usize, attr: i32, v: u64) -> CuResult<()> {
    let d = dev.min(MAX_DEVICES - 1);
    match attr {
        1 | 3 if v == 0 => {
            GRAPH_HIGH[d].store(GRAPH_USED[d].load(Acquire), Release);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
