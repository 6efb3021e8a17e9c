//! What the plugin's system tests share: its directories inside a test's world, starting it,
//! the kubelet's side of registration over its real sockets, the claims an API server would
//! hold (as files, `--claims dir:`), and what a container runtime makes of a CDI device.

#![allow(dead_code)] // each test binary uses a part

pub mod allocator;
pub mod apiserver;
pub mod strict;

use gpuslice_dra::proto::{health_v1alpha1, registration, v1, v1beta1};
use gpuslice_e2e::{artifact, World};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NODE: &str = "node-a";
pub const DRIVER: &str = "gpuslice.dev";

/// The plugin's directories, inside the test's world.
pub struct Dirs {
    pub root: PathBuf,
}

impl Dirs {
    pub fn new(world: &World) -> Dirs {
        let root = world.runtime_dir().parent().unwrap().join("k8s");
        for d in ["reg", "plugin", "cdi", "claims"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        Dirs { root }
    }
    pub fn reg_socket(&self) -> PathBuf {
        self.root.join("reg").join(format!("{DRIVER}-reg.sock"))
    }
    pub fn dra_socket(&self) -> PathBuf {
        self.root.join("plugin/dra.sock")
    }
    pub fn cdi(&self) -> PathBuf {
        self.root.join("cdi")
    }
    pub fn slice_file(&self) -> PathBuf {
        self.root.join("slice.json")
    }
    pub fn log(&self) -> PathBuf {
        self.root.join("plugin.log")
    }
}

pub fn start_plugin(world: &World, dirs: &Dirs) -> Child {
    start_plugin_with(world, dirs, &artifact("libgpuslice.so"), &[])
}

/// The plugin with `library` as the host's libgpuslice.so and `extra` flags; returns once its
/// registration socket exists.
pub fn start_plugin_with(world: &World, dirs: &Dirs, library: &Path, extra: &[&str]) -> Child {
    let _ = std::fs::remove_file(dirs.reg_socket());
    let child = spawn_plugin(world, dirs, library, extra);
    wait_for(dirs, "the registration socket", || {
        dirs.reg_socket().exists()
    });
    child
}

/// The plugin started in the test's directories (its log appended to `dirs.log()`), not
/// waiting for anything.
pub fn spawn_plugin(world: &World, dirs: &Dirs, library: &Path, extra: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dirs.log())
        .unwrap();
    world
        .command(env!("CARGO_BIN_EXE_gpuslice-dra"))
        .arg("--node-name")
        .arg(NODE)
        .arg("--registry-dir")
        .arg(dirs.root.join("reg"))
        .arg("--plugin-dir")
        .arg(dirs.root.join("plugin"))
        .arg("--cdi-dir")
        .arg(dirs.cdi())
        .arg("--runtime-dir")
        .arg(world.runtime_dir())
        .arg("--library")
        .arg(library)
        .arg("--claims")
        .arg(format!("dir:{}", dirs.root.join("claims").display()))
        .arg("--publish")
        .arg(format!("file:{}", dirs.slice_file().display()))
        .args(["--resync", "0.1"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn gpuslice-dra")
}

pub fn log_of(dirs: &Dirs) -> String {
    std::fs::read_to_string(dirs.log()).unwrap_or_default()
}

/// Wait (generously: the machine may be busy) for `cond`, failing with the plugin's log.
pub fn wait_for(dirs: &Dirs, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}; plugin log:\n{}",
            log_of(dirs)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

/// The kubelet's side of the DRA service on the plugin's endpoint: v1, and v1beta1 as a kubelet
/// that still asks for it.
pub struct Kubelet {
    v1: v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    v1beta1: v1beta1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
}

impl Kubelet {
    pub async fn connect(endpoint: &Path) -> Kubelet {
        let channel = channel(endpoint.to_path_buf()).await;
        Kubelet {
            v1: v1::dra_plugin_client::DraPluginClient::new(channel.clone()),
            v1beta1: v1beta1::dra_plugin_client::DraPluginClient::new(channel),
        }
    }

    /// NodePrepareResources for `claims`, as the kubelet asks it.
    pub async fn prepare(&mut self, claims: &[&TestClaim]) -> v1::NodePrepareResourcesResponse {
        let req = v1::NodePrepareResourcesRequest {
            claims: claims.iter().map(|c| c.proto()).collect(),
        };
        self.v1
            .node_prepare_resources(req)
            .await
            .unwrap()
            .into_inner()
    }

    /// NodeUnprepareResources for `claims`.
    pub async fn unprepare(&mut self, claims: &[&TestClaim]) -> v1::NodeUnprepareResourcesResponse {
        let req = v1::NodeUnprepareResourcesRequest {
            claims: claims.iter().map(|c| c.proto()).collect(),
        };
        self.v1
            .node_unprepare_resources(req)
            .await
            .unwrap()
            .into_inner()
    }

    /// [`Kubelet::prepare`] through v1beta1.
    pub async fn prepare_v1beta1(
        &mut self,
        claims: &[&TestClaim],
    ) -> v1beta1::NodePrepareResourcesResponse {
        let req = v1beta1::NodePrepareResourcesRequest {
            claims: claims.iter().map(|c| c.proto_v1beta1()).collect(),
        };
        self.v1beta1
            .node_prepare_resources(req)
            .await
            .unwrap()
            .into_inner()
    }

    /// [`Kubelet::unprepare`] through v1beta1.
    pub async fn unprepare_v1beta1(
        &mut self,
        claims: &[&TestClaim],
    ) -> v1beta1::NodeUnprepareResourcesResponse {
        let req = v1beta1::NodeUnprepareResourcesRequest {
            claims: claims.iter().map(|c| c.proto_v1beta1()).collect(),
        };
        self.v1beta1
            .node_unprepare_resources(req)
            .await
            .unwrap()
            .into_inner()
    }
}

/// The plugin started (on the fake GPU, with this build's shim) and registered as the kubelet
/// registers it: the child and its DRA endpoint.
pub async fn start_registered(world: &World, dirs: &Dirs) -> (Child, PathBuf) {
    let plugin = start_plugin(world, dirs);
    (plugin, register(dirs).await)
}

/// The kubelet's registration: GetInfo, check, NotifyRegistrationStatus; returns the endpoint.
pub async fn register(dirs: &Dirs) -> PathBuf {
    let mut reg = registration::registration_client::RegistrationClient::new(
        channel(dirs.reg_socket()).await,
    );
    let info = reg
        .get_info(registration::InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(PathBuf::from(&info.endpoint), dirs.dra_socket());
    assert!(info
        .supported_versions
        .contains(&"v1.DRAPlugin".to_string()));
    assert!(info
        .supported_versions
        .contains(&"v1beta1.DRAPlugin".to_string()));
    // The optional device-health service, in both versions (health.rs).
    for s in ["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"] {
        assert!(info.supported_versions.contains(&s.to_string()), "{s}");
    }
    reg.notify_registration_status(registration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .expect("NotifyRegistrationStatus");
    PathBuf::from(info.endpoint)
}

/// The ResourceSlice the plugin wrote (`--publish file:`), checked as the API server would
/// check it (`strict.rs`): every slice a test reads is one the API server accepts.
pub fn read_slice(dirs: &Dirs) -> Option<ResourceSlice> {
    let text = std::fs::read_to_string(dirs.slice_file()).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).expect("the published slice is JSON");
    if let Err(r) = strict::check_resource_slice(&v) {
        panic!(
            "the API server would refuse {v}: {:?}",
            r.status("slice")["message"]
        );
    }
    Some(serde_json::from_value(v).expect("the published ResourceSlice deserializes"))
}

/// The ResourceSlice, once the plugin has published it.
pub fn published_slice(dirs: &Dirs) -> ResourceSlice {
    wait_for(dirs, "the ResourceSlice", || read_slice(dirs).is_some());
    read_slice(dirs).unwrap()
}

/// (memory, compute) capacity quantities of each device, by device name.
pub fn capacities(s: &ResourceSlice) -> BTreeMap<String, (String, String)> {
    s.spec
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| {
            let c = d.capacity.as_ref().unwrap();
            (
                d.name.clone(),
                (c["memory"].value.0.clone(), c["compute"].value.0.clone()),
            )
        })
        .collect()
}

pub fn uuid_attr(s: &ResourceSlice, i: usize) -> String {
    let d = &s.spec.devices.as_ref().unwrap()[i];
    d.attributes.as_ref().unwrap()["uuid"]
        .string
        .clone()
        .unwrap()
}

/// The capacity a claim consumed of its device: `memory` and `compute` quantities.
pub fn consumed(memory: &str, compute: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("memory".to_string(), Quantity(memory.into())),
        ("compute".to_string(), Quantity(compute.into())),
    ])
}

