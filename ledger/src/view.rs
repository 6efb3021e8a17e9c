//! A read-only view of the node ledger: what a slice holds, for processes that only look.
//!
//! The NVML side of the shim (`nvidia-smi`, `nvitop`, pynvml inside a slice) must report a
//! slice exactly as its CUDA processes see it, without ever creating the ledger or taking a
//! process slot. So:
//! - [`ReadOnlyLedger::open`] maps the file `O_RDONLY` / `PROT_READ` after the same version and
//!   size checks as [`Ledger::open`]; a missing file is `Ok(None)`, not an error, and nothing
//!   (directory, file, lock) is ever created.
//! - [`View`] answers the lookups, over a read-only mapping ([`ReadOnlyLedger::view`]) or over
//!   a ledger the caller already has ([`View::of`]), so a process that also attached gets the
//!   very same numbers: a device by UUID, a slice by name and device ([`SliceView`]: quota,
//!   usage, compute_used), the processes of a slice ([`ProcView`]: pid, PID namespace, charge).
//!   Lookups allocate nothing; [`View::generation`] tells a cache when to look again.
//! - [`PidMap`] turns a ledger process into the pid *the caller* sees: a process records its
//!   pid in its own namespace, its namespace's inode and its start time; a reader in another
//!   namespace finds it in its own `/proc` (or learns it cannot see it).
//!
//! Where node mode plugs in: the hot-path words (`Slice::memory_used`, `ProcDevice::charged`,
//! the scheduler windows behind `compute_used`) are read only in [`View::slice`],
//! [`View::process`] and [`View::device`], and liveness only in [`View::is_alive`]; a view over
//! the root-owned policy file plus a slice's read-only region replaces those reads, and every
//! caller (the shim's NVML hooks) stays as it is.
//!
//! Everything read here is untrusted input: any process that can write the file can put any
//! bytes in it. Indices read from it are bounds-checked before use, usage is clamped to its
//! quota, device sums to the device, fractions to `0..=1`, and a pid is only reported after
//! the reader's own `/proc` confirmed it (start time and namespace).
//!
//! ```
//! use gpuslice_ledger::view::{ReadOnlyLedger, View};
//! use gpuslice_ledger::{Ledger, SliceRequest};
//! let dir = std::env::temp_dir().join(format!("gpuslice-viewdoc-{}", std::process::id()));
//! assert!(ReadOnlyLedger::open(&dir).unwrap().is_none()); // no ledger: nothing created
//! assert!(!dir.exists());
//! let ledger = Ledger::open_or_create(&dir).unwrap();
//! let dev = ledger.ensure_device("GPU-00000000-0000-0000-0000-000000000007", "Fake", 8 << 30).unwrap();
//! let me = ledger.attach("job").unwrap();
//! let req = SliceRequest::new(Some("job"), Some(1 << 30));
//! ledger.join(me, dev, &req).unwrap();
//! assert!(ledger.account(me, dev).unwrap().try_charge(256 << 20));
//!
//! let ro = ReadOnlyLedger::open(&dir).unwrap().unwrap();
//! let v = ro.view();
//! let d = v.find_device(b"GPU-00000000-0000-0000-0000-000000000007").unwrap();
//! let s = v.slice(v.find_slice(b"job", d).unwrap()).unwrap();
//! assert_eq!((s.memory_limit, s.memory_used), (Some(1 << 30), 256 << 20));
//! let p = v.members(s.index).next().and_then(|slot| v.process(slot, d)).unwrap();
//! assert_eq!((p.pid, p.charged), (std::process::id(), 256 << 20));
//! # ledger.detach(me).unwrap();
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use crate::error::LedgerError;
use crate::file::{self, Mapping};
use crate::layout::*;
use crate::ledger::Ledger;
use crate::procfs::{ns_pids, pid_ns_of, INITIAL_PID_NS};
use core::sync::atomic::Ordering::{Acquire, Relaxed};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The ledger file mapped read-only. Dropping it unmaps and closes; it never held a lock.
pub struct ReadOnlyLedger {
    m: Mapping,
    dev: u64,
    ino: u64,
}

