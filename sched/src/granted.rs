//! Node mode: turns granted by the monitor (docs/security.md, "Compute in node mode").
//!
//! In node mode the lease word of a device is the policy's (`Device::sched.lease`, written by
//! the monitor only, mapped read-only by tenants): nobody but the monitor can name who may
//! launch. A process signals what it wants in its own slot of its slice's region
//! ([`GrantProc`]: a heartbeat while it waits, the length of work it wants next, the turn it
//! handed back, when its queued work ends), and sleeps on the policy's futex word
//! (`Device::sched.seq`: `FUTEX_WAIT` only reads, so a read-only shared mapping serves). The
//! monitor's turns thread (`monitor/src/turns.rs`) runs the same pure policy as personal mode
//! ([`super::pick`], [`super::charge`]) over the policy's slice records, which only it writes,
//! so virtual time and cap budgets cannot be forged; it charges every turn at least the span it
//! granted, whatever a tenant writes, plus what the slice's processes left queued past it, and
//! grants the next turn when a lease ends whether or not its holder stopped, once the work its
//! processes left queued is about done and at most 5 ms later (nobody waits on a tenant longer).
//!
//! [`Granted`] is one process's side of one device: the same [`Work`]-driven admission as
//! [`Client`] (launch while the queued work fits before the lease's end, and while the slice's
//! processes together have queued at most the turn's length, then drain to
//! [`NODE_HANDOFF_LEAD_NS`] and hand back), but it never writes the policy. A slice alone and
//! uncapped gets a solo lease: launches cost one load of the lease word ([`Granted::solo`]).
//!
//! While the monitor is down (its heartbeat, `Header::monitor_beat_ns`, older than
//! [`MONITOR_STALE_NS`]) nobody grants turns: processes launch unthrottled until it is back,
//! rather than freezing every tenant of the node. [`Scheduler`] is what the shim holds: either
//! client behind one set of methods.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use super::client::{Admission, Client};
use super::policy::{LATENCY_QUEUE_NS, MAX_LEASE_NS, MAX_SLEEP_NS};
use super::records::{Lease, SchedDevice, SchedSlice, CLASS_LATENCY, MAX_SLICE_ID};
use super::sys::Os;
use super::work::Work;

/// A holder hands its turn back when its queued work needs about this much more: a hand-back
/// travels to the monitor (woken through the policy's `turns_bell`), then to the next holder's
/// futex wake and first launch, three wake-ups on a host whose CPUs may be busy, so the lead is
/// longer than personal mode's `HANDOFF_LEAD_NS`, where holders hand over to each other
/// directly. At 0.5 ms the engine idled after one hand-over in eight to one in two on the fake
/// at load 5 (the holder woke late, or the monitor, or the next holder: 1-8 % of the device);
/// past the engine's 2 ms time slice the next holder's kernels would interleave with the
/// leftover, and 1 ms and 2 ms both cost the 0.25 tenant of the pair or an attacker's slice a
/// point in the simulation (`tests/hostile.rs`), so 1.5 ms (docs/benchmarks/2026-12-02.md,
/// "Issue 20, round 3 (h7/handover)").
pub const NODE_HANDOFF_LEAD_NS: u64 = 1_500_000;
/// A monitor heartbeat older than this means no monitor grants turns: launch unthrottled.
pub const MONITOR_STALE_NS: u64 = 500_000_000;
/// The monitor refreshes its heartbeat at least this often.
pub const MONITOR_BEAT_NS: u64 = 50_000_000;

