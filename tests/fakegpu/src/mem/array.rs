//! Arrays (`cuArrayCreate`, `cuArray3DCreate`, `cuMipmappedArrayCreate`): a counted linear
//! backing store with its descriptor, sized as the shim charges for the same descriptor. Apart
//! because an array is a handle of its own, with a layout the copies read.

use super::device::{alloc, free_now};
use super::ranges::{ranges, Kind};
use crate::runtime::{Ctx, CuResult};
use gpuslice_abi::*;

const ARRAY_MAGIC: u64 = 0xA77A_0000_0000_FA4E;

/// An array: a counted linear buffer with its descriptor.
#[repr(C)]
pub struct Array {
    magic: u64,
    /// Backing store.
    pub ptr: u64,
    /// Its 3D descriptor.
    pub desc: CUDA_ARRAY3D_DESCRIPTOR,
}

/// Bytes per element of an array format.
pub fn format_bytes(f: CUarray_format) -> Option<u64> {
    Some(match f {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

/// `cuArrayCreate` / `cuArray3DCreate` (`levels` 1) and `cuMipmappedArrayCreate`: the backing
/// store holds every level, each halving every non-zero extent (floor, at least 1), so the
/// count matches what the shim charges for the same descriptor.
pub fn array_create(
    ctx: &'static Ctx,
    d: CUDA_ARRAY3D_DESCRIPTOR,
    levels: u32,
) -> CuResult<&'static Array> {
    let eb = format_bytes(d.Format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if d.Width == 0 || levels == 0 || !matches!(d.NumChannels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let half = |e: usize| if e == 0 { 0 } else { (e / 2).max(1) };
    let (mut w, mut h, mut z) = (d.Width, d.Height, d.Depth);
    let mut bytes = 0u64;
    for _ in 0..levels {
        let level = (w as u64)
            .checked_mul(h.max(1) as u64)
            .and_then(|v| v.checked_mul(z.max(1) as u64))
            .and_then(|v| v.checked_mul(eb * d.NumChannels as u64));
        bytes = level
            .and_then(|l| bytes.checked_add(l))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // Layers and cubemap faces (counted in Depth) stay whole at every level.
        let layers = d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
        (w, h, z) = (half(w), half(h), if layers { z } else { half(z) });
    }
    let ptr = alloc(ctx, bytes, Kind::Array)?;
    Ok(Box::leak(Box::new(Array {
        magic: ARRAY_MAGIC,
        ptr,
        desc: d,
    })))
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Array {
    const MAGIC: u64 = ARRAY_MAGIC;
}

/// The array a handle names (`CUarray` or `CUmipmappedArray`); its backing range shows it has
/// not been destroyed.
pub fn array_of(h: CUarray) -> CuResult<&'static Array> {
    let a = crate::handle::resolve::<Array>(h as *const std::ffi::c_void)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    match ranges().get(&a.ptr) {
        Some(r) if r.kind == Kind::Array => Ok(a),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// `cuArrayDestroy`.
pub fn array_destroy(h: CUarray) -> CuResult<()> {
    let a = array_of(h)?;
    free_now(a.ptr);
    Ok(())
}

/// Row pitch of an array's linear backing store.
pub fn array_pitch(a: &Array) -> usize {
    a.desc.Width * a.desc.NumChannels as usize * format_bytes(a.desc.Format).unwrap_or(1) as usize
}
