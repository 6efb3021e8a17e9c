//! A tiny driver-API client for the fake GPU's own system tests: it `dlopen`s `libcuda.so.1`
//! and `libnvidia-ml.so.1` from `LD_LIBRARY_PATH` as real clients do, runs one scenario and
//! prints one JSON line. Subcommands:
//!
//! - `hold BYTES`: allocate, print, then wait until stdin closes;
//! - `meminfo`: cuMemGetInfo_v2 and NVML's view of device 0;
//! - `events KERNEL_US`: time one `gpuslice_spin` kernel with events;
//! - `share KERNEL_US SECONDS`: launch back to back (16 in flight), report engine share;
//! - `busy BYTES KERNEL_US SECONDS`: `hold`'s line, then `share`'s run and report, then wait
//!   until stdin closes (still holding the memory);
//! - `zero STREAMS ROUNDS`: 0 ns kernels (mixed with 50 µs ones) on several streams, each round
//!   ending in cuCtxSynchronize, cuStreamSynchronize and cuEventSynchronize;
//! - `procaddr`: the cuGetProcAddress cases the tests check;
//! - `fidelity TSV`: compare cuGetProcAddress_v2 with a real driver's table;
//! - `copies`: memcpy/memset in every direction, checked byte for byte;
//! - `memops`: stream memory operations (a wait the host releases, 64-bit and batched writes),
//!   prefetch of managed and of plain memory, graph node introspection;
//! - `init`, `devices`, `graph`, `pool`, `vmm`: error codes, device identity, graphs, pools, VMM;
//! - `graphmem BYTES [capture]`: a graph memory node of BYTES (added, or a captured
//!   cuMemAllocAsync), instantiated, its graph destroyed, then launched; memory info and a plain
//!   allocation of BYTES afterwards, memory info again once the node's memory is freed and the
//!   executable destroyed (run under the shim);
//! - `syncflags KERNEL_US`: in a context made with each `CU_CTX_SCHED_*` flag (and with a
//!   blocking-sync event), how long stream, event and context synchronizes of one kernel took;
//! - `launchcost`: host cost of launch, record and sync (a diagnostic, not a test);
//! - `lose DEV`, `restore DEV`: make node device DEV fall off the bus (XID 79) for every
//!   process on the node, or bring it back (`fakegpu_set_lost`; see the fake's `lost.rs`);
//! - `probe DEV [wait]`: what NVML and CUDA answer for device DEV (its handle and memory, a
//!   primary context and an allocation in it); with `wait`, once more after a line on stdin,
//!   with the same handle and context (a device lost in between).

use gpuslice_abi::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::time::Instant;

const PTX: &str = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry gpuslice_spin(.param .u64 ns) { ret; }
.visible .entry other_kernel() { ret; }
";

struct Lib(*mut c_void);