/// What one process writes for the monitor's turns on one device (in its slot of the region
/// of its account there). All hostile to the monitor: it clamps every value, never indexes
/// with one, and a lie only moves the liar's own slice (within its share: turns are charged
/// by the span granted).
#[repr(C)]
#[derive(Debug, Default)]
pub struct GrantProc {
    /// Heartbeat while the process waits for a turn (CLOCK_MONOTONIC ns); 0: not waiting.
    pub want_ns: AtomicU64,
    /// GPU ns the process wants to queue at the start of its next turn: the device's leases are
    /// made as long as the longest need of its waiting slices, at most the monitor's
    /// `MAX_GRANT_NS` (20 ms), the same length for every slice.
    pub need_ns: AtomicU64,
    /// The device turn (`SchedDevice::turn`) the process handed back (it stopped launching
    /// in it); the monitor ends a turn early once every process of the slice is done or idle.
    pub done_turn: AtomicU64,
    /// When its queued work is estimated to complete (ns), written at each launch and at the
    /// hand-back, moved on by a waiting process while its work outlasts the estimate (to its
    /// next look), and set to when it was seen done: the monitor charges the slice until then
    /// for what its processes left queued past a turn, and holds the next grant (a while at
    /// most) until little of it is left.
    pub busy_until_ns: AtomicU64,
    /// GPU ns sampled while solo (statistics only).
    pub solo_gpu_ns: AtomicU64,
    /// Launches admitted (statistics only).
    pub launches: AtomicU64,
    /// Room to grow without moving the region layout.
    pub reserved: [u64; 2],
}

/// Where a process of node mode finds its words: the policy's (read-only to it) and its
/// region's (its own, and its slice's).
pub struct GrantWords<'a> {
    /// The policy's device record (the lease, the turn counter, the futex word).
    pub dev: &'a SchedDevice,
    /// The monitor's heartbeat (the policy's header).
    pub beat: &'a AtomicU64,
    /// The monitor's futex word (the policy's header): rung to hand a turn back.
    pub bell: &'a AtomicU32,
    /// The policy slice's priority class.
    pub class: &'a AtomicU32,
    /// The slice's scheduler words in its region (`RegionHeader::sched`), shared by its
    /// processes: their account of the turn they hold, so that together they queue at most
    /// the turn's length.
    pub shared: &'a SchedSlice,
    /// This process's words in its region slot.
    pub me: &'a GrantProc,
}

/// One process's side of one device in node mode.
pub struct Granted<'a> {
    os: &'a dyn Os,
    dev: &'a SchedDevice,
    beat: &'a AtomicU64,
    bell: &'a AtomicU32,
    class: &'a AtomicU32,
    shared: &'a SchedSlice,
    me: &'a GrantProc,
    id: u32,
    solo_word: u64,
    /// The turn this process last launched in.
    turn: Option<u64>,
}

