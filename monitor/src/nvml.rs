//! NVML for the monitor (the loader is `gpuslice_nvml`, shared with the DRA plugin): which
//! devices exist, and how much device memory each process really holds, for the audit.
//! Everything here is optional: when the library or a function is missing, callers fall back
//! to what the ledger knows.

pub use gpuslice_nvml::{Gpu, Nvml};

use crate::view::{DeviceView, NodeView};

/// The devices NVML lists, read once per process (empty without NVML).
pub fn devices() -> &'static [Gpu] {
    static DEVICES: std::sync::OnceLock<Vec<Gpu>> = std::sync::OnceLock::new();
    DEVICES.get_or_init(|| Nvml::load().and_then(|n| n.devices()).unwrap_or_default())
}

/// NVML's index of each device UUID (empty without NVML): how views number devices the way
/// `nvidia-smi` does.
pub fn indices() -> std::collections::HashMap<&'static str, u32> {
    devices()
        .iter()
        .map(|d| (d.uuid.as_str(), d.index))
        .collect()
}

/// Add to `view` the devices NVML lists that the ledger does not know yet (no monitor has
/// registered them and no process has used them): a node's GPUs are shown from the start,
/// nothing reserved or used on them. Devices end up in NVML's order.
pub fn add_unregistered(view: &mut NodeView) {
    for d in devices() {
        if view.device(&d.uuid).is_none() {
            view.devices.push(DeviceView {
                uuid: d.uuid.clone(),
                index: d.index,
                name: d.name.clone(),
                memory_total: d.memory_total,
                memory_reserved: 0,
                memory_used: 0,
                compute_reserved: 0.0,
                context_bytes: 0,
            });
        }
    }
    view.devices.sort_by_key(|d| d.index);
}
