//! Hook overhead: a 1 MiB `cuMemAlloc_v2` + `cuMemFree_v2` pair and a `cuLaunchKernel`, called
//! directly on the fake GPU and through `libgpuslice.so` (`LD_PRELOAD`, entry points found with
//! `dlsym` as a linked program would get them), reported as nanoseconds per call over direct.
//!
//! Two drivers: the fake GPU (realistic, but its own pair costs microseconds of mmap/munmap,
//! which buries the shim's tens of nanoseconds in noise), and a stub driver (C, compiled here
//! with `cc` into the scratch directory: every entry point returns at once, `cuMemAlloc_v2`
//! hands out one fixed address as a caching allocator would, events complete at once and
//! measure [`STUB_EVENT_MS`]), which isolates the shim's own cost. The stub part is skipped with
//! a note when no `cc` is found.
//!
//! On the stub, launches are measured twice through the shim: alone on the device (the solo
//! fast path) and **contended**: the measuring child's slice (share 0.9) is on the device with
//! a rival slice (another child, share and cap 0.1, launching in a loop), so no lease is ever
//! solo and every launch goes through whatever the contended gate does (scheduler, events,
//! capture check, hand-overs), as it does on a shared GPU. The rival's cap keeps it off the
//! device most of the time, so the measuring child holds the lease most of the time; a launch
//! that stalls over [`STALL_NS`] (a wait for the rival's turn, or the OS running something
//! else) is counted and reported apart, not in the per-launch figure. Each launch is timed on
//! its own (one clock read per launch, in the direct run too, so it cancels in the overhead).
//!
//! Not a test. Run: `cargo build --release -p fakegpu -p gpuslice-shim && cargo bench -p
//! gpuslice-shim --bench hook_overhead` (`GPUSLICE_BENCH_ROUNDS=N` for other than
//! [`ROUNDS`] rounds). The variants run in alternating child processes (this binary again) so
//! drift on a shared machine hits both alike; medians of rounds. Each round's contended run has
//! its own ledger and a fresh rival.
//!
//! Noise-free complement (instructions, not time): `cargo bench -p gpuslice-shim --bench
//! hook_overhead -- --bench --callgrind` runs one direct and one shimmed stub child under
//! `valgrind --tool=callgrind` with `ALLOC_CALLS` and `ALLOC_CALLS * 2` pairs and reports the
//! difference per pair (start-up cancels out); then the same for contended launches
//! ([`CALLGRIND_LAUNCHES`] and twice as many, the rival running natively beside the child).
//!
//! Before/after: `-- --bench --after PATH` (timed, or with `--callgrind`) also measures the
//! stub-driver launches through the `libgpuslice.so` at PATH (another build, e.g. from a `git
//! archive` of another commit), in the same rounds, each shim with its own rival and ledger.

use core::ffi::c_void;
use gpuslice_abi::pfn;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const PTX: &str = include_str!("../../tests/burn/src/spin.ptx");
const ALLOC_CALLS: usize = 20_000;
const LAUNCH_CALLS: usize = 10_000;
/// Launches per stub child alone, and contended (enough for dozens of 5 ms turns), after
/// [`WARM_LAUNCHES`] untimed ones.
const STUB_LAUNCHES: usize = 50_000;
const CONTENDED_LAUNCHES: usize = 500_000;
const WARM_LAUNCHES: usize = 2_000;
/// A launch longer than this waited (for a turn, or for a CPU): counted apart.
const STALL_NS: u128 = 100_000;
/// What the stub's `cuEventElapsedTime` answers, in ms (10 ns): less than any launch takes to
/// make, so the stub's "GPU" keeps up with any launcher, as its events (complete at once) say.
/// (At 1 µs, a gate that estimates its queue from sampled events saw a queue the stub never
/// had and waited for it to drain.)
const STUB_EVENT_MS: f32 = 0.00001;
const ROUNDS: usize = 15;
/// Launches of the contended callgrind runs (and twice as many).
const CALLGRIND_LAUNCHES: usize = 20_000;

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The export `$name` of the library `h`, typed by its header signature (`gpuslice_abi::pfn`).
macro_rules! sym {
    ($h:expr, $name:ident) => {
        sym::<pfn::$name>($h, stringify!($name))
    };
}

