//! `Ledger`: the handle on the mapped file, and every cold path (devices, attaching processes,
//! joining and admitting slices, operator slices, reaping, snapshots).
//!
//! All of these run under the header's robust mutex. They are written so that a holder killed
//! at any point leaves only states that `rebuild_derived` (run by the next locker after
//! `EOWNERDEAD`) and `reap_dead` can repair: the sums `memory_reserved`, `compute_reserved`
//! and `attached` are always recomputable from the slice and process records.

use crate::account::{dead_part, Account, Member};
use crate::dir::{Owner, RuntimeDir};
use crate::error::{human_bytes, AdmissionError, LedgerError};
use crate::file::{self, Locked, Mapping};
use crate::layout::*;
use crate::snapshot::*;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::path::Path;

/// Device and inode of a file.
pub type FileId = (u64, u64);

/// A mapped node ledger.
pub struct Ledger {
    m: Mapping,
    dir: RuntimeDir,
    /// Node mode, in the monitor: its slice regions (best-effort usage for admission).
    regions: std::sync::OnceLock<std::sync::Arc<dyn crate::node::Regions>>,
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
        self.ledger.header().generation.fetch_add(1, Relaxed);
        file::unlock(self.ledger.header());
    }
}

/// This process's slot in the ledger. Dropping it does not detach; see [`Ledger::detach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcHandle {
    /// Index of the process record.
    pub slot: usize,
}

/// What a process asks for on one device.
#[derive(Debug, Clone)]
pub struct SliceRequest {
    /// Slice name; `None` for a private slice of this process.
    pub name: Option<String>,
    /// Quota in bytes; `None` = best effort (charged to the device's unreserved memory).
    pub memory: Option<u64>,
    /// Guaranteed compute share, ppm (0 = none).
    pub compute_share_ppm: u32,
    /// Compute cap, ppm ([`PPM`] = none).
    pub compute_cap_ppm: u32,
    /// The setting the memory came from, for messages (`GPUSLICE_MEMORY`).
    pub memory_setting: String,
    /// The setting the share came from (`GPUSLICE_COMPUTE`).
    pub compute_setting: String,
}

impl SliceRequest {
    /// A request for memory alone: slice `name` (`None`: a private slice) with quota `memory`
    /// (`None`: best effort), no compute share, no cap, and the settings named as the
    /// variables that carry them (`GPUSLICE_MEMORY`, `GPUSLICE_COMPUTE`).
    pub fn new(name: Option<&str>, memory: Option<u64>) -> SliceRequest {
        SliceRequest {
            name: name.map(Into::into),
            memory,
            compute_share_ppm: 0,
            compute_cap_ppm: PPM,
            memory_setting: "GPUSLICE_MEMORY".into(),
            compute_setting: "GPUSLICE_COMPUTE".into(),
        }
    }
}

/// The outcome of joining a slice on a device.
#[derive(Debug, Clone)]
pub struct Joined {
    /// Slice index.
    pub slice: usize,
    /// The slice's quota (`None`: best effort).
    pub memory_limit: Option<u64>,
    /// Lines to show the user (e.g. the slice's values differ from the request).
    pub warnings: Vec<String>,
}

/// An operator-defined slice (`gpuslice slice create`).
#[derive(Debug, Clone)]
pub struct OperatorSlice {
    /// Name.
    pub name: String,
    /// Ledger device index (digits) or UUID.
    pub device: String,
    /// Quota in bytes.
    pub memory: u64,
    /// Guarantee, ppm.
    pub compute_share_ppm: u32,
    /// Cap, ppm ([`PPM`]: none).
    pub compute_cap_ppm: u32,
    /// A label to find the slice by (Kubernetes `namespace/name`), shown by `status`.
    pub claim: Option<String>,
}

