//! `gpuslice-bench`: the compute-share benchmark behind `scripts/bench.sh` (a benchmark, not a
//! test: it reports numbers, it asserts nothing).
//!
//! - `gpuslice-bench shares [--scenario A,B] [--kernel-us N,M] [--launch plain,ex,graph]
//!   [--seconds S] [--all]`: runs `gpuslice-burn` tenants under the shim on the fake GPU (or on
//!   whatever `libcuda.so.1` the environment provides) and prints, per scenario and tenant, the
//!   assigned share, the achieved fraction over the measured window (S − 2 s, default 10 s) and
//!   the worst 1 s interval. Achieved = burn's own count of completed kernels × kernel time,
//!   never the scheduler's bookkeeping.
//! - `gpuslice-bench overhead [--launches N]`: ns per `cuLaunchKernel` call, direct, under the
//!   shim alone on the device, and under the shim while another slice contends (median of the
//!   admitted calls, so time spent waiting for a turn is not counted as overhead).
//! - `gpuslice-bench freeze [--runs N] [--seconds S]`: issue 14's pair started together and
//!   0-300 ms apart, N times: longest gap without a completed kernel and worst 5 s split.
//! - `gpuslice-bench latency [--seconds S]`: a request/response client (bursts of 20 kernels)
//!   alone, next to a trainer, and next to it with `GPUSLICE_PRIORITY=latency`: p50/p99 burst
//!   latency and the trainer's GPU fraction (`burst-loop` is the client it runs).
//! - `gpuslice-bench launch-loop N`: the client `overhead` runs (times N launch calls).
//!
//! Artifacts (`gpuslice-burn`, `libgpuslice.so`, `libfakegpu.so`) are looked up beside this
//! executable; `FAKEGPU=0` in the environment uses the system's `libcuda.so.1` instead.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Environment of one benchmark run: a private fake-GPU state and ledger.
struct Env {
    root: PathBuf,
    fake_libs: Option<PathBuf>,
}

