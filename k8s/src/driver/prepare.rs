//! One claim prepared (its allocation read from the API server, checked against what the GPUs
//! have left, then its slices and CDI spec made, whole or not at all) and unprepared.

use super::{slice_name, ClaimRef, Driver, PreparedDevice};
use crate::nvml::Gpu;
use crate::quantity;
use crate::resource_slice::{self, COMPUTE, COMPUTE_WHOLE, MEMORY};
use gpuslice_ledger::{human_bytes, OperatorSlice, Snapshot, PPM};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use std::collections::BTreeMap;

/// What a claim asks of one GPU.
#[derive(Debug, Clone, Default)]
struct Want {
    memory: u64,
    compute: u64,
}

impl Driver {
    fn consumed(
        &self,
        r: &DeviceRequestAllocationResult,
        gpu: &Gpu,
        snap: &Snapshot,
    ) -> Result<Want, String> {
        let Some(cc) = &r.consumed_capacity else {
            // No consumable capacity (a cluster without DRAConsumableCapacity allocates the
            // device whole): the claim gets all that this node offers on it.
            let (memory, compute) = resource_slice::offered(gpu, snap);
            return Ok(Want { memory, compute });
        };
        let get = |cap: &str| {
            cc.get(cap)
                .or_else(|| cc.get(&format!("{}/{cap}", self.cfg.driver)))
                .map(|q| quantity::parse(&q.0).map_err(|e| format!("consumedCapacity {cap}: {e}")))
                .transpose()
        };
        let memory = match get(MEMORY)? {
            Some(m) => {
                u64::try_from(m).map_err(|_| "consumedCapacity memory is too large".to_string())?
            }
            None => self.cfg.memory_default,
        };
        let compute = get(COMPUTE)?.unwrap_or(0);
        if compute > COMPUTE_WHOLE as u128 {
            return Err(format!(
                "consumedCapacity compute {compute} is more than a whole GPU ({COMPUTE_WHOLE})"
            ));
        }
        Ok(Want {
            memory,
            compute: compute as u64,
        })
    }