/// # Safety
/// `h` is a live `dlopen` handle and `T` is the function pointer type of the export `name`.
unsafe fn sym<T>(h: *mut c_void, name: &str) -> T {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: `h` is a live handle (the contract); `c` is NUL-terminated and outlives the call.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name} missing");
    // SAFETY: `p` is a non-null address of `name`, whose pointer type is `T` (the contract);
    // a function pointer has the size of a data pointer on the platforms we build for.
    unsafe { core::mem::transmute_copy(&p) }
}

macro_rules! ck {
    ($e:expr) => {{
        let r = $e;
        assert_eq!(r, 0, "{} failed: {r}", stringify!($e));
    }};
}

/// One measurement in this process.
#[derive(Clone, Copy, Default)]
struct Measured {
    /// ns per alloc+free pair (0 when none were asked for).
    alloc_ns: f64,
    /// ns per launch (stub: per launch that did not stall).
    launch_ns: f64,
    /// Launches that stalled over [`STALL_NS`], and the ms they took in all (stub only).
    stalls: f64,
    stalled_ms: f64,
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One measurement in this process, on the fake GPU or (`GPUSLICE_BENCH_STUB`) the stub.
fn measure() -> Measured {
    let stub = std::env::var_os("GPUSLICE_BENCH_STUB").is_some();
    // SAFETY: the driver's entry points, called with valid arguments.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "cannot load libcuda.so.1");
        let cu_init = sym!(h, cuInit);
        let dev_get = sym!(h, cuDeviceGet);
        let retain = sym!(h, cuDevicePrimaryCtxRetain);
        let set_cur = sym!(h, cuCtxSetCurrent);
        let alloc = sym!(h, cuMemAlloc_v2);
        let free = sym!(h, cuMemFree_v2);
        let load = sym!(h, cuModuleLoadData);
        let getf = sym!(h, cuModuleGetFunction);
        let launch = sym!(h, cuLaunchKernel);
        let sync = sym!(h, cuCtxSynchronize);

        ck!(cu_init(0));
        let mut dev = 0;
        ck!(dev_get(&mut dev, 0));
        let mut ctx = core::ptr::null_mut();
        ck!(retain(&mut ctx, dev));
        ck!(set_cur(ctx));

        let mut out = Measured::default();
        let pairs = env_count("GPUSLICE_BENCH_PAIRS", ALLOC_CALLS);
        let mut p = 0u64;
        if pairs > 0 {
            for _ in 0..1000 {
                ck!(alloc(&mut p, 1 << 20));
                ck!(free(p));
            }
            let t = Instant::now();
            for _ in 0..pairs {
                alloc(&mut p, 1 << 20);
                free(p);
            }
            out.alloc_ns = t.elapsed().as_nanos() as f64 / pairs as f64;
        }

        let ptx = std::ffi::CString::new(PTX).unwrap();
        let mut m = core::ptr::null_mut();
        ck!(load(&mut m, ptx.as_ptr().cast()));
        let mut f = core::ptr::null_mut();
        ck!(getf(&mut f, m, c"gpuslice_spin".as_ptr()));
        let mut ns: u64 = 1_000; // 1 µs: the fake (at this writing) never drains 0-ns kernels
        let params = [(&mut ns as *mut u64).cast::<c_void>()];
        let one = || {
            launch(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                core::ptr::null_mut(),
                params.as_ptr().cast_mut(),
                core::ptr::null_mut(),
            )
        };
        if std::env::var_os("GPUSLICE_BENCH_RIVAL").is_some() {
            rival(&one);
        }
        if stub {
            // Each launch timed on its own, so that the few that wait for a turn (contended)
            // can be told apart from the rest.
            for _ in 0..WARM_LAUNCHES {
                ck!(one());
            }
            let n = env_count("GPUSLICE_BENCH_LAUNCHES", STUB_LAUNCHES);
            let (mut ok, mut stalled, mut stalls) = (0u128, 0u128, 0usize);
            let mut prev = Instant::now();
            for _ in 0..n {
                one();
                let now = Instant::now();
                let d = now.duration_since(prev).as_nanos();
                prev = now;
                if d > STALL_NS {
                    stalls += 1;
                    stalled += d;
                } else {
                    ok += d;
                }
            }
            out.launch_ns = ok as f64 / (n - stalls).max(1) as f64;
            out.stalls = stalls as f64;
            out.stalled_ms = stalled as f64 / 1e6;
            return out;
        }

        let mut total = 0u128;
        let batch = 1000;
        for _ in 0..LAUNCH_CALLS / batch {
            let t = Instant::now();
            for _ in 0..batch {
                one();
            }
            total += t.elapsed().as_nanos();
            ck!(sync());
        }
        out.launch_ns = total as f64 / LAUNCH_CALLS as f64;
        out
    }
}

