//! Where the node's ResourceSlice goes (server-side apply to the API server, or a file), and
//! the loop that republishes it when GPUs or reservations change.

use crate::driver::Driver;
use crate::error::Error;
use crate::resource_slice;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::path::PathBuf;
use std::sync::Arc;

/// A ResourceSlice destination.
#[derive(Clone)]
pub enum Sink {
    /// Server-side apply (field manager `gpuslice-dra`, strict field validation).
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
                    "gpuslice-dra: reading Node {node} for the ResourceSlice's owner reference: \
                     {e}; publishing without one (grant `get` on nodes: the chart's \
                     ClusterRole, deploy/helm/gpuslice/templates/rbac.yaml)"
                );
                None
            }
        }
    }

    /// Remove the ResourceSlices of `driver` on `node` (every node: `None`), at a clean exit
    /// or an uninstall, so the scheduler sees no devices of a driver that is gone; the names
    /// removed. Slices gone already are fine. A file sink removes its file.
    pub async fn remove_all(&self, driver: &str, node: Option<&str>) -> Result<Vec<String>, Error> {
        match self {
            Sink::Api(c) => {
                let api: kube::Api<ResourceSlice> = kube::Api::all(c.clone());
                let mut selector = format!("spec.driver={driver}");
                if let Some(n) = node {
                    selector.push_str(&format!(",spec.nodeName={n}"));
                }
                let list = api
                    .list(&kube::api::ListParams::default().fields(&selector))
                    .await
                    .map_err(|source| Error::Api {
                        what: format!("listing ResourceSlices ({selector})"),
                        source,
                    })?;
                let mut removed = vec![];
                for s in list.items {
                    let name = s.metadata.name.unwrap_or_default();
                    match api.delete(&name, &kube::api::DeleteParams::default()).await {
                        Ok(_) => removed.push(name),
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(source) => {
                            return Err(Error::Api {
                                what: format!("deleting ResourceSlice {name}"),
                                source,
                            })
                        }
                    }
                }
                Ok(removed)
            }
            Sink::File(p) => match std::fs::remove_file(p) {
                Ok(()) => Ok(vec![p.display().to_string()]),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
                Err(source) => Err(Error::Io {
                    what: "removing",
                    path: p.clone(),
                    source,
                }),
            },
        }
    }

    /// Publish `s`.
    pub async fn publish(&self, s: &ResourceSlice) -> Result<(), PublishError> {
        let name = s.metadata.name.clone().unwrap_or_default();
        let obj = to_object(s).map_err(|e| PublishError::Failed(e.to_string()))?;
        match self {
            Sink::Api(c) => {
                let api: kube::Api<ResourceSlice> = kube::Api::all(c.clone());
                api.patch(
                    &name,
                    // Strict: a field this API server does not know is an error, not
                    // silently dropped (an older API server than the plugin's types).
                    &kube::api::PatchParams::apply("gpuslice-dra")
                        .force()
                        .validation_strict(),
                    &kube::api::Patch::Apply(&obj),
                )
                .await
                .map(|_| ())
                .map_err(|e| match e {
                    kube::Error::Api(st) if refused(st.code) => PublishError::Refused {
                        code: st.code,
                        message: st.message.clone(),
                    },
                    e => PublishError::Failed(format!("applying ResourceSlice {name}: {e}")),
                })
            }
            Sink::File(p) => {
                let text = serde_json::to_string_pretty(&obj)
                    .map_err(|e| PublishError::Failed(e.to_string()))?
                    + "\n";
                gpuslice_cdi::write_atomically(p, text.as_bytes())
                    .map_err(|e| PublishError::Failed(format!("writing {}: {e}", p.display())))
            }
        }
    }
}

/// `s` as the object sent: with its `apiVersion` and `kind`.
pub fn to_object(s: &ResourceSlice) -> Result<serde_json::Value, serde_json::Error> {
    let mut obj = serde_json::to_value(s)?;
    obj["apiVersion"] = "resource.k8s.io/v1".into();
    obj["kind"] = "ResourceSlice".into();
    Ok(obj)
}

/// Why a slice was not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// The API server refused the object itself (400 Bad Request, 422 Invalid, ...): sending it
    /// again cannot help; `message` is the server's.
    Refused {
        /// HTTP status.
        code: u16,
        /// The API server's `Status.message`.
        message: String,
    },
    /// Anything else (no connection, a timeout, a conflict, a server error): retried.
    Failed(String),
}

/// Whether an API status means the object is refused as it is (a client error other than
/// those that pass: timeout, conflict, rate limit).
fn refused(code: u16) -> bool {
    (400..500).contains(&code) && ![401, 403, 404, 408, 409, 429].contains(&code)
}

