//! Node mode: reserved memory held physically ("balloons"; docs/security.md, "Reserved memory is
//! held"). The shim's quota is software: a program without it, or one that scribbles its own
//! slice's counters, could take memory another slice reserved, and the driver would let it. So
//! the monitor itself holds, on each GPU, every quota slice's reserved-but-unused memory
//! (`limit - used`, in pieces of at most [`CHUNK`]) through the real driver: what no slice
//! uses and no best-effort allowance may take is not free, and the driver answers
//! `CUDA_ERROR_OUT_OF_MEMORY` to anyone who asks for it.
//!
//! - **Handing back** ([`Balloons::release`]): a slice's process whose allocation the driver
//!   refuses (the device is physically full) asks the monitor over `monitor.sock` (op
//!   `release`) and retries; the monitor frees pieces of *that process's own slice's* balloon
//!   (the slice the policy says it joined) and holds off re-inflating every balloon for
//!   [`QUIET`], so the requester gets them. Nothing changes on the hot path: the shim asks only
//!   when the driver already said out of memory.
//! - **Taking again, with hysteresis** ([`Balloons::tick`], every monitor tick): a balloon is
//!   refilled when it holds [`SLACK`] or more below its slice's unused reservation, and
//!   emptied down to it when it holds `SLACK` or more above (usage grew from memory nobody
//!   reserved); a slice's usage moving by less changes nothing.
//! - **The monitor dies**: the driver frees its memory with the process: the balloons fall away
//!   and the quotas go on in software (the shim's counters); a shim that finds the driver full
//!   and no monitor to ask says so once. **It restarts**: the first tick holds again what is
//!   physically free, never memory a process holds (a process charges its slice before it
//!   allocates, so an allocation in flight is outside `limit - used`).
//! - **Contexts** ([`Balloons::admitted`]): a CUDA context takes device memory, and each is
//!   charged to its slice inside the quota (`Device::context_bytes`, `shim/src/contexts.rs`),
//!   so the balloon holds `limit - used` with contexts in `used`. The admission of a process
//!   hands one context's charge of its slice's balloon back at once (the release path above),
//!   so the context it is about to create finds the memory without the slow path.
//! - **Off**: `gpuslice monitor --balloons off`.

use crate::error::{DriverError, RequestError};
use gpuslice_abi::{pfn, CUcontext, CUdevice, CUdeviceptr, CUuuid, CUDA_SUCCESS};
use gpuslice_ledger::layout::{NO_LIMIT, STATE_ACTIVE};
use gpuslice_ledger::node::Policy;
use gpuslice_ledger::region::Regions;
use gpuslice_ledger::Ledger;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The largest piece a balloon allocates (fewer, larger pieces: fewer driver calls; smaller:
/// finer hand-backs).
pub const CHUNK: u64 = 256 << 20;
/// Hysteresis: a balloon is changed by the tick only when it is this far from its target.
pub const SLACK: u64 = 64 << 20;
/// After a hand-back, no balloon is refilled for this long: the requester retries first.
pub const QUIET: Duration = Duration::from_millis(250);

/// The driver entry points the balloons use, from `libcuda.so.1` (never linked).
struct Driver {
    alloc: pfn::cuMemAlloc_v2,
    free: pfn::cuMemFree_v2,
    set_current: pfn::cuCtxSetCurrent,
}

/// One slice's balloon.
#[derive(Default)]
struct Held {
    /// The slice record's identity when it was filled (a freed and reused record is another
    /// slice): device UUID and name.
    owner: (String, String),
    /// Device pointers and their sizes.
    pieces: Vec<(CUdeviceptr, u64)>,
}

impl Held {
    fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.1).sum()
    }
}

struct State {
    /// By slice record.
    held: HashMap<usize, Held>,
    /// No refilling before this (after a hand-back).
    quiet_until: Instant,
    /// Slices whose balloon could not be filled, said once each until it can.
    short: HashSet<usize>,
}

/// The monitor's balloons on every GPU the driver shows.
pub struct Balloons {
    drv: Driver,
    /// Device UUID to its primary context (an address, kept as an integer to be `Send`).
    ctxs: HashMap<String, usize>,
    state: Mutex<State>,
}

/// Resolve `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
/// `lib` is a live `dlopen` handle and `T` is the C signature of `name`.
unsafe fn sym<T: Copy>(lib: *mut libc::c_void, name: &'static str) -> Result<T, DriverError> {
    let c = std::ffi::CString::new(name).map_err(|_| DriverError::Missing(name))?;
    // SAFETY: live handle and NUL-terminated name (this function's contract).
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        return Err(DriverError::Missing(name));
    }
    // SAFETY: a non-null symbol of the signature `T` (this function's contract); function
    // pointers and data pointers have one size on every platform the driver exists for.
    Ok(unsafe { core::mem::transmute_copy::<*mut libc::c_void, T>(&p) })
}

