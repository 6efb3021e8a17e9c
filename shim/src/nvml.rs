//! What NVML tells a program inside a slice (`nvidia-smi`, `nvitop`, pynvml, PyTorch): the
//! slice, exactly as its CUDA processes are told it, never the neighbours.
//!
//! - Memory (`nvmlDeviceGetMemoryInfo`, `_v2`): the quota as the total, the slice's usage as
//!   used, the rest as free (never negative, never more than the device has free), with the
//!   formula of the driver hooks (`report::view_of`).
//! - Running processes (compute v1/v2/v3, graphics and MPS v1/v2/v3, the detail list): only
//!   the slice's live processes, with what the ledger charges them and their pids as the
//!   caller sees them (`PidMap`); NVML's count protocol (`*infoCount` too small →
//!   `NVML_ERROR_INSUFFICIENT_SIZE` and the count needed). Graphics and MPS lists are empty
//!   inside a slice: slices hold CUDA processes, which the compute lists show.
//! - Accounting (`nvmlDeviceGetAccountingPids`, `nvmlDeviceGetAccountingStats`): while NVML
//!   has accounting on, the pids of the slice's live processes (as the caller sees them), and
//!   stats only for those: any other pid is `NVML_ERROR_NOT_FOUND`, as is one the shim cannot
//!   name to NVML (a process in another PID namespace asked about from a third one: NVML
//!   knows the host's pids only).
//! - Utilisation (`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetProcessUtilization`,
//!   `nvmlDeviceGetProcessesUtilizationInfo`): the slice's own `compute_used` (the scheduler's
//!   measured share of the device over its window), per-process samples only of its processes.
//!
//! Where the answers come from:
//! - a process that went through `cuInit` uses its own ledger mapping and accounts (the very
//!   numbers CUDA reports, so NVML and CUDA never disagree in one process);
//! - an NVML-only process (every monitoring tool) maps the ledger **read-only**
//!   (`ledger::view`), never creates it or takes a process slot, and finds its slice by the
//!   name its configuration gives (`GPUSLICE_SLICE`, or HAMi's shared-cache path), parsed by
//!   the same `Config` as `cuInit`. A slice already in the ledger gives its values (an
//!   operator's quota wins, as at `cuInit`); before any CUDA process made it, the configured
//!   quota and nothing used; a ledger that appears later is picked up within 200 ms.
//! - A process with no slice settings, `GPUSLICE_DISABLE=1`, or a device CUDA cannot see,
//!   gets the real device.
//!
//! Cost: one uncontended lock and a few atomic loads per call once warm. NVML handles are
//! cached by address, slice lookups by the ledger's generation, pid translations for the life
//! of each process; nothing here allocates per call (the first call builds the cache).
//!
//! The cache's lock is one a child made by `fork()` can always take: a thread of the parent
//! that held it does not exist in the child, so the child's `pthread_atfork` handler frees the
//! lock and drops (without freeing) a cache that thread may have been changing.
//!
//! Every `pub unsafe fn` here is a handler of the hook table, relying on the handler contract
//! of [`crate::hooks`]: `real` is NVML's function, the arguments are the program's, and each
//! pointer is null or valid as `nvml.h` documents it (arrays hold the count the program says).

use crate::config::Config;
use crate::hooks::{pfn, real};
use crate::init::{state_if_ready, State};
use crate::log::log;
use crate::report::view_of;
use core::cell::UnsafeCell;
use core::ffi::{c_char, c_uint, c_void};
use core::mem::size_of;
use core::sync::atomic::{AtomicBool, Ordering::*};
use gpuslice_abi::*;
use gpuslice_ledger::layout::{MAX_PROCS, UUID_LEN};
use gpuslice_ledger::sched::now_ns;
use gpuslice_ledger::view::{PidMap, ReadOnlyLedger, View, INITIAL_PID_NS};

/// How often an NVML-only process looks for a ledger that is not there yet.
const RETRY_NS: u64 = 200_000_000;
/// How often it checks that the ledger it maps is still the one in the directory.
const RECHECK_NS: u64 = 1_000_000_000;
/// NVML handles remembered (NVML has at most a few dozen devices).
const MAX_HANDLES: usize = 64;

/// `nvmlProcessInfo_v1_t`, what the unversioned process queries fill.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessUtilizationSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// One NVML device as this process has met it.
struct Dev {
    handle: usize,
    uuid: [u8; UUID_LEN],
    uuid_len: usize,
    /// CUDA ordinal under `CUDA_VISIBLE_DEVICES` (`None`: CUDA cannot see it: real device).
    ordinal: Option<u32>,
    /// Ledger generation the lookups below were made at (`u64::MAX`: never).
    gen: u64,
    ledger_dev: Option<usize>,
    slice: Option<usize>,
    /// Process slots of `slice` at `gen`.
    members: Vec<u16>,
}

impl Dev {
    fn uuid(&self) -> &[u8] {
        &self.uuid[..self.uuid_len]
    }
}

