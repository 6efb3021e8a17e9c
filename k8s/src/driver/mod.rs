//! The plugin's state machine: preparing a claim makes an operator slice in the ledger (named
//! from the claim's UID, on the allocated GPU, with the consumed memory and compute) and a CDI
//! spec that puts containers in it; unpreparing removes both once no process uses the slice.
//!
//! Nothing lives only in memory: whether a claim is prepared is read from the ledger (the
//! slice) and the CDI directory (the spec), so a restarted plugin carries on where the last
//! one stopped, and every call is idempotent. Calls are serialized by one lock.
//!
//! Two kinds of runtime directory (docs/security.md): in a **personal** one the plugin writes
//! the ledger itself (`Ledger::create_operator_slice`); in a **node** one the policy belongs to
//! the root `gpuslice monitor`, and the plugin only reads it: slices are created and removed
//! by operator requests over `monitor.sock` (`SliceCreate`, `SliceRemove`, authorized by
//! `SO_PEERCRED` as root), the monitor registers the GPUs and reaps dead processes, and a
//! prepare while the monitor is down fails with a retryable per-claim error.
//!
//! One job a file: `mod.rs` the driver's state, the GPUs and their health, and the kubelet's
//! calls; `slices.rs` where a claim's slices are made (the ledger, or the node's monitor:
//! the one trait `Mode`, decided when the ledger is opened);
//! `prepare.rs` one claim prepared and unprepared; `cdi.rs` the claim's CDI spec.

mod cdi;
mod prepare;
mod slices;

use crate::claims::ClaimSource;
use crate::config::Config;
use crate::error::Error;
use crate::health::GpuHealth;
use crate::nvml::{Gpu, Inventory, Nvml};
use crate::resource_slice::{self, Gone};
use gpuslice_ledger::Ledger;
use k8s_openapi::api::resource::v1::Device;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

impl ClaimRef {
    /// `namespace/name`, the label the slice carries.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `e`, as this claim's.
    fn error(&self, e: Error) -> Error {
        Error::ForClaim {
            claim: self.label(),
            uid: self.uid.clone(),
            source: Box::new(e),
        }
    }
}

/// One allocated device of a prepared claim, for the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's request this device serves.
    pub request_names: Vec<String>,
    /// Pool (this node).
    pub pool_name: String,
    /// Device (`gpu-<uuid>`).
    pub device_name: String,
    /// The claim's gpuslice CDI device, then the NVIDIA device's.
    pub cdi_device_ids: Vec<String>,
}

/// The slice name of a claim: `k8s-<uid>` (every container of every pod sharing the claim
/// joins this one slice).
pub fn slice_name(uid: &str) -> String {
    format!("k8s-{uid}")
}

/// The driver.
pub struct Driver {
    cfg: Config,
    ledger: Ledger,
    /// Personal or node mode, decided once: where slices are made, who registers the GPUs.
    mode: &'static dyn slices::Mode,
    nvml: Nvml,
    claims: Box<dyn ClaimSource>,
    inventory: Mutex<Inventory>,
    serial: tokio::sync::Mutex<()>,
    /// Every GPU's health, for the kubelet's health streams (`health.rs`).
    health: tokio::sync::watch::Sender<Vec<GpuHealth>>,
    /// The device names of every GPU seen since start (one that vanishes stays, unhealthy).
    seen: Mutex<BTreeSet<String>>,
    /// The GPUs published since start, to keep in the slice, tainted, when they go.
    known: Mutex<Known>,
}

/// What the plugin remembers of the GPUs it published.
#[derive(Default)]
struct Known {
    /// The device last published for each GPU while it was there.
    devices: BTreeMap<String, Device>,
    /// Since when each gone GPU has been gone (its taint's `timeAdded`), and why.
    gone_since: BTreeMap<String, (Time, Gone)>,
}

