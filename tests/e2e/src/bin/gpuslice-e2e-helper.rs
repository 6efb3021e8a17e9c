//! `gpuslice-e2e-helper`: small programs the system tests run under the shim, for situations
//! `gpuslice-burn` does not make (it never forks and never loads libraries of its own).
//!
//! ```text
//! gpuslice-e2e-helper fork-hold BYTES CHILD_SECONDS
//!     cuInit, allocate BYTES on device 0, fork() a child that only sleeps CHILD_SECONDS (a
//!     DataLoader-style worker: no exec, no CUDA), print `ready <parent pid> <child pid>`,
//!     then sleep until killed.
//! gpuslice-e2e-helper fork-cuda
//!     cuInit, then fork() a child that calls cuInit again and exits with its result; print
//!     `child cuInit <code>`.
//! gpuslice-e2e-helper ctor-cuda LIBRARY
//!     Thread B makes the process's first CUDA call (cuInit) while thread A is inside
//!     dlopen(LIBRARY), whose constructor makes a CUDA call of its own (A holds the loader lock,
//!     B needs it); the two meet through files named after $CTOR_FLAG. Prints `ok` when
//!     both calls returned.
//! gpuslice-e2e-helper pool-devices BYTES
//!     On a 2-device node: create a memory pool located on device 1, then, each step when a
//!     line arrives on stdin and always with device 0's context current, `alloc` BYTES from
//!     it, `free` them (cuMemFreeAsync, synchronized; the pool keeps them: its release
//!     threshold is the maximum), `overfill` (cuMemAlloc_v2 of 1 GiB + 1
//!     byte on device 0, which a 1 GiB quota refuses after trying to reclaim pool memory),
//!     `destroy` the pool; prints `done STEP` (`done overfill CODE`) after each, so the test
//!     can read the ledger between steps.
//! gpuslice-e2e-helper pool-steps
//!     cuInit, device 0's primary context, then one step per stdin line, each answered
//!     `done CODE` (the driver's status): `threshold BYTES|max` (the default pool's release
//!     threshold), `async NAME BYTES` (cuMemAllocAsync on the legacy stream), `freeasync NAME`
//!     (cuMemFreeAsync), `sync` (cuStreamSynchronize), `trim` (cuMemPoolTrimTo the default
//!     pool to 0), `plain NAME BYTES` (cuMemAlloc_v2), `free NAME` (cuMemFree_v2).
//! gpuslice-e2e-helper nvml-fork N
//!     nvmlInit, then while a second thread calls nvmlDeviceGetMemoryInfo without pause (under
//!     the shim: through its NVML cache and the cache's lock), fork N children one after
//!     another; each child makes the same call once (an alarm ends it after 3 s) and exits
//!     with 0 if it returned NVML_SUCCESS. Prints `{"forks": N, "ok": K, "failed": F,
//!     "hung": H}` (it stops at the first hung child).
//! gpuslice-e2e-helper node-usage
//!     Until stdin closes, sample device 0's used memory as the fake GPU's NVML reports it
//!     for the whole node (every process, whatever gpuslice's ledger says), printing
//!     `sampling` once 3 samples are taken (so a caller can wait for them instead of sleeping);
//!     then print `{"samples": N, "min_used": BYTES, "max_used": BYTES}`. Run it without the
//!     shim.
//! gpuslice-e2e-helper engine-ns
//!     The fake GPU's own engine accounting, on request: for each line of pids read on stdin,
//!     print one line `FROM_NS TO_NS NS NS ...`: the CLOCK_MONOTONIC times before and after
//!     the reading, and the engine time the fake has charged each pid on device 0
//!     (`fakegpu_engine_ns`; `-` for a pid not attached), until stdin closes. Run it without
//!     the shim, as root.
//! gpuslice-e2e-helper pulse KERNEL_US PERIOD_MS SECONDS
//!     A lightly used tenant: one `gpuslice_spin` kernel of KERNEL_US, waited for, every
//!     PERIOD_MS for SECONDS; prints `{"launches": N}`.
//! ```
//!
//! The driver is reached the way programs reach it, through `dlopen("libcuda.so.1")` and
//! `dlsym`, so under `LD_PRELOAD` every call goes through the shim. Exit status 0 on success,
//! 1 with a message on stderr otherwise, 2 for bad usage.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::time::Duration;

type CuResult = u32;

fn die(msg: &str) -> ! {
    eprintln!("gpuslice-e2e-helper: {msg}");
    std::process::exit(1);
}

