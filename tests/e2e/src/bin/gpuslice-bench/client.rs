//! The benchmark's own CUDA client processes (`burst-loop`, `launch-loop`): the driver loaded
//! by its soname, one spin kernel, one stream.

use std::time::{Duration, Instant};

/// The driver entry points a benchmark client needs, with one kernel loaded and one stream.
pub(crate) struct Client {
    pub(crate) launch: LaunchFn,
    pub(crate) sync: unsafe extern "C" fn(gpuslice_abi::CUstream) -> gpuslice_abi::CUresult,
    pub(crate) f: gpuslice_abi::CUfunction,
    pub(crate) s: gpuslice_abi::CUstream,
}

/// `cuLaunchKernel`, typed from the headers (`gpuslice_abi::pfn`).
pub(crate) type LaunchFn = gpuslice_abi::pfn::cuLaunchKernel;

impl Client {
    /// Launch the spin kernel for `ns` on the stream.
    pub(crate) fn launch(&self, ns: u64) {
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

    pub(crate) fn sync(&self) {
        // SAFETY: our stream.
        unsafe { (self.sync)(self.s) };
    }
}

/// `burst-loop SECONDS KERNEL_US`: a request/response client: bursts of 20 kernels, each burst
/// waited for, 10 ms apart; prints the p50/p99 of the burst latency (first launch to done), and
/// of the time its first launch call took to return (`admit_*`: under the shim, mostly the wait
/// for the device, which the rest of the burst latency is not).
pub(crate) fn burst_loop(seconds: f64, kernel_us: u64) {
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

/// Load the driver, the spin kernel and a stream.
pub(crate) fn client() -> Client {
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
    const PTX: &str = concat!(include_str!("../../../../burn/src/spin.ptx"), "\0");
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
pub(crate) fn launch_loop(n: usize) {
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
