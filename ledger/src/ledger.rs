//! `Ledger`: the handle on the mapped file, and every cold path (devices, attaching processes,
//! joining and admitting slices, operator slices, reaping, snapshots).
//!
//! All of these run under the header's robust mutex. They are written so that a holder killed
//! at any point leaves only states that `rebuild_derived` (run by the next locker after
//! `EOWNERDEAD`) and `reap_dead` can repair: the sums `memory_reserved`, `compute_reserved`
//! and `attached` are always recomputable from the slice and process records.

use crate::account::{dead_part, Account, Member};
use crate::error::{human_bytes, AdmissionError, LedgerError};
use crate::file::{self, Locked, Mapping};
use crate::layout::*;
use crate::snapshot::*;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::path::{Path, PathBuf};

/// The default ledger directory when `GPUSLICE_RUNTIME_DIR` is unset.
pub const DEFAULT_RUNTIME_DIR: &str = "/dev/shm/gpuslice";

/// `GPUSLICE_RUNTIME_DIR`, or [`DEFAULT_RUNTIME_DIR`].
pub fn runtime_dir_from_env() -> PathBuf {
    match std::env::var_os("GPUSLICE_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_RUNTIME_DIR),
    }
}

/// A mapped node ledger.
pub struct Ledger {
    m: Mapping,
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
}

fn frac(ppm: u64) -> String {
    format!("{:.2}", ppm as f64 / PPM as f64)
}

