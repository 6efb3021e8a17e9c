//! The one table of symbols. Each hooked row generates, from a single line:
//! - the exported wrapper (`#[no_mangle] extern "C"`), which finds the real function, passes
//!   straight through under `GPUSLICE_DISABLE=1`, and otherwise calls the handler named in the
//!   row with the real function as first argument, catching any panic;
//! - the entry in [`SYMBOLS`] that `dlsym.rs` (by name) and `procaddr.rs` (by the real
//!   function's address) use to hand out the wrapper;
//! - a typed accessor `real::<name>()` for the real function.
//!
//! Real-only rows (driver functions gpuslice calls but does not hook) generate only the
//! accessor. Adding a hook is adding one line here and writing its handler.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::real::Lib;
use core::ffi::{c_char, c_int, c_uint, c_void};
use gpuslice_abi::*;

/// One symbol of the table.
pub struct Symbol {
    /// NUL-terminated export name.
    pub name: &'static str,
    /// The library that defines the real one.
    pub lib: Lib,
    /// Our wrapper, for hooked symbols.
    pub wrapper: Option<Wrapper>,
}

/// The address of an exported wrapper.
#[derive(Clone, Copy)]
pub struct Wrapper(pub *const ());

// SAFETY: a function address is immutable and valid from any thread.
unsafe impl Sync for Wrapper {}

macro_rules! hook_table {
    (
        hooks { $( $lib:ident $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $handler:path; )* }
        reals { $( $rlib:ident $rname:ident ( $($rarg:ident : $rty:ty),* $(,)? ); )* }
    ) => {
        /// Index of each symbol in [`SYMBOLS`]: hooked ones first, then real-only ones.
        #[allow(non_camel_case_types, clippy::enum_variant_names, dead_code)]
        #[derive(Clone, Copy)]
        #[repr(usize)]
        pub enum Sym { $($name,)* $($rname,)* }

        /// How many symbols the table holds.
        pub const COUNT: usize = [$(Sym::$name,)* $(Sym::$rname,)*].len();

        /// Every symbol: name, library, wrapper.
        pub static SYMBOLS: [Symbol; COUNT] = [
            $( Symbol { name: concat!(stringify!($name), "\0"), lib: Lib::$lib, wrapper: Some(Wrapper(exports::$name as *const ())) }, )*
            $( Symbol { name: concat!(stringify!($rname), "\0"), lib: Lib::$rlib, wrapper: None }, )*
        ];

        /// Function pointer types of the real functions.
        pub mod pfn {
            #[allow(unused_imports)]
            use super::*;
            $( #[allow(non_camel_case_types)] pub type $name = unsafe extern "C" fn($($ty),*) -> u32; )*
            $( #[allow(non_camel_case_types)] pub type $rname = unsafe extern "C" fn($($rty),*) -> u32; )*
        }

        /// The real functions, resolved lazily (`None` when the driver lacks one).
        pub mod real {
            use super::*;
            $(
                #[inline]
                pub fn $name() -> Option<pfn::$name> {
                    let p = crate::real::get(Sym::$name as usize);
                    // SAFETY: p was returned by the real dlsym for this exact name, whose C
                    // signature is the one in the table row.
                    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, pfn::$name>(p) })
                }
            )*
            $(
                #[inline]
                pub fn $rname() -> Option<pfn::$rname> {
                    let p = crate::real::get(Sym::$rname as usize);
                    // SAFETY: as above.
                    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, pfn::$rname>(p) })
                }
            )*
        }

        /// The exported wrappers.
        pub mod exports {
            use super::*;
            $(
                #[no_mangle]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> u32 {
                    let Some(real) = real::$name() else { return Lib::$lib.missing() };
                    if crate::config::disabled() {
                        return real($($arg),*);
                    }
                    // SAFETY: the handler gets the caller's arguments unchanged and the real
                    // function of the same signature; no panic crosses the C boundary.
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { $handler(real, $($arg),*) })) {
                        Ok(r) => r,
                        Err(_) => Lib::$lib.internal_error(),
                    }
                }
            )*
        }
    };
}

use crate::{init, launch, memory, nvml, procaddr, report};