impl<'a> Granted<'a> {
    /// The client of slice `id` (policy slice index + 1) with the words `w`.
    pub fn new(w: GrantWords<'a>, id: u32, os: &'a dyn Os) -> Option<Granted<'a>> {
        if id == 0 || id > MAX_SLICE_ID {
            return None;
        }
        w.me.want_ns.store(0, Release);
        Some(Granted {
            os,
            dev: w.dev,
            beat: w.beat,
            bell: w.bell,
            class: w.class,
            shared: w.shared,
            me: w.me,
            id,
            solo_word: Lease::solo_word(id),
            turn: None,
        })
    }

    /// Count `next` ns of work into the slice's account of turn `turn` (lease end `end`) if it
    /// fits: the slice's processes together queue at most the turn's length (as the first of
    /// them saw it) in it, however many they are; the slice's first launch of a turn always
    /// goes (a kernel longer than a turn would never run otherwise). The words are the
    /// slice's own (its processes can undo only their own bound; the monitor charges what
    /// they queue past the turn whatever the words say).
    fn slice_admits(&self, turn: u64, now: u64, end: u64, next: u64) -> bool {
        let sh = self.shared;
        let key = sh.turn_key.load(Acquire);
        if key != turn
            && sh
                .turn_key
                .compare_exchange(key, turn, AcqRel, Acquire)
                .is_ok()
        {
            sh.turn_start_ns.store(now, Release);
            sh.turn_queued_ns.store(0, Release);
        }
        sh.queue_in_turn(now, end, next)
    }

    /// The launch fast path: true when the slice holds a solo lease (one load).
    #[inline]
    pub fn solo(&self) -> bool {
        self.dev.lease.load(Relaxed) == self.solo_word
    }

    /// Whether a monitor is granting turns now (its heartbeat is fresh).
    pub fn monitor_alive(&self, now: u64) -> bool {
        now.saturating_sub(self.beat.load(Acquire)) < MONITOR_STALE_NS
    }

    fn latency_active(&self, now: u64) -> bool {
        let at = self.dev.latency_ns.load(Acquire);
        at != 0 && now.saturating_sub(at) < super::policy::LATENCY_ACTIVE_NS
    }

    /// Block until this process may launch one more piece of work; never spins (futex waits
    /// with timeouts on the policy's `seq`).
    pub fn acquire(&mut self, work: &mut dyn Work) -> Admission {
        let t0 = self.os.now_ns();
        let mut waited = false;
        loop {
            let now = self.os.now_ns();
            if !self.monitor_alive(now) {
                break; // nobody grants turns: unthrottled until the monitor is back
            }
            let w = self.dev.lease.load(Acquire);
            let turn = self.dev.turn.load(Acquire);
            let l = Lease::unpack(w);
            if l.holder == self.id && l.solo {
                break;
            }
            if l.holder == self.id && now < l.end_ns && self.me.done_turn.load(Acquire) != turn {
                let queued = work.outstanding_ns();
                let next = work.next_ns();
                let held_short =
                    self.class.load(Relaxed) != CLASS_LATENCY && self.latency_active(now);
                if held_short {
                    work.track_each(now + super::policy::LATENCY_ACTIVE_NS);
                }
                if held_short && (queued > LATENCY_QUEUE_NS || work.pending() > 1) {
                    // A latency slice waits: keep our queue short so it gets the device soon
                    // (at most one launch in flight, none long). Both waits block (events);
                    // neither spins.
                    work.wait_pending(1);
                    if work.outstanding_ns() > LATENCY_QUEUE_NS {
                        work.wait_below(LATENCY_QUEUE_NS);
                    }
                    if work.pending() > 1 {
                        break; // a launch that never completes: do not wait on it again
                    }
                    continue;
                }
                // A latency slice's short kernels share the engine with other contexts' long
                // ones, so their measurements hold the others' time slices (a 50 µs kernel
                // beside 2 ms ones measures ~0.5 ms) and a burst that fits would be handed back
                // mid-way: its launches count at their least measurement. What runs past the
                // turn is still charged to the slice (`turns.rs`), so this lends it nothing.
                let (need, counted) = if self.class.load(Relaxed) == CLASS_LATENCY {
                    let least = work.next_least_ns();
                    (least.saturating_mul(work.pending() as u64 + 1), least)
                } else {
                    (queued.saturating_add(next), next)
                };
                // The first launch of a turn always goes (a kernel longer than what is left
                // would never run otherwise); later ones only while they fit, and while the
                // slice's processes together fit.
                let first = self.turn != Some(turn);
                if (first || now.saturating_add(need) <= l.end_ns)
                    && self.slice_admits(turn, now, l.end_ns, counted)
                {
                    self.turn = Some(turn);
                    self.me.want_ns.store(0, Release);
                    self.me
                        .busy_until_ns
                        .store(now.saturating_add(need.min(MAX_LEASE_NS)), Release);
                    break;
                }
                // The turn is over for us: let the queue run down to the handoff lead (the
                // next holder's first kernel then meets a busy engine), then hand back.
                let left = work.wait_below(NODE_HANDOFF_LEAD_NS);
                let now = self.os.now_ns();
                self.me
                    .busy_until_ns
                    .store(now.saturating_add(left.min(MAX_LEASE_NS)), Release);
                // Still wanting (the launch waits): said before the hand-back, so the monitor
                // never sees the slice done and not waiting, which would hand the other slice
                // a solo lease for a moment.
                self.me.need_ns.store(next.min(MAX_LEASE_NS), Release);
                self.me.want_ns.store(now.max(1), Release);
                self.me.done_turn.store(turn, Release);
                // The monitor grants the next turn as soon as it sees this.
                self.os.futex_wake(self.bell);
                continue;
            }
            // Not ours (or handed back, or over): say we want a turn, and sleep until the lease
            // changes or the heartbeat needs refreshing. Work queued in an earlier turn: say
            // when it is done (the monitor charges the slice for it until then), looking again
            // when it should be.
            let pending = work.pending();
            let queued = if pending == 0 {
                0
            } else {
                work.outstanding_ns()
            };
            let next = work.next_ns();
            let nap = if pending == 0 {
                MAX_SLEEP_NS
            } else {
                overdue_nap(queued, next)
            };
            let busy = self.me.busy_until_ns.load(Relaxed);
            if pending == 0 {
                // Done: when it was seen done (the monitor charges the slice until then).
                let at = work.finished_at().unwrap_or(now).min(now);
                if busy > at {
                    self.me.busy_until_ns.store(at, Release);
                }
            } else if busy < now.saturating_add(nap) {
                // Still queued (past its estimate, when other contexts' kernels share the
                // engine with it): "until I look again", so the monitor neither charges the
                // rest to the next holder nor grants it while it runs (`turns.rs`).
                self.me
                    .busy_until_ns
                    .store(now.saturating_add(nap), Release);
            }
            self.me.need_ns.store(next.min(MAX_LEASE_NS), Release);
            let seq = self.dev.seq.load(Acquire);
            self.me.want_ns.store(now.max(1), Release);
            if !waited {
                // Ring the monitor once a wait: it looks at once (a solo holder's lease is made
                // ordinary, a newly admitted process is seen) instead of at its next heartbeat,
                // up to 50 ms later. It passes at most every `MIN_PASS_NS` however often rung.
                self.os.futex_wake(self.bell);
            }
            waited = true;
            if self.dev.lease.load(Acquire) != w || self.dev.turn.load(Acquire) != turn {
                continue;
            }
            self.os.futex_wait(&self.dev.seq, seq, nap);
        }
        self.me.want_ns.store(0, Release);
        self.me.launches.fetch_add(1, Relaxed);
        Admission {
            throttled_ns: if waited {
                self.os.now_ns().saturating_sub(t0)
            } else {
                0
            },
        }
    }

    /// The process stops using the device: drain, and hand the turn back if it holds one.
    pub fn release(&mut self, work: &mut dyn Work) {
        let l = Lease::unpack(self.dev.lease.load(Acquire));
        self.me.want_ns.store(0, Release);
        if l.holder != self.id || l.solo {
            return;
        }
        let turn = self.dev.turn.load(Acquire);
        let done = work.drain();
        self.me.busy_until_ns.store(done, Release);
        self.me.done_turn.store(turn, Release);
        self.os.futex_wake(self.bell);
    }

    /// GPU time sampled while solo (statistics: the monitor folds it into the policy's).
    pub fn charge_solo(&self, ns: u64, launches: u64) {
        self.me.solo_gpu_ns.fetch_add(ns, Relaxed);
        self.me.launches.fetch_add(launches, Relaxed);
    }
}