pub struct TestClaim {
    pub namespace: &'static str,
    pub name: &'static str,
    pub uid: &'static str,
}

impl TestClaim {
    pub const fn new(namespace: &'static str, name: &'static str, uid: &'static str) -> TestClaim {
        TestClaim {
            namespace,
            name,
            uid,
        }
    }

    pub fn proto(&self) -> v1::Claim {
        v1::Claim {
            namespace: self.namespace.into(),
            uid: self.uid.into(),
            name: self.name.into(),
        }
    }

    /// The claim as a kubelet that still speaks v1beta1 names it.
    pub fn proto_v1beta1(&self) -> v1beta1::Claim {
        v1beta1::Claim {
            namespace: self.namespace.into(),
            uid: self.uid.into(),
            name: self.name.into(),
        }
    }

    /// Write the claim as the API server would hold it after allocation.
    pub fn write(&self, dirs: &Dirs, device: &str, memory: &str, compute: &str) {
        self.write_consumed(dirs, device, Some(consumed(memory, compute)));
    }

    /// The claim as the API server holds it once allocated on `device` of `pool`. `consumed`:
    /// None as a cluster without consumable capacity allocates (the whole device).
    pub fn allocated(
        &self,
        pool: &str,
        device: &str,
        consumed: Option<BTreeMap<String, Quantity>>,
    ) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(self.name.into()),
                namespace: Some(self.namespace.into()),
                uid: Some(self.uid.into()),
                ..Default::default()
            },
            spec: None,
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            driver: DRIVER.into(),
                            pool: pool.into(),
                            device: device.into(),
                            request: "gpu".into(),
                            consumed_capacity: consumed,
                            share_id: Some(format!("share-{}", self.uid)),
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

    /// Write the claim allocated on `device` of this node, as [`TestClaim::allocated`].
    pub fn write_consumed(
        &self,
        dirs: &Dirs,
        device: &str,
        consumed: Option<BTreeMap<String, Quantity>>,
    ) {
        let rc = self.allocated(NODE, device, consumed);
        let dir = dirs.root.join("claims").join(self.namespace);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{}.json", self.name)),
            serde_json::to_string(&rc).unwrap(),
        )
        .unwrap();
    }
}