impl Driver {
    /// Open the ledger (personal mode: creating it if needed; node mode: waiting for the
    /// monitor's policy), read the GPUs, register them in a personal ledger.
    pub fn new(cfg: Config, claims: Box<dyn ClaimSource>) -> Result<Driver, Error> {
        let nvml = Nvml::load()?;
        let ledger = slices::open_ledger(&cfg.runtime_dir, cfg.mode)?;
        let mode = slices::mode_of(&ledger);
        eprintln!(
            "gpuslice-dra: {} in {}",
            mode.describe(),
            cfg.runtime_dir.display()
        );
        let inventory = nvml.inventory()?;
        let d = Driver {
            cfg,
            ledger,
            mode,
            nvml,
            claims,
            inventory: Mutex::new(inventory.clone()),
            serial: tokio::sync::Mutex::new(()),
            health: tokio::sync::watch::channel(vec![]).0,
            seen: Mutex::new(BTreeSet::new()),
            known: Mutex::new(Known::default()),
        };
        d.update_health(Ok(&inventory), &BTreeMap::new());
        d.mode.register(&d.ledger, &inventory)?;
        Ok(d)
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The GPUs' health, kept current by [`Driver::devices`] (every resync).
    pub fn health(&self) -> tokio::sync::watch::Receiver<Vec<GpuHealth>> {
        self.health.subscribe()
    }

    /// Determine every GPU's health from NVML's answer now, the published GPUs that are
    /// `gone`, and (node mode) the monitor's answer.
    fn update_health(
        &self,
        inv: Result<&Inventory, &crate::nvml::Error>,
        gone: &BTreeMap<String, Gone>,
    ) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let here: BTreeSet<String> = match inv {
            Ok(inv) => inv
                .gpus
                .iter()
                .map(|g| resource_slice::device_name(&g.uuid))
                .collect(),
            Err(_) => BTreeSet::new(),
        };
        seen.extend(here.iter().cloned());
        let monitor = match inv {
            Ok(_) => self.mode.ready(&self.ledger).err().map(|e| e.to_string()),
            Err(_) => None,
        };
        let nvml = inv.err().map(|e| e.to_string());
        let here = match &nvml {
            None => Ok(&here),
            Some(e) => Err(e.as_str()),
        };
        let lost: BTreeSet<String> = gone
            .iter()
            .filter(|(_, why)| **why == Gone::Lost)
            .map(|(d, _)| d.clone())
            .collect();
        let now = crate::health::judge(&seen, here, &lost, monitor.as_deref());
        self.health.send_if_modified(|h| {
            let changed = *h != now;
            if changed {
                for g in now.iter().filter(|g| !h.contains(g)) {
                    match g.healthy {
                        Some(true) => eprintln!("gpuslice-dra: {} is healthy", g.device),
                        Some(false) => {
                            eprintln!("gpuslice-dra: {} is unhealthy: {}", g.device, g.message)
                        }
                        None => {
                            eprintln!("gpuslice-dra: {} health unknown: {}", g.device, g.message)
                        }
                    }
                }
                *h = now;
            }
            changed
        });
    }

    /// Read GPUs and reservations again; the devices this node publishes now.
    pub async fn devices(&self) -> Result<resource_slice::Devices, Error> {
        let _g = self.serial.lock().await;
        let inv = self.nvml.inventory();
        let gone = inv.as_ref().map(|i| self.gone(i)).unwrap_or_default();
        self.update_health(inv.as_ref(), &gone);
        let inv = inv?;
        self.mode.register(&self.ledger, &inv)?;
        *self.inventory.lock().unwrap_or_else(|p| p.into_inner()) = inv.clone();
        let snap = self.ledger.snapshot();
        let mut out =
            resource_slice::devices(&inv, &snap, self.cfg.memory_step, self.cfg.memory_default);
        self.keep_gone(&mut out, &gone);
        Ok(out)
    }

