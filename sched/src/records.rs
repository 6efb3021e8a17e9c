//! The scheduler's records in the ledger file: the per-device lease word, and the per-device,
//! per-slice and per-process counters. They are part of the file format (`layout.rs` embeds
//! them; any change here bumps its `LAYOUT_VERSION`): `#[repr(C)]`, atomics only, all-zero is
//! idle. Every value may have been written by any process of the node, so readers saturate and
//! clamp, never index with one.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Priority class of an ordinary slice.
pub const CLASS_NORMAL: u32 = 0;
/// Priority class of a latency-sensitive slice: it gets the device at the next launch boundary.
pub const CLASS_LATENCY: u32 = 1;

/// The class a priority name means (`latency`, `normal`), for variables, flags and JSON.
pub fn parse_class(name: &str) -> Option<u32> {
    match name {
        "latency" => Some(CLASS_LATENCY),
        "normal" => Some(CLASS_NORMAL),
        _ => None,
    }
}

/// The name of a class (any value that is not [`CLASS_LATENCY`] reads as `normal`).
pub fn class_name(class: u32) -> &'static str {
    if class == CLASS_LATENCY {
        "latency"
    } else {
        "normal"
    }
}

/// Width of the statistics window behind `compute_used`.
pub const WINDOW_NS: u64 = 1_000_000_000;

// The lease word: [holder: 15 bits][solo: 1 bit][end: 48 bits, µs of CLOCK_MONOTONIC].
// One word, so a lease is read and replaced atomically (no torn holder/end pairs); 48 bits of
// µs last 8.9 years of uptime.
const END_BITS: u32 = 48;
const END_MASK: u64 = (1 << END_BITS) - 1;
const SOLO_BIT: u64 = 1 << END_BITS;
const HOLDER_SHIFT: u32 = END_BITS + 1;
/// The largest slice id a lease can name (slice index + 1).
pub const MAX_SLICE_ID: u32 = (1 << (64 - HOLDER_SHIFT)) - 1;

/// A decoded lease word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Slice id (ledger slice index + 1); 0: nobody holds the device.
    pub holder: u32,
    /// The holder is alone and uncapped: it launches without asking until someone else wants in.
    pub solo: bool,
    /// End of the lease, CLOCK_MONOTONIC ns (µs resolution); 0 for a solo lease.
    pub end_ns: u64,
}

impl Lease {
    /// Nobody holds the device.
    pub const FREE: Lease = Lease {
        holder: 0,
        solo: false,
        end_ns: 0,
    };

    /// Decode a lease word.
    pub fn unpack(w: u64) -> Lease {
        Lease {
            holder: (w >> HOLDER_SHIFT) as u32,
            solo: w & SOLO_BIT != 0,
            end_ns: (w & END_MASK) * 1000,
        }
    }

    /// Encode (end rounded up to the µs).
    pub fn pack(self) -> u64 {
        let end_us = self.end_ns.div_ceil(1000) & END_MASK;
        ((self.holder as u64) << HOLDER_SHIFT) | if self.solo { SOLO_BIT } else { 0 } | end_us
    }

    /// The solo lease word of slice `id`: what the launch fast path compares against.
    pub fn solo_word(id: u32) -> u64 {
        Lease {
            holder: id,
            solo: true,
            end_ns: 0,
        }
        .pack()
    }
}

/// Time-bucketed GPU time, for "fraction of the device over the last window".
#[repr(C)]
#[derive(Debug, Default)]
pub struct Window {
    /// Start of the current bucket (ns).
    pub start_ns: AtomicU64,
    /// GPU ns charged in the current bucket.
    pub cur_ns: AtomicU64,
    /// GPU ns charged in the previous bucket.
    pub prev_ns: AtomicU64,
}

impl Window {
    pub(crate) fn add(&self, now: u64, ns: u64) {
        let start = self.start_ns.load(Acquire);
        // `start` may be anything a record held (saturate), or ahead of `now` when another
        // process charged a span ending past the clock (then this one adds to that bucket).
        if now >= start.saturating_add(WINDOW_NS) {
            let new_start = now - now % WINDOW_NS;
            if self
                .start_ns
                .compare_exchange(start, new_start, AcqRel, Relaxed)
                .is_ok()
            {
                let cur = self.cur_ns.swap(0, AcqRel);
                let adjacent = start != 0 && new_start == start.saturating_add(WINDOW_NS);
                self.prev_ns.store(if adjacent { cur } else { 0 }, Release);
            }
        }
        self.cur_ns.fetch_add(ns, AcqRel);
    }

