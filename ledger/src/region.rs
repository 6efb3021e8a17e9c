//! Node mode: a slice's *region*, the only memory its processes write.
//!
//! The monitor creates one region per slice record (and one best-effort allowance per device) as a
//! `memfd`, sizes it once and seals it (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): nobody,
//! not even a process holding a read-write descriptor, can truncate or grow it, so a mapping
//! of it can never fault with SIGBUS. Processes receive the descriptor over `monitor.sock`
//! (`SCM_RIGHTS`) at admission and map it read-write; no path leads to it, so only the
//! slice's own processes (and root) can reach it. Everything in it is hostile input to the
//! monitor: it clamps what it reads there and never indexes anything with it.
//!
//! What lives here is what the hot paths write: the slice's `memory_used` counter, the
//! allocation statistics, the reaper's `reaping` flag, and per process slot (the slot index is
//! the process's record in the policy, which the monitor chose) its `charged` bytes and its
//! `ops_begun`/`ops_ended` counters (see `account.rs`), plus the compute scheduler's per-slice
//! and per-process words ([`SchedSlice`], [`SchedProc`]; in node mode the turns the monitor
//! grants are asked for in [`GrantProc`], per process, since a best-effort process's region is
//! its user's allowance, shared by several slices).

use crate::error::LedgerError;
use crate::layout::{CacheLine, MAX_PROCS};
use core::mem::size_of;
use core::sync::atomic::{AtomicU32, AtomicU64};
use gpuslice_sched::{GrantProc, SchedProc, SchedSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// First bytes of a region.
pub const REGION_MAGIC: [u8; 8] = *b"GSREGION";

/// The region's header and slice-wide words.
#[repr(C, align(64))]
pub struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: [u8; 8],
    /// [`crate::layout::LAYOUT_VERSION`].
    pub layout_version: u32,
    /// Which record it belongs to: a slice index, or `u32::MAX - d` for device `d`'s
    /// best-effort allowance. Written by the monitor before any process sees the region.
    pub key: u32,
    /// The policy's generation of that record when the region was made (recovery check).
    pub created: u64,
    /// Non-zero while the monitor's reaper settles the counter (hot paths pause, bounded).
    pub reaping: AtomicU32,
    /// Padding.
    pub _pad: u32,
    /// Allocations refused for the quota.
    pub alloc_denied_total: AtomicU64,
    /// Allocations charged (count).
    pub alloc_total: AtomicU64,
    /// Bytes held by the slice's processes (the hot-path word).
    pub memory_used: CacheLine<AtomicU64>,
    /// Compute scheduler, per slice. In node mode the monitor keeps each slice's scheduler
    /// state in the policy and processes ask for turns in [`GrantProc`]; here the slice's
    /// processes keep only their shared account of the turn they hold (`turn_key`,
    /// `turn_start_ns`, `turn_queued_ns`: together they queue at most the turn's length).
    pub sched: SchedSlice,
}

/// What one process slot writes in a region.
#[repr(C, align(64))]
pub struct RegionProc {
    /// Hot-path updates begun (see `account.rs`).
    pub ops_begun: AtomicU64,
    /// Hot-path updates finished.
    pub ops_ended: AtomicU64,
    /// Bytes this process holds in the slice.
    pub charged: AtomicU64,
    /// Of `charged`, the bytes that are its CUDA contexts (written by the process, as
    /// `charged`; read by the monitor for `gpuslice status`, clamped to `charged`).
    pub contexts: AtomicU64,
    /// Compute scheduler, per process.
    pub sched: SchedProc,
    /// Node-mode compute turns: what the process asks of the monitor (`gpuslice_sched::Granted`).
    pub grant: GrantProc,
}

/// The whole region.
#[repr(C)]
pub struct RegionLayout {
    /// Header and slice-wide words.
    pub header: RegionHeader,
    /// One per policy process slot.
    pub procs: [RegionProc; MAX_PROCS],
}

/// Size of every region.
pub const REGION_SIZE: usize = size_of::<RegionLayout>().div_ceil(4096) * 4096;

/// The key of device `d`'s best-effort allowance.
pub fn best_effort_key(d: usize) -> u32 {
    u32::MAX - d as u32
}

/// A mapped region (read-write or read-only).
pub struct Region {
    fd: OwnedFd,
    base: *mut RegionLayout,
}

// SAFETY: the mapping is shared memory accessed only through atomics (the header's plain
// fields are written once, before anyone else can see the region); valid for the Region's life.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping we made.
        unsafe { libc::munmap(self.base.cast(), REGION_SIZE) };
    }
}

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

