//! Node mode, the monitor's side: [`DeviceTurns`] grants one device's compute turns (the thread
//! that drives it for every device is the monitor's, `monitor/src/turns.rs`; the tenants' side
//! is `granted.rs`; docs/security.md, "Compute in node mode").
//!
//! Each pass reads what the processes of the device ask for in their region slots
//! ([`GrantProc`]: hostile words, clamped), mirrors the demand into the policy's slice records
//! (which only the monitor writes), and runs the same pure policy as personal mode ([`pick`],
//! [`charge`]) over those records, so virtual times and cap budgets are the monitor's own. A
//! turn is charged the span the monitor granted (from the grant to its hand-back or its end),
//! never less, whatever a tenant wrote, plus what its processes left queued past it; when a
//! lease ends, the next slice is granted once that leftover is about done, at most
//! [`DRAIN_HOLD_NS`] later, whether or not the holder stopped: a holder that overstays (stopped,
//! hung, or ignoring its lease) is simply not granted again until it asks, and nobody waits on
//! it longer. A latency slice preempting a holder is granted at once, beside the holder's
//! leftover: the two split the time they shared on the engine, each paying half (the one place
//! a turn pays less than its span). A slice alone and uncapped gets a solo lease (its launches cost one load); the monitor turns it into an
//! ordinary lease when a second slice asks. Every write into the policy's records is here, so
//! the monitor's thread only reads the ledger.

use core::sync::atomic::{AtomicU64, Ordering::*};

use super::granted::{GrantProc, MONITOR_BEAT_NS, NODE_HANDOFF_LEAD_NS};
use super::policy::*;
use super::records::{Lease, SchedDevice, CLASS_LATENCY};
use super::sys::Os;

#[cfg(test)]
use gpuslice_quantity::{Cap, Share, PPM};

/// Slots beyond this are ignored for solo statistics (a bound on what a member list can make
/// the turns allocate).
const MAX_SLOTS: usize = 1 << 16;

/// Refresh the monitor's heartbeat (`Header::monitor_beat_ns`): while it is fresh tenants wait
/// for granted turns, once it is stale ([`super::MONITOR_STALE_NS`]) they launch unthrottled.
pub fn beat(word: &AtomicU64, now: u64) {
    word.store(now, Release);
}

/// How often a device with processes is looked at between lease ends (new demand, hand-backs,
/// cap budgets): the latency of a hand-back or of a newcomer's first turn.
pub const POLL_NS: u64 = 1_000_000;
/// The same while a slice holds the device alone (solo) or nobody wants it.
pub const POLL_SOLO_NS: u64 = 2_000_000;
/// The end of a lease, where a hand-back is looked for more often.
pub const HAND_BACK_WINDOW_NS: u64 = 1_500_000;
/// How often, then.
pub const HAND_BACK_POLL_NS: u64 = 100_000;
/// Longest lease granted for the slices' stated needs (a kernel longer than [`LEASE_NS`]): a
/// slice lying about its need makes every turn on the device this long at most (its own paid in
/// full), so the others wait at most this long for a turn.
pub const MAX_GRANT_NS: u64 = 20_000_000;

/// One process of a device as the turns see it: its slice (id: slice index + 1, the policy's
/// word, which the monitor wrote), its slot, and its words in its region (hostile).
pub struct Member<'a> {
    /// The process's slot (in the ledger and in its region).
    pub slot: usize,
    /// Its slice on the device (slice index + 1), as the policy records it.
    pub slice: u32,
    /// Its words in its region (tenant-written).
    pub words: &'a GrantProc,
}

/// Whether a process is waiting for a turn now (a fresh heartbeat; one in the future counts as
/// now, so a liar is only "always waiting", never more).
fn waiting(m: &Member, now: u64) -> bool {
    let w = m.words.want_ns.load(Acquire);
    w != 0 && now - w.min(now) < WANT_STALE_NS
}

/// When to look again at an ordinary lease ending at `end`: every `poll` until its last
/// [`HAND_BACK_WINDOW_NS`], then every [`HAND_BACK_POLL_NS`] (an honest holder hands back about
/// [`HANDOFF_LEAD_NS`] before the end: the next turn is granted while the engine still runs
/// the holder's last kernel, not a poll later), and at the end itself.
fn next_look(end: u64, now: u64, poll: u64) -> u64 {
    if now.saturating_add(HAND_BACK_WINDOW_NS) >= end {
        end.min(now + HAND_BACK_POLL_NS)
    } else {
        (end - HAND_BACK_WINDOW_NS).min(now + poll)
    }
}

