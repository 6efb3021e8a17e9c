//! Device health for the kubelet (`DRAResourceHealth.NodeWatchResources`, KEP-4680 for DRA,
//! feature gate `ResourceHealthStatus`): a stream on the DRA socket that carries the health of
//! every GPU this plugin published, at once, on every change, and every [`KEEPALIVE`] so the
//! kubelet never takes it as stale. The kubelet shows it in the status of the pods whose
//! claims use the device (`status.containerStatuses[].allocatedResourcesStatus`).
//!
//! What "healthy" means here is what the plugin can vouch for: NVML lists the GPU, and (node
//! mode) the node's monitor answers, without which no new process of a claim on the GPU can
//! start (`cuInit` needs admission). A GPU that NVML stopped listing is unhealthy; with NVML
//! itself failing, every GPU is unknown. Served as `v1alpha1` (kubelets 1.34 on) and `v1`
//! (same messages; newer kubelets pick it from the registration's supported versions).

use crate::proto::{health_v1, health_v1alpha1};
use std::collections::BTreeSet;
use std::pin::Pin;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The registration's names of the health services served.
pub const SERVICES: [&str; 2] = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];
/// How often an unchanged health is sent again.
pub const KEEPALIVE: Duration = Duration::from_secs(20);
/// After how long without a message the kubelet may take a device's health as unknown.
pub const TIMEOUT_SECONDS: i64 = 60;
/// The kubelet keeps at most this much of a message.
const MESSAGE_MAX: usize = 1024;

/// One GPU's health, as the plugin determined it last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHealth {
    /// The DRA device name (`gpu-<uuid>`).
    pub device: String,
    /// `Some(true)` healthy, `Some(false)` unhealthy, `None` unknown.
    pub healthy: Option<bool>,
    /// Why (empty when healthy).
    pub message: String,
}

/// Every GPU in `seen` (device names of all GPUs published since start): `here` is what NVML
/// lists now (or why it failed), `lost` the GPUs NVML reports lost, `monitor` why the node's
/// monitor does not answer (node mode).
pub fn judge(
    seen: &BTreeSet<String>,
    here: Result<&BTreeSet<String>, &str>,
    lost: &BTreeSet<String>,
    monitor: Option<&str>,
) -> Vec<GpuHealth> {
    seen.iter()
        .map(|device| {
            let (healthy, message) = match (here, monitor) {
                (Err(e), _) => (None, format!("NVML does not answer: {e}")),
                (Ok(here), _) if !here.contains(device) && lost.contains(device) => (
                    Some(false),
                    "NVML reports this GPU lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus, \
                     XID 79); processes on it fail, and a GPU reset or a reboot brings it back"
                        .into(),
                ),
                (Ok(here), _) if !here.contains(device) => (
                    Some(false),
                    "NVML no longer lists this GPU (fallen off the bus, or reset?)".into(),
                ),
                (Ok(_), Some(e)) => (
                    Some(false),
                    format!("new processes of claims on this GPU cannot start (no admission): {e}"),
                ),
                (Ok(_), None) => (Some(true), String::new()),
            };
            GpuHealth {
                device: device.clone(),
                healthy,
                message,
            }
        })
        .collect()
}

