//! One claim prepared (its allocation read from the API server, checked against what the GPUs
//! have left, then its slices and CDI spec made, whole or not at all) and unprepared.

use super::{slice_name, ClaimRef, Driver, PreparedDevice};
use crate::error::Error;
use crate::nvml::Gpu;
use crate::resource_slice::{self, COMPUTE, COMPUTE_WHOLE, MEMORY};
use gpuslice_ledger::{Cap, OperatorSlice, Share, Snapshot, PPM};
use gpuslice_quantity::parse_kubernetes;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use std::collections::BTreeMap;

/// What a claim asks of each GPU, by UUID.
type PerGpu = BTreeMap<String, (Gpu, Want)>;

/// What a claim asks of one GPU.
#[derive(Debug, Clone, Default)]
struct Want {
    memory: u64,
    compute: u64,
}

impl Driver {
    /// What allocation `r` consumes of `gpu`.
    fn consumed(
        &self,
        r: &DeviceRequestAllocationResult,
        gpu: &Gpu,
        snap: &Snapshot,
    ) -> Result<Want, Error> {
        let Some(cc) = &r.consumed_capacity else {
            // No consumable capacity (a cluster without DRAConsumableCapacity allocates the
            // device whole): the claim gets all that this node offers on it.
            let (memory, compute) = resource_slice::offered(gpu, snap);
            return Ok(Want { memory, compute });
        };
        let get = |capacity: &'static str| {
            cc.get(capacity)
                .or_else(|| cc.get(&format!("{}/{capacity}", self.cfg.driver)))
                .map(|q| {
                    parse_kubernetes(&format!("consumedCapacity {capacity}"), &q.0)
                        .map_err(Error::Capacity)
                })
                .transpose()
        };
        let memory = match get(MEMORY)? {
            Some(m) => u64::try_from(m).map_err(|_| Error::MemoryTooLarge)?,
            None => self.cfg.memory_default,
        };
        let compute = get(COMPUTE)?.unwrap_or(0);
        if compute > COMPUTE_WHOLE as u128 {
            return Err(Error::ComputeOverWhole {
                compute,
                whole: COMPUTE_WHOLE,
            });
        }
        Ok(Want {
            memory,
            compute: compute as u64,
        })
    }

    /// The claim's allocation results of this driver, from the API server (the kubelet's
    /// call names the claim, not what was allocated).
    async fn allocation(&self, c: &ClaimRef) -> Result<Vec<DeviceRequestAllocationResult>, Error> {
        let rc: ResourceClaim = self.claims.get(&c.namespace, &c.name).await?;
        let uid = rc.metadata.uid.as_deref().unwrap_or("");
        if uid != c.uid {
            return Err(Error::ClaimRecreated {
                claim: c.label(),
                has: uid.to_string(),
                asked: c.uid.clone(),
            });
        }
        let results: Vec<DeviceRequestAllocationResult> = rc
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.driver == self.cfg.driver)
            .collect();
        if results.is_empty() {
            return Err(Error::NotAllocated {
                driver: self.cfg.driver.clone(),
            });
        }
        Ok(results)
    }

    /// What the claim wants of each of this node's GPUs (several results on one GPU add up),
    /// and the devices the kubelet is answered with.
    fn wants(
        &self,
        c: &ClaimRef,
        results: &[DeviceRequestAllocationResult],
        snap: &Snapshot,
    ) -> Result<(PerGpu, Vec<PreparedDevice>), Error> {
        let gpus = self.gpus();
        let mut per_gpu = PerGpu::new();
        let mut devices = Vec::new();
        for r in results {
            if r.pool != self.cfg.node_name {
                return Err(Error::OtherPool {
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    node: self.cfg.node_name.clone(),
                });
            }
            let Some(gpu) = gpus
                .iter()
                .find(|g| resource_slice::device_name(&g.uuid) == r.device)
            else {
                if let Some(why) = self.gone_now(&r.device) {
                    return Err(Error::Gone {
                        device: r.device.clone(),
                        why,
                        taint: format!(
                            "{}={}:{}",
                            resource_slice::gone_key(&self.cfg.driver),
                            why.as_str(),
                            self.cfg.gone_taint_effect.as_str()
                        ),
                    });
                }
                return Err(Error::NotOnNode {
                    device: r.device.clone(),
                    here: gpus
                        .iter()
                        .map(|g| resource_slice::device_name(&g.uuid))
                        .collect(),
                });
            };
            let want = self.consumed(r, gpu, snap)?;
            let e = per_gpu
                .entry(gpu.uuid.clone())
                .or_insert_with(|| (gpu.clone(), Want::default()));
            e.1.memory = e.1.memory.saturating_add(want.memory);
            e.1.compute += want.compute;
            let mut ids = vec![format!("{}={}", self.cfg.cdi_kind, slice_name(&c.uid))];
            ids.extend(self.nvidia_cdi_id(gpu));
            devices.push(PreparedDevice {
                request_names: vec![r.request.clone()],
                pool_name: r.pool.clone(),
                device_name: r.device.clone(),
                cdi_device_ids: ids,
            });
        }
        Ok((per_gpu, devices))
    }

    /// The slices still to create for claim `c`, every one checked against what its GPU has
    /// left before any is made (a claim is prepared whole or not at all); a slice made before
    /// (a repeated call, a restart) with the same sizes is kept.
    fn slices_to_create(
        &self,
        c: &ClaimRef,
        per_gpu: &PerGpu,
        snap: &Snapshot,
    ) -> Result<Vec<OperatorSlice>, Error> {
        let name = slice_name(&c.uid);
        let mut to_create = Vec::new();
        for (uuid, (gpu, want)) in per_gpu {
            // The claim's compute (thousandths of the device) as the share the slice guarantees.
            let share = Share::from_ppm(
                (want.compute.min(COMPUTE_WHOLE) * (PPM as u64 / COMPUTE_WHOLE)) as u32,
            );
            if let Some(s) = snap
                .slices
                .iter()
                .find(|s| s.name == name && &s.device_uuid == uuid && !s.private)
            {
                if s.memory_limit == Some(want.memory) && s.compute_share == share {
                    continue; // prepared before (a repeated call, or before a restart)
                }
                return Err(Error::SliceDiffers {
                    name,
                    uuid: uuid.clone(),
                    has_memory: s.memory_limit,
                    has_compute: s.compute_share.ppm() / 1000,
                    memory: want.memory,
                    compute: want.compute,
                });
            }
            let dev = snap
                .devices
                .iter()
                .find(|d| &d.uuid == uuid)
                .ok_or_else(|| Error::NotRegistered {
                    uuid: uuid.clone(),
                    node_mode: self.mode.is_node(),
                })?;
            let avail = dev
                .memory_total
                .saturating_sub(dev.memory_reserved)
                .saturating_sub(dev.best_effort_used);
            if want.memory > avail {
                return Err(Error::StaleMemory {
                    device: resource_slice::device_name(uuid),
                    uuid: uuid.clone(),
                    requested: want.memory,
                    available: avail,
                });
            }
            let avail_ppm = (PPM as u64).saturating_sub(dev.compute_reserved_ppm as u64);
            if share.ppm() as u64 > avail_ppm {
                return Err(Error::StaleCompute {
                    device: resource_slice::device_name(uuid),
                    uuid: uuid.clone(),
                    requested: want.compute,
                    available: avail_ppm / 1000,
                });
            }
            to_create.push(OperatorSlice {
                name: name.clone(),
                device: gpu.uuid.clone(),
                memory: want.memory,
                compute_share: share,
                compute_cap: Cap::NONE,
                claim: Some(c.label()),
            });
        }
        Ok(to_create)
    }

    /// Prepare claim `c`: its slices (checked first), then its CDI spec; on any failure what
    /// this call made is removed again.
    pub(super) async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, Error> {
        let results = self.allocation(c).await?;
        let snap = self.ledger.snapshot();
        let (per_gpu, devices) = self.wants(c, &results, &snap)?;
        let to_create = self.slices_to_create(c, &per_gpu, &snap)?;
        let name = slice_name(&c.uid);
        let secret = self.mode.claim_secret(&self.ledger, &name, &snap)?;
        for spec in &to_create {
            if let Err(e) = self.mode.create(&self.ledger, spec, secret.as_ref()) {
                let _ = self.remove_slice(&name);
                return Err(Error::Creating {
                    name,
                    device: spec.device.clone(),
                    source: Box::new(e),
                });
            }
        }
        if let Err(e) = self.write_spec(&c.uid, secret.as_ref()) {
            if !to_create.is_empty() {
                let _ = self.remove_slice(&name);
            }
            return Err(e);
        }
        Ok(devices)
    }

    /// Unprepare claim `c`: its CDI spec, the spec's files and its slices go once no live
    /// process is in them.
    pub(super) fn unprepare_one(&self, c: &ClaimRef) -> Result<(), Error> {
        let name = slice_name(&c.uid);
        // Processes that died are returned first, so a finished pod's slice is free to go
        // (personal mode; in node mode the monitor reaps, and its record says who lives).
        let _ = self.ledger.reap_dead();
        let snap = self.ledger.snapshot();
        let mine: Vec<_> = snap
            .slices
            .iter()
            .filter(|s| s.name == name && !s.private)
            .collect();
        let (live, mut pids) = self.mode.live(&self.ledger, &mine);
        if live > 0 {
            pids.sort_unstable();
            pids.dedup();
            return Err(Error::StillLive { name, live, pids });
        }
        let path = self.spec_path(&c.uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io {
                    what: "removing the CDI spec",
                    path,
                    source,
                })
            }
        }
        // Its files after it (a runtime reading the spec finds them until it is gone).
        gpuslice_cdi::remove_files(&path).map_err(|source| Error::Io {
            what: "removing the claim's /etc/ld.so.preload and settings file",
            path: gpuslice_cdi::files_dir(&path),
            source,
        })?;
        if mine.is_empty() {
            return Ok(());
        }
        // Node mode: a dead process the monitor has not reaped yet keeps the record until its
        // next tick; the monitor removes the slice then (it never yanks a live one).
        self.remove_slice(&name).map_err(|e| Error::Removing {
            name,
            source: Box::new(e),
        })
    }

    /// Remove the claim's slice on every device; one already gone is no error.
    fn remove_slice(&self, name: &str) -> Result<(), Error> {
        match self.mode.remove(&self.ledger, name) {
            Err(e) if e.is_no_such_slice() => Ok(()),
            r => r,
        }
    }
}