/// How long past the end of a slice's leftover work, as its processes said, the monitor waits
/// for them to say more before it charges it (work that outlasts its estimate is reported by
/// the waiting process's next look, `granted.rs`).
pub const SETTLE_SLACK_NS: u64 = IDLE_GRACE_NS;

/// Longest the next grant waits, past a lease's end, for the work its holder's processes left
/// queued to run down to [`NODE_HANDOFF_LEAD_NS`].
pub const DRAIN_HOLD_NS: u64 = LEASE_NS;

/// Whether the turn ending now (lease end `end`; its holder's processes say their queued work
/// ends at `tail`) waits before the next grant, and until when. Work left queued past a turn
/// runs on the engine after it; granted at once, the next holder's kernels would share the
/// engine with it (contexts are time-sliced), and neither the holder's charge nor the next one's
/// can tell whose the engine time was (a slice of 16 processes took 0.28 of the device for a
/// 0.25 share that way, or, charged the whole overlap, 0.21). So the next grant waits until
/// about [`NODE_HANDOFF_LEAD_NS`] of it is left, as a personal-mode holder hands over, and at
/// most [`DRAIN_HOLD_NS`] past the lease's end: the holder pays for the wait (charged until
/// its work is done, `settle_owed`), so a tenant claiming a long tail only makes its own turns
/// dearer, and the others wait at most that long more for a turn.
fn drain_hold(end: u64, tail: u64, now: u64) -> Option<u64> {
    let last = end.saturating_add(DRAIN_HOLD_NS);
    let until = tail.min(last).saturating_sub(NODE_HANDOFF_LEAD_NS);
    (until > now).then(|| until.min(now + HAND_BACK_POLL_NS))
}

/// Per-slice demand seen in one pass.
#[derive(Clone, Copy)]
struct Ask {
    id: u32,
    waiters: u32,
    need: u64,
}

/// The monitor's state for one device (process-local; the shared state is the policy's).
#[derive(Default)]
pub struct DeviceTurns {
    /// When the current ordinary turn's charge starts (monitor clock): its grant, or the end
    /// of what the previous holder left queued, whichever is later; and its turn number.
    start_ns: u64,
    granted: Option<u64>,
    /// End of the latest turn charged, the work its holder left queued included once known.
    charged_until: u64,
    /// The slice whose turn ended at the second figure, and whose processes may still have
    /// work queued then: not yet charged for it.
    owed: Option<(u32, u64)>,
    /// The turn granted at once over the previous holder's leftover work (a latency slice
    /// preempting), and the part of its span that leftover is known to have shared with it, of
    /// which each pays half (`settle_owed`).
    beside: Option<u64>,
    beside_shared: u64,
    /// The turn whose overstay was counted (`SchedDevice::takeovers_total`).
    overstay_counted: Option<u64>,
    /// Per slot, the last `solo_gpu_ns` seen.
    solo_seen: Vec<u64>,
    last_ns: u64,
}