/// The scheduler client a process holds for one device: personal mode's tenant-run
/// [`Client`], or node mode's [`Granted`].
pub enum Scheduler<'a> {
    /// Personal mode.
    Tenant(Client<'a>),
    /// Node mode.
    Granted(Granted<'a>),
}

impl<'a> Scheduler<'a> {
    /// See [`Client::solo`].
    #[inline]
    pub fn solo(&self) -> bool {
        match self {
            Scheduler::Tenant(c) => c.solo(),
            Scheduler::Granted(g) => g.solo(),
        }
    }

    /// The device's lease word (the fast path loads it; read-only in node mode).
    pub fn lease_word(&self) -> &'a AtomicU64 {
        match self {
            Scheduler::Tenant(c) => &c.parts().0.lease,
            Scheduler::Granted(g) => &g.dev.lease,
        }
    }

    /// The lease word meaning "our slice is alone here".
    pub fn solo_word(&self) -> u64 {
        match self {
            Scheduler::Tenant(c) => c.solo_word(),
            Scheduler::Granted(g) => g.solo_word,
        }
    }

    /// See [`Client::set_class`]; in node mode the class is the policy's (the operator's).
    pub fn set_class(&self, class: u32) {
        if let Scheduler::Tenant(c) = self {
            c.set_class(class)
        }
    }

    /// See [`Client::acquire`] and [`Granted::acquire`].
    pub fn acquire(&mut self, work: &mut dyn Work) -> Admission {
        match self {
            Scheduler::Tenant(c) => c.acquire(work),
            Scheduler::Granted(g) => g.acquire(work),
        }
    }

    /// See [`Client::release`] and [`Granted::release`].
    pub fn release(&mut self, work: &mut dyn Work) {
        match self {
            Scheduler::Tenant(c) => c.release(work),
            Scheduler::Granted(g) => g.release(work),
        }
    }

    /// Account GPU time sampled while solo (`end`: when, ns).
    pub fn charge_solo(&self, end: u64, ns: u64, launches: u64) {
        match self {
            Scheduler::Tenant(c) => {
                let (dev, slice) = c.parts();
                super::policy::charge_solo(dev, slice, end, ns, launches)
            }
            Scheduler::Granted(g) => g.charge_solo(ns, launches),
        }
    }
}

