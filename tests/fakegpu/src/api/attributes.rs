//! What the fake answers about itself: the driver version, device attributes (an H200's),
//! the SM resource of green-context queries, function attributes and names, and pointer
//! attributes read from the registry of live ranges. Apart because these are the fake's
//! constants, kept in one place, and the exports only forward to them.

use super::args::put;
use crate::mem::{self, Kind};
use crate::module::Func;
use crate::runtime::{self as rtm, CuResult};
use gpuslice_abi::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// The CUDA version the fake driver reports (`cuDriverGetVersion`, NVML):
/// `FAKEGPU_DRIVER_VERSION`, default [`crate::config::DEFAULT_DRIVER_VERSION`].
pub fn driver_version() -> c_int {
    rtm::config()
        .map(|c| c.driver_version)
        .unwrap_or(crate::config::DEFAULT_DRIVER_VERSION)
}

pub(crate) fn device_attribute(a: CUdevice_attribute, d: &rtm::Device) -> CuResult<c_int> {
    Ok(match a {
        1 => 1024,                 // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,             // MAX_BLOCK_DIM_X/Y
        4 => 64,                   // MAX_BLOCK_DIM_Z
        5 => i32::MAX,             // MAX_GRID_DIM_X
        6 | 7 => 65535,            // MAX_GRID_DIM_Y/Z
        8 => 49152,                // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                // TOTAL_CONSTANT_MEMORY
        10 => 32,                  // WARP_SIZE
        11 => i32::MAX,            // MAX_PITCH
        12 => 65536,               // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,           // CLOCK_RATE kHz
        14 => 512,                 // TEXTURE_ALIGNMENT
        15 => 1,                   // GPU_OVERLAP
        16 => 132,                 // MULTIPROCESSOR_COUNT
        17 | 18 => 0,              // KERNEL_EXEC_TIMEOUT, INTEGRATED
        19 => 1,                   // CAN_MAP_HOST_MEMORY
        20 => 0,                   // COMPUTE_MODE default
        30 => 512,                 // SURFACE_ALIGNMENT
        31 => 1,                   // CONCURRENT_KERNELS
        32 => 1,                   // ECC_ENABLED
        33 => d.phys as c_int + 1, // PCI_BUS_ID
        34 => 0,                   // PCI_DEVICE_ID
        35 => 0,                   // TCC_DRIVER
        36 => 2_619_000,           // MEMORY_CLOCK_RATE kHz
        37 => 6144,                // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,            // L2_CACHE_SIZE
        39 => 2048,                // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                   // ASYNC_ENGINE_COUNT
        41 => 1,                   // UNIFIED_ADDRESSING
        50 => 0,                   // PCI_DOMAIN_ID
        51 => 32,                  // TEXTURE_PITCH_ALIGNMENT
        75 => 9,                   // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                   // COMPUTE_CAPABILITY_MINOR
        78..=80 => 1,              // STREAM_PRIORITIES, GLOBAL/LOCAL_L1_CACHE
        81 => 233_472,             // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,               // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                   // MANAGED_MEMORY
        84 | 85 => 0,              // MULTI_GPU_BOARD(_GROUP_ID)
        86 => 0,                   // HOST_NATIVE_ATOMIC_SUPPORTED
        87 => 2,                   // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        88 => 0,                   // PAGEABLE_MEMORY_ACCESS
        89..=91 => 1, // CONCURRENT_MANAGED_ACCESS, PREEMPTION, HOST_POINTER_FOR_REGISTERED
        92..=94 => 1, // stream mem ops
        95 => 1,      // COOPERATIVE_LAUNCH
        96 => 0,      // COOPERATIVE_MULTI_DEVICE_LAUNCH
        97 => 232_448, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 | 99 => 1, // CAN_FLUSH_REMOTE_WRITES, HOST_REGISTER_SUPPORTED
        100 | 101 => 0,
        102 | 103 => 1,   // VIRTUAL_MEMORY_MANAGEMENT, POSIX_FD handles
        104 | 105 => 0,   // WIN32 handles
        106 => 32,        // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => 1,         // GENERIC_COMPRESSION_SUPPORTED
        108 => 30 << 20,  // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 128 << 20, // MAX_ACCESS_POLICY_WINDOW_SIZE
        110 => 1,
        111 => 1024, // RESERVED_SHARED_MEMORY_PER_BLOCK
        112 | 113 => 1,
        114 => 0,       // TIMELINE_SEMAPHORE_INTEROP
        115 => 1,       // MEMORY_POOLS_SUPPORTED
        116 | 117 => 0, // GPU_DIRECT_RDMA
        118 => 0,
        119 => 1, // MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd
        120 => 1, // CLUSTER_LAUNCH
        121 => 0,
        122 => 1, // CAN_USE_64_BIT_STREAM_MEM_OPS
        123 => 1,
        124 => 1, // DMA_BUF_SUPPORTED
        125 | 126 => 0,
        127 => 1, // MEM_SYNC_DOMAIN_COUNT..
        128 => 4,
        129 => 0,
        130 => 0,
        131 => 0, // MPS_ENABLED
        132 => 0,
        0 | 21..=29 | 42..=49 | 52..=74 | 77 => 65536,
        133..=150 => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// A `CUdevResource` (144 bytes in CUDA 12.4..13.x: the type, 92 bytes of padding, the union at
/// 96, in 13.x a next pointer at 136) describing the whole device's SMs; only
/// `CU_DEV_RESOURCE_TYPE_SM` (1) is modelled.
pub(super) fn sm_resource(r: *mut c_void, ty: c_int) -> CuResult<()> {
    if r.is_null() || ty != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes room for one CUdevResource (144 bytes).
    unsafe {
        let b = r as *mut u8;
        std::ptr::write_bytes(b, 0, 144);
        (b as *mut u32).write_unaligned(1);
        let sm = b.add(96) as *mut u32;
        sm.write_unaligned(132); // smCount
        sm.add(1).write_unaligned(8); // minSmPartitionSize
        sm.add(2).write_unaligned(2); // smCoscheduledAlignment
    }
    Ok(())
}

pub(super) fn func_attribute(a: CUfunction_attribute) -> CuResult<c_int> {
    Ok(match a {
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        | CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES
        | CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => 0,
        CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
        CU_FUNC_ATTRIBUTE_PTX_VERSION | CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
        7 => 0,
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => 49152,
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
        10..=15 => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

pub(super) fn func_name(f: &'static Func) -> *const c_char {
    static NAMES: std::sync::Mutex<Vec<(usize, std::ffi::CString)>> =
        std::sync::Mutex::new(Vec::new());
    let mut g = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let key = f as *const Func as usize;
    if let Some((_, s)) = g.iter().find(|(k, _)| *k == key) {
        return s.as_ptr();
    }
    let s = std::ffi::CString::new(f.name.clone()).unwrap_or_default();
    let p = s.as_ptr();
    g.push((key, s));
    p
}

pub(super) fn pointer_attribute(
    data: *mut c_void,
    attr: CUpointer_attribute,
    p: CUdeviceptr,
) -> CuResult<()> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let found = mem::lookup(p);
    let vmm = mem::vmm_lookup(p);
    let (start, size, kind, dev, ctx) = match (found, vmm) {
        (Some((s, r)), _) => (s, r.size, Some(r.kind), r.dev, r.ctx),
        (None, Some((s, n))) => (s, n, None, 0, 0),
        (None, None) => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let host = matches!(kind, Some(Kind::Host) | Some(Kind::Registered));
    match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT => put(data as *mut CUcontext, ctx as CUcontext),
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE => put(
            data as *mut c_uint,
            if host {
                CU_MEMORYTYPE_HOST
            } else {
                CU_MEMORYTYPE_DEVICE
            },
        ),
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER => put(data as *mut CUdeviceptr, p),
        CU_POINTER_ATTRIBUTE_HOST_POINTER => {
            if host || kind == Some(Kind::Managed) {
                put(data as *mut *mut c_void, p as *mut c_void)
            } else {
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => put(data as *mut c_int, 1),
        CU_POINTER_ATTRIBUTE_BUFFER_ID => put(data as *mut u64, start),
        CU_POINTER_ATTRIBUTE_IS_MANAGED => {
            put(data as *mut c_int, (kind == Some(Kind::Managed)) as c_int)
        }
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => put(data as *mut c_int, dev as c_int),
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => put(data as *mut CUdeviceptr, start),
        CU_POINTER_ATTRIBUTE_RANGE_SIZE => put(data as *mut usize, size as usize),
        CU_POINTER_ATTRIBUTE_MAPPED => put(data as *mut c_int, 1),
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => put(
            data as *mut usize,
            match kind {
                Some(Kind::Pool(p)) => p,
                _ => 0,
            },
        ),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