impl ReadOnlyLedger {
    /// Map the ledger in `dir` read-only. `Ok(None)` when there is no ledger file (or no
    /// directory); errors are real problems (a file of another version, unreadable).
    pub fn open(dir: &Path) -> Result<Option<ReadOnlyLedger>, LedgerError> {
        let m = match file::open_read_only(dir) {
            Ok(m) => m,
            Err(LedgerError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        // SAFETY: st is plain data; m.fd is the open ledger.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let (dev, ino) = if unsafe { libc::fstat(m.fd, &mut st) } == 0 {
            (st.st_dev, st.st_ino)
        } else {
            (0, 0)
        };
        Ok(Some(ReadOnlyLedger { m, dev, ino }))
    }

    /// Whether `dir/ledger` is still the file this maps (false once it was removed or
    /// replaced: the caller should open again).
    pub fn is_current(&self, dir: &Path) -> bool {
        std::fs::metadata(dir.join("ledger"))
            .is_ok_and(|md| md.dev() == self.dev && md.ino() == self.ino)
    }

    /// The lookups.
    pub fn view(&self) -> View<'_> {
        // SAFETY: the mapping is FILE_SIZE bytes holding a Header at 0 and the record arrays at
        // their offsets (size and version checked when opened); every field is an atomic or a
        // byte array, read-only here, valid for as long as `self` lives.
        unsafe {
            View {
                header: &*self.m.base.cast::<Header>(),
                devices: &*self.m.base.add(DEVICES_OFFSET).cast(),
                slices: &*self.m.base.add(SLICES_OFFSET).cast(),
                procs: &*self.m.base.add(PROCS_OFFSET).cast(),
                alive: Alive::Fd(self.m.fd),
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Alive<'a> {
    /// Ask the kernel through this descriptor (we hold no liveness lock of our own on it).
    Fd(libc::c_int),
    /// The ledger this process attached through (it knows its own slot).
    Ledger(&'a Ledger),
}

/// Read-only lookups over a mapped ledger. Cheap to copy; allocates nothing.
#[derive(Clone, Copy)]
pub struct View<'a> {
    header: &'a Header,
    devices: &'a [Device; MAX_DEVICES],
    slices: &'a [Slice; MAX_SLICES],
    procs: &'a [Proc; MAX_PROCS],
    alive: Alive<'a>,
}

/// A device as the ledger records it (sums clamped to the device).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceView {
    /// Ledger index.
    pub index: usize,
    /// Bytes on the device (as the driver API reported it to the process that registered it).
    pub memory_total: u64,
    /// Σ quotas of its slices (≤ `memory_total`).
    pub memory_reserved: u64,
    /// What best-effort processes hold (≤ `memory_total - memory_reserved`).
    pub best_effort_used: u64,
    /// Fraction of the device's time used over the scheduler's window, all slices (0..=1).
    pub compute_used: f64,
}

impl DeviceView {
    /// What a best-effort process may still take: the unreserved memory not yet used.
    pub fn best_effort_free(&self) -> u64 {
        self.memory_total
            .saturating_sub(self.memory_reserved)
            .saturating_sub(self.best_effort_used)
    }
}

/// A slice on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SliceView {
    /// Slice record index.
    pub index: usize,
    /// Ledger device index (checked `< MAX_DEVICES`).
    pub device: usize,
    /// Quota in bytes; `None` for a best-effort slice (charged to the device's allowance).
    pub memory_limit: Option<u64>,
    /// Bytes the slice holds (quota slices; ≤ the quota). 0 for a best-effort slice: see
    /// [`View::slice_charged`].
    pub memory_used: u64,
    /// Node mode: bytes of its unused reservation the monitor's balloons hold (≤ the quota; 0
    /// for best effort): free to its processes, though not to the driver.
    pub balloon_held: u64,
    /// Guaranteed compute share.
    pub compute_share: Share,
    /// Compute cap.
    pub compute_cap: Cap,
    /// Fraction of the device's time the slice used over the scheduler's window (0..=1).
    pub compute_used: f64,
    /// Created by an operator.
    pub operator_defined: bool,
    /// A process's private slice.
    pub private: bool,
}

/// A process of the ledger, on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcView {
    /// Process record index.
    pub slot: usize,
    /// Its pid in its own PID namespace (as it saw itself).
    pub pid: u32,
    /// Inode of its PID namespace, 0 if unknown.
    pub pid_ns: u64,
    /// Its pid in the namespace of its `/proc` mount (a hint, see [`PidMap`]).
    pub outer_pid: u32,
    /// Its start time (clock ticks since boot), against pid reuse.
    pub start_time: u64,
    /// The slice it joined on this device, if any (checked `< MAX_SLICES`).
    pub slice: Option<usize>,
    /// Bytes it holds on this device.
    pub charged: u64,
}

