//! `Ledger`: the handle on the mapped file (opening it, the record arrays, the cold-path lock
//! and its repair, the device table), and the home of every other cold path, one file a job:
//!
//! - `procs.rs`: a process attaches (claims a record, proves it alive) and detaches;
//! - `join.rs`: a process joins a slice on a device, and a new slice is admitted
//!   (memory against what the device has left unreserved, compute shares summing to ≤ 1.0);
//! - `slices.rs`: operator slices and the changes made to a slice after it exists (owner,
//!   priority, audit, removal, the last process leaving);
//! - `reap.rs`: the memory and records of dead processes come back;
//! - `shared/`: exported VMM allocations, charged to their exporter while anyone holds them;
//! - `snapshot.rs`: a checked copy of everything for display (the types are `crate::snapshot`).
//!
//! All of these run under the header's robust mutex. They are written so that a holder killed
//! at any point leaves only states that `rebuild_derived` (run by the next locker after
//! `EOWNERDEAD`) and `reap_dead` can repair: the sums `memory_reserved`, `compute_reserved`
//! and `attached` are always recomputable from the slice and process records.

mod compute;
mod join;
mod procs;
mod reap;
mod reslice;
mod secrets;
mod shared;
mod slices;
mod snapshot;

pub use join::{Joined, SliceRequest};
pub use procs::{Membership, ProcHandle};
pub use reslice::SliceChange;
pub use shared::{Import, LetGo, RecordCharge, ShareKey};
pub use slices::OperatorSlice;

use crate::dir::{Owner, RuntimeDir};
use crate::error::LedgerError;
use crate::file::{self, Locked, Mapping};
use crate::layout::*;
use core::sync::atomic::Ordering::SeqCst;
use std::path::Path;

/// Device and inode of a file.
pub type FileId = (u64, u64);

/// A mapped node ledger.
pub struct Ledger {
    m: Mapping,
    dir: RuntimeDir,
    /// Node mode, in the monitor: its slice regions (best-effort usage for admission).
    regions: std::sync::OnceLock<std::sync::Arc<dyn crate::region::Regions>>,
    /// Process slots whose liveness lock this handle holds. An OFD lock does not conflict with
    /// its own description, so `F_OFD_GETLK` cannot see these: we know them instead.
    owned: [core::sync::atomic::AtomicU64; MAX_PROCS / 64],
}

/// Held while the cold-path lock is taken.
pub struct LockGuard<'a> {
    ledger: &'a Ledger,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // Before the unlock: a snapshot that saw the lock free at both ends and the same
        // generation saw no change (`snapshot.rs`).
        self.ledger.header().generation.fetch_add(1, SeqCst);
        file::unlock(self.ledger.header());
    }
}

