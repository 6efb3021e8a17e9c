//! The node's GPUs, from NVML loaded at run time (`gpuslice_nvml`, shared with the monitor:
//! `dlopen("libnvidia-ml.so.1")`, never linked; the plugin image carries no driver, the node's
//! driver library is mounted in, and the tests' fake GPU provides the same name).

pub use gpuslice_nvml::{Error, Gpu};

/// What NVML says about the node: the driver version and every GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// The kernel driver's version (`nvmlSystemGetDriverVersion`), empty when unknown.
    pub driver_version: String,
    /// GPUs that answer, in NVML's order.
    pub gpus: Vec<Gpu>,
    /// NVML's indices of the GPUs it reports lost (fallen off the bus): counted, but without a
    /// handle, so known only by index.
    pub lost: Vec<u32>,
}

/// An initialised NVML (kept for the plugin's life: the inventory is read again on every resync).
pub struct Nvml(gpuslice_nvml::Nvml);

impl Nvml {
    /// Load and initialise NVML; `Err` says why it is unavailable (and, shown, what to do when
    /// the library is not there; the plugin's [`crate::error::Error::Nvml`]).
    pub fn load() -> Result<Nvml, Error> {
        gpuslice_nvml::Nvml::load().map(Nvml)
    }

    /// The driver version and every GPU, now.
    pub fn inventory(&self) -> Result<Inventory, Error> {
        let scan = self.0.scan()?;
        Ok(Inventory {
            driver_version: self.0.driver_version().unwrap_or_default(),
            gpus: scan.gpus,
            lost: scan.lost,
        })
    }
}
