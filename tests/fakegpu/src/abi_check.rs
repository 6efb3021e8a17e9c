//! The fake's exports, checked against the C signatures of NVIDIA's headers
//! ([`gpuslice_abi::pfn`], generated from `cuda.h`, `cudaTypedefs.h` and `nvml.h`).
//!
//! Each name below is coerced to the `pfn` type of the same name at compile time, so an export
//! whose parameters differ from the header's (a `c_uint` where the header has `size_t`) does
//! not build. The exports in `differs!` do not match the header yet: each is pinned to its
//! present signature (so fixing it fails the build here, and the line moves to `checked!`).
//! Exports newer than those headers are in `newer!`, pinned to their signature. The tests at
//! the bottom fail when an export is missing from every list.

use gpuslice_abi::pfn;
#[allow(unused_imports)]
use gpuslice_abi::*;
#[allow(unused_imports)]
use std::ffi::{c_int, c_uint, c_void};

macro_rules! checked {
    ($($module:ident { $($name:ident),* $(,)? })*) => {
        $($( const _: pfn::$name = crate::$module::$name; )*)*

        /// Every export checked above, by symbol name.
        #[cfg(test)]
        const CHECKED: &[&str] = &[$($(stringify!($name)),*),*];
    };
}

macro_rules! differs {
    ($($module:ident::$name:ident: $ty:ty => $why:literal;)*) => {
        $(
            const _: $ty = crate::$module::$name;
            const _: Option<pfn::$name> = None;
        )*

        /// The exports that differ from the header, and how.
        #[cfg(test)]
        const DIFFERS: &[(&str, &str)] = &[$((stringify!($name), $why)),*];
    };
}

macro_rules! newer {
    ($($module:ident::$name:ident: $ty:ty => $why:literal;)*) => {
        $( const _: $ty = crate::$module::$name; )*

        /// Exports newer than the headers `pfn` was generated from, pinned to their signature.
        #[cfg(test)]
        const NEWER: &[(&str, &str)] = &[$((stringify!($name), $why)),*];
    };
}

newer! {
    api::cuMemGetDefaultMemPool:
        unsafe extern "C" fn(*mut CUmemoryPool, *mut CUmemLocation, CUmemAllocationType) -> CUresult
        => "CUDA 13 (cuda.h 13.0): not in the 12.9 headers pfn.rs comes from";
    api::cuMemGetMemPool:
        unsafe extern "C" fn(*mut CUmemoryPool, *mut CUmemLocation, CUmemAllocationType) -> CUresult
        => "CUDA 13 (cuda.h 13.0): not in the 12.9 headers pfn.rs comes from";
    api::cuMemSetMemPool:
        unsafe extern "C" fn(*mut CUmemLocation, CUmemAllocationType, CUmemoryPool) -> CUresult
        => "CUDA 13 (cuda.h 13.0): not in the 12.9 headers pfn.rs comes from";
}

differs! {
    api::cuOccupancyMaxPotentialBlockSize:
        unsafe extern "C" fn(*mut c_int, *mut c_int, CUfunction, *mut c_void, usize, c_int) -> CUresult
        => "the CUoccupancyB2DSize callback is typed *mut c_void (same width, untyped)";
    api::cuOccupancyMaxPotentialBlockSizeWithFlags:
        unsafe extern "C" fn(*mut c_int, *mut c_int, CUfunction, *mut c_void, usize, c_int, c_uint) -> CUresult
        => "the CUoccupancyB2DSize callback is typed *mut c_void (same width, untyped)";
}