/// Everything the NVML hooks remember. Built on the first hooked call.
struct Cache {
    /// `None`: the configuration is invalid (said once; `cuInit` will refuse it).
    config: Option<Config>,
    /// The configuration puts this process in a slice (a name, a quota or a share).
    in_slice: bool,
    /// `GPUSLICE_SLICE` (or HAMi's shared-cache slice), as bytes.
    slice_name: Option<Vec<u8>>,
    /// The read-only ledger of an NVML-only process.
    ro: Option<ReadOnlyLedger>,
    /// When to look for (or re-check) the ledger next.
    recheck_at: u64,
    /// An unusable ledger was reported (once).
    warned: bool,
    devs: Vec<Dev>,
    pids: PidMap,
    /// The list being built: allocated once.
    list: Vec<Member>,
}

/// A live process of the caller's slice, as NVML answers show it.
#[derive(Clone, Copy)]
struct Member {
    /// Its pid as the caller sees it.
    pid: u32,
    /// What the ledger charges it.
    bytes: u64,
    /// Its pid as NVML knows it (the initial namespace's), when the shim can tell.
    nvml_pid: Option<u32>,
}

/// The cache behind a lock that a forked child can always take (module comment).
struct CacheCell {
    held: AtomicBool,
    cache: UnsafeCell<Option<Cache>>,
}

// SAFETY: `cache` is reached only through a `CacheGuard`, which exists while `held` is ours.
unsafe impl Sync for CacheCell {}

static CACHE: CacheCell = CacheCell {
    held: AtomicBool::new(false),
    cache: UnsafeCell::new(None),
};