    /// Fraction of `WINDOW_NS` charged over the last `WINDOW_NS` before `now`.
    pub fn fraction(&self, now: u64) -> f64 {
        (self.ns(now) / WINDOW_NS as f64).clamp(0.0, 1.0)
    }

    /// GPU ns charged over the last `WINDOW_NS` before `now` (the previous bucket weighted by
    /// how much of it is still inside the window), unclamped. The buckets of every window
    /// start at multiples of `WINDOW_NS`, so a slice's and its device's are weighted alike.
    pub(crate) fn ns(&self, now: u64) -> f64 {
        let start = self.start_ns.load(Acquire);
        let (cur, prev) = (
            self.cur_ns.load(Acquire) as f64,
            self.prev_ns.load(Acquire) as f64,
        );
        let w = WINDOW_NS as f64;
        let into = now.saturating_sub(start) as f64;
        if into < w {
            cur + prev * (w - into) / w
        } else if into < 2.0 * w {
            cur * (2.0 * w - into) / w
        } else {
            0.0
        }
    }
}

/// Per-device scheduler state (in the ledger's `Device` record).
#[repr(C)]
#[derive(Debug, Default)]
pub struct SchedDevice {
    /// The lease word (see [`Lease`]). 0: free.
    pub lease: AtomicU64,
    /// Futex word: bumped on every change of holder, so sleepers wake.
    pub seq: AtomicU32,
    /// Processes asleep on `seq` (a hint: one killed asleep only costs a spare wake).
    pub sleepers: AtomicU32,
    /// Unused since issue 20 (it was the virtual time of the latest slice granted the lease,
    /// where a returning slice restarted: a floor a tenant could push); kept for the layout.
    pub vt_floor: AtomicU64,
    /// GPU ns charged on this device, all slices.
    pub gpu_ns_total: AtomicU64,
    /// Leases granted (handoffs and renewals).
    pub leases_total: AtomicU64,
    /// Leases taken over from a holder that overran, went idle or died.
    pub takeovers_total: AtomicU64,
    /// Recent GPU time, all slices.
    pub window: Window,
    /// Turn counter: bumped before every attempt to install a lease (a grant or a renewal),
    /// never by a stretch, so the processes of the holding slice can tell a new turn from the
    /// same turn stretched.
    pub turn: AtomicU64,
    /// The `turn` whose lease was stretched for a launch longer than it: at most one stretch a
    /// turn, so no holder can keep the device by stretching launch after launch.
    pub stretched: AtomicU64,
    /// Latest heartbeat of a latency-class slice waiting or launching here (ns): while it is
    /// recent, normal holders keep their queues short and track each launch.
    pub latency_ns: AtomicU64,
    /// End of the latest span charged to any slice here, the work its holder left queued
    /// included (personal mode): the next holder's charge starts no earlier (its first kernels
    /// wait behind that work), so no engine time is charged twice at a hand-over.
    pub charged_until_ns: AtomicU64,
    /// Latest end of work a holder left queued past the span it was charged at its hand-over
    /// (it ran longer than estimated; personal mode): that holder pays for it once it sees
    /// it done, and whoever held the device meanwhile is not charged for it.
    pub overrun_until_ns: AtomicU64,
    /// Room to grow without moving the ledger layout.
    pub reserved: [u64; 3],
}