impl DeviceTurns {
    /// One pass over device `dev` at `now`: mirror demand, end a turn that is over or handed
    /// back, grant the next. Returns when to look again (ns).
    pub fn step(
        &mut self,
        os: &dyn Os,
        dev: &SchedDevice,
        t: &dyn Tenants,
        members: &[Member],
        now: u64,
    ) -> u64 {
        let elapsed = now.saturating_sub(self.last_ns).min(MAX_LEASE_NS);
        self.last_ns = now;
        self.settle_owed(dev, t, members, None);
        // Whether the holder of an ordinary lease is done with its turn: every process of its
        // slice handed it back or is idle (launched nothing for IDLE_GRACE_NS since its queued
        // work ran out, or since the turn began; and does not wait to start in it). Read before
        // the demand: a process says it wants more before it hands back, so a hand-back seen
        // here comes with its demand below.
        let l0 = Lease::unpack(dev.lease.load(Acquire));
        let turn = dev.turn.load(Acquire);
        // A latency slice's turn ends soon after its burst does (it pays for the span granted).
        let grace = t
            .get(l0.holder)
            .map_or(IDLE_GRACE_NS, |t| idle_grace(t.sched));
        let mut done = true;
        // When the holder's turn would end as idle if nothing changes: looked at then.
        let mut idle_at = 0u64;
        // When the holder's processes together say their queued work ends (hostile: bounded
        // where it is used).
        let mut tail = 0u64;
        for m in members.iter().filter(|m| m.slice == l0.holder) {
            let handed_back = m.words.done_turn.load(Acquire) == turn;
            let until = m.words.busy_until_ns.load(Acquire);
            tail = tail.max(until);
            let busy = until.min(l0.end_ns).max(self.start_ns);
            let idle = !waiting(m, now) && now > busy.saturating_add(grace);
            if !(handed_back || idle) {
                done = false;
                idle_at = idle_at.max(busy.saturating_add(grace).saturating_add(1));
            }
        }
        // Demand, per slice: only slices live on this device count (the member's slice is the
        // policy's word; `t.get` checks it again).
        let mut asks: Vec<Ask> = vec![];
        let mut solo_ns: Vec<(u32, u64)> = vec![];
        for m in members {
            if t.get(m.slice).is_none() {
                continue;
            }
            if m.slot < MAX_SLOTS && self.solo_seen.len() <= m.slot {
                self.solo_seen.resize(m.slot + 1, 0);
            }
            if let Some(seen) = self.solo_seen.get_mut(m.slot) {
                let v = m.words.solo_gpu_ns.load(Relaxed);
                let d = v.saturating_sub(*seen);
                *seen = v;
                match solo_ns.iter_mut().find(|x| x.0 == m.slice) {
                    Some(x) => x.1 = x.1.saturating_add(d),
                    None => solo_ns.push((m.slice, d)),
                }
            }
            if !waiting(m, now) {
                continue;
            }
            let need = m.words.need_ns.load(Relaxed).min(MAX_LEASE_NS);
            match asks.iter_mut().find(|a| a.id == m.slice) {
                Some(a) => {
                    a.waiters = a.waiters.saturating_add(1);
                    a.need = a.need.max(need);
                }
                None => asks.push(Ask {
                    id: m.slice,
                    waiters: 1,
                    need,
                }),
            }
        }
        let holder = l0.holder;
        let mut latency_waits = false;
        let mut returning: Vec<u32> = vec![];
        t.each(&mut |Tenant { id, sched: s, .. }| {
            let a = asks.iter().find(|a| a.id == id);
            s.waiters.store(a.map_or(0, |a| a.waiters), Release);
            if a.is_some() {
                // Coming back after idling (no demand and no turn for RETURN_NS): placed
                // below, once every slice's demand is in.
                if id != holder && now.saturating_sub(s.want_ns.load(Acquire)) >= RETURN_NS {
                    returning.push(id);
                }
                if s.class.load(Relaxed) == CLASS_LATENCY {
                    latency_waits = true;
                }
            }
            // `want_ns` here is the monitor's: when the slice last waited, held the device, or
            // had work queued on it (as its processes say: a process blocked on its own kernel,
            // which other slices' work delays, is not idle, and keeps its place).
            let queued = members.iter().any(|m| {
                m.slice == id
                    && (now..=now.saturating_add(MAX_LEASE_NS))
                        .contains(&m.words.busy_until_ns.load(Relaxed))
            });
            if a.is_some() || id == holder || queued {
                s.want_ns.store(now, Release);
            }
        });
        // Where the competing slices stand, so idling earns no burst (and nobody's idle,
        // lightly used or best-effort clock sets anyone's start).
        for id in returning {
            rejoin(t, id, holder, now);
        }
        if latency_waits {
            dev.latency_ns.store(now, Release);
        }
        // Solo statistics (the slice's own samples, at most the wall time since the last pass).
        for (id, ns) in solo_ns {
            if ns > 0 {
                if let Some(s) = t.get(id) {
                    charge_solo(dev, s.sched, now, ns.min(elapsed), 0);
                }
            }
        }
        let poll = if members.is_empty() {
            MONITOR_BEAT_NS
        } else {
            POLL_NS
        };
        let l = l0;
        // One lease length for every slice of the device: long enough for the longest launch
        // any of them waits to make (a kernel longer than a lease), at most MAX_GRANT_NS. The
        // same for all, so a slice that lies about its need lengthens everyone's turns alike
        // (fewer hand-overs are no advantage of its own) and pays for its whole span.
        let need = asks.iter().map(|a| a.need).max().unwrap_or(0);
        if l.holder != 0 && t.get(l.holder).is_none() {
            // The holder's slice is gone.
            self.grant(os, dev, t, now, 0, need);
            return now + poll;
        }
        if l.solo {
            let cap = t.get(l.holder).expect("checked above").cap;
            let others = asks.iter().any(|a| a.id != l.holder);
            let capped = capped(cap);
            if !others && !capped {
                return now + POLL_SOLO_NS.max(poll);
            }
            // Someone else wants in (or a cap was set): the solo holder gets one ordinary lease,
            // and the newcomers compete from its virtual time (it was not charged while alone).
            for a in asks.iter().filter(|a| a.id != l.holder) {
                rejoin(t, a.id, l.holder, now);
            }
            let nl = Lease {
                holder: l.holder,
                solo: false,
                end_ns: now + LEASE_NS,
            };
            self.install(os, dev, t, nl, now);
            return now + poll;
        }
        if l.holder == 0 {
            self.grant(os, dev, t, now, 0, need);
            return now + poll;
        }
        // A waiting latency slice ends a normal holder's turn at once when the grant that
        // follows would go to it: the same pick as that grant's (the holder competing, as it
        // does while its turn runs). Asked with the holder left out, a latency slice too far
        // ahead to be served first ended the turn at every pass only for the grant to give it
        // back to the holder (turns cut to ~1 ms while the latency slice still waited).
        let preempt = latency_waits && {
            let h = t.get(l.holder).expect("checked above").sched;
            h.class.load(Relaxed) != CLASS_LATENCY && {
                let p = pick(t, now, l.holder, 0);
                p.holder != l.holder
                    && t.get(p.holder)
                        .is_some_and(|t| t.sched.class.load(Relaxed) == CLASS_LATENCY)
            }
        };
        if now < l.end_ns && !done && !preempt {
            let look = next_look(l.end_ns, now, poll);
            return if idle_at > now {
                look.min(idle_at)
            } else {
                look
            };
        }
        if now >= l.end_ns && !done && self.overstay_counted != Some(turn) {
            // Overstayed (or kept busy to its end); once a turn, however long it is held.
            self.overstay_counted = Some(turn);
            dev.takeovers_total.fetch_add(1, Relaxed);
        }
        if !preempt && self.granted == Some(turn) {
            if let Some(at) = drain_hold(l.end_ns, tail, now) {
                return at;
            }
        }
        // Charge the span granted, then the next turn.
        // Only a turn this monitor granted: one found in the policy after a restart began at an
        // unknown time (and was not granted by anyone while the monitor was down).
        let stop = now.min(l.end_ns);
        if let (
            Some(Tenant {
                sched: s,
                share,
                cap,
                ..
            }),
            true,
        ) = (t.get(l.holder), self.granted == Some(turn))
        {
            // The previous turn's leftovers first: this turn's charge starts after them, or,
            // granted beside them (preempting), from its grant less its half of what they
            // shared: like any turn, a preempting one pays its span.
            self.settle_owed(dev, t, members, Some(stop));
            let (start, busy) = if self.beside == Some(turn) {
                let start = self.start_ns.min(stop);
                (start, (stop - start).saturating_sub(self.beside_shared / 2))
            } else {
                let start = self.start_ns.max(self.charged_until).min(stop);
                (start, stop - start)
            };
            self.beside = None;
            self.beside_shared = 0;
            charge(dev, s, share, cap, start, stop, busy);
            // What its processes left queued runs on the engine after the turn: charged once
            // they report it done, or as far as they said it would run when the next turn
            // ends, whichever comes first.
            self.owed = Some((l.holder, stop.max(self.charged_until)));
            self.charged_until = self.charged_until.max(stop);
        }
        // A holder still at work at its end (draining its last kernels late, on a busy CPU)
        // competes for the next turn by its virtual time like a waiting slice, and nobody gets
        // a solo lease over it; it was charged its whole lease, so a holder that is stopped or
        // hung gets at most one more turn, which ends as idle after IDLE_GRACE_NS (charged
        // too), and then stops competing: it does not wait for a turn.
        let renewing = if done { 0 } else { l.holder };
        let preempted = l.holder;
        self.grant(os, dev, t, now, renewing, need);
        let l = Lease::unpack(dev.lease.load(Acquire));
        if preempt && l.holder != preempted {
            // Granted without waiting for the holder's leftover, which runs beside this turn.
            self.beside = self.granted;
        }
        if l.holder != 0 && !l.solo {
            next_look(l.end_ns, now, poll)
        } else {
            now + poll
        }
    }