/// The cache, held.
struct CacheGuard(&'static CacheCell);

impl core::ops::Deref for CacheGuard {
    type Target = Option<Cache>;
    fn deref(&self) -> &Option<Cache> {
        // SAFETY: we hold the lock (CacheGuard exists only then).
        unsafe { &*self.0.cache.get() }
    }
}

impl core::ops::DerefMut for CacheGuard {
    fn deref_mut(&mut self) -> &mut Option<Cache> {
        // SAFETY: as above, and the guard is the only way in.
        unsafe { &mut *self.0.cache.get() }
    }
}

impl Drop for CacheGuard {
    fn drop(&mut self) {
        self.0.held.store(false, Release);
    }
}

/// Take the cache's lock (held for microseconds; a waiter yields its CPU).
fn lock_cache() -> CacheGuard {
    let mut spins = 0u32;
    while CACHE
        .held
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let mut g = CacheGuard(&CACHE);
    if g.is_none() {
        *g = Some(Cache::new());
        // SAFETY: registers a handler that only stores an atomic and writes a plain value
        // (async-signal-safe, see in_forked_child); once, as the cache is built once.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
    }
    g
}

/// `pthread_atfork` child handler: the child's only thread is the one that forked, so a
/// holder of the cache's lock (another thread of the parent) is gone. Its cache may be half
/// changed: dropped without being read or freed (no allocator call here), rebuilt at the
/// next call.
extern "C" fn in_forked_child() {
    if CACHE.held.load(Relaxed) {
        // SAFETY: the child has one thread, this one, which holds no guard (it is inside
        // fork()): nobody else can reach the cache. `write` forgets the old value.
        unsafe { core::ptr::write(CACHE.cache.get(), None) };
        CACHE.held.store(false, Release);
    }
}

/// What the caller is, on one device.
enum Place {
    /// Outside any slice: the real device (process lists, utilisation). A CUDA process without
    /// slice settings still runs best effort: `memory` then holds those figures, so NVML and
    /// CUDA agree on its memory.
    Outside {
        /// Best-effort limit, what the pool holds (as in `Inside`), for an attached process.
        memory: Option<(u64, u64, bool)>,
    },
    /// Inside a slice.
    Inside {
        /// Quota or best-effort limit, what the account holds, whether it is a quota
        /// (`None`: no figures of its own, the real memory).
        memory: Option<(u64, u64, bool)>,
        /// Ledger device and slice indices, when the ledger has the slice.
        found: Option<(usize, usize)>,
    },
}

impl Cache {
    fn new() -> Cache {
        let config = match Config::from_env() {
            Ok(c) => Some(c),
            Err(e) => {
                log!(Error, "{e} (NVML shows the real device)");
                None
            }
        };
        let in_slice = config.as_ref().is_some_and(|c| {
            c.slice.is_some()
                || c.memory.is_some()
                || c.compute.is_some()
                || c.compute_cap.is_some()
        });
        Cache {
            slice_name: config
                .as_ref()
                .and_then(|c| c.slice.as_ref())
                .map(|s| s.as_bytes().to_vec()),
            config,
            in_slice,
            ro: None,
            recheck_at: 0,
            warned: false,
            devs: Vec::with_capacity(MAX_HANDLES),
            pids: PidMap::new(),
            list: Vec::with_capacity(MAX_PROCS),
        }
    }

    /// The cached entry of an NVML handle (asks NVML for its UUID and index the first time).
    fn dev(&mut self, handle: nvmlDevice_t) -> Option<usize> {
        if let Some(i) = self.devs.iter().position(|d| d.handle == handle as usize) {
            return Some(i);
        }
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        let f = real::nvmlDeviceGetUUID()?;
        // SAFETY: the buffer holds buf.len() bytes.
        if unsafe { f(handle, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
            return None;
        }
        let mut idx: c_uint = 0;
        let fi = real::nvmlDeviceGetIndex()?;
        // SAFETY: idx is a valid out-parameter.
        if unsafe { fi(handle, &mut idx) } != NVML_SUCCESS {
            return None;
        }
        let mut uuid = [0u8; UUID_LEN];
        let mut uuid_len = 0;
        for (k, &c) in buf
            .iter()
            .take(UUID_LEN)
            .take_while(|&&c| c != 0)
            .enumerate()
        {
            uuid[k] = c as u8;
            uuid_len = k + 1;
        }
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal = cuda_ordinal(visible.as_deref(), idx, &uuid[..uuid_len]);
        if self.devs.len() == MAX_HANDLES {
            self.devs.remove(0);
        }
        self.devs.push(Dev {
            handle: handle as usize,
            uuid,
            uuid_len,
            ordinal,
            gen: u64::MAX,
            ledger_dev: None,
            slice: None,
            members: Vec::with_capacity(16),
        });
        Some(self.devs.len() - 1)
    }

    /// Open (or re-open) the read-only ledger of an NVML-only process when due.
    fn refresh_ledger(&mut self) {
        let now = now_ns();
        if now < self.recheck_at {
            return;
        }
        let Some(dir) = self.config.as_ref().map(|c| &c.runtime_dir) else {
            return;
        };
        let stale = self.ro.as_ref().is_some_and(|r| !r.is_current(dir));
        if self.ro.is_none() || stale {
            self.ro = match ReadOnlyLedger::open(dir) {
                Ok(r) => r,
                Err(e) => {
                    if !self.warned {
                        log!(Warn, "NVML shows configured quotas only: {e}");
                        self.warned = true;
                    }
                    None
                }
            };
            for d in &mut self.devs {
                d.gen = u64::MAX;
            }
        }
        self.recheck_at = now
            + if self.ro.is_some() {
                RECHECK_NS
            } else {
                RETRY_NS
            };
    }

    /// Where the caller stands on device `di`. `real_total` resolves a `25%` quota when the
    /// ledger does not know the device yet.
    fn place(&mut self, st: Option<&'static State>, di: usize, real_total: u64) -> Place {
        if self.config.is_none() {
            return Place::Outside { memory: None };
        }
        if let Some(st) = st {
            return self.place_attached(st, di);
        }
        let Some(ordinal) = self.devs[di].ordinal.filter(|_| self.in_slice) else {
            return Place::Outside { memory: None };
        };
        let configured = self
            .config
            .as_ref()
            .and_then(|c| c.memory.as_ref())
            .and_then(|m| m.get(ordinal))
            .map(|(size, _)| size);
        self.refresh_ledger();
        let Cache {
            ro,
            devs,
            slice_name,
            ..
        } = self;
        let Some(v) = ro.as_ref().map(|r| r.view()) else {
            return Place::Inside {
                memory: configured.map(|size| (size.resolve(real_total), 0, true)),
                found: None,
            };
        };
        let d = &mut devs[di];
        let gen = v.generation();
        if d.gen != gen {
            d.gen = gen;
            d.ledger_dev = v.find_device(d.uuid());
            d.slice = d
                .ledger_dev
                .and_then(|ld| v.find_slice(slice_name.as_deref()?, ld));
            d.members.clear();
            if let Some(si) = d.slice {
                d.members.extend(v.members(si).map(|s| s as u16));
            }
        }
        let Some(ld) = d.ledger_dev else {
            return Place::Inside {
                memory: configured.map(|size| (size.resolve(real_total), 0, true)),
                found: None,
            };
        };
        match d.slice.and_then(|si| v.slice(si)) {
            Some(s) => Place::Inside {
                memory: Some(match s.memory_limit {
                    Some(l) => (l, s.memory_used, true),
                    None => best_effort(&v, ld),
                }),
                found: Some((ld, s.index)),
            },
            // The device is known but the slice not made yet: what cuInit would give.
            None => {
                let total = v.device(ld).map_or(real_total, |x| x.memory_total);
                Place::Inside {
                    memory: Some(match configured {
                        Some(size) => (size.resolve(total), 0, true),
                        None => best_effort(&v, ld),
                    }),
                    found: None,
                }
            }
        }
    }

    /// A process that attached at `cuInit`: its own accounts and ledger.
    fn place_attached(&mut self, st: &'static State, di: usize) -> Place {
        let d = &mut self.devs[di];
        let Some(ds) = st.devices.iter().find(|x| x.uuid.as_bytes() == d.uuid()) else {
            return Place::Outside { memory: None }; // CUDA cannot see this device
        };
        let memory = Some((ds.account.limit(), ds.account.used(), ds.account.is_quota()));
        if !self.in_slice {
            // Its private best-effort slice: the CUDA view of memory, the real rest.
            return Place::Outside {
                memory: memory.filter(|m| !m.2),
            };
        }
        let v = View::of(st.ledger);
        let slice = v.process(st.me.slot, ds.ledger_dev).and_then(|p| p.slice);
        let gen = v.generation();
        if d.gen != gen || d.slice != slice {
            d.gen = gen;
            d.ledger_dev = Some(ds.ledger_dev);
            d.slice = slice;
            d.members.clear();
            if let Some(si) = slice {
                d.members.extend(v.members(si).map(|s| s as u16));
            }
        }
        Place::Inside {
            memory,
            found: slice.map(|si| (ds.ledger_dev, si)),
        }
    }
}

/// A best-effort account on ledger device `ld`, as `Account::limit`/`used` compute it.
fn best_effort(v: &View<'_>, ld: usize) -> (u64, u64, bool) {
    v.device(ld).map_or((0, 0, false), |d| {
        (
            d.memory_total - d.memory_reserved,
            d.best_effort_used,
            false,
        )
    })
}

/// The CUDA ordinal of NVML device `index` (UUID `uuid`) under `CUDA_VISIBLE_DEVICES`
/// (`None`: CUDA does not see it). As CUDA reads the variable: a comma-separated list of
/// indices or `GPU-` UUID prefixes, ending at the first entry it cannot read. Indices are taken
/// in NVML's (PCI) order, which is CUDA's with `CUDA_DEVICE_ORDER=PCI_BUS_ID` and on nodes of
/// one GPU model.
fn cuda_ordinal(visible: Option<&str>, index: u32, uuid: &[u8]) -> Option<u32> {
    let Some(list) = visible else {
        return Some(index);
    };
    for (k, e) in list.split(',').map(str::trim).enumerate() {
        if let Ok(i) = e.parse::<u32>() {
            if i == index {
                return Some(k as u32);
            }
        } else if e.len() > 4 && e.starts_with("GPU-") {
            if uuid.starts_with(e.as_bytes()) {
                return Some(k as u32);
            }
        } else {
            return None;
        }
    }
    None
}

/// What a hook gets to work with on one device.
struct Ctx<'a> {
    place: Place,
    /// The ledger the place refers to.
    view: Option<View<'a>>,
    pids: &'a mut PidMap,
    list: &'a mut Vec<Member>,
    /// Process slots of the slice (as of the ledger generation last seen).
    members: &'a [u16],
}

/// Run `f` with the caller's place on device `dev`; `None` when NVML cannot describe the
/// device (the caller then keeps the real answer).
fn with_place<R>(dev: nvmlDevice_t, real_total: u64, f: impl FnOnce(Ctx<'_>) -> R) -> Option<R> {
    let mut g = lock_cache();
    let cache = g.as_mut()?;
    let di = cache.dev(dev)?;
    let st = state_if_ready();
    let place = cache.place(st, di, real_total);
    let Cache {
        ro,
        devs,
        pids,
        list,
        ..
    } = cache;
    let view = match st {
        Some(st) => Some(View::of(st.ledger)),
        None => ro.as_ref().map(|r| r.view()),
    };
    Some(f(Ctx {
        place,
        view,
        pids,
        list,
        members: &devs[di].members,
    }))
}

/// `(total, free, used, reserved)` for a device inside a slice, given NVML's own total/free.
fn memory(place: &Place, total: u64, free: u64) -> Option<(u64, u64, u64, u64)> {
    let (Place::Inside {
        memory: Some((limit, used, quota)),
        ..
    }
    | Place::Outside {
        memory: Some((limit, used, quota)),
    }) = *place
    else {
        return None;
    };
    let (t, f) = view_of(quota, limit, used, total, free);
    // v1 `used` counts everything not free (NVML's meaning); v2 splits it into the slice's
    // usage and `reserved`: quota the device cannot give right now.
    let not_free = t.saturating_sub(f);
    let used = if quota { used.min(not_free) } else { not_free };
    Some((t, f, not_free, not_free - used))
}

/// The memory structs NVML fills (`nvmlMemory_t`, `nvmlMemory_v2_t`): what differs between
/// `nvmlDeviceGetMemoryInfo` and its `_v2`.
pub trait MemoryStruct {
    /// NVML's own `(total, free)`.
    fn total_free(&self) -> (u64, u64);
    /// Store the slice's figures: `not_free` = total − free, `reserved` of it quota the
    /// device cannot give right now.
    fn store(&mut self, total: u64, free: u64, not_free: u64, reserved: u64);
}

impl MemoryStruct for nvmlMemory_t {
    fn total_free(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn store(&mut self, total: u64, free: u64, not_free: u64, _reserved: u64) {
        // v1 `used` counts everything not free (NVML's meaning).
        (self.total, self.free, self.used) = (total, free, not_free);
    }
}

impl MemoryStruct for nvmlMemory_v2_t {
    fn total_free(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn store(&mut self, total: u64, free: u64, not_free: u64, reserved: u64) {
        (self.total, self.free) = (total, free);
        (self.used, self.reserved) = (not_free - reserved, reserved);
    }
}

/// `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2` (the struct tells them apart).
pub unsafe fn memory_info<M: MemoryStruct>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut M) -> NvmlReturn,
    dev: nvmlDevice_t,
    mem: *mut M,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(dev, mem) };
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    // SAFETY: mem is non-null (checked above), the program's struct, filled in by NVML's
    // successful call (which accepted its version); ours to overwrite.
    let mem = unsafe { &mut *mem };
    let (total, free) = mem.total_free();
    if let Some(Some((t, f, not_free, reserved))) =
        with_place(dev, total, |c| memory(&c.place, total, free))
    {
        mem.store(t, f, not_free, reserved);
    }
    r
}

/// `f` of the live processes of the caller's slice on `dev`. `None`: outside any slice (pass
/// the real answer through).
fn with_slice_processes<R>(dev: nvmlDevice_t, f: impl FnOnce(&[Member]) -> R) -> Option<R> {
    with_place(dev, 0, |c| {
        let Place::Inside { found, .. } = c.place else {
            return None;
        };
        c.list.clear();
        if let (Some((ld, si)), Some(v)) = (found, c.view) {
            for &slot in c.members {
                let slot = slot as usize;
                let Some(p) = v.process(slot, ld) else {
                    continue;
                };
                if p.slice != Some(si) || !v.is_alive(slot) {
                    continue;
                }
                if let Some(pid) = c.pids.pid_here(&p) {
                    let nvml_pid = if p.pid_ns == INITIAL_PID_NS {
                        Some(p.pid)
                    } else {
                        c.pids.in_initial_namespace().then_some(pid)
                    };
                    c.list.push(Member {
                        pid,
                        bytes: p.charged,
                        nvml_pid,
                    });
                }
            }
        }
        Some(f(c.list))
    })
    .flatten()
}

/// The element types of NVML's process arrays, as the hooked functions' header types them.
pub trait ProcessEntry {
    /// Store entry `k`: the member's pid as the caller sees it and its bytes.
    ///
    /// # Safety
    /// `infos` holds more than `k` entries of the query's layout (the caller's count,
    /// checked by `running_processes`).
    unsafe fn put(infos: *mut Self, k: usize, pid: u32, bytes: u64);
}

/// The unversioned lists, whose header types leave the array untyped: `nvmlProcessInfo_v1_t`.
impl ProcessEntry for c_void {
    unsafe fn put(infos: *mut c_void, k: usize, pid: u32, bytes: u64) {
        let e = ProcessInfoV1 {
            pid,
            used_gpu_memory: bytes,
        };
        // SAFETY: entry k is inside the program's array (this function's contract); unaligned
        // writes ask nothing of the program's alignment.
        unsafe { infos.cast::<ProcessInfoV1>().add(k).write_unaligned(e) };
    }
}

/// The `_v2`/`_v3` lists (one layout).
impl ProcessEntry for nvmlProcessInfo_t {
    unsafe fn put(infos: *mut nvmlProcessInfo_t, k: usize, pid: u32, bytes: u64) {
        let e = nvmlProcessInfo_t {
            pid,
            usedGpuMemory: bytes,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        };
        // SAFETY: as for the v1 entries.
        unsafe { infos.add(k).write_unaligned(e) };
    }
}

/// The accounting pids: a bare pid.
impl ProcessEntry for c_uint {
    unsafe fn put(infos: *mut c_uint, k: usize, pid: u32, _bytes: u64) {
        // SAFETY: as for the v1 entries.
        unsafe { infos.add(k).write_unaligned(pid) };
    }
}

/// What a process query lists inside a slice.
#[derive(Clone, Copy, PartialEq)]
enum Listing {
    /// The slice's processes (compute lists).
    Slice,
    /// Nothing (graphics and MPS lists: slices hold CUDA processes, which the compute lists
    /// show; a neighbour is never shown).
    Nothing,
    /// The slice's processes, while NVML has accounting on (else NVML's own refusal).
    Accounting,
}

/// One process query with NVML's count protocol: `*count` in is the room in `infos`, out the
/// number listed; too little room is `NVML_ERROR_INSUFFICIENT_SIZE` with the number needed.
///
/// # Safety
/// The handler contract for the query `real` is: `count` is null or the program's in/out
/// count, `infos` null or an array of `*count` entries.
unsafe fn running_processes<E: ProcessEntry>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut E) -> NvmlReturn,
    listing: Listing,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut E,
) -> u32 {
    // SAFETY: NVML's query with the program's arguments (this function's contract).
    let pass = || unsafe { real(dev, count, infos) };
    if count.is_null() {
        return pass();
    }
    // SAFETY: count is non-null (checked above), the program's in/out count.
    let cap = unsafe { *count } as usize;
    let answer = with_slice_processes(dev, |list| {
        if listing == Listing::Accounting {
            // Whether NVML keeps accounting on this device at all: it says by its answer to
            // a count query (off or unsupported: its refusal stands).
            let mut n: c_uint = 0;
            // SAFETY: NVML's query with a count of our own and no array.
            let r = unsafe { real(dev, &mut n, core::ptr::null_mut()) };
            if r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE {
                return (r, None);
            }
        }
        let list = if listing == Listing::Nothing {
            &[][..]
        } else {
            list
        };
        if list.len() > cap {
            return (NVML_ERROR_INSUFFICIENT_SIZE, Some(list.len()));
        }
        if !list.is_empty() && infos.is_null() {
            return (NVML_ERROR_INVALID_ARGUMENT, None);
        }
        for (k, m) in list.iter().enumerate() {
            // SAFETY: the caller's array holds cap ≥ list.len() entries.
            unsafe { E::put(infos, k, m.pid, m.bytes) };
        }
        (NVML_SUCCESS, Some(list.len()))
    });
    match answer {
        None => pass(),
        Some((r, n)) => {
            if let Some(n) = n {
                // SAFETY: as above: the program's non-null count, valid for writes.
                unsafe { *count = n as c_uint };
            }
            r
        }
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 entries), `_v2` and `_v3`.
pub unsafe fn compute_processes<E: ProcessEntry>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut E) -> NvmlReturn,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut E,
) -> u32 {
    // SAFETY: the handler contract; E is this query's entry layout (its header type).
    unsafe { running_processes(real, Listing::Slice, dev, count, infos) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses*` and `nvmlDeviceGetMPSComputeRunningProcesses*`:
/// none inside a slice.
pub unsafe fn unlisted_processes<E: ProcessEntry>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut E) -> NvmlReturn,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut E,
) -> u32 {
    // SAFETY: the handler contract; E is this query's entry layout (its header type).
    unsafe { running_processes(real, Listing::Nothing, dev, count, infos) }
}

/// `nvmlDeviceGetAccountingPids`: the slice's processes.
pub unsafe fn accounting_pids(
    real: pfn::nvmlDeviceGetAccountingPids,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> u32 {
    // SAFETY: the handler contract; the array holds pids.
    unsafe { running_processes(real, Listing::Accounting, dev, count, pids) }
}

/// `nvmlDeviceGetAccountingStats`: inside a slice, only for its own processes (pids as the
/// caller sees them, asked of NVML by the pid it knows).
pub unsafe fn accounting_stats(
    real: pfn::nvmlDeviceGetAccountingStats,
    dev: nvmlDevice_t,
    pid: c_uint,
    stats: *mut c_void,
) -> u32 {
    let answer = with_slice_processes(dev, |list| {
        list.iter().find(|m| m.pid == pid).and_then(|m| m.nvml_pid)
    });
    match answer {
        // SAFETY: the handler contract: `real` with the program's arguments.
        None => unsafe { real(dev, pid, stats) },
        // SAFETY: as above, with the member's pid as NVML knows it.
        Some(Some(nvml_pid)) => unsafe { real(dev, nvml_pid, stats) },
        // A neighbour, a process gone, or one NVML could not be asked about by its pid.
        Some(None) => NVML_ERROR_NOT_FOUND,
    }
}

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
struct ProcessDetailList {
    version: c_uint,
    mode: c_uint,
    num_proc_array_entries: c_uint,
    proc_array: *mut ProcessDetail,
}

/// `nvmlProcessDetail_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessDetail {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
    used_gpu_cc_protected_memory: u64,
}

/// `nvmlProcessDetailList_v1`: the struct's size with the version in the top byte.
const PROCESS_DETAIL_LIST_V1: c_uint = size_of::<ProcessDetailList>() as c_uint | (1 << 24);
/// `NVML_PROCESS_MODE_COMPUTE`; graphics (1) and MPS (2) list nothing inside a slice.
const PROCESS_MODE_COMPUTE: c_uint = 0;
const PROCESS_MODE_MPS: c_uint = 2;

/// `nvmlDeviceGetRunningProcessDetailList`: the v1 list, with the same count protocol
/// (`numProcArrayEntries` in and out). Inside a slice a version this shim does not know is
/// refused (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH`) rather than passed through unfiltered.
pub unsafe fn process_detail_list(
    real: pfn::nvmlDeviceGetRunningProcessDetailList,
    dev: nvmlDevice_t,
    plist: *mut c_void,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dev, plist) };
    let list = plist.cast::<ProcessDetailList>();
    if list.is_null() {
        return pass();
    }
    // SAFETY: list is non-null (checked above): the program's struct, whose first fields
    // (version, mode, count, array) every version shares.
    let (version, mode, cap, array) = unsafe {
        (
            (*list).version,
            (*list).mode,
            (*list).num_proc_array_entries as usize,
            (*list).proc_array,
        )
    };
    let answer = with_slice_processes(dev, |procs| {
        if version != PROCESS_DETAIL_LIST_V1 {
            return (NVML_ERROR_ARGUMENT_VERSION_MISMATCH, None);
        }
        let procs = match mode {
            PROCESS_MODE_COMPUTE => procs,
            1..=PROCESS_MODE_MPS => &[][..],
            _ => return (NVML_ERROR_INVALID_ARGUMENT, None),
        };
        if procs.len() > cap || (!procs.is_empty() && array.is_null()) {
            return (NVML_ERROR_INSUFFICIENT_SIZE, Some(procs.len()));
        }
        for (k, m) in procs.iter().enumerate() {
            let d = ProcessDetail {
                pid: m.pid,
                used_gpu_memory: m.bytes,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
                used_gpu_cc_protected_memory: 0,
            };
            // SAFETY: the caller's array holds cap ≥ procs.len() entries.
            unsafe { array.add(k).write_unaligned(d) };
        }
        (NVML_SUCCESS, Some(procs.len()))
    });
    match answer {
        None => pass(),
        Some((r, n)) => {
            if let Some(n) = n {
                // SAFETY: the program's non-null struct (checked above), valid for writes.
                unsafe { (*list).num_proc_array_entries = n as c_uint };
            }
            r
        }
    }
}

