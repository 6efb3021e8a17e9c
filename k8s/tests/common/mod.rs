//! What the plugin's test files share (each `tests/*.rs` is its own crate and includes this as
//! `mod common`).

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Claim `namespace/name` (uid `uid`) as the API server holds it once the scheduler allocated
/// it on `device` of pool `pool` (driver `gpuslice.dev`, request `gpu`, share `share-<uid>`).
/// `consumed`: what it consumes (`memory`, `compute`); `None` as a cluster without consumable
/// capacity allocates (the whole device).
pub fn allocated_claim(
    (namespace, name, uid): (&str, &str, &str),
    pool: &str,
    device: &str,
    consumed: Option<BTreeMap<String, Quantity>>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: None,
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        driver: "gpuslice.dev".into(),
                        pool: pool.into(),
                        device: device.into(),
                        request: "gpu".into(),
                        consumed_capacity: consumed,
                        share_id: Some(format!("share-{uid}")),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// `memory` and `compute` as a claim consumes them.
pub fn consumed(memory: &str, compute: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("memory".to_string(), Quantity(memory.into())),
        ("compute".to_string(), Quantity(compute.into())),
    ])
}

/// A gRPC channel to the plugin's unix socket at `path`, as the kubelet opens one.
pub async fn channel(path: PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connect to the plugin's socket")
}
