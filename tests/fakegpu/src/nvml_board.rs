//! What monitoring tools (nvitop, gpustat, nvidia-smi-like dashboards) and frameworks (JAX's
//! PCIe check) ask NVML about the board at start: clocks, power, thermals, PCIe link, ECC,
//! MIG and display state, BAR1. The answers are an H200 SXM's (no fans, no video encoder
//! load, PCIe Gen5 x16, 700 W, MIG off, persistence on); the ones that move (clocks, power,
//! throttle reasons, energy) follow the device's simulated engine load. Apart from `nvml.rs`
//! because these are the board's constants, while that file serves the state every process
//! shares (memory, processes, utilisation).

use super::{dev, handle_of, node, put, put_str, NResult};
use crate::shared::{self, now_ns};
use gpuslice_abi::*;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::*;

/// Board power limit, mW (H200 SXM).
const POWER_LIMIT_MW: c_uint = 700_000;
/// Lowest settable power limit, mW.
const POWER_MIN_MW: c_uint = 200_000;
/// Idle board power, mW (what `nvmlDeviceGetPowerUsage` reports with the engine idle).
const IDLE_POWER_MW: c_uint = 100_000;
/// Maximum graphics/SM clock, MHz (the `CLOCK_RATE` attribute's 1.98 GHz).
const SM_MAX_MHZ: c_uint = 1980;
/// Idle graphics/SM clock, MHz.
const SM_IDLE_MHZ: c_uint = 345;
/// Memory clock, MHz (the `MEMORY_CLOCK_RATE` attribute).
const MEM_MHZ: c_uint = 2619;
/// Video clock, MHz.
const VIDEO_MHZ: c_uint = 1545;
/// `nvmlClocksEventReasons`: the GPU is idle.
const EVENT_REASON_GPU_IDLE: u64 = 0x1;
/// `NVML_PCIE_LINK_MAX_SPEED_32000MBPS` (Gen5).
const PCIE_MAX_SPEED_GEN5: c_uint = 5;
/// `NVML_DEVICE_ARCH_HOPPER`.
const ARCH_HOPPER: c_uint = 9;
/// `nvmlTemperature_v1`: sizeof(nvmlTemperature_v1_t) | 1 << 24.
const TEMPERATURE_V1: c_uint = 12 | 1 << 24;
/// The temperature NVML reports (°C).
pub(super) const TEMPERATURE_C: c_uint = 40;

/// Engine load of device `i` over the last second, percent.
fn load(i: usize) -> NResult<c_uint> {
    let n = node()?;
    Ok(shared::utilization(n.state, i, now_ns()))
}

/// Board power for a load in percent, mW: idle power plus the load's share of the rest.
pub(super) fn power_mw(load: c_uint) -> c_uint {
    IDLE_POWER_MW + (POWER_LIMIT_MW - IDLE_POWER_MW) / 100 * load.min(100)
}

