//! A GPU that is gone, as the API of Kubernetes 1.37 tells the cluster (DRA device taints, GA
//! in 1.37, and the kubelet's health stream): the fake GPU's device 1 falls off the bus
//! (`fakegpu-client lose 1`, NVML_ERROR_GPU_IS_LOST as after an XID 79) while the plugin runs
//! against the strict fake API server. The GPU stays in the node's ResourceSlice, unchanged
//! but for the taint `gpuslice.dev/gone=lost` (the `--gone-taint-effect`), accepted by the
//! server's 1.37 rules for taints, and the health stream reports it unhealthy; the other GPU
//! is untouched. Brought back (`fakegpu-client restore 1`), the taint goes and it is healthy.

mod common;
use common::apiserver::{exited, wait_until, Cluster, FakeApiServer};
use common::strict::check_resource_slice;
use common::{channel, consumed, health_watch, next_health, Kubelet, TestClaim, NODE};
use gpuslice_dra::proto::health_v1alpha1::HealthStatus;
use gpuslice_dra::proto::registration;
use gpuslice_e2e::artifact;
use serde_json::Value;
use std::path::PathBuf;

const SLICE: &str = "node-a-gpuslice.dev";

fn stored(api: &FakeApiServer) -> Option<Value> {
    api.lock().slices.get(SLICE).cloned()
}

fn device<'a>(slice: &'a Value, name: &str) -> &'a Value {
    slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {slice}"))
}

/// `fakegpu-client lose|restore DEV` on the cluster's fake node.
fn fake(cluster: &Cluster, what: &str, dev: &str) {
    let out = cluster
        .world
        .command(artifact("fakegpu-client"))
        .args([what, dev])
        .output()
        .unwrap();
    assert!(out.status.success(), "{what} {dev}: {out:?}");
}

