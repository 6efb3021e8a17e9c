//! Contexts: a CUDA context takes device memory (a few hundred MiB on a real GPU), so in node
//! mode each one is charged to its process's slice, inside the quota, as a GPU counts its
//! contexts inside its total: a slice looks like a device of its quota's size
//! (docs/configuration.md, "Contexts"). The charge per context is the policy's
//! (`Device::context_bytes`, the monitor's `--context-memory`), taken before the driver makes
//! the context (the primary one when this process first retains it, every `cuCtxCreate`) and
//! returned after the driver lets it go; a slice that cannot afford it gets
//! `CUDA_ERROR_OUT_OF_MEMORY` and one line naming the slice, what it has left and how to
//! raise it. A dead process's charge comes back with the rest of what it charged.
//!
//! Contexts' end also hands the process's compute lease on the device back (`compute/`)
//! before the driver lets go of it.

use crate::admit::DevState;
use crate::compute;
use crate::log::log;
use crate::process::State;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};
use gpuslice_abi::pfn;
use gpuslice_abi::*;
use gpuslice_ledger::human_bytes;
use std::sync::Mutex;

/// The charges of this process's contexts: cold-path state, behind one lock.
struct Charged {
    /// Per CUDA ordinal: references to the primary context this process holds (retains not
    /// yet released), and the bytes its charge took (0: not charged).
    primary: Vec<(u32, u64)>,
    /// Contexts made by `cuCtxCreate*` and the bytes each was charged (its address, as an
    /// integer, and the CUDA ordinal).
    created: Vec<(usize, i32, u64)>,
}

static CHARGED: Mutex<Charged> = Mutex::new(Charged {
    primary: Vec::new(),
    created: Vec::new(),
});

fn charged() -> std::sync::MutexGuard<'static, Charged> {
    CHARGED.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one context is charged on `dev` (0: contexts are not charged there: personal mode, or
/// a monitor that could not measure one).
fn context_bytes(st: &State, dev: &DevState) -> u64 {
    if dev.region.is_none() {
        return 0;
    }
    st.ledger
        .devices()
        .get(dev.ledger_dev)
        .map_or(0, |d| d.context_bytes.load(Relaxed))
}

/// Record `bytes` of this process's charge on `dev` as context (for `gpuslice status`).
fn note(st: &State, dev: &DevState, bytes: i64) {
    if let Some(w) = dev.region.and_then(|r| r.proc_(st.me.slot)) {
        if bytes >= 0 {
            w.contexts.fetch_add(bytes as u64, SeqCst);
        } else {
            let n = bytes.unsigned_abs();
            let _ = w
                .contexts
                .fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n)));
        }
    }
}

/// The line a refused context prints: the slice, what it has left, the charge, and what
/// raises it.
fn refusal(st: &State, dev: &DevState, bytes: u64) -> String {
    let left = dev.account.limit().saturating_sub(dev.account.used());
    let charge = format!(
        "a CUDA context is charged {} on this device (the node's `gpuslice monitor \
         --context-memory`)",
        human_bytes(bytes)
    );
    if dev.account.is_quota() {
        let name = st
            .ledger
            .slice_of(st.me.slot, dev.ledger_dev)
            .and_then(|si| st.ledger.slices().get(si))
            .map_or_else(|| "?".to_string(), |s| s.name.get());
        format!(
            "cannot create a CUDA context on device {} ({}): slice {name:?} has {} of its {} \
             quota left and {charge}, inside the quota as on a GPU; raise the slice's memory \
             (GPUSLICE_MEMORY, `gpuslice run --memory`, or `gpuslice slice set {name} --memory` \
             for an operator's slice) or run fewer processes in it",
            dev.ordinal,
            dev.uuid,
            human_bytes(left),
            human_bytes(dev.account.limit()),
        )
    } else {
        format!(
            "cannot create a CUDA context on device {} ({}): this user's best-effort memory \
             there has {} of the {} the monitor grants it left and {charge}; give the process \
             a quota (GPUSLICE_MEMORY) on a device with room, or run fewer processes without one",
            dev.ordinal,
            dev.uuid,
            human_bytes(left),
            human_bytes(dev.account.limit()),
        )
    }
}

/// Charge a new context on `dev` and make it with `create`: the driver's status (with the
/// refusal line over the slice's budget).
///
/// # Safety
/// `dev` is a device of the started state `st`.
unsafe fn charge_and_create(
    st: &State,
    dev: &DevState,
    bytes: u64,
    create: impl FnMut() -> (CUresult, ()),
) -> CUresult {
    // SAFETY: this function's contract.
    match unsafe { crate::memory::charge_context(dev, bytes, create) } {
        Ok(()) => {
            note(st, dev, bytes as i64);
            CUDA_SUCCESS
        }
        Err(None) => {
            log!(Error, "{}", refusal(st, dev, bytes));
            CUDA_ERROR_OUT_OF_MEMORY
        }
        Err(Some(r)) => r,
    }
}

/// Return a context's charge of `bytes` on `dev`.
fn uncharge(st: &State, dev: &DevState, bytes: u64) {
    if bytes > 0 {
        note(st, dev, -(bytes as i64));
        dev.account.uncharge(bytes);
    }
}

/// The started state and device `d`, with what a context is charged there; `None` to pass
/// the call through untouched (no start-up, a device not ours, contexts not charged).
fn charging(d: CUdevice) -> Option<(&'static State, &'static DevState, u64)> {
    let st = crate::init::state_if_ready()?;
    let dev = st.device(d)?;
    let bytes = context_bytes(st, dev);
    (bytes > 0).then_some((st, dev, bytes))
}

