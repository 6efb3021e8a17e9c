//! The NVML exports: the node's devices as NVML sees them (every device, in node order:
//! NVML ignores `CUDA_VISIBLE_DEVICES`), with memory, running processes and utilization read
//! from the shared state, so they reflect every process on the node.

#![allow(clippy::missing_safety_doc)]

use crate::config::{device_uuid, uuid_string, MAX_DEVICES};
use crate::runtime::{config, device_name};
use crate::shared::{self, Node};
use gpuslice_abi::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering::*};

/// The driver the fake presents for each CUDA version it can report: (CUDA version as
/// `cuDriverGetVersion` gives it, the NVML driver version of the release branch that ships
/// it), oldest first. The default, CUDA 13.0, is the 580 branch; `FAKEGPU_DRIVER_VERSION`
/// picks the newest branch not above it, so every answer describes one driver.
pub const DRIVERS: &[(i32, &str)] = &[
    (11080, "520.61.05"),
    (12000, "525.147.05"),
    (12020, "535.261.03"),
    (12040, "550.163.01"),
    (12060, "560.35.05"),
    (12080, "570.172.08"),
    (12090, "575.57.08"),
    (13000, "580.95.05"),
];

/// The NVML driver version string of the driver the fake presents.
pub fn driver_version_string() -> &'static str {
    let v = crate::api::driver_version();
    DRIVERS
        .iter()
        .rev()
        .find(|(cuda, _)| *cuda <= v)
        .unwrap_or(&DRIVERS[0])
        .1
}

type NResult<T> = Result<T, NvmlReturn>;

static INITS: AtomicU32 = AtomicU32::new(0);

#[repr(C)]
struct Handle {
    index: u32,
}

/// One handle per possible device: `nvmlDevice_t` is the address of entry `index`.
static HANDLES: [Handle; MAX_DEVICES] = {
    let mut h = [const { Handle { index: 0 } }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        h[i].index = i as u32;
        i += 1;
    }
    h
};

/// Run an export's body; a panic becomes `NVML_ERROR_UNKNOWN`, never unwinds into C.
fn guard(f: impl FnOnce() -> NResult<()>) -> NvmlReturn {
    crate::catch(NVML_SUCCESS, NVML_ERROR_UNKNOWN, f)
}

macro_rules! nvml_exports {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => { $(
        #[no_mangle]
        #[allow(unused_unsafe)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
            // SAFETY: the caller follows NVML's contract: pointer arguments are valid for
            // what the API documents.
            crate::nvml::guard(move || unsafe { $body })
        }
    )* };
}

#[path = "nvml_board.rs"]
mod board;
pub use board::*;

fn init() -> NResult<()> {
    let cfg = config().map_err(|_| NVML_ERROR_UNKNOWN)?;
    shared::node(cfg, crate::runtime::at_exit).map_err(|e| {
        eprintln!("{e}");
        NVML_ERROR_UNKNOWN
    })?;
    INITS.fetch_add(1, AcqRel);
    Ok(())
}

fn node() -> NResult<&'static Node> {
    if INITS.load(Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    shared::attached().ok_or(NVML_ERROR_UNINITIALIZED)
}

fn ndev(n: &Node) -> usize {
    n.state.ndev.load(Relaxed) as usize
}

fn dev(h: nvmlDevice_t) -> NResult<(&'static Node, usize)> {
    let n = node()?;
    let base = HANDLES.as_ptr() as usize;
    let off = (h as usize).wrapping_sub(base);
    let i = off / std::mem::size_of::<Handle>();
    if h.is_null() || !off.is_multiple_of(std::mem::size_of::<Handle>()) || i >= ndev(n) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    present(i)?;
    Ok((n, i))
}

/// `NVML_ERROR_GPU_IS_LOST` for a device that fell off the bus ([`crate::lost`]).
fn present(i: usize) -> NResult<()> {
    if crate::lost::is_lost(i) {
        Err(NVML_ERROR_GPU_IS_LOST)
    } else {
        Ok(())
    }
}

