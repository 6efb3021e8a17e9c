//! Joining a slice and making a new one: what a process asks for ([`SliceRequest`]), the
//! slice it gets ([`Joined`]), and the fit rule: a new slice's memory and compute share against
//! what its device has left (refused with a [`crate::FitError`]). Apart because it is the one
//! place that decides whether a slice fits; operator slices (`slices.rs`) come through it too.
//! (The monitor's socket server that admits processes in node mode is another thing:
//! `monitor/src/admission.rs`.)

use super::procs::ProcHandle;
use super::Ledger;
use crate::account::Account;
use crate::error::{human_bytes, FitError, LedgerError};
use crate::layout::*;
use core::sync::atomic::Ordering::SeqCst;

/// What a process asks for on one device.
#[derive(Debug, Clone)]
pub struct SliceRequest {
    /// Slice name; `None` for a private slice of this process.
    pub name: Option<String>,
    /// Quota in bytes; `None` = best effort (charged to the device's unreserved memory).
    pub memory: Option<u64>,
    /// Guaranteed compute share.
    pub compute_share: Share,
    /// Compute cap.
    pub compute_cap: Cap,
    /// The setting the memory came from, for messages (the caller's: a variable, a flag).
    pub memory_setting: String,
    /// The setting the share came from, for messages.
    pub compute_setting: String,
}

impl SliceRequest {
    /// A request for memory alone: slice `name` (`None`: a private slice) with quota `memory`
    /// (`None`: best effort), no compute share, no cap; messages name the settings `memory`
    /// and `compute share` (callers that read settings say which in the fields).
    pub fn new(name: Option<&str>, memory: Option<u64>) -> SliceRequest {
        SliceRequest {
            name: name.map(Into::into),
            memory,
            compute_share: Share::NONE,
            compute_cap: Cap::NONE,
            memory_setting: "memory".into(),
            compute_setting: "compute share".into(),
        }
    }
}

/// Who a new slice is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// A process's private slice (`pid-<pid>`).
    Private,
    /// A slice a process named.
    Named,
    /// An operator's (`slice create`, the DRA plugin).
    Operator,
}

/// A slice to make ([`Ledger::create_slice_locked`]).
pub(super) struct NewSlice<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its ledger device.
    pub device: usize,
    /// Its quota (`None`: best effort).
    pub memory: Option<u64>,
    /// Its guaranteed share.
    pub share: Share,
    /// Its cap.
    pub cap: Cap,
    /// Who it is for.
    pub origin: Origin,
    /// The setting the memory came from, for a refusal's message.
    pub memory_setting: &'a str,
    /// The setting the share came from, for a refusal's message.
    pub compute_setting: &'a str,
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

fn frac(ppm: u64) -> String {
    format!("{:.2}", ppm as f64 / PPM as f64)
}