impl Balloons {
    /// Load the driver, initialise it and retain every device's primary context. `Err` says
    /// why balloons cannot be held (no driver): the monitor then warns and goes on without.
    pub fn open() -> Result<Balloons, DriverError> {
        // SAFETY: dlopen with a constant NUL-terminated name; the handle is checked.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err(DriverError::NotLoaded);
        }
        type Entry = (
            pfn::cuInit,
            pfn::cuDeviceGetCount,
            pfn::cuDeviceGet,
            pfn::cuDeviceGetUuid_v2,
            pfn::cuDevicePrimaryCtxRetain,
        );
        // SAFETY: for all `sym` calls: a live handle; each type is the entry point's signature
        // from gpuslice_abi::pfn. The handle is never closed (the driver stays for the process).
        let (init, count, get, uuid, retain): Entry = unsafe {
            (
                sym(lib, "cuInit")?,
                sym(lib, "cuDeviceGetCount")?,
                sym(lib, "cuDeviceGet")?,
                sym(lib, "cuDeviceGetUuid_v2").or_else(|_| sym(lib, "cuDeviceGetUuid"))?,
                sym(lib, "cuDevicePrimaryCtxRetain")?,
            )
        };
        // SAFETY: as above.
        let drv = unsafe {
            Driver {
                alloc: sym(lib, "cuMemAlloc_v2")?,
                free: sym(lib, "cuMemFree_v2")?,
                set_current: sym(lib, "cuCtxSetCurrent")?,
            }
        };
        let check = |call: &'static str, code| {
            if code == CUDA_SUCCESS {
                Ok(())
            } else {
                Err(DriverError::Failed { call, code })
            }
        };
        // SAFETY: the driver's functions with valid out-parameters (locals) throughout.
        check("cuInit", unsafe { init(0) })?;
        let mut n = 0;
        // SAFETY: as above.
        check("cuDeviceGetCount", unsafe { count(&mut n) })?;
        let mut ctxs = HashMap::new();
        for ord in 0..n {
            let mut dev: CUdevice = 0;
            // SAFETY: as above; `ord` is below the count.
            check("cuDeviceGet", unsafe { get(&mut dev, ord) })?;
            let mut u = CUuuid::default();
            // SAFETY: as above.
            check("cuDeviceGetUuid", unsafe { uuid(&mut u, dev) })?;
            let mut ctx: CUcontext = core::ptr::null_mut();
            // SAFETY: as above.
            check("cuDevicePrimaryCtxRetain", unsafe { retain(&mut ctx, dev) })?;
            ctxs.insert(gpuslice_abi::uuid_text(&u), ctx as usize);
        }
        Ok(Balloons {
            drv,
            ctxs,
            state: Mutex::new(State {
                held: HashMap::new(),
                quiet_until: Instant::now(),
                short: HashSet::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make `uuid`'s context current on this thread; false for a device the driver lacks.
    fn enter(&self, uuid: &str) -> bool {
        let Some(&ctx) = self.ctxs.get(uuid) else {
            return false;
        };
        // SAFETY: a primary context this process retained (never released).
        unsafe { (self.drv.set_current)(ctx as CUcontext) == CUDA_SUCCESS }
    }

    /// Allocate one piece of `bytes` on the current context.
    fn alloc(&self, bytes: u64) -> Option<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: the driver's allocator with a valid out-parameter.
        let r = unsafe { (self.drv.alloc)(&mut p, bytes as usize) };
        (r == CUDA_SUCCESS).then_some(p)
    }

    /// Free the last pieces of `h` (on the current context) until it holds at most `keep`, or
    /// at least `free` bytes were freed; the bytes freed.
    fn shrink(&self, h: &mut Held, keep: u64, free: u64) -> u64 {
        let mut freed = 0;
        while h.bytes() > keep || freed < free {
            let Some((p, n)) = h.pieces.pop() else { break };
            // SAFETY: a pointer this process allocated on the current context, freed once.
            unsafe { (self.drv.free)(p) };
            freed += n;
        }
        freed
    }

    /// Bring every quota slice's balloon to its unused reservation, within [`SLACK`]; free the
    /// balloons of slices that are gone. Monitor tick only. Log lines, each with the device
    /// UUID when it says a balloon cannot be filled (the device is physically full: memory
    /// taken outside gpuslice, which the caller names).
    pub fn tick(&self, ledger: &Ledger, regions: &dyn Regions) -> Vec<(String, Option<String>)> {
        let mut lines = vec![];
        let mut st = self.lock();
        let quiet = Instant::now() < st.quiet_until;
        let mut live = HashSet::new();
        for (si, s) in ledger.slices().iter().enumerate() {
            let limit = s.memory_limit.load(SeqCst);
            if s.state.load(SeqCst) != STATE_ACTIVE || limit == NO_LIMIT {
                continue;
            }
            let Some(d) = ledger.devices().get(s.device.load(SeqCst) as usize) else {
                continue;
            };
            let owner = (d.uuid.get(), s.name.get());
            if !self.enter(&owner.0) {
                continue;
            }
            live.insert(si);
            // The slice's usage is its region's counter (hostile: clamped); a slice without a
            // region yet (an operator's, no process) uses nothing.
            let used = regions
                .get(si as u32)
                .map_or(0, |r| r.header().memory_used.load(SeqCst))
                .min(limit);
            let want = limit - used;
            let h = st.held.entry(si).or_default();
            if h.owner != owner {
                self.shrink(h, 0, 0);
                h.owner = owner;
            }
            let have = h.bytes();
            let mut changed = false;
            if have >= want.saturating_add(SLACK) {
                self.shrink(h, want, 0);
                changed = true;
            }
            let have = h.bytes();
            if (changed || have.saturating_add(SLACK) <= want || have == 0) && !quiet {
                let mut missing = want.saturating_sub(have);
                // Said before it is taken: the slice's processes add what the balloon holds to
                // the driver's free memory (`cuMemGetInfo`), so a piece the driver no longer
                // counts free must already be in the word (counted twice for a moment at
                // most, never missing); the word is settled below.
                ledger.record_balloon(si, want);
                while missing > 0 {
                    let n = missing.min(CHUNK);
                    match self.alloc(n) {
                        Some(p) => h.pieces.push((p, n)),
                        None => break,
                    }
                    missing -= n;
                }
                let name = h.owner.1.clone();
                let uuid = h.owner.0.clone();
                if missing >= SLACK {
                    if st.short.insert(si) {
                        lines.push((
                            format!(
                                "balloons: cannot hold {} of slice {name:?}'s unused reservation \
                                 on {uuid}: the device is physically full; retrying every tick",
                                crate::table::size(missing)
                            ),
                            Some(uuid),
                        ));
                    }
                } else if st.short.remove(&si) {
                    lines.push((
                        format!(
                            "balloons: slice {name:?}'s unused reservation on {uuid} is held again"
                        ),
                        None,
                    ));
                }
            }
            // What the slice's processes are told is free beyond the driver's free memory.
            ledger.record_balloon(si, st.held.get(&si).map_or(0, Held::bytes));
        }
        let gone: Vec<usize> = st
            .held
            .keys()
            .copied()
            .filter(|k| !live.contains(k))
            .collect();
        for si in gone {
            if let Some(mut h) = st.held.remove(&si) {
                if self.enter(&h.owner.0) {
                    self.shrink(&mut h, 0, 0);
                }
            }
            ledger.record_balloon(si, 0);
            st.short.remove(&si);
        }
        lines
    }

    /// A process of slice `si` on device `uuid` found the driver full: free at least `bytes` of
    /// that slice's balloon (whole pieces) and hold off refilling for [`QUIET`]. The bytes
    /// freed (0: the balloon holds nothing there; the device is full for other reasons).
    pub fn release(&self, ledger: &Ledger, si: usize, uuid: &str, bytes: u64) -> u64 {
        let mut st = self.lock();
        let Some(h) = st.held.get_mut(&si) else {
            return 0;
        };
        if h.owner.0 != uuid || !self.enter(uuid) {
            return 0;
        }
        let keep = h.bytes();
        let freed = self.shrink(h, keep, bytes.max(1));
        ledger.record_balloon(si, h.bytes());
        st.quiet_until = Instant::now() + QUIET;
        freed
    }

    /// The `release` request of an admitted process (`pid` in the monitor's namespace, with
    /// its start time at accept): free at least `bytes` of the balloon of the slice the policy
    /// says it joined on device `uuid`. Only its own slice: nothing it sends names a slice. The
    /// bytes freed.
    pub fn release_for(
        &self,
        ledger: &Policy,
        pid: u32,
        start_time: u64,
        uuid: &str,
        bytes: u64,
    ) -> Result<u64, RequestError> {
        let dev = ledger
            .find_device(uuid)
            .ok_or_else(|| RequestError::UnknownDevice(uuid.to_string()))?;
        let me = ledger
            .admitted_slot(pid, start_time)
            .ok_or(RequestError::NotAdmitted("ask for its slice's memory"))?;
        let si = ledger
            .slice_of(me, dev)
            .ok_or(RequestError::BadDeviceIndex)?;
        Ok(self.release(ledger, si, uuid, bytes))
    }

    /// A process was just admitted to slice `si` (the policy's record): hand back one
    /// context's charge of its slice's balloon ([`Balloons::release`]), which the driver takes
    /// when the process creates its context (charged to the slice first). The bytes freed.
    pub fn admitted(&self, ledger: &Ledger, si: usize) -> u64 {
        let Some(s) = ledger.slices().get(si) else {
            return 0;
        };
        let Some(d) = ledger.devices().get(s.device.load(SeqCst) as usize) else {
            return 0;
        };
        let room = d.context_bytes.load(SeqCst);
        if room == 0 || s.memory_limit.load(SeqCst) == NO_LIMIT {
            return 0;
        }
        self.release(ledger, si, &d.uuid.get(), room)
    }

    /// What the balloons hold per device UUID, for the log and metrics.
    pub fn held(&self) -> HashMap<String, u64> {
        let mut m: HashMap<String, u64> = HashMap::new();
        for h in self.lock().held.values() {
            *m.entry(h.owner.0.clone()).or_default() += h.bytes();
        }
        m
    }
}
