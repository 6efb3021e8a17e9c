//! Node mode's slow path for memory: the driver refused an allocation that the slice's quota
//! allows, because the device is physically full and the monitor holds this slice's unused
//! reservation there (its "balloon", docs/security.md, "Reserved memory is held"). Ask the
//! monitor over `monitor.sock` to hand back at least the allocation's size from this process's
//! own slice (the monitor decides which slice from its own record of this process), then let
//! the caller try the driver again. Never on the hot path: only after the driver said
//! `CUDA_ERROR_OUT_OF_MEMORY`. Every path that reserves in the slice comes here: the
//! allocations through `super::allocated`, and graph memory (charged when its node is made)
//! when the driver takes it at `cuGraphLaunch` (`super::graph::launch_refused`).

use crate::admit::DevState;
use crate::log::log;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};
use gpuslice_abi::*;
use gpuslice_protocol::{self as protocol, Release};

/// Hand-backs asked for one allocation before its out-of-memory stands (a bypass may take
/// what was handed back before the retry; the second ask gets more).
const ASKS: usize = 2;
/// How long one ask may take (the monitor answers at once; this bounds a stuck one).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The driver refused, with status `r`, an allocation of `bytes` for which `charged` bytes
/// were charged to `dev`'s account (less than `bytes` when a pool's credit paid the rest; 0
/// when the charge stays, as graph memory's at launch). In node mode, when the refusal is out
/// of memory and the account is a slice's quota, the monitor may hold part of this slice's own
/// reservation (balloons): ask for `bytes` and try `alloc` again after each hand-back, at most
/// [`ASKS`] times. Whatever fails in the end has `charged` uncharged and its status returned.
/// Cold and never inlined: the hot path pays only the one comparison of the driver's status it
/// always made.
#[cold]
#[inline(never)]
pub(super) fn refused<T>(
    dev: &DevState,
    bytes: u64,
    charged: u64,
    mut alloc: impl FnMut() -> (CUresult, T),
    r: CUresult,
) -> Result<T, CUresult> {
    let mut r = r;
    if r == CUDA_ERROR_OUT_OF_MEMORY && dev.region.is_some() && dev.account.is_quota() {
        let t0 = std::time::Instant::now();
        for _ in 0..ASKS {
            if !ask(dev, bytes) {
                break;
            }
            let (again, out) = alloc();
            r = again;
            if r == CUDA_SUCCESS {
                // The slow path's cost, for docs/benchmarks.md ("balloon slow path").
                log!(
                    Debug,
                    "slow path for {bytes} bytes on device {}: allocated after {} µs",
                    dev.ordinal,
                    t0.elapsed().as_micros()
                );
                return Ok(out);
            }
            if r != CUDA_ERROR_OUT_OF_MEMORY {
                break;
            }
        }
        log!(
            Debug,
            "slow path for {bytes} bytes on device {}: still refused after {} µs",
            dev.ordinal,
            t0.elapsed().as_micros()
        );
    }
    if charged > 0 {
        dev.account.uncharge(charged);
    }
    Err(r)
}

/// Ask the monitor for `bytes` of this slice's reservation on `dev`: whether to try the driver
/// again (it answered; when it handed nothing back, its tick may have just deflated the balloon
/// by this very charge, so the memory is free now). A monitor that does not answer is said
/// once (its balloons went with it: nothing is held, the device is full for other reasons).
fn ask(dev: &DevState, bytes: u64) -> bool {
    static SAID: AtomicBool = AtomicBool::new(false);
    let Ok(st) = crate::init::state() else {
        return false;
    };
    let release = Release {
        device: dev.uuid.clone(),
        bytes,
    };
    match protocol::ask(st.ledger.dir().fd(), release, TIMEOUT) {
        Ok(answer) => {
            log!(
                Debug,
                "device {} full: asked the monitor for {bytes} bytes of this slice's \
                 reservation: {}",
                dev.ordinal,
                match &answer {
                    Ok(r) => format!("{} bytes handed back", r.bytes),
                    Err(refusal) => format!("refused ({refusal})"),
                }
            );
            answer.is_ok()
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