/// The DRA endpoint the plugin registered.
async fn endpoint(cluster: &Cluster) -> PathBuf {
    let reg = cluster.root.join("reg/gpuslice.dev-reg.sock");
    wait_until("the registration socket", &cluster.log, || reg.exists()).await;
    let info = registration::registration_client::RegistrationClient::new(channel(reg).await)
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    PathBuf::from(info.endpoint)
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_gpu_is_tainted_and_unhealthy_until_it_is_back() {
    let cluster = Cluster::new(2, NODE).await;
    let (api, log) = (&cluster.api, &cluster.log);
    let mut plugin = cluster.spawn_plugin(&[]);
    wait_until("the first ResourceSlice", log, || stored(api).is_some()).await;
    let before = stored(api).unwrap();
    let by_index = |s: &Value, i: i64| {
        s["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["attributes"]["index"]["int"] == i)
            .unwrap()
            .clone()
    };
    let (gpu0, gpu1) = (by_index(&before, 0), by_index(&before, 1));
    let (dev0, dev1) = (
        gpu0["name"].as_str().unwrap().to_string(),
        gpu1["name"].as_str().unwrap().to_string(),
    );
    let ep = endpoint(&cluster).await;
    let mut health = health_watch(&ep).await;
    next_health(&mut health, "both GPUs healthy", |h| {
        h.len() == 2 && h.values().all(|(s, _)| *s == HealthStatus::Healthy)
    })
    .await;

    // GPU 1 falls off the bus.
    fake(&cluster, "lose", "1");
    wait_until("GPU 1 tainted", log, || {
        stored(api).is_some_and(|s| device(&s, &dev1).get("taints").is_some())
    })
    .await;
    let s = stored(api).unwrap();
    let lost = device(&s, &dev1);
    let taints = lost["taints"].as_array().unwrap();
    assert_eq!(taints.len(), 1, "{lost}");
    assert_eq!(taints[0]["key"], "gpuslice.dev/gone");
    assert_eq!(taints[0]["value"], "lost");
    assert_eq!(taints[0]["effect"], "NoSchedule", "the default effect");
    let added = taints[0]["timeAdded"].as_str().unwrap().to_string();
    assert!(added.ends_with('Z') && added.len() == 20, "{added}");
    let mut untainted = lost.clone();
    untainted.as_object_mut().unwrap().remove("taints");
    assert_eq!(
        untainted, gpu1,
        "the GPU as last published, but for the taint"
    );
    assert_eq!(device(&s, &dev0), &gpu0, "GPU 0 untouched");
    assert!(
        s["spec"]["pool"]["generation"].as_i64() > before["spec"]["pool"]["generation"].as_i64()
    );
    let h = next_health(&mut health, "GPU 1 unhealthy", |h| {
        h[&dev1].0 == HealthStatus::Unhealthy
    })
    .await;
    assert!(h[&dev1].1.contains("NVML_ERROR_GPU_IS_LOST"), "{h:?}");
    assert_eq!(h[&dev0].0, HealthStatus::Healthy);
    wait_until("the loss logged", log, || {
        cluster.log_text().contains(&format!(
            "{dev1} is gone (NVML reports it lost): kept in the ResourceSlice with taint \
             gpuslice.dev/gone=lost:NoSchedule"
        ))
    })
    .await;

    // A claim the scheduler placed on GPU 1 before it was lost (a pod starting now): its
    // prepare fails, naming the loss, and creates nothing; the kubelet retries.
    let uid = "3a3a3a3a-0000-4000-8000-00000000003a";
    let c = TestClaim::new("team-a", "a", uid);
    let claim = c.allocated(NODE, &dev1, Some(consumed("4Gi", "250")));
    api.lock().objects.insert(
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/a".into(),
        (200, serde_json::to_string(&claim).unwrap()),
    );
    let mut kubelet = Kubelet::connect(&ep).await;
    let r = kubelet.prepare(&[&c]).await;
    let e = &r.claims[uid].error;
    assert!(
        e.contains(&format!(
            "device {dev1} is gone (NVML reports it lost: fallen off the bus, XID 79; tainted \
             gpuslice.dev/gone=lost:NoSchedule in the ResourceSlice): nothing was created"
        )),
        "{e}"
    );
    assert!(gpuslice_ledger::Ledger::open(&cluster.world.runtime_dir())
        .unwrap()
        .snapshot()
        .slices
        .iter()
        .all(|s| s.name != format!("k8s-{uid}")));

    // While it stays lost the slice does not change (the taint keeps its timeAdded): a
    // second of resyncs (every 0.1 s) sends nothing new.
    let generation = s["spec"]["pool"]["generation"].clone();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let still = stored(api).unwrap();
    assert_eq!(still["spec"]["pool"]["generation"], generation);
    assert_eq!(device(&still, &dev1)["taints"][0]["timeAdded"], added);

    // Back after a reset: the taint goes, healthy again.
    fake(&cluster, "restore", "1");
    wait_until("GPU 1 untainted", log, || {
        stored(api).is_some_and(|s| device(&s, &dev1).get("taints").is_none())
    })
    .await;
    assert_eq!(device(&stored(api).unwrap(), &dev1), &gpu1);
    next_health(&mut health, "GPU 1 healthy again", |h| {
        h.values().all(|(s, _)| *s == HealthStatus::Healthy)
    })
    .await;
    assert!(cluster
        .log_text()
        .contains(&format!("{dev1} is back: taint gpuslice.dev/gone removed")));
    // The kubelet's retry now prepares the claim.
    let r = kubelet.prepare(&[&c]).await;
    assert_eq!(r.claims[uid].error, "");
    assert_eq!(kubelet.unprepare(&[&c]).await.claims[uid].error, "");

    // Every slice sent passed the 1.37 checks, taints included.
    let verdicts = api.lock().verdicts.clone();
    assert!(verdicts
        .iter()
        .any(|v| v.object.to_string().contains("gpuslice.dev/gone")));
    for v in &verdicts {
        assert!(v.refusal.is_none(), "refused: {:?}", v.refusal);
    }
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(plugin.id() as i32, libc::SIGTERM) }, 0);
    assert!(exited(&mut plugin).await.success());
}