/// The slice's compute figures on `dev`: (its used fraction, the device's), `None` outside.
fn slice_compute(dev: nvmlDevice_t) -> Option<(f64, f64)> {
    with_place(dev, 0, |c| match (c.place, c.view) {
        (Place::Outside { .. }, _) => None,
        (
            Place::Inside {
                found: Some((ld, si)),
                ..
            },
            Some(v),
        ) => Some((
            v.slice(si).map_or(0.0, |s| s.compute_used),
            v.device(ld).map_or(0.0, |d| d.compute_used),
        )),
        (Place::Inside { .. }, _) => Some((0.0, 0.0)),
    })
    .flatten()
}

fn percent(f: f64) -> c_uint {
    (f.clamp(0.0, 1.0) * 100.0).round() as c_uint
}

/// `nvmlDeviceGetUtilizationRates`: the slice's share of the device's time; memory-controller
/// use is the device's, in the proportion of the slice's part of the device's GPU time.
pub unsafe fn utilization_rates(
    real: pfn::nvmlDeviceGetUtilizationRates,
    dev: nvmlDevice_t,
    util: *mut nvmlUtilization_t,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(dev, util) };
    if r != NVML_SUCCESS || util.is_null() {
        return r;
    }
    if let Some((mine, all)) = slice_compute(dev) {
        // SAFETY: util is non-null (checked above), the program's struct, filled in by NVML's
        // successful call; ours to overwrite.
        let util = unsafe { &mut *util };
        let mem = if all > 0.0 {
            (util.memory as f64 * (mine / all).min(1.0)).round() as c_uint
        } else {
            0
        };
        util.gpu = percent(mine);
        util.memory = mem.min(100);
    }
    r
}

