//! Exported VMM allocations (`layout::Shared`): the charge of an allocation
//! exported as a POSIX descriptor stays on its exporter's account for as long as the driver
//! keeps the memory, which may be past the exporter's release or exit while another process
//! imported it and still holds or maps it.
//!
//! The exporter registers the allocation when it exports it ([`Ledger::share_export`]),
//! importers when they import it ([`Ledger::share_import`]) and leave when their last handle
//! and mapping go ([`Ledger::share_leave`]). When the exporter lets go first (released and
//! unmapped it, [`Ledger::share_let_go`], or died, the reaper) while a live importer holds it,
//! the bytes move from the exporter's `charged` word into the record's `held`, in the same
//! account's counter: `counter = Σ live members' charged + Σ held + updates in flight` stays
//! true, so the reaper's double collect (`account.rs`) returns `counter − Σ live charged −
//! Σ held` for the dead. The last importer to leave or die returns `held`.
//!
//! A descriptor outlives every handle: the driver keeps the memory for it (an exported POSIX
//! descriptor holds a reference, as an imported handle does), so it may be imported after
//! everyone let go, the exporter exited included. A record nobody is charged for any more
//! therefore becomes an *orphan* ([`STATE_ORPHAN`]) instead of going: its device, identity and
//! size stay, and the next process that imports it is charged for it as if it had allocated it,
//! here, under the lock, before the driver's import ([`Import::Adopted`]: it becomes the
//! record's exporter), or refused over its quota ([`Import::Refused`]). So handing a descriptor
//! to a friend and exiting moves the charge to the friend's slice when it imports, and never to
//! no slice; and since the charge is made here (in node mode by the monitor), a tenant that
//! hand-makes its requests cannot take an orphan over uncharged. An orphan is reused when the
//! table has no free record (that identity loses its size: see docs/architecture.md) or when a
//! new export has its identity (the old descriptor is gone: the kernel reuses an inode number
//! only once the file is freed).
//!
//! In node mode a record is not orphaned while a descriptor may be left: with no live
//! importer it keeps its last exporter's charge in `held` ([`Ledger::descriptor_held`]) until
//! the monitor's scan of `/proc/*/fd` finds no descriptor of it
//! ([`Ledger::share_release_unheld`]), or an import adopts it (the charge moves to the
//! importer's slice). Personal mode orphans it at once (one user, nobody to scan).
//!
//! The counters are where the account's are: in a personal ledger the slice's `memory_used` and
//! the process record's words; in node mode the slice's region (`region.rs`), where only the
//! monitor calls these, for the processes that ask over `monitor.sock` (the caller's slot is
//! the monitor's record of the connected process, never something it says).
//!
//! Every change here is made under the cold-path lock, like the reaper's, so none races it;
//! the hot paths never look at the table. What the records hold is checked before use
//! (indices, the account, bytes clamped to what the exporter was charged): a record can hold
//! at most what its exporter had charged on that device, only on the exporter's own account,
//! and only while a live process that imported the same descriptor holds it (node mode: or
//! while the monitor finds a descriptor of it open).
//!
//! One job a file: here the records and what a process does with them (export, import, let
//! go, leave); `counters.rs` where a record's bytes are counted (a personal ledger's words or
//! node mode's regions); `descriptors.rs` node mode's records only descriptors hold, for the
//! monitor's scan; `reap.rs` the records as the reaper and a slice's removal see them.

mod counters;
mod descriptors;
mod reap;

use super::{Ledger, LockGuard};
use crate::error::LedgerError;
use crate::layout::*;
use crate::ledger::ProcHandle;
use crate::snapshot::RemovedSlice;
use core::sync::atomic::Ordering::{Relaxed, Release, SeqCst};

/// The identity of an exported allocation: `(st_dev, st_ino)` of its shareable descriptor,
/// the same in the exporter and in every process the descriptor was passed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl ShareKey {
    /// The identity of descriptor `fd` (`None`: not a descriptor).
    pub fn of_fd(fd: i32) -> Option<ShareKey> {
        let st = crate::dir::fstat(fd).ok()?;
        Some(ShareKey {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }
}

/// What the exported-allocation records charge one slice on one device
/// ([`Ledger::record_charges`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordCharge {
    /// The ledger device.
    pub device: usize,
    /// The slice (its record index, the region's key).
    pub account: u32,
    /// Bytes the records hold themselves (their exporters gone).
    pub held: u64,
    /// (exporter's process slot, bytes it said it exported) of the records whose exporter is
    /// still registered; the bytes are the exporter's word, bounded by nothing but `limit`
    /// once the region that held its charge is gone.
    pub exported: Vec<(usize, u64)>,
    /// The slice's quota.
    pub limit: u64,
}