impl Ledger {
    /// Open the existing ledger in `dir` (the monitor and CLI use this to avoid creating one).
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        Ok(Ledger::new(file::open(dir)?))
    }

    /// Open the ledger in `dir`, creating it (and the directory, mode 01777) if needed.
    pub fn open_or_create(dir: &Path) -> Result<Ledger, LedgerError> {
        Ok(Ledger::new(file::open_or_create(dir)?))
    }

    fn new(m: Mapping) -> Ledger {
        Ledger {
            m,
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

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.m.path
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

    /// Take the cold-path lock (times out after [`file::LOCK_TIMEOUT`]); repairs the derived
    /// sums when the previous holder died.
    pub fn lock(&self) -> Result<LockGuard<'_>, LedgerError> {
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
        for (si, s) in self.slices().iter().enumerate() {
            let n = self
                .procs()
                .iter()
                .filter(|p| p.state.load(SeqCst) != STATE_FREE)
                .filter(|p| {
                    p.devices
                        .iter()
                        .any(|pd| pd.slice.load(SeqCst) as usize == si)
                })
                .count();
            s.attached.store(n as u32, SeqCst);
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
        let _ = self.reap_dead();
        let _g = self.lock()?;
        for (i, p) in self.procs().iter().enumerate() {
            if p.state.load(SeqCst) != STATE_FREE || !file::take_liveness(self.m.fd, i) {
                continue;
            }
            p.pid.store(std::process::id(), SeqCst);
            p.start_time.store(file::own_start_time(), SeqCst);
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
        Err(LedgerError::Full("process"))
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
        let _g = self.lock()?;
        let p = &self.procs()[h.slot];
        let pd = &p.devices[device];
        if let Some(s) = Some(pd.slice.load(SeqCst)).filter(|&s| s != ACCOUNT_NONE) {
            let limit = self.slices()[s as usize].memory_limit.load(SeqCst);
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
                let name = req
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("pid-{}", std::process::id()));
                if !crate::quantity::storable_name(&name) {
                    return Err(LedgerError::BadName(name));
                }
                self.create_slice_locked(
                    &name,
                    device,
                    req.memory,
                    req.compute_share_ppm,
                    req.compute_cap_ppm,
                    req.name.is_none(),
                    false,
                    &req.memory_setting,
                    &req.compute_setting,
                )?
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
        let p = &self.procs()[h.slot];
        let pd = &p.devices[device];
        let d = &self.devices()[device];
        match pd.account.load(SeqCst) {
            ACCOUNT_NONE => None,
            ACCOUNT_BEST_EFFORT => Some(Account::new(d, None, p, pd)),
            s => Some(Account::new(d, Some(&self.slices()[s as usize]), p, pd)),
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
        let d = &self.devices()[device];
        let uuid = d.uuid.get();
        let si = self
            .slices()
            .iter()
            .position(|s| s.state.load(SeqCst) == STATE_FREE)
            .ok_or(LedgerError::Full("slice"))?;
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
            let be = d.best_effort_used.load(SeqCst);
            let fits = before
                .checked_add(l)
                .and_then(|r| r.checked_add(be))
                .is_some_and(|v| v <= total);
            if !fits {
                d.memory_reserved.fetch_sub(l, SeqCst);
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
        unsafe { s.name.set(name) };
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
        s.state.store(STATE_ACTIVE, SeqCst);
        Ok(si)
    }

    /// Create an operator-defined slice (persists when empty; processes naming it get its
    /// values). Errors: unknown device, bad name, already exists, admission.
    pub fn create_operator_slice(&self, spec: &OperatorSlice) -> Result<usize, LedgerError> {
        if !crate::quantity::valid_slice_name(&spec.name) {
            return Err(LedgerError::BadName(spec.name.clone()));
        }
        let _g = self.lock()?;
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
        self.create_slice_locked(
            &spec.name,
            dev,
            Some(spec.memory),
            spec.compute_share_ppm,
            spec.compute_cap_ppm,
            false,
            true,
            "--memory",
            "--compute",
        )
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
        Ok(removed)
    }

    fn free_slice_locked(&self, si: usize) {
        let s = &self.slices()[si];
        let d = &self.devices()[s.device.load(SeqCst) as usize];
        s.state.store(STATE_FREE, SeqCst);
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
    pub fn is_alive(&self, slot: usize) -> bool {
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
        // Every (device, account) a dying process is charged to.
        let mut accounts: Vec<(usize, u32)> = vec![];
        for &i in &dying {
            for (d, pd) in procs[i].devices.iter().enumerate() {
                let a = pd.account.load(SeqCst);
                if a != ACCOUNT_NONE && !accounts.contains(&(d, a)) {
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
                    proc_: p,
                    charged: &p.devices[d].charged,
                })
                .collect();
            match dead_part(counter, reaping, &live) {
                Some(n) => {
                    counter.fetch_sub(n, SeqCst);
                    out.bytes_returned += n;
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
                bytes: p.devices.iter().map(|pd| pd.charged.load(SeqCst)).sum(),
            });
            // Its compute lease and place in the queue go before its slices do.
            crate::tenants::reap_proc(self.devices(), self.slices(), p);
            for pd in &p.devices {
                let s = pd.slice.load(SeqCst);
                pd.account.store(ACCOUNT_NONE, SeqCst);
                pd.slice.store(ACCOUNT_NONE, SeqCst);
                pd.charged.store(0, SeqCst);
                if s != ACCOUNT_NONE {
                    let sl = &self.slices()[s as usize];
                    let left = sl.attached.fetch_sub(1, SeqCst).saturating_sub(1);
                    if left == 0
                        && sl.operator_defined.load(SeqCst) == 0
                        && sl.state.load(SeqCst) == STATE_ACTIVE
                    {
                        out.slices_removed.push(sl.name.get());
                        self.free_slice_locked(s as usize);
                    }
                }
            }
            p.pid.store(0, SeqCst);
            p.state.store(STATE_FREE, SeqCst);
        }
        out
    }

    /// A consistent-enough copy of everything, for display and decisions (no lock taken).
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
                compute_reserved_ppm: d.compute_reserved.load(SeqCst) as u32,
            });
        }
        let alive: Vec<bool> = (0..MAX_PROCS)
            .map(|i| self.procs()[i].state.load(SeqCst) == STATE_ACTIVE && self.is_alive(i))
            .collect();
        for (si, s) in self.slices().iter().enumerate() {
            if s.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let dev = s.device.load(SeqCst) as usize;
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
                members
                    .iter()
                    .map(|p| p.devices[dev].charged.load(SeqCst))
                    .sum()
            } else {
                s.memory_used.0.load(SeqCst)
            };
            snap.slices.push(SliceInfo {
                index: si,
                name: s.name.get(),
                device: dev,
                device_uuid: self.devices()[dev].uuid.get(),
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
            });
        }
        for d in &mut snap.devices {
            let quota: u64 = snap
                .slices
                .iter()
                .filter(|s| s.device == d.index && s.memory_limit.is_some())
                .map(|s| s.memory_used)
                .sum();
            d.memory_used = quota + d.best_effort_used;
        }
        for (i, p) in self.procs().iter().enumerate() {
            if p.state.load(SeqCst) == STATE_FREE {
                continue;
            }
            let devices: Vec<ProcDeviceInfo> = p
                .devices
                .iter()
                .enumerate()
                .filter(|(_, pd)| pd.slice.load(SeqCst) != ACCOUNT_NONE)
                .map(|(d, pd)| ProcDeviceInfo {
                    device: d,
                    slice: pd.slice.load(SeqCst) as usize,
                    charged: pd.charged.load(SeqCst),
                })
                .collect();
            snap.processes.push(ProcInfo {
                slot: i,
                pid: p.pid.load(SeqCst),
                start_time: p.start_time.load(SeqCst),
                slice: p.slice_name.get(),
                alive: alive[i],
                memory_used: devices.iter().map(|d| d.charged).sum(),
                devices,
            });
        }
        snap
    }
}
