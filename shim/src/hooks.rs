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
//!
//! No row spells a signature: the function types are [`gpuslice_abi::pfn`]'s and the wrappers'
//! parameter lists come from [`gpuslice_abi::signature!`], both generated from NVIDIA's headers
//! (`abi/gen/pfn.py`). A handler whose parameters differ from the header's (a `c_uint` where
//! `cuda.h` has `size_t`) does not build.
//!
//! # The handler contract
//! Every handler named in a row is an `unsafe fn` called only by its wrapper, and may rely on:
//! - `real` is the real function of the same name, whose C signature is the row's `pfn` type;
//!   calling it with the program's own arguments is exactly the call the program made, under
//!   the driver's (or NVML's) contract;
//! - every argument is the program's, unchanged, so each pointer is what the header says it
//!   is: null, or valid for the reads (descriptors, `const` inputs) and writes (out-pointers)
//!   that function's documentation describes. A handler dereferences a pointer only after
//!   checking it non-null, and reads an out-pointer only after the real call succeeded (so
//!   the driver has written it).
//!
//! The SAFETY comments in the handlers name which of these they use.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::resolve::Lib;
use core::ffi::c_void;

/// The function pointer types of the driver and NVML, from the headers.
pub use gpuslice_abi::pfn;

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
        hooks { $( $lib:ident $name:ident => $handler:path; )* }
        reals { $( $rlib:ident $rname:ident; )* }
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

        /// The real functions, resolved lazily (`None` when the driver lacks one).
        pub mod real {
            use super::*;
            $(
                #[inline]
                pub fn $name() -> Option<pfn::$name> {
                    let p = crate::resolve::get(Sym::$name as usize);
                    // SAFETY: p was returned by the real dlsym for this exact name, whose C
                    // signature is pfn's, generated from the header.
                    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, pfn::$name>(p) })
                }
            )*
            $(
                #[inline]
                pub fn $rname() -> Option<pfn::$rname> {
                    let p = crate::resolve::get(Sym::$rname as usize);
                    // SAFETY: as above.
                    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, pfn::$rname>(p) })
                }
            )*
        }

        /// The exported wrappers, each with the header's signature.
        pub mod exports {
            use super::*;
            $( gpuslice_abi::signature!($name => export!($lib $name $handler;)); )*
        }
    };
}

/// One exported wrapper; `signature!` appends the C parameter list and return type.
macro_rules! export {
    ($lib:ident $name:ident $handler:path; ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            let Some(real) = real::$name() else { return Lib::$lib.missing() };
            if crate::config::disabled() {
                // SAFETY: the real function of this signature, with the program's arguments.
                return unsafe { real($($arg),*) };
            }
            // SAFETY: the handler gets the caller's arguments unchanged and the real function
            // of the same signature; no panic crosses the C boundary.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { $handler(real, $($arg),*) })) {
                Ok(r) => r,
                Err(_) => Lib::$lib.internal_error(),
            }
        }
    };
}

use crate::{init, launch, memory, nvml, procaddr, report};

