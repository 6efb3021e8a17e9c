//! The node's GPUs, from NVML loaded at run time (`dlopen("libnvidia-ml.so.1")`, never linked:
//! the plugin image carries no driver; the node's driver library is mounted in, and the tests'
//! fake GPU provides the same name).

use gpuslice_abi::{
    nvmlDevice_t, nvmlMemory_t, nvml_return_name, NvmlReturn, NVML_DEVICE_NAME_V2_BUFFER_SIZE,
    NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_SUCCESS,
};
use std::ffi::{c_char, c_uint, c_void, CStr};

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
}

/// What NVML says about the node: the driver version and every GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// The kernel driver's version (`nvmlSystemGetDriverVersion`), empty when unknown.
    pub driver_version: String,
    /// GPUs in NVML's order.
    pub gpus: Vec<Gpu>,
}

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type HandleFn = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> NvmlReturn;
type StringFn = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> NvmlReturn;
type SystemStringFn = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn;
type MemoryFn = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> NvmlReturn;

fn failed(what: &str, r: NvmlReturn) -> String {
    format!(
        "{what} failed: {} ({r})",
        nvml_return_name(r).unwrap_or("unknown nvmlReturn_t")
    )
}

/// An initialised NVML (kept for the plugin's life: the inventory is read again on every resync).
pub struct Nvml {
    lib: *mut c_void,
    count: CountFn,
    handle: HandleFn,
    uuid: StringFn,
    name: StringFn,
    memory: MemoryFn,
    driver_version: Option<SystemStringFn>,
}

// SAFETY: NVML's entry points are thread-safe (documented by NVIDIA); the struct only holds the
// library handle and function pointers.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Load and initialise NVML; `Err` says why it is unavailable.
    pub fn load() -> Result<Nvml, String> {
        // SAFETY: dlopen with a constant NUL-terminated name; the handle is checked for null.
        let lib = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        if lib.is_null() {
            return Err(
                "libnvidia-ml.so.1 not found: mount the node's NVIDIA driver libraries into the \
                 plugin's container (see docs/kubernetes.md)"
                    .into(),
            );
        }
        let sym = |name: &CStr| {
            // SAFETY: `lib` is a live handle from dlopen and `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let need =
            |name: &CStr| sym(name).ok_or_else(|| format!("NVML lacks {}", name.to_string_lossy()));
        let built = (|| -> Result<(Nvml, InitFn), String> {
            // SAFETY: every transmute here turns a symbol NVML exports under that name into
            // the function type its C signature in nvml.h spells.
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
        let r = unsafe { init() };
        if r != NVML_SUCCESS {
            return Err(failed("nvmlInit_v2", r));
        }
        Ok(nvml)
    }

    fn read_string(
        what: &str,
        len: usize,
        f: impl FnOnce(*mut c_char, c_uint) -> NvmlReturn,
    ) -> Result<String, String> {
        let mut buf = vec![0 as c_char; len + 1];
        let r = f(buf.as_mut_ptr(), len as c_uint);
        if r != NVML_SUCCESS {
            return Err(failed(what, r));
        }
        // SAFETY: the buffer's last byte is never written by NVML (it got `len`), so a NUL ends it.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The driver version and every GPU, now.
    pub fn inventory(&self) -> Result<Inventory, String> {
        let driver_version = match self.driver_version {
            Some(f) => {
                // SAFETY: read_string passes a buffer of `l` writable bytes (plus the NUL).
                Self::read_string("nvmlSystemGetDriverVersion", 96, |b, l| unsafe { f(b, l) })
                    .unwrap_or_default()
            }
            None => String::new(),
        };
        let mut n: c_uint = 0;
        // SAFETY: `n` is a valid out-pointer.
        let r = unsafe { (self.count)(&mut n) };
        if r != NVML_SUCCESS {
            return Err(failed("nvmlDeviceGetCount_v2", r));
        }
        let mut gpus = Vec::new();
        for index in 0..n {
            let mut h: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: `h` is a valid out-pointer.
            let r = unsafe { (self.handle)(index, &mut h) };
            if r != NVML_SUCCESS {
                return Err(failed("nvmlDeviceGetHandleByIndex_v2", r));
            }
            let uuid = Self::read_string(
                "nvmlDeviceGetUUID",
                NVML_DEVICE_UUID_V2_BUFFER_SIZE,
                // SAFETY: `h` is a handle NVML just gave; the buffer has `l` writable bytes.
                |b, l| unsafe { (self.uuid)(h, b, l) },
            )?;
            let name = Self::read_string(
                "nvmlDeviceGetName",
                NVML_DEVICE_NAME_V2_BUFFER_SIZE,
                // SAFETY: as for the UUID just above.
                |b, l| unsafe { (self.name)(h, b, l) },
            )?;
            let mut mem = nvmlMemory_t::default();
            // SAFETY: `mem` is a valid out-pointer of the v1 struct this function takes.
            let r = unsafe { (self.memory)(h, &mut mem) };
            if r != NVML_SUCCESS {
                return Err(failed("nvmlDeviceGetMemoryInfo", r));
            }
            gpus.push(Gpu {
                index,
                uuid,
                name,
                memory_total: mem.total,
            });
        }
        Ok(Inventory {
            driver_version,
            gpus,
        })
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: nothing obtained from the library outlives `self` (no shutdown: other users of
        // NVML in this process, if any, keep their own reference count).
        unsafe { libc::dlclose(self.lib) };
    }
}