/// What [`Ledger::share_import`] did for a descriptor about to be imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Import {
    /// Someone is charged for the memory: the importer is counted on record `.0` and charged
    /// nothing.
    Held(usize),
    /// An orphan (nobody charged for it any more): the importer was charged `bytes` on ledger
    /// device `dev` and is record `rec`'s exporter now (if the driver's import fails, it lets
    /// go of it as an exporter: [`Ledger::share_let_go`]).
    Adopted {
        /// The record.
        rec: usize,
        /// Its ledger device.
        dev: usize,
        /// Bytes charged.
        bytes: u64,
    },
    /// An orphan of `bytes` on ledger device `dev` that does not fit the importer's quota:
    /// nothing changed; the import is refused as an allocation would be.
    Refused {
        /// Its ledger device.
        dev: usize,
        /// Bytes of the allocation.
        bytes: u64,
    },
    /// An orphan of `bytes` on ledger device `dev`, and the importer's account there keeps no
    /// record (node mode's best-effort allowance, or none): it charges itself, as for an
    /// allocation, until it lets go; the record stays an orphan.
    Charge {
        /// Its ledger device.
        dev: usize,
        /// Bytes of the allocation.
        bytes: u64,
    },
    /// Not an export gpuslice knows (or not counted: the record's importer entries are full):
    /// charged nothing.
    Unknown,
}

/// What an exporter letting go of an exported allocation does with its charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetGo {
    /// A live importer still holds the memory: the record holds the charge now (do not
    /// uncharge).
    HandedOver,
    /// Nobody else holds it: uncharge it. The record stays as an orphan, so a descriptor still
    /// around charges whoever imports it next.
    Uncharge,
    /// Nobody imported it yet, and the descriptor may still be on its way: it stays charged to
    /// the exporter until it exits (never less than the driver holds).
    Keep,
}

impl Ledger {
    /// The shared-allocation records.
    pub fn shared(&self) -> &[Shared; MAX_SHARED] {
        // SAFETY: SHARED_OFFSET..+MAX_SHARED*size lies in the mapping; records are atomics.
        unsafe { &*self.m.base.add(SHARED_OFFSET).cast() }
    }

    /// Process `me` exported `bytes` it was charged on ledger device `dev` as the descriptor
    /// `key`: the record (new, or the one it already made for `key`), `None` when the table is
    /// full (node mode: or holds [`SHARED_PER_UID`] of `me`'s user's), the process holds no
    /// account there (node mode: or a best-effort allowance's) or another process registered
    /// `key` (the charge then stays with `me` until it exits).
    pub fn share_export(
        &self,
        me: ProcHandle,
        dev: usize,
        key: ShareKey,
        bytes: u64,
    ) -> Result<Option<usize>, LedgerError> {
        let _g = self.lock()?;
        let Some(pd) = self.procs().get(me.slot).and_then(|p| p.devices.get(dev)) else {
            return Ok(None);
        };
        let account = pd.account.load(SeqCst);
        // Node mode's best-effort allowances go with their last member (their region too): a
        // best-effort export stays charged to its exporter until it exits.
        if account == ACCOUNT_NONE || (self.is_node() && account as usize >= MAX_SLICES) {
            return Ok(None);
        }
        let same = self.find_shared(key);
        if let Some(i) = same.filter(|&i| self.shared()[i].state.load(SeqCst) == STATE_ACTIVE) {
            let mine = self.shared()[i].exporter.load(SeqCst) == me.slot as u32;
            return Ok(mine.then_some(i));
        }
        let uid = self.procs()[me.slot].uid.load(SeqCst);
        let theirs = self
            .shared()
            .iter()
            .filter(|r| r.state.load(SeqCst) == STATE_ACTIVE && r.uid.load(SeqCst) == uid)
            .count();
        if self.is_node() && theirs >= SHARED_PER_UID {
            return Ok(None);
        }
        // An orphan of the same identity is stale (its descriptor is gone); else a free
        // record, else an orphan (its size is lost: docs/architecture.md).
        let state = |s| self.shared().iter().position(|r| r.state.load(SeqCst) == s);
        let Some(i) = same
            .or_else(|| state(STATE_FREE))
            .or_else(|| state(STATE_ORPHAN))
        else {
            return Ok(None);
        };
        let r = &self.shared()[i];
        r.device.store(dev as u32, SeqCst);
        r.account.store(account, SeqCst);
        r.exporter.store(me.slot as u32, SeqCst);
        r.key_dev.store(key.dev, SeqCst);
        r.key_ino.store(key.ino, SeqCst);
        r.bytes.store(bytes, SeqCst);
        r.held.store(0, SeqCst);
        r.imported.store(0, SeqCst);
        r.uid.store(uid, SeqCst);
        r.pid_ns
            .store(self.procs()[me.slot].pid_ns.load(SeqCst), SeqCst);
        for x in &r.importers {
            x.store(NO_SLOT, SeqCst);
        }
        r.state.store(STATE_ACTIVE, SeqCst);
        Ok(Some(i))
    }