/// The health of `gpus` as a v1 message.
pub fn response(pool: &str, gpus: &[GpuHealth], now: i64) -> health_v1::NodeWatchResourcesResponse {
    health_v1::NodeWatchResourcesResponse {
        devices: gpus
            .iter()
            .map(|g| {
                let mut message = g.message.clone();
                if message.len() > MESSAGE_MAX {
                    let mut cut = MESSAGE_MAX - 3;
                    while !message.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    message.truncate(cut);
                    message.push_str("...");
                }
                health_v1::DeviceHealth {
                    device: Some(health_v1::DeviceIdentifier {
                        pool_name: pool.to_string(),
                        device_name: g.device.clone(),
                    }),
                    health: match g.healthy {
                        Some(true) => health_v1::HealthStatus::Healthy,
                        Some(false) => health_v1::HealthStatus::Unhealthy,
                        None => health_v1::HealthStatus::Unknown,
                    } as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: TIMEOUT_SECONDS,
                    message,
                }
            })
            .collect(),
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

type HealthStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The stream for one watcher: the current health at once, then on every change and every
/// [`KEEPALIVE`]; it ends when the watcher goes away. `T` is the v1 response or one with the
/// same fields (v1alpha1), converted on the wire.
fn watch<T: prost::Message + Default + Send + 'static>(health: &Health) -> HealthStream<T> {
    let mut rx = health.gpus.clone();
    let pool = health.pool.clone();
    let (tx, out) = tokio::sync::mpsc::channel::<Result<T, Status>>(4);
    tokio::spawn(async move {
        loop {
            let gpus = rx.borrow_and_update().clone();
            let msg = response(&pool, &gpus, now());
            let msg = T::decode(prost::Message::encode_to_vec(&msg).as_slice())
                .map_err(|e| Status::internal(format!("converting the health message: {e}")));
            if tx.send(msg).await.is_err() {
                return; // the kubelet closed the stream
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(KEEPALIVE) => {}
                () = tx.closed() => return,
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))
}

/// Both health services: the GPUs' health as the driver keeps it (`Driver::health`), for the
/// pool (node) it publishes.
#[derive(Clone)]
pub struct Health {
    /// The pool the devices are named in (the node's name).
    pub pool: String,
    /// Every GPU's health, current.
    pub gpus: tokio::sync::watch::Receiver<Vec<GpuHealth>>,
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for Health {
    type NodeWatchResourcesStream = HealthStream<health_v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(watch(self)))
    }
}

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for Health {
    type NodeWatchResourcesStream = HealthStream<health_v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(watch(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn a_gpu_is_healthy_when_nvml_lists_it_and_the_monitor_answers() {
        let seen: BTreeSet<String> = ["gpu-a", "gpu-b"].map(String::from).into();
        let here: BTreeSet<String> = ["gpu-a"].map(String::from).into();
        let none = BTreeSet::new();
        let h = judge(&seen, Ok(&here), &none, None);
        assert_eq!((h[0].healthy, h[0].message.as_str()), (Some(true), ""));
        assert_eq!(h[1].healthy, Some(false), "gone from NVML");
        assert!(h[1].message.contains("no longer lists"));
        let lost: BTreeSet<String> = ["gpu-b"].map(String::from).into();
        let h = judge(&seen, Ok(&here), &lost, None);
        assert_eq!(h[1].healthy, Some(false), "reported lost");
        assert!(h[1].message.contains("NVML_ERROR_GPU_IS_LOST"), "{h:?}");
        let h = judge(&seen, Ok(&here), &none, Some("connection refused"));
        assert_eq!(h[0].healthy, Some(false));
        assert!(h[0].message.contains("connection refused"));
        let h = judge(&seen, Err("NVML_ERROR_UNINITIALIZED"), &none, None);
        assert!(h.iter().all(|g| g.healthy.is_none()));
        assert!(h[0].message.contains("NVML_ERROR_UNINITIALIZED"));
    }

    #[test]
    fn messages_name_the_device_and_are_cut_to_the_kubelets_limit() {
        let gpus = [
            GpuHealth {
                device: "gpu-a".into(),
                healthy: Some(true),
                message: String::new(),
            },
            GpuHealth {
                device: "gpu-b".into(),
                healthy: Some(false),
                message: "é".repeat(700),
            },
            GpuHealth {
                device: "gpu-c".into(),
                healthy: None,
                message: "nvml".into(),
            },
        ];
        let r = response("node-a", &gpus, 7);
        let d = &r.devices;
        assert_eq!(d.len(), 3);
        let id = d[1].device.as_ref().unwrap();
        assert_eq!(
            (id.pool_name.as_str(), id.device_name.as_str()),
            ("node-a", "gpu-b")
        );
        assert_eq!(d[0].health, health_v1::HealthStatus::Healthy as i32);
        assert_eq!(d[1].health, health_v1::HealthStatus::Unhealthy as i32);
        assert_eq!(d[2].health, health_v1::HealthStatus::Unknown as i32);
        assert!(d[1].message.len() <= MESSAGE_MAX && d[1].message.ends_with("..."));
        assert_eq!(
            (d[0].last_updated_time, d[0].health_check_timeout_seconds),
            (7, 60)
        );
        // v1alpha1 reads the same bytes the same way.
        let a = health_v1alpha1::NodeWatchResourcesResponse::decode(
            prost::Message::encode_to_vec(&r).as_slice(),
        )
        .unwrap();
        assert_eq!(a.devices[2].message, "nvml");
        assert_eq!(
            a.devices[1].health,
            health_v1alpha1::HealthStatus::Unhealthy as i32
        );
    }
}
