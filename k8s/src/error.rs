//! The plugin's errors. Each keeps its data and is worded only where it is shown: the
//! kubelet's per-claim error (`NodePrepareResourceResponse.error`, shown in the pod's events),
//! the plugin's log, its exit message. Every message says what to do about it.

use crate::claims::ClaimError;
use gpuslice_ledger::{human_bytes, LedgerError};
use gpuslice_protocol::{ProtocolError, Refusal, Why};
use gpuslice_quantity::QuantityError;
use std::fmt;
use std::path::PathBuf;

/// Why the plugin, or one claim's prepare or unprepare, failed.
#[derive(Debug)]
pub enum Error {
    /// NVML could not be loaded or asked.
    Nvml(gpuslice_nvml::Error),
    /// The runtime directory's ledger could not be opened or read.
    Ledger {
        /// The runtime directory.
        dir: PathBuf,
        /// Why.
        source: Box<LedgerError>,
    },
    /// `--mode personal`, but the ledger at this path is the node monitor's policy.
    NodePolicyInPersonalMode(PathBuf),
    /// `--mode node`, but the ledger at this path is a personal one.
    PersonalLedgerInNodeMode(PathBuf),
    /// Registering a GPU (`uuid`) in a personal ledger failed.
    Register {
        /// The GPU.
        uuid: String,
        /// Why.
        source: Box<LedgerError>,
    },
    /// The ledger refused a change to a claim's slice (personal mode).
    Slice(LedgerError),
    /// The node's monitor did not answer, or refused (node mode).
    Monitor(MonitorError),
    /// Reading a ResourceClaim failed.
    Claim(ClaimError),
    /// The kubelet named a claim by a UID that the API server's claim no longer has.
    ClaimRecreated {
        /// `namespace/name`.
        claim: String,
        /// The API server's UID.
        has: String,
        /// The kubelet's.
        asked: String,
    },
    /// The claim has no device of this driver allocated.
    NotAllocated {
        /// This plugin's driver name.
        driver: String,
    },
    /// A device was allocated from another node's pool.
    OtherPool {
        /// The allocation's pool.
        pool: String,
        /// The allocation's device.
        device: String,
        /// This node.
        node: String,
    },
    /// A device allocated here is a GPU this node published that is gone now (tainted).
    Gone {
        /// The allocation's device.
        device: String,
        /// Why: NVML reports it lost, or no longer lists it.
        why: crate::resource_slice::Gone,
        /// The taint it carries (`<driver>/gone=<why>:<effect>`).
        taint: String,
    },
    /// A device allocated here is not one of this node's GPUs.
    NotOnNode {
        /// The allocation's device.
        device: String,
        /// The devices this node has.
        here: Vec<String>,
    },
    /// A `consumedCapacity` entry is not a quantity (the error names which entry).
    Capacity(QuantityError),
    /// `consumedCapacity` memory does not fit in 64 bits.
    MemoryTooLarge,
    /// `consumedCapacity` compute is more than a whole GPU.
    ComputeOverWhole {
        /// What was consumed, in thousandths.
        compute: u128,
        /// A whole GPU, in the same unit.
        whole: u64,
    },
    /// The claim's slice exists with other sizes than the claim now asks.
    SliceDiffers {
        /// The slice.
        name: String,
        /// Its GPU.
        uuid: String,
        /// Its memory limit.
        has_memory: Option<u64>,
        /// Its compute share, in thousandths.
        has_compute: u32,
        /// The claim's memory.
        memory: u64,
        /// The claim's compute, in thousandths.
        compute: u64,
    },
    /// The allocated GPU is not in the ledger (`node_mode`: not in the monitor's policy).
    NotRegistered {
        /// The GPU.
        uuid: String,
        /// Node mode.
        node_mode: bool,
    },
    /// The allocation asks for more memory than the GPU has left (a stale allocation).
    StaleMemory {
        /// The DRA device name.
        device: String,
        /// The GPU.
        uuid: String,
        /// Asked.
        requested: u64,
        /// Left.
        available: u64,
    },
    /// The allocation asks for more compute than the GPU has left (a stale allocation).
    StaleCompute {
        /// The DRA device name.
        device: String,
        /// The GPU.
        uuid: String,
        /// Asked, in thousandths.
        requested: u64,
        /// Left, in thousandths.
        available: u64,
    },
    /// Making the claim's join secret failed.
    Secret(LedgerError),
    /// Reading an existing claim slice's join secret failed.
    ReadSecret {
        /// The slice.
        name: String,
        /// Why.
        source: Box<LedgerError>,
    },
    /// Creating the claim's slice on `device` failed (nothing was kept).
    Creating {
        /// The slice.
        name: String,
        /// The GPU.
        device: String,
        /// Why.
        source: Box<Error>,
    },
    /// The claim's slice still has live processes (unprepare is retried).
    StillLive {
        /// The slice.
        name: String,
        /// How many.
        live: u32,
        /// Their pids, sorted.
        pids: Vec<u32>,
    },
    /// Removing the claim's slice failed.
    Removing {
        /// The slice.
        name: String,
        /// Why.
        source: Box<Error>,
    },
    /// A file operation failed: what was done (`writing the CDI spec`), on which path.
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The API server refused or failed a request: what was asked.
    Api {
        /// What was being done (`listing ResourceSlices (spec.driver=…)`).
        what: String,
        /// Why.
        source: kube::Error,
    },
    /// A gRPC service stopped.
    Serve {
        /// `the DRA service`, `the registration service`.
        what: &'static str,
        /// Why.
        source: tonic::transport::Error,
    },
    /// A claim's prepare or unprepare failed.
    ForClaim {
        /// `namespace/name`.
        claim: String,
        /// Its UID.
        uid: String,
        /// Why.
        source: Box<Error>,
    },
    /// Something else: what, and why (serializing, a signal handler).
    Other {
        /// What was being done.
        what: &'static str,
        /// Why, as the library said it.
        why: String,
    },
}