impl Env {
    fn new(tag: &str) -> Env {
        let root =
            std::env::temp_dir().join(format!("gpuslice-bench-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("fakegpu")).unwrap();
        std::fs::create_dir_all(root.join("ledger")).unwrap();
        let fake_libs = (std::env::var("FAKEGPU").as_deref() != Ok("0")).then(|| {
            let lib = bin_dir().join("libfakegpu.so");
            assert!(
                lib.exists(),
                "{} is missing: build with scripts/bench.sh",
                lib.display()
            );
            let dir = root.join("libs");
            std::fs::create_dir_all(&dir).unwrap();
            for n in [
                "libcuda.so.1",
                "libcuda.so",
                "libnvidia-ml.so.1",
                "libnvidia-ml.so",
            ] {
                std::os::unix::fs::symlink(&lib, dir.join(n)).unwrap();
            }
            dir
        });
        Env { root, fake_libs }
    }

    fn command(&self, program: &Path, wrapped: bool) -> Command {
        let mut c = Command::new(program);
        if let Some(l) = &self.fake_libs {
            c.env("LD_LIBRARY_PATH", l)
                .env("FAKEGPU_DEVICES", "1")
                .env("FAKEGPU_MEMORY", "16Gi");
        }
        c.env("FAKEGPU_STATE_DIR", self.root.join("fakegpu"))
            .env("GPUSLICE_RUNTIME_DIR", self.root.join("ledger"))
            .env_remove("LD_PRELOAD");
        for (k, _) in std::env::vars() {
            if k.starts_with("GPUSLICE_COMPUTE") || k == "GPUSLICE_SLICE" || k == "GPUSLICE_MEMORY"
            {
                c.env_remove(k);
            }
        }
        if wrapped {
            c.env("LD_PRELOAD", bin_dir().join("libgpuslice.so"));
        }
        c
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One tenant of a scenario.
#[derive(Clone)]
struct Spec {
    share: Option<f64>,
    cap: Option<f64>,
    /// Stop after this many seconds (work conservation); None: the whole run.
    seconds: Option<f64>,
    wrapped: bool,
}

impl Spec {
    fn share(s: f64) -> Spec {
        Spec {
            share: Some(s),
            cap: None,
            seconds: None,
            wrapped: true,
        }
    }
}

/// What a scenario expects each tenant to achieve over the window (and after the idle point).
struct Scenario {
    name: &'static str,
    tenants: Vec<Spec>,
    /// Expected fraction per tenant.
    expect: Vec<f64>,
    /// Run the tenants one after another (each alone on the device), not together.
    sequential: bool,
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "pair",
            tenants: vec![Spec::share(0.25), Spec::share(0.75)],
            expect: vec![0.25, 0.75],
            sequential: false,
        },
        Scenario {
            name: "article",
            tenants: vec![Spec::share(0.2), Spec::share(0.5), Spec::share(0.3)],
            expect: vec![0.2, 0.5, 0.3],
            sequential: false,
        },
        Scenario {
            name: "eight",
            tenants: vec![Spec::share(0.125); 8],
            expect: vec![0.125; 8],
            sequential: false,
        },
        Scenario {
            name: "cap",
            tenants: vec![Spec {
                share: None,
                cap: Some(0.3),
                seconds: None,
                wrapped: true,
            }],
            expect: vec![0.3],
            sequential: false,
        },
        // Work conservation: the second tenant stops halfway; the first should then have all of
        // it. Reported over the second half for the first tenant.
        Scenario {
            name: "idle",
            tenants: vec![
                Spec::share(0.5),
                Spec {
                    seconds: Some(0.5),
                    ..Spec::share(0.5)
                },
            ],
            expect: vec![1.0, 0.5],
            sequential: false,
        },
        // Alone with a share, against the same load unwrapped (the ratio is what counts).
        Scenario {
            name: "alone",
            tenants: vec![
                Spec::share(0.25),
                Spec {
                    wrapped: false,
                    ..Spec::share(0.25)
                },
            ],
            expect: vec![1.0, 1.0],
            sequential: true,
        },
    ]
}

struct Ran {
    intervals: Vec<(f64, f64)>, // (t at end, gpu_seconds in the interval)
    report: Value,
}

fn spawn_burn(env: &Env, name: &str, spec: &Spec, args: &[String]) -> Child {
    let mut c = env.command(&bin_dir().join("gpuslice-burn"), spec.wrapped);
    c.args(args)
        .args(["--json", "--report-interval", "1"])
        .env("GPUSLICE_SLICE", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(s) = spec.share {
        c.env("GPUSLICE_COMPUTE", s.to_string());
    }
    if let Some(s) = spec.cap {
        c.env("GPUSLICE_COMPUTE_CAP", s.to_string());
    }
    c.spawn().expect("spawn gpuslice-burn")
}

fn collect(child: Child) -> Ran {
    let out = child.wait_with_output().expect("wait gpuslice-burn");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let report = lines.last().cloned().unwrap_or(Value::Null);
    if !out.status.success() || !report["error"].is_null() {
        eprintln!(
            "gpuslice-bench: a tenant failed: {report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let intervals = lines
        .iter()
        .filter(|v| v["event"] == "interval")
        .map(|v| {
            (
                v["t"].as_f64().unwrap_or(0.0),
                v["gpu_seconds"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    Ran { intervals, report }
}

/// Fraction over the intervals ending in `(from, to]`, and the worst ~1 s window's deviation
/// from `expect`. burn reports on a fixed schedule, so after a launch that blocked past a report
/// time the next report comes early: short intervals are merged into the next one.
fn window(r: &Ran, from: f64, to: f64, expect: f64) -> (f64, f64) {
    let (mut gpu, mut span, mut worst) = (0.0, 0.0, 0.0f64);
    let (mut prev, mut acc_g, mut acc_t) = (0.0, 0.0, 0.0);
    for &(t, g) in &r.intervals {
        if t > from && t <= to + 0.05 {
            gpu += g;
            span += t - prev;
            acc_g += g;
            acc_t += t - prev;
            if acc_t >= 0.9 {
                worst = worst.max((acc_g / acc_t - expect).abs());
                (acc_g, acc_t) = (0.0, 0.0);
            }
        }
        prev = t;
    }
    if span == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    (gpu / span, worst)
}

fn burn_args(kernel_us: u64, launch: &str, seconds: f64) -> Vec<String> {
    let mut a = vec![
        "--kernel-us".into(),
        kernel_us.to_string(),
        "--seconds".into(),
        format!("{seconds}"),
        "--depth".into(),
        "8".into(),
    ];
    match launch {
        "graph" => {
            let n = (1000 / kernel_us).clamp(1, 50);
            a.extend(["--graph".into(), n.to_string()]);
        }
        l => a.extend(["--launch".into(), l.into()]),
    }
    a
}

fn shares(opts: &Opts) {
    println!(
        "{:<8} {:>7} {:<6} {:>6} {:>9} {:>9} {:>9} {:>10}",
        "scenario", "kernel", "launch", "tenant", "assigned", "expected", "achieved", "worst-1s"
    );
    for sc in scenarios()
        .into_iter()
        .filter(|s| opts.scenarios.iter().any(|n| n == s.name))
    {
        for &k in &opts.kernels {
            for launch in &opts.launches {
                let env = Env::new(sc.name);
                let total = opts.seconds;
                let start = |(i, spec): (usize, &Spec)| {
                    let secs = spec.seconds.map_or(total, |f| total * f);
                    let args = burn_args(k, launch, secs);
                    spawn_burn(&env, &format!("{}{i}", sc.name), spec, &args)
                };
                let runs: Vec<Ran> = if sc.sequential {
                    sc.tenants
                        .iter()
                        .enumerate()
                        .map(|t| collect(start(t)))
                        .collect()
                } else {
                    let children: Vec<Child> = sc.tenants.iter().enumerate().map(start).collect();
                    children.into_iter().map(collect).collect()
                };
                for (i, (r, spec)) in runs.iter().zip(&sc.tenants).enumerate() {
                    let expect = sc.expect[i];
                    // The measured window: after a 1 s start, before the last second; for the
                    // idle scenario's stayer, the part after its neighbour left.
                    let (from, to) = match (sc.name, i) {
                        ("idle", 0) => (total * 0.5 + 1.0, total - 1.0),
                        ("idle", 1) => (1.0, total * 0.5 - 0.5),
                        _ => (1.0, total - 1.0),
                    };
                    let (got, worst) = window(r, from, to, expect);
                    let assigned = match (spec.share, spec.cap, spec.wrapped) {
                        (_, _, false) => "direct".to_string(),
                        (_, Some(c), _) => format!("cap {c}"),
                        (Some(s), _, _) => format!("{s}"),
                        _ => "-".into(),
                    };
                    println!(
                        "{:<8} {:>5}us {:<6} {:>6} {:>9} {:>9.3} {:>9.3} {:>10.3}",
                        sc.name, k, launch, i, assigned, expect, got, worst
                    );
                    let _ = &r.report;
                }
                if sc.name == "alone" {
                    let w = window(&runs[0], 1.0, total - 1.0, 1.0).0;
                    let d = window(&runs[1], 1.0, total - 1.0, 1.0).0;
                    println!(
                        "{:<8} {:>5}us {:<6} wrapped/direct throughput: {:.3}",
                        sc.name,
                        k,
                        launch,
                        w / d
                    );
                }
            }
        }
    }
}

/// One tenant's interval lines on CLOCK_MONOTONIC: (start, end, kernels, gpu_seconds).
fn mono_spans(child: Child) -> Vec<(f64, f64, u64, f64)> {
    let out = child.wait_with_output().expect("wait gpuslice-burn");
    let mut prev: Option<f64> = None;
    let mut spans = Vec::new();
    for v in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "interval")
    {
        let (t, mono) = (
            v["t"].as_f64().unwrap_or(0.0),
            v["mono"].as_f64().unwrap_or(0.0),
        );
        let start = prev.unwrap_or(mono - t);
        let k = v["kernels"].as_u64().unwrap_or(0);
        spans.push((start, mono, k, v["gpu_seconds"].as_f64().unwrap_or(0.0)));
        prev = Some(mono);
    }
    if !out.status.success() {
        eprintln!(
            "gpuslice-bench: a tenant failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    spans
}

/// `freeze`: issue 14's pair (0.25/0.75, 1 ms kernels, depth 2) `runs` times, the second tenant
/// started 0-300 ms after the first (every fifth run together); per run, over the window in
/// which both ran: each tenant's longest stretch without a completed kernel, and the worst
/// deviation of the 0.25 tenant's part from 0.25 over any 5 s window (stepped by 0.2 s).
fn freeze(runs: usize, seconds: f64) {
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "run", "delay_ms", "gap_0.25", "gap_0.75", "worst_5s", "part_all"
    );
    let (mut worst_gap, mut worst_dev, mut bad) = (0.0f64, 0.0f64, 0);
    for i in 0..runs {
        // A fixed sequence, so two benchmark runs try the same delays.
        let delay_ms = if i % 5 == 0 { 0 } else { (i as u64 * 97) % 301 };
        let env = Env::new(&format!("freeze{i}"));
        let args: Vec<String> = [
            "--kernel-us",
            "1000",
            "--depth",
            "2",
            "--seconds",
            &seconds.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let spawn = |name: &str, share: f64| {
            let mut c = env.command(&bin_dir().join("gpuslice-burn"), true);
            c.args(&args)
                .args(["--json", "--report-interval", "0.2"])
                .env("GPUSLICE_SLICE", name)
                .env("GPUSLICE_COMPUTE", share.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().expect("spawn gpuslice-burn")
        };
        let a = spawn("quarter", 0.25);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let b = spawn("three-quarters", 0.75);
        let (a, b) = (mono_spans(a), mono_spans(b));
        let (Some(fa), Some(fb), Some(la), Some(lb)) = (a.first(), b.first(), a.last(), b.last())
        else {
            println!("{i:>4} {delay_ms:>9} no intervals");
            bad += 1;
            continue;
        };
        let (from, to) = (fa.0.max(fb.0) + 0.2, la.1.min(lb.1) - 0.2);
        let gap = |sp: &[(f64, f64, u64, f64)]| {
            let (mut last, mut g) = (from, 0.0f64);
            for &(_, e, k, _) in sp.iter().filter(|s| s.1 >= from && s.1 <= to) {
                if k > 0 {
                    g = g.max(e - last);
                    last = e;
                }
            }
            g.max(to - last)
        };
        let gpu = |sp: &[(f64, f64, u64, f64)], x: f64, y: f64| -> f64 {
            sp.iter()
                .filter(|s| s.0 >= x - 1e-6 && s.1 <= y + 1e-6)
                .map(|s| s.3)
                .sum()
        };
        let (ga, gb) = (gap(&a), gap(&b));
        let mut dev = 0.0f64;
        let mut w = from;
        while w + 5.0 <= to + 1e-6 {
            let (x, y) = (gpu(&a, w, w + 5.0), gpu(&b, w, w + 5.0));
            if x + y > 0.0 {
                dev = dev.max((x / (x + y) - 0.25).abs());
            }
            w += 0.2;
        }
        let (x, y) = (gpu(&a, from, to), gpu(&b, from, to));
        let part = x / (x + y).max(1e-9);
        println!("{i:>4} {delay_ms:>9} {ga:>9.3} {gb:>9.3} {dev:>10.3} {part:>9.3}");
        worst_gap = worst_gap.max(ga.max(gb));
        worst_dev = worst_dev.max(dev);
        if ga.max(gb) > 1.2 || dev > 0.04 {
            bad += 1;
        }
    }
    println!(
        "freeze: {runs} runs, longest gap {worst_gap:.3} s (limit 1.2), worst 5 s deviation \
         {worst_dev:.3} (limit 0.04), runs over a limit: {bad}"
    );
}

/// The driver entry points a benchmark client needs, with one kernel loaded and one stream.
struct Client {
    launch: LaunchFn,
    sync: unsafe extern "C" fn(gpuslice_abi::CUstream) -> gpuslice_abi::CUresult,
    f: gpuslice_abi::CUfunction,
    s: gpuslice_abi::CUstream,
}

/// `cuLaunchKernel`, typed from the headers (`gpuslice_abi::pfn`).
type LaunchFn = gpuslice_abi::pfn::cuLaunchKernel;

impl Client {
    /// Launch the spin kernel for `ns` on the stream.
    fn launch(&self, ns: u64) {
        use core::ffi::c_void;
        let mut ns = ns;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        // SAFETY: a loaded kernel taking one u64, its parameter array, our stream.
        let r = unsafe {
            (self.launch)(
                self.f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                self.s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, gpuslice_abi::CUDA_SUCCESS, "cuLaunchKernel");
    }

    fn sync(&self) {
        // SAFETY: our stream.
        unsafe { (self.sync)(self.s) };
    }
}

/// `burst-loop SECONDS KERNEL_US`: a request/response client: bursts of 20 kernels, each burst
/// waited for, 10 ms apart; prints the p50/p99 of the burst latency (first launch to done), and
/// of the time its first launch call took to return (`admit_*`: under the shim, mostly the wait
/// for the device, which the rest of the burst latency is not).
fn burst_loop(seconds: f64, kernel_us: u64) {
    let c = client();
    let t0 = Instant::now();
    let (mut lat, mut admit) = (Vec::new(), Vec::new());
    while t0.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        c.launch(kernel_us * 1000);
        admit.push(t.elapsed().as_secs_f64() * 1e3);
        for _ in 1..20 {
            c.launch(kernel_us * 1000);
        }
        c.sync();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(10));
    }
    let warm = lat.len() / 10;
    let quantiles = |v: &[f64]| {
        let mut v = v[warm..].to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        (v.len(), q(0.5), q(0.99))
    };
    let (n, p50, p99) = quantiles(&lat);
    let (_, a50, a99) = quantiles(&admit);
    println!(
        "{}",
        serde_json::json!({ "bursts": n, "p50_ms": p50, "p99_ms": p99, "admit_p50_ms": a50, "admit_p99_ms": a99 })
    );
}

/// `latency`: the request/response client (20 kernels of 50 us a burst) alone, next to a
/// trainer (burn, 2 ms kernels 16 deep, share 0.6) without priority, and with
/// `GPUSLICE_PRIORITY=latency`; its p50/p99 burst latency and the trainer's GPU fraction.
fn latency(seconds: f64) {
    let me = std::env::current_exe().unwrap();
    println!(
        "{:<26} {:>8} {:>8} {:>10}",
        "case", "p50 ms", "p99 ms", "trainer"
    );
    for case in ["alone", "colocated, normal", "colocated, latency"] {
        let env = Env::new("latency");
        let trainer = (case != "alone").then(|| {
            let spec = Spec::share(0.6);
            let mut args = burn_args(2000, "plain", seconds + 1.0);
            let d = args.iter().position(|a| a == "--depth").unwrap();
            args[d + 1] = "16".into();
            spawn_burn(&env, "trainer", &spec, &args)
        });
        std::thread::sleep(Duration::from_millis(500));
        let mut c = env.command(&me, true);
        c.args(["burst-loop", &seconds.to_string(), "50"])
            .env("GPUSLICE_SLICE", "server")
            .env("GPUSLICE_COMPUTE", "0.2");
        if case.ends_with("latency") {
            c.env("GPUSLICE_PRIORITY", "latency");
        }
        let out = c.output().expect("spawn burst-loop");
        let v: Value = String::from_utf8_lossy(&out.stdout)
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        let tf = trainer
            .map(collect)
            .map_or(f64::NAN, |r| window(&r, 1.0, seconds, 0.6).0);
        println!(
            "{:<26} {:>8.2} {:>8.2} {:>10.3}",
            case,
            v["p50_ms"].as_f64().unwrap_or(f64::NAN),
            v["p99_ms"].as_f64().unwrap_or(f64::NAN),
            tf
        );
    }
}

/// Load the driver, the spin kernel and a stream.
fn client() -> Client {
    use core::ffi::c_void;
    use gpuslice_abi::*;
    use std::ptr::null_mut;
    // SAFETY: loading the CUDA driver library by its soname.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "cannot load libcuda.so.1");
    macro_rules! sym {
        ($name:ident) => {{
            let name = concat!(stringify!($name), "\0");
            // SAFETY: dlsym on a live handle with a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, name.as_ptr().cast()) };
            assert!(!p.is_null(), "libcuda.so.1 lacks {}", stringify!($name));
            // SAFETY: the export's C signature is pfn's, generated from cuda.h.
            unsafe { core::mem::transmute::<*mut c_void, pfn::$name>(p) }
        }};
    }
    let init = sym!(cuInit);
    let dev_get = sym!(cuDeviceGet);
    let retain = sym!(cuDevicePrimaryCtxRetain);
    let set = sym!(cuCtxSetCurrent);
    let load = sym!(cuModuleLoadData);
    let get_fn = sym!(cuModuleGetFunction);
    let stream_create = sym!(cuStreamCreate);
    let sync = sym!(cuStreamSynchronize);
    let launch = sym!(cuLaunchKernel);
    const PTX: &str = concat!(include_str!("../../../burn/src/spin.ptx"), "\0");
    let (mut dev, mut ctx, mut m, mut f, mut s) =
        (0, null_mut(), null_mut(), null_mut(), null_mut());
    // SAFETY: driver calls with valid out-pointers, in the order the API requires.
    unsafe {
        assert_eq!(init(0), CUDA_SUCCESS, "cuInit");
        assert_eq!(dev_get(&mut dev, 0), CUDA_SUCCESS);
        assert_eq!(retain(&mut ctx, dev), CUDA_SUCCESS);
        assert_eq!(set(ctx), CUDA_SUCCESS);
        assert_eq!(
            load(&mut m, PTX.as_ptr().cast()),
            CUDA_SUCCESS,
            "cuModuleLoadData"
        );
        assert_eq!(get_fn(&mut f, m, c"gpuslice_spin".as_ptr()), CUDA_SUCCESS);
        assert_eq!(stream_create(&mut s, 0), CUDA_SUCCESS);
    }
    Client { launch, sync, f, s }
}

/// `launch-loop N`: time N launches of a 1 µs kernel (in batches that never fill the queue).
fn launch_loop(n: usize) {
    let c = client();
    // Per-launch time of each batch of 64 (one clock read per batch, not per call, so the
    // clock's own cost and granularity do not drown a difference of a few ns).
    let mut times = Vec::with_capacity(n / 64 + 1);
    let mut done = 0;
    while done < n {
        let batch = 64.min(n - done);
        let t = Instant::now();
        for _ in 0..batch {
            c.launch(1000);
        }
        times.push(t.elapsed().as_nanos() as f64 / batch as f64);
        done += batch;
        c.sync();
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let k = times.len();
    let mean = times.iter().sum::<f64>() / k as f64;
    println!(
        "{}",
        serde_json::json!({ "launches": n, "median_ns": times[k / 2], "mean_ns": mean, "p90_ns": times[k * 9 / 10] })
    );
}

fn overhead(launches: usize) {
    let me = std::env::current_exe().unwrap();
    let run = |env: &Env, wrapped: bool| -> Value {
        let out = env
            .command(&me, wrapped)
            .args(["launch-loop", &launches.to_string()])
            .env("GPUSLICE_COMPUTE", "0.5")
            .output()
            .expect("spawn launch-loop");
        let s = String::from_utf8_lossy(&out.stdout);
        s.lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| {
                panic!(
                    "launch-loop printed nothing: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    let env = Env::new("overhead");
    let mut rows = vec![];
    for _ in 0..3 {
        rows.push(("direct", run(&env, false)));
        rows.push(("shim, alone", run(&env, true)));
    }
    // Contended: a neighbour slice saturating the device with 1 ms kernels at share 0.5. The
    // fake's own launch costs more while its engine is busy, so the contended shim is compared
    // with a direct run next to the same neighbour, alternated.
    let spec = Spec::share(0.5);
    let neighbour = spawn_burn(&env, "neighbour", &spec, &burn_args(1000, "plain", 60.0));
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        rows.push(("direct, busy", run(&env, false)));
        rows.push(("shim, contended", run(&env, true)));
    }
    let mut neighbour = neighbour;
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    let med = |name: &str, k: &str| -> f64 {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, r)| r[k].as_f64().unwrap())
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!(
        "{:<16} {:>10} {:>10} {:>12}",
        "launch", "median ns", "p90 ns", "over direct"
    );
    for (name, base) in [
        ("direct", "direct"),
        ("shim, alone", "direct"),
        ("direct, busy", "direct, busy"),
        ("shim, contended", "direct, busy"),
    ] {
        let m = med(name, "median_ns");
        println!(
            "{:<16} {:>10.0} {:>10.0} {:>12.0}",
            name,
            m,
            med(name, "p90_ns"),
            m - med(base, "median_ns")
        );
    }
}

struct Opts {
    scenarios: Vec<String>,
    kernels: Vec<u64>,
    launches: Vec<String>,
    seconds: f64,
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn usage() -> ! {
    eprintln!(
        "usage: gpuslice-bench shares [--scenario pair,article,eight,cap,idle,alone] \
         [--kernel-us 20,1000,5000] [--launch plain,ex,graph] [--seconds S] [--all]\n       \
         gpuslice-bench overhead [--launches N]\n       gpuslice-bench freeze [--runs N] [--seconds S]\n       \
         gpuslice-bench latency [--seconds S]\n       \
         gpuslice-bench launch-loop N"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { usage() };
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    match cmd.as_str() {
        "shares" => {
            let all = args.iter().any(|a| a == "--all");
            let mut o = Opts {
                scenarios: list("pair,article,eight,cap,idle,alone"),
                kernels: vec![1000],
                launches: list("plain"),
                seconds: 12.0,
            };
            if all {
                o.kernels = vec![20, 1000, 5000];
                o.launches = list("plain,ex,graph");
            }
            if let Some(v) = value("--scenario") {
                o.scenarios = list(v);
            }
            if let Some(v) = value("--kernel-us") {
                o.kernels = list(v)
                    .iter()
                    .map(|k| k.parse().unwrap_or_else(|_| usage()))
                    .collect();
            }
            if let Some(v) = value("--launch") {
                o.launches = list(v);
            }
            if let Some(v) = value("--seconds") {
                o.seconds = v.parse().unwrap_or_else(|_| usage());
            }
            shares(&o);
        }
        "overhead" => {
            let n = value("--launches").map_or(20_000, |v| v.parse().unwrap_or_else(|_| usage()));
            overhead(n);
        }
        "freeze" => {
            let runs = value("--runs").map_or(50, |v| v.parse().unwrap_or_else(|_| usage()));
            let secs = value("--seconds").map_or(6.0, |v| v.parse().unwrap_or_else(|_| usage()));
            freeze(runs, secs);
        }
        "latency" => {
            let secs = value("--seconds").map_or(8.0, |v| v.parse().unwrap_or_else(|_| usage()));
            latency(secs);
        }
        "burst-loop" => {
            let secs: f64 = args
                .get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            let us: u64 = args
                .get(2)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            burst_loop(secs, us);
        }
        "launch-loop" => {
            let n = args
                .get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            launch_loop(n);
        }
        _ => usage(),
    }
}
