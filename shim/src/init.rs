//! Start-up, on the first `cuInit` (or the first hooked call that needs it): read the
//! configuration, enumerate the devices through the real driver, open the node ledger, attach
//! this process and join its slice on every visible device (admission control). The result is
//! one process-wide [`State`], published once and read lock-free afterwards.
//!
//! A process that never calls CUDA never gets here, so it never creates the ledger. A bad
//! configuration or a refused admission prints one line and makes `cuInit` (and every later
//! hooked call) fail with `CUDA_ERROR_INVALID_VALUE`.

use crate::admit::{self, Admission, Found};
use crate::config::Config;
use crate::log::{self, log};
pub use crate::process::State;
use crate::process::{FAILED, FORKED, INIT, STATE};
use crate::real;
use core::ffi::{c_char, c_int};
use core::sync::atomic::Ordering::*;
use gpuslice_abi::pfn;
use gpuslice_abi::*;
use gpuslice_ledger::node::Opened;
use gpuslice_ledger::Ledger;
use gpuslice_protocol::Refusal;

/// The state, starting up if needed. `Err` carries the status to return to the caller.
#[inline]
pub fn state() -> Result<&'static State, CUresult> {
    let p = STATE.load(Acquire);
    if !p.is_null() {
        // SAFETY: published once, never freed.
        return Ok(unsafe { &*p });
    }
    start(None)
}

/// The state if start-up already happened (no start-up: for NVML and reporting).
#[inline]
pub fn state_if_ready() -> Option<&'static State> {
    let p = STATE.load(Acquire);
    // SAFETY: published once, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The `cuInit` hook.
pub unsafe fn cu_init(real: pfn::cuInit, flags: core::ffi::c_uint) -> CUresult {
    let f = FAILED.load(Acquire);
    if f != 0 {
        return start(None).err().unwrap_or(f);
    }
    if !STATE.load(Acquire).is_null() {
        // SAFETY: the handler contract: `real` with the program's arguments.
        return unsafe { real(flags) };
    }
    // Before anything of ours can panic: a panic caught at the FFI boundary prints one
    // `gpuslice:` line instead of Rust's default message.
    crate::log::install_panic_hook();
    match start(Some((real, flags))) {
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

/// `pthread_atfork` child handler, registered once start-up published the state. Runs in the
/// child right after `fork()`, where only async-signal-safe work is allowed: atomic stores and
/// [`Ledger::forget_after_fork`] (no allocation, no lock, no log line).
extern "C" fn in_forked_child() {
    let p = STATE.swap(core::ptr::null_mut(), AcqRel);
    if p.is_null() {
        return;
    }
    FORKED.store(true, Release);
    FAILED.store(CUDA_ERROR_NOT_INITIALIZED, Release);
    // SAFETY: published once, never freed (the child keeps the parent's copy of it).
    unsafe { (*p).ledger.forget_after_fork() };
}

#[cold]
fn start(cu_init: Option<(pfn::cuInit, core::ffi::c_uint)>) -> Result<&'static State, CUresult> {
    // Before the lock: in a forked child another thread of the parent may have held it.
    let f = FAILED.load(Acquire);
    if f != 0 {
        if FORKED.swap(false, AcqRel) {
            log!(
                Error,
                "this process was forked (without exec) from one that had initialised CUDA; CUDA \
                 cannot be used in it (start GPU workers with spawn, or exec a new program)"
            );
        }
        return Err(f);
    }
    // Resolve the driver's functions before the lock: resolving takes the loader's lock, and a
    // thread inside dlopen (a library constructor calling CUDA) may hold that one while it
    // waits for ours.
    crate::real::resolve_all(crate::real::Lib::Cuda);
    let _g = INIT.lock().unwrap_or_else(|e| e.into_inner());
    let f = FAILED.load(Acquire);
    if f != 0 {
        return Err(f);
    }
    if let Some(s) = state_if_ready() {
        return Ok(s);
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return Err(fail(CUDA_ERROR_INVALID_VALUE, &e.to_string())),
    };
    log::set_level(config.log);
    // The driver must be initialised before we can enumerate devices.
    let (init, flags) = match cu_init {
        Some(x) => x,
        None => (real::cuInit().ok_or(CUDA_ERROR_NOT_INITIALIZED)?, 0),
    };
    // SAFETY: the real cuInit.
    let r = unsafe { init(flags) };
    if r != CUDA_SUCCESS {
        return Err(r); // not cached: the caller may retry
    }
    match build(&config) {
        Ok(s) => {
            let p = Box::into_raw(Box::new(s));
            STATE.store(p, Release);
            // SAFETY: registers a handler that is async-signal-safe (see in_forked_child);
            // once, under INIT, since the state is published only once.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
            // SAFETY: just published, never freed.
            Ok(unsafe { &*p })
        }
        Err(failed) => Err(fail(failed.code, &failed.message)),
    }
}

fn fail(code: CUresult, msg: &str) -> CUresult {
    log!(Error, "{msg}");
    FAILED.store(code, Release);
    code
}

/// Why start-up failed: the status `cuInit` returns, and the line logged.
struct Failed {
    code: CUresult,
    message: String,
}

impl From<Refusal> for Failed {
    fn from(r: Refusal) -> Failed {
        Failed {
            code: r.code(),
            message: r.message,
        }
    }
}

fn cu(call: &str, r: CUresult) -> Result<(), Failed> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Failed {
            code: r,
            message: format!("{call} failed during start-up: {}", describe_cu(r)),
        })
    }
}