hook_table! {
    hooks {
        Cuda cuInit => init::cu_init;
        Cuda cuGetProcAddress => procaddr::get_proc_address;
        Cuda cuGetProcAddress_v2 => procaddr::get_proc_address_v2;

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
        Cuda cuStreamSynchronize => memory::stream_synchronize;
        Cuda cuStreamSynchronize_ptsz => memory::stream_synchronize;
        Cuda cuCtxSynchronize => memory::ctx_synchronize;
        Cuda cuCtxSynchronize_v2 => memory::ctx_synchronize_v2;
        Cuda cuEventSynchronize => memory::event_synchronize;
        Cuda cuMemCreate => memory::mem_create;
        Cuda cuMemRelease => memory::mem_release;
        Cuda cuMemMap => memory::mem_map;
        Cuda cuMemUnmap => memory::mem_unmap;
        Cuda cuMemExportToShareableHandle => memory::mem_export;
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
        Cuda cuStreamBeginCapture => memory::begin_capture_v1;
        Cuda cuStreamBeginCapture_ptsz => memory::begin_capture_v1;
        Cuda cuStreamBeginCapture_v2 => memory::begin_capture;
        Cuda cuStreamBeginCapture_v2_ptsz => memory::begin_capture;
        Cuda cuStreamEndCapture => memory::end_capture;
        Cuda cuStreamEndCapture_ptsz => memory::end_capture;

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
        Cuda cuCtxDestroy_v2 => launch::ctx_destroy;
        Cuda cuDevicePrimaryCtxRelease_v2 => launch::primary_ctx_release;
        Cuda cuDevicePrimaryCtxReset_v2 => launch::primary_ctx_reset;

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

/// The hooked symbol called `name` (no NUL), if any.
pub fn find_hooked(name: &[u8]) -> Option<&'static Symbol> {
    SYMBOLS
        .iter()
        .find(|s| s.wrapper.is_some() && &s.name.as_bytes()[..s.name.len() - 1] == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake GPU's `cuGetProcAddress` table: what the driver the tests run on (a 13.0
    /// driver, see docs/fakegpu.md) answers, rows `base flags min_version symbol`.
    const PROCADDR: &str = include_str!("../../tests/fakegpu/src/procaddr.tsv");

    /// The base name of an exported symbol: `cuMemAllocAsync_ptsz` -> `cuMemAllocAsync`,
    /// `cuStreamBeginCapture_v2_ptsz` -> `cuStreamBeginCapture`.
    fn base(sym: &str) -> &str {
        let s = sym
            .strip_suffix("_ptsz")
            .or_else(|| sym.strip_suffix("_ptds"))
            .unwrap_or(sym);
        match s.rfind("_v") {
            Some(i) if s[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < s.len() => &s[..i],
            _ => s,
        }
    }

    /// A CUDA 12.x or 13.x runtime asks for its own version: whatever the driver then hands
    /// out for a base name the shim hooks in any form must be a form the shim hooks, or that
    /// path escapes it (the driver's answer is matched to a wrapper by address).
    #[test]
    fn every_form_a_current_runtime_gets_of_a_hooked_entry_point_is_hooked() {
        let hooked: Vec<&str> = SYMBOLS
            .iter()
            .filter(|s| s.wrapper.is_some() && s.lib == Lib::Cuda)
            .map(|s| s.name.trim_end_matches('\0'))
            .collect();
        let bases: Vec<&str> = hooked.iter().map(|s| base(s)).collect();
        // (base, flags) -> [(min_version, symbol)], for the bases the shim hooks.
        let mut rows: std::collections::HashMap<(&str, &str), Vec<(u32, &str)>> =
            std::collections::HashMap::new();
        for line in PROCADDR.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let [b, flags, ver, sym] = f[..] else {
                panic!("bad row {line:?}")
            };
            if bases.contains(&b) {
                rows.entry((b, flags))
                    .or_default()
                    .push((ver.parse().unwrap(), sym));
            }
        }
        let mut missing = Vec::new();
        let mut checked = 0;
        for ((b, flags), rows) in &rows {
            // What a 12.0+ runtime can be given: the row in force at 12000 and every later one.
            let from = rows
                .iter()
                .filter(|(v, _)| *v <= 12000)
                .map(|(v, _)| *v)
                .max()
                .unwrap_or(0);
            for (ver, sym) in rows.iter().filter(|(v, s)| *v >= from && *s != "-") {
                checked += 1;
                if !hooked.contains(sym) {
                    missing.push(format!("{b} (flags {flags}) -> {sym} from {ver}"));
                }
            }
        }
        assert!(checked > 50, "only {checked} rows checked");
        assert!(
            missing.is_empty(),
            "the driver hands out forms the shim does not hook:\n{}",
            missing.join("\n")
        );
    }
}