    /// Charge the slice whose turn ended last for the work its processes left queued past the
    /// turn (all of them together: the engine runs it after the turn, or beside the next
    /// holder's), once every one of them reports its queue done, or at once with what they
    /// said when the current turn ends at `now_or_never` (it must know where its own charge
    /// starts). Their words are hostile: read as "until then", never before the turn's end, at
    /// most [`MAX_LEASE_NS`] past it; a slice that says less pays the span granted, no less.
    ///
    /// Leftover work that ran beside a turn granted over it at once (a latency slice
    /// preempting: no hold for it) shared the engine with that turn, which time-slices the two
    /// contexts: each pays half of the time they shared. A slice that says its leftover runs
    /// longer pays for all of it past the shared part, so saying more never lowers its own
    /// charge.
    fn settle_owed(
        &mut self,
        dev: &SchedDevice,
        t: &dyn Tenants,
        members: &[Member],
        now_or_never: Option<u64>,
    ) {
        let Some((id, stop)) = self.owed else {
            return;
        };
        let until = members
            .iter()
            .filter(|m| m.slice == id)
            .map(|m| m.words.busy_until_ns.load(Acquire))
            .max()
            .unwrap_or(0)
            .clamp(stop, stop.saturating_add(MAX_LEASE_NS));
        if now_or_never.is_none() && until.saturating_add(SETTLE_SLACK_NS) > self.last_ns {
            // Still running as far as its processes said, or only just done: a process whose
            // work outlasts its estimate says so when it looks again (`granted.rs`), a
            // moment after the estimate ran out.
            return;
        }
        self.owed = None;
        let mut pay = until - stop;
        if self.beside.is_some() && self.beside == self.granted {
            let end = now_or_never.map_or(until, |e| until.min(e));
            self.beside_shared = end.saturating_sub(self.start_ns.max(stop));
            pay -= self.beside_shared / 2;
        }
        if let Some(h) = t.get(id) {
            charge(dev, h.sched, h.share, h.cap, stop, until, pay);
        }
        self.charged_until = self.charged_until.max(until);
    }

