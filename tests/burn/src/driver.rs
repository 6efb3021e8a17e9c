//! The CUDA driver as `gpuslice-burn` sees it: `libcuda.so.1` opened with `dlopen`, and one
//! table of the entry points burn calls, resolved either through `cuGetProcAddress_v2` (what
//! cudart, PyTorch and cuda-bindings do) or through `dlsym` on the versioned export names.
//!
//! The table below is the only list of entry points: each row names the field (the base name,
//! as `cuGetProcAddress` wants it) and the versioned export `dlsym` looks up, whose signature is
//! [`gpuslice_abi::pfn`]'s (generated from `cudaTypedefs.h`). Each export is the newest at or
//! below CUDA 12.0; none of these changed later (through 13.x), so asking for the driver's own
//! version (`--cuda-version driver`) returns the same ABI.
//!
//! An entry point the driver lacks is not fatal at start-up: the field stays empty and the call
//! fails with [`Failure::Missing`] when a mode actually needs it, so burn still runs the modes a
//! partial driver (or fake) supports.

#![allow(non_snake_case)] // fields are named like the driver's entry points

use core::ffi::{c_int, c_void};
use std::ffi::CStr;
use std::fmt;

use gpuslice_abi::*;

/// A CUDA call that did not succeed.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The driver answered with a status other than `CUDA_SUCCESS`.
    Cuda { call: &'static str, code: CUresult },
    /// The entry point could not be resolved (see [`Driver::missing`] for why).
    Missing { call: &'static str, why: String },
}

impl Failure {
    /// The status code, or `None` for an entry point that was never resolved.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            Failure::Cuda { code, .. } => Some(*code),
            Failure::Missing { .. } => None,
        }
    }

    /// The failure as a JSON object: `{"call", "code", "name"}` or `{"call", "missing"}`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Failure::Cuda { call, code } => serde_json::json!({
                "call": call,
                "code": code,
                "name": cu_result_name(*code).unwrap_or("unknown CUresult"),
            }),
            Failure::Missing { call, why } => serde_json::json!({ "call": call, "missing": why }),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Cuda { call, code } => write!(f, "{call} failed: {}", describe_cu(*code)),
            Failure::Missing { call, why } => write!(f, "{call} is not available: {why}"),
        }
    }
}

/// How entry points are found (`--resolve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// `cuGetProcAddress_v2(base, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status)`.
    ProcAddress { cuda_version: Option<c_int> },
    /// `dlsym(handle, "cuMemAlloc_v2")`.
    Dlsym,
}