    /// The GPUs published since start that NVML does not answer for now, and why: reported
    /// lost at the index they were published with, or not listed at all.
    fn gone(&self, inv: &Inventory) -> BTreeMap<String, Gone> {
        let here: BTreeSet<String> = inv
            .gpus
            .iter()
            .map(|g| resource_slice::device_name(&g.uuid))
            .collect();
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known
            .devices
            .iter()
            .filter(|(name, _)| !here.contains(*name))
            .map(|(name, d)| {
                let index = d
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get("index")?.int)
                    .and_then(|i| u32::try_from(i).ok());
                let why = match index {
                    Some(i) if inv.lost.contains(&i) => Gone::Lost,
                    _ => Gone::Missing,
                };
                (name.clone(), why)
            })
            .collect()
    }

    /// Why the published GPU `device` is gone, if it is (as of the last resync).
    fn gone_now(&self, device: &str) -> Option<Gone> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.gone_since.get(device).map(|(_, why)| *why)
    }

    /// Remember the devices published now, and add each `gone` GPU as last published, tainted
    /// `<driver>/gone` (its `timeAdded` kept while it stays gone, so the slice does not change
    /// at every resync); a GPU that is back is published fresh, untainted.
    fn keep_gone(&self, out: &mut resource_slice::Devices, gone: &BTreeMap<String, Gone>) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let known = &mut *known;
        for d in &out.published {
            known.devices.insert(d.name.clone(), d.clone());
        }
        let key = resource_slice::gone_key(&self.cfg.driver);
        known.gone_since.retain(|name, _| {
            let back = !gone.contains_key(name);
            if back {
                eprintln!("gpuslice-dra: {name} is back: taint {key} removed");
            }
            !back
        });
        let effect = self.cfg.gone_taint_effect;
        for (name, why) in gone {
            let Some(last) = known.devices.get(name) else {
                continue;
            };
            let (since, was) = known.gone_since.entry(name.clone()).or_insert_with(|| {
                eprintln!(
                    "gpuslice-dra: {name} is gone ({}): kept in the ResourceSlice with taint \
                     {key}={}:{}",
                    match why {
                        Gone::Lost => "NVML reports it lost",
                        Gone::Missing => "NVML no longer lists it",
                    },
                    why.as_str(),
                    effect.as_str()
                );
                (resource_slice::now(), *why)
            });
            *was = *why;
            out.published.push(resource_slice::tainted(
                last,
                &self.cfg.driver,
                *why,
                effect,
                since.clone(),
            ));
        }
    }

    fn gpus(&self) -> Vec<Gpu> {
        self.inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gpus
            .clone()
    }

    /// Prepare claims, one result per claim (in order).
    pub async fn prepare(&self, claims: &[ClaimRef]) -> Vec<Result<Vec<PreparedDevice>, Error>> {
        let _g = self.serial.lock().await;
        // Nothing is prepared while the node's monitor is down: a container started now would
        // fail cuInit (no admission), so the pod waits with this message instead. Asked once
        // per call, so a hung monitor costs one timeout, not one per claim.
        let down = self.mode.ready(&self.ledger).err();
        let mut out = Vec::with_capacity(claims.len());
        for c in claims {
            let r = match &down {
                Some(e) => Err(Error::Monitor(e.clone())),
                None => self.prepare_one(c).await,
            }
            .map_err(|e| c.error(e));
            match &r {
                Ok(d) => eprintln!(
                    "gpuslice-dra: prepared claim {} as slice {} ({} device(s))",
                    c.label(),
                    slice_name(&c.uid),
                    d.len()
                ),
                Err(e) => eprintln!("gpuslice-dra: prepare failed: {e}"),
            }
            out.push(r);
        }
        out
    }

    /// Unprepare claims, one result per claim (in order).
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> Vec<Result<(), Error>> {
        let _g = self.serial.lock().await;
        claims
            .iter()
            .map(|c| {
                let r = self.unprepare_one(c).map_err(|e| c.error(e));
                match &r {
                    Ok(()) => eprintln!("gpuslice-dra: unprepared claim {}", c.label()),
                    Err(e) => eprintln!("gpuslice-dra: unprepare failed: {e}"),
                }
                r
            })
            .collect()
    }
}
