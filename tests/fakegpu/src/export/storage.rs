//! `c693336e`: the export table of per-context storage, the runtime's (key, value, destructor)
//! slots on each context, over each context's `CtxStorage` (`ctx_storage.rs`).

use super::{stub, Table};
use crate::api::guard;
use crate::ctx_storage::Dtor;
use crate::runtime::{self as rtm, Ctx};
use gpuslice_abi::*;
use std::ffi::c_void;

/// The context a storage call names: the given one, or the current one for null.
fn storage_ctx(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    if ctx.is_null() {
        rtm::cur_ctx()
    } else {
        Ctx::from_handle(ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }
}

unsafe extern "C" fn storage_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Dtor,
) -> CUresult {
    guard(|| {
        let c = storage_ctx(ctx)?;
        let d = dtor.map_or(0, |f| f as usize);
        if c.storage.put(key as usize, value as usize, d) {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    })
}

unsafe extern "C" fn storage_del(ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard(|| {
        let c = storage_ctx(ctx)?;
        if c.storage.del(key as usize) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    })
}

/// `get(void **value, ctx, key)`: on the runtime's path of nearly every call, so it takes no
/// lock and allocates nothing; a missing key fails (the runtime then calls `put`).
unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    if value.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let c = match storage_ctx(ctx) {
        Ok(c) => c,
        Err(e) => return e,
    };
    match c.storage.get(key as usize) {
        Some(v) => {
            // SAFETY: non-null out-pointer from the runtime.
            unsafe { value.write(v as *mut c_void) };
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

type PutFn = unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void, Dtor) -> CUresult;
type DelFn = unsafe extern "C" fn(CUcontext, *mut c_void) -> CUresult;
type GetFn = unsafe extern "C" fn(*mut *mut c_void, CUcontext, *mut c_void) -> CUresult;

/// No size word: the three functions first.
pub static STORAGE: Table<6> = Table([
    fp!(storage_put as PutFn),
    fp!(storage_del as DelFn),
    fp!(storage_get as GetFn),
    fp!(stub::<3, 3> as extern "C" fn() -> CUresult),
    fp!(stub::<3, 4> as extern "C" fn() -> CUresult),
    fp!(stub::<3, 5> as extern "C" fn() -> CUresult),
]);
