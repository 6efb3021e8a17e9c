//! The simulated GPU's execution engine ([`Engine`]): every simulated process is a context
//! with its own queue; kernels of every context run in submission order, or time-sliced
//! round-robin like the hardware's (and the fake's) scheduler.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// A kernel submitted to the [`Engine`].
pub type KernelId = usize;

struct Kernel {
    ctx: usize,
    submitted: u64,
    /// When its context's stream reached it: its submission, or the end of the context's
    /// previous kernel (where the shim's start event fires).
    reached: u64,
    end: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Kernels of every context one after another in submission order (no preemption).
    Fifo,
    /// Contexts time-sliced round-robin, like the hardware's (and the fake's) scheduler: a
    /// context keeps the engine while it has work, and hands it on after this many ns when
    /// another context has work too, mid-kernel if need be.
    Sliced(u64),
}

/// The engine's queued work and where it stands: small (only what is queued), so a projection
/// can run a copy forward.
#[derive(Clone)]
struct Sched {
    mode: Mode,
    /// Simulated time the engine has been run up to.
    t: u64,
    /// Per context, its queued kernels in order, with the engine time each still needs.
    queues: Vec<VecDeque<(KernelId, u64)>>,
    /// The context of every queued kernel in submission order ([`Mode::Fifo`]).
    fifo: VecDeque<usize>,
    cur: usize,
    /// Since when `cur` has run while another context had work.
    slice_from: u64,
}

impl Sched {
    fn contended(&self, me: usize) -> bool {
        self.queues
            .iter()
            .enumerate()
            .any(|(c, q)| c != me && !q.is_empty())
    }

    /// The context the engine runs at `self.t`, and until when at most (`None`: idle).
    fn running(&mut self) -> Option<(usize, u64)> {
        match self.mode {
            Mode::Fifo => self.fifo.front().map(|&c| (c, u64::MAX)),
            Mode::Sliced(ts) => {
                let n = self.queues.len();
                if self.queues.get(self.cur).is_none_or(|q| q.is_empty())
                    || (self.contended(self.cur) && self.t >= self.slice_from + ts)
                {
                    // Round-robin to the next context with work.
                    self.cur = (1..=n)
                        .map(|i| (self.cur + i) % n)
                        .find(|&c| !self.queues[c].is_empty())?;
                    self.slice_from = self.t;
                }
                if !self.contended(self.cur) {
                    // Alone: its slice counts from when another context shows up.
                    self.slice_from = self.t;
                    return Some((self.cur, u64::MAX));
                }
                Some((self.cur, self.slice_from + ts))
            }
        }
    }

    /// Run up to `to`: `ran(ctx, from, to)` for each stretch of engine time, `ended(kernel,
    /// ctx, at)` for each completion, which returns whether to stop there.
    fn advance(
        &mut self,
        to: u64,
        ran: &mut dyn FnMut(usize, u64, u64),
        ended: &mut dyn FnMut(KernelId, usize, u64) -> bool,
    ) {
        while self.t < to {
            let Some((ctx, until)) = self.running() else {
                self.t = to;
                return;
            };
            let (k, left) = self.queues[ctx][0];
            let run_to = to.min(until).min(self.t + left);
            ran(ctx, self.t, run_to);
            self.queues[ctx][0].1 -= run_to - self.t;
            self.t = run_to;
            if self.queues[ctx][0].1 == 0 {
                self.queues[ctx].pop_front();
                if self.mode == Mode::Fifo {
                    self.fifo.pop_front();
                }
                if ended(k, ctx, self.t) {
                    return;
                }
            }
        }
    }
}

struct EngineState {
    sched: Sched,
    kernels: Vec<Kernel>,
    /// Per context, the intervals the engine ran its work.
    runs: Vec<Vec<(u64, u64)>>,
}

impl EngineState {
    fn advance(&mut self, to: u64) {
        let (kernels, runs) = (&mut self.kernels, &mut self.runs);
        let mut ended_at: Vec<(KernelId, usize, u64)> = Vec::new();
        self.sched.advance(
            to,
            &mut |ctx, from, to| match runs[ctx].last_mut() {
                Some(r) if r.1 == from => r.1 = to,
                _ => runs[ctx].push((from, to)),
            },
            &mut |k, ctx, at| {
                ended_at.push((k, ctx, at));
                false
            },
        );
        for (k, ctx, at) in ended_at {
            kernels[k].end = Some(at);
            if let Some(&(n, _)) = self.sched.queues[ctx].front() {
                let nk = &mut kernels[n];
                nk.reached = nk.submitted.max(at);
            }
        }
    }
}