    /// Grant the device to the slice the policy picks (or nobody).
    fn grant(
        &mut self,
        os: &dyn Os,
        dev: &SchedDevice,
        t: &dyn Tenants,
        now: u64,
        renewing: u32,
        need: u64,
    ) {
        // Never solo while another slice was active moments ago (`SOLO_QUIET_NS`, in `pick`).
        let mut next = pick(t, now, renewing, 0);
        if next.holder != 0 && !next.solo {
            let len = LEASE_NS.max(need.saturating_add(HANDOFF_LEAD_NS));
            next.end_ns = now + len.min(MAX_GRANT_NS);
        }
        let cur = Lease::unpack(dev.lease.load(Acquire));
        if next == Lease::FREE && cur == Lease::FREE {
            return;
        }
        self.install(os, dev, t, next, now);
    }

    fn install(&mut self, os: &dyn Os, dev: &SchedDevice, t: &dyn Tenants, l: Lease, now: u64) {
        self.granted = Some(dev.turn.fetch_add(1, AcqRel).wrapping_add(1));
        dev.lease.store(l.pack(), Release);
        self.start_ns = now;
        if let Some(Tenant { sched: s, .. }) = t.get(l.holder) {
            s.leases_total.fetch_add(1, Relaxed);
            dev.leases_total.fetch_add(1, Relaxed);
        }
        dev.seq.fetch_add(1, Release);
        // Tenants cannot count themselves in `sleepers` (the policy is read-only to them):
        // always wake (a syscall that finds nobody costs about a microsecond).
        os.futex_wake(&dev.seq);
    }
}

#[cfg(test)]
mod tests;