macro_rules! driver_table {
    ($( $name:ident / $export:ident; )*) => {
        /// The resolved entry points; `None` where the driver lacks one.
        pub struct Driver {
            $( pub $name: Option<pfn::$export>, )*
            /// Why each unresolved entry point is missing, by base name.
            pub missing: Vec<(&'static str, String)>,
            /// The CUDA version passed to `cuGetProcAddress_v2` (`None` with `dlsym`).
            pub cuda_version: Option<c_int>,
            /// What `cuDriverGetVersion` answered.
            pub driver_version: c_int,
        }

        impl Driver {
            fn resolve_all(
                lookup: &mut dyn FnMut(&'static CStr, &'static CStr) -> Result<*mut c_void, String>,
            ) -> (Self, Vec<(&'static str, String)>) {
                let mut missing = Vec::new();
                let d = Driver {
                    $( $name: {
                        let base = nul_terminated(concat!(stringify!($name), "\0"));
                        let export = nul_terminated(concat!(stringify!($export), "\0"));
                        match lookup(base, export) {
                            // SAFETY: the pointer was resolved for this name, at a version whose
                            // `PFN_` typedef is the export's (see the module comment).
                            Ok(p) => Some(unsafe { std::mem::transmute::<*mut c_void, pfn::$export>(p) }),
                            Err(why) => {
                                missing.push((stringify!($name), why));
                                None
                            }
                        }
                    }, )*
                    missing: Vec::new(),
                    cuda_version: None,
                    driver_version: 0,
                };
                (d, missing)
            }
        }
    };
}

driver_table! {
    cuInit / cuInit;
    cuDeviceGetCount / cuDeviceGetCount;
    cuDeviceGet / cuDeviceGet;
    cuDeviceGetName / cuDeviceGetName;
    cuDeviceGetUuid / cuDeviceGetUuid_v2;
    cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRetain;
    cuDevicePrimaryCtxRelease / cuDevicePrimaryCtxRelease_v2;
    cuCtxSetCurrent / cuCtxSetCurrent;
    cuCtxSynchronize / cuCtxSynchronize;
    cuModuleLoadData / cuModuleLoadData;
    cuModuleGetFunction / cuModuleGetFunction;
    cuModuleUnload / cuModuleUnload;
    cuLaunchKernel / cuLaunchKernel;
    cuLaunchKernelEx / cuLaunchKernelEx;
    cuLaunchCooperativeKernel / cuLaunchCooperativeKernel;
    cuStreamCreate / cuStreamCreate;
    cuStreamDestroy / cuStreamDestroy_v2;
    cuStreamSynchronize / cuStreamSynchronize;
    cuEventCreate / cuEventCreate;
    cuEventRecord / cuEventRecord;
    cuEventSynchronize / cuEventSynchronize;
    cuEventQuery / cuEventQuery;
    cuEventElapsedTime / cuEventElapsedTime;
    cuEventDestroy / cuEventDestroy_v2;
    cuStreamBeginCapture / cuStreamBeginCapture_v2;
    cuStreamEndCapture / cuStreamEndCapture;
    cuGraphCreate / cuGraphCreate;
    cuGraphAddMemAllocNode / cuGraphAddMemAllocNode;
    cuGraphInstantiateWithFlags / cuGraphInstantiateWithFlags;
    cuGraphLaunch / cuGraphLaunch;
    cuGraphExecDestroy / cuGraphExecDestroy;
    cuGraphDestroy / cuGraphDestroy;
    cuMemGetInfo / cuMemGetInfo_v2;
    cuMemAlloc / cuMemAlloc_v2;
    cuMemFree / cuMemFree_v2;
    cuMemAllocPitch / cuMemAllocPitch_v2;
    cuMemAllocManaged / cuMemAllocManaged;
    cuMemAllocAsync / cuMemAllocAsync;
    cuMemFreeAsync / cuMemFreeAsync;
    cuMemPoolCreate / cuMemPoolCreate;
    cuMemPoolDestroy / cuMemPoolDestroy;
    cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync;
    cuMemGetAllocationGranularity / cuMemGetAllocationGranularity;
    cuMemCreate / cuMemCreate;
    cuMemRelease / cuMemRelease;
    cuMemAddressReserve / cuMemAddressReserve;
    cuMemAddressFree / cuMemAddressFree;
    cuMemMap / cuMemMap;
    cuMemUnmap / cuMemUnmap;
    cuMemSetAccess / cuMemSetAccess;
    cuArrayCreate / cuArrayCreate_v2;
    cuArrayDestroy / cuArrayDestroy;
    cuArray3DCreate / cuArray3DCreate_v2;
    cuMipmappedArrayCreate / cuMipmappedArrayCreate;
    cuMipmappedArrayDestroy / cuMipmappedArrayDestroy;
    cuMemsetD8 / cuMemsetD8_v2;
}

/// Call a driver entry point through a [`Driver`], turning its status into a `Result`.
///
/// `cu!(driver, cuMemAlloc(&mut ptr, size))`. Every pointer argument must be valid for the
/// call as `cuda.h` documents it; call sites pass references to live locals or handles the
/// driver itself returned.
macro_rules! cu {
    ($d:expr, $name:ident($($arg:expr),* $(,)?)) => {{
        match $d.$name {
            Some(f) => {
                // SAFETY: `f` has the exact signature of this entry point (see driver_table!),
                // and the caller passes arguments valid for it (see the macro's doc comment).
                let r = unsafe { f($($arg),*) };
                if r == gpuslice_abi::CUDA_SUCCESS {
                    Ok(())
                } else {
                    Err($crate::driver::Failure::Cuda { call: stringify!($name), code: r })
                }
            }
            None => Err($d.missing_failure(stringify!($name))),
        }
    }};
}
pub(crate) use cu;

impl Driver {
    /// Open `libcuda.so.1` and resolve the table. Fails only when the library or the resolver
    /// itself cannot be found; single missing entry points are recorded in [`Driver::missing`].
    pub fn open(resolve: Resolve) -> Result<Driver, String> {
        // SAFETY: dlopen with a NUL-terminated name; the handle is never closed, so every
        // pointer resolved from it stays valid for the life of the process.
        let handle =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("cannot load libcuda.so.1: {}", dlerror()));
        }
        let sym = |name: &CStr| -> *mut c_void {
            // SAFETY: `handle` is a live dlopen handle and `name` is NUL-terminated.
            unsafe { libc::dlsym(handle, name.as_ptr()) }
        };

        let get_version = sym(c"cuDriverGetVersion");
        let mut driver_version: c_int = 0;
        if !get_version.is_null() {
            // SAFETY: `cuDriverGetVersion(int*)` is the only ABI this export ever had.
            let f: pfn::cuDriverGetVersion = unsafe { std::mem::transmute(get_version) };
            // SAFETY: a valid out-pointer; the call works before cuInit.
            let r = unsafe { f(&mut driver_version) };
            if r != CUDA_SUCCESS {
                return Err(format!("cuDriverGetVersion failed: {}", describe_cu(r)));
            }
        }

        let (mut d, missing) = match resolve {
            Resolve::Dlsym => Driver::resolve_all(&mut |_base, export| {
                let p = sym(export);
                if p.is_null() {
                    Err(format!("dlsym({}) found nothing", export.to_string_lossy()))
                } else {
                    Ok(p)
                }
            }),
            Resolve::ProcAddress { cuda_version } => {
                let gpa = sym(c"cuGetProcAddress_v2");
                if gpa.is_null() {
                    return Err("libcuda.so.1 exports no cuGetProcAddress_v2 \
                         (driver older than CUDA 12.0?); try --resolve dlsym"
                        .into());
                }
                // SAFETY: the export `cuGetProcAddress_v2` has the PFN_cuGetProcAddress_v12000 ABI.
                let gpa: pfn::cuGetProcAddress_v2 = unsafe { std::mem::transmute(gpa) };
                let version = cuda_version.unwrap_or(driver_version);
                let res = Driver::resolve_all(&mut |base, _export| {
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let mut status: c_int = -1;
                    // SAFETY: NUL-terminated name and valid out-pointers.
                    let r = unsafe {
                        gpa(
                            base.as_ptr(),
                            &mut p,
                            version,
                            CU_GET_PROC_ADDRESS_DEFAULT,
                            &mut status,
                        )
                    };
                    if r != CUDA_SUCCESS {
                        Err(format!("cuGetProcAddress_v2 failed: {}", describe_cu(r)))
                    } else if status != CU_GET_PROC_ADDRESS_SUCCESS || p.is_null() {
                        let what = match status {
                            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND => "symbol not found",
                            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT => "version not sufficient",
                            CU_GET_PROC_ADDRESS_SUCCESS => "null pointer with success status",
                            _ => "unknown symbolStatus",
                        };
                        Err(format!(
                            "cuGetProcAddress_v2(version {version}) answered {what} \
                             (symbolStatus {status})"
                        ))
                    } else {
                        Ok(p)
                    }
                });
                (res.0.with_version(Some(version)), res.1)
            }
        };
        d.missing = missing;
        d.driver_version = driver_version;
        Ok(d)
    }

    fn with_version(mut self, v: Option<c_int>) -> Self {
        self.cuda_version = v;
        self
    }

    /// The failure for calling an entry point that was never resolved.
    pub fn missing_failure(&self, call: &'static str) -> Failure {
        let why = self
            .missing
            .iter()
            .find(|(n, _)| *n == call)
            .map(|(_, w)| w.clone())
            .unwrap_or_else(|| "not resolved".into());
        Failure::Missing { call, why }
    }
}

/// A `&'static CStr` from a literal the table macro NUL-terminated itself.
fn nul_terminated(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => unreachable!("entry point names hold no NUL and end with one"),
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc, copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null and NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}
