//! Kernel launches: the checks of a launch's shape, the simulated duration of the kernel
//! (`gpuslice_spin` reads its first `u64` parameter), launch configurations and their cluster
//! attribute, and the occupancy the fake answers with. Apart because the launch variants
//! (`cuLaunchKernel`, cooperative, `Ex`, per-thread) and the occupancy calls share it.

use super::args::{arg, put};
use crate::exec::{Op, Stream};
use crate::module::Func;
use crate::runtime::{cur_ctx, CuResult};
use gpuslice_abi::*;
use std::ffi::{c_int, c_uint, c_void};

/// The duration of a launch: `gpuslice_spin` reads its first u64 parameter.
fn kernel_ns(f: &Func, s: &Stream, params: *mut *mut c_void, extra: *mut *mut c_void) -> u64 {
    if !f.spin {
        return s.exec.default_kernel_ns();
    }
    // SAFETY: for gpuslice_spin(u64 ns) the contract is kernelParams[0] -> u64, or an `extra`
    // list of (marker, value) pairs whose BUFFER_POINTER starts with that u64.
    unsafe {
        if !params.is_null() && !(*params).is_null() {
            return (*params as *const u64).read_unaligned();
        }
        if !extra.is_null() {
            let mut i = 0;
            loop {
                let k = *extra.add(i) as usize;
                if k == CU_LAUNCH_PARAM_END {
                    break;
                }
                if k == CU_LAUNCH_PARAM_BUFFER_POINTER {
                    let buf = *extra.add(i + 1) as *const u64;
                    if !buf.is_null() {
                        return buf.read_unaligned();
                    }
                }
                i += 2;
            }
        }
    }
    s.exec.default_kernel_ns()
}

pub(super) fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    h: CUstream,
    per_thread: bool,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<()> {
    cur_ctx()?;
    let f = Func::resolve(f)?;
    if grid.contains(&0)
        || block.contains(&0)
        || block.iter().map(|&b| b as u64).product::<u64>() > 1024
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = Stream::resolve(h, per_thread)?;
    let ns = kernel_ns(f, s, params, extra);
    s.submit(Op::Kernel(ns))
}

pub(super) fn launch_ex(
    cfg: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> CuResult<()> {
    let c = arg(cfg)?;
    launch(
        f,
        [c.gridDimX, c.gridDimY, c.gridDimZ],
        [c.blockDimX, c.blockDimY, c.blockDimZ],
        c.hStream,
        per_thread,
        params,
        extra,
    )
}

/// The number of blocks in a cluster a launch configuration asks for (1 without the attribute).
pub(super) fn cluster_size(cfg: *const CUlaunchConfig) -> CuResult<u32> {
    const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;
    let c = arg(cfg)?;
    let mut size = 1u32;
    for i in 0..c.numAttrs as usize {
        if c.attrs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `attrs` holds `numAttrs` entries by the API contract.
        let a = unsafe { c.attrs.add(i).read_unaligned() };
        if a.id as u32 == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
            let d = |k: usize| {
                u32::from_le_bytes(a.value[4 * k..4 * k + 4].try_into().unwrap_or([1, 0, 0, 0]))
                    .max(1)
            };
            size = d(0) * d(1) * d(2);
        }
    }
    Ok(size)
}

pub(super) fn occupancy_blocks(block: c_int) -> c_int {
    if block <= 0 {
        0
    } else {
        (2048 / block).clamp(1, 32)
    }
}

/// `cuOccupancyMaxPotentialBlockSize(WithFlags)`: the largest block the limit allows, and a
/// grid that fills every SM with it.
pub(super) fn potential_block_size(
    grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    limit: c_int,
) -> CuResult<()> {
    Func::resolve(f)?;
    let b = if limit > 0 { limit.min(1024) } else { 1024 };
    put(grid, 132 * occupancy_blocks(b))?;
    put(block, b)
}