/// What a container runtime does with a CDI device: its env, with paths under its mounts'
/// container paths mapped to their host paths (what the bind mounts make them).
pub fn container_env(cdi_dir: &Path, id: &str) -> Vec<(String, String)> {
    let (kind, name) = id.split_once('=').unwrap();
    for entry in std::fs::read_dir(cdi_dir).unwrap() {
        // Runtimes read the specs, not the directories of their files beside them.
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        if spec["kind"] != kind {
            continue;
        }
        let Some(dev) = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
        else {
            continue;
        };
        let edits = &dev["containerEdits"];
        let mounts: Vec<(String, String)> = edits["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["containerPath"].as_str().unwrap().to_string(),
                    m["hostPath"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        return edits["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let (k, v) = e.as_str().unwrap().split_once('=').unwrap();
                let v = mounts
                    .iter()
                    .find_map(|(c, h)| v.strip_prefix(c.as_str()).map(|rest| format!("{h}{rest}")))
                    .unwrap_or_else(|| v.to_string());
                (k.to_string(), v)
            })
            .collect();
    }
    panic!("no CDI device {id} in {}", cdi_dir.display());
}

/// `gpuslice-burn` as a container of a pod with this prepared claim would run it: the env of
/// the claim's CDI device, and only the allocated GPU visible (what the NVIDIA CDI device does).
/// `cmd`, a burn in the environment of a 4 GiB claim whose context is charged `context` bytes
/// inside the quota (node mode; 0 in personal mode), sees a 4 GiB GPU and gets no byte past
/// it: 3 GiB and the rest succeed, the next 512 MiB is refused with CUDA_ERROR_OUT_OF_MEMORY.
pub fn assert_held_to_4_gib(cmd: &mut Command, context: u64) {
    gpuslice_e2e::node::assert_held_to_4_gib(cmd, context)
}

pub fn burn_in_claim(world: &World, dirs: &Dirs, ids: &[String]) -> Command {
    let mut c = world.burn();
    for (k, v) in container_env(&dirs.cdi(), &ids[0]) {
        c.env(k, v);
    }
    let (kind, gpu) = ids[1].split_once('=').unwrap();
    assert_eq!(kind, "nvidia.com/gpu");
    c.env("CUDA_VISIBLE_DEVICES", gpu);
    c
}

pub fn prepared_ids(r: &v1::NodePrepareResourcesResponse, uid: &str) -> Vec<String> {
    let e = &r.claims[uid];
    assert_eq!(e.error, "", "claim {uid}");
    assert_eq!(e.devices.len(), 1);
    e.devices[0].cdi_device_ids.clone()
}

/// The kubelet's device-health watch (v1alpha1, what kubelets 1.34 on open).
pub async fn health_watch(
    endpoint: &Path,
) -> tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse> {
    health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
        channel(endpoint.to_path_buf()).await,
    )
    .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
    .await
    .expect("NodeWatchResources")
    .into_inner()
}

/// The health of each device as (status, message), by device name.
pub fn health_of(
    r: &health_v1alpha1::NodeWatchResourcesResponse,
) -> BTreeMap<String, (health_v1alpha1::HealthStatus, String)> {
    r.devices
        .iter()
        .map(|d| {
            let id = d.device.as_ref().expect("a device identifier");
            assert_eq!(id.pool_name, NODE);
            assert!(d.last_updated_time > 0 && d.health_check_timeout_seconds > 0);
            (
                id.device_name.clone(),
                (
                    health_v1alpha1::HealthStatus::try_from(d.health).expect("a known status"),
                    d.message.clone(),
                ),
            )
        })
        .collect()
}

/// The next health message for which `cond` holds (within 60 s).
pub async fn next_health(
    s: &mut tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>,
    what: &str,
    mut cond: impl FnMut(&BTreeMap<String, (health_v1alpha1::HealthStatus, String)>) -> bool,
) -> BTreeMap<String, (health_v1alpha1::HealthStatus, String)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = tokio::time::timeout_at(deadline, s.message())
            .await
            .unwrap_or_else(|_| panic!("no health message with {what} in 60 s"))
            .expect("the health stream")
            .expect("the health stream stays open");
        let h = health_of(&m);
        if cond(&h) {
            return h;
        }
    }
}