checked! {
    api {
        cuGetExportTable,
        cuDeviceGetDevResource, cuCtxGetDevResource, cuDeviceGetGraphMemAttribute,
        cuDeviceSetGraphMemAttribute, cuMemPoolGetAccess, cuMemPoolSetAccess,
        cuMemExportToShareableHandle, cuMemImportFromShareableHandle, cuMemRetainAllocationHandle,
        cuMemGetAllocationPropertiesFromHandle, cuStreamGetDevice, cuStreamGetDevice_ptsz,
        cuStreamWriteValue32, cuStreamWriteValue32_ptsz, cuStreamWriteValue32_v2,
        cuStreamWriteValue32_v2_ptsz, cuModuleGetLoadingMode, cuLibraryGetManaged,
        cuOccupancyAvailableDynamicSMemPerBlock, cuOccupancyMaxActiveClusters,
        cuOccupancyMaxPotentialClusterSize,
        cuDevicePrimaryCtxGetState, cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString, cuGetProcAddress,
        cuGetProcAddress_v2, cuProfilerStart, cuProfilerStop, cuDeviceGetCount, cuDeviceGet,
        cuDeviceGetName, cuDeviceGetUuid, cuDeviceGetUuid_v2, cuDeviceTotalMem_v2,
        cuDeviceGetAttribute, cuDeviceComputeCapability, cuDeviceGetPCIBusId,
        cuDeviceGetByPCIBusId, cuDeviceCanAccessPeer, cuDeviceGetDefaultMemPool,
        cuDeviceGetMemPool, cuDeviceSetMemPool, cuDeviceGraphMemTrim, cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxReset_v2,
        cuDevicePrimaryCtxReset, cuDevicePrimaryCtxSetFlags_v2,
        cuDevicePrimaryCtxSetFlags, cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4,
        cuCtxDestroy_v2, cuCtxSetCurrent, cuCtxGetCurrent, cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2, cuCtxGetDevice, cuCtxSynchronize, cuCtxGetApiVersion, cuCtxGetFlags,
        cuCtxSetFlags, cuCtxGetId, cuCtxGetStreamPriorityRange, cuCtxEnablePeerAccess,
        cuCtxDisablePeerAccess, cuCtxGetLimit, cuCtxSetLimit, cuCtxGetCacheConfig,
        cuCtxSetCacheConfig, cuMemGetInfo_v2, cuMemAlloc_v2, cuMemAllocPitch_v2,
        cuMemAllocManaged, cuMemFree_v2, cuMemGetAddressRange_v2, cuMemAllocHost_v2,
        cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer_v2, cuMemHostGetFlags,
        cuMemHostRegister_v2, cuMemHostRegister, cuMemHostUnregister, cuPointerGetAttribute,
        cuPointerGetAttributes, cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle,
        cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle, cuMemAllocAsync,
        cuMemAllocAsync_ptsz, cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz, cuMemFreeAsync, cuMemFreeAsync_ptsz, cuMemPoolCreate,
        cuMemPoolDestroy, cuMemPoolTrimTo, cuMemPoolGetAttribute, cuMemPoolSetAttribute,
        cuMemGetAllocationGranularity, cuMemCreate, cuMemRelease, cuMemAddressReserve,
        cuMemAddressFree, cuMemMap, cuMemUnmap, cuMemSetAccess, cuArrayCreate_v2,
        cuArray3DCreate_v2, cuArrayGetDescriptor_v2, cuArray3DGetDescriptor_v2, cuArrayDestroy,
        cuMipmappedArrayCreate, cuMipmappedArrayDestroy, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds,
        cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, cuMemcpy,
        cuMemcpy_ptds, cuMemcpyPeer, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz,
        cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoDAsync_v2,
        cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyAsync, cuMemcpyAsync_ptsz, cuMemcpyPeerAsync,
        cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds,
        cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, cuMemcpy3D_v2, cuMemcpy3D_v2_ptds,
        cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, cuMemsetD8_v2, cuMemsetD8_v2_ptds,
        cuMemsetD16_v2, cuMemsetD16_v2_ptds, cuMemsetD32_v2, cuMemsetD32_v2_ptds,
        cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds,
        cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds, cuMemsetD8Async, cuMemsetD8Async_ptsz,
        cuMemsetD16Async, cuMemsetD16Async_ptsz, cuMemsetD32Async, cuMemsetD32Async_ptsz,
        cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz,
        cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, cuStreamCreate, cuStreamCreateWithPriority,
        cuStreamDestroy_v2, cuStreamDestroy, cuStreamSynchronize, cuStreamSynchronize_ptsz,
        cuStreamQuery, cuStreamQuery_ptsz, cuStreamWaitEvent, cuStreamWaitEvent_ptsz,
        cuStreamGetPriority, cuStreamGetPriority_ptsz, cuStreamGetFlags, cuStreamGetFlags_ptsz,
        cuStreamGetCtx, cuStreamGetCtx_ptsz, cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz,
        cuStreamGetId, cuStreamGetId_ptsz, cuStreamAddCallback, cuStreamAddCallback_ptsz,
        cuLaunchHostFunc, cuLaunchHostFunc_ptsz, cuStreamIsCapturing, cuStreamIsCapturing_ptsz,
        cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo_v2,
        cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v3,
        cuStreamGetCaptureInfo_v3_ptsz, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz,
        cuStreamBeginCapture, cuStreamBeginCapture_ptsz, cuStreamEndCapture,
        cuStreamEndCapture_ptsz, cuThreadExchangeStreamCaptureMode, cuEventCreate,
        cuEventRecord, cuEventRecord_ptsz, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz,
        cuEventQuery, cuEventSynchronize, cuEventElapsedTime, cuEventElapsedTime_v2,
        cuEventDestroy_v2, cuEventDestroy, cuModuleLoad, cuModuleLoadData, cuModuleLoadDataEx,
        cuModuleLoadFatBinary, cuModuleUnload, cuModuleGetFunction, cuModuleGetGlobal_v2,
        cuLinkCreate_v2, cuLinkAddData_v2, cuLinkAddFile_v2, cuLinkComplete, cuLinkDestroy,
        cuLibraryLoadData, cuLibraryLoadFromFile, cuLibraryUnload, cuLibraryGetKernel,
        cuLibraryGetModule, cuLibraryGetKernelCount, cuLibraryGetGlobal, cuKernelGetFunction,
        cuKernelGetAttribute, cuKernelSetAttribute, cuKernelSetCacheConfig, cuKernelGetName,
        cuFuncGetName, cuFuncGetAttribute, cuFuncSetAttribute, cuFuncSetCacheConfig,
        cuFuncSetSharedMemConfig, cuFuncGetModule, cuOccupancyMaxActiveBlocksPerMultiprocessor,
        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
        cuLaunchKernel, cuLaunchKernel_ptsz,
        cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz, cuGraphCreate, cuGraphDestroy, cuGraphGetNodes,
        cuGraphInstantiateWithFlags, cuGraphInstantiate_v2, cuGraphLaunch, cuGraphLaunch_ptsz,
        cuGraphUpload, cuGraphUpload_ptsz, cuGraphExecDestroy, cuGraphAddMemAllocNode,
        cuGraphAddMemFreeNode,
        cuStreamWaitValue32, cuStreamWaitValue32_v2, cuStreamWaitValue64, cuStreamWaitValue64_v2,
        cuStreamWriteValue64, cuStreamWriteValue64_v2, cuStreamBatchMemOp, cuStreamBatchMemOp_v2,
        cuMemPrefetchAsync, cuMemPrefetchAsync_v2, cuKernelGetLibrary, cuGraphInstantiate,
        cuGraphNodeGetType, cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams_v2,
        cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams_v2,
    }
    nvml {
        nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetNvLinkRemoteDeviceType,
        nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlDeviceGetNvLinkRemotePciInfo,
        nvmlDeviceGetGpuFabricInfo, nvmlDeviceGetGpuFabricInfoV,
        nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetGraphicsRunningProcesses,
        nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v2,
        nvmlDeviceGetMPSComputeRunningProcesses, nvmlDeviceGetRunningProcessDetailList,
        nvmlDeviceGetProcessUtilization, nvmlDeviceGetProcessesUtilizationInfo,
        nvmlInit_v2, nvmlInit, nvmlInitWithFlags, nvmlShutdown, nvmlDeviceGetCount_v2,
        nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetHandleByUUID, nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetName,
        nvmlDeviceGetUUID, nvmlDeviceGetSerial, nvmlDeviceGetIndex, nvmlDeviceGetMinorNumber,
        nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
        nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetComputeRunningProcesses_v2,
        nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetUtilizationRates,
        nvmlDeviceGetCudaComputeCapability, nvmlDeviceGetPciInfo_v3, nvmlDeviceGetTemperature,
        nvmlDeviceGetPowerUsage, nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion,
        nvmlSystemGetCudaDriverVersion, nvmlSystemGetCudaDriverVersion_v2,
        nvmlDeviceGetAccountingMode, nvmlDeviceGetAccountingBufferSize, nvmlDeviceGetAccountingPids,
        nvmlDeviceGetAccountingStats,
    }
}