/// The slice's per-process utilisation samples on `dev`, newer than `last_seen` (µs since the
/// epoch): one per live process of the slice while the slice used the device over the
/// scheduler's window, the slice's share divided evenly between them (the ledger measures GPU
/// time per slice). Written with `write(k, pid, time stamp, sm %)` into a buffer of `cap`
/// entries (`ok`: the buffer is there). `(status, count)`: `NVML_ERROR_NOT_FOUND` (no samples:
/// an idle slice), `NVML_ERROR_INSUFFICIENT_SIZE` with the count needed, or success.
/// `None`: outside any slice.
fn utilization_samples(
    dev: nvmlDevice_t,
    last_seen: u64,
    cap: usize,
    ok: bool,
    mut write: impl FnMut(usize, u32, u64, c_uint),
) -> Option<(u32, usize)> {
    let (mine, _) = slice_compute(dev)?;
    let now_us = {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid out-parameter.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
    };
    let busy = percent(mine) > 0 && now_us > last_seen;
    let answer = with_slice_processes(dev, |list| {
        let n = if busy { list.len() } else { 0 };
        if n == 0 {
            return (NVML_ERROR_NOT_FOUND, 0);
        }
        if !ok || cap < n {
            return (NVML_ERROR_INSUFFICIENT_SIZE, n);
        }
        let each = percent(mine / n as f64);
        for (k, m) in list.iter().enumerate() {
            write(k, m.pid, now_us, each);
        }
        (NVML_SUCCESS, n)
    });
    Some(answer.unwrap_or((NVML_ERROR_NOT_FOUND, 0)))
}

