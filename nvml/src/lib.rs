//! NVML loaded at run time with `dlopen("libnvidia-ml.so.1")`, never linked: the `gpuslice`
//! monitor runs on machines without a driver, and the DRA plugin's image carries none (the
//! node's driver library is mounted in; the tests' fake GPU provides the same name).
//!
//! [`Nvml::load`] opens and initialises it; [`Nvml::devices`] lists the GPUs in NVML's order
//! (the order `nvidia-smi` shows), [`Nvml::driver_version`] and [`Nvml::processes`] say what a
//! caller may do without (`None` when this NVML cannot say). Errors are an [`Error`] that keeps
//! the call and status code and formats them only when shown. The entry points' types are
//! `gpuslice_abi::pfn`'s, generated from `nvml.h`, so a signature here cannot drift from the
//! header.
//!
//! This is the monitor's and the DRA plugin's NVML, not the shim's: the shim *is* an NVML (it
//! interposes on `libnvidia-ml.so.1`) and resolves the real one through its own hook table.
//!
//! ```
//! // On a machine without a driver this prints why; with one (or the fake GPU), the GPUs.
//! match gpuslice_nvml::Nvml::load() {
//!     Ok(nvml) => {
//!         for g in nvml.devices().unwrap_or_default() {
//!             println!("{} {} {} ({} bytes)", g.index, g.uuid, g.name, g.memory_total);
//!         }
//!     }
//!     Err(e) => println!("no NVML: {e}"),
//! }
//! ```

#![deny(missing_docs)]

use gpuslice_abi::{
    nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_t, nvml_return_name, pfn, NvmlReturn,
    NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_SUCCESS, NVML_VALUE_NOT_AVAILABLE_ULL,
};
use std::ffi::{c_char, c_uint, c_void, CStr};
use std::fmt;

// The entry points' C signatures, generated from nvml.h. Where one type serves two functions,
// the `const` checks that their signatures really are the same.
type InitFn = pfn::nvmlInit_v2;
type CountFn = pfn::nvmlDeviceGetCount_v2;
type HandleFn = pfn::nvmlDeviceGetHandleByIndex_v2;
type StringFn = pfn::nvmlDeviceGetUUID;
type SystemStringFn = pfn::nvmlSystemGetDriverVersion;
type MemoryFn = pfn::nvmlDeviceGetMemoryInfo;
type ProcsFn = pfn::nvmlDeviceGetComputeRunningProcesses_v3;
const _: fn(pfn::nvmlShutdown) -> InitFn = |f| f;
const _: fn(pfn::nvmlDeviceGetName) -> StringFn = |f| f;

