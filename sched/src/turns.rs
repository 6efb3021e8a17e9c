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
mod tests {

    use super::*;
    use crate::{GrantWords, Granted, SchedSlice, Work, CLASS_NORMAL, MONITOR_STALE_NS};
    use core::sync::atomic::{AtomicU32, AtomicU64};
    use std::cell::Cell;

    /// A clock the test moves; futex calls only count.
    struct Clock {
        now: AtomicU64,
        wakes: AtomicU32,
    }
    impl Clock {
        fn at(now: u64) -> Clock {
            Clock {
                now: AtomicU64::new(now),
                wakes: AtomicU32::new(0),
            }
        }
    }
    impl Os for Clock {
        fn now_ns(&self) -> u64 {
            self.now.load(SeqCst)
        }
        fn futex_wait(&self, _: &AtomicU32, _: u32, t: u64) {
            self.now.fetch_add(t.min(1_000_000), SeqCst);
        }
        fn futex_wake(&self, _: &AtomicU32) {
            self.wakes.fetch_add(1, SeqCst);
        }
    }

    /// Slices 1..=n with shares and caps, as the policy holds them.
    struct Slices(Vec<(SchedSlice, Share, Cap)>);
    impl Tenants for Slices {
        fn each(&self, f: &mut dyn FnMut(Tenant<'_>)) {
            for id in 1..=self.0.len() as u32 {
                f(self.get(id).expect("in the table"));
            }
        }
        fn get(&self, id: u32) -> Option<Tenant<'_>> {
            let (s, share, cap) = self.0.get(id.checked_sub(1)? as usize)?;
            Some(Tenant {
                id,
                sched: s,
                share: *share,
                cap: *cap,
            })
        }
    }

    fn slices(v: &[(f64, f64)]) -> Slices {
        Slices(
            v.iter()
                .map(|&(s, c)| {
                    (
                        SchedSlice::default(),
                        Share::from_ppm((s * PPM as f64) as u32),
                        Cap::from_ppm((c * PPM as f64) as u32),
                    )
                })
                .collect(),
        )
    }

    const MS: u64 = 1_000_000;
    const T0: u64 = 1_000 * MS;

    /// A device and a clock at `T0`; slices `1..=n` of the given (share, cap), each with one
    /// process, whose words are `w[id - 1]`.
    struct World {
        os: Clock,
        dev: SchedDevice,
        t: Slices,
        w: Vec<GrantProc>,
    }
    impl World {
        fn new(v: &[(f64, f64)]) -> World {
            World {
                os: Clock::at(T0),
                dev: SchedDevice::default(),
                t: slices(v),
                w: v.iter().map(|_| GrantProc::default()).collect(),
            }
        }
        /// One pass of the turns over this device at `now`.
        fn step(&self, dt: &mut DeviceTurns, now: u64) -> u64 {
            dt.step(&self.os, &self.dev, &self.t, &members(&self.w), now)
        }
        fn lease(&self) -> Lease {
            Lease::unpack(self.dev.lease.load(SeqCst))
        }
        /// The virtual time slice `id` has been charged.
        fn vt(&self, id: u32) -> u64 {
            self.t.get(id).unwrap().sched.vt.load(SeqCst)
        }
    }

