//! What the NVML hooks remember between calls (the configuration, the devices met, the
//! read-only ledger of an NVML-only process, the pid translations), and the lock around it: a
//! spin lock that a child made by `fork()` can always take (the module comment of `nvml`).
//! Apart because it is the only state the hooks keep, and the only lock they take.

use crate::config::Config;
use crate::log::log;
use crate::real;
use core::cell::UnsafeCell;
use core::ffi::{c_char, c_uint};
use core::sync::atomic::{AtomicBool, Ordering::*};
use gpuslice_abi::*;
use gpuslice_ledger::layout::{MAX_PROCS, UUID_LEN};
use gpuslice_ledger::view::{PidMap, ReadOnlyLedger};
use gpuslice_sched::now_ns;

/// How often an NVML-only process looks for a ledger that is not there yet.
const RETRY_NS: u64 = 200_000_000;
/// How often it checks that the ledger it maps is still the one in the directory.
const RECHECK_NS: u64 = 1_000_000_000;
/// NVML handles remembered (NVML has at most a few dozen devices).
const MAX_HANDLES: usize = 64;

/// One NVML device as this process has met it.
pub(super) struct Dev {
    handle: usize,
    uuid: [u8; UUID_LEN],
    uuid_len: usize,
    /// CUDA ordinal under `CUDA_VISIBLE_DEVICES` (`None`: CUDA cannot see it: real device).
    pub(super) ordinal: Option<u32>,
    /// Ledger generation the lookups below were made at (`u64::MAX`: never).
    pub(super) gen: u64,
    pub(super) ledger_dev: Option<usize>,
    pub(super) slice: Option<usize>,
    /// Process slots of `slice` at `gen`.
    pub(super) members: Vec<u16>,
}

impl Dev {
    pub(super) fn uuid(&self) -> &[u8] {
        &self.uuid[..self.uuid_len]
    }
}

/// Everything the NVML hooks remember. Built on the first hooked call.
pub(super) struct Cache {
    /// `None`: the configuration is invalid (said once; `cuInit` will refuse it).
    pub(super) config: Option<Config>,
    /// The configuration puts this process in a slice (a name, a quota or a share).
    pub(super) in_slice: bool,
    /// `GPUSLICE_SLICE` (or HAMi's shared-cache slice), as bytes.
    pub(super) slice_name: Option<Vec<u8>>,
    /// The read-only ledger of an NVML-only process.
    pub(super) ro: Option<ReadOnlyLedger>,
    /// When to look for (or re-check) the ledger next.
    recheck_at: u64,
    /// An unusable ledger was reported (once).
    warned: bool,
    pub(super) devs: Vec<Dev>,
    pub(super) pids: PidMap,
    /// The list being built: allocated once.
    pub(super) list: Vec<Member>,
}

/// A live process of the caller's slice, as NVML answers show it.
#[derive(Clone, Copy)]
pub(super) struct Member {
    /// Its pid as the caller sees it.
    pub(super) pid: u32,
    /// What the ledger charges it.
    pub(super) bytes: u64,
    /// Its pid as NVML knows it (the initial namespace's), when the shim can tell.
    pub(super) nvml_pid: Option<u32>,
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
pub(super) struct CacheGuard(&'static CacheCell);

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
pub(super) fn lock_cache() -> CacheGuard {
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
    pub(super) fn dev(&mut self, handle: nvmlDevice_t) -> Option<usize> {
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
    pub(super) fn refresh_ledger(&mut self) {
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
}
