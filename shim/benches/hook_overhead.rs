//! Hook overhead: a 1 MiB `cuMemAlloc_v2` + `cuMemFree_v2` pair and a `cuLaunchKernel`, called
//! directly on the fake GPU and through `libgpuslice.so` (`LD_PRELOAD`, entry points found with
//! `dlsym` as a linked program would get them), reported as nanoseconds per call over direct.
//!
//! Two drivers: the fake GPU (realistic, but its own pair costs microseconds of mmap/munmap,
//! which buries the shim's tens of nanoseconds in noise), and a stub driver (C, compiled here
//! with `cc` into the scratch directory: every entry point returns at once, `cuMemAlloc_v2`
//! hands out one fixed address as a caching allocator would), which isolates the shim's own
//! cost. The stub part is skipped with a note when no `cc` is found.
//!
//! Not a test. Run: `cargo build --release -p fakegpu -p gpuslice-shim && cargo bench -p
//! gpuslice-shim --bench hook_overhead`. The variants run in alternating child processes
//! (this binary again) so drift on a shared machine hits both alike; medians of rounds.
//!
//! Noise-free complement (instructions, not time): `cargo bench -p gpuslice-shim --bench
//! hook_overhead -- --bench --callgrind` runs one direct and one shimmed stub child under
//! `valgrind --tool=callgrind` with `ALLOC_CALLS` and `ALLOC_CALLS * 2` pairs and reports the
//! difference per pair (start-up cancels out).

use core::ffi::c_void;
use gpuslice_abi::pfn;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const PTX: &str = include_str!("../../tests/burn/src/spin.ptx");
const ALLOC_CALLS: usize = 20_000;
const LAUNCH_CALLS: usize = 10_000;
const ROUNDS: usize = 15;

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

/// One measurement in this process: (ns per alloc+free pair, ns per launch).
fn measure() -> (f64, f64) {
    // SAFETY: the fake driver's entry points, called with valid arguments.
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

        let mut p = 0u64;
        for _ in 0..1000 {
            ck!(alloc(&mut p, 1 << 20));
            ck!(free(p));
        }
        let pairs = std::env::var("GPUSLICE_BENCH_PAIRS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ALLOC_CALLS);
        let t = Instant::now();
        for _ in 0..pairs {
            alloc(&mut p, 1 << 20);
            free(p);
        }
        let alloc_ns = t.elapsed().as_nanos() as f64 / pairs as f64;
        if std::env::var_os("GPUSLICE_BENCH_STUB").is_some() {
            return (alloc_ns, 0.0);
        }

        let ptx = std::ffi::CString::new(PTX).unwrap();
        let mut m = core::ptr::null_mut();
        ck!(load(&mut m, ptx.as_ptr().cast()));
        let mut f = core::ptr::null_mut();
        ck!(getf(&mut f, m, c"gpuslice_spin".as_ptr()));
        let mut ns: u64 = 1_000; // 1 µs: the fake (at this writing) never drains 0-ns kernels
        let mut params = [(&mut ns as *mut u64).cast::<c_void>()];
        let mut total = 0u128;
        let batch = 1000;
        for _ in 0..LAUNCH_CALLS / batch {
            let t = Instant::now();
            for _ in 0..batch {
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
                    params.as_mut_ptr(),
                    core::ptr::null_mut(),
                );
            }
            total += t.elapsed().as_nanos();
            ck!(sync());
        }
        (alloc_ns, total as f64 / LAUNCH_CALLS as f64)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
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
/* Resolved by the measuring code, not called in stub mode. */
int cuModuleLoadData(void **m, const void *i) { (void)i; *m = (void *)32; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *n) { (void)m; (void)n; *f = (void *)48; return 0; }
int cuLaunchKernel(void) { return 0; }
int cuCtxSynchronize(void) { return 0; }
"#;

/// Build the stub driver into `dir` as `libcuda.so.1`; false (with a note) when `cc` fails.
fn build_stub(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("stub.c");
    std::fs::write(&src, STUB_C).unwrap();
    let ok = Command::new("cc")
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

fn run_child(libs: &Path, state: &Path, preload: Option<&Path>, stub: bool) -> (f64, f64) {
    let mut c = child(
        Command::new(std::env::current_exe().unwrap()),
        libs,
        state,
        preload,
    );
    if stub {
        c.env("GPUSLICE_BENCH_STUB", "1");
    }
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
    (v[0], v[1])
}

fn main() {
    if std::env::var_os("GPUSLICE_BENCH_CHILD").is_some() {
        let (a, l) = measure();
        println!("result {a} {l}");
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
    for _ in 0..ROUNDS {
        let d = run_child(&libs, &tmp, None, false);
        let s = run_child(&libs, &tmp, Some(&shim), false);
        da.push(d.0);
        dl.push(d.1);
        sa.push(s.0);
        sl.push(s.1);
        oa.push(s.0 - d.0);
        ol.push(s.1 - d.1);
        if stub {
            let d = run_child(&stub_libs, &tmp, None, true);
            let s = run_child(&stub_libs, &tmp, Some(&shim), true);
            ta.push(d.0);
            tsa.push(s.0);
            toa.push(s.0 - d.0);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!("hook overhead, median of {ROUNDS} alternating rounds ({ALLOC_CALLS} pairs, {LAUNCH_CALLS} launches each):");
    println!("  fake GPU, 1 MiB cuMemAlloc_v2+cuMemFree_v2: direct {:.0} ns, through the shim {:.0} ns, overhead {:.0} ns per pair (target <= 150)", median(da), median(sa), median(oa));
    println!("  fake GPU, cuLaunchKernel:                   direct {:.0} ns, through the shim {:.0} ns, overhead {:.0} ns per launch (target <= 20)", median(dl), median(sl), median(ol));
    if stub {
        println!("  stub driver, 1 MiB cuMemAlloc_v2+cuMemFree_v2: direct {:.1} ns, through the shim {:.1} ns, overhead {:.1} ns per pair (target <= 150)", median(ta), median(tsa), median(toa));
    }
}

/// Instructions per pair, direct and through the shim, on the stub driver.
fn callgrind(libs: &Path, state: &Path, shim: &Path) {
    let count = |preload: Option<&Path>, pairs: usize| -> u64 {
        let out_file = state.join(format!("cg.{pairs}.{}", preload.is_some()));
        let mut v = Command::new("valgrind");
        v.arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(std::env::current_exe().unwrap());
        let mut v = child(v, libs, state, preload);
        v.env("GPUSLICE_BENCH_STUB", "1")
            .env("GPUSLICE_BENCH_PAIRS", pairs.to_string());
        let out = v.output().expect("valgrind");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&out_file).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("summary: "))
            .or_else(|| text.lines().find_map(|l| l.strip_prefix("totals: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("callgrind summary")
    };
    let n = ALLOC_CALLS;
    let per = |p: Option<&Path>| (count(p, 2 * n) as f64 - count(p, n) as f64) / n as f64;
    let (d, s) = (per(None), per(Some(shim)));
    println!("callgrind, stub driver, instructions per 1 MiB cuMemAlloc_v2+cuMemFree_v2 pair (difference of {n} and {} pairs): direct {d:.1}, through the shim {s:.1}, overhead {:.1}", 2 * n, s - d);
}