/// `dlsym(handle, name)` as a function of type `F`, or exit 1 naming the symbol.
fn sym<F: Copy>(handle: *mut c_void, name: &CStr) -> F {
    // SAFETY: valid handle and NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        die(&format!("no {name:?} in the driver"));
    }
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: F is the C function type of `name` (the callers spell the driver's signatures).
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn libcuda() -> *mut c_void {
    // SAFETY: NUL-terminated constant name.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        die("cannot load libcuda.so.1 (is the fake GPU on LD_LIBRARY_PATH?)");
    }
    h
}

fn check(call: &str, r: CuResult) {
    if r != 0 {
        die(&format!("{call} returned {r}"));
    }
}

fn fork_cuda() {
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    // SAFETY: the driver's signature.
    check("cuInit", unsafe { cu_init(0) });
    // SAFETY: as in fork_hold; the child calls into the shim (glibc's malloc is fork-safe).
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    if child == 0 {
        // SAFETY: the driver's signature; _exit skips the parent's atexit handlers.
        unsafe { libc::_exit(cu_init(0) as c_int) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    println!("child cuInit {}", libc::WEXITSTATUS(status));
}

fn fork_hold(bytes: u64, child_secs: u64) {
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    let cu_device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult =
        sym(cuda, c"cuDeviceGet");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
        sym(cuda, c"cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult = sym(cuda, c"cuCtxSetCurrent");
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult = sym(cuda, c"cuMemAlloc_v2");
    let (mut dev, mut ctx, mut ptr) = (0, std::ptr::null_mut(), 0u64);
    // SAFETY: the driver's signatures above; out-parameters are valid locals.
    unsafe {
        check("cuInit", cu_init(0));
        check("cuDeviceGet", cu_device_get(&mut dev, 0));
        check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev));
        check("cuCtxSetCurrent", set_current(ctx));
        check("cuMemAlloc_v2", alloc(&mut ptr, bytes as usize));
    }
    // SAFETY: fork in a process whose other threads (if any, the driver's) are not needed by
    // the child, which only sleeps and exits with async-signal-safe calls.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    if child == 0 {
        // SAFETY: sleep and _exit are async-signal-safe.
        unsafe {
            libc::sleep(child_secs as u32);
            libc::_exit(0);
        }
    }
    println!("ready {} {child}", std::process::id());
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[repr(C)]
struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: c_int,
    win32: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

fn pool_devices(bytes: u64) {
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
        sym(cuda, c"cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult = sym(cuda, c"cuCtxSetCurrent");
    let create: unsafe extern "C" fn(*mut *mut c_void, *const PoolProps) -> CuResult =
        sym(cuda, c"cuMemPoolCreate");
    let alloc: unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> CuResult =
        sym(cuda, c"cuMemAllocFromPoolAsync");
    let free: unsafe extern "C" fn(u64, *mut c_void) -> CuResult = sym(cuda, c"cuMemFreeAsync");
    let sync: unsafe extern "C" fn() -> CuResult = sym(cuda, c"cuCtxSynchronize");
    let destroy: unsafe extern "C" fn(*mut c_void) -> CuResult = sym(cuda, c"cuMemPoolDestroy");
    let set_attr: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> CuResult =
        sym(cuda, c"cuMemPoolSetAttribute");
    let plain_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult =
        sym(cuda, c"cuMemAlloc_v2");
    let (mut ctx0, mut ctx1, mut pool, mut ptr) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        0u64,
    );
    let props = PoolProps {
        alloc_type: 1,    // CU_MEM_ALLOCATION_TYPE_PINNED
        handle_types: 0,  // CU_MEM_HANDLE_TYPE_NONE
        location_type: 1, // CU_MEM_LOCATION_TYPE_DEVICE
        location_id: 1,
        win32: std::ptr::null_mut(),
        max_size: 0,
        usage: 0,
        reserved: [0; 54],
    };
    // SAFETY: the driver's signatures above; out-parameters are valid locals.
    unsafe {
        check("cuInit", cu_init(0));
        check("cuDevicePrimaryCtxRetain(0)", retain(&mut ctx0, 0));
        check("cuDevicePrimaryCtxRetain(1)", retain(&mut ctx1, 1));
        check("cuCtxSetCurrent(1)", set_current(ctx1));
        check("cuMemPoolCreate", create(&mut pool, &props));
        // The pool keeps what is freed into it (its credit stays until it is destroyed).
        let mut keep = u64::MAX;
        check(
            "cuMemPoolSetAttribute",
            set_attr(pool, 4, (&mut keep as *mut u64).cast()), // RELEASE_THRESHOLD
        );
        check("cuCtxSetCurrent(0)", set_current(ctx0));
    }
    println!("done create");
    for line in std::io::stdin().lines() {
        let step = line.unwrap_or_default();
        // SAFETY: as above; `ptr` came from the pool.
        unsafe {
            match step.trim() {
                "alloc" => check(
                    "cuMemAllocFromPoolAsync",
                    alloc(&mut ptr, bytes as usize, pool, std::ptr::null_mut()),
                ),
                "free" => {
                    // Synchronized in both contexts: the free is done, and the pool (its
                    // threshold at the maximum) keeps the block.
                    check("cuMemFreeAsync", free(ptr, std::ptr::null_mut()));
                    check("cuCtxSynchronize", sync()); // the free, queued in context 0
                    check("cuCtxSetCurrent(1)", set_current(ctx1));
                    check("cuCtxSynchronize", sync());
                    check("cuCtxSetCurrent(0)", set_current(ctx0));
                }
                "destroy" => check("cuMemPoolDestroy", destroy(pool)),
                "overfill" => {
                    let mut p = 0u64;
                    println!("done overfill {}", plain_alloc(&mut p, (1 << 30) + 1));
                    continue;
                }
                other => die(&format!("unknown step {other:?}")),
            }
        }
        println!("done {}", step.trim());
    }
}

fn pool_steps() {
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
        sym(cuda, c"cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult = sym(cuda, c"cuCtxSetCurrent");
    let get_pool: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
        sym(cuda, c"cuDeviceGetMemPool");
    let set_attr: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> CuResult =
        sym(cuda, c"cuMemPoolSetAttribute");
    let alloc_async: unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> CuResult =
        sym(cuda, c"cuMemAllocAsync");
    let free_async: unsafe extern "C" fn(u64, *mut c_void) -> CuResult =
        sym(cuda, c"cuMemFreeAsync");
    let sync: unsafe extern "C" fn(*mut c_void) -> CuResult = sym(cuda, c"cuStreamSynchronize");
    let trim: unsafe extern "C" fn(*mut c_void, usize) -> CuResult = sym(cuda, c"cuMemPoolTrimTo");
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult = sym(cuda, c"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(u64) -> CuResult = sym(cuda, c"cuMemFree_v2");
    let (mut ctx, mut pool) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the driver's signatures above; out-parameters are valid locals.
    unsafe {
        check("cuInit", cu_init(0));
        check("cuDevicePrimaryCtxRetain", retain(&mut ctx, 0));
        check("cuCtxSetCurrent", set_current(ctx));
        check("cuDeviceGetMemPool", get_pool(&mut pool, 0));
    }
    const RELEASE_THRESHOLD: c_int = 4; // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    let stream = std::ptr::null_mut();
    let mut held = std::collections::HashMap::<String, u64>::new();
    println!("ready");
    for line in std::io::stdin().lines() {
        let line = line.unwrap_or_default();
        let w: Vec<&str> = line.split_whitespace().collect();
        let bytes = |i: usize| -> usize {
            w.get(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| die(&format!("bad step {line:?}")))
        };
        let name = |i: usize| w.get(i).map(|s| s.to_string()).unwrap_or_default();
        let mut p = 0u64;
        // SAFETY: the driver's signatures above; pointers freed are ones this loop allocated.
        let code = unsafe {
            match w.first().copied() {
                Some("threshold") => {
                    let mut v: u64 = match w.get(1) {
                        Some(&"max") => u64::MAX,
                        _ => bytes(1) as u64,
                    };
                    set_attr(pool, RELEASE_THRESHOLD, (&mut v as *mut u64).cast())
                }
                Some("async") => {
                    let r = alloc_async(&mut p, bytes(2), stream);
                    held.insert(name(1), p);
                    r
                }
                Some("freeasync") => free_async(held.remove(&name(1)).unwrap_or(0), stream),
                Some("sync") => sync(stream),
                Some("trim") => trim(pool, 0),
                Some("plain") => {
                    let r = alloc(&mut p, bytes(2));
                    held.insert(name(1), p);
                    r
                }
                Some("free") => free(held.remove(&name(1)).unwrap_or(0)),
                _ => die(&format!("unknown step {line:?}")),
            }
        };
        println!("done {code}");
    }
}

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

type NvmlMemoryInfo = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> u32;

/// `nvmlDeviceGetMemoryInfo` (through `dlsym`, as programs find it) and device 0's handle,
/// after `nvmlInit_v2`.
fn nvml_device0() -> (NvmlMemoryInfo, *mut c_void) {
    // SAFETY: NUL-terminated constant name.
    let nvml = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    if nvml.is_null() {
        die("cannot load libnvidia-ml.so.1");
    }
    let init: unsafe extern "C" fn() -> u32 = sym(nvml, c"nvmlInit_v2");
    let handle: unsafe extern "C" fn(u32, *mut *mut c_void) -> u32 =
        sym(nvml, c"nvmlDeviceGetHandleByIndex_v2");
    let info: unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> u32 =
        sym(nvml, c"nvmlDeviceGetMemoryInfo");
    let mut dev = std::ptr::null_mut();
    // SAFETY: NVML's signatures above; out-parameters are valid locals.
    unsafe {
        check("nvmlInit_v2", init());
        check("nvmlDeviceGetHandleByIndex_v2", handle(0, &mut dev));
    }
    (info, dev)
}

fn node_usage() {
    let (info, dev) = nvml_device0();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    std::thread::spawn(move || {
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let (mut samples, mut min, mut max) = (0u64, u64::MAX, 0u64);
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let mut m = NvmlMemory::default();
        // SAFETY: as above.
        check("nvmlDeviceGetMemoryInfo", unsafe { info(dev, &mut m) });
        samples += 1;
        min = min.min(m.used);
        max = max.max(m.used);
        if samples == 3 {
            println!("sampling");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    println!("{{\"samples\": {samples}, \"min_used\": {min}, \"max_used\": {max}}}");
}

fn nvml_fork(n: u64) {
    let (info, dev) = nvml_device0();
    let dev = dev as usize; // a plain address, for the thread
    std::thread::spawn(move || loop {
        let mut m = NvmlMemory::default();
        // SAFETY: as above.
        unsafe { info(dev as *mut c_void, &mut m) };
    });
    std::thread::sleep(Duration::from_millis(50));
    let (mut ok, mut failed, mut hung) = (0, 0, 0);
    for _ in 0..n {
        // SAFETY: the child only makes one NVML call (the shim's handler may allocate: glibc's
        // malloc is fork-safe) and leaves with _exit.
        let child = unsafe { libc::fork() };
        if child < 0 {
            die("fork failed");
        }
        if child == 0 {
            let mut m = NvmlMemory::default();
            // SAFETY: alarm and _exit are async-signal-safe; the call is NVML's, as above.
            unsafe {
                libc::alarm(3);
                let r = info(dev as *mut c_void, &mut m);
                libc::_exit((r != 0) as c_int);
            }
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        if libc::WIFSIGNALED(status) {
            hung += 1;
            break;
        } else if libc::WEXITSTATUS(status) == 0 {
            ok += 1;
        } else {
            failed += 1;
        }
    }
    println!("{{\"forks\": {n}, \"ok\": {ok}, \"failed\": {failed}, \"hung\": {hung}}}");
}

fn ctor_cuda(library: &str) {
    // Thread B: the process's first CUDA call, made while A is inside dlopen below. The
    // entry point is found now, before A takes the loader lock: what B then needs the lock
    // for is the shim's first resolution of the real driver.
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    // The constructor creates `$CTOR_FLAG.in` once it runs (A holds the loader lock); B then
    // creates `$CTOR_FLAG` and calls, and the constructor, seeing it, gives B time to reach
    // the loader lock before making its own call.
    let flag = std::env::var_os("CTOR_FLAG").unwrap_or_else(|| die("CTOR_FLAG is not set"));
    // B must be fully started before A takes the loader lock: a thread's start registers its
    // thread-local destructors, which takes that lock too.
    let started = std::sync::Arc::new(std::sync::Barrier::new(2));
    let b_started = started.clone();
    let b = std::thread::spawn(move || {
        b_started.wait();
        let mut inside = flag.clone();
        inside.push(".in");
        let t0 = std::time::Instant::now();
        while !std::path::Path::new(&inside).exists() {
            if t0.elapsed() > Duration::from_secs(20) {
                die("the constructor never ran");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if std::fs::write(&flag, b"b").is_err() {
            die("cannot write CTOR_FLAG");
        }
        // SAFETY: the driver's signature.
        unsafe { cu_init(0) }
    });
    started.wait();
    let lib = std::ffi::CString::new(library).unwrap_or_else(|_| die("bad library path"));
    // SAFETY: a NUL-terminated path; the library's constructor calls into the driver.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        // SAFETY: dlerror returns a valid C string after a failed dlopen.
        let e = unsafe { CStr::from_ptr(libc::dlerror() as *const c_char) };
        die(&format!("dlopen {library}: {e:?}"));
    }
    let r = b.join().unwrap_or_else(|_| die("thread B panicked"));
    check("cuInit (thread B)", r);
    println!("ok");
}

/// `CLOCK_MONOTONIC` now, ns: the clock the fake's simulated time and burn's `mono` use.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn engine_ns() {
    use std::io::{BufRead, Write};
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    // SAFETY: the driver's signature; cuInit attaches this process to the fake's node state.
    check("cuInit", unsafe { cu_init(0) });
    let busy: unsafe extern "C" fn(u32, u32) -> u64 = sym(cuda, c"fakegpu_engine_ns");
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let from = mono_ns();
        let mut values = String::new();
        for pid in line.split_whitespace() {
            let pid: u32 = pid
                .parse()
                .unwrap_or_else(|_| die(&format!("bad pid {pid:?}")));
            // SAFETY: the fake's export, `uint64_t fakegpu_engine_ns(uint32_t, uint32_t)`.
            match unsafe { busy(pid, 0) } {
                u64::MAX => values.push_str(" -"),
                ns => values.push_str(&format!(" {ns}")),
            }
        }
        let to = mono_ns();
        if writeln!(out, "{from} {to}{values}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
}

/// The `gpuslice_spin` kernel `pulse` launches (its one parameter: the ns it takes).
const SPIN_PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry gpuslice_spin(.param .u64 ns) { ret; }
";

fn pulse(kernel_us: u64, period_ms: u64, seconds: u64) {
    let cuda = libcuda();
    let cu_init: unsafe extern "C" fn(u32) -> CuResult = sym(cuda, c"cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
        sym(cuda, c"cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult = sym(cuda, c"cuCtxSetCurrent");
    let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult =
        sym(cuda, c"cuModuleLoadData");
    let get: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult =
        sym(cuda, c"cuModuleGetFunction");
    type Launch = unsafe extern "C" fn(
        *mut c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult;
    let launch: Launch = sym(cuda, c"cuLaunchKernel");
    let sync: unsafe extern "C" fn() -> CuResult = sym(cuda, c"cuCtxSynchronize");
    let (mut ctx, mut module, mut func) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: the driver's signatures above; out-parameters are valid locals, the PTX is
    // NUL-terminated.
    unsafe {
        check("cuInit", cu_init(0));
        check("cuDevicePrimaryCtxRetain", retain(&mut ctx, 0));
        check("cuCtxSetCurrent", set_current(ctx));
        check(
            "cuModuleLoadData",
            load(&mut module, SPIN_PTX.as_ptr().cast()),
        );
        check(
            "cuModuleGetFunction",
            get(&mut func, module, c"gpuslice_spin".as_ptr()),
        );
    }
    let t0 = std::time::Instant::now();
    let mut launches = 0u64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        let mut ns = kernel_us * 1000;
        let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
        // SAFETY: a 1x1x1 launch of the module's kernel on the legacy stream, its one
        // parameter a live local; synchronized before `ns` goes out of scope.
        unsafe {
            check(
                "cuLaunchKernel",
                launch(
                    func,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            );
            check("cuCtxSynchronize", sync());
        }
        launches += 1;
        std::thread::sleep(Duration::from_millis(period_ms));
    }
    println!("{{\"launches\": {launches}}}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = |i: usize| -> u64 {
        args.get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage())
    };
    match args.first().map(String::as_str) {
        Some("fork-hold") => fork_hold(n(1), n(2)),
        Some("fork-cuda") => fork_cuda(),
        Some("ctor-cuda") => ctor_cuda(args.get(1).unwrap_or_else(|| usage())),
        Some("pool-devices") => pool_devices(n(1)),
        Some("node-usage") => node_usage(),
        Some("pool-steps") => pool_steps(),
        Some("nvml-fork") => nvml_fork(n(1)),
        Some("engine-ns") => engine_ns(),
        Some("pulse") => pulse(n(1), n(2), n(3)),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: gpuslice-e2e-helper fork-hold BYTES CHILD_SECONDS | fork-cuda | ctor-cuda LIBRARY | \
         pool-devices BYTES | pool-steps | nvml-fork N | node-usage | engine-ns | \
         pulse KERNEL_US PERIOD_MS SECONDS"
    );
    std::process::exit(2);
}
