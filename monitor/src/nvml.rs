//! NVML for the monitor (the loader is `gpuslice_nvml`, shared with the DRA plugin): which
//! devices exist, and how much device memory each process really holds, for the audit.
//! Everything here is optional: when the library or a function is missing, callers fall back
//! to what the ledger knows.

pub use gpuslice_nvml::{Gpu, Nvml};

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