/// Per-slice scheduler state (in the ledger's `Slice` record). The share and cap themselves are
/// the slice record's `compute_share` / `compute_cap`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SchedSlice {
    /// Virtual time: GPU ns held × 10⁶ / weight (ppm).
    pub vt: AtomicU64,
    /// Cap budget (GCRA theoretical arrival time, ns): eligible once the clock passes it.
    pub cap_tat_ns: AtomicU64,
    /// Heartbeat of this slice's waiting or launching processes (ns).
    pub want_ns: AtomicU64,
    /// Processes of this slice waiting for the lease (a hint; the heartbeat decides).
    pub waiters: AtomicU32,
    /// Priority class ([`CLASS_NORMAL`] or [`CLASS_LATENCY`]), set when the slice is joined.
    pub class: AtomicU32,
    /// While holding: when the holder's queued work is estimated to complete (ns).
    pub busy_until_ns: AtomicU64,
    /// GPU ns charged (time the slice held the device with work queued).
    pub gpu_ns_total: AtomicU64,
    /// ns its processes spent waiting for a lease before a launch.
    pub throttled_ns_total: AtomicU64,
    /// Launches admitted.
    pub launches_total: AtomicU64,
    /// Leases granted to it.
    pub leases_total: AtomicU64,
    /// Recent GPU time.
    pub window: Window,
    /// The device turn (`SchedDevice::turn`) the three words below are about: the slice's
    /// current or latest turn. The processes of a slice together are charged at most the
    /// turn's span, so a process waiting behind a sibling is not charged for that wait.
    pub turn_key: AtomicU64,
    /// When the slice's turn `turn_key` began (ns).
    pub turn_start_ns: AtomicU64,
    /// GPU ns charged to the slice for turn `turn_key` so far.
    pub turn_used_ns: AtomicU64,
    /// Processes of the slice with work queued in a turn: `[turn: 40 bits][count: 24 bits]`
    /// (see `TurnHolders`). The last of them to finish its queue hands the lease on, so the
    /// next slice's turn does not begin behind a sibling's queued work.
    pub turn_holders: TurnHolders,
    /// Latest estimated end of the work its processes queued (ns): how long a process that
    /// finished its own queue waits, at most, for a sibling that never comes back to hand over.
    pub tail_ns: AtomicU64,
    /// Estimated GPU ns its processes queued in turn `turn_key`, all together: at most the
    /// turn's length ([`SchedSlice::queue_in_turn`]; node mode, in the slice's region).
    pub turn_queued_ns: AtomicU64,
}

/// How many processes of a slice hold queued work in one turn: one word, so a process joining
/// a new turn resets the count and joins it in one atomic step (no reset racing a join).
#[repr(transparent)]
#[derive(Debug, Default)]
pub struct TurnHolders(AtomicU64);

const HOLDER_COUNT_BITS: u32 = 24;
const HOLDER_COUNT_MASK: u64 = (1 << HOLDER_COUNT_BITS) - 1;

impl TurnHolders {
    fn turn_bits(turn: u64) -> u64 {
        turn << HOLDER_COUNT_BITS
    }

    /// A process starts holding in device turn `turn`.
    pub(crate) fn join(&self, turn: u64) {
        let key = Self::turn_bits(turn);
        let _ = self.0.fetch_update(AcqRel, Acquire, |w| {
            Some(if w & !HOLDER_COUNT_MASK == key {
                key | ((w & HOLDER_COUNT_MASK) + 1).min(HOLDER_COUNT_MASK)
            } else {
                key | 1
            })
        });
    }

    /// A process that joined turn `turn` is done with it; returns how many still hold in it
    /// (0 when the word moved on to another turn: nobody to wait for). The count is a hint
    /// (a process killed while holding stays counted for that turn only).
    pub(crate) fn leave(&self, turn: u64) -> u64 {
        let key = Self::turn_bits(turn);
        match self.0.fetch_update(AcqRel, Acquire, |w| {
            (w & !HOLDER_COUNT_MASK == key && w & HOLDER_COUNT_MASK > 0).then(|| w - 1)
        }) {
            Ok(w) => (w & HOLDER_COUNT_MASK) - 1,
            Err(_) => 0,
        }
    }

    /// Processes holding in turn `turn`.
    pub(crate) fn count(&self, turn: u64) -> u64 {
        let w = self.0.load(Acquire);
        if w & !HOLDER_COUNT_MASK == Self::turn_bits(turn) {
            w & HOLDER_COUNT_MASK
        } else {
            0
        }
    }

    pub(crate) fn clear(&self) {
        self.0.store(0, Release);
    }
}

