//! Node mode: the policy's cold paths, run by the root monitor only (docs/security.md).
//!
//! In node mode the `ledger` file is the *policy*: root-owned, mode 0644, written only by the
//! monitor, mapped read-only by everyone else. Processes never take its mutex (they cannot:
//! their mapping is read-only). They ask the monitor over `monitor.sock`, which runs
//! [`Policy::admit`] for them with the identity the kernel gives (`SO_PEERCRED`) and answers
//! with the slice regions (`region.rs`) where their hot paths write.
//!
//! Liveness is the monitor's own record: the pid it saw and that pid's start time, checked
//! by the monitor in its PID namespace (no lock a tenant could hold or fake). The reaper works
//! as in personal mode (`account.rs`), on the counters of each slice's region.

use crate::account::{dead_part, Member};
use crate::dir::{Owner, RuntimeDir};
use crate::error::LedgerError;
use crate::file;
use crate::layout::*;
use crate::ledger::{Ledger, ProcHandle, SliceRequest};
use crate::region::{region_key, Regions};
use crate::snapshot::{Reaped, ReapedProc};
use core::sync::atomic::Ordering::SeqCst;
use std::path::Path;
use std::sync::Arc;

/// Who asks, as the kernel and `/proc` tell the monitor.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// pid in the monitor's PID namespace (`SO_PEERCRED`).
    pub host_pid: u32,
    /// pid in the process's own namespace (the last `NSpid`), for display and the audit.
    pub nspid: u32,
    /// uid (`SO_PEERCRED`).
    pub uid: u32,
    /// Start time of `host_pid` (`/proc/<pid>/stat` field 22), read by the monitor.
    pub start_time: u64,
    /// Inode of its PID namespace (0: unknown), so a reader in that namespace can tell whether
    /// `nspid` still runs (`status`'s `alive`).
    pub pid_ns: u64,
}

/// Per-user bounds on the policy's tables (docs/security.md, "Bounds").
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Process records one uid may hold.
    pub procs_per_uid: usize,
    /// Slice records one uid's processes may create.
    pub slices_per_uid: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            procs_per_uid: MAX_PROCS / 2,
            slices_per_uid: MAX_SLICES / 2,
        }
    }
}

/// What a process asks for on one of its devices.
#[derive(Debug, Clone)]
pub struct DeviceAsk {
    /// The device's UUID (must be one the monitor registered from NVML).
    pub uuid: String,
    /// Slice name and settings.
    pub req: SliceRequest,
}

/// One device of an admitted process.
#[derive(Debug, Clone)]
pub struct AdmittedDevice {
    /// The UUID asked for.
    pub uuid: String,
    /// Ledger device index.
    pub device: usize,
    /// Slice record joined.
    pub slice: usize,
    /// The region its allocations are charged in (`region_key`).
    pub key: u32,
    /// Quota (`None`: best effort).
    pub memory_limit: Option<u64>,
    /// Best effort: the allowance (of this uid on this device) it charges into.
    pub allowance: Option<usize>,
    /// Lines for the user.
    pub warnings: Vec<String>,
}

/// An admitted process.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// Its policy record.
    pub slot: usize,
    /// Per device asked for, in order.
    pub devices: Vec<AdmittedDevice>,
}

/// How a wrapped process found the ledger.
pub enum Opened {
    /// A personal ledger, mapped read-write: the process admits itself.
    Personal(Ledger),
    /// A node policy, mapped read-only: the process asks the monitor.
    Node(Ledger),
}

impl Ledger {
    /// Whether this is a node policy.
    pub fn is_node(&self) -> bool {
        self.header().mode.load(SeqCst) == MODE_NODE
    }

