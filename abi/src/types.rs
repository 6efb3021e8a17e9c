//! Handles, enums and structs of the driver API and NVML.

#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use core::ffi::{c_char, c_int, c_uint, c_void};

/// A device ordinal, as `cuDeviceGet` returns it.
pub type CUdevice = c_int;
/// A device address (64-bit since CUDA 3.2; the `_v2` entry points).
pub type CUdeviceptr = u64;

macro_rules! opaque_handles {
    ($($name:ident),* $(,)?) => { $(
        /// An opaque driver handle (a pointer-sized value the driver hands out).
        pub type $name = *mut c_void;
    )* };
}
opaque_handles!(
    CUcontext,
    CUmodule,
    CUfunction,
    CUlibrary,
    CUkernel,
    CUstream,
    CUevent,
    CUarray,
    CUmipmappedArray,
    CUgraph,
    CUgraphExec,
    CUgraphNode,
    CUmemoryPool,
    CUlinkState,
    CUhostFn_userData,
    nvmlDevice_t
);

/// `CUmemGenericAllocationHandle`: a 64-bit VMM allocation handle.
pub type CUmemGenericAllocationHandle = u64;
/// `CUhostFn`: a host callback enqueued with `cuLaunchHostFunc`.
pub type CUhostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

// --- cuGetProcAddress ---------------------------------------------------------------------

/// `CUdriverProcAddress_flags`.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`, what `cuGetProcAddress_v2` writes to `symbolStatus`. A C
/// enum: spelled `int` here, the type of its enumerators (the same size, alignment and
/// registers as the `unsigned int` GCC picks for it).
pub type CUdriverProcAddressQueryResult = c_int;
pub const CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: CUdriverProcAddressQueryResult = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: CUdriverProcAddressQueryResult = 2;

// --- memory --------------------------------------------------------------------------------

/// `CUarray_format` is a plain C enum.
pub type CUarray_format = c_uint;
pub const CU_AD_FORMAT_UNSIGNED_INT8: CUarray_format = 0x01;
pub const CU_AD_FORMAT_UNSIGNED_INT16: CUarray_format = 0x02;
pub const CU_AD_FORMAT_UNSIGNED_INT32: CUarray_format = 0x03;
pub const CU_AD_FORMAT_SIGNED_INT8: CUarray_format = 0x08;
pub const CU_AD_FORMAT_SIGNED_INT16: CUarray_format = 0x09;
pub const CU_AD_FORMAT_SIGNED_INT32: CUarray_format = 0x0a;
pub const CU_AD_FORMAT_HALF: CUarray_format = 0x10;
pub const CU_AD_FORMAT_FLOAT: CUarray_format = 0x20;

/// `CUDA_ARRAY_DESCRIPTOR` (v2: `size_t` extents).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR::Flags`: `Depth` counts layers, not a third dimension.
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
/// `CUDA_ARRAY3D_DESCRIPTOR::Flags`: six faces (times the layers, if layered) in `Depth`.
pub const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;

/// `CUmemorytype`.
pub type CUmemorytype = c_uint;
pub const CU_MEMORYTYPE_HOST: CUmemorytype = 1;
pub const CU_MEMORYTYPE_DEVICE: CUmemorytype = 2;
pub const CU_MEMORYTYPE_ARRAY: CUmemorytype = 3;
pub const CU_MEMORYTYPE_UNIFIED: CUmemorytype = 4;

/// `CUDA_MEMCPY2D` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEMCPY2D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcMemoryType: CUmemorytype,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: CUmemorytype,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}

/// `CUDA_MEMCPY3D` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEMCPY3D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcZ: usize,
    pub srcLOD: usize,
    pub srcMemoryType: CUmemorytype,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub reserved0: *mut c_void,
    pub srcPitch: usize,
    pub srcHeight: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstZ: usize,
    pub dstLOD: usize,
    pub dstMemoryType: CUmemorytype,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub reserved1: *mut c_void,
    pub dstPitch: usize,
    pub dstHeight: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
    pub Depth: usize,
}

/// `CUmemLocationType`.
pub type CUmemLocationType = c_uint;
pub const CU_MEM_LOCATION_TYPE_INVALID: CUmemLocationType = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: CUmemLocationType = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: CUmemLocationType = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: CUmemLocationType = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: CUmemLocationType = 4;

/// `CUmemAllocationType`.
pub type CUmemAllocationType = c_uint;
pub const CU_MEM_ALLOCATION_TYPE_INVALID: CUmemAllocationType = 0;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: CUmemAllocationType = 1;

