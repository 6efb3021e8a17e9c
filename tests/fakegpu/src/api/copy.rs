//! Copies and memsets as the executor runs them: the flat copies' and memsets' checks, and the
//! decoding of `CUDA_MEMCPY2D`/`CUDA_MEMCPY3D` descriptors (host, device, unified or array
//! sides, pitches and offsets) into one [`Op::Copy`]. Apart because the synchronous and
//! asynchronous, per-thread and legacy variants of every copy all come down to these.

use super::args::arg;
use crate::exec::{Copy3D, Memset, Op};
use crate::mem;
use crate::runtime::{cur_ctx, CuResult};
use gpuslice_abi::*;
use std::ffi::c_void;

/// A device-side range must lie in memory the fake handed out.
fn check_dev(ptr: u64, len: usize) -> CuResult<()> {
    if len == 0 {
        return Ok(());
    }
    if let Some((s, r)) = mem::lookup(ptr) {
        if ptr + len as u64 <= s + r.map_len as u64 {
            return Ok(());
        }
    }
    if mem::vmm_covers(ptr, len as u64) {
        return Ok(());
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

pub(super) fn copy_op(
    dst: u64,
    src: u64,
    n: usize,
    check_dst: bool,
    check_src: bool,
) -> CuResult<Op> {
    cur_ctx()?;
    if check_dst {
        check_dev(dst, n)?;
    }
    if check_src {
        check_dev(src, n)?;
    }
    if n > 0 && (dst == 0 || src == 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Copy(Copy3D::flat(dst as usize, src as usize, n)))
}

pub(super) fn set_op(
    dst: u64,
    pitch: usize,
    value: u32,
    width: usize,
    height: usize,
    elem: u8,
) -> CuResult<Op> {
    cur_ctx()?;
    let pitch = if height <= 1 {
        width * elem as usize
    } else {
        pitch
    };
    if height > 0 && width > 0 {
        check_dev(dst, pitch * (height - 1) + width * elem as usize)?;
    }
    if !dst.is_multiple_of(elem as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Op::Set(Memset {
        dst: dst as usize,
        pitch,
        width,
        height,
        elem,
        value,
    }))
}

/// Address and row pitch of one side of a 2D/3D copy; a zero pitch means rows of `width`
/// bytes, packed.
fn side(
    ty: CUmemorytype,
    host: *const c_void,
    dev: CUdeviceptr,
    arr: CUarray,
    pitch: usize,
    width: usize,
) -> CuResult<(usize, usize)> {
    let (addr, pitch) = match ty {
        CU_MEMORYTYPE_HOST => (host as usize, pitch),
        CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_UNIFIED => (dev as usize, pitch),
        CU_MEMORYTYPE_ARRAY => {
            let a = mem::array_of(arr)?;
            (a.ptr as usize, mem::array_pitch(a))
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    Ok((addr, if pitch == 0 { width } else { pitch }))
}

/// `(address, pitch)` of the source and destination of a `CUDA_MEMCPY2D` or `CUDA_MEMCPY3D`
/// (the two share these field names); returns early with the error of a bad side.
macro_rules! copy_sides {
    ($c:expr) => {{
        let c = &$c;
        let w = c.WidthInBytes;
        (
            side(
                c.srcMemoryType,
                c.srcHost,
                c.srcDevice,
                c.srcArray,
                c.srcPitch,
                w,
            )?,
            side(
                c.dstMemoryType,
                c.dstHost,
                c.dstDevice,
                c.dstArray,
                c.dstPitch,
                w,
            )?,
        )
    }};
}

pub(super) fn copy2d_op(p: *const CUDA_MEMCPY2D) -> CuResult<Op> {
    cur_ctx()?;
    let c = arg(p)?;
    let ((s, sp), (d, dp)) = copy_sides!(c);
    Ok(Op::Copy(Copy3D {
        dst: d + c.dstY * dp + c.dstXInBytes,
        dst_pitch: dp,
        dst_height: c.Height.max(1),
        src: s + c.srcY * sp + c.srcXInBytes,
        src_pitch: sp,
        src_height: c.Height.max(1),
        width: c.WidthInBytes,
        height: c.Height,
        depth: 1,
    }))
}

pub(super) fn copy3d_op(p: *const CUDA_MEMCPY3D) -> CuResult<Op> {
    cur_ctx()?;
    let c = arg(p)?;
    let ((s, sp), (d, dp)) = copy_sides!(c);
    let sh = if c.srcHeight == 0 {
        c.Height.max(1)
    } else {
        c.srcHeight
    };
    let dh = if c.dstHeight == 0 {
        c.Height.max(1)
    } else {
        c.dstHeight
    };
    Ok(Op::Copy(Copy3D {
        dst: d + (c.dstZ * dh + c.dstY) * dp + c.dstXInBytes,
        dst_pitch: dp,
        dst_height: dh,
        src: s + (c.srcZ * sh + c.srcY) * sp + c.srcXInBytes,
        src_pitch: sp,
        src_height: sh,
        width: c.WidthInBytes,
        height: c.Height.max(1),
        depth: c.Depth.max(1),
    }))
}