fn frac(ppm: u64) -> String {
    format!("{:.2}", ppm as f64 / PPM as f64)
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
    /// best-effort pools' usage there). Set once.
    pub fn set_regions(&self, r: std::sync::Arc<dyn crate::node::Regions>) {
        let _ = self.regions.set(r);
    }

    /// What best-effort processes hold on `device` now. Node mode: the pools' live counters
    /// where the monitor's regions are at hand (after lowering the grants), else, for root's
    /// CLI, what the pools may hold (their grants), which is never less.
    fn best_effort_now(&self, device: usize) -> u64 {
        if !self.is_node() {
            return self.devices()[device].best_effort_used.load(SeqCst);
        }
        self.pools()
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.state.load(SeqCst) == STATE_ACTIVE && p.device.load(SeqCst) as usize == device
            })
            .fold(0u64, |a, (i, p)| {
                // A pool's counter is its users' to write: it counts for at most its grant
                // (the monitor's), so lying high cannot block other slices' admission.
                let g = p.grant.load(SeqCst);
                let v = match self.regions.get() {
                    Some(r) => r
                        .get(POOL_ACCOUNT_BASE + i as u32)
                        .map_or(0, |r| r.header().memory_used.load(SeqCst).min(g)),
                    None => g.max(p.used.load(SeqCst)),
                };
                a.saturating_add(v)
            })
    }

    /// The monitor's regions, if this is the monitor's handle.
    pub(crate) fn regions(&self) -> Option<&std::sync::Arc<dyn crate::node::Regions>> {
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

    fn set_owned(&self, slot: usize, on: bool) {
        let bit = 1u64 << (slot % 64);
        if on {
            self.owned[slot / 64].fetch_or(bit, SeqCst);
        } else {
            self.owned[slot / 64].fetch_and(!bit, SeqCst);
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

    /// The best-effort pools (node mode).
    pub fn pools(&self) -> &[Pool; MAX_POOLS] {
        // SAFETY: as for devices.
        unsafe { &*self.m.base.add(POOLS_OFFSET).cast() }
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

    /// Claim a process record for the calling process and prove it alive with an OFD lock.
    /// Reaps dead processes first so their slots and memory come back.
    pub fn attach(&self, slice_name: &str) -> Result<ProcHandle, LedgerError> {
        if self.is_node() {
            return Err(LedgerError::Monitor(
                "this is a node policy: processes are admitted by the node's monitor".into(),
            ));
        }
        let _ = self.reap_dead();
        let (pid_ns, outer_pid) = crate::view::own_pid_identity(); // /proc reads: not under the lock
        let _g = self.lock()?;
        for (i, p) in self.procs().iter().enumerate() {
            if p.state.load(SeqCst) != STATE_FREE || !file::take_liveness(self.m.fd, i) {
                continue;
            }
            p.pid.store(std::process::id(), SeqCst);
            p.host_pid.store(std::process::id(), SeqCst);
            p.uid.store(crate::dir::euid(), SeqCst);
            p.start_time.store(file::own_start_time(), SeqCst);
            p.pid_ns.store(pid_ns, SeqCst);
            p.outer_pid.store(outer_pid, SeqCst);
            // SAFETY: under the lock, record not yet published.
            unsafe { p.slice_name.set(slice_name) };
            for pd in &p.devices {
                pd.slice.store(ACCOUNT_NONE, SeqCst);
                pd.account.store(ACCOUNT_NONE, SeqCst);
                pd.charged.store(0, SeqCst);
            }
            self.set_owned(i, true);
            p.state.store(STATE_ACTIVE, SeqCst);
            return Ok(ProcHandle { slot: i });
        }
        Err(self.procs_full())
    }

    /// The error for a full process table, naming who holds it (by uid, the largest first).
    pub(crate) fn procs_full(&self) -> LedgerError {
        let mut by_uid: Vec<(u32, usize)> = vec![];
        for p in self.procs() {
            if p.state.load(SeqCst) == STATE_FREE {
                continue;
            }
            let u = p.uid.load(SeqCst);
            match by_uid.iter_mut().find(|(x, _)| *x == u) {
                Some(e) => e.1 += 1,
                None => by_uid.push((u, 1)),
            }
        }
        by_uid.sort_by_key(|e| core::cmp::Reverse(e.1));
        LedgerError::TableFull {
            table: "process",
            size: MAX_PROCS,
            holders: by_uid
                .iter()
                .take(4)
                .map(|(u, n)| format!("uid {u} holds {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The error for a full slice table, naming who holds it (by owner uid).
    pub(crate) fn slices_full(&self) -> LedgerError {
        let mut by_uid: Vec<(u32, usize)> = vec![];
        for s in self.slices() {
            if s.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let u = s.owner_uid.load(SeqCst);
            match by_uid.iter_mut().find(|(x, _)| *x == u) {
                Some(e) => e.1 += 1,
                None => by_uid.push((u, 1)),
            }
        }
        by_uid.sort_by_key(|e| core::cmp::Reverse(e.1));
        LedgerError::TableFull {
            table: "slice",
            size: MAX_SLICES,
            holders: by_uid
                .iter()
                .take(4)
                .map(|(u, n)| {
                    if *u == ANY_UID {
                        format!("operator or personal slices: {n}")
                    } else {
                        format!("uid {u} holds {n}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// Join (or create) the slice `req` names on `device`, with admission control. A process
    /// joining an existing slice gets the slice's values (and a warning when it asked for
    /// others); an operator slice can never be raised by a process.
    pub fn join(
        &self,
        h: ProcHandle,
        device: usize,
        req: &SliceRequest,
    ) -> Result<Joined, LedgerError> {
        if device >= MAX_DEVICES || h.slot >= MAX_PROCS {
            return Err(LedgerError::Corrupt("device or process index"));
        }
        let _g = self.lock()?;
        self.join_locked(h, device, req, std::process::id(), ANY_UID)
    }

    /// `join` on several devices under one taking of the lock (a process's start-up): the
    /// results in order, stopping at the first error.
    pub fn join_all(
        &self,
        h: ProcHandle,
        reqs: &[(usize, SliceRequest)],
    ) -> Result<Vec<Joined>, LedgerError> {
        let _g = self.lock()?;
        reqs.iter()
            .map(|(d, r)| self.join_locked(h, *d, r, std::process::id(), ANY_UID))
            .collect()
    }

    /// `join` for process record `h` (of pid `pid`, for a private slice's name) and, in node
    /// mode, of user `uid`, who may join only slices open to it; caller holds the lock.
    pub(crate) fn join_locked(
        &self,
        h: ProcHandle,
        device: usize,
        req: &SliceRequest,
        pid: u32,
        uid: u32,
    ) -> Result<Joined, LedgerError> {
        if device >= MAX_DEVICES || h.slot >= MAX_PROCS {
            return Err(LedgerError::Corrupt("device or process index"));
        }
        let p = &self.procs()[h.slot];
        let pd = &p.devices[device];
        if let Some(s) = Some(pd.slice.load(SeqCst)).filter(|&s| s != ACCOUNT_NONE) {
            // Our own record says we joined already; an index past the table is a scribbled
            // record, refused rather than used.
            let limit = self
                .slices()
                .get(s as usize)
                .ok_or(LedgerError::Corrupt("process record's slice index"))?
                .memory_limit
                .load(SeqCst);
            return Ok(Joined {
                slice: s as usize,
                memory_limit: (limit != NO_LIMIT).then_some(limit),
                warnings: vec![],
            });
        }
        let mut warnings = vec![];
        let existing = req.name.as_deref().and_then(|n| self.find_slice(n, device));
        let si = match existing {
            Some(si) => {
                let s = &self.slices()[si];
                let owner = s.owner_uid.load(SeqCst);
                if uid != ANY_UID && owner != ANY_UID && owner != uid {
                    return Err(LedgerError::Monitor(format!(
                        "slice {:?} belongs to uid {owner}: the processes of one slice trust \
                         each other, so only uid {owner} may join it (choose another \
                         GPUSLICE_SLICE)",
                        req.name.as_deref().unwrap_or("")
                    )));
                }
                let limit = s.memory_limit.load(SeqCst);
                let (share, cap) = (
                    s.compute_share_ppm.load(SeqCst),
                    s.compute_cap_ppm.load(SeqCst),
                );
                let asked = req.memory.unwrap_or(NO_LIMIT);
                // Only what the process asked for can conflict: no quota, no share (0) and no
                // cap (PPM) are "whatever the slice has", so joining silently is right.
                let conflicts = req.memory.is_some_and(|m| m != limit)
                    || (req.compute_share_ppm != 0 && req.compute_share_ppm != share)
                    || (req.compute_cap_ppm != PPM && req.compute_cap_ppm != cap);
                if conflicts {
                    let show = |l: u64| {
                        if l == NO_LIMIT {
                            "none".to_string()
                        } else {
                            human_bytes(l)
                        }
                    };
                    warnings.push(format!(
                        "slice {:?} already exists with memory {}, compute {}, cap {}; using its values, not the requested memory {}, compute {}, cap {}",
                        req.name.as_deref().unwrap_or(""),
                        show(limit),
                        frac(share as u64),
                        frac(cap as u64),
                        show(asked),
                        frac(req.compute_share_ppm as u64),
                        frac(req.compute_cap_ppm as u64),
                    ));
                }
                si
            }
            None => {
                let name = req.name.clone().unwrap_or_else(|| format!("pid-{pid}"));
                if !crate::quantity::storable_name(&name) {
                    return Err(LedgerError::BadName(name));
                }
                let si = self.create_slice_locked(
                    &name,
                    device,
                    req.memory,
                    req.compute_share_ppm,
                    req.compute_cap_ppm,
                    req.name.is_none(),
                    false,
                    &req.memory_setting,
                    &req.compute_setting,
                )?;
                self.slices()[si].owner_uid.store(uid, SeqCst);
                si
            }
        };
        let s = &self.slices()[si];
        let limit = s.memory_limit.load(SeqCst);
        s.attached.fetch_add(1, SeqCst);
        pd.account.store(
            if limit == NO_LIMIT {
                ACCOUNT_BEST_EFFORT
            } else {
                si as u32
            },
            SeqCst,
        );
        pd.slice.store(si as u32, SeqCst);
        Ok(Joined {
            slice: si,
            memory_limit: (limit != NO_LIMIT).then_some(limit),
            warnings,
        })
    }

    /// The charging handle of process `h` on `device` (after `join`).
    pub fn account(&self, h: ProcHandle, device: usize) -> Option<Account<'_>> {
        if !self.m.writable {
            return None;
        }
        let p = self.procs().get(h.slot)?;
        let pd = p.devices.get(device)?;
        let d = self.devices().get(device)?;
        match pd.account.load(SeqCst) {
            ACCOUNT_NONE => None,
            ACCOUNT_BEST_EFFORT => Some(Account::new(d, None, p, pd)),
            s => Some(Account::new(d, Some(self.slices().get(s as usize)?), p, pd)),
        }
    }

    fn find_slice(&self, name: &str, device: usize) -> Option<usize> {
        self.slices().iter().position(|s| {
            s.state.load(SeqCst) == STATE_ACTIVE
                && s.private.load(SeqCst) == 0
                && s.device.load(SeqCst) as usize == device
                && s.name.get() == name
        })
    }

    /// Admission + creation; caller holds the lock.
    #[allow(clippy::too_many_arguments)]
    fn create_slice_locked(
        &self,
        name: &str,
        device: usize,
        memory: Option<u64>,
        share: u32,
        cap: u32,
        private: bool,
        operator: bool,
        mem_setting: &str,
        cpu_setting: &str,
    ) -> Result<usize, LedgerError> {
        let d = self
            .devices()
            .get(device)
            .ok_or(LedgerError::Corrupt("device index"))?;
        let uuid = d.uuid.get();
        let si = self
            .slices()
            .iter()
            .position(|s| s.state.load(SeqCst) == STATE_FREE)
            .ok_or_else(|| self.slices_full())?;
        // Compute first: it has no hot-path counterpart, so a plain check under the lock is exact.
        let cpu = d.compute_reserved.load(SeqCst);
        if !crate::sched::admits(cpu, share) {
            return Err(AdmissionError {
                setting: cpu_setting.into(),
                device: uuid,
                requested: frac(share as u64),
                available: frac((PPM as u64).saturating_sub(cpu)),
            }
            .into());
        }
        if let Some(l) = memory {
            // Raise the reservation first, then look at best effort (see account.rs).
            let total = d.memory_total.load(SeqCst);
            let before = d.memory_reserved.fetch_add(l, SeqCst);
            // Node mode: lower the best-effort grants to the new reservation first, then read
            // what the pools hold (a charge racing the lowering is seen or undoes itself).
            self.rebalance_pools_locked(device);
            let be = self.best_effort_now(device);
            let fits = before
                .checked_add(l)
                .and_then(|r| r.checked_add(be))
                .is_some_and(|v| v <= total);
            if !fits {
                d.memory_reserved.fetch_sub(l, SeqCst);
                self.rebalance_pools_locked(device);
                return Err(AdmissionError {
                    setting: mem_setting.into(),
                    device: uuid,
                    requested: human_bytes(l),
                    available: human_bytes(total.saturating_sub(before).saturating_sub(be)),
                }
                .into());
            }
        }
        d.compute_reserved.fetch_add(share as u64, SeqCst);
        let s = &self.slices()[si];
        // SAFETY: under the lock, record not yet published (state FREE).
        unsafe {
            s.name.set(name);
        }
        s.device.store(device as u32, SeqCst);
        s.memory_limit.store(memory.unwrap_or(NO_LIMIT), SeqCst);
        s.memory_used.0.store(0, SeqCst);
        s.compute_share_ppm.store(share, SeqCst);
        s.compute_cap_ppm.store(cap, SeqCst);
        s.operator_defined.store(operator as u32, SeqCst);
        s.private.store(private as u32, SeqCst);
        s.attached.store(0, SeqCst);
        s.alloc_denied_total.store(0, SeqCst);
        s.alloc_total.store(0, SeqCst);
        s.sched.reset();
        s.owner_uid.store(ANY_UID, SeqCst);
        s.over_quota.store(0, SeqCst);
        s.audit_observed.store(0, SeqCst);
        s.violations_total.store(0, SeqCst);
        // SAFETY: under the lock, record not yet published.
        unsafe { s.claim.set("") };
        s.state.store(STATE_ACTIVE, SeqCst);
        self.header().slice_hwm.fetch_max(si as u32 + 1, SeqCst);
        Ok(si)
    }

    /// Create an operator-defined slice (persists when empty; processes naming it get its
    /// values). Errors: unknown device, bad name, already exists, admission.
    pub fn create_operator_slice(&self, spec: &OperatorSlice) -> Result<usize, LedgerError> {
        self.create_operator_slice_with_secret(spec, None)
    }

    /// [`Ledger::create_operator_slice`] with a join secret (node mode only; `secret.rs`): the
    /// secret is stored, root-only, before the slice exists, and is required of every non-root
    /// process that names the slice from then on.
    pub fn create_operator_slice_with_secret(
        &self,
        spec: &OperatorSlice,
        secret: Option<&crate::secret::Secret>,
    ) -> Result<usize, LedgerError> {
        if !crate::quantity::valid_slice_name(&spec.name) {
            return Err(LedgerError::BadName(spec.name.clone()));
        }
        let _g = self.lock()?;
        let undo = self.set_secret_for_new_slice_locked(&spec.name, secret)?;
        let r = self.create_operator_slice_locked(spec);
        if r.is_err() {
            if let Some(old) = undo {
                let _ = old.save(self.dir());
            }
        }
        r
    }

    fn create_operator_slice_locked(&self, spec: &OperatorSlice) -> Result<usize, LedgerError> {
        let dev = self
            .find_device(&spec.device)
            .ok_or_else(|| LedgerError::NoSuchDevice(spec.device.clone()))?;
        if let Some(si) = self.find_slice(&spec.name, dev) {
            let s = &self.slices()[si];
            if s.operator_defined.load(SeqCst) == 0 && s.attached.load(SeqCst) > 0 {
                return Err(LedgerError::Exists(spec.name.clone()));
            }
            return Err(LedgerError::Exists(spec.name.clone()));
        }
        let claim = spec.claim.as_deref().unwrap_or("");
        if claim.len() >= CLAIM_LEN || claim.bytes().any(|b| b.is_ascii_control()) {
            return Err(LedgerError::BadName(claim.into()));
        }
        let si = self.create_slice_locked(
            &spec.name,
            dev,
            Some(spec.memory),
            spec.compute_share_ppm,
            spec.compute_cap_ppm,
            false,
            true,
            "--memory",
            "--compute",
        )?;
        // SAFETY: under the lock; the record was just created and no process joined it yet.
        unsafe { self.slices()[si].claim.set(claim) };
        Ok(si)
    }

    /// The monitor's audit of slice `si`: what NVML reports for its processes and whether that
    /// is over its quota (counted in `violations_total` when it goes over).
    pub fn record_audit(&self, si: usize, observed: u64, over: bool) {
        if !self.writable() {
            return;
        }
        let Some(s) = self.slices().get(si) else {
            return;
        };
        s.audit_observed.store(observed, SeqCst);
        if s.over_quota.swap(over as u32, SeqCst) == 0 && over {
            s.violations_total.fetch_add(1, SeqCst);
        }
    }

    /// Node mode: let only `uid`'s processes join the slice `name` on `device` (index or UUID);
    /// an operator slice is open to every uid until this is set.
    pub fn set_slice_owner(
        &self,
        name: &str,
        device: &str,
        uid: u32,
    ) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let dev = self
            .find_device(device)
            .ok_or_else(|| LedgerError::NoSuchDevice(device.into()))?;
        let si = self
            .find_slice(name, dev)
            .ok_or_else(|| LedgerError::NoSuchSlice(name.into()))?;
        self.slices()[si].owner_uid.store(uid, SeqCst);
        Ok(1)
    }

    /// Set the scheduling priority (0 normal, 1 latency) of every slice called `name`;
    /// returns how many.
    pub fn set_slice_priority(&self, name: &str, priority: u32) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let mut n = 0;
        for s in self.slices() {
            if s.state.load(SeqCst) == STATE_ACTIVE
                && s.private.load(SeqCst) == 0
                && s.name.get() == name
            {
                s.sched
                    .class
                    .store(priority.min(crate::sched::CLASS_LATENCY), SeqCst);
                n += 1;
            }
        }
        if n == 0 {
            return Err(LedgerError::NoSuchSlice(name.into()));
        }
        Ok(n)
    }

    /// Remove the operator slices called `name` (on every device). One with processes still
    /// attached stops being operator-defined and goes away with its last process. Returns how
    /// many were removed at once.
    pub fn remove_slice(&self, name: &str) -> Result<usize, LedgerError> {
        let _g = self.lock()?;
        let mut found = 0;
        let mut removed = 0;
        for (si, s) in self.slices().iter().enumerate() {
            if s.state.load(SeqCst) != STATE_ACTIVE
                || s.private.load(SeqCst) != 0
                || s.name.get() != name
            {
                continue;
            }
            found += 1;
            s.operator_defined.store(0, SeqCst);
            if s.attached.load(SeqCst) == 0 {
                self.free_slice_locked(si);
                removed += 1;
            }
        }
        if found == 0 {
            return Err(LedgerError::NoSuchSlice(name.into()));
        }
        self.prune_secrets_locked();
        Ok(removed)
    }

    /// A reaped process leaves slice `si` (record `sl`), under the lock: one fewer attached, and
    /// a slice no operator made is freed when its last process goes (its name is returned).
    pub(crate) fn leave_slice_locked(&self, si: usize, sl: &Slice) -> Option<String> {
        let left = sl
            .attached
            .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(1)))
            .unwrap_or(0)
            .saturating_sub(1);
        let free = left == 0
            && sl.operator_defined.load(SeqCst) == 0
            && sl.state.load(SeqCst) == STATE_ACTIVE;
        if !free {
            return None;
        }
        let name = sl.name.get();
        self.free_slice_locked(si);
        Some(name)
    }

    fn free_slice_locked(&self, si: usize) {
        let Some(s) = self.slices().get(si) else {
            return;
        };
        s.state.store(STATE_FREE, SeqCst);
        s.memory_used.0.store(0, SeqCst);
        // A scribbled device index: nothing to give back to (rebuild_derived recomputes sums).
        let Some(d) = self.devices().get(s.device.load(SeqCst) as usize) else {
            return;
        };
        let l = s.memory_limit.load(SeqCst);
        if l != NO_LIMIT {
            let _ = d
                .memory_reserved
                .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(l)));
        }
        let c = s.compute_share_ppm.load(SeqCst) as u64;
        let _ = d
            .compute_reserved
            .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(c)));
        s.memory_used.0.store(0, SeqCst);
    }

    /// Whether process record `slot` belongs to a live process (its OFD lock is held).
    /// In node mode the monitor's own check decides and reaps promptly: a record in use is
    /// a live process as far as anyone else can tell.
    pub fn is_alive(&self, slot: usize) -> bool {
        if self.is_node() {
            return self
                .procs()
                .get(slot)
                .is_some_and(|p| p.state.load(SeqCst) == STATE_ACTIVE);
        }
        self.owned[slot / 64].load(SeqCst) & (1 << (slot % 64)) != 0
            || file::is_alive(self.m.fd, slot)
    }

    /// Leave the ledger: this process's memory goes back to its slices, private and emptied
    /// slices are removed. Only call when no thread of this process charges any more.
    pub fn detach(&self, h: ProcHandle) -> Result<Reaped, LedgerError> {
        let g = self.lock()?;
        self.procs()[h.slot].state.store(STATE_DYING, SeqCst);
        file::drop_liveness(self.m.fd, h.slot);
        self.set_owned(h.slot, false);
        let r = self.reap_locked(&g);
        Ok(r)
    }

    /// Find processes that died, return what they held to their slices, free their records,
    /// and remove the slices they leave empty (unless operator-defined).
    pub fn reap_dead(&self) -> Result<Reaped, LedgerError> {
        if self.is_node() {
            return Ok(Reaped::default()); // the monitor's `reap_node` does it
        }
        let g = self.lock()?;
        Ok(self.reap_locked(&g))
    }

    fn reap_locked(&self, _g: &LockGuard<'_>) -> Reaped {
        let mut out = Reaped::default();
        let procs = self.procs();
        for (i, p) in procs.iter().enumerate() {
            if p.state.load(SeqCst) == STATE_ACTIVE && !self.is_alive(i) {
                p.state.store(STATE_DYING, SeqCst);
            }
        }
        let dying: Vec<usize> = (0..MAX_PROCS)
            .filter(|&i| procs[i].state.load(SeqCst) == STATE_DYING)
            .collect();
        if dying.is_empty() {
            return out;
        }
        // Every (device, account) a dying process is charged to. An account index past the
        // slice table is a scribbled record: reported, and never used as an index.
        let valid_account = |a: u32| a == ACCOUNT_BEST_EFFORT || (a as usize) < MAX_SLICES;
        let mut accounts: Vec<(usize, u32)> = vec![];
        for &i in &dying {
            for (d, pd) in procs[i].devices.iter().enumerate() {
                let a = pd.account.load(SeqCst);
                if a == ACCOUNT_NONE {
                    continue;
                }
                if !valid_account(a) {
                    out.problems.push(format!(
                        "process record {i} (pid {}): account index {a} on device {d} is past \
                         the slice table; its memory cannot be returned",
                        procs[i].pid.load(SeqCst)
                    ));
                    continue;
                }
                if !accounts.contains(&(d, a)) {
                    accounts.push((d, a));
                }
            }
        }
        let mut unresolved: Vec<(usize, u32)> = vec![];
        for &(d, a) in &accounts {
            let (counter, reaping) = if a == ACCOUNT_BEST_EFFORT {
                (
                    &self.devices()[d].best_effort_used,
                    &self.devices()[d].reaping,
                )
            } else {
                let s = &self.slices()[a as usize];
                (&s.memory_used.0, &s.reaping)
            };
            let live: Vec<Member<'_>> = procs
                .iter()
                .filter(|p| {
                    p.state.load(SeqCst) == STATE_ACTIVE && p.devices[d].account.load(SeqCst) == a
                })
                .map(|p| Member {
                    begun: &p.ops_begun,
                    ended: &p.ops_ended,
                    charged: &p.devices[d].charged,
                })
                .collect();
            match dead_part(counter, reaping, &live) {
                Some(n) => {
                    counter.fetch_sub(n, SeqCst);
                    out.bytes_returned = out.bytes_returned.saturating_add(n);
                }
                None => unresolved.push((d, a)),
            }
        }
        for &i in &dying {
            let p = &procs[i];
            if p.devices
                .iter()
                .enumerate()
                .any(|(d, pd)| unresolved.contains(&(d, pd.account.load(SeqCst))))
            {
                continue; // retried at the next reap
            }
            out.processes.push(ReapedProc {
                pid: p.pid.load(SeqCst),
                bytes: p
                    .devices
                    .iter()
                    .fold(0u64, |a, pd| a.saturating_add(pd.charged.load(SeqCst))),
            });
            // Its compute lease and place in the queue go before its slices do.
            crate::tenants::reap_proc(self.devices(), self.slices(), &self.header().slice_hwm, p);
            for (d, pd) in p.devices.iter().enumerate() {
                let s = pd.slice.load(SeqCst);
                pd.account.store(ACCOUNT_NONE, SeqCst);
                pd.slice.store(ACCOUNT_NONE, SeqCst);
                pd.charged.store(0, SeqCst);
                if s == ACCOUNT_NONE {
                    continue;
                }
                let Some(sl) = self.slices().get(s as usize) else {
                    out.problems.push(format!(
                        "process record {i}: slice index {s} on device {d} is past the slice table"
                    ));
                    continue;
                };
                out.slices_removed
                    .extend(self.leave_slice_locked(s as usize, sl));
            }
            p.pid.store(0, SeqCst);
            p.state.store(STATE_FREE, SeqCst);
        }
        out
    }

    /// A consistent-enough copy of everything, for display and decisions (no lock taken).
    ///
    /// Every index, count and name comes from shared memory and is checked before use: a
    /// record that does not make sense (a slice on a device past the table, a process joined
    /// to a slice index past it) is skipped and described in [`Snapshot::problems`]; sums
    /// saturate. Nothing here panics or reads outside the mapping, whatever the file holds.
    pub fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        for (i, d) in self.devices().iter().enumerate() {
            if d.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            snap.devices.push(DeviceInfo {
                index: i,
                uuid: d.uuid.get(),
                name: d.name.get(),
                memory_total: d.memory_total.load(SeqCst),
                memory_reserved: d.memory_reserved.load(SeqCst),
                memory_used: 0,
                best_effort_used: d.best_effort_used.load(SeqCst),
                compute_reserved_ppm: d.compute_reserved.load(SeqCst).min(u32::MAX as u64) as u32,
            });
        }
        let alive: Vec<bool> = (0..MAX_PROCS)
            .map(|i| self.procs()[i].state.load(SeqCst) == STATE_ACTIVE && self.is_alive(i))
            .collect();
        let mut good_slice = [false; MAX_SLICES];
        for (si, s) in self.slices().iter().enumerate() {
            if s.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let dev = s.device.load(SeqCst) as usize;
            let Some(device) = self.devices().get(dev) else {
                snap.problems.push(format!(
                    "slice record {si} ({:?}): device index {dev} is past the device table; skipped",
                    s.name.get()
                ));
                continue;
            };
            good_slice[si] = true;
            let limit = s.memory_limit.load(SeqCst);
            let members: Vec<&Proc> = self
                .procs()
                .iter()
                .filter(|p| {
                    p.state.load(SeqCst) != STATE_FREE
                        && p.devices[dev].slice.load(SeqCst) as usize == si
                })
                .collect();
            let used = if limit == NO_LIMIT {
                members.iter().fold(0u64, |a, p| {
                    a.saturating_add(p.devices[dev].charged.load(SeqCst))
                })
            } else {
                s.memory_used.0.load(SeqCst)
            };
            snap.slices.push(SliceInfo {
                index: si,
                name: s.name.get(),
                device: dev,
                device_uuid: device.uuid.get(),
                operator_defined: s.operator_defined.load(SeqCst) != 0,
                private: s.private.load(SeqCst) != 0,
                memory_limit: (limit != NO_LIMIT).then_some(limit),
                memory_used: used,
                compute_share_ppm: s.compute_share_ppm.load(SeqCst),
                compute_cap_ppm: s.compute_cap_ppm.load(SeqCst),
                attached: s.attached.load(SeqCst),
                pids: members.iter().map(|p| p.pid.load(SeqCst)).collect(),
                alloc_total: s.alloc_total.load(Relaxed),
                alloc_denied_total: s.alloc_denied_total.load(Relaxed),
                claim: Some(s.claim.get()).filter(|c| !c.is_empty()),
                over_quota: s.over_quota.load(SeqCst) != 0,
                audit_observed: s.audit_observed.load(SeqCst),
                violations_total: s.violations_total.load(SeqCst),
                priority: s.sched.class.load(SeqCst).min(crate::sched::CLASS_LATENCY),
            });
        }
        for d in &mut snap.devices {
            let quota = snap
                .slices
                .iter()
                .filter(|s| s.device == d.index && s.memory_limit.is_some())
                .fold(0u64, |a, s| a.saturating_add(s.memory_used));
            d.memory_used = quota.saturating_add(d.best_effort_used);
        }
        for (i, p) in self.procs().iter().enumerate() {
            if p.state.load(SeqCst) == STATE_FREE {
                continue;
            }
            let mut devices: Vec<ProcDeviceInfo> = vec![];
            for (d, pd) in p.devices.iter().enumerate() {
                let slice = pd.slice.load(SeqCst);
                if slice == ACCOUNT_NONE {
                    continue;
                }
                if !good_slice.get(slice as usize).copied().unwrap_or(false) {
                    snap.problems.push(format!(
                        "process record {i} (pid {}): slice index {slice} on device {d} is not \
                         a usable slice; that part skipped",
                        p.pid.load(SeqCst)
                    ));
                    continue;
                }
                devices.push(ProcDeviceInfo {
                    device: d,
                    slice: slice as usize,
                    charged: pd.charged.load(SeqCst),
                });
            }
            snap.processes.push(ProcInfo {
                slot: i,
                pid: p.pid.load(SeqCst),
                start_time: p.start_time.load(SeqCst),
                slice: p.slice_name.get(),
                alive: alive[i],
                memory_used: devices
                    .iter()
                    .fold(0u64, |a, d| a.saturating_add(d.charged)),
                devices,
            });
        }
        snap
    }
}