impl Ledger {
    /// Open the existing ledger in `dir` (the monitor and CLI use this to avoid creating one).
    /// In a directory of the caller's it is mapped read-write; in root's directory, for
    /// anyone else, read-only (every cold path then answers [`LedgerError::ReadOnly`]).
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        let dir = RuntimeDir::open(dir)?;
        let write = dir.owner() == Owner::Caller;
        Ledger::open_in(dir, write)
    }

    /// Open the ledger of an already checked directory.
    pub(crate) fn open_in(dir: RuntimeDir, write: bool) -> Result<Ledger, LedgerError> {
        let m = file::open(&dir, write)?;
        Ok(Ledger::new(m, dir))
    }

    pub(crate) fn from_parts(m: Mapping, dir: RuntimeDir) -> Ledger {
        Ledger::new(m, dir)
    }

    /// Node mode, in the monitor: where the slices' regions are (admission reads the
    /// best-effort allowances' usage there). Set once.
    pub fn set_regions(&self, r: std::sync::Arc<dyn crate::region::Regions>) {
        let _ = self.regions.set(r);
    }

    /// The monitor's regions, if this is the monitor's handle.
    pub(crate) fn regions(&self) -> Option<&std::sync::Arc<dyn crate::region::Regions>> {
        self.regions.get()
    }

    /// Open the ledger in `dir`, creating it (and the directory, mode 0700, or 0755 for root)
    /// if needed. Only in a directory the caller owns (see `dir.rs`).
    pub fn open_or_create(dir: &Path) -> Result<Ledger, LedgerError> {
        let dir = RuntimeDir::open_or_create(dir)?;
        if dir.owner() != Owner::Caller {
            return Err(LedgerError::ReadOnly(dir.path().join(file::LEDGER_FILE)));
        }
        // An existing node policy is opened as it is (root, its owner, may write it: the
        // operator CLI and the Kubernetes plugin do); a new file is a personal ledger.
        let m = file::open_or_create(&dir, 0o600, MODE_PERSONAL)?;
        Ok(Ledger::new(m, dir))
    }

    fn new(m: Mapping, dir: RuntimeDir) -> Ledger {
        Ledger {
            m,
            dir,
            regions: std::sync::OnceLock::new(),
            owned: [const { core::sync::atomic::AtomicU64::new(0) }; MAX_PROCS / 64],
        }
    }

    /// For a `pthread_atfork` child handler: this process is a child made by `fork()`, which
    /// is not a member of the ledger. Let go of the ledger without touching it, so the child
    /// does not keep the parent counted alive (the inherited descriptor and mapping would hold
    /// the parent's liveness lock): a SIGKILLed parent is reaped while its forked children
    /// live. Afterwards this handle reads a private, frozen copy; nothing written through it
    /// reaches the node. Async-signal-safe (no allocation, no lock).
    pub fn forget_after_fork(&self) {
        file::forget_after_fork(&self.m);
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.m.path
    }

    /// The checked runtime directory the ledger lives in.
    pub fn dir(&self) -> &RuntimeDir {
        &self.dir
    }

    /// Whether this handle may change the ledger (false: mapped read-only).
    pub fn writable(&self) -> bool {
        self.m.writable
    }

    /// Device and inode of the mapped file, and of the file under the ledger's name now: they
    /// differ when the ledger was removed or replaced since it was opened.
    pub fn identities(&self) -> (Option<FileId>, Option<FileId>) {
        let mapped = crate::dir::fstat(self.m.fd)
            .ok()
            .map(|st| (st.st_dev, st.st_ino));
        (mapped, self.dir.identity(file::LEDGER_FILE))
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping holds a Header at offset 0, checked when opened.
        unsafe { &*self.m.base.cast::<Header>() }
    }

    /// The device records.
    pub fn devices(&self) -> &[Device; MAX_DEVICES] {
        // SAFETY: DEVICES_OFFSET..+MAX_DEVICES*size lies in the mapping; records are atomics
        // or fields written only before the record is published.
        unsafe { &*self.m.base.add(DEVICES_OFFSET).cast() }
    }

    /// The slice records.
    pub fn slices(&self) -> &[Slice; MAX_SLICES] {
        // SAFETY: as for devices.
        unsafe { &*self.m.base.add(SLICES_OFFSET).cast() }
    }

    /// The process records.
    pub fn procs(&self) -> &[Proc; MAX_PROCS] {
        // SAFETY: as for devices.
        unsafe { &*self.m.base.add(PROCS_OFFSET).cast() }
    }

    /// The best-effort allowances (node mode).
    pub fn allowances(&self) -> &[Allowance; MAX_ALLOWANCES] {
        // SAFETY: as for devices.
        unsafe { &*self.m.base.add(ALLOWANCES_OFFSET).cast() }
    }

    /// Take the cold-path lock (times out after [`file::LOCK_TIMEOUT`]); repairs the derived
    /// sums when the previous holder died.
    pub fn lock(&self) -> Result<LockGuard<'_>, LedgerError> {
        if !self.m.writable {
            return Err(LedgerError::ReadOnly(self.path().into()));
        }
        let r = file::lock(self.header(), self.path())?;
        let g = LockGuard { ledger: self };
        if let Locked::OwnerDied = r {
            self.rebuild_derived();
        }
        Ok(g)
    }

    /// Recompute `memory_reserved`, `compute_reserved` and `attached` from the records.
    fn rebuild_derived(&self) {
        // A reaper that died mid-settle leaves its flag up: hot paths would keep pausing.
        for d in self.devices() {
            d.reaping.store(0, SeqCst);
        }
        for s in self.slices() {
            s.reaping.store(0, SeqCst);
        }
        for (di, d) in self.devices().iter().enumerate() {
            let (mut mem, mut cpu) = (0u64, 0u64);
            for s in self.slices().iter().filter(|s| {
                s.state.load(SeqCst) == STATE_ACTIVE && s.device.load(SeqCst) as usize == di
            }) {
                let l = s.memory_limit.load(SeqCst);
                if l != NO_LIMIT {
                    mem = mem.saturating_add(l);
                }
                cpu += s.compute_share_ppm.load(SeqCst) as u64;
            }
            d.memory_reserved.store(mem, SeqCst);
            d.compute_reserved.store(cpu, SeqCst);
        }
        // One pass over the processes (slices × processes × devices would be 67 M steps).
        let mut attached = vec![0u32; MAX_SLICES];
        for p in self.procs() {
            if p.state.load(SeqCst) == STATE_FREE {
                continue;
            }
            let mut seen: Vec<usize> = vec![];
            for pd in &p.devices {
                let si = pd.slice.load(SeqCst) as usize;
                if si < MAX_SLICES && !seen.contains(&si) {
                    seen.push(si);
                    attached[si] += 1;
                }
            }
        }
        for (s, n) in self.slices().iter().zip(attached) {
            s.attached.store(n, SeqCst);
        }
    }

    /// Find a device by ledger index (digits) or UUID.
    pub fn find_device(&self, key: &str) -> Option<usize> {
        let active = |i: usize| self.devices()[i].state.load(SeqCst) == STATE_ACTIVE;
        if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
            return key.parse().ok().filter(|&i| i < MAX_DEVICES && active(i));
        }
        (0..MAX_DEVICES).find(|&i| active(i) && self.devices()[i].uuid.get() == key)
    }

    /// Register a device (by UUID) or refresh its name and size; returns its ledger index.
    pub fn ensure_device(
        &self,
        uuid: &str,
        name: &str,
        memory_total: u64,
    ) -> Result<usize, LedgerError> {
        if let Some(i) = self
            .find_device(uuid)
            .filter(|_| !uuid.bytes().all(|b| b.is_ascii_digit()))
        {
            if self.devices()[i].memory_total.load(SeqCst) == memory_total {
                return Ok(i);
            }
        }
        let _g = self.lock()?;
        if let Some(i) = self.find_device(uuid) {
            self.devices()[i].memory_total.store(memory_total, SeqCst);
            return Ok(i);
        }
        let i = (0..MAX_DEVICES)
            .find(|&i| self.devices()[i].state.load(SeqCst) == STATE_FREE)
            .ok_or(LedgerError::Full("device"))?;
        let d = &self.devices()[i];
        // SAFETY: under the lock, record not yet published.
        unsafe {
            d.uuid.set(uuid);
            d.name.set(name);
        }
        d.memory_total.store(memory_total, SeqCst);
        d.state.store(STATE_ACTIVE, SeqCst);
        Ok(i)
    }

    /// The error for a full `table` of `size` records: who holds it, by uid, the largest
    /// first (`uids`: the uid of each record in use; `holder` words one uid's count).
    pub(super) fn table_full(
        table: &'static str,
        size: usize,
        uids: impl Iterator<Item = u32>,
        holder: impl Fn(u32, usize) -> String,
    ) -> LedgerError {
        let mut by_uid: Vec<(u32, usize)> = vec![];
        for u in uids {
            match by_uid.iter_mut().find(|(x, _)| *x == u) {
                Some(e) => e.1 += 1,
                None => by_uid.push((u, 1)),
            }
        }
        by_uid.sort_by_key(|e| core::cmp::Reverse(e.1));
        LedgerError::TableFull {
            table,
            size,
            holders: by_uid
                .iter()
                .take(4)
                .map(|&(u, n)| holder(u, n))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}
