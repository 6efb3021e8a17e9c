//! NVML, loaded at run time with `dlopen("libnvidia-ml.so.1")` (never linked, so `gpuslice`
//! runs on machines without a driver): which devices exist, and how much device memory each
//! process really holds, for the monitor's audit. Everything here is optional: when the library
//! or a function is missing, callers fall back to what the ledger knows.

use gpuslice_abi::{
    nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_t, nvml_return_name, pfn, NvmlReturn,
    NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_SUCCESS, NVML_VALUE_NOT_AVAILABLE_ULL,
};
use std::ffi::{c_char, c_uint, c_void, CStr};

// The entry points' C signatures, generated from nvml.h. Where one type serves two functions,
// the `const` checks that their signatures really are the same.
type InitFn = pfn::nvmlInit_v2;
type CountFn = pfn::nvmlDeviceGetCount_v2;
type HandleFn = pfn::nvmlDeviceGetHandleByIndex_v2;
type StringFn = pfn::nvmlDeviceGetUUID;
type MemoryFn = pfn::nvmlDeviceGetMemoryInfo;
type ProcsFn = pfn::nvmlDeviceGetComputeRunningProcesses_v3;
const _: fn(pfn::nvmlShutdown) -> InitFn = |f| f;
const _: fn(pfn::nvmlDeviceGetName) -> StringFn = |f| f;

/// A device as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlDevice {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    /// Device memory in use, by anyone (processes with or without gpuslice, the driver).
    pub memory_used: u64,
}

/// An initialised NVML.
pub struct Nvml {
    lib: *mut c_void,
    count: CountFn,
    handle: HandleFn,
    uuid: StringFn,
    name: StringFn,
    memory: MemoryFn,
    procs: Option<ProcsFn>,
    shutdown: Option<InitFn>,
}

/// `nvmlFoo() failed: NVML_ERROR_X (n)`.
fn failed(what: &str, r: NvmlReturn) -> String {
    format!(
        "{what} failed: {} ({r})",
        nvml_return_name(r).unwrap_or("unknown nvmlReturn_t")
    )
}

impl Nvml {
    /// Load and initialise NVML; `Err` says why it is unavailable (no library, init failed).
    pub fn load() -> Result<Nvml, String> {
        // SAFETY: dlopen with a constant NUL-terminated name; the handle is checked for null.
        let lib = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        if lib.is_null() {
            return Err("libnvidia-ml.so.1 not found (no NVIDIA driver here?)".into());
        }
        let sym = |name: &CStr| {
            // SAFETY: `lib` is a live handle from dlopen and `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let need =
            |name: &CStr| sym(name).ok_or_else(|| format!("NVML lacks {}", name.to_string_lossy()));
        let init = need(c"nvmlInit_v2");
        let built = (|| -> Result<(Nvml, *mut c_void), String> {
            let init = init?;
            // SAFETY: every transmute below turns a symbol NVML exports under that name into the
            // function type of its C signature (generated from nvml.h).
            unsafe {
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
                    procs: sym(c"nvmlDeviceGetComputeRunningProcesses_v3")
                        .map(|p| std::mem::transmute::<*mut c_void, ProcsFn>(p)),
                    shutdown: sym(c"nvmlShutdown")
                        .map(|p| std::mem::transmute::<*mut c_void, InitFn>(p)),
                };
                Ok((nvml, init))
            }
        })();
        let (nvml, init) = match built {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: `lib` came from dlopen and nothing from it is kept.
                unsafe { libc::dlclose(lib) };
                return Err(e);
            }
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        let r = unsafe { std::mem::transmute::<*mut c_void, InitFn>(init)() };
        if r != NVML_SUCCESS {
            // `nvml` has no shutdown to run yet: forget it so Drop does not call nvmlShutdown.
            let lib = nvml.lib;
            std::mem::forget(nvml);
            // SAFETY: as above.
            unsafe { libc::dlclose(lib) };
            return Err(failed("nvmlInit_v2", r));
        }
        Ok(nvml)
    }

    fn handle(&self, index: u32) -> Result<nvmlDevice_t, String> {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer.
        let r = unsafe { (self.handle)(index, &mut h) };
        if r != NVML_SUCCESS {
            return Err(failed("nvmlDeviceGetHandleByIndex_v2", r));
        }
        Ok(h)
    }

    fn string(
        &self,
        f: StringFn,
        h: nvmlDevice_t,
        what: &str,
        len: usize,
    ) -> Result<String, String> {
        let mut buf = vec![0 as c_char; len];
        // SAFETY: `buf` has `len` writable bytes and NVML writes at most that, NUL included.
        let r = unsafe { f(h, buf.as_mut_ptr(), len as c_uint) };
        if r != NVML_SUCCESS {
            return Err(failed(what, r));
        }
        buf.push(0);
        // SAFETY: the buffer ends with a NUL (pushed above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Every device NVML sees, in NVML's order.
    pub fn devices(&self) -> Result<Vec<NvmlDevice>, String> {
        let mut n: c_uint = 0;
        // SAFETY: `n` is a valid out-pointer.
        let r = unsafe { (self.count)(&mut n) };
        if r != NVML_SUCCESS {
            return Err(failed("nvmlDeviceGetCount_v2", r));
        }
        let mut out = Vec::new();
        for index in 0..n {
            let h = self.handle(index)?;
            let uuid = self.string(
                self.uuid,
                h,
                "nvmlDeviceGetUUID",
                NVML_DEVICE_UUID_V2_BUFFER_SIZE,
            )?;
            let name = self.string(
                self.name,
                h,
                "nvmlDeviceGetName",
                NVML_DEVICE_NAME_V2_BUFFER_SIZE,
            )?;
            let mut mem = nvmlMemory_t::default();
            // SAFETY: `mem` is a valid out-pointer of the v1 struct this function takes.
            let r = unsafe { (self.memory)(h, &mut mem) };
            if r != NVML_SUCCESS {
                return Err(failed("nvmlDeviceGetMemoryInfo", r));
            }
            out.push(NvmlDevice {
                index,
                uuid,
                name,
                memory_total: mem.total,
                memory_used: mem.used,
            });
        }
        Ok(out)
    }

    /// `(pid, bytes)` of each compute process on device `index`; `None` when this NVML cannot
    /// say (no `_v3` entry point, or the driver does not report per-process memory).
    pub fn processes(&self, index: u32) -> Result<Option<Vec<(u32, u64)>>, String> {
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
            if r != NVML_SUCCESS {
                return Err(failed("nvmlDeviceGetComputeRunningProcesses_v3", r));
            }
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

/// NVML's index of each device UUID, loaded once per process (empty without NVML): how views
/// number devices the way `nvidia-smi` does.
pub fn indices() -> &'static std::collections::HashMap<String, u32> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<String, u32>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        Nvml::load()
            .and_then(|n| n.devices())
            .map(|ds| ds.into_iter().map(|d| (d.uuid, d.index)).collect())
            .unwrap_or_default()
    })
}
