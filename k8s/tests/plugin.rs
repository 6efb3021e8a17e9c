//! The plugin through its real sockets, with a test client built from the same `.proto` files
//! doing the kubelet's part, on the fake GPU: registration, the published ResourceSlice,
//! prepare/unprepare of claims (two on one GPU, one on another), wrapped processes held to what
//! their claim consumed, idempotence, a restart in between, and a stale allocation refused.
//!
//! Claims come from a directory (`--claims dir:`) and the slice goes to a file (`--publish
//! file:`): the same code paths as in a cluster except the API client itself.

use gpuslice_dra::proto::health_v1alpha1::HealthStatus;
use gpuslice_e2e::World;
use gpuslice_ledger::{human_bytes, Cap, Ledger, OperatorSlice, Share, PPM};
use std::process::{Child, Stdio};
use std::time::Duration;

const GI: u64 = 1 << 30;

mod common;
use common::*;

#[tokio::test(flavor = "current_thread")]
async fn kubelet_protocol_end_to_end_on_the_fake_gpu() {
    let world = World::new(2, "16Gi");
    let dirs = Dirs::new(&world);
    let (mut plugin, endpoint) = start_registered(&world, &dirs).await;

    // The published slice: two shareable GPUs, named from their UUIDs, whole.
    let s0 = published_slice(&dirs);
    assert_eq!(s0.spec.driver, DRIVER);
    assert_eq!(s0.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(s0.spec.pool.name, NODE);
    let devs = s0.spec.devices.as_ref().unwrap();
    assert_eq!(devs.len(), 2);
    let (uuid0, uuid1) = (uuid_attr(&s0, 0), uuid_attr(&s0, 1));
    let (dev0, dev1) = (devs[0].name.clone(), devs[1].name.clone());
    assert_eq!(
        dev0,
        format!("gpu-{}", uuid0.trim_start_matches("GPU-").to_lowercase())
    );
    for d in devs {
        assert_eq!(d.allow_multiple_allocations, Some(true));
        let mem = &d.capacity.as_ref().unwrap()["memory"];
        let policy = mem.request_policy.as_ref().unwrap();
        assert_eq!(
            policy
                .valid_range
                .as_ref()
                .unwrap()
                .step
                .as_ref()
                .unwrap()
                .0,
            "256Mi"
        );
        assert_eq!(policy.default.as_ref().unwrap().0, "1Gi");
    }
    assert_eq!(capacities(&s0)[&dev0], ("16Gi".into(), "1000".into()));

    // Device health, as a kubelet with ResourceHealthStatus watches it: both GPUs healthy.
    let mut health = health_watch(&endpoint).await;
    let h = next_health(&mut health, "both GPUs", |h| h.len() == 2).await;
    for d in [&dev0, &dev1] {
        assert_eq!(h[d].0, HealthStatus::Healthy, "{h:?}");
    }
    // The same service as v1.
    let v1h =
        gpuslice_dra::proto::health_v1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(endpoint.clone()).await,
        )
        .node_watch_resources(gpuslice_dra::proto::health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v1h.devices.len(), 2);
    assert!(v1h
        .devices
        .iter()
        .all(|d| d.health == gpuslice_dra::proto::health_v1::HealthStatus::Healthy as i32));
    drop(health);

    // An operator slice made outside Kubernetes: the slice is republished without it.
    let ledger = Ledger::open(&world.runtime_dir()).expect("the plugin created the ledger");
    ledger
        .create_operator_slice(&OperatorSlice {
            name: "ops".into(),
            device: uuid0.clone(),
            memory: 2 * GI,
            compute_share: Share::from_ppm(PPM / 10),
            compute_cap: Cap::NONE,
            claim: None,
        })
        .unwrap();
    wait_for(&dirs, "the slice republished with the reservation", || {
        read_slice(&dirs).is_some_and(|s| capacities(&s)[&dev0] == ("14Gi".into(), "900".into()))
    });
    let s1 = read_slice(&dirs).unwrap();
    assert!(s1.spec.pool.generation > s0.spec.pool.generation);
    assert_eq!(capacities(&s1)[&dev1], ("16Gi".into(), "1000".into()));

    // Claims: two on GPU 0 (4Gi, 250 each, as deploy/example.yaml asks), one on GPU 1, and a
    // stale one that no longer fits GPU 1.
    let a = TestClaim::new("team-a", "a", "0a0a0a0a-0000-4000-8000-00000000000a");
    let b = TestClaim::new("team-a", "b", "0b0b0b0b-0000-4000-8000-00000000000b");
    let c = TestClaim::new("team-c", "c", "0c0c0c0c-0000-4000-8000-00000000000c");
    let d = TestClaim::new("team-d", "d", "0d0d0d0d-0000-4000-8000-00000000000d");
    a.write(&dirs, &dev0, "4Gi", "250");
    b.write(&dirs, &dev0, "4294967296", "250");
    c.write(&dirs, &dev1, "6Gi", "0");
    d.write(&dirs, &dev1, "12Gi", "0");
    // ... and one whose compute no longer fits GPU 0 (100 + 250 + 250 taken: 400 left).
    let e = TestClaim::new("team-e", "e", "0f0f0f0f-0000-4000-8000-00000000000f");
    e.write(&dirs, &dev0, "1Gi", "950");

    let mut dra = Kubelet::connect(&endpoint).await;
    let all = [&a, &b, &c, &d, &e];
    let r1 = dra.prepare(&all).await;
    assert_eq!(r1.claims.len(), 5);
    let ids_a = prepared_ids(&r1, a.uid);
    let ids_b = prepared_ids(&r1, b.uid);
    let ids_c = prepared_ids(&r1, c.uid);
    assert_eq!(
        ids_a,
        vec![
            format!("gpuslice.dev/slice=k8s-{}", a.uid),
            format!("nvidia.com/gpu={uuid0}")
        ]
    );
    assert_eq!(ids_c[1], format!("nvidia.com/gpu={uuid1}"));
    let dev_a = &r1.claims[a.uid].devices[0];
    assert_eq!(
        (dev_a.pool_name.as_str(), dev_a.device_name.as_str()),
        (NODE, dev0.as_str())
    );
    assert_eq!(dev_a.request_names, vec!["gpu".to_string()]);

    // The stale allocation: refused for that claim alone, saying requested and available, and
    // nothing made for it.
    let err_d = &r1.claims[d.uid].error;
    assert!(r1.claims[d.uid].devices.is_empty());
    assert!(err_d.contains("team-d/d"), "{err_d}");
    assert!(
        err_d.contains(&format!("memory {} requested", human_bytes(12 * GI))),
        "{err_d}"
    );
    assert!(
        err_d.contains(&format!("{} available", human_bytes(10 * GI))),
        "{err_d}"
    );
    assert!(err_d.contains("stale"), "{err_d}");
    let name_of = |t: &TestClaim| format!("k8s-{}", t.uid);
    let spec_file = |t: &TestClaim| {
        dirs.cdi()
            .join(format!("gpuslice.dev-slice_k8s-{}.json", t.uid))
    };
    assert!(!spec_file(&d).exists());
    let err_e = &r1.claims[e.uid].error;
    assert!(
        err_e.contains("compute 950 requested") && err_e.contains("400 available"),
        "{err_e}"
    );
    assert!(!spec_file(&e).exists());

    // The ledger: one operator slice per claim, on the allocated GPU, with the consumed
    // memory and compute, labelled with the claim.
    let snap = ledger.snapshot();
    let find = |t: &TestClaim| {
        snap.slices
            .iter()
            .find(|s| s.name == name_of(t))
            .unwrap_or_else(|| panic!("no slice for claim {}: {:?}", t.name, snap.slices))
            .clone()
    };
    let (sa, sb, sc) = (find(&a), find(&b), find(&c));
    assert!(snap
        .slices
        .iter()
        .all(|s| s.name != name_of(&d) && s.name != name_of(&e)));
    assert_eq!(
        (
            sa.device_uuid.as_str(),
            sa.memory_limit,
            sa.compute_share.ppm()
        ),
        (uuid0.as_str(), Some(4 * GI), 250_000)
    );
    assert_eq!(
        (
            sb.device_uuid.as_str(),
            sb.memory_limit,
            sb.compute_share.ppm()
        ),
        (uuid0.as_str(), Some(4 * GI), 250_000)
    );
    assert_eq!(
        (
            sc.device_uuid.as_str(),
            sc.memory_limit,
            sc.compute_share.ppm()
        ),
        (uuid1.as_str(), Some(6 * GI), 0)
    );
    assert!(sa.operator_defined);
    assert_eq!(sa.claim.as_deref(), Some("team-a/a"));
    assert_eq!(sc.claim.as_deref(), Some("team-c/c"));
    // Claims' own slices are the scheduler's to count: the published capacity is unchanged.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        capacities(&read_slice(&dirs).unwrap())[&dev0],
        ("14Gi".into(), "900".into())
    );

    // A repeated prepare (the kubelet retries; a second pod shares the claim) changes nothing.
    let spec_a = std::fs::read(spec_file(&a)).unwrap();
    let mtime_a = std::fs::metadata(spec_file(&a))
        .unwrap()
        .modified()
        .unwrap();
    let r2 = dra.prepare(&all).await;
    assert_eq!(r2.claims[a.uid], r1.claims[a.uid]);
    assert_eq!(r2.claims[b.uid], r1.claims[b.uid]);
    assert_eq!(r2.claims[c.uid], r1.claims[c.uid]);
    let snap2 = ledger.snapshot();
    let key = |s: &gpuslice_ledger::SliceInfo| {
        (
            s.index,
            s.name.clone(),
            s.device,
            s.memory_limit,
            s.compute_share,
        )
    };
    assert_eq!(
        snap2.slices.iter().map(key).collect::<Vec<_>>(),
        snap.slices.iter().map(key).collect::<Vec<_>>()
    );
    assert_eq!(std::fs::read(spec_file(&a)).unwrap(), spec_a);
    assert_eq!(
        std::fs::metadata(spec_file(&a))
            .unwrap()
            .modified()
            .unwrap(),
        mtime_a
    );

    // Real wrapped processes, set up from the returned CDI ids as a runtime would, are held to
    // their claim's memory: A sees a 4 GiB GPU and gets no byte past it.
    assert_held_to_4_gib(&mut burn_in_claim(&world, &dirs, &ids_a), 0);
    let v = gpuslice_e2e::run_json(
        burn_in_claim(&world, &dirs, &ids_c).args(["--alloc", "6Gi,1Mi", "--json"]),
    );
    assert_eq!(v["mem_total"], 6 * GI, "{v}");
    assert_eq!(v["allocated_bytes"], 6 * GI, "{v}");
    assert_eq!(v["alloc_errors"], serde_json::json!([2]), "{v}");

    // B's pod is running (a process holds 3 GiB) when the plugin is killed and restarted.
    let (mut holder, _) = gpuslice_e2e::spawn_holding(
        burn_in_claim(&world, &dirs, &ids_b)
            .args(["--alloc", "3Gi", "--hold", "60", "--json"])
            .stderr(Stdio::null()),
    );
    // A second process of the same claim shares its one quota: 1 GiB left, not 4.
    let v = gpuslice_e2e::run_json(burn_in_claim(&world, &dirs, &ids_b).args([
        "--alloc",
        "1Gi,256Mi",
        "--json",
    ]));
    assert_eq!(v["allocated_bytes"], GI, "{v}");

    plugin.kill().unwrap();
    plugin.wait().unwrap();
    let (mut plugin, endpoint) = start_registered(&world, &dirs).await;
    let mut dra = Kubelet::connect(&endpoint).await;

    // Prepared before the restart: the same answer, from the ledger and the CDI directory.
    let r3 = dra.prepare(&[&a]).await;
    assert_eq!(r3.claims[a.uid], r1.claims[a.uid]);
    // The same through v1beta1 (a kubelet that still asks for it).
    let r4 = dra.prepare_v1beta1(&[&a]).await;
    let d4 = &r4.claims[a.uid];
    assert_eq!(d4.error, "");
    assert_eq!(d4.devices[0].cdi_device_ids, ids_a);
    assert_eq!(d4.devices[0].device_name, dev0);

    // B still has a live process: its unprepare fails for B alone, and nothing of B goes.
    let un = dra.unprepare(&[&a, &b]).await;
    assert_eq!(un.claims[a.uid].error, "");
    let err_b = &un.claims[b.uid].error;
    assert!(
        err_b.contains("live process") && err_b.contains(&holder.id().to_string()),
        "{err_b}"
    );
    assert!(spec_file(&b).exists());
    assert!(!spec_file(&a).exists());
    let snap = ledger.snapshot();
    assert!(snap.slices.iter().any(|s| s.name == name_of(&b)));
    assert!(snap.slices.iter().all(|s| s.name != name_of(&a)));

    // The pod ends: now B goes too. C is unprepared through v1beta1; a repeat is a no-op.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let un = dra.unprepare(&[&b]).await;
    assert_eq!(un.claims[b.uid].error, "");
    for _ in 0..2 {
        let un = dra.unprepare_v1beta1(&[&c]).await;
        assert_eq!(un.claims[c.uid].error, "");
    }
    let snap = ledger.snapshot();
    let names: Vec<&str> = snap.slices.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, vec!["ops"], "only the operator's own slice is left");
    assert_eq!(std::fs::read_dir(dirs.cdi()).unwrap().count(), 0);
    let dev = snap.devices.iter().find(|d| d.uuid == uuid0).unwrap();
    assert_eq!(dev.memory_reserved, 2 * GI);

    // A cluster without DRAConsumableCapacity allocates a device whole (no consumedCapacity):
    // the claim gets all the GPU offers. GPU 0 offers 14 GiB and 900 next to the operator's
    // slice.
    let w = TestClaim::new("team-w", "whole", "0e0e0e0e-0000-4000-8000-00000000000e");
    w.write_consumed(&dirs, &dev0, None);
    let r = dra.prepare(&[&w]).await;
    prepared_ids(&r, w.uid);
    let snap = ledger.snapshot();
    let sw = snap.slices.iter().find(|s| s.name == name_of(&w)).unwrap();
    assert_eq!(
        (sw.memory_limit, sw.compute_share.ppm()),
        (Some(14 * GI), 900_000)
    );
    let un = dra.unprepare(&[&w]).await;
    assert_eq!(un.claims[w.uid].error, "");

    // The restarted plugin published again with a higher pool generation.
    wait_for(&dirs, "a republished slice", || {
        read_slice(&dirs).is_some_and(|s| s.spec.pool.generation > s1.spec.pool.generation)
    });

    plugin.kill().unwrap();
    plugin.wait().unwrap();
}

