//! Node mode's slow path for memory: the driver refused an allocation that the slice's quota
//! allows, because the device is physically full and the monitor holds this slice's unused
//! reservation there (its "balloon", docs/security.md, "Reserved memory is held"). Ask the
//! monitor over `monitor.sock` to hand back at least the allocation's size from this process's
//! own slice (the monitor decides which slice from its own record of this process), then let
//! the caller try the driver again. Never on the hot path: only after the driver said
//! `CUDA_ERROR_OUT_OF_MEMORY`.

use crate::init::DevState;
use crate::log::log;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};
use gpuslice_abi::*;
use gpuslice_protocol::{self as protocol, Message};

/// Hand-backs asked for one allocation before its out-of-memory stands (a bypass may take
/// what was handed back before the retry; the second ask gets more).
const ASKS: usize = 2;
/// How long one ask may take (the monitor answers at once; this bounds a stuck one).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Try `alloc` again after each hand-back, at most [`ASKS`] times; what the last attempt
/// gave (`first` when the monitor handed nothing back). Cold and never inlined: the hot path
/// pays one comparison of the driver's status for it.
#[cold]
#[inline(never)]
pub(super) fn retry<T>(
    dev: &DevState,
    bytes: u64,
    alloc: &mut impl FnMut() -> (CUresult, T),
    first: (CUresult, T),
) -> (CUresult, T) {
    let t0 = std::time::Instant::now();
    let mut last = first;
    for _ in 0..ASKS {
        if !ask(dev, bytes) {
            break;
        }
        last = alloc();
        if last.0 != CUDA_ERROR_OUT_OF_MEMORY {
            break;
        }
    }
    // The slow path's cost, for docs/benchmarks.md ("Balloons").
    log!(
        Debug,
        "slow path for {bytes} bytes on device {}: {} after {} µs",
        dev.ordinal,
        if last.0 == CUDA_SUCCESS {
            "allocated"
        } else {
            "still out of memory"
        },
        t0.elapsed().as_micros()
    );
    last
}

/// Ask the monitor for `bytes` of this slice's reservation on `dev`: whether it handed any
/// back. A monitor that does not answer is said once (its balloons went with it: nothing is
/// held, the device is full for other reasons).
fn ask(dev: &DevState, bytes: u64) -> bool {
    static SAID: AtomicBool = AtomicBool::new(false);
    let Ok(st) = crate::init::state() else {
        return false;
    };
    let mut m = Message::new("op", "release");
    m.push("dev", &dev.uuid).push("bytes", &bytes.to_string());
    match protocol::call(st.ledger.dir().fd(), &m, TIMEOUT) {
        Ok((r, _)) => {
            let freed = r.get("ok").and_then(|v| v.parse::<u64>().ok());
            log!(
                Debug,
                "device {} full: asked the monitor for {bytes} bytes of this slice's \
                 reservation: {}",
                dev.ordinal,
                match (freed, r.get("err")) {
                    (Some(n), _) => format!("{n} bytes handed back"),
                    (None, e) => format!("refused ({})", e.unwrap_or("?")),
                }
            );
            freed.is_some_and(|n| n > 0)
        }
        Err(e) => {
            if !SAID.swap(true, Relaxed) {
                log!(
                    Warn,
                    "device {} is full and the node's monitor does not answer ({e}): reserved \
                     memory is not held for any slice until it is back",
                    dev.ordinal
                );
            }
            false
        }
    }
}
