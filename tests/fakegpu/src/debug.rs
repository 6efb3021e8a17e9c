//! The fake's own log (`FAKEGPU_DEBUG`): at 1, what a client asked for that the fake does not
//! model (a failing driver call, a null `cuGetProcAddress` answer, an unknown export table, a
//! stub slot); at 2, every driver call too. Apart because every export logs through it, and a
//! trace costs one relaxed load when it is off.

use crate::config::config;
use gpuslice_abi::*;
use std::sync::atomic::Ordering::*;

fn debug_enabled() -> bool {
    config().map(|c| c.debug > 0).unwrap_or(false)
}

/// 0: not read yet; else the debug level + 1.
static TRACE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Trace a driver call (`FAKEGPU_DEBUG=2`); one relaxed load when tracing is off.
#[inline]
pub fn trace(name: &str) {
    let mut t = TRACE.load(Relaxed);
    if t == 0 {
        t = config().map(|c| c.debug).unwrap_or(0) + 1;
        TRACE.store(t, Relaxed);
    }
    if t > 2 {
        eprintln!("fakegpu: trace: {name}");
    }
}

/// Log at debug level (`FAKEGPU_DEBUG=1`): something the fake does not model was asked for.
pub(crate) fn debug(what: std::fmt::Arguments) {
    if debug_enabled() {
        eprintln!("fakegpu: debug: {what}");
    }
}

/// Log an entry point's error at debug level (`FAKEGPU_DEBUG=1`): the first thing to read when
/// a framework fails on the fake.
#[cold]
pub fn debug_error(name: &str, r: CUresult) {
    debug(format_args!(
        "{name} -> {r} ({})",
        cu_result_name(r).unwrap_or("?")
    ));
}

/// Log a `cuGetProcAddress` lookup that found nothing (`FAKEGPU_DEBUG=1`).
#[cold]
pub fn debug_missing(name: &str, version: i32, flags: u64, status: i32) {
    debug(format_args!(
        "cuGetProcAddress({name}, {version}, flags {flags}): not found (status {status})"
    ));
}
