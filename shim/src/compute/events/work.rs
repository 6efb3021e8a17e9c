//! The scheduler's view of this process's queue ([`Work`] for [`Events`]): what is left, how
//! many launches are pending, and waiting for them, from the ring of fences and the run that
//! `mod.rs` keeps.

use super::*;

impl Events {
    /// What is left of the queued work (ns, 0 when overdue but pending); None when every fence
    /// completed and the unfenced launches' estimated end has passed.
    fn left(&mut self, now: u64) -> Option<u64> {
        let fenced = self.poll();
        let unfenced = self.unfenced_end();
        if !fenced {
            if unfenced <= now {
                self.tail_end = 0;
                self.run_end = 0;
                self.orphan_end = 0;
                return None;
            }
            return Some(unfenced - now);
        }
        Some(self.tail_end.max(unfenced).saturating_sub(now))
    }

    /// Launches not known complete: the fences' and, until their estimated end, the run's.
    fn launches_pending(&mut self) -> usize {
        self.poll();
        let now = sched::now_ns();
        let fenced: usize = (0..self.len)
            .map(|i| self.ring[(self.head + i) % RING].launches as usize)
            .sum();
        let run = if self.run_n > 0 && self.run_end > now {
            self.run_n as usize
        } else {
            0
        };
        fenced + run
    }
}

impl Work for Events {
    fn outstanding_ns(&mut self) -> u64 {
        // Pending but overdue by the estimate: still something, so a holder keeps waiting.
        self.left(sched::now_ns())
            .map_or(0, |l| l.max(MIN_PENDING_NS))
    }

    fn wait_below(&mut self, ns: u64) -> u64 {
        self.fence_run();
        let t0 = sched::now_ns();
        loop {
            let now = sched::now_ns();
            let Some(left) = self.left(now) else {
                return 0;
            };
            // Past its estimated end the rest is unknown: wait for it to complete.
            if (left > 0 && left <= ns) || now.saturating_sub(t0) > DRAIN_LIMIT_NS {
                return left.max(MIN_PENDING_NS);
            }
            let nap_ns = if left > ns {
                left - ns
            } else {
                MIN_PENDING_NS * 2
            };
            std::thread::sleep(std::time::Duration::from_nanos(nap_ns.min(1_000_000)));
        }
    }

    fn next_ns(&mut self) -> u64 {
        self.next
    }

    fn next_least_ns(&mut self) -> u64 {
        self.next_least.min(self.next)
    }

    fn finished_at(&mut self) -> Option<u64> {
        let now = sched::now_ns();
        self.left(now)
            .is_none()
            .then(|| self.done_seen.max(self.unfenced_end()).min(now))
            .filter(|&at| at != 0)
    }

    fn pending(&mut self) -> usize {
        self.launches_pending()
    }

    fn wait_pending(&mut self, n: usize) {
        self.fence_run();
        let t0 = sched::now_ns();
        while self.launches_pending() > n {
            if sched::now_ns().saturating_sub(t0) > DRAIN_LIMIT_NS {
                return;
            }
            let est = if self.len > 0 {
                self.ring[self.head].est
            } else {
                self.run_ns
            };
            nap(est);
        }
    }

    fn track_each(&mut self, until_ns: u64) {
        self.each_until = self.each_until.max(until_ns);
    }

    fn drain(&mut self) -> u64 {
        self.fence_run();
        let t0 = sched::now_ns();
        while let Some(left) = self.left(sched::now_ns()) {
            if sched::now_ns().saturating_sub(t0) > DRAIN_LIMIT_NS {
                break;
            }
            nap(left);
        }
        sched::now_ns()
    }
}