/// The GPU's execution engine, shared by every simulated process (each its own context). Run
/// lazily: whoever looks at it runs it up to the simulated time (which only moves forward).
pub struct Engine {
    st: Mutex<EngineState>,
}

impl Engine {
    fn with(mode: Mode) -> Engine {
        Engine {
            st: Mutex::new(EngineState {
                sched: Sched {
                    mode,
                    t: 0,
                    queues: Vec::new(),
                    fifo: VecDeque::new(),
                    cur: 0,
                    slice_from: 0,
                },
                kernels: Vec::new(),
                runs: Vec::new(),
            }),
        }
    }

    /// Kernels of every context one after another in submission order.
    pub fn fifo() -> Engine {
        Engine::with(Mode::Fifo)
    }

    /// Contexts time-sliced round-robin every `slice_ns` while several have work (a real GPU's
    /// and the fake's scheduler: `FAKEGPU_TIMESLICE_US`, 2 ms by default).
    pub fn sliced(slice_ns: u64) -> Engine {
        Engine::with(Mode::Sliced(slice_ns))
    }

    fn lock(&self) -> MutexGuard<'_, EngineState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new context (a process's).
    pub fn context(&self) -> usize {
        let mut st = self.lock();
        st.sched.queues.push(VecDeque::new());
        st.runs.push(Vec::new());
        st.runs.len() - 1
    }

    /// Queue a kernel of `ns` on context `ctx` at `now`.
    pub fn submit(&self, ctx: usize, now: u64, ns: u64) -> KernelId {
        let mut st = self.lock();
        st.advance(now);
        let id = st.kernels.len();
        // Reached at once on an idle stream, else when the previous kernel ends (set then).
        let reached = if st.sched.queues[ctx].is_empty() {
            now
        } else {
            u64::MAX
        };
        st.kernels.push(Kernel {
            ctx,
            submitted: now,
            reached,
            end: None,
        });
        st.sched.queues[ctx].push_back((id, ns.max(1)));
        if st.sched.mode == Mode::Fifo {
            st.sched.fifo.push_back(ctx);
        }
        id
    }

    /// When kernel `k` completed, if it did by `now`.
    pub fn done(&self, k: KernelId, now: u64) -> Option<u64> {
        let mut st = self.lock();
        st.advance(now);
        st.kernels[k].end
    }

    /// The time from when its context's stream reached kernel `k` to its end (what the shim's
    /// events measure), once it completed.
    pub fn measured(&self, k: KernelId) -> Option<u64> {
        let st = self.lock();
        let k = &st.kernels[k];
        k.end.map(|e| e - k.reached.min(e))
    }

    /// When kernel `k` completes if nothing more is submitted (a lower bound: later submissions
    /// of other contexts can only delay it).
    pub fn projected_end(&self, k: KernelId, now: u64) -> u64 {
        let mut st = self.lock();
        st.advance(now);
        if let Some(e) = st.kernels[k].end {
            return e;
        }
        let mut copy = st.sched.clone();
        let mut at = u64::MAX;
        copy.advance(u64::MAX, &mut |_, _, _| {}, &mut |done, _, t| {
            if done == k {
                at = t;
            }
            done == k
        });
        at
    }

    /// The engine time the work queued on contexts `ctxs` still needs at `now`, together.
    pub fn backlog(&self, ctxs: &[usize], now: u64) -> u64 {
        let mut st = self.lock();
        st.advance(now);
        ctxs.iter()
            .filter_map(|&c| st.sched.queues.get(c))
            .flat_map(|q| q.iter().map(|&(_, left)| left))
            .sum()
    }

    /// The stretches of engine time context `ctx` ran, up to `now`.
    pub fn runs(&self, ctx: usize, now: u64) -> Vec<(u64, u64)> {
        let mut st = self.lock();
        st.advance(now);
        st.runs.get(ctx).cloned().unwrap_or_default()
    }

    /// Completion times of context `ctx`'s kernels that completed by `now`.
    pub fn ends(&self, ctx: usize, now: u64) -> Vec<u64> {
        let mut st = self.lock();
        st.advance(now);
        st.kernels
            .iter()
            .filter(|k| k.ctx == ctx && ctx != usize::MAX)
            .filter_map(|k| k.end)
            .collect()
    }
}