fn missing(name: &str) -> Failed {
    Failed {
        code: CUDA_ERROR_NOT_FOUND,
        message: format!("the driver has no {name}, which gpuslice needs"),
    }
}

fn build(config: &Config) -> Result<State, Failed> {
    let count_f = real::cuDeviceGetCount().ok_or_else(|| missing("cuDeviceGetCount"))?;
    let get_f = real::cuDeviceGet().ok_or_else(|| missing("cuDeviceGet"))?;
    let total_f = real::cuDeviceTotalMem_v2().ok_or_else(|| missing("cuDeviceTotalMem_v2"))?;
    let mut n: c_int = 0;
    // SAFETY: out-parameters are valid locals throughout.
    cu("cuDeviceGetCount", unsafe { count_f(&mut n) })?;
    let mut found: Vec<Found> = vec![];
    for ord in 0..n {
        let mut dev: CUdevice = 0;
        // SAFETY: the real cuDeviceGet; `dev` is a valid local out-parameter and `ord` is
        // below the count the driver gave.
        cu("cuDeviceGet", unsafe { get_f(&mut dev, ord) })?;
        let mut uuid = CUuuid::default();
        let uf = real::cuDeviceGetUuid_v2()
            .or_else(real::cuDeviceGetUuid)
            .ok_or_else(|| missing("cuDeviceGetUuid"))?;
        // SAFETY: the real cuDeviceGetUuid; `uuid` is a valid local out-parameter, `dev` the
        // driver's.
        cu("cuDeviceGetUuid", unsafe { uf(&mut uuid, dev) })?;
        let mut name = [0 as c_char; 96];
        if let Some(nf) = real::cuDeviceGetName() {
            // SAFETY: the real cuDeviceGetName; it writes at most len - 1 bytes into the local
            // buffer, whose last byte stays NUL.
            unsafe { nf(name.as_mut_ptr(), name.len() as c_int - 1, dev) };
        }
        let name: String = name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        let mut total: usize = 0;
        // SAFETY: the real cuDeviceTotalMem_v2; `total` is a valid local out-parameter.
        cu("cuDeviceTotalMem_v2", unsafe { total_f(&mut total, dev) })?;
        found.push((ord, uuid_text(&uuid), name, total as u64));
    }
    let opened = Ledger::open_for_process(&config.runtime_dir)
        .map_err(|e| Failed::from(Refusal::other(format!("cannot use the node ledger: {e}"))))?;
    let request = admit::request(config, &found);
    let (ledger, node) = match opened {
        Opened::Personal(l) => (l, false),
        Opened::Node(l) => (l, true),
    };
    let ledger: &'static Ledger = Box::leak(Box::new(ledger));
    let admission: &dyn Admission = if node {
        &admit::Node(ledger)
    } else {
        &admit::Personal(ledger)
    };
    let admitted = admission.admit(&request, found)?;
    Ok(State {
        ledger,
        me: admitted.me,
        devices: admitted.devices,
        priority: config.priority,
    })
}