fn os(what: &str) -> LedgerError {
    LedgerError::Region(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl Region {
    /// Create a sealed region for `key` (monitor only).
    pub fn create(key: u32, created: u64) -> Result<Region, LedgerError> {
        // SAFETY: valid name; flags are constants.
        let fd = unsafe {
            libc::memfd_create(
                c"gpuslice-region".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: just created, ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), REGION_SIZE as libc::off_t) } != 0 {
            return Err(os("size a region"));
        }
        // SAFETY: our fd; sealing is what makes truncation impossible for everyone.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(os("seal a region"));
        }
        let r = Region::map(fd, true)?;
        // SAFETY: nobody else has the region yet; plain fields written once.
        unsafe {
            (*r.base).header.magic = REGION_MAGIC;
            (*r.base).header.layout_version = crate::layout::LAYOUT_VERSION;
            (*r.base).header.key = key;
            (*r.base).header.created = created;
        }
        Ok(r)
    }

    /// Map a region received over the socket (or recovered by the monitor), checking that it
    /// is sealed against resizing and of the right size.
    pub fn from_fd(fd: OwnedFd, write: bool) -> Result<Region, LedgerError> {
        // SAFETY: valid fd.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) == 0 {
            return Err(LedgerError::Region(
                "a region that is not sealed against resizing".into(),
            ));
        }
        let st = crate::dir::fstat(fd.as_raw_fd()).map_err(|_| os("stat a region"))?;
        if st.st_size as usize != REGION_SIZE {
            return Err(LedgerError::Region(format!(
                "a region of {} bytes, expected {REGION_SIZE}",
                st.st_size
            )));
        }
        let r = Region::map(fd, write)?;
        let h = r.header();
        if h.magic != REGION_MAGIC || h.layout_version != crate::layout::LAYOUT_VERSION {
            return Err(LedgerError::Region(
                "not a region of this gpuslice version".into(),
            ));
        }
        Ok(r)
    }

    fn map(fd: OwnedFd, write: bool) -> Result<Region, LedgerError> {
        // A region is REGION_SIZE bytes and sealed against shrinking.
        let p = crate::sys::map_shared(fd.as_raw_fd(), REGION_SIZE, write)
            .ok_or_else(|| os("map a region"))?;
        Ok(Region { fd, base: p.cast() })
    }

    /// The descriptor (to pass to a process).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The header.
    pub fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping holds a RegionLayout for the Region's life.
        unsafe { &(*self.base).header }
    }

    /// Process slot `slot`'s words (None past the table).
    pub fn proc_(&self, slot: usize) -> Option<&RegionProc> {
        // SAFETY: as for header.
        unsafe { (*self.base).procs.get(slot) }
    }

    /// Clear process slot `slot`'s accounting and turn words for a newly admitted process (a
    /// previous holder's were reaped). Only the monitor, which hands the slot out, calls it.
    pub fn reset_slot(&self, slot: usize) {
        use core::sync::atomic::Ordering::SeqCst;
        let Some(w) = self.proc_(slot) else {
            return;
        };
        w.charged.store(0, SeqCst);
        w.contexts.store(0, SeqCst);
        w.ops_begun.store(0, SeqCst);
        w.ops_ended.store(0, SeqCst);
        let g = &w.grant;
        for x in [
            &g.want_ns,
            &g.need_ns,
            &g.done_turn,
            &g.busy_until_ns,
            &g.solo_gpu_ns,
            &g.launches,
        ] {
            x.store(0, SeqCst);
        }
    }

    /// The process slot array.
    pub fn procs(&self) -> &[RegionProc; MAX_PROCS] {
        // SAFETY: as for header.
        unsafe { &(*self.base).procs }
    }
}

/// The region key of account `account` (a `ProcDevice::account`) on device `d`.
pub fn region_key(account: u32, _d: usize) -> Option<u32> {
    use crate::layout::{ALLOWANCE_ACCOUNT_BASE, MAX_ALLOWANCES, MAX_SLICES};
    match account {
        a if (a as usize) < MAX_SLICES => Some(a),
        a if (ALLOWANCE_ACCOUNT_BASE..ALLOWANCE_ACCOUNT_BASE + MAX_ALLOWANCES as u32)
            .contains(&a) =>
        {
            Some(a)
        }
        _ => None,
    }
}

/// The monitor's regions, by key (a slice index, or an allowance's account `ALLOWANCE_ACCOUNT_BASE + i`).
pub trait Regions: Send + Sync {
    /// The region of `key`, if the monitor has one.
    fn get(&self, key: u32) -> Option<std::sync::Arc<Region>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering::SeqCst;

    #[test]
    fn a_region_cannot_be_truncated_by_anyone_holding_it() {
        let r = Region::create(3, 1).unwrap();
        // SAFETY: our fd; the call must fail because of the seals.
        assert_ne!(unsafe { libc::ftruncate(r.fd(), 0) }, 0);
        // SAFETY: our fd; growing is sealed too.
        let rc = unsafe { libc::ftruncate(r.fd(), (REGION_SIZE * 2) as i64) };
        assert_ne!(rc, 0);
        // SAFETY: dup of our fd for a second mapping.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(r.fd())) };
        let other = Region::from_fd(dup, true).unwrap();
        other.header().memory_used.store(5, SeqCst);
        assert_eq!(r.header().memory_used.load(SeqCst), 5);
        assert_eq!(r.header().key, 3);
        assert!(r.proc_(MAX_PROCS).is_none());
    }

    #[test]
    fn an_unsealed_memfd_is_refused() {
        // SAFETY: valid name.
        let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: our fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: our fd.
        unsafe { libc::ftruncate(fd.as_raw_fd(), REGION_SIZE as i64) };
        assert!(Region::from_fd(fd, true).is_err());
    }
}