    /// Two slices both always waiting (honest processes that hand back at their lease's end)
    /// for `secs`: asserts that slice 1 was granted its share of the time, within 0.02, and
    /// returns slice 2's longest wait.
    fn run_pair(shares: [f64; 2], hostile: bool, secs: u64) -> u64 {
        let p = World::new(&[(shares[0], 1.0), (shares[1], 1.0)]);
        let mut dt = DeviceTurns::default();
        let mut got = [0u64; 2];
        let (mut gap, mut longest) = (0u64, 0u64); // slice 2's waits
        let end = T0 + secs * 1000 * MS;
        let mut now = T0;
        while now < end {
            p.os.now.store(now, SeqCst);
            let l = p.lease();
            // Honest tenants: the holder launches (not waiting) until its lease ends, then hands
            // back and waits; the other waits. Slice 1 (if hostile) claims to wait forever,
            // wants the longest lease and says it is busy forever, never handing back.
            for (i, w) in p.w.iter().enumerate() {
                let id = i as u32 + 1;
                if hostile && i == 0 {
                    w.want_ns.store(u64::MAX, SeqCst);
                    w.need_ns.store(u64::MAX, SeqCst);
                    w.busy_until_ns.store(u64::MAX, SeqCst);
                    w.done_turn.store(u64::MAX, SeqCst);
                    continue;
                }
                if l.holder == id && (l.solo || now + 100_000 < l.end_ns) {
                    w.want_ns.store(0, SeqCst);
                    w.busy_until_ns.store(now + 1_000_000, SeqCst);
                } else {
                    if l.holder == id {
                        w.done_turn.store(p.dev.turn.load(SeqCst), SeqCst);
                    }
                    w.want_ns.store(now, SeqCst);
                }
            }
            if l.holder != 0 {
                got[l.holder as usize - 1] += 100_000;
            }
            if l.holder == 2 {
                gap = 0;
            } else {
                gap += 100_000;
                longest = longest.max(gap);
            }
            p.step(&mut dt, now);
            now += 100_000;
        }
        let f = got[0] as f64 / (got[0] + got[1]) as f64;
        if hostile {
            // Busy "forever" is read as MAX_LEASE_NS of work queued past each of its turns:
            // charged, so it gets fewer turns than its share, never more.
            assert!(f <= shares[0] + 0.02, "{got:?} {f}");
        } else {
            assert!((f - shares[0]).abs() < 0.02, "{got:?} {f}");
        }
        longest
    }

    #[test]
    fn two_waiting_slices_get_their_shares() {
        let longest = run_pair([0.25, 0.75], false, 10);
        assert!(longest <= LEASE_NS + POLL_NS, "{longest}");
    }

    #[test]
    fn a_hostile_slice_gets_no_more_than_its_share() {
        // Slice 1 writes the worst it can into its own words: waiting forever, the longest
        // lease, busy forever, a bogus hand-back. It is charged the span granted, so WFQ still
        // gives it a quarter; and the other is granted on time at every lease end.
        let longest = run_pair([0.25, 0.75], true, 10);
        // Its lies buy it at most the longest grant and the longest hold for the work it
        // claims to have queued past it, paid in full.
        assert!(
            longest <= MAX_GRANT_NS + DRAIN_HOLD_NS + POLL_NS,
            "{longest}"
        );
    }

    /// Work the holder's processes left queued past its lease: the next grant waits until about
    /// the hand-over lead of it is left (the holder paying), at most `DRAIN_HOLD_NS` past the
    /// lease's end, so the next holder's kernels do not share the engine with it.
    #[test]
    fn the_next_grant_waits_for_the_holders_leftover_work_a_bounded_time() {
        for (left, granted_at) in [
            (2 * MS, 2 * MS - NODE_HANDOFF_LEAD_NS),
            (60 * MS, DRAIN_HOLD_NS - NODE_HANDOFF_LEAD_NS),
        ] {
            let (p, mut dt, h) = halves_first_turn();
            let l = p.lease();
            // The holder launches to its end, leaving `left` queued past it.
            p.w[h].want_ns.store(0, SeqCst);
            p.w[h].busy_until_ns.store(l.end_ns + left, SeqCst);
            let mut now = l.end_ns;
            while p.lease().holder as usize - 1 == h && now < l.end_ns + 100 * MS {
                p.step(&mut dt, now);
                now += 10_000;
            }
            let waited = now - 10_000 - l.end_ns;
            assert!(
                waited >= granted_at && waited <= granted_at + HAND_BACK_POLL_NS,
                "{left}: granted {waited} ns past the end"
            );
            // The holder pays its leftover (settled at the next turn's end at the latest).
            let end2 = p.lease().end_ns;
            p.step(&mut dt, end2);
            let paid = p.vt(h as u32 + 1) / 2;
            assert!(
                paid >= LEASE_NS + granted_at,
                "{left}: paid {paid} for a turn of {LEASE_NS} and its leftover"
            );
        }
    }

