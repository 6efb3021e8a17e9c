//! The names and descriptions of result codes (`cuGetErrorName`, `cuGetErrorString`), as
//! static C strings. Apart because the names come from `gpuslice_abi`'s one list, built into
//! C strings once, while the descriptions are the driver's own wording.

use super::args::{put, put_opt};
use crate::runtime::CuResult;
use gpuslice_abi::*;
use std::ffi::{c_char, CStr};

pub(super) fn error_string(e: CUresult) -> Option<&'static CStr> {
    Some(match e {
        CUDA_SUCCESS => c"no error",
        CUDA_ERROR_INVALID_VALUE => c"invalid argument",
        CUDA_ERROR_OUT_OF_MEMORY => c"out of memory",
        CUDA_ERROR_NOT_INITIALIZED => c"initialization error",
        CUDA_ERROR_NO_DEVICE => c"no CUDA-capable device is detected",
        CUDA_ERROR_INVALID_DEVICE => c"invalid device ordinal",
        CUDA_ERROR_INVALID_IMAGE => c"device kernel image is invalid",
        CUDA_ERROR_INVALID_CONTEXT => c"invalid device context",
        CUDA_ERROR_FILE_NOT_FOUND => c"file not found",
        CUDA_ERROR_INVALID_HANDLE => c"invalid resource handle",
        CUDA_ERROR_ILLEGAL_STATE => c"the operation cannot be performed in the present state",
        CUDA_ERROR_NOT_FOUND => c"named symbol not found",
        CUDA_ERROR_NOT_READY => c"device not ready",
        CUDA_ERROR_NOT_SUPPORTED => c"operation not supported",
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            c"operation not permitted when stream is capturing"
        }
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
            c"operation failed due to a previous error during capture"
        }
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => {
            c"part or all of the requested memory range is already mapped"
        }
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => {
            c"pointer does not correspond to a registered memory region"
        }
        CUDA_ERROR_OPERATING_SYSTEM => c"OS call failed or operation not supported on this OS",
        CUDA_ERROR_UNKNOWN => c"unknown error",
        _ => return None,
    })
}

/// `cuGetErrorName` wants a static C string: the names of result.rs, NUL-terminated once.
pub(super) fn error_name(e: CUresult) -> Option<*const c_char> {
    static NAMES: std::sync::OnceLock<std::collections::HashMap<CUresult, std::ffi::CString>> =
        std::sync::OnceLock::new();
    let m = NAMES.get_or_init(|| {
        (0..1000)
            .filter_map(|c| Some((c, std::ffi::CString::new(cu_result_name(c)?).ok()?)))
            .collect()
    });
    m.get(&e).map(|s| s.as_ptr())
}

/// Write a name or description found for a result code; an unknown code writes null and is
/// `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn put_text(out: *mut *const c_char, text: Option<*const c_char>) -> CuResult<()> {
    match text {
        Some(p) => put(out, p),
        None => {
            put_opt(out, std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}