    /// What a wrapped process opens: in its own directory a personal ledger (created when
    /// missing) or, if the directory holds the node policy, that policy read-only; in root's
    /// directory the node policy, read-only (never creating anything). Root in a container
    /// whose node directory is mounted read-only (every slice's CDI spec mounts it so) finds
    /// its own directory unwritable: the node policy there is opened read-only as well.
    pub fn open_for_process(dir: &Path) -> Result<Opened, LedgerError> {
        let d = RuntimeDir::open_or_create(dir)?;
        if d.owner() == Owner::Caller {
            let l = match Ledger::open_in(d, true) {
                Err(LedgerError::NotFound(_)) => Ledger::open_or_create(dir)?,
                Err(LedgerError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::EROFS) =>
                {
                    let l = Ledger::open_in(RuntimeDir::open(dir)?, false)?;
                    if !l.is_node() {
                        return Err(LedgerError::Monitor(format!(
                            "{} is a personal ledger on a read-only mount; mount it read-write, \
                             or run the node's monitor (`gpuslice monitor --mode node`)",
                            l.path().display()
                        )));
                    }
                    return Ok(Opened::Node(l));
                }
                other => other?,
            };
            if !l.is_node() {
                return Ok(Opened::Personal(l));
            }
            return Ok(Opened::Node(Ledger::open_in(
                RuntimeDir::open(dir)?,
                false,
            )?));
        }
        let l = match Ledger::open_in(d, false) {
            Err(LedgerError::NotFound(p)) => {
                return Err(LedgerError::Monitor(format!(
                    "{} holds no node policy yet: the node's monitor is not running (ask the \
                     operator to start `gpuslice monitor` as root)",
                    p.display()
                )))
            }
            Err(LedgerError::Io { source, path, .. })
                if source.raw_os_error() == Some(libc::EACCES) =>
            {
                return Err(LedgerError::Monitor(format!(
                    "{} is root's personal ledger, not a node policy: on a shared node start \
                     the monitor with `gpuslice monitor --mode node`; or set \
                     GPUSLICE_RUNTIME_DIR to a directory of your own",
                    path.display()
                )))
            }
            other => other?,
        };
        if !l.is_node() {
            return Err(LedgerError::Monitor(format!(
                "{} is not a node policy; set GPUSLICE_RUNTIME_DIR to a directory of your own",
                l.path().display()
            )));
        }
        Ok(Opened::Node(l))
    }

    /// Open or create the node policy in `dir` (the root monitor, `--mode node`). Refuses a
    /// directory root does not own and a personal ledger found there.
    pub fn open_or_create_node(dir: &Path) -> Result<Policy, LedgerError> {
        if crate::dir::euid() != 0 {
            return Err(LedgerError::Monitor(
                "node mode needs root: the policy must be a file tenants cannot write".into(),
            ));
        }
        let d = RuntimeDir::open_or_create(dir)?;
        let m = file::open_or_create(&d, 0o644, MODE_NODE)?;
        let l = Ledger::from_parts(m, d);
        if !l.is_node() {
            return Err(LedgerError::Monitor(format!(
                "{} is a personal ledger; stop the processes using it and remove it before \
                 starting the node's monitor there",
                l.path().display()
            )));
        }
        Ok(Policy(Arc::new(l)))
    }
}

/// The node policy as its root monitor holds it, from [`Ledger::open_or_create_node`]: the
/// only handle on which processes are admitted and the policy's upkeep (reaping, allowances,
/// usage) runs, so that no code can do either on a personal ledger or on a read-only
/// mapping of the policy. Everything else is the [`Ledger`] it derefs to.
#[derive(Clone)]
pub struct Policy(Arc<Ledger>);

impl core::ops::Deref for Policy {
    type Target = Ledger;
    fn deref(&self) -> &Ledger {
        &self.0
    }
}