fn put<T>(p: *mut T, v: T) -> NResult<()> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for one T by the API contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NResult<()> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// The device at a PCI bus id (`00000000:01:00.0`: device `i` is on bus `i + 1`).
fn device_of_bus_id(bus: *const c_char) -> NResult<usize> {
    let n = node()?;
    if bus.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null; NVML's contract: a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(bus) }
        .to_str()
        .map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    let b = s
        .rsplit(':')
        .nth(1)
        .and_then(|b| usize::from_str_radix(b, 16).ok())
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    if b == 0 || b > ndev(n) {
        return Err(NVML_ERROR_NOT_FOUND);
    }
    Ok(b - 1)
}

fn handle_of(i: usize) -> nvmlDevice_t {
    &HANDLES[i] as *const Handle as nvmlDevice_t
}

fn memory(n: &Node, i: usize) -> (u64, u64) {
    shared::reap(n);
    let (free, total) = n.mem_info(i);
    (total, total - free)
}

/// `nvmlProcessInfo_v1_t`, the entries of the unversioned process queries.
#[repr(C)]
pub struct ProcessInfoV1 {
    /// The process.
    pub pid: c_uint,
    /// Bytes it holds.
    pub used_gpu_memory: u64,
}

/// The v1 form of [`processes`] (16-byte entries).
fn processes_v1(h: nvmlDevice_t, count: *mut c_uint, infos: *mut ProcessInfoV1) -> NResult<()> {
    fill_processes(h, count, infos, |pid, used| ProcessInfoV1 {
        pid,
        used_gpu_memory: used,
    })
}

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
pub struct ProcessDetailList {
    /// [`PROCESS_DETAIL_LIST_V1`].
    pub version: c_uint,
    /// 0 compute, 1 graphics, 2 MPS.
    pub mode: c_uint,
    /// Entries of `proc_array` (in), entries needed or written (out).
    pub num_proc_array_entries: c_uint,
    /// The caller's array.
    pub proc_array: *mut ProcessDetail,
}

/// `nvmlProcessDetail_v1_t`.
#[repr(C)]
pub struct ProcessDetail {
    /// The process.
    pub pid: c_uint,
    /// Bytes it holds.
    pub used_gpu_memory: u64,
    /// MIG instances (none).
    pub gpu_instance_id: c_uint,
    /// MIG instances (none).
    pub compute_instance_id: c_uint,
    /// Confidential-computing memory (none).
    pub used_gpu_cc_protected_memory: u64,
}

/// `nvmlProcessDetailList_v1`.
pub const PROCESS_DETAIL_LIST_V1: c_uint =
    std::mem::size_of::<ProcessDetailList>() as c_uint | (1 << 24);

