//! One process's side of one device: [`Client`] asks for admission before each launch, sleeps
//! on the device's futex while another slice holds the lease, waits for its own queued work
//! when its lease ends, charges what it used and hands the lease on. It sees the process's
//! queued work through [`Work`] (`work.rs`) and the clock and futex through [`Os`] (`sys.rs`),
//! so tests run it on a simulated engine and clock; the lease word's hand-over is `lease.rs`.

use core::sync::atomic::Ordering::*;

use super::lease::install;
use super::policy::*;
use super::records::{Lease, SchedDevice, SchedProc, SchedSlice, CLASS_LATENCY, MAX_SLICE_ID};
use super::sys::Os;
use super::work::Work;
use gpuslice_quantity::{Cap, Share};

/// What an admission cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// ns spent waiting for the lease.
    pub throttled_ns: u64,
}

/// One process's side of one device: process-local (the shim keeps one per device under a
/// process-local lock, taken only off the solo fast path).
pub struct Client<'a> {
    os: &'a dyn Os,
    dev: &'a SchedDevice,
    dev_index: usize,
    tenants: &'a dyn Tenants,
    id: u32,
    me: &'a SchedSlice,
    proc: &'a SchedProc,
    /// First launch of this process under its slice's current lease (its charge starts there).
    pub(super) held_since: Option<u64>,
    /// The device's turn counter when `held_since` was set.
    pub(super) held_turn: u64,
    /// This process's latest estimate of when its queued work completes.
    pub(super) busy_until: u64,
    /// End of the last span charged (a handoff charges a little ahead of the clock).
    pub(super) charged_until: u64,
    /// Estimated GPU time of the launches admitted under the current lease.
    admitted_ns: u64,
    /// End of the span charged at this process's latest hand-over, while the work it left
    /// queued then may still run past it (0: nothing owed).
    owed_from: u64,
    /// How many of the slice's processes still held work in that turn, itself included: their
    /// leftovers interleave on the engine, so each one's wall time to its end counts all of
    /// them, and it pays its part of that.
    owed_among: u64,
    solo_word: u64,
}

