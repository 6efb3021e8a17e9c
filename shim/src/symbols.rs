//! The one table of symbols: every driver and NVML function gpuslice hooks (with the handler
//! its wrapper calls) or only calls (real-only rows). Data, not code: `for_each_symbol!`
//! hands the rows to a macro, and two modules expand them: `real.rs` (the real functions:
//! their index, name and library, and a typed accessor each) and `hooks.rs` (the exported
//! wrappers). So the accessors sit below every handler and the wrappers above them: nothing
//! a handler imports imports the handlers back. Adding a hook is adding one row here and
//! writing its handler.
//!
//! A handler path in a row is resolved where the rows are expanded into wrappers
//! (`hooks.rs`, which imports the handler modules); `real.rs` ignores it.

/// Call `$callback! { hooks { LIB NAME => HANDLER; ... } reals { LIB NAME; ... } }` with the
/// table's rows.
macro_rules! for_each_symbol {
    ($callback:ident) => {
        $callback! {
            hooks {
                Cuda cuInit => init::cu_init;
                Cuda cuGetProcAddress => get_proc_address;
                Cuda cuGetProcAddress_v2 => get_proc_address_v2;

                Cuda cuMemAlloc_v2 => memory::mem_alloc;
                Cuda cuMemAllocPitch_v2 => memory::mem_alloc_pitch;
                Cuda cuMemAllocManaged => memory::mem_alloc_managed;
                Cuda cuMemAllocAsync => memory::mem_alloc_async;
                Cuda cuMemAllocAsync_ptsz => memory::mem_alloc_async;
                Cuda cuMemAllocFromPoolAsync => memory::mem_alloc_from_pool;
                Cuda cuMemAllocFromPoolAsync_ptsz => memory::mem_alloc_from_pool;
                Cuda cuMemFree_v2 => memory::mem_free;
                Cuda cuMemFreeAsync => memory::mem_free_async;
                Cuda cuMemFreeAsync_ptsz => memory::mem_free_async;
                Cuda cuMemPoolTrimTo => memory::pool_trim_to;
                Cuda cuMemPoolCreate => memory::pool_create;
                Cuda cuMemPoolDestroy => memory::pool_destroy;
                Cuda cuStreamSynchronize => sync::stream_synchronize;
                Cuda cuStreamSynchronize_ptsz => sync::stream_synchronize;
                Cuda cuCtxSynchronize => sync::ctx_synchronize;
                Cuda cuCtxSynchronize_v2 => sync::ctx_synchronize_v2;
                Cuda cuEventSynchronize => sync::event_synchronize;
                Cuda cuMemCreate => memory::mem_create;
                Cuda cuMemRelease => memory::mem_release;
                Cuda cuMemMap => memory::mem_map;
                Cuda cuMemUnmap => memory::mem_unmap;
                Cuda cuMemExportToShareableHandle => memory::mem_export;
                Cuda cuMemImportFromShareableHandle => memory::mem_import;
                Cuda cuMemRetainAllocationHandle => memory::mem_retain;
                Cuda cuArrayCreate_v2 => memory::array_create;
                Cuda cuArray3DCreate_v2 => memory::array3d_create;
                Cuda cuArrayDestroy => memory::array_destroy;
                Cuda cuMipmappedArrayCreate => memory::mipmapped_create;
                Cuda cuMipmappedArrayDestroy => memory::mipmapped_destroy;
                Cuda cuGraphAddMemAllocNode => memory::graph_add_mem_alloc_node;
                Cuda cuGraphAddNode => memory::graph_add_node;
                Cuda cuGraphAddNode_v2 => memory::graph_add_node_v2;
                Cuda cuGraphDestroy => memory::graph_destroy;
                Cuda cuGraphInstantiateWithFlags => memory::graph_instantiate_with_flags;
                Cuda cuGraphInstantiate => memory::graph_instantiate;
                Cuda cuGraphInstantiate_v2 => memory::graph_instantiate;
                Cuda cuGraphInstantiateWithParams => memory::graph_instantiate_with_params;
                Cuda cuGraphInstantiateWithParams_ptsz => memory::graph_instantiate_with_params;
                Cuda cuGraphExecDestroy => memory::graph_exec_destroy;
                Cuda cuStreamBeginCapture => capture::begin_capture_v1;
                Cuda cuStreamBeginCapture_ptsz => capture::begin_capture_v1;
                Cuda cuStreamBeginCapture_v2 => capture::begin_capture;
                Cuda cuStreamBeginCapture_v2_ptsz => capture::begin_capture;
                Cuda cuStreamEndCapture => capture::end_capture;
                Cuda cuStreamEndCapture_ptsz => capture::end_capture;

                Cuda cuMemGetInfo_v2 => report::mem_get_info;
                Cuda cuDeviceTotalMem_v2 => report::device_total_mem;

                Cuda cuLaunchKernel => launch::launch_kernel;
                Cuda cuLaunchKernel_ptsz => launch::launch_kernel;
                Cuda cuLaunchKernelEx => launch::launch_kernel_ex;
                Cuda cuLaunchKernelEx_ptsz => launch::launch_kernel_ex;
                Cuda cuLaunchCooperativeKernel => launch::launch_cooperative;
                Cuda cuLaunchCooperativeKernel_ptsz => launch::launch_cooperative;
                Cuda cuGraphLaunch => launch::graph_launch;
                Cuda cuGraphLaunch_ptsz => launch::graph_launch;
                Cuda cuDevicePrimaryCtxRetain => contexts::primary_ctx_retain;
                Cuda cuCtxCreate_v2 => contexts::ctx_create_v2;
                Cuda cuCtxCreate_v3 => contexts::ctx_create_v3;
                Cuda cuCtxCreate_v4 => contexts::ctx_create_v4;
                Cuda cuCtxDestroy_v2 => contexts::ctx_destroy;
                Cuda cuDevicePrimaryCtxRelease_v2 => contexts::primary_ctx_release;
                Cuda cuDevicePrimaryCtxReset_v2 => contexts::primary_ctx_reset;

                Nvml nvmlDeviceGetMemoryInfo => nvml::memory_info;
                Nvml nvmlDeviceGetMemoryInfo_v2 => nvml::memory_info;
                Nvml nvmlDeviceGetComputeRunningProcesses => nvml::compute_processes;
                Nvml nvmlDeviceGetComputeRunningProcesses_v2 => nvml::compute_processes;
                Nvml nvmlDeviceGetComputeRunningProcesses_v3 => nvml::compute_processes;
                Nvml nvmlDeviceGetGraphicsRunningProcesses => nvml::unlisted_processes;
                Nvml nvmlDeviceGetGraphicsRunningProcesses_v2 => nvml::unlisted_processes;
                Nvml nvmlDeviceGetGraphicsRunningProcesses_v3 => nvml::unlisted_processes;
                Nvml nvmlDeviceGetMPSComputeRunningProcesses => nvml::unlisted_processes;
                Nvml nvmlDeviceGetMPSComputeRunningProcesses_v2 => nvml::unlisted_processes;
                Nvml nvmlDeviceGetMPSComputeRunningProcesses_v3 => nvml::unlisted_processes;
                Nvml nvmlDeviceGetAccountingPids => nvml::accounting_pids;
                Nvml nvmlDeviceGetAccountingStats => nvml::accounting_stats;
                Nvml nvmlDeviceGetRunningProcessDetailList => nvml::process_detail_list;
                Nvml nvmlDeviceGetUtilizationRates => nvml::utilization_rates;
                Nvml nvmlDeviceGetProcessesUtilizationInfo => nvml::processes_utilization_info;
                Nvml nvmlDeviceGetProcessUtilization => nvml::process_utilization;
            }
            reals {
                Cuda cuDeviceGetCount;
                Cuda cuDeviceGet;
                Cuda cuDeviceGetUuid_v2;
                Cuda cuDeviceGetUuid;
                Cuda cuDeviceGetName;
                Cuda cuCtxGetDevice;
                Cuda cuEventCreate;
                Cuda cuEventRecord;
                Cuda cuEventQuery;
                Cuda cuEventElapsedTime;
                Cuda cuEventDestroy_v2;
                Cuda cuStreamIsCapturing;
                Cuda cuStreamGetCaptureInfo_v2;
                Cuda cuMemPoolGetAttribute;
                Cuda cuDeviceGetMemPool;
                Nvml nvmlDeviceGetUUID;
                Nvml nvmlDeviceGetIndex;
            }
        }
    };
}

pub(crate) use for_each_symbol;