impl<'a> View<'a> {
    /// The same lookups over a ledger this process opened read-write (and may be attached
    /// to): a process that also uses CUDA sees through NVML exactly what CUDA is told.
    pub fn of(ledger: &'a Ledger) -> View<'a> {
        View {
            header: ledger.header(),
            devices: ledger.devices(),
            slices: ledger.slices(),
            procs: ledger.procs(),
            alive: Alive::Ledger(ledger),
        }
    }

    /// Bumped by every cold-path change (attach, join, slice create/remove, reap): while it
    /// stays the same, device and slice indices and slice membership found before still hold.
    pub fn generation(&self) -> u64 {
        self.header.generation.load(Acquire)
    }

    /// The active device whose UUID is `uuid` (`GPU-...`).
    pub fn find_device(&self, uuid: &[u8]) -> Option<usize> {
        self.devices
            .iter()
            .position(|d| d.state.load(Acquire) == STATE_ACTIVE && d.uuid.eq_bytes(uuid))
    }

    /// Device `index`, if active.
    pub fn device(&self, index: usize) -> Option<DeviceView> {
        let d = self.devices.get(index)?;
        if d.state.load(Acquire) != STATE_ACTIVE {
            return None;
        }
        let total = d.memory_total.load(Relaxed);
        let reserved = d.memory_reserved.load(Relaxed).min(total);
        Some(DeviceView {
            index,
            memory_total: total,
            memory_reserved: reserved,
            best_effort_used: d.best_effort_used.load(Relaxed).min(total - reserved),
            compute_used: d.sched.window.fraction(gpuslice_sched::now_ns()),
        })
    }

    /// The named (not private) active slice called `name` on `device` that this process would
    /// join: the operator's of that name, else its own user's (in node mode tenants' names are
    /// namespaced by owner: `Ledger::slice_for`; a personal ledger's slices are all its user's).
    pub fn find_slice(&self, name: &[u8], device: usize) -> Option<usize> {
        let named = |s: &Slice| {
            s.state.load(Acquire) == STATE_ACTIVE
                && s.private.load(Relaxed) == 0
                && s.device.load(Relaxed) as usize == device
                && s.name.eq_bytes(name)
        };
        let me = crate::dir::euid();
        self.slices
            .iter()
            .position(|s| named(s) && s.operator_defined.load(Relaxed) != 0)
            .or_else(|| {
                self.slices.iter().position(|s| {
                    named(s) && matches!(s.owner_uid.load(Relaxed), o if o == ANY_UID || o == me)
                })
            })
    }

    /// Slice `index`, if active and on a valid device.
    pub fn slice(&self, index: usize) -> Option<SliceView> {
        let s = self.slices.get(index)?;
        if s.state.load(Acquire) != STATE_ACTIVE {
            return None;
        }
        let device = s.device.load(Relaxed) as usize;
        if device >= MAX_DEVICES {
            return None;
        }
        let limit = s.memory_limit.load(Relaxed);
        let memory_limit = (limit != NO_LIMIT).then_some(limit);
        Some(SliceView {
            index,
            device,
            memory_limit,
            memory_used: memory_limit.map_or(0, |l| s.memory_used.0.load(Relaxed).min(l)),
            balloon_held: memory_limit.map_or(0, |l| s.balloon_held.load(Relaxed).min(l)),
            compute_share: s.share(),
            compute_cap: s.cap(),
            compute_used: gpuslice_sched::slice_stats(
                &self.devices[device].sched,
                &s.sched,
                gpuslice_sched::now_ns(),
            )
            .used_fraction,
            operator_defined: s.operator_defined.load(Relaxed) != 0,
            private: s.private.load(Relaxed) != 0,
        })
    }

    /// The slot of every process record (live or awaiting the reaper) that joined slice
    /// `slice` on its device. Walks the process table: cache the result per
    /// [`View::generation`].
    pub fn members(&self, slice: usize) -> impl Iterator<Item = usize> + 'a {
        let device = self
            .slices
            .get(slice)
            .map(|s| s.device.load(Relaxed) as usize)
            .filter(|&d| d < MAX_DEVICES);
        let procs = self.procs;
        (0..MAX_PROCS).filter(move |&i| {
            let Some(d) = device else { return false };
            let p = &procs[i];
            p.state.load(Acquire) != STATE_FREE
                && p.devices[d].slice.load(Relaxed) as usize == slice
        })
    }

    /// Process record `slot` on `device`, if in use.
    pub fn process(&self, slot: usize, device: usize) -> Option<ProcView> {
        let p = self.procs.get(slot)?;
        let pd = p.devices.get(device)?;
        if p.state.load(Acquire) == STATE_FREE {
            return None;
        }
        let slice = pd.slice.load(Relaxed) as usize;
        Some(ProcView {
            slot,
            pid: p.pid.load(Relaxed),
            pid_ns: p.pid_ns.load(Relaxed),
            outer_pid: p.outer_pid.load(Relaxed),
            start_time: p.start_time.load(Relaxed),
            slice: (slice < MAX_SLICES).then_some(slice),
            charged: pd.charged.load(Relaxed),
        })
    }