    /// Process `me` is importing the descriptor `key` (asked before the driver's import, so an
    /// exporter letting go meanwhile finds it there): [`Import::Held`] when someone is charged for
    /// the memory (`me` is counted on the record); for an orphan, `me` charged for it and made its
    /// exporter ([`Import::Adopted`]), [`Import::Refused`] over its quota, or [`Import::Charge`]
    /// when `me` has no account there that keeps a record; [`Import::Unknown`] when nobody
    /// registered `key` (not exported under gpuslice, or from a node policy) or the record's
    /// importer entries are full.
    pub fn share_import(&self, me: ProcHandle, key: ShareKey) -> Result<Import, LedgerError> {
        let g = self.lock()?;
        let Some(i) = self.find_shared(key) else {
            return Ok(Import::Unknown);
        };
        let r = &self.shared()[i];
        let (dev, bytes) = (r.device.load(SeqCst) as usize, r.bytes.load(SeqCst));
        // Node mode: a record only descriptors hold (its exporter and importers gone) is still
        // charged to its last exporter's slice (`held`); its importer adopts it as an orphan's,
        // and the charge moves to its slice.
        let by_descriptors = self.descriptors_only(r);
        if r.state.load(SeqCst) == STATE_ACTIVE && !by_descriptors {
            return Ok(self
                .add_importer(me, i)
                .map_or(Import::Unknown, Import::Held));
        }
        let Some(account) = self.slice_account(me.slot, dev) else {
            if by_descriptors {
                // No account to move the charge to: it stays where it is while `me` holds it.
                return Ok(self
                    .add_importer(me, i)
                    .map_or(Import::Unknown, Import::Held));
            }
            return Ok(Import::Charge { dev, bytes });
        };
        let (old, held) = (r.account.load(SeqCst), r.held.load(SeqCst));
        let same = by_descriptors && old == account;
        if same {
            // Its own slice already counts the bytes: let them go first, so the charge below
            // is a move, not a second count against the quota.
            self.return_held(dev, old, held);
            r.held.store(0, SeqCst);
        }
        // Charged like an allocation (the same compare-and-swap against the quota, in `me`'s
        // own words), then the record is `me`'s: both under the lock, so a second importer
        // finds it held, and the reaper sees the bytes in `me`'s charged word.
        let charged = self
            .with_slice_account(me.slot, dev, |a| a.try_charge(bytes))
            .unwrap_or(false);
        if !charged {
            if same {
                let _ = self.with_counter(dev, old, |c| c.fetch_add(held, SeqCst));
                r.held.store(held, SeqCst);
            }
            return Ok(Import::Refused { dev, bytes });
        }
        if by_descriptors && !same {
            self.return_held(dev, old, held);
        }
        r.account.store(account, SeqCst);
        r.exporter.store(me.slot as u32, SeqCst);
        r.held.store(0, SeqCst);
        r.imported.store(1, SeqCst);
        r.uid.store(self.procs()[me.slot].uid.load(SeqCst), SeqCst);
        r.pid_ns
            .store(self.procs()[me.slot].pid_ns.load(SeqCst), SeqCst);
        for x in &r.importers {
            x.store(NO_SLOT, SeqCst);
        }
        r.state.store(STATE_ACTIVE, SeqCst);
        if by_descriptors && !same {
            // The slice the record alone kept goes (its processes gone), as at a last leave.
            let _ = self.drop_kept_slice_locked(&g, old);
        }
        Ok(Import::Adopted { rec: i, dev, bytes })
    }

    /// Count `me` as an importer of active record `i`: `i`, or `None` when the entries are
    /// full. Its exporter too: a second handle it imports holds the memory after it let go
    /// of its own (the charge is then handed over to the record, not returned).
    fn add_importer(&self, me: ProcHandle, i: usize) -> Option<usize> {
        let r = &self.shared()[i];
        let slot = me.slot as u32;
        if r.importers.iter().any(|x| x.load(SeqCst) == slot) {
            return Some(i);
        }
        // An entry of a process that died (not reaped yet) is free too.
        let e = r.importers.iter().find(|x| !self.holds(x.load(SeqCst)))?;
        e.store(slot, SeqCst);
        r.imported.store(1, SeqCst);
        Some(i)
    }

