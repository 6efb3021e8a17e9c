//! The node's ResourceSlice: one device per GPU, shareable (`allowMultipleAllocations`), with
//! `memory` (bytes) and `compute` (thousandths of the GPU; 0 = best effort) capacities, less
//! what operator slices made outside Kubernetes already reserve in the ledger.

use crate::nvml::{Gpu, Inventory};
use crate::quantity;
use gpuslice_ledger::{Snapshot, PPM};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;

/// The capacity name of a device's memory (bytes).
pub const MEMORY: &str = "memory";
/// The capacity name of a device's guaranteed compute (thousandths of the GPU).
pub const COMPUTE: &str = "compute";
/// Compute capacity of a whole GPU.
pub const COMPUTE_WHOLE: u64 = 1000;

/// The DRA device name of a GPU: `gpu-` and its UUID in lower case (a DNS label, stable across
/// reboots and index changes).
pub fn device_name(uuid: &str) -> String {
    let id = uuid.strip_prefix("GPU-").unwrap_or(uuid);
    let mut s: String = format!("gpu-{id}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(63);
    s.trim_end_matches('-').to_string()
}

/// What the ledger's operator slices made outside Kubernetes (no claim label) reserve on a GPU:
/// (bytes, compute in thousandths rounded up).
pub fn outside_reservations(snap: &Snapshot, uuid: &str) -> (u64, u64) {
    let mut mem = 0u64;
    let mut ppm = 0u64;
    for s in &snap.slices {
        if s.device_uuid == uuid && s.operator_defined && s.claim.is_none() {
            mem = mem.saturating_add(s.memory_limit.unwrap_or(0));
            ppm += s.compute_share_ppm as u64;
        }
    }
    (mem, ppm.div_ceil(PPM as u64 / COMPUTE_WHOLE))
}

/// What one GPU offers to Kubernetes: (memory bytes, compute thousandths).
pub fn offered(gpu: &Gpu, snap: &Snapshot) -> (u64, u64) {
    let (mem, compute) = outside_reservations(snap, &gpu.uuid);
    (
        gpu.memory_total.saturating_sub(mem),
        COMPUTE_WHOLE.saturating_sub(compute),
    )
}

fn string_attr(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    }
}

/// The devices of this node's slice.
pub fn devices(
    inv: &Inventory,
    snap: &Snapshot,
    memory_step: u64,
    memory_default: u64,
) -> Vec<Device> {
    inv.gpus
        .iter()
        .map(|g| {
            let (mem, compute) = offered(g, snap);
            let mut attributes = BTreeMap::new();
            attributes.insert("uuid".to_string(), string_attr(&g.uuid));
            attributes.insert("productName".to_string(), string_attr(&g.name));
            attributes.insert(
                "driverVersion".to_string(),
                string_attr(&inv.driver_version),
            );
            attributes.insert(
                "index".to_string(),
                DeviceAttribute {
                    int: Some(g.index as i64),
                    ..Default::default()
                },
            );
            let mut capacity = BTreeMap::new();
            capacity.insert(
                MEMORY.to_string(),
                DeviceCapacity {
                    value: Quantity(quantity::bytes(mem)),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(Quantity(quantity::bytes(memory_default))),
                        valid_range: Some(CapacityRequestPolicyRange {
                            min: Quantity(quantity::bytes(memory_step)),
                            step: Some(Quantity(quantity::bytes(memory_step))),
                            max: None,
                        }),
                        valid_values: None,
                    }),
                },
            );
            capacity.insert(
                COMPUTE.to_string(),
                DeviceCapacity {
                    value: Quantity(compute.to_string()),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(Quantity("0".into())),
                        valid_range: Some(CapacityRequestPolicyRange {
                            min: Quantity("0".into()),
                            step: Some(Quantity("1".into())),
                            max: None,
                        }),
                        valid_values: None,
                    }),
                },
            );
            Device {
                name: device_name(&g.uuid),
                allow_multiple_allocations: Some(true),
                attributes: Some(attributes),
                capacity: Some(capacity),
                ..Default::default()
            }
        })
        .collect()
}

/// The object name of this node's slice (a DNS subdomain).
pub fn object_name(node: &str, driver: &str) -> String {
    let mut s: String = format!("{node}-{driver}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(253);
    s.trim_end_matches(['-', '.']).to_string()
}

/// The whole ResourceSlice of this node, pool generation `generation`, owned by `owner` (the
/// Node) when given.
pub fn resource_slice(
    node: &str,
    driver: &str,
    generation: i64,
    owner: Option<OwnerReference>,
    devices: Vec<Device>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(object_name(node, driver)),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_dns_labels_from_the_uuid() {
        assert_eq!(
            device_name("GPU-FA4E0000-0000-4000-8000-000000000001"),
            "gpu-fa4e0000-0000-4000-8000-000000000001"
        );
        let long = device_name(&format!("GPU-{}", "a".repeat(80)));
        assert!(long.len() <= 63);
        assert_eq!(object_name("Node_1", "gpuslice.dev"), "node-1-gpuslice.dev");
    }
}