#[tokio::test(flavor = "current_thread")]
async fn no_execute_is_the_operators_choice() {
    let cluster = Cluster::new(2, NODE).await;
    let (api, log) = (&cluster.api, &cluster.log);
    let mut plugin = cluster.spawn_plugin(&["--gone-taint-effect", "NoExecute"]);
    wait_until("the first ResourceSlice", log, || stored(api).is_some()).await;
    fake(&cluster, "lose", "0");
    wait_until("GPU 0 tainted NoExecute", log, || {
        stored(api).is_some_and(|s| {
            s["spec"]["devices"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["taints"][0]["effect"] == "NoExecute")
        })
    })
    .await;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(plugin.id() as i32, libc::SIGTERM) }, 0);
    assert!(exited(&mut plugin).await.success());
}

#[test]
fn the_strict_checks_hold_taints_to_the_1_37_rules() {
    let slice = |devices: Value| {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": SLICE},
            "spec": {"driver": "gpuslice.dev", "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices},
        })
    };
    let gpu =
        |i: usize, taints: Value| serde_json::json!({"name": format!("gpu-{i}"), "taints": taints});
    let message = |v: &Value| {
        let r = check_resource_slice(v).unwrap_err();
        assert_eq!(r.code, 422);
        r.status(SLICE)["message"].as_str().unwrap().to_string()
    };
    let taint = |key: &str, value: &str, effect: &str| {
        serde_json::json!([{"key": key, "value": value, "effect": effect,
            "timeAdded": "2026-12-07T19:00:00Z"}])
    };
    for effect in ["NoSchedule", "NoExecute", "None"] {
        let ok = slice(serde_json::json!([gpu(
            0,
            taint("gpuslice.dev/gone", "lost", effect)
        )]));
        assert_eq!(check_resource_slice(&ok), Ok(()), "{effect}");
    }
    let m = message(&slice(serde_json::json!([gpu(
        0,
        taint("gpuslice.dev/gone", "lost", "PreferNoSchedule")
    )])));
    assert!(m.contains("spec.devices[0].taints[0].effect: Unsupported value: \"PreferNoSchedule\": supported values: \"NoExecute\", \"NoSchedule\", \"None\""), "{m}");
    let m = message(&slice(serde_json::json!([gpu(
        0,
        taint("gpuslice.dev/gone", "lost", "")
    )])));
    assert!(
        m.contains("spec.devices[0].taints[0].effect: Required value"),
        "{m}"
    );
    let m = message(&slice(serde_json::json!([gpu(
        0,
        taint("a/b/gone", "-lost", "None")
    )])));
    assert!(
        m.contains("taints[0].key: Invalid value") && m.contains("taints[0].value: Invalid value"),
        "{m}"
    );
    let many: Vec<Value> = (0..17)
        .map(|i| serde_json::json!({"key": format!("gpuslice.dev/t{i}"), "effect": "None"}))
        .collect();
    let m = message(&slice(serde_json::json!([gpu(0, many.into())])));
    assert!(
        m.contains("spec.devices[0].taints: Too many: 17: must have at most 16 items"),
        "{m}"
    );
    // A slice with a tainted device holds at most 64 devices (128 without).
    let devices = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| serde_json::json!({"name": format!("gpu-{i}")}))
            .collect()
    };
    assert_eq!(check_resource_slice(&slice(devices(65).into())), Ok(()));
    let mut d = devices(65);
    d[0] = gpu(0, taint("gpuslice.dev/gone", "lost", "NoSchedule"));
    let m = message(&slice(d.into()));
    assert!(
        m.contains("spec.devices: Too many: 65: must have at most 64 items"),
        "{m}"
    );
}