    /// Process `me` let go of its last handle and mapping of record `rec`'s allocation. If the
    /// exporter let go before and nobody else holds it, the record's charge goes back (and an
    /// exporter's slice it kept alone is removed); the record stays as an orphan.
    pub fn share_leave(
        &self,
        me: ProcHandle,
        rec: usize,
    ) -> Result<Vec<RemovedSlice>, LedgerError> {
        let g = self.lock()?;
        let Some(r) = self.shared().get(rec) else {
            return Ok(vec![]);
        };
        if r.state.load(SeqCst) != STATE_ACTIVE {
            return Ok(vec![]);
        }
        for x in &r.importers {
            let _ = x.compare_exchange(me.slot as u32, NO_SLOT, SeqCst, SeqCst);
        }
        // Node mode: the record keeps the charge until no descriptor of it is left
        // ([`Ledger::share_release_unheld`], after the monitor's scan).
        if r.exporter.load(SeqCst) != NO_SLOT || self.any_importer(r) || self.is_node() {
            return Ok(vec![]);
        }
        Ok(self.orphan_locked(&g, r))
    }

    /// Record `r` held by nobody any more: its `held` bytes go back (and the slice it alone
    /// kept, returned), and it becomes an orphan.
    fn orphan_locked(&self, g: &LockGuard<'_>, r: &Shared) -> Vec<RemovedSlice> {
        let (d, a, held) = (
            r.device.load(SeqCst) as usize,
            r.account.load(SeqCst),
            r.held.load(SeqCst),
        );
        r.held.store(0, SeqCst);
        r.state.store(STATE_ORPHAN, SeqCst);
        self.return_held(d, a, held);
        self.drop_kept_slice_locked(g, a).into_iter().collect()
    }

    /// The identity of record `r`'s descriptor.
    fn key_of(r: &Shared) -> ShareKey {
        ShareKey {
            dev: r.key_dev.load(SeqCst),
            ino: r.key_ino.load(SeqCst),
        }
    }

    /// Exporter `me` let go of record `rec`'s allocation (released it and unmapped its last
    /// mapping): what to do with what it was charged for it. Anyone but the exporter gets
    /// [`LetGo::Keep`] and changes nothing.
    pub fn share_let_go(&self, me: ProcHandle, rec: usize) -> Result<LetGo, LedgerError> {
        let _g = self.lock()?;
        let Some(r) = self.shared().get(rec) else {
            return Ok(LetGo::Keep);
        };
        if r.state.load(SeqCst) != STATE_ACTIVE || r.exporter.load(SeqCst) != me.slot as u32 {
            return Ok(LetGo::Keep);
        }
        // Node mode: a record once imported holds the charge while any descriptor of it is
        // left, as the driver holds the memory (the monitor's scan lets it go).
        let node_held = self.is_node() && r.imported.load(SeqCst) != 0;
        if self.any_importer(r) || node_held {
            let d = r.device.load(SeqCst) as usize;
            let bytes = r.bytes.load(SeqCst);
            let handed = self.with_member(me.slot, d, |m| {
                let n = bytes.min(m.charged.load(SeqCst));
                // The record holds the bytes first, then the exporter's word lets them go, one
                // update bracketed like the hot path's (`account.rs`): killed in between, the
                // bytes are counted twice (kept too long), never lost.
                r.held.store(n, SeqCst);
                r.exporter.store(NO_SLOT, SeqCst);
                m.begun.fetch_add(1, Relaxed);
                m.charged.fetch_sub(n, Release);
                m.ended.fetch_add(1, Release);
            });
            return Ok(if handed.is_some() {
                LetGo::HandedOver
            } else {
                LetGo::Keep
            });
        }
        if r.imported.load(SeqCst) != 0 {
            r.state.store(STATE_ORPHAN, SeqCst);
            return Ok(LetGo::Uncharge);
        }
        Ok(LetGo::Keep)
    }

    /// The active or orphan record of identity `key`.
    fn find_shared(&self, key: ShareKey) -> Option<usize> {
        self.shared().iter().position(|r| {
            matches!(r.state.load(SeqCst), STATE_ACTIVE | STATE_ORPHAN)
                && r.key_dev.load(SeqCst) == key.dev
                && r.key_ino.load(SeqCst) == key.ino
        })
    }

    /// Whether process slot `slot` is a live process (entries of the dead count for nothing).
    fn holds(&self, slot: u32) -> bool {
        (slot as usize) < MAX_PROCS
            && self.procs()[slot as usize].state.load(SeqCst) == STATE_ACTIVE
            && self.is_alive(slot as usize)
    }

    fn any_importer(&self, r: &Shared) -> bool {
        r.importers.iter().any(|x| self.holds(x.load(SeqCst)))
    }
}