/// The devices a refusal names (by name, or as `spec.devices[N]` in the API server's field
/// paths), or all of them when it names none.
pub fn devices_named(message: &str, devices: &[Device]) -> Vec<String> {
    let by_index: Vec<usize> = message
        .split("spec.devices[")
        .skip(1)
        .filter_map(|p| p.split(']').next()?.parse().ok())
        .collect();
    let named: Vec<String> = devices
        .iter()
        .enumerate()
        .filter(|(i, d)| by_index.contains(i) || message.contains(&d.name))
        .map(|(_, d)| d.name.clone())
        .collect();
    if named.is_empty() {
        devices.iter().map(|d| d.name.clone()).collect()
    } else {
        named
    }
}

/// Publish the node's slice now and whenever its devices change (checked every `resync`).
///
/// A slice the API server refuses is reported once, with its message and the devices it
/// names, and not sent again until the devices change (a reservation made or released, a GPU
/// gone): the same object would be refused the same way. Other failures are retried at every
/// resync, reported when their message changes.
pub async fn run(driver: Arc<Driver>, sink: Sink) {
    let cfg = driver.config().clone();
    let name = resource_slice::object_name(&cfg.node_name, &cfg.driver);
    let mut generation = sink.generation(&name).await;
    let owner = sink.owner(&cfg.node_name).await;
    let mut last: Option<Vec<Device>> = None;
    let mut refused: Option<Vec<Device>> = None;
    let mut left_out: Vec<(String, String)> = vec![];
    let mut failing: Option<String> = None;
    // Unchanged devices are applied again now and then (same generation: a no-op for the API
    // server), so a slice deleted by hand comes back.
    const REAPPLY_TICKS: u32 = 60;
    let mut ticks = 0u32;
    let mut interval = tokio::time::interval(cfg.resync);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let found = match driver.devices().await {
            Ok(d) => d,
            Err(e) => {
                eprintln!("gpuslice-dra: reading the GPUs: {e}");
                continue;
            }
        };
        if found.left_out != left_out {
            for (dev, why) in found.left_out.iter().filter(|l| !left_out.contains(l)) {
                eprintln!(
                    "gpuslice-dra: {dev} is left out of ResourceSlice {name}: {why}; the node's \
                     other GPUs stay schedulable"
                );
            }
            for (dev, _) in left_out
                .iter()
                .filter(|(d, _)| !found.left_out.iter().any(|(now, _)| now == d))
            {
                eprintln!("gpuslice-dra: {dev} has room again: back in ResourceSlice {name}");
            }
            left_out = found.left_out;
        }
        let devices = found.published;
        let changed = last.as_ref() != Some(&devices);
        if refused.as_ref() == Some(&devices) {
            continue;
        }
        ticks += 1;
        if !changed && ticks < REAPPLY_TICKS && failing.is_none() {
            continue;
        }
        ticks = 0;
        let next = generation + changed as i64;
        let s = resource_slice::resource_slice(
            &cfg.node_name,
            &cfg.driver,
            next,
            owner.clone(),
            devices.clone(),
        );
        match sink.publish(&s).await {
            Ok(()) => {
                failing = None;
                refused = None;
                if changed {
                    generation = next;
                    eprintln!(
                        "gpuslice-dra: published ResourceSlice {name} (pool generation \
                         {generation}, {} device(s))",
                        devices.len()
                    );
                    last = Some(devices);
                }
            }
            Err(PublishError::Refused { code, message }) => {
                eprintln!(
                    "gpuslice-dra: the API server refused ResourceSlice {name} (pool generation \
                     {next}, HTTP {code}) for device(s) {}: {message}; not sent again until the \
                     GPUs or their reservations change",
                    devices_named(&message, &devices).join(", ")
                );
                refused = Some(devices);
            }
            Err(PublishError::Failed(e)) => {
                if failing.as_deref() != Some(e.as_str()) {
                    eprintln!("gpuslice-dra: {e}; retrying every --resync");
                }
                failing = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_devices_of_its_fields() {
        let dev = |n: &str| Device {
            name: n.into(),
            ..Default::default()
        };
        let devices = [dev("gpu-a"), dev("gpu-b")];
        let m = "ResourceSlice.resource.k8s.io \"n-gpuslice.dev\" is invalid: \
                 spec.devices[1].capacity[compute].requestPolicy.validRange.step: Invalid \
                 value: \"1\": one step 1 is larger than capacity value: 0";
        assert_eq!(devices_named(m, &devices), ["gpu-b"]);
        assert_eq!(devices_named("bad", &devices), ["gpu-a", "gpu-b"]);
        assert_eq!(devices_named("policy denied gpu-a", &devices), ["gpu-a"]);
        assert!(refused(422) && refused(400) && !refused(409) && !refused(500));
    }
}
