//! Where the node's ResourceSlice goes (server-side apply to the API server, or a file), and
//! the loop that republishes it when GPUs or reservations change.

use crate::driver::Driver;
use crate::slice;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use std::path::PathBuf;
use std::sync::Arc;

/// A ResourceSlice destination.
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
    let mut last: Option<Vec<Device>> = None;
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
        if last.as_ref() == Some(&devices) {
            continue;
        }
        let s = slice::resource_slice(&cfg.node_name, &cfg.driver, generation + 1, devices.clone());
        match sink.publish(&s).await {
            Ok(()) => {
                generation += 1;
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