impl Policy {
    /// The policy's paths over any ledger, whatever its header says: for fuzzing them over
    /// hostile files. Test builds only (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn assume(ledger: Ledger) -> Policy {
        Policy(Arc::new(ledger))
    }

    /// The ledger itself, shared: for the threads that only read it.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.0
    }

    /// The monitor's tick: rebalance every device's best-effort allowances.
    pub fn rebalance_allowances(&self) -> Result<(), LedgerError> {
        let _g = self.lock()?;
        for d in 0..MAX_DEVICES {
            self.rebalance_allowances_locked(d);
        }
        Ok(())
    }

    /// Admit a process: claim a policy record for `peer`, join (or create) its slice on every
    /// device it asked for, with admission control and the per-uid bounds. Monitor only.
    pub fn admit(
        &self,
        peer: &Peer,
        display_name: &str,
        asks: &[DeviceAsk],
        limits: &Limits,
    ) -> Result<Admitted, LedgerError> {
        self.admit_with_secret(peer, display_name, asks, limits, None)
    }

    /// [`Policy::admit`] for a process that gave a join secret (`GPUSLICE_SLICE_SECRET`): a
    /// slice made with a secret admits a non-root process only with that secret (`secret.rs`).
    pub fn admit_with_secret(
        &self,
        peer: &Peer,
        display_name: &str,
        asks: &[DeviceAsk],
        limits: &Limits,
        secret: Option<&str>,
    ) -> Result<Admitted, LedgerError> {
        let _g = self.lock()?;
        let names: Vec<&str> = asks.iter().filter_map(|a| a.req.name.as_deref()).collect();
        self.check_join_secret_locked(peer.uid, &names, secret)?;
        let procs = self.procs();
        let mine = procs
            .iter()
            .filter(|p| p.state.load(SeqCst) != STATE_FREE && p.uid.load(SeqCst) == peer.uid)
            .count();
        if mine >= limits.procs_per_uid {
            return Err(LedgerError::UserLimit {
                uid: peer.uid,
                holds: mine,
                table: "process",
                flag: "--max-procs-per-user",
            });
        }
        // One record per process: asking again cannot multiply its slots.
        if procs.iter().any(|p| {
            p.state.load(SeqCst) == STATE_ACTIVE
                && p.host_pid.load(SeqCst) == peer.host_pid
                && p.start_time.load(SeqCst) == peer.start_time
        }) {
            return Err(LedgerError::Monitor(format!(
                "pid {} is admitted already (one record per process)",
                peer.nspid
            )));
        }
        let slot = procs
            .iter()
            .position(|p| p.state.load(SeqCst) == STATE_FREE)
            .ok_or_else(|| self.procs_full())?;
        let p = &procs[slot];
        p.pid.store(peer.nspid, SeqCst);
        p.host_pid.store(peer.host_pid, SeqCst);
        p.uid.store(peer.uid, SeqCst);
        p.start_time.store(peer.start_time, SeqCst);
        p.pid_ns.store(peer.pid_ns, SeqCst);
        // SAFETY: under the lock, record not yet published.
        unsafe { p.slice_name.set(display_name) };
        for pd in &p.devices {
            pd.slice.store(ACCOUNT_NONE, SeqCst);
            pd.account.store(ACCOUNT_NONE, SeqCst);
            pd.charged.store(0, SeqCst);
        }
        p.state.store(STATE_ACTIVE, SeqCst);
        let h = ProcHandle { slot };
        let mut out = Admitted {
            slot,
            devices: vec![],
        };
        let result = (|| {
            for ask in asks {
                let dev = self
                    .find_device(&ask.uuid)
                    .filter(|_| !ask.uuid.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| {
                        LedgerError::Monitor(format!(
                            "device {:?} is not one the node's monitor knows (NVML did not list \
                             it)",
                            ask.uuid
                        ))
                    })?;
                let owned = self
                    .slices()
                    .iter()
                    .filter(|s| {
                        s.state.load(SeqCst) == STATE_ACTIVE && s.owner_uid.load(SeqCst) == peer.uid
                    })
                    .count();
                let creates = match ask.req.name.as_deref() {
                    Some(n) => self.slice_for(n, dev, peer.uid)?.is_none(),
                    None => true,
                };
                if creates && owned >= limits.slices_per_uid {
                    return Err(LedgerError::UserLimit {
                        uid: peer.uid,
                        holds: owned,
                        table: "slice",
                        flag: "--max-slices-per-user",
                    });
                }
                let j = self.join_locked(h, dev, &ask.req, peer.nspid, peer.uid)?;
                let allowance = if j.memory_limit.is_none() {
                    let i = self.allowance_for_locked(dev, peer.uid)?;
                    p.devices[dev]
                        .account
                        .store(ALLOWANCE_ACCOUNT_BASE + i as u32, SeqCst);
                    self.allowances()[i].members.fetch_add(1, SeqCst);
                    Some(i)
                } else {
                    None
                };
                let account = p.devices[dev].account.load(SeqCst);
                let key = region_key(account, dev).ok_or(LedgerError::Corrupt("account"))?;
                out.devices.push(AdmittedDevice {
                    uuid: ask.uuid.clone(),
                    device: dev,
                    slice: j.slice,
                    key,
                    memory_limit: j.memory_limit,
                    allowance,
                    warnings: j.warnings,
                });
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.release_locked(slot);
            return Err(e);
        }
        for d in &out.devices {
            if d.allowance.is_some() {
                self.rebalance_allowances_locked(d.device);
            }
        }
        Ok(out)
    }

    /// Undo an admission that failed half-way (nothing was charged yet).
    fn release_locked(&self, slot: usize) {
        let p = &self.procs()[slot];
        for pd in &p.devices {
            self.leave_allowance_locked(pd.account.load(SeqCst));
            let s = pd.slice.load(SeqCst);
            pd.slice.store(ACCOUNT_NONE, SeqCst);
            pd.account.store(ACCOUNT_NONE, SeqCst);
            if let Some(sl) = self.slices().get(s as usize) {
                self.leave_slice_locked(s as usize, sl);
            }
        }
        p.pid.store(0, SeqCst);
        p.state.store(STATE_FREE, SeqCst);
    }

    /// Node mode: find processes the monitor's liveness check says are gone (`alive`), return
    /// what they held to their slices' regions, free their records and the slices they leave
    /// empty. Every word read from a region is hostile: counts saturate, nothing is indexed
    /// with it.
    pub fn reap_node(
        &self,
        alive: &dyn Fn(&Proc) -> bool,
        regions: &dyn Regions,
    ) -> Result<Reaped, LedgerError> {
        let g = self.lock()?;
        let mut out = Reaped::default();
        let procs = self.procs();
        for p in procs {
            if p.state.load(SeqCst) == STATE_ACTIVE && !alive(p) {
                p.state.store(STATE_DYING, SeqCst);
            }
        }
        let dying: Vec<usize> = (0..MAX_PROCS)
            .filter(|&i| procs[i].state.load(SeqCst) == STATE_DYING)
            .collect();
        if dying.is_empty() {
            return Ok(out);
        }
        let mut keys: Vec<(usize, u32, u32)> = vec![]; // (device, account, region key)

        // Exported allocations: as in a personal ledger (`ledger/shared/`), on the regions.
        let freed_shared = self.reap_shared_locked(&dying, &mut out);
        let accounts = dying
            .iter()
            .flat_map(|&i| {
                procs[i]
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(d, pd)| (d, pd.account.load(SeqCst)))
            })
            .chain(freed_shared.iter().copied());
        for (d, a) in accounts {
            if let Some(k) = region_key(a, d) {
                if !keys.iter().any(|x| x.2 == k) {
                    keys.push((d, a, k));
                }
            }
        }
        let mut unresolved: Vec<u32> = vec![];
        for &(d, a, k) in &keys {
            let Some(r) = regions.get(k) else {
                continue; // no region: nothing was ever charged there
            };
            let live: Vec<Member<'_>> = procs
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    p.state.load(SeqCst) == STATE_ACTIVE && p.devices[d].account.load(SeqCst) == a
                })
                .filter_map(|(i, _)| r.proc_(i))
                .map(|rp| Member {
                    begun: &rp.ops_begun,
                    ended: &rp.ops_ended,
                    charged: &rp.charged,
                })
                .collect();
            let h = r.header();
            match dead_part(&h.memory_used.0, &h.reaping, &live) {
                Some(dead) => {
                    let n = dead.saturating_sub(self.shared_held(d, a));
                    let _ = h
                        .memory_used
                        .0
                        .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n)));
                    out.bytes_returned = out.bytes_returned.saturating_add(n);
                }
                None => unresolved.push(k),
            }
        }
        for &i in &dying {
            let p = &procs[i];
            let keys_of = |d: usize, pd: &ProcDevice| region_key(pd.account.load(SeqCst), d);
            if p.devices
                .iter()
                .enumerate()
                .any(|(d, pd)| keys_of(d, pd).is_some_and(|k| unresolved.contains(&k)))
            {
                continue; // retried at the next reap
            }
            let mut bytes = 0u64;
            for (d, pd) in p.devices.iter().enumerate() {
                if let Some(rp) = keys_of(d, pd).and_then(|k| regions.get(k)) {
                    if let Some(w) = rp.proc_(i) {
                        bytes = bytes.saturating_add(w.charged.swap(0, SeqCst));
                        w.contexts.store(0, SeqCst);
                        w.ops_begun.store(0, SeqCst);
                        w.ops_ended.store(0, SeqCst);
                    }
                }
            }
            out.processes.push(ReapedProc {
                pid: p.pid.load(SeqCst),
                bytes,
            });
            self.free_dead_record_locked(i, p, &mut out);
        }
        for (_, a) in freed_shared {
            out.slices_removed
                .extend(self.drop_kept_slice_locked(&g, a));
        }
        if !out.slices_removed.is_empty() {
            self.prune_secrets_locked();
        }
        Ok(out)
    }

    /// The policy slot of the admitted process `host_pid` started at `start_time` (the
    /// monitor's record of a connected peer).
    pub fn admitted_slot(&self, host_pid: u32, start_time: u64) -> Option<usize> {
        self.procs().iter().position(|p| {
            p.state.load(SeqCst) == STATE_ACTIVE
                && p.host_pid.load(SeqCst) == host_pid
                && p.start_time.load(SeqCst) == start_time
        })
    }

    /// Node mode: copy what the regions say into the policy's usage words, so every reader of
    /// the policy (`status`, `metrics`, the audit, NVML-only processes) sees it, at most one
    /// monitor tick old. Region values are clamped for display; nothing else depends on them.
    pub fn mirror_usage(&self, regions: &dyn Regions) {
        if !self.writable() {
            return;
        }
        for (si, s) in self.slices().iter().enumerate() {
            if s.state.load(SeqCst) != STATE_ACTIVE || s.memory_limit.load(SeqCst) == NO_LIMIT {
                continue;
            }
            if let Some(r) = regions.get(si as u32) {
                let h = r.header();
                s.memory_used.0.store(h.memory_used.load(SeqCst), SeqCst);
                s.alloc_total.store(h.alloc_total.load(SeqCst), SeqCst);
                s.alloc_denied_total
                    .store(h.alloc_denied_total.load(SeqCst), SeqCst);
            }
        }
        for (d, dev) in self.devices().iter().enumerate() {
            if dev.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let mut sum = 0u64;
            for (i, p) in self.allowances().iter().enumerate() {
                if p.state.load(SeqCst) != STATE_ACTIVE || p.device.load(SeqCst) as usize != d {
                    continue;
                }
                let used = regions
                    .get(ALLOWANCE_ACCOUNT_BASE + i as u32)
                    .map_or(0, |r| r.header().memory_used.load(SeqCst));
                p.used.store(used, SeqCst);
                sum = sum.saturating_add(used);
            }
            dev.best_effort_used.store(sum, SeqCst);
        }
        // Each slice's contexts: what its members say of their own charge is context, each
        // clamped to that charge (hostile words move only their own slice's display).
        let mut contexts = vec![0u64; self.slices().len()];
        for (i, p) in self.procs().iter().enumerate() {
            if p.state.load(SeqCst) == STATE_FREE {
                continue;
            }
            for (d, pd) in p.devices.iter().enumerate() {
                let account = pd.account.load(SeqCst);
                let (v, ctx) = region_key(account, d)
                    .and_then(|k| regions.get(k))
                    .and_then(|r| {
                        r.proc_(i).map(|w| {
                            let c = w.charged.load(SeqCst);
                            (c, w.contexts.load(SeqCst).min(c))
                        })
                    })
                    .unwrap_or((0, 0));
                pd.charged.store(v, SeqCst);
                if let Some(sum) = contexts.get_mut(account as usize) {
                    *sum = sum.saturating_add(ctx);
                }
            }
        }
        for (s, ctx) in self.slices().iter().zip(contexts) {
            if s.state.load(SeqCst) == STATE_ACTIVE {
                let used = s.memory_used.0.load(SeqCst);
                s.context_used.store(ctx.min(used), SeqCst);
            }
        }
    }
}
