//! The node's ResourceSlice: one device per GPU, shareable (`allowMultipleAllocations`), with
//! `memory` (bytes) and `compute` (thousandths of the GPU; 0 = best effort) capacities, less
//! what operator slices made outside Kubernetes already reserve in the ledger.

use crate::config::TaintEffect;
use crate::nvml::{Gpu, Inventory};
use gpuslice_ledger::{Snapshot, PPM};
use gpuslice_quantity::kubernetes_bytes;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
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
            ppm += s.compute_share.ppm() as u64;
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

/// The API server's limit on a string attribute (`DeviceAttributeMaxValueLength`,
/// pkg/apis/resource/types.go).
pub const ATTRIBUTE_MAX: usize = 64;

/// A string attribute, cut to [`ATTRIBUTE_MAX`] bytes at a character boundary (a product name
/// past it would make the API server refuse the whole slice).
fn string_attr(s: &str) -> DeviceAttribute {
    let mut end = s.len().min(ATTRIBUTE_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    DeviceAttribute {
        string: Some(s[..end].to_string()),
        ..Default::default()
    }
}

/// The memory capacity of a GPU with `offered` bytes left, requested in multiples of `step` from
/// `step` up; `None` when fewer than two steps are left: the API server requires `min + step <=
/// value` of a request policy (`validateRequestPolicyRange`, pkg/apis/resource/validation), so
/// such a GPU cannot offer memory in steps and is left out of the slice. The default (what a
/// request that names no memory consumes) is `default` or, when less is left, the largest
/// multiple of `step` that fits, so `min <= default <= value` and the default is on the grid.
pub fn memory_capacity(offered: u64, step: u64, default: u64) -> Option<DeviceCapacity> {
    if step == 0 || offered / step < 2 {
        return None;
    }
    let default = default.min(offered / step * step).max(step);
    let default = default / step * step;
    Some(DeviceCapacity {
        value: Quantity(kubernetes_bytes(offered)),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(kubernetes_bytes(default))),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(kubernetes_bytes(step)),
                step: Some(Quantity(kubernetes_bytes(step))),
                max: None,
            }),
            valid_values: None,
        }),
    })
}

/// The compute capacity of a GPU with `offered` thousandths left. With at least one left,
/// requests are whole thousandths from 0 (best effort) up, 0 when none is named. With none
/// left, the value is 0 and there is no request policy (one with `min + step <= 0` cannot
/// exist): a request for any compute does not fit, and one that names none consumes the
/// value, 0, so the GPU still takes best-effort claims for its memory.
pub fn compute_capacity(offered: u64) -> DeviceCapacity {
    let request_policy = (offered >= 1).then(|| CapacityRequestPolicy {
        default: Some(Quantity("0".into())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity("0".into()),
            step: Some(Quantity("1".into())),
            max: None,
        }),
        valid_values: None,
    });
    DeviceCapacity {
        value: Quantity(offered.to_string()),
        request_policy,
    }
}

/// The devices of this node's slice, and the GPUs left out of it with why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Devices {
    /// One per GPU that can take a claim.
    pub published: Vec<Device>,
    /// (device name, why) of each GPU too full to be published.
    pub left_out: Vec<(String, String)>,
}

/// The devices of this node's slice: one per GPU, less what operator slices reserve; a GPU
/// with less than two memory steps left is left out (see [`memory_capacity`]), so the slice
/// stays valid and the node's other GPUs stay schedulable.
pub fn devices(inv: &Inventory, snap: &Snapshot, memory_step: u64, memory_default: u64) -> Devices {
    let mut out = Devices::default();
    for g in &inv.gpus {
        let (mem, compute) = offered(g, snap);
        let name = device_name(&g.uuid);
        let Some(memory) = memory_capacity(mem, memory_step, memory_default) else {
            out.left_out.push((
                name,
                format!(
                    "{} of its memory is left after operator slices (gpuslice slice create), \
                     less than two --memory-step ({}) steps",
                    kubernetes_bytes(mem),
                    kubernetes_bytes(memory_step)
                ),
            ));
            continue;
        };
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
        let capacity = BTreeMap::from([
            (MEMORY.to_string(), memory),
            (COMPUTE.to_string(), compute_capacity(compute)),
        ]);
        out.published.push(Device {
            name,
            allow_multiple_allocations: Some(true),
            attributes: Some(attributes),
            capacity: Some(capacity),
            ..Default::default()
        });
    }
    out
}

/// Why a GPU the plugin published is gone: the value of its taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// NVML counts it but reports it lost (`NVML_ERROR_GPU_IS_LOST`: fallen off the bus, XID 79).
    Lost,
    /// NVML no longer lists it (unbound from the driver, removed, or renumbered away).
    Missing,
}