    pub(super) async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let rc: ResourceClaim = self.claims.get(&c.namespace, &c.name).await?;
        let uid = rc.metadata.uid.as_deref().unwrap_or("");
        if uid != c.uid {
            return Err(format!(
                "the ResourceClaim {} has UID {uid:?}, the kubelet asked for {:?}: it was deleted \
                 and re-created; the pod needs to be re-created",
                c.label(),
                c.uid
            ));
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
            return Err(format!(
                "the ResourceClaim has no device of driver {} allocated (status.allocation is \
                 empty: not scheduled yet?)",
                self.cfg.driver
            ));
        }
        let gpus = self.gpus();
        let snap = self.ledger.snapshot();
        let mut per_gpu: BTreeMap<String, (Gpu, Want)> = BTreeMap::new();
        let mut devices = Vec::new();
        for r in &results {
            if r.pool != self.cfg.node_name {
                return Err(format!(
                    "device {}/{} was allocated from pool {:?}, but this is node {:?}",
                    r.pool, r.device, r.pool, self.cfg.node_name
                ));
            }
            let Some(gpu) = gpus
                .iter()
                .find(|g| resource_slice::device_name(&g.uuid) == r.device)
            else {
                let here: Vec<String> = gpus
                    .iter()
                    .map(|g| resource_slice::device_name(&g.uuid))
                    .collect();
                return Err(format!(
                    "device {} is not on this node (GPUs here: {}); a stale allocation",
                    r.device,
                    here.join(", ")
                ));
            };
            let want = self.consumed(r, gpu, &snap)?;
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
        let name = slice_name(&c.uid);
        // Check everything before creating anything: a claim is prepared whole or not at all.
        let mut to_create = Vec::new();
        for (uuid, (gpu, want)) in &per_gpu {
            let ppm = want.compute.min(COMPUTE_WHOLE) * (PPM as u64 / COMPUTE_WHOLE);
            if let Some(s) = snap
                .slices
                .iter()
                .find(|s| s.name == name && &s.device_uuid == uuid && !s.private)
            {
                if s.memory_limit == Some(want.memory) && s.compute_share_ppm as u64 == ppm {
                    continue; // prepared before (a repeated call, or before a restart)
                }
                return Err(format!(
                    "slice {name} already exists on {uuid} with memory {}, compute {}, but the \
                     claim now asks for memory {}, compute {}: remove it with `gpuslice slice rm \
                     {name}` once its processes are gone",
                    s.memory_limit
                        .map(human_bytes)
                        .unwrap_or_else(|| "none".into()),
                    s.compute_share_ppm / 1000,
                    human_bytes(want.memory),
                    want.compute
                ));
            }
            let dev = snap
                .devices
                .iter()
                .find(|d| &d.uuid == uuid)
                .ok_or_else(|| {
                    if self.node {
                        format!(
                            "{uuid} is not registered in the node's policy: the gpuslice \
                             monitor registers the GPUs NVML shows it (is its container given \
                             the GPUs, NVIDIA_VISIBLE_DEVICES=all?); retried"
                        )
                    } else {
                        format!("{uuid} is not in the gpuslice ledger")
                    }
                })?;
            let avail = dev
                .memory_total
                .saturating_sub(dev.memory_reserved)
                .saturating_sub(dev.best_effort_used);
            if want.memory > avail {
                return Err(format!(
                    "memory {} requested on {} ({uuid}), {} available: the allocation is stale \
                     (memory was reserved on this GPU outside Kubernetes, or the ResourceSlice \
                     was out of date); nothing was created, delete and re-create the pod to \
                     schedule it again",
                    human_bytes(want.memory),
                    resource_slice::device_name(uuid),
                    human_bytes(avail)
                ));
            }
            let avail_ppm = (PPM as u64).saturating_sub(dev.compute_reserved_ppm as u64);
            if ppm > avail_ppm {
                return Err(format!(
                    "compute {} requested on {} ({uuid}), {} available: the allocation is stale; \
                     nothing was created",
                    want.compute,
                    resource_slice::device_name(uuid),
                    avail_ppm / 1000
                ));
            }
            to_create.push(OperatorSlice {
                name: name.clone(),
                device: gpu.uuid.clone(),
                memory: want.memory,
                compute_share_ppm: ppm as u32,
                compute_cap_ppm: PPM,
                claim: Some(c.label()),
            });
        }
        let secret = self.claim_secret(&name, &snap)?;
        let created_any = !to_create.is_empty();
        for spec in &to_create {
            if let Err(e) = self.create_slice(spec, secret.as_ref()) {
                let _ = self.remove_slice(&name);
                return Err(format!(
                    "creating slice {name} on {}: {e}; nothing was kept",
                    spec.device
                ));
            }
        }
        if let Err(e) = self.write_spec(&c.uid, secret.as_ref()) {
            if created_any {
                let _ = self.remove_slice(&name);
            }
            return Err(e);
        }
        Ok(devices)
    }

    pub(super) fn unprepare_one(&self, c: &ClaimRef) -> Result<(), String> {
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
        let (live, mut pids) = if self.node {
            let indices: Vec<usize> = mine.iter().map(|s| s.index).collect();
            let pids = self.live_members(&indices);
            (pids.len() as u32, pids)
        } else {
            let live: u32 = mine.iter().map(|s| s.attached).sum();
            (
                live,
                mine.iter().flat_map(|s| s.pids.iter().copied()).collect(),
            )
        };
        if live > 0 {
            pids.sort_unstable();
            pids.dedup();
            return Err(format!(
                "slice {name} still has {live} live process(es) (pids {pids:?}): kept with its CDI \
                 spec, and retried when the kubelet calls again; if these are not the pod's own \
                 processes, end them"
            ));
        }
        let path = self.spec_path(&c.uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing the CDI spec {}: {e}", path.display())),
        }
        if mine.is_empty() {
            return Ok(());
        }
        // Node mode: a dead process the monitor has not reaped yet keeps the record until its
        // next tick; the monitor removes the slice then (it never yanks a live one).
        self.remove_slice(&name)
            .map_err(|e| format!("removing slice {name}: {e}"))
    }
}
