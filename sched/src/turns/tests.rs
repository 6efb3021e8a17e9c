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
