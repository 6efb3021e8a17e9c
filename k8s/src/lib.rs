//! `gpuslice-dra`: the Kubernetes DRA kubelet plugin of gpuslice.
//!
//! It publishes each GPU of its node as one shareable device (`allowMultipleAllocations`) with
//! `memory` and `compute` capacities, so kube-scheduler places claims by what they consume and
//! keeps the sums within each GPU; and it enforces what was placed: each prepared claim becomes
//! a gpuslice operator slice (a VRAM quota and a compute share) and a CDI device that puts the
//! claim's containers in it. See `docs/kubernetes.md`.
//!
//! - [`proto`]: the kubelet's gRPC interfaces (plugin registration; DRA v1 and v1beta1), from
//!   our own `.proto` files written from the published API;
//! - [`driver`]: prepare and unprepare, with state only in the ledger and the CDI directory;
//! - [`resource_slice`]: the ResourceSlice; [`publish`]: where it goes, and the resync loop;
//! - [`claims`]: where ResourceClaims are read (API server, or a directory for tests);
//! - [`server`]: the two unix-socket gRPC servers ([`authority`]: the kubelet's invalid
//!   `:authority` made valid on the way in); [`health`]: the device-health stream the
//!   kubelet watches (`DRAResourceHealth`);
//! - [`nvml`], [`config`]; [`error`]: the plugin's errors, worded where shown.

pub mod authority;
pub mod claims;
pub mod config;
pub mod driver;
pub mod error;
pub mod health;
pub mod nvml;
pub mod publish;
pub mod resource_slice;
pub mod server;

/// Generated from `proto/` by `build.rs`.
pub mod proto {
    /// `pluginregistration` (k8s.io/kubelet/pkg/apis/pluginregistration/v1).
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1`.
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
    /// Device health (k8s.io/kubelet/pkg/apis/dra-health), gRPC package `v1alpha1`.
    pub mod health_v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
    /// Device health, gRPC package `v1` (the same messages).
    pub mod health_v1 {
        tonic::include_proto!("v1");
    }
}