impl Ledger {
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
        let existing = match req.name.as_deref() {
            Some(n) => self.slice_for(n, device, uid)?,
            None => None,
        };
        let si = match existing {
            Some(si) => {
                let s = &self.slices()[si];
                let limit = s.memory_limit.load(SeqCst);
                let (share, cap) = (s.share(), s.cap());
                let asked = req.memory.unwrap_or(NO_LIMIT);
                // Only what the process asked for can conflict: no quota, no share and no cap
                // are "whatever the slice has", so joining silently is right.
                let conflicts = req.memory.is_some_and(|m| m != limit)
                    || (!req.compute_share.is_none() && req.compute_share != share)
                    || (!req.compute_cap.is_none() && req.compute_cap != cap);
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
                        frac(share.ppm() as u64),
                        frac(cap.ppm() as u64),
                        show(asked),
                        frac(req.compute_share.ppm() as u64),
                        frac(req.compute_cap.ppm() as u64),
                    ));
                }
                si
            }
            None => {
                let name = req.name.clone().unwrap_or_else(|| format!("pid-{pid}"));
                if !gpuslice_quantity::storable_name(&name) {
                    return Err(LedgerError::BadName(name));
                }
                let si = self.create_slice_locked(&NewSlice {
                    name: &name,
                    device,
                    memory: req.memory,
                    share: req.compute_share,
                    cap: req.compute_cap,
                    origin: if req.name.is_none() {
                        Origin::Private
                    } else {
                        Origin::Named
                    },
                    memory_setting: &req.memory_setting,
                    compute_setting: &req.compute_setting,
                })?;
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

    /// The slice a process of `uid` ([`ANY_UID`]: personal mode, one user) means by `name` on
    /// `device`, if it exists. Names are namespaced by owner in node mode, so that no tenant can
    /// take a name another user or the operator will use: an operator slice of that name
    /// (which the operator reserves; refused when it belongs to another uid), else the slice
    /// of that name `uid` made itself; another tenant's slice of the same name is a different
    /// slice, never joined and never in the way.
    pub(crate) fn slice_for(
        &self,
        name: &str,
        device: usize,
        uid: u32,
    ) -> Result<Option<usize>, LedgerError> {
        if uid == ANY_UID {
            return Ok(self.named_on(name, device).next());
        }
        if let Some(si) = self.operator_slice(name, device) {
            let owner = self.slices()[si].owner_uid.load(SeqCst);
            if owner != ANY_UID && owner != uid {
                return Err(LedgerError::Monitor(format!(
                    "slice {name:?} belongs to uid {owner}: the processes of one slice trust \
                     each other, so only uid {owner} may join it (choose another \
                     GPUSLICE_SLICE)"
                )));
            }
            return Ok(Some(si));
        }
        Ok(self.named_on(name, device).find(|&si| {
            let s = &self.slices()[si];
            s.operator_defined.load(SeqCst) == 0 && s.owner_uid.load(SeqCst) == uid
        }))
    }

    /// Whether a process of `uid` naming `name` (`None`: a private slice, always new) on
    /// `device` would join a slice that exists (node mode's admission: a new reservation is
    /// checked against the device as it physically is).
    pub fn joins_existing(&self, name: Option<&str>, device: usize, uid: u32) -> bool {
        name.is_some_and(|n| matches!(self.slice_for(n, device, uid), Ok(Some(_))))
    }

    /// The operator slice called `name` on `device` (at most one: operator names are unique
    /// per device, whatever tenants named their own slices).
    pub(crate) fn operator_slice(&self, name: &str, device: usize) -> Option<usize> {
        self.named_on(name, device)
            .find(|&si| self.slices()[si].operator_defined.load(SeqCst) != 0)
    }

    /// The slice records an operator command on `name` acts on: the operator slices called
    /// `name` (one per device), or, where there is none, every named slice of that name (root
    /// acting on tenants' own slices).
    pub(crate) fn operator_targets(&self, name: &str) -> Vec<usize> {
        let named: Vec<usize> = self
            .slices()
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.state.load(SeqCst) == STATE_ACTIVE
                    && s.private.load(SeqCst) == 0
                    && s.name.get() == name
            })
            .map(|(si, _)| si)
            .collect();
        let ops: Vec<usize> = named
            .iter()
            .copied()
            .filter(|&si| self.slices()[si].operator_defined.load(SeqCst) != 0)
            .collect();
        if ops.is_empty() {
            named
        } else {
            ops
        }
    }

    /// The named (not private) active slices called `name` on `device`, of every owner.
    fn named_on<'a>(&'a self, name: &'a str, device: usize) -> impl Iterator<Item = usize> + 'a {
        self.slices().iter().enumerate().filter_map(move |(si, s)| {
            (s.state.load(SeqCst) == STATE_ACTIVE
                && s.private.load(SeqCst) == 0
                && s.device.load(SeqCst) as usize == device
                && s.name.get() == name)
                .then_some(si)
        })
    }

    /// Admission + creation of `new`; caller holds the lock.
    pub(super) fn create_slice_locked(&self, new: &NewSlice<'_>) -> Result<usize, LedgerError> {
        let &NewSlice {
            name,
            device,
            memory,
            share,
            cap,
            origin,
            memory_setting,
            compute_setting,
        } = new;
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
        if !gpuslice_sched::admits(cpu, share) {
            return Err(FitError {
                setting: compute_setting.into(),
                device: uuid,
                requested: frac(share.ppm() as u64),
                available: frac((PPM as u64).saturating_sub(cpu)),
            }
            .into());
        }
        if let Some(l) = memory {
            // Raise the reservation first, then look at best effort (see account.rs).
            let total = d.memory_total.load(SeqCst);
            let before = d.memory_reserved.fetch_add(l, SeqCst);
            // Node mode: lower the best-effort grants to the new reservation first, then read
            // what the allowances hold (a charge racing the lowering is seen or undoes itself).
            self.rebalance_allowances_locked(device);
            let be = self.best_effort_now(device);
            let fits = before
                .checked_add(l)
                .and_then(|r| r.checked_add(be))
                .is_some_and(|v| v <= total);
            if !fits {
                d.memory_reserved.fetch_sub(l, SeqCst);
                self.rebalance_allowances_locked(device);
                return Err(FitError {
                    setting: memory_setting.into(),
                    device: uuid,
                    requested: human_bytes(l),
                    available: human_bytes(total.saturating_sub(before).saturating_sub(be)),
                }
                .into());
            }
        }
        d.compute_reserved.fetch_add(share.ppm() as u64, SeqCst);
        let s = &self.slices()[si];
        // SAFETY: under the lock, record not yet published (state FREE).
        unsafe {
            s.name.set(name);
        }
        s.device.store(device as u32, SeqCst);
        s.memory_limit.store(memory.unwrap_or(NO_LIMIT), SeqCst);
        s.memory_used.0.store(0, SeqCst);
        s.compute_share_ppm.store(share.ppm(), SeqCst);
        s.compute_cap_ppm.store(cap.ppm(), SeqCst);
        s.operator_defined
            .store((origin == Origin::Operator) as u32, SeqCst);
        s.private.store((origin == Origin::Private) as u32, SeqCst);
        s.attached.store(0, SeqCst);
        s.alloc_denied_total.store(0, SeqCst);
        s.alloc_total.store(0, SeqCst);
        s.sched.reset();
        s.owner_uid.store(ANY_UID, SeqCst);
        s.over_quota.store(0, SeqCst);
        s.audit_observed.store(0, SeqCst);
        s.violations_total.store(0, SeqCst);
        s.balloon_held.store(0, SeqCst);
        s.context_used.store(0, SeqCst);
        // SAFETY: under the lock, record not yet published.
        unsafe { s.claim.set("") };
        s.state.store(STATE_ACTIVE, SeqCst);
        self.header().slice_hwm.fetch_max(si as u32 + 1, SeqCst);
        Ok(si)
    }

    /// What best-effort processes hold on `device` now. Node mode: the allowances' live counters
    /// where the monitor's regions are at hand (after lowering the grants), else, for root's
    /// CLI, what the allowances may hold (their grants), which is never less.
    fn best_effort_now(&self, device: usize) -> u64 {
        if !self.is_node() {
            return self.devices()[device].best_effort_used.load(SeqCst);
        }
        self.allowances()
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.state.load(SeqCst) == STATE_ACTIVE && p.device.load(SeqCst) as usize == device
            })
            .fold(0u64, |a, (i, p)| {
                // An allowance's counter is its users' to write: it counts for at most its grant
                // (the monitor's), so lying high cannot block other slices' admission.
                let g = p.grant.load(SeqCst);
                let v = match self.regions.get() {
                    Some(r) => r
                        .get(ALLOWANCE_ACCOUNT_BASE + i as u32)
                        .map_or(0, |r| r.header().memory_used.load(SeqCst).min(g)),
                    None => g.max(p.used.load(SeqCst)),
                };
                a.saturating_add(v)
            })
    }
}
