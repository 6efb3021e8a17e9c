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

use super::{Ledger, LockGuard};
use crate::account::{Account, Member};
use crate::error::LedgerError;
use crate::layout::*;
use crate::ledger::ProcHandle;
use crate::snapshot::{Reaped, RemovedSlice};
use core::sync::atomic::AtomicU64;
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

    /// Process slot `slot`'s account on ledger device `d` if it can keep a record (as for an
    /// export: not node mode's best-effort allowances, which go with their last member).
    fn slice_account(&self, slot: usize, d: usize) -> Option<u32> {
        let pd = self.procs().get(slot)?.devices.get(d)?;
        let a = pd.account.load(SeqCst);
        let keeps = a != ACCOUNT_NONE && (!self.is_node() || (a as usize) < MAX_SLICES);
        keeps.then_some(a)
    }

    /// Run `f` on process slot `slot`'s account on device `d` ([`Self::slice_account`]; in
    /// node mode over the slice's region), `None` when it has none.
    fn with_slice_account<T>(
        &self,
        slot: usize,
        d: usize,
        f: impl FnOnce(&Account<'_>) -> T,
    ) -> Option<T> {
        let a = self.slice_account(slot, d)?;
        if !self.is_node() {
            return self.account(ProcHandle { slot }, d).map(|acc| f(&acc));
        }
        let region = self.regions()?.get(crate::node::region_key(a, d)?)?;
        let slice = self.slices().get(a as usize)?;
        let acc = Account::in_region(self.devices().get(d)?, Some(slice), &region, slot)?;
        Some(f(&acc))
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

    /// Node mode: the records only descriptors may hold now (active, their exporter and
    /// importers gone; each still charged to its last exporter's slice): what the monitor looks
    /// for in `/proc/*/fd`.
    pub fn descriptor_held(&self) -> Vec<(usize, ShareKey)> {
        if !self.is_node() {
            return vec![];
        }
        (self.shared().iter().enumerate())
            .filter(|(_, r)| self.descriptors_only(r))
            .map(|(i, r)| (i, Self::key_of(r)))
            .collect()
    }

    /// Node mode: what the records charge, per ledger device and slice (for the slices still
    /// active on that device): what they hold themselves (`held`, their exporters gone) and, for
    /// those whose exporter is still registered, the exporter and the bytes it exported (its
    /// charge is in its own words in the slice's region). A monitor restarted after such a
    /// slice's last live process went recovers no region for it (regions are found through
    /// their live members), so it makes the region again with these in it: the charge stays
    /// enforced on the slice, an exporter that died meanwhile hands its part to its records
    /// when reaped, and the charge goes when they let go.
    pub fn record_charges(&self) -> Result<Vec<RecordCharge>, LedgerError> {
        if !self.is_node() {
            return Ok(vec![]);
        }
        let _g = self.lock()?;
        let mut out: Vec<RecordCharge> = vec![];
        for r in self.shared() {
            let (d, a) = (r.device.load(SeqCst) as usize, r.account.load(SeqCst));
            if r.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            // Only a slice of that device: what `with_counter` would charge once it has a region.
            let Some(s) = self.slices().get(a as usize).filter(|s| {
                s.state.load(SeqCst) == STATE_ACTIVE && s.device.load(SeqCst) as usize == d
            }) else {
                continue;
            };
            let at = match out.iter().position(|c| (c.device, c.account) == (d, a)) {
                Some(i) => i,
                None => {
                    out.push(RecordCharge {
                        device: d,
                        account: a,
                        held: 0,
                        exported: vec![],
                        limit: s.memory_limit.load(SeqCst),
                    });
                    out.len() - 1
                }
            };
            let c = &mut out[at];
            c.held = c.held.saturating_add(r.held.load(SeqCst));
            // An exporter charged in this slice's region (a live one, or one that died and
            // is not reaped yet).
            let e = r.exporter.load(SeqCst) as usize;
            let charged_here = self.procs().get(e).is_some_and(|p| {
                matches!(p.state.load(SeqCst), STATE_ACTIVE | STATE_DYING)
                    && p.devices.get(d).map(|pd| pd.account.load(SeqCst)) == Some(a)
            });
            if charged_here {
                c.exported.push((e, r.bytes.load(SeqCst)));
            }
        }
        out.retain(|c| c.held > 0 || !c.exported.is_empty());
        Ok(out)
    }

    /// The uid and PID namespace (0: unknown) of record `rec`'s exporter (the monitor's scan:
    /// whose processes may hold its descriptor unseen).
    pub fn share_owner(&self, rec: usize) -> Option<(u32, u64)> {
        self.shared()
            .get(rec)
            .map(|r| (r.uid.load(SeqCst), r.pid_ns.load(SeqCst)))
    }

    /// Node mode: no process holds a descriptor of record `rec` (identity `key`) any more, as
    /// the monitor's scan found: its charge goes back (and the slice it alone kept), and it
    /// becomes an orphan. Nothing changes if it is no longer that record, or someone took it
    /// meanwhile (an import adopted it, an importer counted on it).
    pub fn share_release_unheld(
        &self,
        rec: usize,
        key: ShareKey,
    ) -> Result<Vec<RemovedSlice>, LedgerError> {
        let g = self.lock()?;
        let Some(r) = self.shared().get(rec) else {
            return Ok(vec![]);
        };
        if Self::key_of(r) != key || !self.descriptors_only(r) {
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

    /// Node mode: whether record `r` is active with nobody but descriptors holding it.
    fn descriptors_only(&self, r: &Shared) -> bool {
        self.is_node()
            && r.state.load(SeqCst) == STATE_ACTIVE
            && r.exporter.load(SeqCst) == NO_SLOT
            && !self.any_importer(r)
    }

    /// Give back `held` bytes a record held in account `a` of device `d`.
    fn return_held(&self, d: usize, a: u32, held: u64) {
        self.with_counter(d, a, |c| {
            let _ = c.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(held)));
        });
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

    /// The reaper's part (under the lock, `dying` marked): dead importers leave; a dying
    /// exporter's records held by a live importer keep their bytes (clamped to what it was
    /// charged there), the others' bytes go with it; records nobody holds any more become
    /// orphans. The accounts whose counters must give back an orphaned record's `held`.
    pub(crate) fn reap_shared_locked(
        &self,
        dying: &[usize],
        out: &mut Reaped,
    ) -> Vec<(usize, u32)> {
        let mut settle = vec![];
        // What each dying exporter was charged per device and has not yet handed to a record.
        let mut left: Vec<(usize, usize, u64)> = vec![];
        for (i, r) in self.shared().iter().enumerate() {
            if r.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            let (d, a) = (r.device.load(SeqCst) as usize, r.account.load(SeqCst));
            if d >= MAX_DEVICES || self.with_counter(d, a, |_| ()).is_none() {
                out.problems.push(format!(
                    "shared allocation record {i}: device {d} or account {a} is not usable; freed"
                ));
                r.state.store(STATE_FREE, SeqCst);
                continue;
            }
            for x in &r.importers {
                if dying.contains(&(x.load(SeqCst) as usize)) {
                    x.store(NO_SLOT, SeqCst);
                }
            }
            let e = r.exporter.load(SeqCst) as usize;
            if dying.contains(&e) {
                // Node mode: the record holds the charge for the descriptors that may be left
                // (the monitor's scan lets it go).
                if self.any_importer(r) || self.is_node() {
                    let at = left.iter().position(|&(p, dd, _)| p == e && dd == d);
                    let at = at.unwrap_or_else(|| {
                        let c = self.with_member(e, d, |m| m.charged.load(SeqCst));
                        left.push((e, d, c.unwrap_or(0)));
                        left.len() - 1
                    });
                    let n = r.bytes.load(SeqCst).min(left[at].2);
                    left[at].2 -= n;
                    r.held.store(n, SeqCst);
                    r.exporter.store(NO_SLOT, SeqCst);
                } else {
                    // Its bytes go with the exporter's; a descriptor it left behind charges
                    // whoever imports it next.
                    r.exporter.store(NO_SLOT, SeqCst);
                    r.state.store(STATE_ORPHAN, SeqCst);
                }
            } else if e as u32 == NO_SLOT && !self.any_importer(r) && !self.is_node() {
                r.state.store(STATE_ORPHAN, SeqCst);
                if !settle.contains(&(d, a)) {
                    settle.push((d, a));
                }
            }
        }
        settle
    }

    /// Bytes the records hold themselves in account `a` of device `d`.
    pub(crate) fn shared_held(&self, d: usize, a: u32) -> u64 {
        self.shared()
            .iter()
            .filter(|r| {
                r.state.load(SeqCst) == STATE_ACTIVE
                    && r.device.load(SeqCst) as usize == d
                    && r.account.load(SeqCst) == a
            })
            .fold(0u64, |s, r| s.saturating_add(r.held.load(SeqCst)))
    }

    /// Whether a record charges slice `si` (which then stays, even with no process in it).
    pub(crate) fn slice_has_shared(&self, si: usize) -> bool {
        self.shared()
            .iter()
            .any(|r| r.state.load(SeqCst) == STATE_ACTIVE && r.account.load(SeqCst) as usize == si)
    }

    /// Free the records charging slice `si` (it is being freed with its counter).
    pub(crate) fn drop_shared_of_slice_locked(&self, si: usize) {
        for r in self.shared() {
            if r.state.load(SeqCst) == STATE_ACTIVE && r.account.load(SeqCst) as usize == si {
                r.state.store(STATE_FREE, SeqCst);
            }
        }
    }

    /// Remove slice `a` if a record alone kept it (no process, not an operator's): after its
    /// last record went.
    pub(crate) fn drop_kept_slice_locked(
        &self,
        _g: &LockGuard<'_>,
        a: u32,
    ) -> Option<RemovedSlice> {
        let sl = self.slices().get(a as usize)?;
        self.remove_if_unused_locked(a as usize, sl)
    }

    /// Run `f` on the counter of account `a` on device `d` (a slice's `memory_used`, or the
    /// device's best-effort pool; in node mode the account's region), `None` for anything else.
    fn with_counter<T>(&self, d: usize, a: u32, f: impl FnOnce(&AtomicU64) -> T) -> Option<T> {
        if self.is_node() {
            let r = self.regions()?.get(crate::node::region_key(a, d)?)?;
            return Some(f(&r.header().memory_used.0));
        }
        if a == ACCOUNT_BEST_EFFORT {
            return self.devices().get(d).map(|dv| f(&dv.best_effort_used));
        }
        let s = self.slices().get(a as usize)?;
        let live = s.state.load(SeqCst) == STATE_ACTIVE && s.device.load(SeqCst) as usize == d;
        live.then(|| f(&s.memory_used.0))
    }

    /// Run `f` on process slot `slot`'s words in its account on device `d` (in node mode, in
    /// the account's region).
    fn with_member<T>(&self, slot: usize, d: usize, f: impl FnOnce(Member<'_>) -> T) -> Option<T> {
        let p = self.procs().get(slot)?;
        let pd = p.devices.get(d)?;
        if self.is_node() {
            let key = crate::node::region_key(pd.account.load(SeqCst), d)?;
            let r = self.regions()?.get(key)?;
            let w = r.proc_(slot)?;
            return Some(f(Member {
                begun: &w.ops_begun,
                ended: &w.ops_ended,
                charged: &w.charged,
            }));
        }
        Some(f(Member {
            begun: &p.ops_begun,
            ended: &p.ops_ended,
            charged: &pd.charged,
        }))
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