/// `cuDevicePrimaryCtxRetain`: this process's first reference charges the context.
pub unsafe fn primary_ctx_retain(
    real: pfn::cuDevicePrimaryCtxRetain,
    pctx: *mut CUcontext,
    d: CUdevice,
) -> CUresult {
    // Start-up first, as the driver needs cuInit (its refusal stands for the call).
    if let Err(e) = crate::init::state() {
        return e;
    }
    let Some((st, dev, bytes)) = charging(d) else {
        // SAFETY: the handler contract: `real` with the program's arguments.
        return unsafe { real(pctx, d) };
    };
    let mut c = charged();
    let i = dev.ordinal as usize;
    if c.primary.len() <= i {
        c.primary.resize(i + 1, (0, 0));
    }
    if c.primary[i].0 > 0 {
        // SAFETY: as above.
        let r = unsafe { real(pctx, d) };
        if r == CUDA_SUCCESS {
            c.primary[i].0 += 1;
        }
        return r;
    }
    // SAFETY: `dev` is a device of the started state; `real` with the program's arguments.
    let r = unsafe { charge_and_create(st, dev, bytes, || (real(pctx, d), ())) };
    if r == CUDA_SUCCESS {
        c.primary[i] = (1, bytes);
    }
    r
}

/// `cuDevicePrimaryCtxRelease_v2`: the lease goes back first; the last reference returns the
/// context's charge once the driver let it go.
pub unsafe fn primary_ctx_release(
    real: pfn::cuDevicePrimaryCtxRelease_v2,
    dev: CUdevice,
) -> CUresult {
    compute::release_device(dev);
    let mut c = charged();
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(dev) };
    if r == CUDA_SUCCESS {
        if let Some(p) = usize::try_from(dev).ok().and_then(|i| c.primary.get_mut(i)) {
            if p.0 > 0 {
                p.0 -= 1;
                if p.0 == 0 {
                    let bytes = core::mem::take(&mut p.1);
                    give_back(dev, bytes);
                }
            }
        }
    }
    r
}

/// `cuDevicePrimaryCtxReset_v2`: as the last release.
pub unsafe fn primary_ctx_reset(real: pfn::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> CUresult {
    compute::release_device(dev);
    let mut c = charged();
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(dev) };
    if r == CUDA_SUCCESS {
        if let Some(p) = usize::try_from(dev).ok().and_then(|i| c.primary.get_mut(i)) {
            let bytes = core::mem::take(&mut p.1);
            p.0 = 0;
            give_back(dev, bytes);
        }
    }
    r
}

fn give_back(dev: CUdevice, bytes: u64) {
    if let Some(st) = crate::init::state_if_ready() {
        if let Some(d) = st.device(dev) {
            uncharge(st, d, bytes);
        }
    }
}

/// `cuCtxCreate_v2` and its later forms (`create` makes the call): charged before the driver
/// makes it, remembered by address for its destroy.
unsafe fn ctx_create(
    pctx: *mut CUcontext,
    d: CUdevice,
    mut create: impl FnMut() -> CUresult,
) -> CUresult {
    if let Err(e) = crate::init::state() {
        return e;
    }
    let Some((st, dev, bytes)) = charging(d) else {
        return create();
    };
    if pctx.is_null() {
        return create(); // the driver's CUDA_ERROR_INVALID_VALUE
    }
    let mut c = charged();
    // SAFETY: `dev` is a device of the started state; `create` calls the driver.
    let r = unsafe { charge_and_create(st, dev, bytes, || (create(), ())) };
    if r == CUDA_SUCCESS {
        // SAFETY: non-null, and the driver wrote the new context there.
        let ctx = unsafe { *pctx } as usize;
        c.created.push((ctx, d, bytes));
    }
    r
}

/// `cuCtxCreate_v2`.
pub unsafe fn ctx_create_v2(
    real: pfn::cuCtxCreate_v2,
    pctx: *mut CUcontext,
    flags: core::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { ctx_create(pctx, dev, || real(pctx, flags, dev)) }
}

/// `cuCtxCreate_v3` (execution-affinity parameters).
pub unsafe fn ctx_create_v3(
    real: pfn::cuCtxCreate_v3,
    pctx: *mut CUcontext,
    params: *mut core::ffi::c_void,
    n: core::ffi::c_int,
    flags: core::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { ctx_create(pctx, dev, || real(pctx, params, n, flags, dev)) }
}

/// `cuCtxCreate_v4` (creation parameters).
pub unsafe fn ctx_create_v4(
    real: pfn::cuCtxCreate_v4,
    pctx: *mut CUcontext,
    params: *mut core::ffi::c_void,
    flags: core::ffi::c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    unsafe { ctx_create(pctx, dev, || real(pctx, params, flags, dev)) }
}

/// `cuCtxDestroy_v2`: the process's compute lease on the context's device is handed back
/// first (the current context's device: the usual case of destroying the current context);
/// a context this process made returns its charge once the driver destroyed it.
#[inline]
pub unsafe fn ctx_destroy(real: pfn::cuCtxDestroy_v2, ctx: CUcontext) -> CUresult {
    if let Some(dev) = compute::current_device() {
        compute::release_device(dev);
    }
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(ctx) };
    if r == CUDA_SUCCESS && !ctx.is_null() {
        let mut c = charged();
        if let Some(i) = c.created.iter().position(|e| e.0 == ctx as usize) {
            let (_, dev, bytes) = c.created.swap_remove(i);
            drop(c);
            give_back(dev, bytes);
        }
    }
    r
}
