//! The API-server side of the plugin (`--claims api --publish api`) against a small fake API
//! server on 127.0.0.1: the plugin, started with a kubeconfig that points there, applies its
//! ResourceSlice (server-side apply, field manager gpuslice-dra) and reads each claim it
//! prepares from `/apis/resource.k8s.io/v1/namespaces/NS/resourceclaims/NAME`; the API's
//! refusals become per-claim errors an operator can act on.

mod common;
use common::apiserver::{exited, status, wait_until, Cluster, Seen, State};
use common::{channel, consumed, Kubelet, TestClaim};
use gpuslice_dra::proto::registration;
use k8s_openapi::api::resource::v1::ResourceSlice;
use std::process::Stdio;

#[tokio::test(flavor = "current_thread")]
async fn the_plugin_talks_to_the_api_server() {
    let cluster = Cluster::new(1, "node-k").await;
    let (world, root, kubeconfig, log) = (
        &cluster.world,
        &cluster.root,
        &cluster.kubeconfig,
        &cluster.log,
    );
    let state = cluster.api.state.clone();
    let start = |extra: &[&str]| cluster.spawn_plugin(extra);
    let mut plugin = start(&[]);

    // The slice, by server-side apply: PATCH with the apply content type, as field manager
    // gpuslice-dra, forced; a ResourceSlice of this node.
    let slice_path = "/apis/resource.k8s.io/v1/resourceslices/node-k-gpuslice.dev";
    wait_until("the ResourceSlice applied", log, || {
        state
            .lock()
            .unwrap()
            .seen
            .iter()
            .any(|s| s.method == "PATCH")
    })
    .await;
    let patch = state
        .lock()
        .unwrap()
        .seen
        .iter()
        .find(|s| s.method == "PATCH")
        .cloned()
        .unwrap();
    let (path, query) = patch.target.split_once('?').unwrap();
    assert_eq!(path, slice_path);
    assert!(
        query.contains("fieldManager=gpuslice-dra")
            && query.contains("force=true")
            && query.contains("fieldValidation=Strict"),
        "{query}"
    );
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    let applied: serde_json::Value = serde_json::from_str(&patch.body).unwrap();
    assert_eq!(applied["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(applied["kind"], "ResourceSlice");
    let slice: ResourceSlice = serde_json::from_value(applied).unwrap();
    let owner = &slice
        .metadata
        .owner_references
        .as_ref()
        .expect("owned by its Node")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-k", "uid-of-node-k")
    );
    assert_eq!(slice.spec.node_name.as_deref(), Some("node-k"));
    let gpu = slice.spec.devices.as_ref().unwrap()[0].clone();
    assert_eq!(gpu.capacity.as_ref().unwrap()["memory"].value.0, "16Gi");
    // It asked for the published generation first, so a restart keeps counting up.
    assert!(state
        .lock()
        .unwrap()
        .seen
        .iter()
        .any(|s| s.method == "GET" && s.target == slice_path));

    // A claim the API server holds, allocated on that GPU; and one it refuses to show.
    let a = TestClaim::new("team-a", "a", "2a2a2a2a-0000-4000-8000-00000000002a");
    let claim = a.allocated("node-k", &gpu.name, Some(consumed("4Gi", "250")));
    {
        let mut s = state.lock().unwrap();
        s.objects.insert(
            "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/a".into(),
            (200, serde_json::to_string(&claim).unwrap()),
        );
        s.objects.insert(
            "/apis/resource.k8s.io/v1/namespaces/team-b/resourceclaims/b".into(),
            (
                403,
                status(
                    403,
                    "Forbidden",
                    "resourceclaims.resource.k8s.io \"b\" is forbidden",
                ),
            ),
        );
    }
    wait_until("the registration socket", log, || {
        root.join("reg/gpuslice.dev-reg.sock").exists()
    })
    .await;
    let mut reg = registration::registration_client::RegistrationClient::new(
        channel(root.join("reg/gpuslice.dev-reg.sock")).await,
    );
    let info = reg
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut dra = Kubelet::connect(info.endpoint.as_ref()).await;
    let b = TestClaim::new("team-b", "b", "2b2b2b2b-0000-4000-8000-00000000002b");
    let gone = TestClaim::new("team-c", "gone", "2c2c2c2c-0000-4000-8000-00000000002c");
    let r = dra.prepare(&[&a, &b, &gone]).await;
    let a = &r.claims["2a2a2a2a-0000-4000-8000-00000000002a"];
    assert_eq!(a.error, "");
    assert_eq!(
        a.devices[0].cdi_device_ids[0],
        "gpuslice.dev/slice=k8s-2a2a2a2a-0000-4000-8000-00000000002a"
    );
    let b = &r.claims["2b2b2b2b-0000-4000-8000-00000000002b"].error;
    assert!(
        b.contains("forbidden") && b.contains("deploy/helm/gpuslice/templates/rbac.yaml"),
        "{b}"
    );
    let gone = &r.claims["2c2c2c2c-0000-4000-8000-00000000002c"].error;
    assert!(gone.contains("team-c/gone not found"), "{gone}");
    let ledger = gpuslice_ledger::Ledger::open(&world.runtime_dir()).unwrap();
    let snap = ledger.snapshot();
    let s = snap
        .slices
        .iter()
        .find(|s| s.name == "k8s-2a2a2a2a-0000-4000-8000-00000000002a")
        .unwrap();
    assert_eq!(
        (s.memory_limit, s.compute_share.ppm(), s.claim.as_deref()),
        (Some(4 << 30), 250_000, Some("team-a/a"))
    );
    assert_eq!(snap.slices.len(), 1, "nothing made for the refused claims");

    // SIGTERM (the DaemonSet deleted, or a rollout): a clean exit that takes the sockets away,
    // so the kubelet stops calling, deletes the node's ResourceSlice (no devices of a driver
    // that is gone stay on the scheduler's list), and leaves prepared claims prepared for the
    // next plugin.
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(plugin.id() as i32, libc::SIGTERM) }, 0);
    let st = exited(&mut plugin).await;
    assert!(
        st.success(),
        "{st:?}\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    assert!(!root.join("reg/gpuslice.dev-reg.sock").exists());
    assert!(!root.join("plugin/dra.sock").exists());
    let deletes: Vec<Seen> = state
        .lock()
        .unwrap()
        .seen
        .iter()
        .filter(|s| s.method == "DELETE")
        .cloned()
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].target.split('?').next(), Some(slice_path));
    // Found by the node's and the driver's field selectors, as the kubelet finds them.
    assert!(state.lock().unwrap().seen.iter().any(|s| s.method == "GET"
        && s.target
            .starts_with("/apis/resource.k8s.io/v1/resourceslices?")
        && s.target.contains("spec.nodeName%3Dnode-k")
        && s.target.contains("spec.driver%3Dgpuslice.dev")));
    assert!(
        state.lock().unwrap().slices.is_empty(),
        "the fake holds no slice any more"
    );
    assert!(std::fs::read_to_string(log)
        .unwrap()
        .contains("deleted ResourceSlice node-k-gpuslice.dev"));
    assert!(ledger
        .snapshot()
        .slices
        .iter()
        .any(|s| s.claim.as_deref() == Some("team-a/a")));

    // With --keep-slice-on-exit the slice stays (the kubelet's own clean-up, 30 s after the
    // plugin unregistered, is left to remove it).
    let patches = |st: &State| st.count("PATCH");
    let before = patches(&state.lock().unwrap());
    let mut plugin = start(&["--keep-slice-on-exit"]);
    wait_until("the ResourceSlice applied again", log, || {
        patches(&state.lock().unwrap()) > before
    })
    .await;
    // SAFETY: as above, our unreaped child.
    assert_eq!(unsafe { libc::kill(plugin.id() as i32, libc::SIGTERM) }, 0);
    assert!(exited(&mut plugin).await.success());
    {
        let s = state.lock().unwrap();
        assert_eq!(s.count("DELETE"), 1);
        assert!(s.slices.contains_key("node-k-gpuslice.dev"));
        // Every slice the plugin sent passed the strict checks (schema and validation).
        assert!(!s.verdicts.is_empty());
        for v in &s.verdicts {
            assert_eq!(v.refusal, None, "{}", v.object);
        }
    }

    // Uninstall: the chart's pre-delete Job runs `gpuslice-dra cleanup --all-nodes`; every
    // ResourceSlice of the driver goes, on every node, and another driver's stays.
    {
        let mut s = state.lock().unwrap();
        let mut other_node = s.slices["node-k-gpuslice.dev"].clone();
        other_node["metadata"]["name"] = "node-j-gpuslice.dev".into();
        other_node["spec"]["nodeName"] = "node-j".into();
        other_node["spec"]["pool"]["name"] = "node-j".into();
        s.slices
            .insert("node-j-gpuslice.dev".into(), other_node.clone());
        let mut other_driver = other_node;
        other_driver["metadata"]["name"] = "node-j-gpu.example.com".into();
        other_driver["spec"]["driver"] = "gpu.example.com".into();
        s.slices
            .insert("node-j-gpu.example.com".into(), other_driver);
    }
    let out = world
        .command(env!("CARGO_BIN_EXE_gpuslice-dra"))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("NODE_NAME")
        .args(["cleanup", "--all-nodes"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tokio::task::spawn_blocking(move || out.wait_with_output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("removed 2 ResourceSlice(s) of driver gpuslice.dev on every node"),
        "{err}"
    );
    let left: Vec<String> = state.lock().unwrap().slices.keys().cloned().collect();
    assert_eq!(left, ["node-j-gpu.example.com"]);
    // Without a node and without --all-nodes, cleanup refuses to guess.
    let out = world
        .command(env!("CARGO_BIN_EXE_gpuslice-dra"))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("NODE_NAME")
        .arg("cleanup")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all-nodes"));
}
