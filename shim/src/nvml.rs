//! NVML's memory queries (`nvmlDeviceGetMemoryInfo`, `_v2`): the same view as the driver
//! hooks. NVML handles are matched to our devices by UUID, since NVML indexes all GPUs while
//! CUDA numbers only the visible ones.
//!
//! A process that uses NVML without CUDA (a monitoring script) has not attached to the ledger;
//! it is shown its configured quota as the total (by NVML index) and nothing used, without
//! creating the ledger.

use crate::config::Config;
use crate::hooks::{pfn, real};
use crate::init::state_if_ready;
use crate::report::view;
use core::ffi::{c_char, c_uint};
use gpuslice_abi::*;

/// `(total, free, used)` for an NVML device, given NVML's own total and free.
unsafe fn adjust(dev: nvmlDevice_t, total: u64, free: u64) -> Option<(u64, u64, u64)> {
    if let Some(st) = state_if_ready() {
        let f = real::nvmlDeviceGetUUID()?;
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if f(dev, buf.as_mut_ptr(), buf.len() as c_uint) != NVML_SUCCESS {
            return None;
        }
        let uuid: String = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        let d = st.devices.iter().find(|d| d.uuid == uuid)?;
        let (t, fr) = view(d, total, free);
        let used = if d.account.is_quota() {
            d.account.used().min(t)
        } else {
            total.saturating_sub(fr)
        };
        return Some((t, fr, used));
    }
    let config = Config::from_env().ok()?;
    let mut idx: c_uint = 0;
    if real::nvmlDeviceGetIndex()?(dev, &mut idx) != NVML_SUCCESS {
        return None;
    }
    let (size, _) = config.memory.as_ref()?.get(idx)?;
    let q = size.resolve(total);
    Some((q, q.min(free), 0))
}

/// `nvmlDeviceGetMemoryInfo`.
pub unsafe fn memory_info(
    real: pfn::nvmlDeviceGetMemoryInfo,
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> u32 {
    let r = real(dev, mem);
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    if let Some((t, f, u)) = adjust(dev, (*mem).total, (*mem).free) {
        (*mem).total = t;
        (*mem).free = f;
        (*mem).used = u;
    }
    r
}

/// `nvmlDeviceGetMemoryInfo_v2`.
pub unsafe fn memory_info_v2(
    real: pfn::nvmlDeviceGetMemoryInfo_v2,
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> u32 {
    let r = real(dev, mem);
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    if let Some((t, f, u)) = adjust(dev, (*mem).total, (*mem).free) {
        (*mem).total = t;
        (*mem).free = f;
        (*mem).used = u;
        (*mem).reserved = 0;
    }
    r
}
