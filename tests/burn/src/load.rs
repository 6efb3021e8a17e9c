//! The kernel phase: `gpuslice_spin` launched on one or more streams, a bounded number of
//! launches in flight per stream, optionally replayed from captured graphs.
//!
//! Pacing: each stream owns a queue of at most `--depth` launch units (one launch, or one graph
//! replay), each followed by an event. Before adding a unit to a full queue burn waits for the
//! oldest event, so the driver's queue never grows without bound and completions are counted as
//! they happen. Streams are served round-robin from one thread.
//!
//! Measures: `gpu_seconds` is completed kernels × `--kernel-us`, the GPU work done for us:
//! on the fake, exactly the simulated engine time this process got; on a real GPU, the spin
//! time, since the kernel spins on the wall clock. `event_seconds` is, summed over streams, what
//! `cuEventElapsedTime` measures between an event recorded before the first launch and one after
//! the last: the time the stream was busy or queued, including waiting for other contexts.

use core::ffi::c_void;
use std::collections::VecDeque;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use gpuslice_abi::*;

use crate::cli::{Launch, Options};
use crate::driver::{cu, Driver, Failure};

/// The embedded module, NUL-terminated as `cuModuleLoadData` wants PTX text.
const PTX: &str = concat!(include_str!("spin.ptx"), "\0");

/// What the kernel phase achieved.
#[derive(Debug, Default, Clone)]
pub struct LoadStats {
    /// Kernels completed.
    pub kernels: u64,
    /// Launch calls made (kernel launches, or graph replays with `--graph`).
    pub launches: u64,
    /// Completed kernels × kernel duration.
    pub gpu_seconds: f64,
    /// Stream time measured with events (see the module comment).
    pub event_seconds: f64,
    /// Wall-clock time of the phase, from the first launch to the last completion.
    pub wall_seconds: f64,
}

struct StreamState {
    stream: CUstream,
    graph: CUgraph,
    exec: CUgraphExec,
    start: CUevent,
    end: CUevent,
    /// Events after launch units still in flight, with the kernels each unit holds.
    inflight: VecDeque<(CUevent, u64)>,
    spare: Vec<CUevent>,
}

/// Module, function and streams of one kernel phase; [`Load::close`] releases them.
pub struct Load<'d> {
    d: &'d Driver,
    module: CUmodule,
    func: CUfunction,
    launch: Launch,
    ns: u64,
    /// Kernels per launch unit.
    unit: u64,
    streams: Vec<StreamState>,
}