impl Error {
    /// The monitor refused a removal because the slice is already gone.
    pub fn is_no_such_slice(&self) -> bool {
        match self {
            Error::Slice(LedgerError::NoSuchSlice(_)) => true,
            Error::Monitor(MonitorError::Refused(r)) => r.why == Why::NoSuchSlice,
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Nvml(e @ gpuslice_nvml::Error::NotFound) => write!(
                f,
                "{e}: mount the node's NVIDIA driver libraries into the plugin's container \
                 (see docs/kubernetes.md)"
            ),
            Error::Nvml(e) => write!(f, "{e}"),
            Error::Ledger { dir, source } => {
                write!(f, "the gpuslice ledger in {}: {source}", dir.display())
            }
            Error::NodePolicyInPersonalMode(p) => write!(
                f,
                "--mode personal, but {} is the node monitor's policy: run with --mode node \
                 (or auto), so slices are made through the monitor",
                p.display()
            ),
            Error::PersonalLedgerInNodeMode(p) => write!(
                f,
                "--mode node, but {} is a personal ledger, not the policy of a root \
                 `gpuslice monitor`: stop what uses it, remove it, and start the monitor \
                 as root (or run the plugin with --mode personal)",
                p.display()
            ),
            Error::Register { uuid, source } => {
                write!(f, "registering {uuid} in the ledger: {source}")
            }
            Error::Slice(e) => write!(f, "{e}"),
            Error::Monitor(e) => write!(f, "{e}"),
            Error::Claim(e) => write!(f, "{e}"),
            Error::ClaimRecreated { claim, has, asked } => write!(
                f,
                "the ResourceClaim {claim} has UID {has:?}, the kubelet asked for {asked:?}: it \
                 was deleted and re-created; the pod needs to be re-created"
            ),
            Error::NotAllocated { driver } => write!(
                f,
                "the ResourceClaim has no device of driver {driver} allocated (status.allocation \
                 is empty: not scheduled yet?)"
            ),
            Error::OtherPool { pool, device, node } => write!(
                f,
                "device {pool}/{device} was allocated from pool {pool:?}, but this is node {node:?}"
            ),
            Error::Gone { device, why, taint } => write!(
                f,
                "device {device} is gone ({}; tainted {taint} in the ResourceSlice): nothing \
                 was created; the kubelet retries, and the claim is prepared if the GPU comes \
                 back (a GPU reset); otherwise delete the pod so its claim is allocated anew",
                match why {
                    crate::resource_slice::Gone::Lost => {
                        "NVML reports it lost: fallen off the bus, XID 79"
                    }
                    crate::resource_slice::Gone::Missing => "NVML no longer lists it",
                }
            ),
            Error::NotOnNode { device, here } => write!(
                f,
                "device {device} is not on this node (GPUs here: {}); a stale allocation",
                here.join(", ")
            ),
            Error::Capacity(e) => write!(f, "{e}"),
            Error::MemoryTooLarge => write!(f, "consumedCapacity memory is too large"),
            Error::ComputeOverWhole { compute, whole } => write!(
                f,
                "consumedCapacity compute {compute} is more than a whole GPU ({whole})"
            ),
            Error::SliceDiffers {
                name,
                uuid,
                has_memory,
                has_compute,
                memory,
                compute,
            } => write!(
                f,
                "slice {name} already exists on {uuid} with memory {}, compute {has_compute}, but \
                 the claim now asks for memory {}, compute {compute}: remove it with `gpuslice \
                 slice rm {name}` once its processes are gone",
                has_memory.map(human_bytes).unwrap_or_else(|| "none".into()),
                human_bytes(*memory),
            ),
            Error::NotRegistered {
                uuid,
                node_mode: true,
            } => write!(
                f,
                "{uuid} is not registered in the node's policy: the gpuslice monitor registers \
                 the GPUs NVML shows it (is its container given the GPUs, \
                 NVIDIA_VISIBLE_DEVICES=all?); retried"
            ),
            Error::NotRegistered {
                uuid,
                node_mode: false,
            } => {
                write!(f, "{uuid} is not in the gpuslice ledger")
            }
            Error::StaleMemory {
                device,
                uuid,
                requested,
                available,
            } => write!(
                f,
                "memory {} requested on {device} ({uuid}), {} available: the allocation is stale \
                 (memory was reserved on this GPU outside Kubernetes, or the ResourceSlice was out \
                 of date); nothing was created, delete and re-create the pod to schedule it again",
                human_bytes(*requested),
                human_bytes(*available)
            ),
            Error::StaleCompute {
                device,
                uuid,
                requested,
                available,
            } => write!(
                f,
                "compute {requested} requested on {device} ({uuid}), {available} available: the \
                 allocation is stale; nothing was created"
            ),
            Error::Secret(e) => write!(f, "{e}"),
            Error::ReadSecret { name, source } => write!(
                f,
                "reading slice {name}'s join secret: {source} (the plugin runs as root to read it)"
            ),
            Error::Creating {
                name,
                device,
                source,
            } => write!(
                f,
                "creating slice {name} on {device}: {source}; nothing was kept"
            ),
            Error::StillLive { name, live, pids } => write!(
                f,
                "slice {name} still has {live} live process(es) (pids {pids:?}): kept with its CDI \
                 spec, and retried when the kubelet calls again; if these are not the pod's own \
                 processes, end them"
            ),
            Error::Removing { name, source } => write!(f, "removing slice {name}: {source}"),
            Error::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
            Error::Api { what, source } => write!(f, "{what}: {source}"),
            Error::Serve { what, source } => write!(f, "{what}: {source}"),
            Error::ForClaim { claim, uid, source } => {
                write!(f, "claim {claim} (uid {uid}): {source}")
            }
            Error::Other { what, why } => write!(f, "{what}: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// What the node's monitor answered instead of `ok` (node mode).
#[derive(Debug, Clone)]
pub enum MonitorError {
    /// It did not answer on `socket` (the kubelet retries).
    Down {
        /// `monitor.sock`.
        socket: PathBuf,
        /// Why.
        source: ProtocolError,
    },
    /// It refused the request.
    Refused(Refusal),
}

impl fmt::Display for MonitorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MonitorError::Down { socket, source } => write!(
                f,
                "the node's gpuslice monitor does not answer on {} ({source}): start it as root \
                 (`gpuslice monitor`, the monitor container of the gpuslice-dra DaemonSet); \
                 nothing was changed, and the kubelet retries",
                socket.display()
            ),
            MonitorError::Refused(r) => write!(f, "the node's gpuslice monitor refused: {r}"),
        }
    }
}

impl From<MonitorError> for Error {
    fn from(e: MonitorError) -> Error {
        Error::Monitor(e)
    }
}

impl From<gpuslice_nvml::Error> for Error {
    fn from(e: gpuslice_nvml::Error) -> Error {
        Error::Nvml(e)
    }
}

impl From<ClaimError> for Error {
    fn from(e: ClaimError) -> Error {
        Error::Claim(e)
    }
}
