//! Where the node's ResourceSlice goes (server-side apply to the API server, or a file), and
//! the loop that republishes it when GPUs or reservations change.

use crate::driver::Driver;
use crate::slice;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::path::PathBuf;
use std::sync::Arc;

/// A ResourceSlice destination.
#[derive(Clone)]
pub enum Sink {
    /// Server-side apply (field manager `gpuslice-dra`).
    Api(kube::Client),
    /// A JSON file, written atomically.
    File(PathBuf),
}

impl Sink {
    /// The pool generation of what is published now (0: nothing).
    pub async fn generation(&self, name: &str) -> i64 {
        match self {
            Sink::Api(c) => {
                let api: kube::Api<ResourceSlice> = kube::Api::all(c.clone());
                match api.get_opt(name).await {
                    Ok(Some(s)) => s.spec.pool.generation,
                    _ => 0,
                }
            }
            Sink::File(p) => std::fs::read_to_string(p)
                .ok()
                .and_then(|t| serde_json::from_str::<ResourceSlice>(&t).ok())
                .map_or(0, |s| s.spec.pool.generation),
        }
    }

    /// The owner reference to this node for the slice, so the API server deletes the slice with
    /// its Node (none for a file, or when the node cannot be read: that is logged).
    pub async fn owner(&self, node: &str) -> Option<OwnerReference> {
        let Sink::Api(c) = self else { return None };
        let api: kube::Api<Node> = kube::Api::all(c.clone());
        match api.get(node).await {
            Ok(n) => Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: n.metadata.uid.unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            }),
            Err(e) => {
                eprintln!(
                    "gpuslice-dra: reading Node {node} for the ResourceSlice's owner reference:                      {e}; publishing without one (grant `get` on nodes, deploy/rbac.yaml)"
                );
                None
            }
        }
    }

    /// Delete the published slice `name` (at a clean exit: an uninstalled driver leaves no
    /// devices behind for the scheduler). One that is gone already is fine.
    pub async fn delete(&self, name: &str) -> Result<(), String> {
        match self {
            Sink::Api(c) => {
                let api: kube::Api<ResourceSlice> = kube::Api::all(c.clone());
                match api.delete(name, &kube::api::DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(format!("deleting ResourceSlice {name}: {e}")),
                }
            }
            Sink::File(p) => match std::fs::remove_file(p) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("removing {}: {e}", p.display())),
            },
        }
    }

    /// Publish `s`.
    pub async fn publish(&self, s: &ResourceSlice) -> Result<(), String> {
        let name = s.metadata.name.clone().unwrap_or_default();
        match self {
            Sink::Api(c) => {
                let api: kube::Api<ResourceSlice> = kube::Api::all(c.clone());
                let mut obj = serde_json::to_value(s).map_err(|e| e.to_string())?;
                obj["apiVersion"] = "resource.k8s.io/v1".into();
                obj["kind"] = "ResourceSlice".into();
                api.patch(
                    &name,
                    &kube::api::PatchParams::apply("gpuslice-dra").force(),
                    &kube::api::Patch::Apply(&obj),
                )
                .await
                .map(|_| ())
                .map_err(|e| format!("applying ResourceSlice {name}: {e}"))
            }
            Sink::File(p) => {
                let mut obj = serde_json::to_value(s).map_err(|e| e.to_string())?;
                obj["apiVersion"] = "resource.k8s.io/v1".into();
                obj["kind"] = "ResourceSlice".into();
                let text = serde_json::to_string_pretty(&obj).map_err(|e| e.to_string())? + "\n";
                gpuslice_ledger::cdi::write_atomically(p, text.as_bytes())
                    .map_err(|e| format!("writing {}: {e}", p.display()))
            }
        }
    }
}

/// Publish the node's slice now and whenever its devices change (checked every `resync`).
pub async fn run(driver: Arc<Driver>, sink: Sink) {
    let cfg = driver.config().clone();
    let name = slice::object_name(&cfg.node_name, &cfg.driver);
    let mut generation = sink.generation(&name).await;
    let owner = sink.owner(&cfg.node_name).await;
    let mut last: Option<Vec<Device>> = None;
    // Unchanged devices are applied again now and then (same generation: a no-op for the API
    // server), so a slice deleted by hand comes back.
    const REAPPLY_TICKS: u32 = 60;
    let mut ticks = 0u32;
    let mut interval = tokio::time::interval(cfg.resync);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let devices = match driver.devices().await {
            Ok(d) => d,
            Err(e) => {
                eprintln!("gpuslice-dra: reading the GPUs: {e}");
                continue;
            }
        };
        let changed = last.as_ref() != Some(&devices);
        ticks += 1;
        if !changed && ticks < REAPPLY_TICKS {
            continue;
        }
        ticks = 0;
        let next = generation + changed as i64;
        let s = slice::resource_slice(
            &cfg.node_name,
            &cfg.driver,
            next,
            owner.clone(),
            devices.clone(),
        );
        match sink.publish(&s).await {
            Ok(()) if !changed => {}
            Ok(()) => {
                generation = next;
                eprintln!(
                    "gpuslice-dra: published ResourceSlice {name} (pool generation {generation}, {} device(s))",
                    devices.len()
                );
                last = Some(devices);
            }
            Err(e) => eprintln!("gpuslice-dra: {e}; retrying"),
        }
    }
}