impl<'d> Load<'d> {
    /// Load the module, create the streams and events, and capture the graphs.
    pub fn new(d: &'d Driver, o: &Options) -> Result<Load<'d>, Failure> {
        let mut load = Load {
            d,
            module: null_mut(),
            func: null_mut(),
            launch: o.launch,
            ns: o.kernel_us.saturating_mul(1000),
            unit: o.graph.max(1) as u64,
            streams: Vec::new(),
        };
        // On error, `load` is dropped half-built; `close` tolerates null handles.
        match load.setup(o) {
            Ok(()) => Ok(load),
            Err(e) => {
                let _ = load.close();
                Err(e)
            }
        }
    }

    fn setup(&mut self, o: &Options) -> Result<(), Failure> {
        let d = self.d;
        cu!(d, cuModuleLoadData(&mut self.module, PTX.as_ptr().cast()))?;
        cu!(
            d,
            cuModuleGetFunction(&mut self.func, self.module, c"gpuslice_spin".as_ptr())
        )?;
        for _ in 0..o.streams {
            let mut s = StreamState {
                stream: null_mut(),
                graph: null_mut(),
                exec: null_mut(),
                start: null_mut(),
                end: null_mut(),
                inflight: VecDeque::new(),
                spare: Vec::new(),
            };
            let r = (|| {
                cu!(d, cuStreamCreate(&mut s.stream, CU_STREAM_NON_BLOCKING))?;
                cu!(d, cuEventCreate(&mut s.start, CU_EVENT_DEFAULT))?;
                cu!(d, cuEventCreate(&mut s.end, CU_EVENT_DEFAULT))?;
                for _ in 0..o.depth {
                    let mut e = null_mut();
                    cu!(d, cuEventCreate(&mut e, CU_EVENT_DEFAULT))?;
                    s.spare.push(e);
                }
                if o.graph > 0 {
                    self.capture(&mut s, o.graph)?;
                }
                Ok(())
            })();
            self.streams.push(s);
            r?;
        }
        Ok(())
    }

    fn capture(&self, s: &mut StreamState, n: usize) -> Result<(), Failure> {
        let d = self.d;
        cu!(
            d,
            cuStreamBeginCapture(s.stream, CU_STREAM_CAPTURE_MODE_GLOBAL)
        )?;
        let mut launched = Ok(());
        for _ in 0..n {
            launched = self.launch_one(s.stream);
            if launched.is_err() {
                break;
            }
        }
        // End the capture even after a failed launch, so the stream is usable again.
        let ended = cu!(d, cuStreamEndCapture(s.stream, &mut s.graph));
        launched?;
        ended?;
        cu!(d, cuGraphInstantiateWithFlags(&mut s.exec, s.graph, 0))
    }

    fn launch_one(&self, stream: CUstream) -> Result<(), Failure> {
        let d = self.d;
        let mut ns = self.ns;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        match self.launch {
            Launch::Plain => cu!(
                d,
                cuLaunchKernel(
                    self.func,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    null_mut()
                )
            ),
            Launch::Ex => {
                let cfg = CUlaunchConfig {
                    gridDimX: 1,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: 1,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    hStream: stream,
                    attrs: null_mut(),
                    numAttrs: 0,
                };
                cu!(
                    d,
                    cuLaunchKernelEx(&cfg, self.func, params.as_mut_ptr(), null_mut())
                )
            }
            Launch::Cooperative => cu!(
                d,
                cuLaunchCooperativeKernel(
                    self.func,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr()
                )
            ),
        }
    }

    /// Launch until `seconds` passed or `kernels` were launched, then wait for all of them.
    /// `report` prints interval lines when set.
    pub fn run(
        &mut self,
        seconds: Option<Duration>,
        kernels: Option<u64>,
        report: Option<Duration>,
    ) -> Result<LoadStats, Failure> {
        let d = self.d;
        let mut st = LoadStats::default();
        let kernel_s = self.ns as f64 / 1e9;
        let t0 = Instant::now();
        for s in &self.streams {
            cu!(d, cuEventRecord(s.start, s.stream))?;
        }
        let mut next_report = report.map(|r| (t0 + r, 0u64, t0));
        let mut launched = 0u64;
        'launching: loop {
            for i in 0..self.streams.len() {
                let done_by_time = seconds.is_some_and(|s| t0.elapsed() >= s);
                let done_by_count = kernels.is_some_and(|k| launched >= k);
                if done_by_time || done_by_count || (seconds.is_none() && kernels.is_none()) {
                    break 'launching;
                }
                let s = &mut self.streams[i];
                if s.spare.is_empty() {
                    let (ev, k) = s
                        .inflight
                        .pop_front()
                        .expect("a full queue has an oldest unit");
                    cu!(d, cuEventSynchronize(ev))?;
                    st.kernels += k;
                    s.spare.push(ev);
                }
                let ev = s.spare.pop().expect("a spare event after waiting");
                let stream = s.stream;
                let exec = s.exec;
                let r = if exec.is_null() {
                    self.launch_one(stream)
                } else {
                    cu!(d, cuGraphLaunch(exec, stream))
                };
                let s = &mut self.streams[i];
                if let Err(e) = r.and_then(|()| cu!(d, cuEventRecord(ev, stream))) {
                    s.spare.push(ev);
                    return Err(e);
                }
                s.inflight.push_back((ev, self.unit));
                st.launches += 1;
                launched += self.unit;
            }
            if let Some((at, ref mut last_kernels, ref mut last_t)) = next_report {
                let now = Instant::now();
                if now >= at {
                    self.poll(&mut st)?;
                    let dt = now.duration_since(*last_t).as_secs_f64();
                    let k = st.kernels - *last_kernels;
                    let line = serde_json::json!({
                        "event": "interval",
                        "t": now.duration_since(t0).as_secs_f64(),
                        "mono": mono_seconds(),
                        "kernels": k,
                        "gpu_seconds": k as f64 * kernel_s,
                        "gpu_fraction": k as f64 * kernel_s / dt,
                    });
                    crate::cli::emit(line);
                    next_report = Some((at + report.unwrap_or_default(), st.kernels, now));
                }
            }
        }
        for s in &mut self.streams {
            while let Some((ev, k)) = s.inflight.pop_front() {
                cu!(d, cuEventSynchronize(ev))?;
                st.kernels += k;
                s.spare.push(ev);
            }
            cu!(d, cuEventRecord(s.end, s.stream))?;
        }
        for s in &self.streams {
            cu!(d, cuEventSynchronize(s.end))?;
            let mut ms = 0f32;
            cu!(d, cuEventElapsedTime(&mut ms, s.start, s.end))?;
            st.event_seconds += f64::from(ms) / 1e3;
        }
        st.wall_seconds = t0.elapsed().as_secs_f64();
        st.gpu_seconds = st.kernels as f64 * kernel_s;
        Ok(st)
    }

    /// Count units that completed without waiting for any.
    fn poll(&mut self, st: &mut LoadStats) -> Result<(), Failure> {
        let d = self.d;
        for s in &mut self.streams {
            while let Some(&(ev, k)) = s.inflight.front() {
                match cu!(d, cuEventQuery(ev)) {
                    Ok(()) => {
                        s.inflight.pop_front();
                        st.kernels += k;
                        s.spare.push(ev);
                    }
                    Err(Failure::Cuda {
                        code: CUDA_ERROR_NOT_READY,
                        ..
                    }) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Wait for all work and release every handle; reports the first failure.
    pub fn close(mut self) -> Result<(), Failure> {
        let d = self.d;
        let mut first: Result<(), Failure> = Ok(());
        let mut check = |r: Result<(), Failure>| {
            if first.is_ok() {
                first = r;
            }
        };
        for s in self.streams.drain(..) {
            if !s.stream.is_null() {
                check(cu!(d, cuStreamSynchronize(s.stream)));
            }
            let events = s
                .inflight
                .iter()
                .map(|&(e, _)| e)
                .chain(s.spare.iter().copied());
            for e in events.chain([s.start, s.end]).filter(|e| !e.is_null()) {
                check(cu!(d, cuEventDestroy(e)));
            }
            if !s.exec.is_null() {
                check(cu!(d, cuGraphExecDestroy(s.exec)));
            }
            if !s.graph.is_null() {
                check(cu!(d, cuGraphDestroy(s.graph)));
            }
            if !s.stream.is_null() {
                check(cu!(d, cuStreamDestroy(s.stream)));
            }
        }
        if !self.module.is_null() {
            check(cu!(d, cuModuleUnload(self.module)));
        }
        first
    }
}

/// CLOCK_MONOTONIC in seconds: the one clock of every process on the machine, so the interval
/// lines of several tenants can be laid on one time line.
fn mono_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