/// `CUmemAllocationHandleType`.
pub type CUmemAllocationHandleType = c_uint;
pub const CU_MEM_HANDLE_TYPE_NONE: CUmemAllocationHandleType = 0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    pub type_: CUmemLocationType,
    pub id: c_int,
}

/// The `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAllocationPropFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: CUmemAllocationType,
    pub requestedHandleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocationPropFlags,
}

/// `CUmemAccess_flags`.
pub type CUmemAccess_flags = c_uint;
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: CUmemAccess_flags = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: CUmemAccess_flags = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: CUmemAccess_flags = 3;

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: CUmemAccess_flags,
}

/// `CUmemAllocationGranularity_flags`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 1;

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub allocType: CUmemAllocationType,
    pub handleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUmemPool_attribute`.
pub type CUmemPool_attribute = c_uint;
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: CUmemPool_attribute = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: CUmemPool_attribute = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: CUmemPool_attribute = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: CUmemPool_attribute = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: CUmemPool_attribute = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: CUmemPool_attribute = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: CUmemPool_attribute = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: CUmemPool_attribute = 8;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1), for graph memory nodes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUgraphNodeType` (the values gpuslice reads).
pub type CUgraphNodeType = c_uint;
pub const CU_GRAPH_NODE_TYPE_GRAPH: CUgraphNodeType = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: CUgraphNodeType = 10;

/// `CUgraphChildGraphNodeOwnership`.
pub type CUgraphChildGraphNodeOwnership = c_uint;
pub const CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE: CUgraphChildGraphNodeOwnership = 0;
pub const CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE: CUgraphChildGraphNodeOwnership = 1;

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_CHILD_GRAPH_NODE_PARAMS {
    pub graph: CUgraph,
    pub ownership: CUgraphChildGraphNodeOwnership,
}

/// The parameter union of `CUgraphNodeParams`; only the members gpuslice reads are named.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUgraphNodeParamsUnion {
    pub reserved1: [i64; 29],
    pub graph: CUDA_CHILD_GRAPH_NODE_PARAMS,
    pub alloc: CUDA_MEM_ALLOC_NODE_PARAMS,
}

/// `CUgraphNodeParams`, for `cuGraphAddNode(_v2)` (the anonymous union is `u`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUgraphNodeParams {
    pub type_: CUgraphNodeType,
    pub reserved0: [c_int; 3],
    pub u: CUgraphNodeParamsUnion,
    pub reserved2: i64,
}

/// `CUmemAttach_flags` for `cuMemAllocManaged`.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
pub const CU_MEM_ATTACH_HOST: c_uint = 0x2;
pub const CU_MEM_ATTACH_SINGLE: c_uint = 0x4;

// --- launch --------------------------------------------------------------------------------

/// `CUlaunchAttributeID`.
pub type CUlaunchAttributeID = c_uint;
pub const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: CUlaunchAttributeID = 2;

/// `CUlaunchAttribute`: an id, padding to 8 bytes, and a 64-byte value union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: CUlaunchAttributeID,
    pub pad: [c_char; 4],
    pub value: [u8; 64],
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: c_uint,
}

// --- streams, events, graphs ---------------------------------------------------------------

pub const CU_STREAM_DEFAULT: c_uint = 0;
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// The legacy default stream handle.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// The per-thread default stream handle.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// How a host thread waits for the device (`cuCtxCreate`, `cuDevicePrimaryCtxSetFlags`): the
/// driver's heuristic (spin while the process has no more active contexts than CPUs, else
/// yield), spin, yield, or block on a synchronization primitive.
pub const CU_CTX_SCHED_AUTO: c_uint = 0x00;
pub const CU_CTX_SCHED_SPIN: c_uint = 0x01;
pub const CU_CTX_SCHED_YIELD: c_uint = 0x02;
pub const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 0x04;
pub const CU_CTX_SCHED_MASK: c_uint = 0x07;

pub const CU_EVENT_DEFAULT: c_uint = 0;
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 1;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// An event other processes can open (`cuIpcGetEventHandle`); needs `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_INTERPROCESS: c_uint = 4;

/// `cuIpcOpenMemHandle`'s one flag, which the driver requires.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `CUstreamCaptureStatus`.
pub type CUstreamCaptureStatus = c_uint;
pub const CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: CUstreamCaptureStatus = 2;

/// `CUstreamCaptureMode`.
pub type CUstreamCaptureMode = c_uint;
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

// --- device attributes ---------------------------------------------------------------------