    /// Whether process record `slot` is active and its process still runs (one `fcntl`).
    pub fn is_alive(&self, slot: usize) -> bool {
        let Some(p) = self.procs.get(slot) else {
            return false;
        };
        if p.state.load(Acquire) != STATE_ACTIVE {
            return false;
        }
        match self.alive {
            Alive::Fd(fd) => file::is_alive(fd, slot),
            Alive::Ledger(l) => l.is_alive(slot),
        }
    }

    /// Σ of what the processes of slice `slice` hold on its device (the usage of a best-effort
    /// slice, which has no counter of its own). Walks the process table.
    pub fn slice_charged(&self, slice: usize) -> u64 {
        let Some(d) = self.slice(slice).map(|s| s.device) else {
            return 0;
        };
        self.members(slice)
            .filter_map(|slot| self.process(slot, d))
            .fold(0u64, |a, p| a.saturating_add(p.charged))
    }
}

/// Translates ledger processes to pids as the calling process sees them, and remembers the
/// answers (a process's namespace never changes, so neither does the answer: each process
/// costs a look in `/proc` once, then nothing).
///
/// A process in the caller's own namespace is shown with the pid it recorded, once `/proc`
/// confirmed it (same start time). One in another namespace is found in the caller's `/proc`
/// by its namespace inode, its innermost pid and its start time (its recorded outer pid is
/// tried first). A process the caller cannot see (a sibling container, or the caller's `/proc`
/// belongs to another namespace than its own) has no pid here: `None`.
pub struct PidMap {
    own_ns: u64,
    /// Our `/proc` is our own namespace's (pids named there are ours).
    own_proc: bool,
    cache: Vec<Known>,
    next: usize,
}

#[derive(Clone, Copy)]
struct Known {
    ns: u64,
    pid: u32,
    start: u64,
    here: Option<u32>,
}

const PID_CACHE: usize = 256;

impl Default for PidMap {
    fn default() -> Self {
        PidMap::new()
    }
}

impl PidMap {
    /// Reads this process's namespace (a few `/proc` reads; allocates the cache once).
    pub fn new() -> PidMap {
        PidMap {
            own_ns: pid_ns_of("self").unwrap_or(0),
            own_proc: ns_pids("self").is_some_and(|v| v.len() == 1),
            cache: Vec::with_capacity(PID_CACHE),
            next: 0,
        }
    }

    /// Whether the caller runs in the initial PID namespace (the host's, whose pids the GPU
    /// driver and NVML use), so that a pid here is the driver's.
    pub fn in_initial_namespace(&self) -> bool {
        self.own_ns == INITIAL_PID_NS
    }

    /// The pid of `p` in the caller's PID namespace, or `None` if the caller cannot see it.
    pub fn pid_here(&mut self, p: &ProcView) -> Option<u32> {
        if let Some(k) = self
            .cache
            .iter()
            .find(|k| k.ns == p.pid_ns && k.pid == p.pid && k.start == p.start_time)
        {
            return k.here;
        }
        let here = self.resolve(p);
        let k = Known {
            ns: p.pid_ns,
            pid: p.pid,
            start: p.start_time,
            here,
        };
        if self.cache.len() < PID_CACHE {
            self.cache.push(k);
        } else {
            self.cache[self.next] = k;
            self.next = (self.next + 1) % PID_CACHE;
        }
        here
    }

    fn resolve(&self, p: &ProcView) -> Option<u32> {
        if p.pid == 0 || p.start_time == 0 {
            return None;
        }
        let same_ns = p.pid_ns != 0 && p.pid_ns == self.own_ns;
        if same_ns {
            // Our namespace: its pid is ours. Confirm it is that process, not a reused pid.
            return (!self.own_proc || file::start_time_of(&p.pid.to_string()) == p.start_time)
                .then_some(p.pid);
        }
        if !self.own_proc || p.pid_ns == 0 {
            return None;
        }
        let is_it = |cand: u32| {
            let c = cand.to_string();
            pid_ns_of(&c) == Some(p.pid_ns)
                && file::start_time_of(&c) == p.start_time
                && ns_pids(&c).and_then(|v| v.last().copied()) == Some(p.pid)
        };
        if p.outer_pid != 0 && p.outer_pid != p.pid && is_it(p.outer_pid) {
            return Some(p.outer_pid);
        }
        let dir = std::fs::read_dir("/proc").ok()?;
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(cand) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // The namespace inode first: one stat rules out nearly every process.
            if pid_ns_of(&cand.to_string()) == Some(p.pid_ns) && is_it(cand) {
                return Some(cand);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