/// `nvmlClockType_t` (graphics, SM, memory, video) at `load` percent.
fn clock(ty: c_uint, load: c_uint, max: bool) -> NResult<c_uint> {
    match ty {
        0 | 1 if max || load > 0 => Ok(SM_MAX_MHZ),
        0 | 1 => Ok(SM_IDLE_MHZ),
        2 => Ok(MEM_MHZ),
        3 => Ok(VIDEO_MHZ),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// `nvmlFieldValue_t` (40 bytes): the fake reports no field, each entry says so in its own
/// `nvmlReturn`, as NVML does for fields a board lacks.
#[repr(C)]
struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: NvmlReturn,
    value: u64,
}

/// `nvmlBAR1Memory_t`.
#[repr(C)]
struct Bar1Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlTemperature_v1_t`.
#[repr(C)]
struct TemperatureV1 {
    version: c_uint,
    sensor_type: c_uint,
    temperature: c_int,
}

nvml_exports! {
    fn nvmlDeviceGetClockInfo(h: nvmlDevice_t, ty: c_uint, mhz: *mut c_uint) { let (_, i) = dev(h)?; put(mhz, clock(ty, load(i)?, false)?) }
    fn nvmlDeviceGetMaxClockInfo(h: nvmlDevice_t, ty: c_uint, mhz: *mut c_uint) { dev(h)?; put(mhz, clock(ty, 0, true)?) }
    fn nvmlDeviceGetClock(h: nvmlDevice_t, ty: c_uint, id: c_uint, mhz: *mut c_uint) {
        // clockId: current, application target, default application target, customer max.
        let (_, i) = dev(h)?;
        if id > 3 { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        put(mhz, clock(ty, load(i)?, id > 0)?)
    }
    fn nvmlDeviceGetCurrentClocksEventReasons(h: nvmlDevice_t, r: *mut u64) {
        let (_, i) = dev(h)?;
        put(r, if load(i)? == 0 { EVENT_REASON_GPU_IDLE } else { 0 })
    }
    fn nvmlDeviceGetCurrentClocksThrottleReasons(h: nvmlDevice_t, r: *mut u64) {
        let (_, i) = dev(h)?;
        put(r, if load(i)? == 0 { EVENT_REASON_GPU_IDLE } else { 0 })
    }
    fn nvmlDeviceGetPowerManagementLimit(h: nvmlDevice_t, mw: *mut c_uint) { dev(h)?; put(mw, POWER_LIMIT_MW) }
    fn nvmlDeviceGetEnforcedPowerLimit(h: nvmlDevice_t, mw: *mut c_uint) { dev(h)?; put(mw, POWER_LIMIT_MW) }
    fn nvmlDeviceGetPowerManagementLimitConstraints(h: nvmlDevice_t, min: *mut c_uint, max: *mut c_uint) {
        dev(h)?;
        put(min, POWER_MIN_MW)?;
        put(max, POWER_LIMIT_MW)
    }
    fn nvmlDeviceGetPowerManagementMode(h: nvmlDevice_t, m: *mut c_uint) { dev(h)?; put(m, 1) }
    fn nvmlDeviceGetTotalEnergyConsumption(h: nvmlDevice_t, mj: *mut u64) {
        // Idle power since the host's monotonic clock started, plus the device's busy time at
        // full power: it only grows, as a board's counter does.
        let (n, i) = dev(h)?;
        let busy_ns = n.state.dev[i].busy_ns.load(Relaxed);
        let idle = IDLE_POWER_MW as u64 * (now_ns() / 1_000_000) / 1000;
        put(mj, idle + (POWER_LIMIT_MW - IDLE_POWER_MW) as u64 * (busy_ns / 1_000_000) / 1000)
    }
    fn nvmlDeviceGetPerformanceState(h: nvmlDevice_t, p: *mut c_uint) { dev(h)?; put(p, 0) }
    fn nvmlDeviceGetPowerState(h: nvmlDevice_t, p: *mut c_uint) { dev(h)?; put(p, 0) }
    fn nvmlDeviceGetPersistenceMode(h: nvmlDevice_t, m: *mut c_uint) { dev(h)?; put(m, 1) }
    fn nvmlDeviceGetComputeMode(h: nvmlDevice_t, m: *mut c_uint) { dev(h)?; put(m, 0) }
    fn nvmlDeviceGetDisplayMode(h: nvmlDevice_t, m: *mut c_uint) { dev(h)?; put(m, 0) }
    fn nvmlDeviceGetDisplayActive(h: nvmlDevice_t, m: *mut c_uint) { dev(h)?; put(m, 0) }
    // An SXM board is cooled by the chassis: no fans of its own.
    fn nvmlDeviceGetNumFans(h: nvmlDevice_t, n: *mut c_uint) { dev(h)?; put(n, 0) }
    fn nvmlDeviceGetFanSpeed(h: nvmlDevice_t, _s: *mut c_uint) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetFanSpeed_v2(h: nvmlDevice_t, _fan: c_uint, _s: *mut c_uint) { dev(h)?; Err(NVML_ERROR_INVALID_ARGUMENT) }
    fn nvmlDeviceGetTemperatureV(h: nvmlDevice_t, t: *mut c_void) {
        dev(h)?;
        let t = t as *mut TemperatureV1;
        if t.is_null() { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        // SAFETY: non-null; the caller passes an nvmlTemperature_v1_t, whose version we check
        // before writing beyond it.
        let (version, sensor) = unsafe { ((*t).version, (*t).sensor_type) };
        if version != TEMPERATURE_V1 { return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH); }
        if sensor != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        // SAFETY: as above.
        unsafe { (*t).temperature = TEMPERATURE_C as c_int };
        Ok(())
    }
    // The video engines exist but the fake runs no video work.
    fn nvmlDeviceGetEncoderUtilization(h: nvmlDevice_t, u: *mut c_uint, period_us: *mut c_uint) { dev(h)?; put(u, 0)?; put(period_us, 167_000) }
    fn nvmlDeviceGetDecoderUtilization(h: nvmlDevice_t, u: *mut c_uint, period_us: *mut c_uint) { dev(h)?; put(u, 0)?; put(period_us, 167_000) }
    fn nvmlDeviceGetMaxPcieLinkGeneration(h: nvmlDevice_t, g: *mut c_uint) { dev(h)?; put(g, 5) }
    fn nvmlDeviceGetGpuMaxPcieLinkGeneration(h: nvmlDevice_t, g: *mut c_uint) { dev(h)?; put(g, 5) }
    fn nvmlDeviceGetCurrPcieLinkGeneration(h: nvmlDevice_t, g: *mut c_uint) { dev(h)?; put(g, 5) }
    fn nvmlDeviceGetMaxPcieLinkWidth(h: nvmlDevice_t, w: *mut c_uint) { dev(h)?; put(w, 16) }
    fn nvmlDeviceGetCurrPcieLinkWidth(h: nvmlDevice_t, w: *mut c_uint) { dev(h)?; put(w, 16) }
    fn nvmlDeviceGetPcieLinkMaxSpeed(h: nvmlDevice_t, s: *mut c_uint) { dev(h)?; put(s, PCIE_MAX_SPEED_GEN5) }
    fn nvmlDeviceGetPcieSpeed(h: nvmlDevice_t, mbps: *mut c_uint) { dev(h)?; put(mbps, 32_000) }
    fn nvmlDeviceGetPcieThroughput(h: nvmlDevice_t, counter: c_uint, kbps: *mut c_uint) {
        // Copies in the fake move host memory, not PCIe traffic.
        dev(h)?;
        if counter > 1 { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        put(kbps, 0)
    }
    fn nvmlDeviceGetEccMode(h: nvmlDevice_t, cur: *mut c_uint, pending: *mut c_uint) { dev(h)?; put(cur, 1)?; put(pending, 1) }
    fn nvmlDeviceGetTotalEccErrors(h: nvmlDevice_t, ty: c_uint, counter: c_uint, n: *mut u64) {
        dev(h)?;
        if ty > 1 || counter > 1 { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        put(n, 0)
    }
    fn nvmlDeviceGetMigMode(h: nvmlDevice_t, cur: *mut c_uint, pending: *mut c_uint) { dev(h)?; put(cur, 0)?; put(pending, 0) }
    fn nvmlDeviceIsMigDeviceHandle(h: nvmlDevice_t, is_mig: *mut c_uint) { dev(h)?; put(is_mig, 0) }
    fn nvmlDeviceGetMaxMigDeviceCount(h: nvmlDevice_t, n: *mut c_uint) { dev(h)?; put(n, 7) }
    fn nvmlDeviceGetMigDeviceHandleByIndex(h: nvmlDevice_t, _i: c_uint, _m: *mut nvmlDevice_t) { dev(h)?; Err(NVML_ERROR_NOT_FOUND) }
    fn nvmlDeviceGetGpuInstanceId(h: nvmlDevice_t, _id: *mut c_uint) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetComputeInstanceId(h: nvmlDevice_t, _id: *mut c_uint) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h: nvmlDevice_t, _d: *mut nvmlDevice_t) { dev(h)?; Err(NVML_ERROR_INVALID_ARGUMENT) }
    fn nvmlDeviceGetConfComputeMemSizeInfo(h: nvmlDevice_t, _m: *mut c_void) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetBAR1MemoryInfo(h: nvmlDevice_t, b: *mut c_void) {
        // BAR1 spans the whole memory, rounded up to a power of two, as on Hopper boards.
        let (n, i) = dev(h)?;
        let total = n.state.dev[i].total.load(Relaxed).next_power_of_two();
        let used = 2 << 20;
        put(b as *mut Bar1Memory, Bar1Memory { total, free: total - used, used })
    }
    fn nvmlDeviceGetFieldValues(h: nvmlDevice_t, count: c_int, values: *mut c_void) {
        dev(h)?;
        if count < 0 || (count > 0 && values.is_null()) { return Err(NVML_ERROR_INVALID_ARGUMENT); }
        let v = values as *mut FieldValue;
        for k in 0..count as usize {
            // SAFETY: the caller passes `count` entries, each with its fieldId set.
            let f = unsafe { &mut *v.add(k) };
            f.timestamp = (now_ns() / 1000) as i64;
            f.latency_usec = 0;
            f.nvml_return = NVML_ERROR_NOT_SUPPORTED;
        }
        Ok(())
    }
    // Driver models (WDDM, TCC) are Windows'; NVML on Linux has none.
    fn nvmlDeviceGetDriverModel(h: nvmlDevice_t, _c: *mut c_uint, _p: *mut c_uint) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetDriverModel_v2(h: nvmlDevice_t, _c: *mut c_uint, _p: *mut c_uint) { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) }
    fn nvmlDeviceGetArchitecture(h: nvmlDevice_t, a: *mut c_uint) { dev(h)?; put(a, ARCH_HOPPER) }
    fn nvmlDeviceGetMemoryBusWidth(h: nvmlDevice_t, w: *mut c_uint) { dev(h)?; put(w, 6144) }
    fn nvmlDeviceGetNumGpuCores(h: nvmlDevice_t, n: *mut c_uint) { dev(h)?; put(n, 132 * 128) }
    fn nvmlDeviceGetMultiGpuBoard(h: nvmlDevice_t, m: *mut c_uint) { dev(h)?; put(m, 0) }
    fn nvmlDeviceGetBoardId(h: nvmlDevice_t, id: *mut c_uint) { let (_, i) = dev(h)?; put(id, 0x100 * (i as c_uint + 1)) }
    fn nvmlDeviceGetVbiosVersion(h: nvmlDevice_t, buf: *mut c_char, len: c_uint) { dev(h)?; put_str(buf, len, "96.00.A5.00.01") }
    fn nvmlDeviceGetHandleByPciBusId(bus: *const c_char, out: *mut nvmlDevice_t) {
        node()?;
        put(out, handle_of(super::device_of_bus_id(bus)?))
    }
}