/// The rival slice of the contended runs: says it is on the device, then launches until its
/// parent goes away (the parent kills it; an orphan stops by itself).
fn rival(one: &dyn Fn() -> gpuslice_abi::CUresult) -> ! {
    use std::io::Write;
    for _ in 0..100 {
        ck!(one());
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    loop {
        for _ in 0..1024 {
            one();
        }
        // SAFETY: getppid cannot fail.
        if unsafe { libc::getppid() } != parent {
            std::process::exit(0);
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The stub driver: what the shim's start-up and the measured calls need, nothing else.
const STUB_C: &str = r#"
#include <stddef.h>
#include <stdint.h>
#include <string.h>
int cuInit(unsigned f) { (void)f; return 0; }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int o) { *d = o; return 0; }
int cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)16 << 30; return 0; }
int cuDeviceGetUuid(unsigned char *u, int d) { memset(u, 0x5a, 16); u[15] = (unsigned char)d; return 0; }
int cuDeviceGetUuid_v2(unsigned char *u, int d) { return cuDeviceGetUuid(u, d); }
int cuDeviceGetName(char *n, int len, int d) { (void)d; strncpy(n, "Stub", (size_t)len); return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)16; return 0; }
int cuCtxSetCurrent(void *c) { (void)c; return 0; }
int cuCtxGetCurrent(void **c) { *c = (void *)16; return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuMemAlloc_v2(uint64_t *p, size_t n) { (void)n; *p = 0x7f0000200000ull; return 0; }
int cuMemFree_v2(uint64_t p) { (void)p; return 0; }
int cuModuleLoadData(void **m, const void *i) { (void)i; *m = (void *)32; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *n) { (void)m; (void)n; *f = (void *)48; return 0; }
int cuLaunchKernel(void) { return 0; }
int cuCtxSynchronize(void) { return 0; }
int cuStreamSynchronize(void *s) { (void)s; return 0; }
/* What the contended gate calls: nothing is capturing, events are distinct handles that are
   complete at once and measure STUB_EVENT_MS apart. */
int cuStreamIsCapturing(void *s, int *st) { (void)s; *st = 0; return 0; }
static uintptr_t next_event = 0x1000;
int cuEventCreate(void **e, unsigned f) { (void)f; *e = (void *)__atomic_add_fetch(&next_event, 16, __ATOMIC_RELAXED); return 0; }
int cuEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
int cuEventRecordWithFlags(void *e, void *s, unsigned f) { (void)e; (void)s; (void)f; return 0; }
int cuEventQuery(void *e) { (void)e; return 0; }
int cuEventSynchronize(void *e) { (void)e; return 0; }
int cuEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = EVENT_MS; return 0; }
int cuEventElapsedTime_v2(float *ms, void *a, void *b) { return cuEventElapsedTime(ms, a, b); }
int cuEventDestroy(void *e) { (void)e; return 0; }
int cuEventDestroy_v2(void *e) { (void)e; return 0; }
"#;

/// Build the stub driver into `dir` as `libcuda.so.1`; false (with a note) when `cc` fails.
fn build_stub(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("stub.c");
    std::fs::write(&src, STUB_C).unwrap();
    let ok = Command::new("cc")
        .arg(format!("-DEVENT_MS={STUB_EVENT_MS:?}f"))
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("(no working `cc`: the stub-driver figures are skipped)");
    }
    ok
}