    /// Process `i` of `w` is the one process of slice `i + 1`.
    fn members(w: &[GrantProc]) -> Vec<Member<'_>> {
        w.iter()
            .enumerate()
            .map(|(i, words)| Member {
                slot: i,
                slice: i as u32 + 1,
                words,
            })
            .collect()
    }

    #[test]
    fn a_slice_alone_gets_a_solo_lease_revoked_when_another_asks() {
        let p = World::new(&[(0.5, 1.0), (0.5, 1.0)]);
        p.w[0].want_ns.store(T0, SeqCst);
        let mut dt = DeviceTurns::default();
        p.step(&mut dt, T0);
        assert_eq!(
            p.lease(),
            Lease {
                holder: 1,
                solo: true,
                end_ns: 0
            }
        );
        assert!(p.os.wakes.load(SeqCst) >= 1, "the waiter is woken");
        p.w[0].want_ns.store(0, SeqCst); // launching on the fast path
        let next = p.step(&mut dt, T0 + MS);
        assert_eq!(next, T0 + MS + POLL_SOLO_NS, "solo: looked at rarely");
        assert!(p.lease().solo);
        // A second slice asks: the holder gets one ordinary lease, then the newcomer.
        p.w[1].want_ns.store(T0 + 2 * MS, SeqCst);
        p.step(&mut dt, T0 + 2 * MS);
        let l = p.lease();
        assert_eq!(
            (l.holder, l.solo, l.end_ns),
            (1, false, T0 + 2 * MS + LEASE_NS)
        );
        // The holder never hands back (stopped), saying its queue runs forever: the newcomer
        // is granted when the longest hold for a holder's leftover work ends, not later.
        p.w[0].busy_until_ns.store(u64::MAX, SeqCst);
        p.step(&mut dt, T0 + 2 * MS + LEASE_NS - 1);
        assert_eq!(p.lease().holder, 1);
        p.step(&mut dt, T0 + 2 * MS + LEASE_NS);
        assert_eq!(p.lease().holder, 1, "held for its leftover work");
        p.step(
            &mut dt,
            T0 + 2 * MS + LEASE_NS + DRAIN_HOLD_NS - NODE_HANDOFF_LEAD_NS,
        );
        let l = p.lease();
        // Not solo yet: the stopped holder was active moments ago (it may be only slow).
        assert_eq!((l.holder, l.solo), (2, false));
        assert_eq!(
            p.dev.takeovers_total.load(SeqCst),
            1,
            "the overstay is counted"
        );
        // The stopped holder was charged its whole lease.
        assert_eq!(p.vt(1), LEASE_NS * PPM as u64 / 500_000);
        // The newcomer, waiting whenever it does not hold the device, keeps it; once the
        // stopped slice was quiet for SOLO_QUIET_NS, it gets it solo.
        let mut now = T0 + 2 * MS + LEASE_NS;
        while now < T0 + 2 * MS + LEASE_NS + SOLO_QUIET_NS + 2 * LEASE_NS {
            now += 100_000;
            let l = p.lease();
            if l.holder == 2 && (l.solo || now + 100_000 < l.end_ns) {
                p.w[1].want_ns.store(0, SeqCst);
                p.w[1].busy_until_ns.store(now + MS, SeqCst);
            } else {
                p.w[1].want_ns.store(now, SeqCst);
                p.w[1].done_turn.store(p.dev.turn.load(SeqCst), SeqCst);
            }
            p.step(&mut dt, now);
            assert_eq!(
                p.lease().holder,
                2,
                "the stopped slice is not granted again"
            );
        }
        assert!(p.lease().solo, "{:?}", p.lease());
    }

    /// Two slices at 0.5, both waiting at `T0`, the first turn granted: the world, its turns,
    /// and the holder's index.
    fn halves_first_turn() -> (World, DeviceTurns, usize) {
        let p = World::new(&[(0.5, 1.0), (0.5, 1.0)]);
        p.w[0].want_ns.store(T0, SeqCst);
        p.w[1].want_ns.store(T0, SeqCst);
        let mut dt = DeviceTurns::default();
        p.step(&mut dt, T0);
        let l = p.lease();
        assert!(!l.solo && l.holder != 0);
        let h = l.holder as usize - 1;
        (p, dt, h)
    }

    #[test]
    fn a_holder_that_hands_back_early_is_charged_only_its_span() {
        let (p, mut dt, h) = halves_first_turn();
        p.w[h].want_ns.store(0, SeqCst);
        p.w[h].busy_until_ns.store(T0 + MS, SeqCst);
        // Done after 1 ms (idle for IDLE_GRACE_NS): the other gets it within one poll.
        let at = T0 + MS + IDLE_GRACE_NS + 1;
        p.step(&mut dt, at);
        assert_eq!(p.lease().holder as usize - 1, 1 - h);
        assert_eq!(p.vt(h as u32 + 1), (at - T0) * 2);
    }

    /// A latency slice's turn ends soon after its burst does, and it is looked at then: it pays
    /// its burst and the short latency grace, not the 2 ms a normal holder keeps its turn idle
    /// (request/response work was charged about 3x its GPU time in node mode).
    #[test]
    fn a_latency_holder_done_with_its_burst_pays_only_a_short_grace() {
        let p = World::new(&[(0.2, 1.0), (0.8, 1.0)]);
        p.t.get(1).unwrap().sched.class.store(CLASS_LATENCY, SeqCst);
        p.w[0].want_ns.store(T0, SeqCst);
        let mut dt = DeviceTurns::default();
        p.step(&mut dt, T0);
        // The trainer asks; the latency slice's solo lease becomes one ordinary lease.
        p.w[1].want_ns.store(T0 + MS, SeqCst);
        p.step(&mut dt, T0 + MS);
        let l = p.lease();
        assert_eq!((l.holder, l.solo), (1, false));
        // Its burst is queued until 1.5 ms, and it launches nothing more.
        p.w[0].want_ns.store(0, SeqCst);
        p.w[0].busy_until_ns.store(T0 + MS + MS / 2, SeqCst);
        let look = p.step(&mut dt, T0 + MS + 100_000);
        let idle_at = T0 + MS + MS / 2 + idle_grace(p.t.get(1).unwrap().sched);
        assert!(look <= idle_at + 1, "looked at {look}, idle at {idle_at}");
        p.step(&mut dt, look);
        assert_eq!(
            p.lease().holder,
            2,
            "the trainer's turn, at the end of the grace"
        );
        let paid = p.vt(1) * 200_000 / PPM as u64;
        assert!(
            paid <= MS / 2 + MS / 2,
            "paid {paid} ns for a turn whose work ended 0.5 ms in"
        );
    }

    /// A trainer (slice 2, 0.6) granted the device at `T0`, then an ordinary lease once the
    /// latency slice (slice 1, 0.2, its virtual time `latency_vt`) asks too. Returns the world
    /// and its turns, the trainer holding.
    fn trainer_holding(latency_vt: u64) -> (World, DeviceTurns) {
        let p = World::new(&[(0.2, 1.0), (0.6, 1.0)]);
        p.t.get(1).unwrap().sched.class.store(CLASS_LATENCY, SeqCst);
        p.t.get(1).unwrap().sched.vt.store(latency_vt, SeqCst);
        p.t.get(2).unwrap().sched.vt.store(0, SeqCst);
        p.w[1].want_ns.store(T0, SeqCst);
        let mut dt = DeviceTurns::default();
        p.step(&mut dt, T0);
        // The latency slice comes later (its first request), the trainer already holding.
        let l = p.lease();
        assert_eq!(l.holder, 2, "{l:?}");
        if l.solo {
            p.w[0].want_ns.store(T0 + 100_000, SeqCst);
            p.step(&mut dt, T0 + 100_000);
        }
        assert_eq!(p.lease().holder, 2);
        (p, dt)
    }

    /// A latency slice that preempts a trainer pays for its turn like any holder, less its half
    /// of the time the trainer's kernel in flight shared the engine with it (in node mode such
    /// turns used to be charged from the end of the trainer's leftover: a client that used
    /// ~0.09 of the device was charged 0.003-0.021, the trainer paying for the rest).
    #[test]
    fn a_preempting_latency_turn_pays_its_span() {
        let (p, mut dt) = trainer_holding(0);
        let l = p.lease();
        assert!(!l.solo);
        // The trainer launches; the latency slice asks mid-turn: the turn ends at once.
        let at = T0 + MS;
        p.w[1].want_ns.store(0, SeqCst);
        p.w[1].busy_until_ns.store(at + 2 * MS, SeqCst);
        p.w[0].want_ns.store(at, SeqCst);
        p.step(&mut dt, at);
        assert_eq!(p.lease().holder, 1, "preempted");
        let trainer_before = p.vt(2) * 600_000 / PPM as u64;
        // The burst: 1 ms queued, then idle; the trainer's 2 ms kernel in flight beside it.
        p.w[0].want_ns.store(0, SeqCst);
        p.w[0].busy_until_ns.store(at + MS, SeqCst);
        p.w[1].want_ns.store(at, SeqCst);
        let mut now = at;
        while p.lease().holder == 1 && now < at + 20 * MS {
            now += 50_000;
            p.step(&mut dt, now);
        }
        let span = now - at;
        assert!(span < 3 * MS, "the latency turn lasted {span}");
        let shared = span.min(2 * MS);
        let paid = p.vt(1) * 200_000 / PPM as u64;
        assert!(
            paid + 10_000 >= span - shared / 2 && paid <= span,
            "the latency slice paid {paid} ns for a turn of {span} ns"
        );
        // The trainer pays its leftover, less its half of what it shared.
        p.step(&mut dt, now + 10 * MS);
        let trainer = p.vt(2) * 600_000 / PPM as u64 - trainer_before;
        assert!(
            trainer + 10_000 >= 2 * MS - shared / 2,
            "the trainer paid {trainer} ns for a 2 ms leftover"
        );
    }

    /// A latency slice too far ahead to be served first (more than `LATENCY_LEAD_NS` of virtual
    /// time) does not end the holder's turn: the check asks what the grant would (the holder
    /// competing), so the trainer's turn is not cut only to be granted to it again.
    #[test]
    fn the_preemption_check_and_the_grant_agree_on_the_holder() {
        let (p, mut dt) = trainer_holding(10 * LATENCY_LEAD_NS);
        let l = p.lease();
        assert!(!l.solo);
        let turn = p.dev.turn.load(SeqCst);
        let mut now = T0 + 100_000;
        while now + HAND_BACK_WINDOW_NS < l.end_ns {
            now += 100_000;
            p.w[1].want_ns.store(0, SeqCst);
            p.w[1].busy_until_ns.store(now + MS, SeqCst);
            p.w[0].want_ns.store(now, SeqCst);
            p.step(&mut dt, now);
            assert_eq!(
                (p.dev.turn.load(SeqCst), p.lease()),
                (turn, l),
                "the trainer's turn was ended at {} ms",
                (now - T0) / MS
            );
        }
    }

    #[test]
    fn a_lease_found_after_a_restart_is_not_charged() {
        let p = World::new(&[(0.5, 1.0), (0.5, 1.0)]);
        p.dev.lease.store(
            Lease {
                holder: 1,
                solo: false,
                end_ns: T0 - MS,
            }
            .pack(),
            SeqCst,
        );
        p.dev.turn.store(77, SeqCst);
        p.w[1].want_ns.store(T0, SeqCst);
        let mut dt = DeviceTurns::default();
        p.step(&mut dt, T0);
        assert_eq!(p.vt(1), 0, "charged for the outage");
        assert_eq!(p.lease().holder, 2);
    }

    #[test]
    fn caps_hold_when_alone() {
        let p = World::new(&[(0.0, 0.3)]);
        let w = &p.w[0];
        let mut dt = DeviceTurns::default();
        let mut held = 0u64;
        let mut now = T0;
        while now < T0 + 2_000 * MS {
            let l = p.lease();
            if l.holder == 1 && now + 100_000 < l.end_ns {
                // Work that ends with the turn (what runs past it is charged too).
                w.want_ns.store(0, SeqCst);
                w.busy_until_ns.store((now + MS).min(l.end_ns), SeqCst);
                held += 100_000;
            } else {
                w.want_ns.store(now, SeqCst);
            }
            assert!(!l.solo, "a capped slice never gets a solo lease");
            p.step(&mut dt, now);
            now += 100_000;
        }
        let f = held as f64 / (2_000 * MS) as f64;
        assert!((f - 0.3).abs() < 0.03, "{f}");
    }

    #[test]
    fn hostile_words_of_a_slice_not_on_the_device_are_ignored() {
        let p = World::new(&[(0.5, 1.0)]);
        let w = GrantProc::default();
        w.want_ns.store(u64::MAX, SeqCst);
        // A member naming a slice that does not exist (it cannot: the monitor wrote the word;
        // but even so) changes nothing.
        let m = [Member {
            slot: MAX_SLOTS + 5,
            slice: 9_999,
            words: &w,
        }];
        let mut dt = DeviceTurns::default();
        dt.step(&p.os, &p.dev, &p.t, &m, T0);
        assert_eq!(p.lease(), Lease::FREE);
        assert_eq!(p.t.get(1).unwrap().sched.waiters.load(SeqCst), 0);
    }

    /// The queue the tenant client sees: a fixed kernel length, nothing ever queued.
    struct Idle(Cell<u64>);
    impl Work for Idle {
        fn outstanding_ns(&mut self) -> u64 {
            0
        }
        fn next_ns(&mut self) -> u64 {
            self.0.get()
        }
        fn drain(&mut self) -> u64 {
            0
        }
        fn wait_below(&mut self, _: u64) -> u64 {
            0
        }
        fn pending(&mut self) -> usize {
            0
        }
        fn wait_pending(&mut self, _: usize) {}
    }

    #[test]
    fn a_tenant_launches_unthrottled_while_the_monitor_is_down() {
        let os = Clock::at(T0 + 10 * MONITOR_STALE_NS);
        let dev = SchedDevice::default();
        // Someone else holds the device, and nobody refreshes the heartbeat.
        dev.lease.store(
            Lease {
                holder: 2,
                solo: true,
                end_ns: 0,
            }
            .pack(),
            SeqCst,
        );
        let beat = AtomicU64::new(T0);
        let class = AtomicU32::new(CLASS_NORMAL);
        let w = GrantProc::default();
        let bell = AtomicU32::new(0);
        let shared = SchedSlice::default();
        let words = GrantWords {
            dev: &dev,
            beat: &beat,
            bell: &bell,
            class: &class,
            shared: &shared,
            me: &w,
        };
        let mut g = Granted::new(words, 1, &os).unwrap();
        let a = g.acquire(&mut Idle(Cell::new(MS)));
        assert_eq!(a.throttled_ns, 0);
        // With a fresh heartbeat it waits (here: until the clock moves past the check).
        beat.store(os.now_ns(), SeqCst);
        let before = os.now_ns();
        // The holder never changes and the beat goes stale after MONITOR_STALE_NS of simulated
        // sleeps: the client then launches, a bounded wait.
        g.acquire(&mut Idle(Cell::new(MS)));
        let waited = os.now_ns() - before;
        assert!(
            (MONITOR_STALE_NS..MONITOR_STALE_NS + 2 * MS).contains(&waited),
            "{waited}"
        );
        assert_ne!(w.want_ns.load(SeqCst), u64::MAX);
    }
}
