//! A process's record: attaching (claim a free record, prove the process alive with an OFD
//! lock on the record's byte), liveness, and detaching. Apart from admission because a record
//! belongs to a process, whichever slices it then joins.

use super::Ledger;
use crate::error::LedgerError;
use crate::file;
use crate::layout::*;
use crate::snapshot::Reaped;
use core::sync::atomic::Ordering::{Acquire, SeqCst};

/// One device of one active process, as [`Ledger::members`] reads it. Each field is one load
/// of a record other processes write: a snapshot, checked against the table's bounds, and
/// nothing more (a tenant's own record may say anything its writer wants).
#[derive(Clone, Copy)]
pub struct Membership<'a> {
    /// Index of the process record.
    pub slot: usize,
    /// The process record itself (its pid, uid, start time ...).
    pub proc_: &'a Proc,
    /// Device index in the ledger.
    pub device: usize,
    /// The slice it joined there, when the record names one inside the table.
    pub slice: Option<usize>,
    /// The node-mode region its hot path writes, when the account word names one.
    pub region: Option<u32>,
}

/// This process's slot in the ledger. Dropping it does not detach; see [`Ledger::detach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcHandle {
    /// Index of the process record.
    pub slot: usize,
}

impl Ledger {
    /// Claim a process record for the calling process and prove it alive with an OFD lock.
    /// Reaps dead processes first so their slots and memory come back.
    pub fn attach(&self, slice_name: &str) -> Result<ProcHandle, LedgerError> {
        if self.is_node() {
            return Err(LedgerError::Monitor(
                "this is a node policy: processes are admitted by the node's monitor".into(),
            ));
        }
        let _ = self.reap_dead();
        let (pid_ns, outer_pid) = crate::procfs::own_pid_identity(); // /proc reads: not under the lock
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
        let uids = self
            .procs()
            .iter()
            .filter(|p| p.state.load(SeqCst) != STATE_FREE)
            .map(|p| p.uid.load(SeqCst));
        Ledger::table_full("process", MAX_PROCS, uids, |u, n| {
            format!("uid {u} holds {n}")
        })
    }

    fn set_owned(&self, slot: usize, on: bool) {
        let bit = 1u64 << (slot % 64);
        if on {
            self.owned[slot / 64].fetch_or(bit, SeqCst);
        } else {
            self.owned[slot / 64].fetch_and(!bit, SeqCst);
        }
    }

    /// Every device membership of every active process: the one walk over raw process records
    /// that callers outside the ledger need (the monitor's turns, region recovery, the plugin's
    /// pod view). A device where the record names neither a slice nor a region is skipped.
    pub fn members(&self) -> impl Iterator<Item = Membership<'_>> + '_ {
        self.procs()
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state.load(Acquire) == STATE_ACTIVE)
            .flat_map(|(slot, p)| {
                p.devices
                    .iter()
                    .enumerate()
                    .filter_map(move |(device, pd)| {
                        let slice =
                            Some(pd.slice.load(Acquire) as usize).filter(|&s| s < MAX_SLICES);
                        let region = crate::region::region_key(pd.account.load(Acquire), device);
                        (slice.is_some() || region.is_some()).then_some(Membership {
                            slot,
                            proc_: p,
                            device,
                            slice,
                            region,
                        })
                    })
            })
    }

    /// The slice process record `slot` joined on `device`, if any.
    pub fn slice_of(&self, slot: usize, device: usize) -> Option<usize> {
        let s = self
            .procs()
            .get(slot)?
            .devices
            .get(device)?
            .slice
            .load(Acquire) as usize;
        (s < MAX_SLICES).then_some(s)
    }

    /// Whether an active process record holds host pid `pid` (the monitor's own record).
    pub fn has_active_pid(&self, pid: u32) -> bool {
        self.procs()
            .iter()
            .any(|p| p.state.load(Acquire) == STATE_ACTIVE && p.host_pid.load(Acquire) == pid)
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
}