/// How long a process waiting for a turn sleeps while its own work from an earlier turn is
/// queued (`queued` ns left by its estimate, a kernel estimated at `next`): until the estimated
/// end, and past it (other contexts' kernels time-slice with it), an eighth of a kernel at a
/// time, 100 µs to 1 ms: its `busy_until_ns` says "until I look again", which the monitor
/// charges and holds the next grant for, so it looks often enough that the engine does not idle
/// long behind work already done, and seldom enough that a slice of many processes waiting on
/// their kernels costs little CPU.
fn overdue_nap(queued: u64, next: u64) -> u64 {
    if queued > OVERDUE_NAP_MIN_NS {
        queued.min(MAX_SLEEP_NS)
    } else {
        (next / 8).clamp(OVERDUE_NAP_MIN_NS, OVERDUE_NAP_MAX_NS)
    }
}

const OVERDUE_NAP_MIN_NS: u64 = 100_000;
const OVERDUE_NAP_MAX_NS: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use core::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// Node mode's waiters sleep on a word of the policy, which they map read-only; the
    /// monitor wakes them through its own read-write mapping. `FUTEX_WAIT` only reads the
    /// word and shared futexes are keyed by the file page, so this works: checked here.
    #[test]
    fn futex_wait_on_a_read_only_shared_mapping_is_woken_through_another_mapping() {
        let path = std::env::temp_dir().join(format!("gpuslice-futex-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(4096).unwrap();
        let map = |prot| {
            // SAFETY: a fresh mapping of our own 4 KiB file; checked below.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    4096,
                    prot,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            p as usize
        };
        let ro = map(libc::PROT_READ);
        let rw = map(libc::PROT_READ | libc::PROT_WRITE);
        std::fs::remove_file(&path).unwrap();
        // SAFETY: both mappings stay for the test's life (never unmapped), aligned, 4 KiB.
        let (ro_word, rw_word) =
            unsafe { (&*(ro as *const AtomicU32), &*(rw as *const AtomicU32)) };
        let t0 = Instant::now();
        let waiter = std::thread::spawn(move || {
            // SAFETY: as above.
            let w = unsafe { &*(ro as *const AtomicU32) };
            let ts = libc::timespec {
                tv_sec: 10,
                tv_nsec: 0,
            };
            // The raw call, to see its result: 0 means woken (EFAULT would mean the kernel
            // refused a read-only page, EAGAIN that the word had changed already).
            // SAFETY: FUTEX_WAIT reads the aligned word of a live mapping; `ts` is valid.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    w.as_ptr(),
                    libc::FUTEX_WAIT,
                    0u32,
                    &ts as *const libc::timespec,
                    0usize,
                    0u32,
                )
            };
            (rc, std::io::Error::last_os_error(), t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        rw_word.store(1, SeqCst);
        crate::sys::futex_wake(rw_word);
        let (rc, err, took) = waiter.join().unwrap();
        assert_eq!(rc, 0, "FUTEX_WAIT on a read-only mapping: {err}");
        assert_eq!(ro_word.load(SeqCst), 1);
        assert!(
            took >= Duration::from_millis(90) && took < Duration::from_secs(5),
            "slept {took:?}: not woken by the wake through the other mapping"
        );
        // And the other way: the monitor sleeps on its read-write mapping, a tenant wakes it
        // through its read-only one (`FUTEX_WAKE` needs no write access).
        let t0 = Instant::now();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: as above.
            let w = unsafe { &*(rw as *const AtomicU32) };
            crate::sys::futex_wait(w, 1, 10_000_000_000);
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(300));
        crate::sys::futex_wake(ro_word);
        let took = sleeper.join().unwrap();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(5),
            "slept {took:?}: not woken through the read-only mapping"
        );
    }
}