impl<'a> Client<'a> {
    /// The client of slice `id` (ledger slice index + 1) on ledger device `dev_index`.
    pub fn new(
        dev: &'a SchedDevice,
        dev_index: usize,
        tenants: &'a dyn Tenants,
        id: u32,
        proc: &'a SchedProc,
        os: &'a dyn Os,
    ) -> Option<Client<'a>> {
        if id == 0 || id > MAX_SLICE_ID {
            return None;
        }
        let me = tenants.get(id)?.sched;
        Some(Client {
            os,
            dev,
            dev_index,
            tenants,
            id,
            me,
            proc,
            held_since: None,
            held_turn: 0,
            busy_until: 0,
            charged_until: 0,
            admitted_ns: 0,
            owed_from: 0,
            owed_among: 1,
            solo_word: Lease::solo_word(id),
        })
    }

    /// The launch fast path: true when this slice holds a solo lease (one atomic load). The
    /// shim launches directly then, and calls [`Client::acquire`] otherwise.
    #[inline]
    pub fn solo(&self) -> bool {
        self.dev.lease.load(Relaxed) == self.solo_word
    }

    /// The device's and the slice's scheduler records (for statistics the caller gathers).
    pub fn parts(&self) -> (&'a SchedDevice, &'a SchedSlice) {
        (self.dev, self.me)
    }

    /// Lease word to compare against in a caller's own fast path.
    pub fn solo_word(&self) -> u64 {
        self.solo_word
    }

    /// Set the slice's priority class ([`super::CLASS_NORMAL`] or [`CLASS_LATENCY`]).
    pub fn set_class(&self, class: u32) {
        self.me.class.store(class, Release);
    }

    fn latency(&self) -> bool {
        self.me.class.load(Relaxed) == CLASS_LATENCY
    }

    /// Whether a latency slice waited or launched on the device recently.
    fn latency_active(&self, now: u64) -> bool {
        let at = self.dev.latency_ns.load(Acquire);
        at != 0 && now.saturating_sub(at) < LATENCY_ACTIVE_NS
    }

    /// A latency slice launches at once, beside whoever holds the lease (whose queue is kept
    /// short meanwhile, and who gets no solo lease): its work meets at most about one kernel
    /// of the holder's in the engine. It pays for each launch as it goes, and overtakes only
    /// while its virtual time is at most [`LATENCY_LEAD_NS`] ahead of the others' least (and
    /// its cap allows): past that it waits for a turn like any slice, so the others keep their
    /// guarantees. Returns whether the launch was admitted so.
    fn overtake(&mut self, work: &mut dyn Work, now: u64) -> bool {
        self.me.want_ns.store(now, Release);
        let (share, cap) = self.share_cap();
        if capped(cap) && self.me.cap_tat_ns.load(Acquire) > now {
            return false;
        }
        let mine = self.me.vt.load(Acquire);
        let mut least = u64::MAX;
        let l = Lease::unpack(self.dev.lease.load(Acquire));
        self.tenants.each(&mut |o| {
            if o.id != self.id && (o.id == l.holder || wants(o.sched, now)) {
                least = least.min(o.sched.vt.load(Acquire));
            }
        });
        if least != u64::MAX && mine > least.saturating_add(LATENCY_LEAD_NS) {
            return false;
        }
        if l.solo && l.holder != self.id {
            // End a normal slice's solo lease: its queue must be bounded from now on.
            let nl = Lease {
                holder: l.holder,
                solo: false,
                end_ns: now + LEASE_NS,
            };
            let _ = self
                .dev
                .lease
                .compare_exchange(l.pack(), nl.pack(), AcqRel, Acquire);
        }
        // Only a latency slice that is served first makes the others keep their queues short:
        // one past its lead queues like any slice.
        self.dev.latency_ns.store(now, Release);
        let next = work.next_ns().min(MAX_LEASE_NS);
        charge(self.dev, self.me, share, cap, now, now + next, next);
        self.me.launches_total.fetch_add(1, Relaxed);
        true
    }

    fn share_cap(&self) -> (Share, Cap) {
        self.tenants
            .get(self.id)
            .map_or((Share::NONE, Cap::NONE), |t| (t.share, t.cap))
    }

    fn bit(&self) -> u32 {
        1u32 << (self.dev_index % 32)
    }

    /// Charge what this process held under its current lease, up to `end`. A turn can start
    /// after the clock (it begins where the previous charge ended, which may lie ahead), so `end`
    /// may precede it: that charges nothing rather than wrapping or panicking.
    /// Returns how many other processes of the slice still hold queued work in that turn.
    pub(super) fn settle(&mut self, end: u64) -> u64 {
        let mut others = 0;
        if let Some(start) = self.held_since.take() {
            let (share, cap) = self.share_cap();
            let busy = core::mem::take(&mut self.admitted_ns);
            let end = end.max(start);
            // This process's part, then the slice's: the processes of a slice share one turn,
            // and together pay at most its span (what their launches measured includes time
            // spent queued behind each other's kernels).
            // Not for work another holder left queued past its charge (it pays for that).
            let start = start.max(self.dev.overrun_until_ns.load(Acquire).min(end));
            let mine = end.saturating_sub(start).min(busy);
            let paid = if self.me.turn_key.load(Acquire) == self.held_turn {
                let span = end.saturating_sub(self.me.turn_start_ns.load(Acquire));
                match self.me.turn_used_ns.fetch_update(AcqRel, Acquire, |u| {
                    Some(u.saturating_add(mine).min(span.max(u)))
                }) {
                    Ok(u) => u.saturating_add(mine).min(span.max(u)) - u,
                    Err(_) => mine,
                }
            } else {
                mine // the slice moved on to a later turn: this one's bookkeeping is gone
            };
            charge(self.dev, self.me, share, cap, start, end, paid);
            self.charged_until = end;
            // The next holder's charge starts after what we leave queued, as we estimate it,
            // at most the hand-over lead (an estimate learned while others' kernels
            // interleaved runs long, and would give the next holder engine time unpaid).
            let lead_end = self.os.now_ns().saturating_add(HANDOFF_LEAD_NS);
            self.dev
                .charged_until_ns
                .fetch_max(end.min(lead_end), AcqRel);
            self.proc.holding_mask.fetch_and(!self.bit(), AcqRel);
            others = self.me.turn_holders.leave(self.held_turn);
        }
        others
    }

    /// Pay for what this process left queued at its latest hand-over and ran past the span it
    /// was charged then, once it sees all of it complete: the slice's GPU time is what its work
    /// took, not what it was estimated to take. Returns whether something is still owed.
    fn settle_owed(&mut self, work: &mut dyn Work, now: u64) -> bool {
        if self.owed_from == 0 {
            return false;
        }
        let Some(done) = work.finished_at() else {
            if now >= self.owed_from.saturating_add(MAX_LEASE_NS) {
                self.owed_from = 0; // it cannot tell: the estimate stands
            }
            return self.owed_from != 0;
        };
        // At most a hand-over lead more: past its estimate the work shares the engine with
        // the next holder's (or waits behind a stalled holder's queue), so the wall time to
        // its end says less about its own GPU time the longer it is.
        let from = core::mem::take(&mut self.owed_from);
        let done = done.min(now).min(from.saturating_add(HANDOFF_LEAD_NS));
        if done > from {
            let (share, cap) = self.share_cap();
            let among = core::mem::replace(&mut self.owed_among, 1).max(1);
            charge(
                self.dev,
                self.me,
                share,
                cap,
                from,
                done,
                (done - from) / among,
            );
            self.dev.overrun_until_ns.fetch_max(done, AcqRel);
        }
        false
    }

    /// A holder taken over (lease `l`, turn `turn`) that launched nothing in its turn (stopped,
    /// descheduled, dead while its slice still waits) pays for the turn it held the device idle
    /// (from about its start to the takeover, at most a lease): otherwise, charged nothing, it
    /// would be granted the next turn again, and the next, while the others wait each one out
    /// (a process stopped 190 ms in every 200 left the device idle a quarter of the time).
    fn charge_unused_turn(&self, l: Lease, turn: u64, now: u64) {
        let Some(Tenant {
            sched: h,
            share,
            cap,
            ..
        }) = self.tenants.get(l.holder)
        else {
            return;
        };
        if l.solo || h.turn_key.load(Acquire) == turn {
            return; // it launched in the turn: its processes charge what they used
        }
        let stop = now.min(l.end_ns);
        let start = l.end_ns.saturating_sub(LEASE_NS).min(stop);
        charge(self.dev, h, share, cap, start, stop, stop - start);
    }

    /// After finishing its own queue at the end of turn `turn` (lease word `w`): sleep until
    /// the last sibling still holding work in the turn hands the lease on, or until the slice's
    /// queued work is estimated to be within [`HANDOFF_LEAD_NS`] of its end, at most half the
    /// lease's grace past its end (waiters take over at the whole grace).
    fn await_siblings(&mut self, w: u64, turn: u64) {
        let l = Lease::unpack(w);
        let until = self
            .me
            .tail_ns
            .load(Acquire)
            .saturating_sub(HANDOFF_LEAD_NS)
            .min(l.end_ns.saturating_add(GRACE_NS / 2));
        loop {
            let seq = self.dev.seq.load(Acquire);
            let now = self.os.now_ns();
            if now >= until
                || self.dev.lease.load(Acquire) != w
                || self.me.turn_holders.count(turn) == 0
            {
                return;
            }
            self.dev.sleepers.fetch_add(1, AcqRel);
            // Woken when the holder changes (the sibling handed over); at most 1 ms at a time
            // to look at the count again (a sibling whose lease was renewed leaves silently).
            self.os
                .futex_wait(&self.dev.seq, seq, (until - now).min(1_000_000));
            self.dev.sleepers.fetch_sub(1, AcqRel);
        }
    }

    /// Block until this process may launch one more piece of work on the device; `work` is its
    /// queued work there. Never spins: waits sleep on the ledger's futex with a timeout.
    pub fn acquire(&mut self, work: &mut dyn Work) -> Admission {
        let t0 = self.os.now_ns();
        if self.latency() && self.overtake(work, t0) {
            return Admission::default();
        }
        let mut registered = false;
        let mut out = Admission::default();
        loop {
            let now = self.os.now_ns();
            let owed = self.settle_owed(work, now);
            let w = self.dev.lease.load(Acquire);
            let turn = self.dev.turn.load(Acquire);
            let l = Lease::unpack(w);
            if l.holder == self.id {
                if l.solo {
                    break;
                }
                if self.held_since.is_some() && self.held_turn != turn {
                    // A renewal by another process of the slice: charge the old lease apart.
                    self.settle(self.busy_until.min(now));
                }
                if self.held_since.is_none() {
                    // What is left of our previous turn's work now runs in this turn, paid
                    // with it.
                    self.owed_from = 0;
                    // Not before the end of what was already charged (a handoff lead), ours or
                    // the previous holder's (a hostile word: at most a lease ahead).
                    let prev = self
                        .dev
                        .charged_until_ns
                        .load(Acquire)
                        .min(now.saturating_add(MAX_LEASE_NS));
                    let since = now.max(self.charged_until).max(prev);
                    self.held_since = Some(since);
                    self.held_turn = turn;
                    // The first process of the slice to launch in this turn starts the slice's
                    // account of it.
                    let key = self.me.turn_key.load(Acquire);
                    if key != turn
                        && self
                            .me
                            .turn_key
                            .compare_exchange(key, turn, AcqRel, Acquire)
                            .is_ok()
                    {
                        self.me.turn_used_ns.store(0, Release);
                        self.me.turn_queued_ns.store(0, Release);
                        self.me.turn_start_ns.store(since, Release);
                    }
                    self.proc.holding_mask.fetch_or(self.bit(), AcqRel);
                    self.me.turn_holders.join(turn);
                }
                self.me.want_ns.store(now, Release);
                let queued = work.outstanding_ns();
                let next = work.next_ns();
                let held_short = !self.latency() && self.latency_active(now);
                if held_short {
                    work.track_each(now + LATENCY_ACTIVE_NS);
                }
                if held_short && (queued > LATENCY_QUEUE_NS || work.pending() > 1) {
                    // A latency slice is active: keep at most one kernel of ours in flight, and
                    // the next one queued behind it only once it is nearly done, so that the
                    // latency slice's work, launched beside ours, waits for about one kernel
                    // of ours, not the whole queue (and the engine does not idle between two
                    // of ours while we wake up to launch the next).
                    work.wait_pending(1);
                    if work.pending() > 0 {
                        work.wait_below(LATENCY_QUEUE_NS);
                    }
                    continue;
                }
                // `queued` and `next` are estimates from the driver's timings: saturate.
                let need = queued.saturating_add(next);
                let done_at = now.saturating_add(need);
                let least = work.next_least_ns();
                // The first launch of a turn is always admitted (what is left of an earlier
                // turn's handoff lead is in `queued`); when it runs past the lease, the lease is
                // stretched to cover it, once a turn. Never again in the same turn: a holder
                // whose queue stays short would otherwise stretch it launch after launch and
                // keep the device for good (the freeze of issue 14, `a_shallow_queue_...`).
                let first = self.admitted_ns == 0 && self.dev.stretched.load(Acquire) != turn;
                let slice_first = self.me.turn_queued_ns.load(Acquire) == 0;
                // The slice's processes together queue at most the turn (node mode's bound,
                // `SchedSlice::queue_in_turn`): N processes must not queue N turns.
                if now < l.end_ns
                    && (first || done_at <= l.end_ns)
                    && self.me.queue_in_turn(now, l.end_ns, least)
                {
                    if done_at > l.end_ns {
                        // One launch longer than what is left of the lease: stretch the lease
                        // to cover it, so waiters do not take over mid-kernel.
                        let end = now + need.min(MAX_LEASE_NS);
                        let nl = Lease { end_ns: end, ..l };
                        self.dev.stretched.store(turn, Release);
                        if self
                            .dev
                            .lease
                            .compare_exchange(w, nl.pack(), AcqRel, Acquire)
                            .is_err()
                        {
                            continue;
                        }
                    }
                    self.admitted_ns = self.admitted_ns.saturating_add(next);
                    // No further than a stretched lease reaches: `busy_until_ns` is lowered
                    // only at the slice's first launch of a turn (below), so one absurd
                    // estimate would otherwise hold off idle takeovers for the whole turn.
                    self.busy_until = now + need.min(MAX_LEASE_NS);
                    let tail = self
                        .me
                        .tail_ns
                        .fetch_max(self.busy_until, AcqRel)
                        .max(self.busy_until);
                    if self.latency() {
                        // A latency slice's turn is its burst: it keeps it to the end.
                        self.busy_until = self
                            .busy_until
                            .max(l.end_ns.saturating_sub(HANDOFF_LEAD_NS));
                    }
                    if slice_first && !self.latency_active(now) {
                        // The slice's first launch of the turn: from now on it is busy while
                        // its queued work runs (then idle after `IDLE_GRACE_NS`, as in node
                        // mode), not for the rest of the time a new holder is allowed to wake
                        // (`WAKE_ALLOW_NS`) nor to the lease's end: a client between two
                        // requests lends the rest of its turn. Not while a latency slice is
                        // active: a holder kept to one kernel in flight then waits for it
                        // longer than its estimate says, and is not idle.
                        self.me
                            .busy_until_ns
                            .store(tail.max(self.busy_until), Release);
                    } else {
                        self.me.busy_until_ns.fetch_max(self.busy_until, AcqRel);
                    }
                    break;
                }
                // The lease is over for us: pay for everything queued, then hand over, a little
                // before our last kernel ends so the next holder's first launch meets an engine
                // that is still busy rather than idle.
                // Draining is not idling: waiters must not take over before the lease's grace.
                self.me
                    .busy_until_ns
                    .fetch_max(l.end_ns.max(now) + GRACE_NS, AcqRel);
                let left = work.wait_below(HANDOFF_LEAD_NS);
                let now = self.os.now_ns();
                // `left` should be about the lead, but a drain that gave up on a hung kernel
                // reports the whole rest: charge at most a lease ahead, or `charged_until`
                // would hold the start of this process's next turns far beyond the clock.
                let end = now + left.min(MAX_LEASE_NS);
                let others = self.settle(end);
                if left > 0 {
                    // What it left queued runs into the next holder's turn: paid when done.
                    self.owed_from = end;
                    self.owed_among = others + 1;
                }
                if others > 0 {
                    // Siblings of this slice still have work queued in the turn (the engine
                    // runs it after or between ours): the last of them hands over, so the next
                    // slice's turn starts on an engine the slice has left, not behind its
                    // queue (which would have the next slice pay for it). Wait for that, but
                    // no longer than the slice's queued work is estimated to last (a sibling
                    // that never comes back to launch must not hold the device).
                    self.await_siblings(w, turn);
                }
                let now = self.os.now_ns();
                if self.dev.lease.load(Acquire) == w {
                    let next = pick(self.tenants, now, self.id, 0);
                    install(self.os, self.dev, self.tenants, w, next, now);
                }
                continue;
            }
            if self.held_since.is_some() {
                // Our lease was taken over (we overran it or looked idle): pay what we held.
                self.settle(self.busy_until.min(now));
            }
            if registered && self.proc.waiting_mask.load(Acquire) & self.bit() == 0 {
                // The reaper took us for dead and dropped our place among the waiters (a
                // liveness check that misfired): take it again, or the slice would never
                // compete while this process waits.
                registered = false;
            }
            if !registered {
                registered = true;
                // Not idle while its own work is queued or was moments ago (blocked on a
                // kernel that other slices' work delays).
                let busy = match work.finished_at() {
                    None => work.pending() > 0,
                    Some(at) => now.saturating_sub(at) < RETURN_NS,
                };
                if self.me.waiters.fetch_add(1, AcqRel) == 0
                    && now.saturating_sub(self.me.want_ns.load(Acquire)) >= RETURN_NS
                    && !busy
                {
                    // Coming back after idling: start where the competing slices stand, so
                    // the idle time earns no burst that would starve them.
                    rejoin(self.tenants, self.id, l.holder, now);
                }
                self.proc.waiting_mask.fetch_or(self.bit(), AcqRel);
            }
            self.me.want_ns.store(now, Release);
            let urgent = self.latency();
            if l.solo {
                // Someone is alone on the device: give it one more ordinary lease, then compete
                // from its virtual time on (it was not charged while alone).
                rejoin(self.tenants, self.id, l.holder, now);
                if let Some(h) = self.tenants.get(l.holder) {
                    h.sched.busy_until_ns.fetch_max(now + WAKE_ALLOW_NS, AcqRel);
                }
                let nl = Lease {
                    holder: l.holder,
                    solo: false,
                    // A latency newcomer takes the device at the holder's next launch.
                    end_ns: if urgent { now } else { now + LEASE_NS },
                };
                let _ = self
                    .dev
                    .lease
                    .compare_exchange(w, nl.pack(), AcqRel, Acquire);
                continue;
            }
            if takeover_due(self.tenants, l, now) {
                let next = pick(self.tenants, now, 0, l.holder);
                if install(self.os, self.dev, self.tenants, w, next, now) && l.holder != 0 {
                    self.dev.takeovers_total.fetch_add(1, Relaxed);
                    self.charge_unused_turn(l, turn, now);
                }
                if next.holder == self.id || next.holder != 0 {
                    continue;
                }
            }
            // Sleep until the lease changes hands, or until it is due for takeover.
            let seq = self.dev.seq.load(Acquire);
            if self.dev.lease.load(Acquire) != w {
                continue;
            }
            let mut deadline = recheck_at(self.tenants, self.me, Lease::unpack(w), now);
            if owed {
                // Look at our leftover work when it should be done, then every 500 µs (no
                // busy polling while it runs late).
                let look = self
                    .owed_from
                    .saturating_add(50_000)
                    .max(now.saturating_add(500_000));
                deadline = deadline.min(look);
            }
            self.dev.sleepers.fetch_add(1, AcqRel);
            self.os
                .futex_wait(&self.dev.seq, seq, deadline.saturating_sub(now));
            self.dev.sleepers.fetch_sub(1, AcqRel);
        }
        if registered {
            let _ = self
                .me
                .waiters
                .fetch_update(AcqRel, Acquire, |w| w.checked_sub(1));
            self.proc.waiting_mask.fetch_and(!self.bit(), AcqRel);
            out.throttled_ns = self.os.now_ns().saturating_sub(t0);
            self.me
                .throttled_ns_total
                .fetch_add(out.throttled_ns, Relaxed);
            self.proc
                .throttled_ns_total
                .fetch_add(out.throttled_ns, Relaxed);
        }
        self.me.launches_total.fetch_add(1, Relaxed);
        out
    }

    /// Give the lease back now if this process holds it (it stops using the device: context
    /// destroyed, process exiting). Drains first, so the next holder starts on an idle engine.
    pub fn release(&mut self, work: &mut dyn Work) {
        let w = self.dev.lease.load(Acquire);
        let l = Lease::unpack(w);
        if l.holder != self.id {
            return;
        }
        let done = if l.solo {
            self.os.now_ns()
        } else {
            work.drain()
        };
        let now = self.os.now_ns();
        self.settle(done.min(now));
        let next = pick(self.tenants, now, 0, self.id);
        install(self.os, self.dev, self.tenants, w, next, now);
    }
}