hook_table! {
    hooks {
        Cuda cuInit(flags: c_uint) => init::cu_init;
        Cuda cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => procaddr::get_proc_address;
        Cuda cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => procaddr::get_proc_address_v2;

        Cuda cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => memory::mem_alloc;
        Cuda cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) => memory::mem_alloc_pitch;
        Cuda cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) => memory::mem_alloc_managed;
        Cuda cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => memory::mem_alloc_async;
        Cuda cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => memory::mem_alloc_async;
        Cuda cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => memory::mem_alloc_from_pool;
        Cuda cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => memory::mem_alloc_from_pool;
        Cuda cuMemFree_v2(dptr: CUdeviceptr) => memory::mem_free;
        Cuda cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => memory::mem_free_async;
        Cuda cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => memory::mem_free_async;
        Cuda cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) => memory::pool_trim_to;
        Cuda cuMemPoolDestroy(pool: CUmemoryPool) => memory::pool_destroy;
        Cuda cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) => memory::mem_create;
        Cuda cuMemRelease(handle: CUmemGenericAllocationHandle) => memory::mem_release;
        Cuda cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) => memory::array_create;
        Cuda cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) => memory::array3d_create;
        Cuda cuArrayDestroy(array: CUarray) => memory::array_destroy;
        Cuda cuMipmappedArrayCreate(array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) => memory::mipmapped_create;
        Cuda cuMipmappedArrayDestroy(array: CUmipmappedArray) => memory::mipmapped_destroy;
        Cuda cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) => memory::graph_add_mem_alloc_node;
        Cuda cuGraphAddNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUgraphNodeParams) => memory::graph_add_node;
        Cuda cuGraphAddNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, ndeps: usize, params: *mut CUgraphNodeParams) => memory::graph_add_node_v2;
        Cuda cuGraphDestroy(graph: CUgraph) => memory::graph_destroy;
        Cuda cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) => memory::graph_instantiate_with_flags;
        Cuda cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, len: usize) => memory::graph_instantiate;
        Cuda cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, len: usize) => memory::graph_instantiate;
        Cuda cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) => memory::graph_instantiate_with_params;
        Cuda cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) => memory::graph_instantiate_with_params;
        Cuda cuGraphExecDestroy(exec: CUgraphExec) => memory::graph_exec_destroy;
        Cuda cuStreamBeginCapture(stream: CUstream) => memory::begin_capture_v1;
        Cuda cuStreamBeginCapture_ptsz(stream: CUstream) => memory::begin_capture_v1;
        Cuda cuStreamBeginCapture_v2(stream: CUstream, mode: CUstreamCaptureMode) => memory::begin_capture;
        Cuda cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: CUstreamCaptureMode) => memory::begin_capture;
        Cuda cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) => memory::end_capture;
        Cuda cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) => memory::end_capture;

        Cuda cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => report::mem_get_info;
        Cuda cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => report::device_total_mem;

        Cuda cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel;
        Cuda cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel;
        Cuda cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex;
        Cuda cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex;
        Cuda cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::launch_cooperative;
        Cuda cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::launch_cooperative;
        Cuda cuGraphLaunch(exec: CUgraphExec, stream: CUstream) => launch::graph_launch;
        Cuda cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) => launch::graph_launch;
        Cuda cuCtxDestroy_v2(ctx: CUcontext) => launch::ctx_destroy;
        Cuda cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => launch::primary_ctx_release;
        Cuda cuDevicePrimaryCtxReset_v2(dev: CUdevice) => launch::primary_ctx_reset;

        Nvml nvmlDeviceGetMemoryInfo(dev: nvmlDevice_t, mem: *mut nvmlMemory_t) => nvml::memory_info;
        Nvml nvmlDeviceGetMemoryInfo_v2(dev: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) => nvml::memory_info_v2;
    }
    reals {
        Cuda cuDeviceGetCount(count: *mut c_int);
        Cuda cuDeviceGet(dev: *mut CUdevice, ordinal: c_int);
        Cuda cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice);
        Cuda cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
        Cuda cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
        Cuda cuCtxGetDevice(dev: *mut CUdevice);
        Cuda cuEventCreate(event: *mut CUevent, flags: c_uint);
        Cuda cuEventRecord(event: CUevent, stream: CUstream);
        Cuda cuEventQuery(event: CUevent);
        Cuda cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
        Cuda cuEventDestroy_v2(event: CUevent);
        Cuda cuStreamIsCapturing(stream: CUstream, status: *mut CUstreamCaptureStatus);
        Cuda cuStreamGetCaptureInfo_v2(stream: CUstream, status: *mut CUstreamCaptureStatus, id: *mut u64, graph: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize);
        Cuda cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
        Cuda cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice);
        Nvml nvmlDeviceGetUUID(dev: nvmlDevice_t, buf: *mut c_char, len: c_uint);
        Nvml nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint);
    }
}

/// The hooked symbol called `name` (no NUL), if any.
pub fn find_hooked(name: &[u8]) -> Option<&'static Symbol> {
    SYMBOLS
        .iter()
        .find(|s| s.wrapper.is_some() && &s.name.as_bytes()[..s.name.len() - 1] == name)
}