/// `nvmlDeviceGetProcessUtilization` (see [`utilization_samples`]).
pub unsafe fn process_utilization(
    real: pfn::nvmlDeviceGetProcessUtilization,
    dev: nvmlDevice_t,
    samples: *mut c_void,
    count: *mut c_uint,
    last_seen: u64,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dev, samples, count, last_seen) };
    if count.is_null() {
        return pass();
    }
    // SAFETY: count is non-null (checked above), the program's in/out count.
    let cap = unsafe { *count } as usize;
    let out = samples.cast::<ProcessUtilizationSample>();
    let answer = utilization_samples(dev, last_seen, cap, !out.is_null(), |k, pid, ts, sm| {
        let s = ProcessUtilizationSample {
            pid,
            time_stamp: ts,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        };
        // SAFETY: the caller's buffer holds cap > k samples (checked by utilization_samples).
        unsafe { out.add(k).write_unaligned(s) };
    });
    match answer {
        None => pass(),
        Some((r, n)) => {
            if r != NVML_ERROR_NOT_FOUND {
                // SAFETY: as above: the program's non-null count, valid for writes.
                unsafe { *count = n as c_uint };
            }
            r
        }
    }
}

/// `nvmlProcessesUtilizationInfo_v1_t`.
#[repr(C)]
struct ProcessesUtilizationInfo {
    version: c_uint,
    process_samples_count: c_uint,
    last_seen_time_stamp: u64,
    proc_util_array: *mut ProcessUtilizationInfo,
}

/// `nvmlProcessUtilizationInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessUtilizationInfo {
    time_stamp: u64,
    pid: c_uint,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
    jpg_util: c_uint,
    ofa_util: c_uint,
}

/// `nvmlProcessesUtilizationInfo_v1`.
const PROCESSES_UTILIZATION_INFO_V1: c_uint =
    size_of::<ProcessesUtilizationInfo>() as c_uint | (1 << 24);

/// `nvmlDeviceGetProcessesUtilizationInfo` (the versioned form of the same samples). Inside a
/// slice a struct version this shim does not know is refused, never passed through.
pub unsafe fn processes_utilization_info(
    real: pfn::nvmlDeviceGetProcessesUtilizationInfo,
    dev: nvmlDevice_t,
    info: *mut c_void,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dev, info) };
    let p = info.cast::<ProcessesUtilizationInfo>();
    if p.is_null() {
        return pass();
    }
    if slice_compute(dev).is_none() {
        return pass();
    }
    // SAFETY: p is non-null (checked above), the program's struct; every version starts with
    // its version word.
    if unsafe { (*p).version } != PROCESSES_UTILIZATION_INFO_V1 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: p is non-null and, by its version, a v1 struct (checked above).
    let (cap, last, out) = unsafe {
        (
            (*p).process_samples_count as usize,
            (*p).last_seen_time_stamp,
            (*p).proc_util_array,
        )
    };
    let answer = utilization_samples(dev, last, cap, !out.is_null(), |k, pid, ts, sm| {
        let s = ProcessUtilizationInfo {
            time_stamp: ts,
            pid,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
            jpg_util: 0,
            ofa_util: 0,
        };
        // SAFETY: the caller's array holds cap > k entries (checked by utilization_samples).
        unsafe { out.add(k).write_unaligned(s) };
    });
    match answer {
        None => pass(),
        Some((r, n)) => {
            if r != NVML_ERROR_NOT_FOUND {
                // SAFETY: the program's non-null v1 struct (checked above), valid for writes.
                unsafe { (*p).process_samples_count = n as c_uint };
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &[u8] = b"GPU-1234abcd-0000-0000-0000-000000000001";

    #[test]
    fn visible_devices_map_nvml_to_cuda_ordinals() {
        assert_eq!(cuda_ordinal(None, 3, U), Some(3));
        assert_eq!(cuda_ordinal(Some("2,3"), 3, U), Some(1));
        assert_eq!(cuda_ordinal(Some("2"), 3, U), None);
        assert_eq!(cuda_ordinal(Some(""), 0, U), None);
        assert_eq!(cuda_ordinal(Some("0, GPU-1234"), 5, U), Some(1));
        assert_eq!(cuda_ordinal(Some("GPU-9999"), 0, U), None);
        // CUDA stops at the first entry it cannot read.
        assert_eq!(cuda_ordinal(Some("1,x,0"), 0, U), None);
        assert_eq!(cuda_ordinal(Some("MIG-abc"), 0, U), None);
    }

    #[test]
    fn memory_inside_a_slice() {
        let inside = |limit, used, quota| Place::Inside {
            memory: Some((limit, used, quota)),
            found: None,
        };
        // Quota 1 GiB, 256 MiB used, the device has plenty: v2 used + free = total.
        let (t, f, nf, res) =
            memory(&inside(1 << 30, 256 << 20, true), 16 << 30, 10 << 30).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 768 << 20, 256 << 20, 0));
        // The device has less free than the quota has left: free follows the device, the
        // gap is v2 `reserved`, v1 `used` counts it (NVML's v1 meaning).
        let (t, f, nf, res) =
            memory(&inside(1 << 30, 256 << 20, true), 16 << 30, 512 << 20).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 512 << 20, 512 << 20, 256 << 20));
        // Usage past the quota (a hostile counter): never negative.
        let (t, f, nf, res) = memory(&inside(1 << 30, u64::MAX, true), 16 << 30, 8 << 30).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 0, 1 << 30, 0));
        // Best effort: the device's total, free capped by what is not reserved.
        let (t, f, nf, _) = memory(&inside(4 << 30, 1 << 30, false), 16 << 30, 10 << 30).unwrap();
        assert_eq!((t, f, nf), (16 << 30, 3 << 30, 13 << 30));
        assert!(memory(&Place::Outside { memory: None }, 16 << 30, 1).is_none());
        // A CUDA process outside any slice: its best-effort figures, as CUDA reports them.
        let (t, f, _, _) = memory(
            &Place::Outside {
                memory: Some((4 << 30, 1 << 30, false)),
            },
            16 << 30,
            10 << 30,
        )
        .unwrap();
        assert_eq!((t, f), (16 << 30, 3 << 30));
        assert!(memory(
            &Place::Inside {
                memory: None,
                found: None
            },
            16 << 30,
            1
        )
        .is_none());
    }

    #[test]
    fn percentages_are_clamped() {
        assert_eq!(percent(0.424), 42);
        assert_eq!(percent(7.0), 100);
        assert_eq!(percent(-1.0), 0);
        assert_eq!(percent(f64::NAN), 0);
    }
}