/// This binary as a measuring child: `program` is the binary itself or valgrind running it.
fn child(program: Command, libs: &Path, state: &Path, preload: Option<&Path>) -> Command {
    let mut c = program;
    c.env("GPUSLICE_BENCH_CHILD", "1")
        .env("LD_LIBRARY_PATH", libs)
        .env("FAKEGPU_STATE_DIR", state.join("fake"))
        .env("GPUSLICE_RUNTIME_DIR", state.join("ledger"))
        .env("FAKEGPU_DEVICES", "1")
        .env("FAKEGPU_MEMORY", "16Gi")
        .env_remove("LD_PRELOAD");
    if let Some(p) = preload {
        c.env("LD_PRELOAD", p).env("GPUSLICE_MEMORY", "8Gi");
    }
    c
}

fn run_child(libs: &Path, state: &Path, preload: Option<&Path>, stub: bool) -> Measured {
    let mut c = child(
        Command::new(std::env::current_exe().unwrap()),
        libs,
        state,
        preload,
    );
    if stub {
        c.env("GPUSLICE_BENCH_STUB", "1");
    }
    output(c)
}

/// Run a measuring child to completion and read its result line.
fn output(mut c: Command) -> Measured {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    let line = s
        .lines()
        .find(|l| l.starts_with("result"))
        .expect("result line");
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    Measured {
        alloc_ns: v[0],
        launch_ns: v[1],
        stalls: v[2],
        stalled_ms: v[3],
    }
}

/// The contended set-up on the stub driver, in its own ledger under `state`: the rival slice
/// (share and cap 0.1, launching in a loop), running once it has launched.
struct Contended {
    rival: std::process::Child,
    state: PathBuf,
}