/// `nvmlDeviceGetRunningProcessDetailList`: compute processes as the other lists give them;
/// no graphics or MPS processes on the fake.
fn process_detail_list(h: nvmlDevice_t, l: *mut ProcessDetailList) -> NResult<()> {
    let (n, i) = dev(h)?;
    if l.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: l is non-null and points to the caller's list by the API contract; its array
    // holds num_proc_array_entries entries.
    unsafe {
        if (*l).version != PROCESS_DETAIL_LIST_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let procs = match (*l).mode {
            0 => shared::processes(n, i),
            1 | 2 => vec![],
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        let cap = (*l).num_proc_array_entries as usize;
        (*l).num_proc_array_entries = procs.len() as c_uint;
        if cap < procs.len() || ((*l).proc_array.is_null() && !procs.is_empty()) {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, (pid, used)) in procs.into_iter().enumerate() {
            (*l).proc_array.add(k).write_unaligned(ProcessDetail {
                pid,
                used_gpu_memory: used,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
                used_gpu_cc_protected_memory: 0,
            });
        }
    }
    Ok(())
}

/// `nvmlAccountingStats_t`.
#[repr(C)]
pub struct AccountingStats {
    /// Percent of the time the process had a kernel running.
    pub gpu_utilization: c_uint,
    /// Percent of the time the process used the memory controller.
    pub memory_utilization: c_uint,
    /// Most bytes it held.
    pub max_memory_usage: u64,
    /// Run time in ms (0 while running).
    pub time: u64,
    /// Start, µs since the epoch.
    pub start_time: u64,
    /// 1 while it runs.
    pub is_running: c_uint,
    /// Reserved.
    pub reserved: [c_uint; 5],
}

/// `nvmlDeviceGetAccountingStats`: a process using the device (what it holds now stands for
/// its high-water mark); any other pid is `NVML_ERROR_NOT_FOUND`.
fn accounting_stats(h: nvmlDevice_t, pid: c_uint, s: *mut AccountingStats) -> NResult<()> {
    let (n, i) = dev(h)?;
    let Some((_, used)) = shared::processes(n, i).into_iter().find(|&(p, _)| p == pid) else {
        return Err(NVML_ERROR_NOT_FOUND);
    };
    put(
        s,
        AccountingStats {
            gpu_utilization: 0,
            memory_utilization: 0,
            max_memory_usage: used,
            time: 0,
            start_time: 0,
            is_running: 1,
            reserved: [0; 5],
        },
    )
}

fn processes(h: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> NResult<()> {
    fill_processes(h, count, infos, |pid, used| nvmlProcessInfo_t {
        pid,
        usedGpuMemory: used,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    })
}

/// The process-list protocol of every version: `*count` in is the room in `infos`, out the
/// number of processes; too little room is `INSUFFICIENT_SIZE`. `entry` builds one entry.
fn fill_processes<T>(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    entry: impl Fn(c_uint, u64) -> T,
) -> NResult<()> {
    let (n, i) = dev(h)?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let procs = shared::processes(n, i);
    // SAFETY: count is non-null; infos holds *count entries by the API contract.
    unsafe {
        let cap = *count as usize;
        *count = procs.len() as c_uint;
        if cap < procs.len() || (infos.is_null() && !procs.is_empty()) {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, (pid, used)) in procs.into_iter().enumerate() {
            infos.add(k).write_unaligned(entry(pid, used));
        }
    }
    Ok(())
}

nvml_exports! {
    fn nvmlInit_v2() { init() }
    fn nvmlInit() { init() }
    fn nvmlInitWithFlags(_flags: c_uint) { init() }
    fn nvmlShutdown() {
        INITS.fetch_update(AcqRel, Acquire, |v| v.checked_sub(1)).map(|_| ()).map_err(|_| NVML_ERROR_UNINITIALIZED)
    }
    fn nvmlDeviceGetCount_v2(c: *mut c_uint) { let n = node()?; put(c, ndev(n) as c_uint) }
    fn nvmlDeviceGetCount(c: *mut c_uint) { let n = node()?; put(c, ndev(n) as c_uint) }
    fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut nvmlDevice_t) {
        let n = node()?;
        if i as usize >= ndev(n) { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        present(i as usize)?;
        put(h, handle_of(i as usize))
    }
    fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut nvmlDevice_t) {
        let n = node()?;
        if i as usize >= ndev(n) { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        present(i as usize)?;
        put(h, handle_of(i as usize))
    }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, h: *mut nvmlDevice_t) {
        let n = node()?;
        if uuid.is_null() { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        let want = CStr::from_ptr(uuid).to_str().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        // A lost device's UUID cannot be read: not found among those that answer is
        // GPU_IS_LOST while any device is lost ("if any GPU has fallen off the bus").
        let answering = || (0..ndev(n)).filter(|&i| present(i).is_ok());
        let Some(i) = answering().find(|&i| uuid_string(&device_uuid(i)) == want) else {
            return Err(if answering().count() < ndev(n) { NVML_ERROR_GPU_IS_LOST } else { NVML_ERROR_NOT_FOUND });
        };
        put(h, handle_of(i))
    }
    fn nvmlDeviceGetHandleByPciBusId_v2(bus: *const c_char, h: *mut nvmlDevice_t) {
        let i = device_of_bus_id(bus)?;
        present(i)?;
        put(h, handle_of(i))
    }
    fn nvmlDeviceGetName(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) {
        let (n, i) = dev(h)?;
        put_str(buf, len, &device_name(n.state.dev[i].total.load(Relaxed)))
    }
    fn nvmlDeviceGetUUID(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) {
        let (_, i) = dev(h)?;
        put_str(buf, len, &uuid_string(&device_uuid(i)))
    }
    fn nvmlDeviceGetSerial(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) {
        let (_, i) = dev(h)?;
        put_str(buf, len, &format!("FAKE{:010}", i))
    }
    fn nvmlDeviceGetIndex(h: nvmlDevice_t, idx: *mut c_uint) { let (_, i) = dev(h)?; put(idx, i as c_uint) }
    fn nvmlDeviceGetMinorNumber(h: nvmlDevice_t, m: *mut c_uint) { let (_, i) = dev(h)?; put(m, i as c_uint) }
    fn nvmlDeviceGetMemoryInfo(h: nvmlDevice_t, m: *mut nvmlMemory_t) {
        let (n, i) = dev(h)?;
        let (total, used) = memory(n, i);
        put(m, nvmlMemory_t { total, free: total - used, used })
    }
    fn nvmlDeviceGetMemoryInfo_v2(h: nvmlDevice_t, m: *mut nvmlMemory_v2_t) {
        let (n, i) = dev(h)?;
        if m.is_null() { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        if (*m).version != NVML_MEMORY_V2 { return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH); }
        let (total, used) = memory(n, i);
        put(m, nvmlMemory_v2_t { version: NVML_MEMORY_V2, total, reserved: 0, free: total - used, used })
    }
    fn nvmlDeviceGetComputeRunningProcesses_v3(h: nvmlDevice_t, c: *mut c_uint, p: *mut nvmlProcessInfo_t) { processes(h, c, p) }
    fn nvmlDeviceGetComputeRunningProcesses_v2(h: nvmlDevice_t, c: *mut c_uint, p: *mut nvmlProcessInfo_t) { processes(h, c, p) }
    fn nvmlDeviceGetComputeRunningProcesses(h: nvmlDevice_t, c: *mut c_uint, p: *mut c_void) { processes_v1(h, c, p as *mut ProcessInfoV1) }
    // The fake's devices have no NVLink and no fabric: what a PCIe GPU's NVML answers.
    fn nvmlDeviceGetNvLinkRemoteDeviceType(h: nvmlDevice_t, _link: c_uint, _t: *mut c_uint) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(h: nvmlDevice_t, _link: c_uint, _p: *mut nvmlPciInfo_t) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetNvLinkRemotePciInfo(h: nvmlDevice_t, _link: c_uint, _p: *mut nvmlPciInfo_t) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetGpuFabricInfo(h: nvmlDevice_t, _i: *mut c_void) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetGpuFabricInfoV(h: nvmlDevice_t, _i: *mut c_void) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(h: nvmlDevice_t, c: *mut c_uint, _p: *mut nvmlProcessInfo_t) { dev(h)?; put(c, 0) }
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(h: nvmlDevice_t, c: *mut c_uint, _p: *mut nvmlProcessInfo_t) { dev(h)?; put(c, 0) }
    fn nvmlDeviceGetGraphicsRunningProcesses(h: nvmlDevice_t, c: *mut c_uint, _p: *mut c_void) { dev(h)?; put(c, 0) }
    // The fake runs no MPS server: its MPS lists are empty.
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(h: nvmlDevice_t, c: *mut c_uint, _p: *mut nvmlProcessInfo_t) { dev(h)?; put(c, 0) }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(h: nvmlDevice_t, c: *mut c_uint, _p: *mut nvmlProcessInfo_t) { dev(h)?; put(c, 0) }
    fn nvmlDeviceGetMPSComputeRunningProcesses(h: nvmlDevice_t, c: *mut c_uint, _p: *mut c_void) { dev(h)?; put(c, 0) }
    fn nvmlDeviceGetRunningProcessDetailList(h: nvmlDevice_t, l: *mut c_void) { process_detail_list(h, l.cast()) }
    // Accounting is on (as root can set it with `nvidia-smi -am 1`): the processes that use
    // the device, with what they hold; a process that ended is forgotten (the fake keeps no
    // history).
    fn nvmlDeviceGetAccountingMode(h: nvmlDevice_t, mode: *mut c_uint) { dev(h)?; put(mode, 1) }
    fn nvmlDeviceGetAccountingBufferSize(h: nvmlDevice_t, n: *mut c_uint) { dev(h)?; put(n, 4000) }
    fn nvmlDeviceGetAccountingPids(h: nvmlDevice_t, c: *mut c_uint, p: *mut c_uint) { fill_processes(h, c, p, |pid, _| pid) }
    fn nvmlDeviceGetAccountingStats(h: nvmlDevice_t, pid: c_uint, s: *mut c_void) { accounting_stats(h, pid, s.cast()) }
    // The fake measures GPU time per device, not per process: it answers as a GPU without
    // per-process accounting does.
    fn nvmlDeviceGetProcessUtilization(h: nvmlDevice_t, _s: *mut std::ffi::c_void, _c: *mut c_uint, _last: u64) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetProcessesUtilizationInfo(h: nvmlDevice_t, _info: *mut std::ffi::c_void) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetUtilizationRates(h: nvmlDevice_t, u: *mut nvmlUtilization_t) {
        let (n, i) = dev(h)?;
        let gpu = shared::utilization(n.state, i, shared::now_ns());
        put(u, nvmlUtilization_t { gpu, memory: gpu / 2 })
    }
    fn nvmlDeviceGetCudaComputeCapability(h: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        dev(h)?;
        put(major, 9)?;
        put(minor, 0)
    }
    fn nvmlDeviceGetPciInfo_v3(h: nvmlDevice_t, p: *mut nvmlPciInfo_t) {
        let (_, i) = dev(h)?;
        let mut info = nvmlPciInfo_t { busIdLegacy: [0; 16], domain: 0, bus: i as c_uint + 1, device: 0, pciDeviceId: 0x2335_10de, pciSubSystemId: 0x18be_10de, busId: [0; 32] };
        let id = format!("00000000:{:02X}:00.0", i + 1);
        for (k, b) in id.bytes().enumerate() { info.busId[k] = b as c_char; }
        for (k, b) in id[4..].bytes().enumerate() { info.busIdLegacy[k] = b as c_char; }
        put(p, info)
    }
    fn nvmlDeviceGetTemperature(h: nvmlDevice_t, _sensor: c_uint, t: *mut c_uint) { dev(h)?; put(t, board::TEMPERATURE_C) }
    fn nvmlDeviceGetPowerUsage(h: nvmlDevice_t, mw: *mut c_uint) {
        let (n, i) = dev(h)?;
        put(mw, board::power_mw(shared::utilization(n.state, i, shared::now_ns())))
    }
    fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) { node()?; put_str(buf, len, driver_version_string()) }
    fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) { node()?; put_str(buf, len, &format!("{}.{}", crate::api::driver_version() / 1000, driver_version_string())) }
    fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) { node()?; put(v, crate::api::driver_version()) }
    fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) { node()?; put(v, crate::api::driver_version()) }
}

/// `nvmlErrorString`: the code's name, `Unknown Error` for a code NVML does not define.
#[no_mangle]
pub extern "C" fn nvmlErrorString(r: NvmlReturn) -> *const c_char {
    static NAMES: std::sync::OnceLock<Vec<(NvmlReturn, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    let name = || {
        let v = NAMES.get_or_init(|| {
            (0..1000)
                .filter_map(|c| {
                    let n = std::ffi::CString::new(nvml_return_name(c)?).ok()?;
                    Some((c, n))
                })
                .collect()
        });
        v.iter().find(|(c, _)| *c == r).map(|(_, s)| s.as_ptr())
    };
    let unknown = c"Unknown Error".as_ptr();
    std::panic::catch_unwind(name).map_or(unknown, |p| p.unwrap_or(unknown))
}