/// The library [`Nvml::load`] opens.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// Why NVML cannot answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `dlopen("libnvidia-ml.so.1")` failed: no NVIDIA driver library here.
    NotFound,
    /// The library lacks an entry point every caller needs.
    Missing(&'static str),
    /// An NVML call returned this status.
    Failed {
        /// The entry point (`nvmlInit_v2`).
        call: &'static str,
        /// Its `nvmlReturn_t`.
        code: NvmlReturn,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => write!(f, "{SONAME} not found"),
            Error::Missing(name) => write!(f, "NVML lacks {name}"),
            Error::Failed { call, code } => write!(
                f,
                "{call} failed: {} ({code})",
                nvml_return_name(*code).unwrap_or("unknown nvmlReturn_t")
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

/// `Ok` on `NVML_SUCCESS`, else the call and its status.
fn check(call: &'static str, code: NvmlReturn) -> Result<(), Error> {
    if code == NVML_SUCCESS {
        Ok(())
    } else {
        Err(Error::Failed { call, code })
    }
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML's index (the order `nvidia-smi` shows).
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Device memory in bytes.
    pub memory_total: u64,
    /// Device memory in use, by anyone (processes with or without gpuslice, the driver).
    pub memory_used: u64,
}

/// What [`Nvml::scan`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// The GPUs that answer, in NVML's order.
    pub gpus: Vec<Gpu>,
    /// NVML's indices of the GPUs it reports lost (`NVML_ERROR_GPU_IS_LOST`).
    pub lost: Vec<u32>,
}

/// An initialised NVML, shut down and closed when dropped.
pub struct Nvml {
    lib: *mut c_void,
    count: CountFn,
    handle: HandleFn,
    uuid: StringFn,
    name: StringFn,
    memory: MemoryFn,
    driver_version: Option<SystemStringFn>,
    procs: Option<ProcsFn>,
    shutdown: Option<InitFn>,
}

// SAFETY: NVML's entry points are thread-safe (documented by NVIDIA); the struct only holds the
// library handle and function pointers.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Load and initialise NVML; `Err` says why it is unavailable (no library, an entry point
    /// missing, init failed).
    pub fn load() -> Result<Nvml, Error> {
        // SAFETY: dlopen with a constant NUL-terminated name; the handle is checked for null.
        let lib = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        if lib.is_null() {
            return Err(Error::NotFound);
        }
        let sym = |name: &CStr| {
            // SAFETY: `lib` is a live handle from dlopen and `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let need = |name: &'static CStr| {
            sym(name).ok_or(Error::Missing(name.to_str().unwrap_or("an entry point")))
        };
        let built = (|| -> Result<(Nvml, InitFn), Error> {
            // SAFETY: every transmute here turns a symbol NVML exports under that name into the
            // function type of its C signature (generated from nvml.h).
            unsafe {
                let init = std::mem::transmute::<*mut c_void, InitFn>(need(c"nvmlInit_v2")?);
                let nvml = Nvml {
                    lib,
                    count: std::mem::transmute::<*mut c_void, CountFn>(need(
                        c"nvmlDeviceGetCount_v2",
                    )?),
                    handle: std::mem::transmute::<*mut c_void, HandleFn>(need(
                        c"nvmlDeviceGetHandleByIndex_v2",
                    )?),
                    uuid: std::mem::transmute::<*mut c_void, StringFn>(need(c"nvmlDeviceGetUUID")?),
                    name: std::mem::transmute::<*mut c_void, StringFn>(need(c"nvmlDeviceGetName")?),
                    memory: std::mem::transmute::<*mut c_void, MemoryFn>(need(
                        c"nvmlDeviceGetMemoryInfo",
                    )?),
                    driver_version: sym(c"nvmlSystemGetDriverVersion")
                        .map(|p| std::mem::transmute::<*mut c_void, SystemStringFn>(p)),
                    procs: sym(c"nvmlDeviceGetComputeRunningProcesses_v3")
                        .map(|p| std::mem::transmute::<*mut c_void, ProcsFn>(p)),
                    shutdown: None,
                };
                Ok((nvml, init))
            }
        })();
        let (mut nvml, init) = match built {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: `lib` came from dlopen and nothing from it is kept.
                unsafe { libc::dlclose(lib) };
                return Err(e);
            }
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        check("nvmlInit_v2", unsafe { init() })?; // `nvml` drops: no shutdown yet, dlclose
                                                  // Only an initialised NVML is shut down (balancing this init; NVML counts them, so
                                                  // other users in the process keep theirs).
        nvml.shutdown = sym(c"nvmlShutdown")
            // SAFETY: nvmlShutdown's signature is nvmlInit_v2's (checked above).
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, InitFn>(p) });
        Ok(nvml)
    }

    fn handle(&self, index: u32) -> Result<nvmlDevice_t, Error> {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer.
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (self.handle)(index, &mut h)
        })?;
        Ok(h)
    }

    /// A string NVML writes into a buffer of `len` bytes (NUL included).
    fn string(
        call: &'static str,
        len: usize,
        f: impl FnOnce(*mut c_char, c_uint) -> NvmlReturn,
    ) -> Result<String, Error> {
        let mut buf = vec![0 as c_char; len + 1];
        check(call, f(buf.as_mut_ptr(), len as c_uint))?;
        // SAFETY: NVML got `len` bytes, so the buffer's last byte is still the NUL that ends it.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The kernel driver's version (`nvmlSystemGetDriverVersion`); `None` when this NVML
    /// cannot say.
    pub fn driver_version(&self) -> Option<String> {
        let f = self.driver_version?;
        // SAFETY: `string` passes a buffer of `l` writable bytes.
        Self::string("nvmlSystemGetDriverVersion", 96, |b, l| unsafe { f(b, l) }).ok()
    }

    /// Every GPU NVML sees and that answers, in NVML's order (a GPU NVML reports lost is left
    /// out: see [`Nvml::scan`]).
    pub fn devices(&self) -> Result<Vec<Gpu>, Error> {
        Ok(self.scan()?.gpus)
    }

    /// Every GPU NVML counts: those that answer, and the indices of those it reports lost
    /// (`NVML_ERROR_GPU_IS_LOST`: fallen off the bus, XID 79; NVML still counts such a GPU but
    /// gives no handle to it, so not even its UUID is known). Any other failure fails the scan.
    pub fn scan(&self) -> Result<Scan, Error> {
        let mut n: c_uint = 0;
        // SAFETY: `n` is a valid out-pointer.
        check("nvmlDeviceGetCount_v2", unsafe { (self.count)(&mut n) })?;
        let mut out = Scan::default();
        for index in 0..n {
            match self.gpu(index) {
                Ok(g) => out.gpus.push(g),
                Err(Error::Failed {
                    code: NVML_ERROR_GPU_IS_LOST,
                    ..
                }) => out.lost.push(index),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The GPU at NVML's `index`.
    fn gpu(&self, index: u32) -> Result<Gpu, Error> {
        let h = self.handle(index)?;
        let uuid = Self::string(
            "nvmlDeviceGetUUID",
            NVML_DEVICE_UUID_V2_BUFFER_SIZE,
            // SAFETY: `h` is a handle NVML just gave; the buffer has `l` writable bytes.
            |b, l| unsafe { (self.uuid)(h, b, l) },
        )?;
        let name = Self::string(
            "nvmlDeviceGetName",
            NVML_DEVICE_NAME_V2_BUFFER_SIZE,
            // SAFETY: as for the UUID just above.
            |b, l| unsafe { (self.name)(h, b, l) },
        )?;
        let mut mem = nvmlMemory_t::default();
        // SAFETY: `mem` is a valid out-pointer of the v1 struct this function takes.
        check("nvmlDeviceGetMemoryInfo", unsafe {
            (self.memory)(h, &mut mem)
        })?;
        Ok(Gpu {
            index,
            uuid,
            name,
            memory_total: mem.total,
            memory_used: mem.used,
        })
    }

    /// `(pid, bytes)` of each compute process on device `index`; `None` when this NVML cannot
    /// say (no `_v3` entry point, or the driver does not report per-process memory).
    pub fn processes(&self, index: u32) -> Result<Option<Vec<(u32, u64)>>, Error> {
        let Some(procs) = self.procs else {
            return Ok(None);
        };
        let h = self.handle(index)?;
        let mut cap: c_uint = 64;
        loop {
            let mut buf = vec![nvmlProcessInfo_t::default(); cap as usize];
            let mut n = cap;
            // SAFETY: `buf` holds `n` entries and NVML writes at most `n`.
            let r = unsafe { procs(h, &mut n, buf.as_mut_ptr()) };
            if r == NVML_ERROR_INSUFFICIENT_SIZE && n > cap && cap < 1 << 16 {
                cap = n + 16; // processes may start meanwhile
                continue;
            }
            check("nvmlDeviceGetComputeRunningProcesses_v3", r)?;
            let got = buf[..(n.min(cap) as usize)]
                .iter()
                .filter(|p| p.usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL)
                .map(|p| (p.pid, p.usedGpuMemory))
                .collect();
            return Ok(Some(got));
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown {
            // SAFETY: NVML was initialised in `load`; shutdown balances that init.
            unsafe { shutdown() };
        }
        // SAFETY: nothing obtained from the library outlives `self`.
        unsafe { libc::dlclose(self.lib) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_and_the_status() {
        let e = Error::Failed {
            call: "nvmlInit_v2",
            code: gpuslice_abi::NVML_ERROR_DRIVER_NOT_LOADED,
        };
        assert_eq!(
            e.to_string(),
            "nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)"
        );
        assert_eq!(
            String::from(Error::Missing("nvmlDeviceGetCount_v2")),
            "NVML lacks nvmlDeviceGetCount_v2"
        );
        assert_eq!(Error::NotFound.to_string(), "libnvidia-ml.so.1 not found");
    }
}
