//! CUDA arrays and mipmapped arrays: charged what their descriptor implies (width × height ×
//! depth × channels × element size, summed over mip levels) to the current device, until
//! their destroy. No state of its own.

use super::{charge_and_alloc, free_and_uncharge, written};
use crate::pointers::Handle;
use core::ffi::c_uint;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// Bytes per element of an array format (4 for formats we do not know: never an undercount
/// of the common ones).
fn format_bytes(f: CUarray_format) -> u64 {
    match f {
        CU_AD_FORMAT_UNSIGNED_INT8 | CU_AD_FORMAT_SIGNED_INT8 => 1,
        CU_AD_FORMAT_UNSIGNED_INT16 | CU_AD_FORMAT_SIGNED_INT16 | CU_AD_FORMAT_HALF => 2,
        _ => 4,
    }
}

/// Bytes of an array of these extents (0 height/depth means 1), `None` on overflow.
pub fn array_bytes(
    w: usize,
    h: usize,
    d: usize,
    format: CUarray_format,
    channels: c_uint,
) -> Option<u64> {
    (w as u64)
        .checked_mul(h.max(1) as u64)?
        .checked_mul(d.max(1) as u64)?
        .checked_mul(channels.max(1) as u64)?
        .checked_mul(format_bytes(format))
}

/// Bytes of a mipmapped array: every level halves each extent (down to 1).
pub fn mipmapped_bytes(desc: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> Option<u64> {
    let (mut w, mut h, mut d) = (desc.Width, desc.Height, desc.Depth);
    // Layers and cubemap faces are counted in Depth and do not shrink from level to level.
    let depth_is_count = desc.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.checked_add(array_bytes(w, h, d, desc.Format, desc.NumChannels)?)?;
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        if !depth_is_count {
            d = if d == 0 { 0 } else { (d / 2).max(1) };
        }
    }
    Some(total)
}

/// The array creators' common body: null arguments and a missing context go to the driver (it
/// reports them); otherwise the array is charged its size from the descriptor before `create`
/// (the real creator, writing the handle to `out`) runs.
///
/// # Safety
/// `out` and `desc` are the program's arguments to the creator (null, or its out-pointer and
/// its descriptor), under the handler contract.
#[inline]
unsafe fn create_array<T, D>(
    kind: Handle,
    out: *mut *mut T,
    desc: *const D,
    bytes: impl FnOnce(&D) -> Option<u64>,
    create: impl Fn() -> CUresult,
) -> CUresult {
    let st = ready!();
    if out.is_null() || desc.is_null() {
        return create();
    }
    let dev = current!(st, create());
    // SAFETY: desc is non-null (checked above): the program's descriptor, valid for reads.
    let Some(bytes) = bytes(unsafe { &*desc }) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    // SAFETY: dev is the started state's; out is non-null (checked above), the program's
    // out-pointer.
    unsafe {
        charge_and_alloc(dev, kind, bytes, || {
            let r = create();
            (r, written(r, out).map_or(0, |h| h as u64))
        })
    }
}

/// `cuArrayCreate_v2`.
pub unsafe fn array_create(
    real: pfn::cuArrayCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let bytes =
        |d: &CUDA_ARRAY_DESCRIPTOR| array_bytes(d.Width, d.Height, 1, d.Format, d.NumChannels);
    // SAFETY: the handler contract: `real` and the pointers are the program's.
    unsafe { create_array(Handle::Array, array, desc, bytes, || real(array, desc)) }
}

/// `cuArray3DCreate_v2` (layered arrays: depth = layers).
pub unsafe fn array3d_create(
    real: pfn::cuArray3DCreate_v2,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let bytes = |d: &CUDA_ARRAY3D_DESCRIPTOR| {
        array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels)
    };
    // SAFETY: the handler contract: `real` and the pointers are the program's.
    unsafe { create_array(Handle::Array, array, desc, bytes, || real(array, desc)) }
}

/// `cuArrayDestroy`.
pub unsafe fn array_destroy(real: pfn::cuArrayDestroy, array: CUarray) -> CUresult {
    let st = ready!();
    // SAFETY: the handler contract: `real` with the program's arguments.
    free_and_uncharge(st, Handle::Array, array as u64, || unsafe { real(array) })
}

/// `cuMipmappedArrayCreate`.
pub unsafe fn mipmapped_create(
    real: pfn::cuMipmappedArrayCreate,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let bytes = |d: &CUDA_ARRAY3D_DESCRIPTOR| mipmapped_bytes(d, levels);
    // SAFETY: the handler contract: `real` and the pointers are the program's.
    unsafe {
        create_array(Handle::Mipmapped, array, desc, bytes, || {
            real(array, desc, levels)
        })
    }
}

/// `cuMipmappedArrayDestroy`.
pub unsafe fn mipmapped_destroy(
    real: pfn::cuMipmappedArrayDestroy,
    array: CUmipmappedArray,
) -> CUresult {
    let st = ready!();
    // SAFETY: the handler contract: `real` with the program's arguments.
    free_and_uncharge(st, Handle::Mipmapped, array as u64, || unsafe {
        real(array)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_estimates() {
        assert_eq!(
            array_bytes(1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4),
            Some(16 << 20)
        );
        assert_eq!(
            array_bytes(1024, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1),
            Some(1024)
        );
        assert_eq!(array_bytes(usize::MAX, 2, 1, CU_AD_FORMAT_FLOAT, 1), None);
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 8,
            Height: 8,
            Depth: 0,
            Format: CU_AD_FORMAT_UNSIGNED_INT8,
            NumChannels: 1,
            Flags: 0,
        };
        assert_eq!(mipmapped_bytes(&d, 4), Some(64 + 16 + 4 + 1));
        // Three layers of an 8x8 mipmap: every level keeps all three layers.
        let layered = CUDA_ARRAY3D_DESCRIPTOR {
            Depth: 3,
            Flags: CUDA_ARRAY3D_LAYERED,
            ..d
        };
        assert_eq!(mipmapped_bytes(&layered, 3), Some(3 * (64 + 16 + 4)));
        let cube = CUDA_ARRAY3D_DESCRIPTOR {
            Depth: 6,
            Flags: CUDA_ARRAY3D_CUBEMAP,
            ..d
        };
        assert_eq!(mipmapped_bytes(&cube, 2), Some(6 * (64 + 16)));
        // A true 3D mipmap halves its depth too.
        let vol = CUDA_ARRAY3D_DESCRIPTOR { Depth: 8, ..d };
        assert_eq!(mipmapped_bytes(&vol, 2), Some(512 + 64));
    }
}