impl Contended {
    fn start(libs: &Path, state: &Path, shim: &Path) -> Contended {
        use std::io::BufRead;
        let mut c = child(
            Command::new(std::env::current_exe().unwrap()),
            libs,
            state,
            Some(shim),
        );
        c.env("GPUSLICE_BENCH_STUB", "1")
            .env("GPUSLICE_BENCH_RIVAL", "1")
            .env("GPUSLICE_BENCH_PAIRS", "0")
            .env("GPUSLICE_SLICE", "rival")
            .env("GPUSLICE_COMPUTE", "0.1")
            .env("GPUSLICE_COMPUTE_CAP", "0.1")
            .stdout(std::process::Stdio::piped());
        let mut rival = c.spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(rival.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the rival did not start");
        Contended {
            rival,
            state: state.to_path_buf(),
        }
    }

    /// The measuring child under the shim, slice share 0.9 next to the rival.
    fn shimmed(&self, program: Command, libs: &Path, shim: &Path) -> Command {
        let mut c = child(program, libs, &self.state, Some(shim));
        c.env("GPUSLICE_BENCH_STUB", "1")
            .env("GPUSLICE_BENCH_PAIRS", "0")
            .env("GPUSLICE_BENCH_LAUNCHES", CONTENDED_LAUNCHES.to_string())
            .env("GPUSLICE_SLICE", "bench")
            .env("GPUSLICE_COMPUTE", "0.9");
        c
    }

    /// Turns granted on the device so far (the rival's and the measuring child's), and the ns
    /// the measuring child's slice waited for a turn (the scheduler's own count); `None` when
    /// the ledger is another build's layout (an `--after` library of another version).
    fn turns_waited(&self) -> Option<(u64, u64)> {
        use std::sync::atomic::Ordering::SeqCst;
        let l = gpuslice_ledger::Ledger::open(&self.state.join("ledger")).ok()?;
        let waited = l
            .slices()
            .iter()
            .find(|s| s.name.eq_bytes(b"bench"))
            .map_or(0, |s| s.sched.throttled_ns_total.load(SeqCst));
        Some((l.devices()[0].sched.leases_total.load(SeqCst), waited))
    }
}

impl Drop for Contended {
    fn drop(&mut self) {
        let _ = self.rival.kill();
        let _ = self.rival.wait();
    }
}

fn main() {
    if std::env::var_os("GPUSLICE_BENCH_CHILD").is_some() {
        let m = measure();
        println!(
            "result {} {} {} {}",
            m.alloc_ns, m.launch_ns, m.stalls, m.stalled_ms
        );
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs benches once as tests: a benchmark is not a test.
        println!("hook_overhead: a benchmark; run it with `cargo bench -p gpuslice-shim --bench hook_overhead`");
        return;
    }
    let prof = profile_dir();
    let fake = prof.join("libfakegpu.so");
    let shim = prof.join("libgpuslice.so");
    for p in [&fake, &shim] {
        assert!(
            p.exists(),
            "{} missing: cargo build --release -p fakegpu -p gpuslice-shim first",
            p.display()
        );
    }
    let tmp = std::env::temp_dir().join(format!("gpuslice-bench-{}", std::process::id()));
    let libs = tmp.join("libs");
    std::fs::create_dir_all(&libs).unwrap();
    for n in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        std::os::unix::fs::symlink(&fake, libs.join(n)).unwrap();
    }
    let stub_libs = tmp.join("stub");
    let stub = build_stub(&stub_libs);
    if std::env::args().any(|a| a == "--callgrind") {
        assert!(stub, "--callgrind needs the stub driver");
        callgrind(&stub_libs, &tmp, &shim);
        let _ = std::fs::remove_dir_all(&tmp);
        return;
    }
    let (mut da, mut dl, mut sa, mut sl, mut oa, mut ol) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut ta, mut tsa, mut toa) = (vec![], vec![], vec![]);
    // Stub launches, direct (and its stalls), then per shim measured (this build's, and the
    // one `--after PATH` names), alone and contended.
    let (mut td, mut dstalls) = (vec![], vec![]);
    let mut series: Vec<StubSeries> = std::iter::once(shim.clone())
        .chain(after_shim())
        .map(StubSeries::new)
        .collect();
    let rounds = env_count("GPUSLICE_BENCH_ROUNDS", ROUNDS);
    for round in 0..rounds {
        let d = run_child(&libs, &tmp, None, false);
        let s = run_child(&libs, &tmp, Some(&shim), false);
        da.push(d.alloc_ns);
        dl.push(d.launch_ns);
        sa.push(s.alloc_ns);
        sl.push(s.launch_ns);
        oa.push(s.alloc_ns - d.alloc_ns);
        ol.push(s.launch_ns - d.launch_ns);
        if stub {
            let d = run_child(&stub_libs, &tmp, None, true);
            let s = run_child(&stub_libs, &tmp, Some(&shim), true);
            ta.push(d.alloc_ns);
            tsa.push(s.alloc_ns);
            toa.push(s.alloc_ns - d.alloc_ns);
            td.push(d.launch_ns);
            dstalls.push(d.stalls);
            for (i, x) in series.iter_mut().enumerate() {
                x.round(&stub_libs, &tmp.join(format!("contended-{round}-{i}")), &d);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!("hook overhead, median of {rounds} alternating rounds ({ALLOC_CALLS} pairs, {LAUNCH_CALLS} launches each):");
    println!("  fake GPU, 1 MiB cuMemAlloc_v2+cuMemFree_v2: direct {:.0} ns, through the shim {:.0} ns, overhead {:.0} ns per pair (target <= 150)", median(da), median(sa), median(oa));
    println!("  fake GPU, cuLaunchKernel:                   direct {:.0} ns, through the shim {:.0} ns, overhead {:.0} ns per launch (target <= 20)", median(dl), median(sl), median(ol));
    if stub {
        println!("  stub driver, 1 MiB cuMemAlloc_v2+cuMemFree_v2: direct {:.1} ns, through the shim {:.1} ns, overhead {:.1} ns per pair (target <= 150)", median(ta), median(tsa), median(toa));
        let direct = median(td);
        for x in series {
            let label = series_label(&x.shim, &shim);
            x.print(direct, median(dstalls.clone()), label);
        }
    }
}

/// The shim `--after PATH` names, to measure beside this build's in the same rounds.
fn after_shim() -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--after")?;
    let p = PathBuf::from(
        args.get(i + 1)
            .expect("--after needs a libgpuslice.so path"),
    );
    assert!(p.exists(), "--after {}: no such file", p.display());
    Some(p)
}

fn series_label(shim: &Path, this: &Path) -> String {
    if shim == this {
        String::new()
    } else {
        format!(" [--after {}]", shim.display())
    }
}

/// Stub-driver launches through one shim, alone and contended, over the rounds.
struct StubSeries {
    shim: PathBuf,
    /// ns per launch alone, contended; stalls and their ms; turns and ms waited per run.
    alone: Vec<f64>,
    contended: Vec<f64>,
    over_alone: Vec<f64>,
    over_contended: Vec<f64>,
    stalls: Vec<f64>,
    stalled: Vec<f64>,
    turns: Vec<f64>,
    waited: Vec<f64>,
}

impl StubSeries {
    fn new(shim: PathBuf) -> StubSeries {
        StubSeries {
            shim,
            alone: vec![],
            contended: vec![],
            over_alone: vec![],
            over_contended: vec![],
            stalls: vec![],
            stalled: vec![],
            turns: vec![],
            waited: vec![],
        }
    }

    /// One round: alone, then contended in a fresh ledger under `state`; `direct` is the
    /// round's direct run.
    fn round(&mut self, libs: &Path, state: &Path, direct: &Measured) {
        let s = run_child(libs, &state.join("alone"), Some(&self.shim), true);
        let con = Contended::start(libs, state, &self.shim);
        let before = con.turns_waited();
        let c = output(con.shimmed(
            Command::new(std::env::current_exe().unwrap()),
            libs,
            &self.shim,
        ));
        let after = con.turns_waited();
        drop(con);
        self.alone.push(s.launch_ns);
        self.contended.push(c.launch_ns);
        self.over_alone.push(s.launch_ns - direct.launch_ns);
        self.over_contended.push(c.launch_ns - direct.launch_ns);
        self.stalls.push(c.stalls);
        self.stalled.push(c.stalled_ms);
        let (turns, waited) = match (before, after) {
            (Some((b, _)), Some((a, w))) => ((a - b) as f64, w as f64 / 1e6),
            _ => (f64::NAN, f64::NAN), // another layout: its books are not ours to read
        };
        self.turns.push(turns);
        self.waited.push(waited);
    }

    fn print(self, direct: f64, direct_stalls: f64, label: String) {
        println!("  stub driver, cuLaunchKernel alone:         direct {direct:.1} ns, through the shim {:.1} ns, overhead {:.1} ns per launch (target <= 20; {STUB_LAUNCHES} launches, each timed){label}", median(self.alone), median(self.over_alone));
        println!("  stub driver, cuLaunchKernel contended:     direct {direct:.1} ns, through the shim {:.1} ns, overhead {:.1} ns per launch (target <= 300){label}", median(self.contended), median(self.over_contended));
        println!("    contended: share 0.9 next to a rival slice at share and cap 0.1, {CONTENDED_LAUNCHES} launches a run; per run: turns granted {:.0}, waited for a turn {:.1} ms (the scheduler's count), launches stalled over {} us (waits, or the CPU taken by another process; not in the figure above) {:.0} taking {:.1} ms (direct, of {STUB_LAUNCHES}: {direct_stalls:.0})", median(self.turns), median(self.waited), STALL_NS / 1000, median(self.stalls), median(self.stalled));
    }
}

/// Instructions per pair, direct and through the shim, on the stub driver; and per launch,
/// direct and through the shim, alone and contended.
fn callgrind(libs: &Path, state: &Path, shim: &Path) {
    let valgrind = |out_file: &Path| {
        let mut v = Command::new("valgrind");
        v.arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(std::env::current_exe().unwrap());
        v
    };
    let total = |mut v: Command, out_file: &Path| -> u64 {
        let out = v.output().expect("valgrind");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(out_file).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("summary: "))
            .or_else(|| text.lines().find_map(|l| l.strip_prefix("totals: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("callgrind summary")
    };
    let count = |preload: Option<&Path>, pairs: usize| -> u64 {
        let out_file = state.join(format!("cg.{pairs}.{}", preload.is_some()));
        let mut v = child(valgrind(&out_file), libs, state, preload);
        v.env("GPUSLICE_BENCH_STUB", "1")
            .env("GPUSLICE_BENCH_PAIRS", pairs.to_string())
            .env("GPUSLICE_BENCH_LAUNCHES", "0");
        total(v, &out_file)
    };
    let n = ALLOC_CALLS;
    let per = |p: Option<&Path>| (count(p, 2 * n) as f64 - count(p, n) as f64) / n as f64;
    let (d, s) = (per(None), per(Some(shim)));
    println!("callgrind, stub driver, instructions per 1 MiB cuMemAlloc_v2+cuMemFree_v2 pair (difference of {n} and {} pairs): direct {d:.1}, through the shim {s:.1}, overhead {:.1}", 2 * n, s - d);

    // Contended launches: the rival runs natively beside the measured child. Under valgrind the
    // child launches ~50x slower, so a 5 ms lease holds fewer of its launches than natively and
    // the hand-overs weigh more per launch: an upper bound on the native count.
    let k = CALLGRIND_LAUNCHES;
    let direct_file = |k: usize| state.join(format!("cg.launch.{k}.direct"));
    let direct = |k: usize| {
        let mut v = child(valgrind(&direct_file(k)), libs, state, None);
        v.env("GPUSLICE_BENCH_STUB", "1")
            .env("GPUSLICE_BENCH_PAIRS", "0")
            .env("GPUSLICE_BENCH_LAUNCHES", k.to_string());
        total(v, &direct_file(k))
    };
    let d = (direct(2 * k) as f64 - direct(k) as f64) / k as f64;
    // Launches alone (no rival: a solo lease, one load per launch): a fixed cost per launch,
    // unlike the contended count below, which includes the hand-overs of the run.
    for (i, sh) in std::iter::once(shim.to_path_buf())
        .chain(after_shim())
        .enumerate()
    {
        // A ledger of its own per library: an `--after` build may have another layout.
        let own = state.join(format!("solo-{i}"));
        std::fs::create_dir_all(&own).unwrap();
        let solo = |k: usize| -> u64 {
            let out_file = state.join(format!("cg.solo.{k}.{i}"));
            let mut v = child(valgrind(&out_file), libs, &own, Some(&sh));
            v.env("GPUSLICE_BENCH_STUB", "1")
                .env("GPUSLICE_BENCH_PAIRS", "0")
                .env("GPUSLICE_BENCH_LAUNCHES", k.to_string());
            total(v, &out_file)
        };
        let s = (solo(2 * k) as f64 - solo(k) as f64) / k as f64;
        let label = series_label(&sh, shim);
        println!("callgrind, stub driver, instructions per cuLaunchKernel, alone (difference of {k} and {} launches): direct {d:.1}, through the shim {s:.1}, overhead {:.1}{label}", 2 * k, s - d);
    }
    for (i, sh) in std::iter::once(shim.to_path_buf())
        .chain(after_shim())
        .enumerate()
    {
        let con = Contended::start(libs, &state.join(format!("contended-cg-{i}")), &sh);
        let launches = |k: usize| -> u64 {
            let out_file = state.join(format!("cg.launch.{k}.{i}"));
            let mut v = con.shimmed(valgrind(&out_file), libs, &sh);
            v.env("GPUSLICE_BENCH_LAUNCHES", k.to_string());
            total(v, &out_file)
        };
        let s = (launches(2 * k) as f64 - launches(k) as f64) / k as f64;
        let label = series_label(&sh, shim);
        println!("callgrind, stub driver, instructions per cuLaunchKernel, contended (share 0.9 next to a rival at share and cap 0.1; difference of {k} and {} launches, each timed): direct {d:.1}, through the shim {s:.1}, overhead {:.1}{label}", 2 * k, s - d);
    }
}