/// `CUdevice_attribute` values gpuslice and its tests read.
pub type CUdevice_attribute = c_uint;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUdevice_attribute = 1;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: CUdevice_attribute = 16;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: CUdevice_attribute = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: CUdevice_attribute = 34;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: CUdevice_attribute = 41;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: CUdevice_attribute = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: CUdevice_attribute = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: CUdevice_attribute = 76;
pub const CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: CUdevice_attribute = 83;
pub const CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: CUdevice_attribute = 95;
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: CUdevice_attribute = 102;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: CUdevice_attribute = 115;

// --- NVML ----------------------------------------------------------------------------------

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`; `version` must be [`NVML_MEMORY_V2`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)`: the struct size with the version in the top byte.
pub const NVML_MEMORY_V2: c_uint = (core::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_t` (the v2/v3 layout used by `nvmlDeviceGetComputeRunningProcesses_v3`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `NVML_VALUE_NOT_AVAILABLE` for `usedGpuMemory`.
pub const NVML_VALUE_NOT_AVAILABLE_ULL: u64 = u64::MAX;
/// Buffer sizes NVML documents for string queries.
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;

// --- pointer and function attributes, launch parameters, JIT ------------------------------

/// `CUpointer_attribute`.
pub type CUpointer_attribute = c_uint;
pub const CU_POINTER_ATTRIBUTE_CONTEXT: CUpointer_attribute = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CUpointer_attribute = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: CUpointer_attribute = 3;
pub const CU_POINTER_ATTRIBUTE_HOST_POINTER: CUpointer_attribute = 4;
pub const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: CUpointer_attribute = 6;
pub const CU_POINTER_ATTRIBUTE_BUFFER_ID: CUpointer_attribute = 7;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: CUpointer_attribute = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: CUpointer_attribute = 9;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: CUpointer_attribute = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: CUpointer_attribute = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: CUpointer_attribute = 13;
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: CUpointer_attribute = 17;

/// `CUfunction_attribute`.
pub type CUfunction_attribute = c_uint;
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUfunction_attribute = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: CUfunction_attribute = 1;
pub const CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: CUfunction_attribute = 2;
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: CUfunction_attribute = 3;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: CUfunction_attribute = 4;
pub const CU_FUNC_ATTRIBUTE_PTX_VERSION: CUfunction_attribute = 5;
pub const CU_FUNC_ATTRIBUTE_BINARY_VERSION: CUfunction_attribute = 6;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: CUfunction_attribute = 8;
pub const CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: CUfunction_attribute = 9;

/// `extra` array markers of `cuLaunchKernel`.
pub const CU_LAUNCH_PARAM_END: usize = 0x00;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// `CUjitInputType`.
pub type CUjitInputType = c_uint;
pub const CU_JIT_INPUT_CUBIN: CUjitInputType = 0;
pub const CU_JIT_INPUT_PTX: CUjitInputType = 1;
pub const CU_JIT_INPUT_FATBINARY: CUjitInputType = 2;
pub const CU_JIT_INPUT_OBJECT: CUjitInputType = 3;
pub const CU_JIT_INPUT_LIBRARY: CUjitInputType = 4;

/// `CUjit_option`, the keys of the JIT option arrays (`cuModuleLoadDataEx`, `cuLink*`): a C
/// enum, spelled `int` like [`CUdriverProcAddressQueryResult`].
pub type CUjit_option = c_int;
/// `CUlibraryOption`, the keys of `cuLibraryLoad*`'s library options (as [`CUjit_option`]).
pub type CUlibraryOption = c_int;

/// `CUoccupancyB2DSize`: the dynamic shared memory a block size needs (`cuOccupancy*`).
pub type CUoccupancyB2DSize = Option<unsafe extern "C" fn(c_int) -> usize>;

/// `CUstreamCallback`, for `cuStreamAddCallback`.
pub type CUstreamCallback = Option<unsafe extern "C" fn(CUstream, u32, *mut c_void)>;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

/// `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUipcEventHandle {
    pub reserved: [c_char; 64],
}

/// `nvmlPciInfo_t` (v3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_headers() {
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(size_of::<CUDA_MEMCPY2D>(), 128);
        assert_eq!(size_of::<CUDA_MEMCPY3D>(), 200);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, maxSize), 24);
        assert_eq!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>(), 120);
        assert_eq!(size_of::<CUgraphNodeParams>(), 256);
        assert_eq!(offset_of!(CUgraphNodeParams, u), 16);
        assert_eq!(size_of::<CUlaunchAttribute>(), 72);
        assert_eq!(size_of::<CUlaunchConfig>(), 56);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(size_of::<CUipcMemHandle>(), 64);
        assert_eq!(size_of::<CUipcEventHandle>(), 64);
    }
}