impl Gone {
    /// The taint's value (a label value).
    pub fn as_str(self) -> &'static str {
        match self {
            Gone::Lost => "lost",
            Gone::Missing => "missing",
        }
    }
}

/// The key of the taint on a GPU that is gone: `<driver>/gone`, in the driver's own domain
/// (a label name: the driver name is a DNS subdomain, the API server's rule for a prefix).
pub fn gone_key(driver: &str) -> String {
    format!("{driver}/gone")
}

/// `device` (as last published) kept in the slice with the taint `<driver>/gone=<why>:<effect>`,
/// added at `since`, so kube-scheduler allocates it to no new claim (a device that simply
/// vanished from the slice would say nothing about the pods that hold it), and, with
/// `NoExecute`, kube-controller-manager evicts the pods using it.
pub fn tainted(
    device: &Device,
    driver: &str,
    why: Gone,
    effect: TaintEffect,
    since: Time,
) -> Device {
    let mut d = device.clone();
    let key = gone_key(driver);
    let mut taints: Vec<DeviceTaint> = d
        .taints
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != key)
        .collect();
    taints.push(DeviceTaint {
        key,
        value: Some(why.as_str().into()),
        effect: effect.as_str().into(),
        time_added: Some(since),
    });
    d.taints = Some(taints);
    d
}

/// Now, to the second (what the API server keeps of a `Time`), so a taint's `timeAdded`
/// compares equal to what was applied.
pub fn now() -> Time {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
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

    fn policy(c: &DeviceCapacity) -> (String, String, String, String) {
        let p = c.request_policy.as_ref().unwrap();
        let r = p.valid_range.as_ref().unwrap();
        (
            c.value.0.clone(),
            p.default.as_ref().unwrap().0.clone(),
            r.min.0.clone(),
            r.step.as_ref().unwrap().0.clone(),
        )
    }

    #[test]
    fn request_policies_stay_within_what_is_left() {
        let (mi, gi) = (1u64 << 20, 1u64 << 30);
        let s = |v: &str| v.to_string();
        let m = |left| memory_capacity(left, 256 * mi, gi).map(|c| policy(&c));
        assert_eq!(
            m(16 * gi),
            Some((s("16Gi"), s("1Gi"), s("256Mi"), s("256Mi")))
        );
        // Less than the default left: the default is what is left, on the grid.
        assert_eq!(
            m(768 * mi + 5),
            Some((s("805306373"), s("768Mi"), s("256Mi"), s("256Mi")))
        );
        assert_eq!(
            m(512 * mi),
            Some((s("512Mi"), s("512Mi"), s("256Mi"), s("256Mi")))
        );
        // Less than two steps: no policy the API server accepts; the GPU is left out.
        assert_eq!(m(512 * mi - 1), None);
        assert_eq!(m(256 * mi), None);
        assert_eq!(m(0), None);
        assert_eq!(
            policy(&compute_capacity(1)),
            (s("1"), s("0"), s("0"), s("1"))
        );
        let none = compute_capacity(0);
        assert_eq!((none.value.0.as_str(), none.request_policy), ("0", None));
    }

    #[test]
    fn a_gone_gpu_keeps_its_device_with_one_taint_of_the_driver() {
        let d = Device {
            name: "gpu-a".into(),
            ..Default::default()
        };
        let t = now();
        let lost = tainted(
            &d,
            "gpuslice.dev",
            Gone::Lost,
            TaintEffect::NoSchedule,
            t.clone(),
        );
        let again = tainted(
            &lost,
            "gpuslice.dev",
            Gone::Missing,
            TaintEffect::NoExecute,
            t.clone(),
        );
        let taints = again.taints.as_ref().unwrap();
        assert_eq!(taints.len(), 1, "one taint of the driver, replaced");
        assert_eq!(
            (
                taints[0].key.as_str(),
                taints[0].value.as_deref(),
                taints[0].effect.as_str()
            ),
            ("gpuslice.dev/gone", Some("missing"), "NoExecute")
        );
        assert_eq!(taints[0].time_added, Some(t.clone()));
        assert_eq!(
            Device {
                taints: None,
                ..again
            },
            d,
            "the device is otherwise unchanged"
        );
        let json = serde_json::to_value(&lost).unwrap();
        assert!(
            json["taints"][0]["timeAdded"]
                .as_str()
                .unwrap()
                .ends_with('Z'),
            "{json}"
        );
        assert_eq!(t.0.subsec_nanosecond(), 0);
    }

    #[test]
    fn long_attributes_are_cut_to_the_api_limit() {
        let a = string_attr(&"é".repeat(40));
        let v = a.string.unwrap();
        assert!(v.len() <= ATTRIBUTE_MAX && v.chars().all(|c| c == 'é'));
    }
}
