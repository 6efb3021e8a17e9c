//! One simulated process's queued work as the shim's event ring sees it ([`Queue`], the
//! scheduler's [`Work`]).

use std::collections::VecDeque;

use super::engine::KernelId;
use super::{Cpu, Engine};
use crate::work::{least_of, Work};

/// What pending work counts for once its estimated end has passed (the shim's figure).
const MIN_PENDING_NS: u64 = 10_000;

/// One process's queued work, as the shim's event ring sees it (the scheduler's [`Work`]).
pub struct Queue<'a, 'w> {
    cpu: &'a Cpu<'w>,
    engine: &'a Engine,
    /// The process's context on the engine.
    pub ctx: usize,
    /// Every launch in flight (what the program paces itself on).
    pub all: VecDeque<KernelId>,
    /// The tracked launches (admitted off the solo path).
    tracked: VecDeque<KernelId>,
    /// Learn the estimate from completions, as the shim does from its events: a launch's
    /// measured time runs from when its stream reached it (its submission, or the process's
    /// previous kernel's end) to its end, so it includes time other contexts held the engine.
    pub learn: bool,
    /// The estimate of one launch.
    pub est_ns: u64,
    /// The least recent measurement of one launch ([`least_of`]).
    least_ns: u64,
    /// Estimated end of the tracked work.
    tail_end: u64,
    /// The latest tracked launch.
    last_tracked: Option<KernelId>,
}

impl<'a, 'w> Queue<'a, 'w> {
    /// An empty queue (a new context) whose launches are estimated at `est_ns`.
    pub fn new(cpu: &'a Cpu<'w>, engine: &'a Engine, est_ns: u64) -> Queue<'a, 'w> {
        Queue {
            cpu,
            engine,
            ctx: engine.context(),
            all: VecDeque::new(),
            tracked: VecDeque::new(),
            learn: false,
            est_ns,
            least_ns: est_ns,
            tail_end: 0,
            last_tracked: None,
        }
    }

    /// Launch a kernel of `ns` now (`tracked`: admitted by the scheduler, so the shim records
    /// events around it).
    pub fn launch(&mut self, ns: u64, tracked: bool) -> KernelId {
        let now = self.cpu.peek();
        let k = self.engine.submit(self.ctx, now, ns);
        self.all.push_back(k);
        if tracked {
            self.tracked.push_back(k);
            self.last_tracked = Some(k);
            self.tail_end = self.tail_end.max(now) + self.est_ns;
        }
        k
    }

    /// Sleep until kernel `k` completed (as a synchronizing call does); returns when.
    pub fn wait(&self, k: KernelId) -> u64 {
        loop {
            let now = self.cpu.peek();
            if let Some(e) = self.engine.done(k, now) {
                return e;
            }
            let at = self.engine.projected_end(k, now).max(now + 1);
            self.cpu.sleep_until(at);
        }
    }

    /// Sleep until the oldest launch in flight completed (a program's bounded queue).
    pub fn wait_oldest(&mut self) {
        if let Some(k) = self.all.pop_front() {
            self.wait(k);
        }
    }

    /// Retire completed tracked launches; whether any is still pending.
    fn poll(&mut self) -> bool {
        let now = self.cpu.peek();
        while let Some(&k) = self.tracked.front() {
            if self.engine.done(k, now).is_none() {
                break;
            }
            self.tracked.pop_front();
            if self.learn {
                let m = self.engine.measured(k).unwrap_or(self.est_ns);
                self.est_ns = (3 * self.est_ns + m) / 4;
                self.least_ns = least_of(self.least_ns, m);
            }
        }
        !self.tracked.is_empty()
    }
}

impl Work for Queue<'_, '_> {
    fn outstanding_ns(&mut self) -> u64 {
        if !self.poll() {
            self.tail_end = 0;
            return 0;
        }
        self.tail_end
            .saturating_sub(self.cpu.peek())
            .max(MIN_PENDING_NS)
    }

    fn next_ns(&mut self) -> u64 {
        self.est_ns
    }

    fn next_least_ns(&mut self) -> u64 {
        self.least_ns.min(self.est_ns)
    }

    fn drain(&mut self) -> u64 {
        if let Some(&k) = self.tracked.back() {
            self.wait(k);
        }
        self.poll();
        self.cpu.peek()
    }

    fn finished_at(&mut self) -> Option<u64> {
        if self.poll() {
            return None;
        }
        self.engine.done(self.last_tracked?, self.cpu.peek())
    }

    fn pending(&mut self) -> usize {
        self.poll();
        self.tracked.len()
    }

    fn wait_pending(&mut self, n: usize) {
        self.poll();
        if self.tracked.len() > n {
            let k = self.tracked[self.tracked.len() - 1 - n];
            self.wait(k);
            self.poll();
        }
    }

    fn wait_below(&mut self, ns: u64) -> u64 {
        let t0 = self.cpu.peek();
        loop {
            if !self.poll() {
                self.tail_end = 0;
                return 0;
            }
            let now = self.cpu.peek();
            let left = self.tail_end.saturating_sub(now);
            if (left > 0 && left <= ns) || now.saturating_sub(t0) > 1_000_000_000 {
                return left.max(MIN_PENDING_NS);
            }
            let nap = if left > ns {
                left - ns
            } else {
                2 * MIN_PENDING_NS
            };
            self.cpu.sleep(nap.min(1_000_000));
        }
    }
}