/// Per-process scheduler state (in the ledger's `Proc` record), for the reaper.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SchedProc {
    /// Bit `d`: the process counts in its slice's `waiters` on ledger device `d`.
    pub waiting_mask: AtomicU32,
    /// Bit `d`: the process is launching under its slice's lease on ledger device `d`.
    pub holding_mask: AtomicU32,
    /// ns this process spent throttled.
    pub throttled_ns_total: AtomicU64,
    /// Room to grow without moving the ledger layout.
    pub reserved: [u64; 6],
}

/// What the monitor shows for one slice.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SliceComputeStats {
    /// `compute_used`: the slice's part of the device's time over the last [`WINDOW_NS`]
    /// ([`used_fraction`] against the device's record, read a moment apart; a view of all a
    /// device's slices divides by their [`SliceComputeStats::window_ns`] summed instead).
    pub used_fraction: f64,
    /// GPU ns charged to the slice over the last [`WINDOW_NS`] (the older bucket weighted).
    pub window_ns: f64,
    /// GPU ns charged since the slice was created.
    pub gpu_ns_total: u64,
    /// ns its processes spent throttled (waiting for a lease).
    pub throttled_ns_total: u64,
    /// Launches admitted through the scheduler's slow path, plus sampled fast-path launches.
    pub launches_total: u64,
}

/// `compute_used` of a slice charged `slice_ns` of GPU time over the last [`WINDOW_NS`] on a
/// device whose slices were charged `device_ns` together: the slice's part of the window, or,
/// when the charges together exceed it (a turn's queued work runs into the next one's, and
/// both are charged for it), its part of what the device was charged. So it is a share of the
/// device's busy time, and slices divided by the sum of their own charges never sum over 1.
pub fn used_fraction(slice_ns: f64, device_ns: f64) -> f64 {
    // Both are sums of u64 charges (finite, ≥ 0); the clamp covers a slice charged in a
    // bucket its device rolled over a moment before.
    (slice_ns / device_ns.max(WINDOW_NS as f64)).clamp(0.0, 1.0)
}

/// The statistics of slice `s` on device `dev` at `now_ns` (CLOCK_MONOTONIC, see
/// [`crate::Os::now_ns`]).
pub fn slice_stats(dev: &SchedDevice, s: &SchedSlice, now_ns: u64) -> SliceComputeStats {
    let window_ns = s.window.ns(now_ns);
    SliceComputeStats {
        used_fraction: used_fraction(window_ns, dev.window.ns(now_ns)),
        window_ns,
        gpu_ns_total: s.gpu_ns_total.load(Relaxed),
        throttled_ns_total: s.throttled_ns_total.load(Relaxed),
        launches_total: s.launches_total.load(Relaxed),
    }
}

impl SchedSlice {
    /// Count `next` ns of work into what the slice's processes queued in their current turn
    /// (`turn_key`, begun at `turn_start_ns`, lease end `end`) if it fits: together at most the
    /// turn's length, however many processes the slice has; the slice's first launch of a turn
    /// always goes (a kernel longer than a turn would never run otherwise). Returns whether it
    /// was counted. The words may be anything (saturating arithmetic).
    pub fn queue_in_turn(&self, now: u64, end: u64, next: u64) -> bool {
        let len = end.saturating_sub(self.turn_start_ns.load(Acquire).min(now));
        self.turn_queued_ns
            .fetch_update(AcqRel, Acquire, |u| {
                (u == 0 || u.saturating_add(next) <= len).then(|| u.saturating_add(next))
            })
            .is_ok()
    }

    /// Forget everything of a previous slice that used this record: the ledger calls it when it
    /// creates a slice in a freed record, before publishing it.
    pub fn reset(&self) {
        for a in [
            &self.vt,
            &self.cap_tat_ns,
            &self.want_ns,
            &self.busy_until_ns,
            &self.gpu_ns_total,
            &self.throttled_ns_total,
            &self.launches_total,
            &self.leases_total,
            &self.turn_key,
            &self.turn_start_ns,
            &self.turn_used_ns,
            &self.tail_ns,
            &self.turn_queued_ns,
            &self.window.start_ns,
            &self.window.cur_ns,
            &self.window.prev_ns,
        ] {
            a.store(0, Release);
        }
        self.turn_holders.clear();
        self.waiters.store(0, Release);
        self.class.store(CLASS_NORMAL, Release);
    }
}
