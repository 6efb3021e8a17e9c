//! Rings of node mode's bell that the monitor's turns thread did not sleep through.
//!
//! A process rings the policy's `turns_bell` (`FUTEX_WAKE`) when it begins waiting for a turn or
//! hands one back. It maps the bell read-only, so it cannot change the word: a ring that comes
//! while the thread is in a pass, not yet asleep on the bell, wakes nobody, and the thread would
//! sleep until its next look (up to `POLL_NS`, 1 ms) with a latency slice waiting for its grant.
//! [`Rings`] notes what each process said when a pass began and tells the thread, before it
//! sleeps, whether one has rung since: then it passes again instead.

use core::sync::atomic::Ordering::Acquire;

use super::granted::GrantProc;

/// What each process said at a pass's start: whether it waits for a turn, and the turn it
/// handed back (its words are hostile: a process that changes them without pause costs a pass
/// per the monitor's `MIN_PASS_NS`, as ringing without pause does).
#[derive(Default)]
pub struct Rings {
    seen: Vec<(bool, u64)>,
    now: Vec<(bool, u64)>,
}

fn said(words: &mut dyn Iterator<Item = Option<&GrantProc>>, into: &mut Vec<(bool, u64)>) {
    into.clear();
    into.extend(words.map(|w| {
        w.map_or((false, 0), |w| {
            (w.want_ns.load(Acquire) != 0, w.done_turn.load(Acquire))
        })
    }));
}

impl Rings {
    /// A pass begins: note the processes' words (the same processes, in the same order, as
    /// [`Rings::missed`] will be shown; `None` for one whose words are not mapped).
    pub fn pass(&mut self, words: &mut dyn Iterator<Item = Option<&GrantProc>>) {
        said(words, &mut self.seen);
    }

    /// Whether a process began waiting or handed a turn back since [`Rings::pass`] (one that
    /// stopped waiting launched, which needs no pass).
    pub fn missed(&mut self, words: &mut dyn Iterator<Item = Option<&GrantProc>>) -> bool {
        said(words, &mut self.now);
        self.seen.len() != self.now.len()
            || self
                .seen
                .iter()
                .zip(&self.now)
                .any(|(b, a)| (a.0 && !b.0) || a.1 != b.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering::Relaxed;

    #[test]
    fn a_process_that_began_waiting_or_handed_back_in_a_pass_is_a_missed_ring() {
        let w = [GrantProc::default(), GrantProc::default()];
        let words = || w.iter().map(Some);
        let mut r = Rings::default();
        r.pass(&mut words());
        assert!(!r.missed(&mut words()));
        w[1].want_ns.store(5, Relaxed);
        assert!(r.missed(&mut words()), "began waiting");
        r.pass(&mut words());
        // A heartbeat of a process already waiting, and a launch, ring nothing.
        w[1].want_ns.store(9, Relaxed);
        assert!(!r.missed(&mut words()));
        w[1].want_ns.store(0, Relaxed);
        assert!(!r.missed(&mut words()));
        w[0].done_turn.store(3, Relaxed);
        assert!(r.missed(&mut words()), "handed back");
        r.pass(&mut words());
        assert!(r.missed(&mut w[..1].iter().map(Some)), "a process left");
    }
}