impl Lib {
    fn open(name: &str) -> Lib {
        let n = CString::new(name).unwrap();
        // SAFETY: dlopen of a library name; checked for null.
        let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {name} failed");
        Lib(h)
    }
    fn raw(&self, name: &str) -> *mut c_void {
        let n = CString::new(name).unwrap();
        // SAFETY: dlsym on a live handle.
        unsafe { libc::dlsym(self.0, n.as_ptr()) }
    }
    /// A function pointer of type `T` (an `extern "C" fn` type).
    fn get<T: Copy>(&self, name: &str) -> T {
        let p = self.raw(name);
        assert!(!p.is_null(), "{name} missing");
        // SAFETY: T is the documented signature of `name`.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

/// `call!(lib, cuMemAlloc_v2; &mut p, n)`: look up the export and call it with the header's
/// signature ([`gpuslice_abi::pfn`]), so the arguments are type-checked against `cuda.h`.
macro_rules! call {
    ($lib:expr, $name:ident ; $($a:expr),*) => {{
        let f: pfn::$name = $lib.get(stringify!($name));
        // SAFETY: `f` has the header's signature for this export, and the call site passes
        // arguments valid for it (live locals, handles the driver returned).
        let r = unsafe { f($($a),*) };
        r
    }};
}

macro_rules! ok {
    ($e:expr) => {{
        let r = $e;
        assert_eq!(r, 0, "{} failed: {}", stringify!($e), describe_cu(r));
    }};
}

struct Cuda {
    lib: Lib,
}

impl Cuda {
    fn init() -> Cuda {
        let lib = Lib::open("libcuda.so.1");
        ok!(call!(lib, cuInit; 0));
        let mut ctx: CUcontext = std::ptr::null_mut();
        ok!(call!(lib, cuDevicePrimaryCtxRetain; &mut ctx, 0));
        ok!(call!(lib, cuCtxSetCurrent; ctx));
        Cuda { lib }
    }
    fn alloc(&self, n: usize) -> Result<u64, u32> {
        let mut p = 0u64;
        let r = call!(self.lib, cuMemAlloc_v2; &mut p, n);
        if r == 0 {
            Ok(p)
        } else {
            Err(r)
        }
    }
    fn mem_info(&self) -> (usize, usize) {
        let (mut f, mut t) = (0usize, 0usize);
        ok!(call!(self.lib, cuMemGetInfo_v2; &mut f, &mut t));
        (f, t)
    }
    fn spin(&self) -> CUfunction {
        let src = CString::new(PTX).unwrap();
        let mut m: CUmodule = std::ptr::null_mut();
        ok!(call!(self.lib, cuModuleLoadData; &mut m, src.as_ptr() as *const c_void));
        let mut f: CUfunction = std::ptr::null_mut();
        ok!(call!(self.lib, cuModuleGetFunction; &mut f, m, c"gpuslice_spin".as_ptr()));
        f
    }
    fn launch_spin(&self, f: CUfunction, ns: u64, s: CUstream) {
        let mut arg = ns;
        let mut params = [&mut arg as *mut u64 as *mut c_void];
        ok!(call!(self.lib, cuLaunchKernel;
            f, 1, 1, 1, 1, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut()));
    }
    fn event(&self) -> CUevent {
        let mut e: CUevent = std::ptr::null_mut();
        ok!(call!(self.lib, cuEventCreate; &mut e, 0));
        e
    }
    fn record(&self, e: CUevent, s: CUstream) {
        ok!(call!(self.lib, cuEventRecord; e, s));
    }
    fn ev_sync(&self, e: CUevent) {
        ok!(call!(self.lib, cuEventSynchronize; e));
    }
}

fn nvml_memory() -> serde_json::Value {
    let lib = Lib::open("libnvidia-ml.so.1");
    ok!(call!(lib, nvmlInit_v2; ));
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    ok!(call!(lib, nvmlDeviceGetHandleByIndex_v2; 0, &mut h));
    let mut m = nvmlMemory_t::default();
    ok!(call!(lib, nvmlDeviceGetMemoryInfo; h, &mut m));
    let mut count: c_uint = 0;
    let r =
        call!(lib, nvmlDeviceGetComputeRunningProcesses_v3; h, &mut count, std::ptr::null_mut());
    assert!(
        r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE,
        "processes: {r}"
    );
    let mut infos = vec![nvmlProcessInfo_t::default(); count as usize + 4];
    let mut n = infos.len() as c_uint;
    ok!(call!(lib, nvmlDeviceGetComputeRunningProcesses_v3; h, &mut n, infos.as_mut_ptr()));
    let procs: Vec<serde_json::Value> = infos[..n as usize]
        .iter()
        .map(|p| serde_json::json!({"pid": p.pid, "used": p.usedGpuMemory}))
        .collect();
    serde_json::json!({"total": m.total, "used": m.used, "free": m.free, "processes": procs})
}

/// Launch `us` µs kernels back to back (16 in flight) for `secs` seconds: the share of the
/// engine this process got (simulated kernel time over wall time).
fn share(c: &Cuda, us: u64, secs: f64) -> serde_json::Value {
    let f = c.spin();
    let s: CUstream = std::ptr::null_mut();
    let ring: Vec<CUevent> = (0..16).map(|_| c.event()).collect();
    let start = Instant::now();
    let mut launched = 0usize;
    while start.elapsed().as_secs_f64() < secs {
        let slot = launched % ring.len();
        if launched >= ring.len() {
            c.ev_sync(ring[slot]);
        }
        c.launch_spin(f, us * 1000, s);
        c.record(ring[slot], s);
        launched += 1;
    }
    ok!(call!(c.lib, cuCtxSynchronize; ));
    let wall = start.elapsed().as_secs_f64();
    let gpu = launched as f64 * us as f64 / 1e6;
    serde_json::json!({"kernels": launched, "gpu_seconds": gpu, "wall_seconds": wall, "share": gpu / wall})
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let out = match arg(0).as_str() {
        "hold" => {
            let c = Cuda::init();
            let n: usize = arg(1).parse().expect("BYTES");
            let r = c.alloc(n);
            println!(
                "{}",
                serde_json::json!({"ptr": r.ok(), "error": r.err(), "pid": std::process::id()})
            );
            let mut s = String::new();
            let _ = std::io::stdin().read_line(&mut s);
            return;
        }
        "meminfo" => {
            let c = Cuda::init();
            let (free, total) = c.mem_info();
            serde_json::json!({"free": free, "total": total, "nvml": nvml_memory()})
        }
        "events" => {
            let c = Cuda::init();
            let us: u64 = arg(1).parse().expect("KERNEL_US");
            let f = c.spin();
            let (a, b) = (c.event(), c.event());
            let s = std::ptr::null_mut();
            c.record(a, s);
            c.launch_spin(f, us * 1000, s);
            c.record(b, s);
            c.ev_sync(b);
            let mut ms = 0f32;
            ok!(call!(c.lib, cuEventElapsedTime; &mut ms, a, b));
            serde_json::json!({"elapsed_ms": ms})
        }
        "share" => share(
            &Cuda::init(),
            arg(1).parse().expect("KERNEL_US"),
            arg(2).parse().expect("SECONDS"),
        ),
        "busy" => {
            let c = Cuda::init();
            let n: usize = arg(1).parse().expect("BYTES");
            let r = c.alloc(n);
            println!(
                "{}",
                serde_json::json!({"ptr": r.ok(), "error": r.err(), "pid": std::process::id()})
            );
            let report = share(
                &c,
                arg(2).parse().expect("KERNEL_US"),
                arg(3).parse().expect("SECONDS"),
            );
            println!("{report}");
            let mut s = String::new();
            let _ = std::io::stdin().read_line(&mut s);
            return;
        }
        "zero" => zero(
            arg(1).parse().expect("STREAMS"),
            arg(2).parse().expect("ROUNDS"),
        ),
        "syncflags" => sync_flags(arg(1).parse().expect("KERNEL_US")),
        "procaddr" => procaddr(),
        "fidelity" => fidelity(&arg(1)),
        "copies" => copies(),
        "memops" => memops(),
        "init" => {
            let lib = Lib::open("libcuda.so.1");
            let before = call!(lib, cuMemAlloc_v2; &mut 0u64, 16);
            let r = call!(lib, cuInit; 0);
            let no_ctx = if r == 0 {
                call!(lib, cuMemAlloc_v2; &mut 0u64, 16)
            } else {
                r
            };
            serde_json::json!({"before_init": before, "cuInit": r, "no_context": no_ctx})
        }
        "devices" => devices(),
        "launchcost" => {
            // Host cost of the fake's launch path (not a test: a diagnostic).
            let c = Cuda::init();
            let f = c.spin();
            let s: CUstream = std::ptr::null_mut();
            let e = c.event();
            let n = 2000u32;
            c.launch_spin(f, 1000, s);
            let t = Instant::now();
            for _ in 0..n {
                c.launch_spin(f, 1000, s);
            }
            let launch = t.elapsed().as_nanos() as f64 / n as f64;
            let t = Instant::now();
            for _ in 0..n {
                c.record(e, s);
            }
            let record = t.elapsed().as_nanos() as f64 / n as f64;
            c.ev_sync(e);
            let t = Instant::now();
            for _ in 0..n {
                c.ev_sync(e);
            }
            let sync = t.elapsed().as_nanos() as f64 / n as f64;
            serde_json::json!({"launch_ns": launch, "record_ns": record, "sync_done_ns": sync})
        }
        "graph" => graph(),
        "pool" => pool(),
        "graphmem" => graphmem(arg(1).parse().expect("BYTES"), arg(2) == "capture"),
        "vmm" => vmm(),
        "lose" | "restore" => set_lost(arg(0) == "lose", arg(1).parse().expect("DEV")),
        "probe" => {
            probe(arg(1).parse().expect("DEV"), arg(2) == "wait");
            return;
        }
        other => {
            eprintln!("fakegpu-client: unknown scenario {other:?}");
            std::process::exit(2);
        }
    };
    println!("{out}");
}

/// Zero-duration kernels must complete like any other: every synchronize returns.
/// For each scheduling flag: the context's flags as read back, and the wall time in ms from
/// launch to the return of a stream, an event and a context synchronize of one kernel of `us`.
fn sync_flags(us: u64) -> serde_json::Value {
    let c = Cuda::init();
    let mut out = serde_json::Map::new();
    for (name, flags) in [
        ("auto", CU_CTX_SCHED_AUTO),
        ("spin", CU_CTX_SCHED_SPIN),
        ("yield", CU_CTX_SCHED_YIELD),
        ("blocking", CU_CTX_SCHED_BLOCKING_SYNC),
    ] {
        let mut ctx: CUcontext = std::ptr::null_mut();
        ok!(call!(c.lib, cuCtxCreate_v2; &mut ctx, flags, 0));
        let mut read: c_uint = 0;
        ok!(call!(c.lib, cuCtxGetFlags; &mut read));
        let f = c.spin();
        let s: CUstream = std::ptr::null_mut();
        let timed = |sync: &dyn Fn()| {
            let t = Instant::now();
            c.launch_spin(f, us * 1000, s);
            sync();
            t.elapsed().as_secs_f64() * 1e3
        };
        let e = c.event();
        let mut blocking: CUevent = std::ptr::null_mut();
        ok!(call!(c.lib, cuEventCreate; &mut blocking, CU_EVENT_BLOCKING_SYNC));
        let stream = timed(&|| ok!(call!(c.lib, cuStreamSynchronize; s)));
        let event = timed(&|| {
            c.record(e, s);
            c.ev_sync(e)
        });
        let blocking_event = timed(&|| {
            c.record(blocking, s);
            c.ev_sync(blocking)
        });
        let context = timed(&|| ok!(call!(c.lib, cuCtxSynchronize; )));
        ok!(call!(c.lib, cuCtxDestroy_v2; ctx));
        out.insert(
            name.into(),
            serde_json::json!({"flags": read, "stream_ms": stream, "event_ms": event,
                "blocking_event_ms": blocking_event, "ctx_ms": context}),
        );
    }
    out.into()
}

fn zero(streams: usize, rounds: usize) -> serde_json::Value {
    let c = Cuda::init();
    let f = c.spin();
    let other = {
        let mut m: CUmodule = std::ptr::null_mut();
        let src = CString::new(PTX).unwrap();
        ok!(call!(c.lib, cuModuleLoadData; &mut m, src.as_ptr() as *const c_void));
        let mut k: CUfunction = std::ptr::null_mut();
        ok!(call!(c.lib, cuModuleGetFunction; &mut k, m, c"other_kernel".as_ptr()));
        k
    };
    let ss: Vec<CUstream> = (0..streams)
        .map(|_| {
            let mut s: CUstream = std::ptr::null_mut();
            ok!(call!(c.lib, cuStreamCreate; &mut s, CU_STREAM_NON_BLOCKING));
            s
        })
        .collect();
    let (a, b) = (c.event(), c.event());
    let mut kernels = 0u64;
    let mut max_elapsed_ms = 0f32;
    let start = Instant::now();
    for r in 0..rounds {
        // Only zero kernels, then a context-wide synchronize.
        for &s in &ss {
            for _ in 0..8 {
                c.launch_spin(f, 0, s);
            }
            kernels += 8;
        }
        ok!(call!(c.lib, cuCtxSynchronize; ));
        // Zero kernels around a real one and around a kernel with no parameter, per stream.
        for &s in &ss {
            c.launch_spin(f, 0, s);
            c.launch_spin(f, 50_000, s);
            c.launch_spin(f, 0, s);
            ok!(call!(c.lib, cuLaunchKernel;
                other, 1, 1, 1, 1, 1, 1, 0, s, std::ptr::null_mut(), std::ptr::null_mut()));
            kernels += 4;
        }
        for &s in &ss {
            ok!(call!(c.lib, cuStreamSynchronize; s));
        }
        // Events around zero kernels only: they complete and measure (about) nothing.
        let s = ss[r % ss.len()];
        c.record(a, s);
        for _ in 0..4 {
            c.launch_spin(f, 0, s);
        }
        kernels += 4;
        c.record(b, s);
        c.ev_sync(b);
        let mut ms = 0f32;
        ok!(call!(c.lib, cuEventElapsedTime; &mut ms, a, b));
        max_elapsed_ms = max_elapsed_ms.max(ms);
    }
    ok!(call!(c.lib, cuCtxSynchronize; ));
    serde_json::json!({
        "kernels": kernels,
        "max_elapsed_ms": max_elapsed_ms,
        "wall_seconds": start.elapsed().as_secs_f64(),
    })
}

type GetProc2 = pfn::cuGetProcAddress_v2;
type GetProc1 = pfn::cuGetProcAddress;

fn procaddr() -> serde_json::Value {
    let lib = Lib::open("libcuda.so.1");
    let gp2: GetProc2 = lib.get("cuGetProcAddress_v2");
    let gp1: GetProc1 = lib.get("cuGetProcAddress");
    let q = |name: &str, ver: c_int, flags: u64| {
        let n = CString::new(name).unwrap();
        let mut p: *mut c_void = std::ptr::NonNull::dangling().as_ptr();
        let mut st: c_int = -1;
        // SAFETY: the documented signature of cuGetProcAddress_v2.
        let r = unsafe { gp2(n.as_ptr(), &mut p, ver, flags, &mut st) };
        serde_json::json!({"result": r, "ptr": p as usize, "status": st})
    };
    let q1 = |name: &str, ver: c_int| {
        let n = CString::new(name).unwrap();
        let mut p: *mut c_void = 7 as *mut c_void;
        // SAFETY: the documented signature of cuGetProcAddress.
        let r = unsafe { gp1(n.as_ptr(), &mut p, ver, 0) };
        serde_json::json!({"result": r, "ptr": p as usize})
    };
    let null_status = {
        let n = CString::new("cuMemAlloc").unwrap();
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: symbolStatus may be null.
        let r = unsafe { gp2(n.as_ptr(), &mut p, 12000, 0, std::ptr::null_mut()) };
        serde_json::json!({"result": r, "ptr": p as usize})
    };
    serde_json::json!({
        "dlsym_cuMemAlloc_v2": lib.raw("cuMemAlloc_v2") as usize,
        "dlsym_cuLaunchKernel_ptsz": lib.raw("cuLaunchKernel_ptsz") as usize,
        "dlsym_cuLaunchKernel": lib.raw("cuLaunchKernel") as usize,
        "cuMemAlloc_3020": q("cuMemAlloc", 3020, 0),
        "cuMemAlloc_null_status": null_status,
        "cuLaunchKernel_ptds": q("cuLaunchKernel", 12000, 2),
        "cuLaunchKernel_default": q("cuLaunchKernel", 12000, 0),
        "unknown": q("cuNoSuchFunction", 12000, 0),
        "versioned_name": q("cuMemAlloc_v2", 12000, 0),
        "too_low": q("cuMemAllocAsync", 11000, 0),
        "bad_flags": q("cuMemAlloc", 12000, 3),
        "v1_unknown": q1("cuNoSuchFunction", 12000),
        "v1_found": q1("cuMemAlloc", 12000),
    })
}

fn fidelity(path: &str) -> serde_json::Value {
    let lib = Lib::open("libcuda.so.1");
    let gp2: GetProc2 = lib.get("cuGetProcAddress_v2");
    let text = std::fs::read_to_string(path).expect("reference table");
    let mut groups: std::collections::BTreeMap<(String, u64), Vec<(c_int, String)>> =
        Default::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() == 4 {
            groups
                .entry((f[0].to_string(), f[1].parse().unwrap()))
                .or_default()
                .push((f[2].parse().unwrap(), f[3].to_string()));
        }
    }
    let (mut checked, mut bases) = (0, std::collections::BTreeSet::new());
    let mut mismatches = Vec::new();
    for ((base, flags), mut rows) in groups {
        rows.sort();
        // Only entry points the fake implements: its newest symbol for these flags is exported.
        let newest = &rows.last().unwrap().1;
        if newest == "-" || lib.raw(newest).is_null() {
            continue;
        }
        bases.insert(base.clone());
        for (i, (ver, sym)) in rows.iter().enumerate() {
            let mut vers = vec![*ver];
            if let Some((next, _)) = rows.get(i + 1) {
                vers.push(next - 1);
            } else {
                // The reference driver is CUDA 12.2: it says nothing about later versions.
                vers.push((*ver).max(12020));
            }
            for v in vers {
                let n = CString::new(base.as_str()).unwrap();
                let mut p: *mut c_void = std::ptr::null_mut();
                let mut st: c_int = -1;
                // SAFETY: the documented signature of cuGetProcAddress_v2.
                let r = unsafe { gp2(n.as_ptr(), &mut p, v, flags, &mut st) };
                let (want_p, want_st) = if sym == "-" {
                    (
                        std::ptr::null_mut(),
                        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                    )
                } else {
                    let d = lib.raw(sym);
                    (
                        d,
                        if d.is_null() {
                            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                        } else {
                            CU_GET_PROC_ADDRESS_SUCCESS
                        },
                    )
                };
                checked += 1;
                if r != 0 || p != want_p || st != want_st {
                    mismatches.push(format!("{base} flags {flags} version {v}: got ({r}, {p:?}, {st}), reference says {sym}"));
                }
            }
        }
    }
    serde_json::json!({"bases": bases.len(), "checked": checked, "mismatches": mismatches})
}

fn copies() -> serde_json::Value {
    let c = Cuda::init();
    let n = 1 << 20;
    let src: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let a = c.alloc(n).unwrap();
    let b = c.alloc(n).unwrap();
    ok!(call!(c.lib, cuMemcpyHtoD_v2; a, src.as_ptr() as *const c_void, n));
    ok!(call!(c.lib, cuMemcpyDtoD_v2; b, a, n));
    let mut back = vec![0u8; n];
    ok!(call!(c.lib, cuMemcpyDtoH_v2; back.as_mut_ptr() as *mut c_void, b, n));
    let roundtrip = back == src;
    ok!(call!(c.lib, cuMemsetD32_v2; a, 0xdeadbeef, 16));
    let mut words = [0u32; 17];
    ok!(
        call!(c.lib, cuMemcpyDtoHAsync_v2; words.as_mut_ptr() as *mut c_void, a, 68, std::ptr::null_mut())
    );
    ok!(call!(c.lib, cuStreamSynchronize; std::ptr::null_mut()));
    let memset = words[..16].iter().all(|&w| w == 0xdeadbeef)
        && words[16] == u32::from_le_bytes([src[64], src[65], src[66], src[67]]);
    let zero = c.alloc(0).err();
    let bad_free = call!(c.lib, cuMemFree_v2; a + 8);
    ok!(call!(c.lib, cuMemFree_v2; a));
    serde_json::json!({"roundtrip": roundtrip, "memset": memset, "alloc_zero": zero, "free_unknown": bad_free})
}

fn memops() -> serde_json::Value {
    let c = Cuda::init();
    let flag = c.alloc(8).unwrap();
    let out = c.alloc(16).unwrap();
    ok!(call!(c.lib, cuMemsetD8_v2; flag, 0, 8));
    ok!(call!(c.lib, cuMemsetD8_v2; out, 0, 16));
    let mut s: CUstream = std::ptr::null_mut();
    ok!(call!(c.lib, cuStreamCreate; &mut s, 1));
    // Wait until the flag word is >= 1, then write 64 bits.
    ok!(call!(c.lib, cuStreamWaitValue32; s, flag, 1, 0));
    ok!(call!(c.lib, cuStreamWriteValue64; s, out, 0x1122_3344_5566_7788, 0));
    // A batch: write 32 bits at out + 8, after the same wait.
    let mut batch = [0u8; 48];
    batch[..4].copy_from_slice(&2u32.to_le_bytes()); // CU_STREAM_MEM_OP_WRITE_VALUE_32
    batch[8..16].copy_from_slice(&(out + 8).to_le_bytes());
    batch[16..20].copy_from_slice(&0xabcd_u32.to_le_bytes());
    ok!(call!(c.lib, cuStreamBatchMemOp; s, 1, batch.as_mut_ptr() as *mut c_void, 0));
    std::thread::sleep(std::time::Duration::from_millis(30));
    let blocked = call!(c.lib, cuStreamQuery; s);
    // Read with the host (device memory is host memory on the fake): a copy would queue behind
    // the wait on the process's one executor (docs/fakegpu.md).
    // SAFETY: `p` is a live 16-byte allocation of ours.
    let read = |p: u64| unsafe {
        [
            (p as *const u64).read_volatile(),
            ((p + 8) as *const u64).read_volatile(),
        ]
    };
    let before = read(out);
    // The host releases the wait (device memory is host memory on the fake).
    // SAFETY: `flag` is a live 8-byte allocation of ours.
    unsafe { (flag as *mut u32).write_volatile(1) };
    ok!(call!(c.lib, cuStreamSynchronize; s));
    let after = read(out);
    let mut managed = 0u64;
    ok!(call!(c.lib, cuMemAllocManaged; &mut managed, 4096, 1));
    let prefetch_managed = call!(c.lib, cuMemPrefetchAsync; managed, 4096, 0, s);
    let prefetch_plain = call!(c.lib, cuMemPrefetchAsync; out, 16, 0, s);
    let mut ty: CUgraphNodeType = 0;
    let node_type = call!(c.lib, cuGraphNodeGetType; 1 as CUgraphNode, &mut ty);
    serde_json::json!({
        "blocked": blocked, "before": before, "after": after,
        "prefetch_managed": prefetch_managed, "prefetch_plain": prefetch_plain,
        "node_type": node_type,
    })
}

fn devices() -> serde_json::Value {
    let c = Cuda::init();
    let mut n: c_int = 0;
    ok!(call!(c.lib, cuDeviceGetCount; &mut n));
    let mut devs = Vec::new();
    for d in 0..n {
        let mut u = CUuuid::default();
        ok!(call!(c.lib, cuDeviceGetUuid; &mut u, d));
        let mut name = [0 as c_char; 96];
        ok!(call!(c.lib, cuDeviceGetName; name.as_mut_ptr(), 96, d));
        let (mut maj, mut min) = (0, 0);
        ok!(
            call!(c.lib, cuDeviceGetAttribute; &mut maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d)
        );
        ok!(
            call!(c.lib, cuDeviceGetAttribute; &mut min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d)
        );
        let hex: String = u
            .bytes
            .iter()
            .map(|b| format!("{:02x}", *b as u8))
            .collect();
        // SAFETY: cuDeviceGetName NUL-terminates.
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        devs.push(serde_json::json!({"uuid": hex, "name": name, "cc": format!("{maj}.{min}")}));
    }
    let mut v: c_int = 0;
    ok!(call!(c.lib, cuDriverGetVersion; &mut v));
    serde_json::json!({"count": n, "devices": devs, "driver": v})
}

fn graphmem(bytes: usize, capture: bool) -> serde_json::Value {
    let c = Cuda::init();
    let mut s: CUstream = std::ptr::null_mut();
    ok!(call!(c.lib, cuStreamCreate; &mut s, CU_STREAM_NON_BLOCKING));
    let mut g: CUgraph = std::ptr::null_mut();
    let mut ptr: CUdeviceptr = 0;
    if capture {
        ok!(call!(c.lib, cuStreamBeginCapture_v2; s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        let add = call!(c.lib, cuMemAllocAsync; &mut ptr, bytes, s);
        ok!(call!(c.lib, cuStreamEndCapture; s, &mut g));
        if add != 0 {
            ok!(call!(c.lib, cuGraphDestroy; g));
            let (free, _) = c.mem_info();
            return serde_json::json!({ "add": add, "free_after_destroy": free });
        }
        return graphmem_run(&c, s, g, ptr, bytes, add);
    }
    ok!(call!(c.lib, cuGraphCreate; &mut g, 0));
    let mut params = CUDA_MEM_ALLOC_NODE_PARAMS {
        poolProps: CUmemPoolProps {
            allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: 0,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        },
        accessDescs: std::ptr::null(),
        accessDescCount: 0,
        bytesize: bytes,
        dptr: 0,
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
    let add = call!(c.lib, cuGraphAddMemAllocNode; &mut node, g, std::ptr::null(), 0, &mut params);
    if add != 0 {
        return serde_json::json!({ "add": add });
    }
    graphmem_run(&c, s, g, params.dptr, bytes, add)
}

fn graphmem_run(
    c: &Cuda,
    s: CUstream,
    g: CUgraph,
    ptr: CUdeviceptr,
    bytes: usize,
    add: u32,
) -> serde_json::Value {
    let mut e: CUgraphExec = std::ptr::null_mut();
    ok!(call!(c.lib, cuGraphInstantiateWithFlags; &mut e, g, 0));
    // Legal and common: the executable does not need its graph any more.
    ok!(call!(c.lib, cuGraphDestroy; g));
    let launch = call!(c.lib, cuGraphLaunch; e, s);
    ok!(call!(c.lib, cuStreamSynchronize; s));
    let (free, total) = c.mem_info();
    let second = c.alloc(bytes);
    if let Ok(p) = second {
        ok!(call!(c.lib, cuMemFree_v2; p));
    }
    if launch == 0 {
        ok!(call!(c.lib, cuMemFreeAsync; ptr, s));
        ok!(call!(c.lib, cuStreamSynchronize; s));
    }
    ok!(call!(c.lib, cuGraphExecDestroy; e));
    let (free_after_destroy, _) = c.mem_info();
    serde_json::json!({
        "add": add,
        "launch": launch,
        "free_after_launch": free,
        "total": total,
        "second_alloc": second.err().unwrap_or(0),
        "free_after_destroy": free_after_destroy,
    })
}

fn graph() -> serde_json::Value {
    let c = Cuda::init();
    let f = c.spin();
    let mut s: CUstream = std::ptr::null_mut();
    ok!(call!(c.lib, cuStreamCreate; &mut s, CU_STREAM_NON_BLOCKING));
    ok!(call!(c.lib, cuStreamBeginCapture_v2; s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    let mut st: c_uint = 9;
    ok!(call!(c.lib, cuStreamIsCapturing; s, &mut st));
    let sync_while_capturing = call!(c.lib, cuStreamSynchronize; s);
    // That sync invalidated the capture, as on the driver; start again.
    let mut g: CUgraph = std::ptr::null_mut();
    let end_invalid = call!(c.lib, cuStreamEndCapture; s, &mut g);
    ok!(call!(c.lib, cuStreamBeginCapture_v2; s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    let mut p = 0u64;
    ok!(call!(c.lib, cuMemAllocAsync; &mut p, 64 << 20, s));
    for _ in 0..10 {
        c.launch_spin(f, 1_000_000, s);
    }
    ok!(call!(c.lib, cuMemFreeAsync; p, s));
    ok!(call!(c.lib, cuStreamEndCapture; s, &mut g));
    let mut e: CUgraphExec = std::ptr::null_mut();
    ok!(call!(c.lib, cuGraphInstantiateWithFlags; &mut e, g, 0));
    let (free0, _) = c.mem_info();
    let (a, b) = (c.event(), c.event());
    c.record(a, s);
    ok!(call!(c.lib, cuGraphLaunch; e, s));
    c.record(b, s);
    c.ev_sync(b);
    let mut ms = 0f32;
    ok!(call!(c.lib, cuEventElapsedTime; &mut ms, a, b));
    ok!(call!(c.lib, cuStreamSynchronize; s));
    let (free1, _) = c.mem_info();
    serde_json::json!({"capturing_status": st, "sync_while_capturing": sync_while_capturing, "end_invalidated": end_invalid,
        "elapsed_ms": ms, "graph_mem_returned": free1 == free0})
}

fn pool() -> serde_json::Value {
    let c = Cuda::init();
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    ok!(call!(c.lib, cuDeviceGetMemPool; &mut pool, 0));
    let s: CUstream = std::ptr::null_mut();
    let (free0, _) = c.mem_info();
    let mut p = 0u64;
    ok!(call!(c.lib, cuMemAllocAsync; &mut p, 256 << 20, s));
    let (free1, _) = c.mem_info();
    ok!(call!(c.lib, cuMemFreeAsync; p, s));
    ok!(call!(c.lib, cuStreamSynchronize; s));
    let (free2, _) = c.mem_info();
    let mut threshold: u64 = u64::MAX;
    ok!(
        call!(c.lib, cuMemPoolSetAttribute; pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut threshold as *mut u64 as *mut c_void)
    );
    ok!(call!(c.lib, cuMemAllocAsync; &mut p, 256 << 20, s));
    ok!(call!(c.lib, cuMemFreeAsync; p, s));
    ok!(call!(c.lib, cuStreamSynchronize; s));
    let (free3, _) = c.mem_info();
    let mut reserved = 0u64;
    ok!(
        call!(c.lib, cuMemPoolGetAttribute; pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &mut reserved as *mut u64 as *mut c_void)
    );
    ok!(call!(c.lib, cuMemPoolTrimTo; pool, 0));
    let (free4, _) = c.mem_info();
    serde_json::json!({"taken_by_alloc": free0 - free1, "after_free_sync": free0 - free2, "kept_above_threshold": free0 - free3,
        "reserved": reserved, "after_trim": free0 - free4})
}

fn vmm() -> serde_json::Value {
    let c = Cuda::init();
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: 0,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    };
    let mut gran = 0usize;
    ok!(call!(c.lib, cuMemGetAllocationGranularity; &mut gran, &prop, 0));
    let size = 2 * gran;
    let (free0, _) = c.mem_info();
    let mut h = 0u64;
    ok!(call!(c.lib, cuMemCreate; &mut h, size, &prop, 0));
    let (free1, _) = c.mem_info();
    let mut va = 0u64;
    ok!(call!(c.lib, cuMemAddressReserve; &mut va, size, 0, 0, 0));
    ok!(call!(c.lib, cuMemMap; va, size, 0, h, 0));
    let desc = CUmemAccessDesc {
        location: prop.location,
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    ok!(call!(c.lib, cuMemSetAccess; va, size, &desc, 1));
    ok!(call!(c.lib, cuMemsetD8_v2; va, 0x5a, size));
    let mut back = vec![0u8; 16];
    ok!(call!(c.lib, cuMemcpyDtoH_v2; back.as_mut_ptr() as *mut c_void, va + size as u64 - 16, 16));
    let ok_bytes = back.iter().all(|&b| b == 0x5a);
    ok!(call!(c.lib, cuMemRelease; h));
    let (free2, _) = c.mem_info();
    ok!(call!(c.lib, cuMemUnmap; va, size));
    ok!(call!(c.lib, cuMemAddressFree; va, size));
    let (free3, _) = c.mem_info();
    let odd = call!(c.lib, cuMemCreate; &mut h, gran + 1, &prop, 0);
    serde_json::json!({"granularity": gran, "created": free0 - free1, "bytes": ok_bytes, "held_while_mapped": free0 - free2,
        "after_unmap": free0 - free3, "unaligned_size": odd})
}

/// `lose DEV` / `restore DEV`.
fn set_lost(lost: bool, dev: u32) -> serde_json::Value {
    let lib = Lib::open("libcuda.so.1");
    let f: extern "C" fn(u32, i32) -> i32 = lib.get("fakegpu_set_lost");
    match f(dev, i32::from(lost)) {
        0 => serde_json::json!({"device": dev, "lost": lost}),
        r => {
            eprintln!(
                "fakegpu-client: device {dev}: {}",
                if r == -1 {
                    "past the fake's 16 devices"
                } else {
                    "cannot write FAKEGPU_STATE_DIR/lost"
                }
            );
            std::process::exit(1);
        }
    }
}

/// `probe DEV [wait]`: one JSON line of result codes (0: success), twice with `wait`.
fn probe(dev: u32, wait: bool) {
    let nvml = Lib::open("libnvidia-ml.so.1");
    ok!(call!(nvml, nvmlInit_v2; ));
    let cuda = Lib::open("libcuda.so.1");
    ok!(call!(cuda, cuInit; 0));
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    let handle = call!(nvml, nvmlDeviceGetHandleByIndex_v2; dev, &mut h);
    let mut ctx: CUcontext = std::ptr::null_mut();
    let retain = call!(cuda, cuDevicePrimaryCtxRetain; &mut ctx, dev as c_int);
    if retain == 0 {
        ok!(call!(cuda, cuCtxSetCurrent; ctx));
    }
    let report = |first: bool| {
        let mut count: c_uint = 0;
        ok!(call!(nvml, nvmlDeviceGetCount_v2; &mut count));
        let mut fresh: nvmlDevice_t = std::ptr::null_mut();
        let mut m = nvmlMemory_t::default();
        let alloc = if retain == 0 {
            call!(cuda, cuMemAlloc_v2; &mut 0u64, 1 << 20)
        } else {
            retain
        };
        serde_json::json!({
            "nvml_count": count,
            "nvml_handle": call!(nvml, nvmlDeviceGetHandleByIndex_v2; dev, &mut fresh),
            "nvml_memory": if handle == 0 { call!(nvml, nvmlDeviceGetMemoryInfo; h, &mut m) } else { handle },
            "cuda_retain": retain,
            "cuda_alloc": alloc,
            "first": first,
        })
    };
    println!("{}", report(true));
    if wait {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        println!("{}", report(false));
    }
}