#[cfg(test)]
mod tests {
    use super::{CHECKED, DIFFERS, NEWER};

    fn covered(name: &str) -> bool {
        CHECKED.contains(&name) || DIFFERS.iter().chain(NEWER).any(|(n, _)| *n == name)
    }

    #[test]
    fn every_driver_export_is_checked() {
        let missing: Vec<&str> = crate::api::EXPORTS
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| !covered(name))
            .collect();
        assert!(
            missing.is_empty(),
            "add these exports to abi_check.rs: {missing:?}"
        );
    }

    #[test]
    fn every_nvml_export_is_checked() {
        // nvml.rs has no table of its exports: read them off its `nvml_exports!` block.
        let src = include_str!("nvml.rs");
        let start = src
            .find("nvml_exports! {")
            .expect("nvml.rs has an nvml_exports! block");
        let block = &src[start..];
        let block = &block[..block.find("\n}\n").unwrap_or(block.len())];
        let missing: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("    fn "))
            .filter_map(|l| l.split('(').next())
            .filter(|name| !covered(name))
            .collect();
        assert!(
            missing.is_empty(),
            "add these exports to abi_check.rs: {missing:?}"
        );
        assert!(CHECKED.contains(&"nvmlInit_v2"), "the NVML list is read");
    }
}