/// GPU fraction a `--report-interval` run got over the intervals ending in `[from, to]` s.
fn fraction_between(intervals: &[serde_json::Value], from: f64, to: f64) -> f64 {
    let (mut gpu, mut first, mut last, mut prev) = (0.0, None, 0.0, 0.0);
    for v in intervals {
        let t = v["t"].as_f64().unwrap();
        if t > from && t <= to {
            gpu += v["gpu_seconds"].as_f64().unwrap();
            first.get_or_insert(prev);
            last = t;
        }
        prev = t;
    }
    let span = last - first.unwrap_or(last);
    assert!(
        span > 0.0,
        "no interval between {from} and {to} s: {intervals:?}"
    );
    gpu / span
}

#[tokio::test(flavor = "current_thread")]
async fn claims_on_one_gpu_are_held_to_their_compute() {
    let world = World::new(1, "8Gi");
    let dirs = Dirs::new(&world);
    let (mut plugin, endpoint) = start_registered(&world, &dirs).await;
    let dev0 = published_slice(&dirs).spec.devices.unwrap()[0].name.clone();
    let q = TestClaim::new("ml", "quarter", "1a1a1a1a-0000-4000-8000-00000000001a");
    let t = TestClaim::new(
        "ml",
        "three-quarters",
        "1b1b1b1b-0000-4000-8000-00000000001b",
    );
    q.write(&dirs, &dev0, "1Gi", "250");
    t.write(&dirs, &dev0, "1Gi", "750");
    let mut dra = Kubelet::connect(&endpoint).await;
    let r = dra.prepare(&[&q, &t]).await;
    let ids = [prepared_ids(&r, q.uid), prepared_ids(&r, t.uid)];
    // Both saturate the GPU at once; each gets its claim's part of the time (± 8 points, as
    // the compute tests of tests/e2e allow on a loaded machine).
    let secs = 5.0;
    let children: Vec<Child> = ids
        .iter()
        .map(|ids| {
            burn_in_claim(&world, &dirs, ids)
                .args([
                    "--seconds",
                    &secs.to_string(),
                    "--kernel-us",
                    "1000",
                    "--depth",
                    "4",
                ])
                .args(["--json", "--report-interval", "0.5"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let got: Vec<(f64, String)> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let intervals: Vec<serde_json::Value> = stdout
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["event"] == "interval")
                .collect();
            (fraction_between(&intervals, 1.0, secs - 0.5), stdout)
        })
        .collect();
    let total: f64 = got.iter().map(|g| g.0).sum();
    for ((f, out), want) in got.iter().zip([0.25, 0.75]) {
        assert!(
            (f / total - want).abs() <= 0.08,
            "claim with compute {want}: got {:.3} of the GPU time the two got ({total:.3})\n{out}",
            f / total
        );
    }
    let un = dra.unprepare(&[&q, &t]).await;
    assert!(un.claims.values().all(|c| c.error.is_empty()), "{un:?}");
    plugin.kill().unwrap();
    plugin.wait().unwrap();
}
