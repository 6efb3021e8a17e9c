//! The C boundary the exports share: running a body without unwinding into C ([`guard`]),
//! writing out-parameters and strings, reading structs by value, and the arguments several
//! exports resolve alike (a context or the current one, a CUDA 13 pool location, a file path,
//! a module image, a module global's address and size). Apart from the table so that every
//! export reads and writes its caller's memory through the same few null checks.

use crate::module;
use crate::runtime::{cur_ctx, rt, Ctx, CuResult};
use gpuslice_abi::*;
use std::ffi::{c_char, c_int, c_void, CStr};

/// Run an entry point's body; a panic becomes `CUDA_ERROR_UNKNOWN`, never unwinds into C.
pub fn guard(f: impl FnOnce() -> CuResult<()>) -> CUresult {
    crate::catch(CUDA_SUCCESS, CUDA_ERROR_UNKNOWN, f)
}

/// Write an out-parameter; null is `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn put<T>(p: *mut T, v: T) -> CuResult<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the API contract makes it valid for one T.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// An optional out-parameter.
pub(super) fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: as in `put`.
        unsafe { p.write_unaligned(v) };
    }
}

/// A C string argument.
pub(super) fn cstr<'a>(p: *const c_char) -> CuResult<&'a str> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the API contract makes it a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)
}

/// Copy a string into a caller buffer of `len` bytes (truncated, NUL-terminated).
pub(super) fn put_str(buf: *mut c_char, len: c_int, s: &str) -> CuResult<()> {
    if buf.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// A struct argument read by value; null is `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn arg<T>(p: *const T) -> CuResult<T> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the API contract makes it a valid T.
    Ok(unsafe { p.read_unaligned() })
}

pub(super) fn ctx_or_current(c: CUcontext) -> CuResult<&'static Ctx> {
    if c.is_null() {
        cur_ctx()
    } else {
        rt()?;
        let c = Ctx::from_handle(c).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        crate::runtime::usable(c)?;
        Ok(c)
    }
}

/// The device a CUDA 13 pool location names: device locations of pinned memory only (the
/// fake has no host or managed pools).
pub(super) fn location_device(
    loc: *mut CUmemLocation,
    ty: CUmemAllocationType,
) -> CuResult<CUdevice> {
    rt()?;
    let l = arg(loc as *const CUmemLocation)?;
    if ty != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if l.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(l.id)
}

pub(super) fn load_module(out: *mut CUmodule, img: *const c_void) -> CuResult<()> {
    let c = cur_ctx()?;
    // SAFETY: the API contract makes `img` a valid image.
    let bytes = unsafe { module::image_bytes(img as *const u8)? };
    put(out, module::load(Some(c), bytes)?.handle())
}

pub(super) fn read_file(path: *const c_char) -> CuResult<Vec<u8>> {
    std::fs::read(cstr(path)?).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)
}

/// Write a module global's address and size, each an optional out-parameter
/// (`cuModuleGetGlobal`, `cuLibraryGetGlobal`, `cuLibraryGetManaged`).
pub(super) fn put_global(
    p: *mut CUdeviceptr,
    bytes: *mut usize,
    m: &'static module::Module,
    name: *const c_char,
) -> CuResult<()> {
    let (ptr, size) = m.global(cstr(name)?)?;
    put_opt(p, ptr);
    put_opt(bytes, size as usize);
    Ok(())
}
