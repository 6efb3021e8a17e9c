//! The ResourceSlice at every reservation level, against the strict fake API server: operator
//! slices made outside Kubernetes reserve all of GPU 0's compute, then 15.75 of its 16 GiB,
//! then all of it. Every slice the plugin sends passes the API server's schema and validation
//! rules (`common/strict.rs`); GPU 1 stays allocatable with its full capacities; and a claim
//! for 4Gi/250 is placed on GPU 1 by the test allocator that follows kube-scheduler's
//! consumable-capacity rules (`common/allocator.rs`), then prepared there by the plugin. A
//! slice the API server refuses is reported once and sent again when the reservations change.

mod common;
use common::allocator::{allocate, Allocation};
use common::apiserver::{exited, wait_until, Cluster, FakeApiServer};
use common::strict::quantity_milli;
use common::{channel, Kubelet, TestClaim};
use gpuslice_dra::proto::registration;
use gpuslice_ledger::{Cap, Ledger, OperatorSlice, Share, PPM};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

const NODE: &str = "node-r";
const SLICE: &str = "node-r-gpuslice.dev";
const GI: u64 = 1 << 30;

/// The slice the fake API server holds now.
fn stored(api: &FakeApiServer) -> Option<Value> {
    api.lock().slices.get(SLICE).cloned()
}

fn device<'a>(slice: &'a Value, name: &str) -> Option<&'a Value> {
    slice["spec"]["devices"]
        .as_array()?
        .iter()
        .find(|d| d["name"] == name)
}

/// (memory, compute) capacity values of a device.
fn values(d: &Value) -> (String, String) {
    let c = &d["capacity"];
    (
        c["memory"]["value"].as_str().unwrap().into(),
        c["compute"]["value"].as_str().unwrap().into(),
    )
}

/// What the issue asks of every request policy beyond the API server's own checks: min <=
/// default <= value, min + step <= value, the default on the step grid.
fn assert_policies_sane(slice: &Value) {
    for d in slice["spec"]["devices"].as_array().unwrap() {
        for (name, c) in d["capacity"].as_object().unwrap() {
            let m = |v: &Value| quantity_milli(v.as_str().unwrap()).unwrap();
            let Some(p) = c.get("requestPolicy") else {
                continue;
            };
            let (value, default) = (m(&c["value"]), m(&p["default"]));
            let r = &p["validRange"];
            let (min, step) = (m(&r["min"]), m(&r["step"]));
            let what = format!("{} {name}: {c}", d["name"]);
            assert!(min <= default && default <= value, "{what}");
            assert!(min + step <= value, "{what}");
            assert_eq!((default - min) % step, 0, "{what}");
        }
    }
}

/// Every slice sent so far passed the strict checks.
fn assert_all_accepted(api: &FakeApiServer) {
    let s = api.lock();
    assert!(!s.verdicts.is_empty());
    for v in &s.verdicts {
        assert!(
            v.refusal.is_none(),
            "the API server would refuse {}: {:?}",
            v.object,
            v.refusal
        );
    }
}

/// Put `claim` in the fake API server, allocated as `a` says on this node.
fn hold_claim(api: &FakeApiServer, claim: &TestClaim, a: &Allocation) {
    let consumed: BTreeMap<String, Quantity> = a
        .quantities()
        .into_iter()
        .map(|(k, v)| (k, Quantity(v)))
        .collect();
    let rc = claim.allocated(NODE, &a.device, Some(consumed));
    api.lock().objects.insert(
        format!(
            "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
            claim.namespace, claim.name
        ),
        (200, serde_json::to_string(&rc).unwrap()),
    );
}

/// The operator's slice outside Kubernetes on `gpu`: replaced by one of `memory` and `ppm`.
fn reserve(ledger: &Ledger, gpu: &str, memory: u64, ppm: u32) {
    let _ = ledger.remove_slice("ops");
    ledger
        .create_operator_slice(&OperatorSlice {
            name: "ops".into(),
            device: gpu.into(),
            memory,
            compute_share: Share::from_ppm(ppm),
            compute_cap: Cap::NONE,
            claim: None,
        })
        .unwrap();
}

async fn kubelet(root: &Path, log: &Path) -> Kubelet {
    let reg = root.join("reg/gpuslice.dev-reg.sock");
    wait_until("the registration socket", log, || reg.exists()).await;
    let info = registration::registration_client::RegistrationClient::new(channel(reg).await)
        .get_info(registration::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    Kubelet::connect(info.endpoint.as_ref()).await
}

#[tokio::test(flavor = "current_thread")]
async fn every_reservation_level_publishes_a_slice_the_api_server_accepts() {
    let cluster = Cluster::new(2, NODE).await;
    let (world, api, root, log) = (&cluster.world, &cluster.api, &cluster.root, &cluster.log);
    let mut plugin = cluster.spawn_plugin(&[]);
    wait_until("the first ResourceSlice", log, || stored(api).is_some()).await;
    let s0 = stored(api).unwrap();
    let names: Vec<String> = s0["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2);
    let (dev0, dev1) = (names[0].clone(), names[1].clone());
    let uuid0 = device(&s0, &dev0).unwrap()["attributes"]["uuid"]["string"]
        .as_str()
        .unwrap()
        .to_string();
    let full = ("16Gi".to_string(), "1000".to_string());
    assert_eq!(values(device(&s0, &dev0).unwrap()), full);
    let gpu1_full = device(&s0, &dev1).unwrap().clone();
    assert_policies_sane(&s0);
    assert_all_accepted(api);
    let mut dra = kubelet(root, log).await;
    let ledger = Ledger::open(&world.runtime_dir()).unwrap();

    // The three levels, and what GPU 0 must look like at each.
    let levels: [(&str, u64, u32); 3] = [
        ("100% of GPU 0's compute", GI, PPM),
        ("15.75 of GPU 0's 16 GiB", 15 * GI + 3 * GI / 4, 0),
        ("all of GPU 0", 16 * GI, PPM),
    ];
    let claims = [
        TestClaim::new("team-r", "r1", "1e1e1e1e-0000-4000-8000-000000000001"),
        TestClaim::new("team-r", "r2", "1e1e1e1e-0000-4000-8000-000000000002"),
        TestClaim::new("team-r", "r3", "1e1e1e1e-0000-4000-8000-000000000003"),
    ];
    let mut placed: Vec<Allocation> = vec![];
    let mut generation = s0["spec"]["pool"]["generation"].as_i64().unwrap();
    for (i, (level, memory, ppm)) in levels.into_iter().enumerate() {
        reserve(&ledger, &uuid0, memory, ppm);
        // GPU 0 as published: compute 0 (no request policy) while memory is left; left out
        // once less than two memory steps (2 x 256Mi) are.
        let expect = |s: &Value| match device(s, &dev0) {
            Some(d) if i == 0 => {
                values(d) == ("15Gi".into(), "0".into())
                    && d["capacity"]["compute"].get("requestPolicy").is_none()
            }
            Some(_) => false,
            None => i > 0,
        };
        // (A refusal ends the wait: assert_all_accepted below shows it.)
        let refused = || api.lock().verdicts.iter().any(|v| v.refusal.is_some());
        wait_until(level, log, || {
            refused() || stored(api).is_some_and(|s| expect(&s))
        })
        .await;
        assert_all_accepted(api);
        if i > 0 {
            // Left out, and said so with what is left.
            let left = ["256Mi", "0"][i - 1];
            let said = format!("{dev0} is left out of ResourceSlice {SLICE}: {left} of its memory");
            wait_until(level, log, || {
                std::fs::read_to_string(log).is_ok_and(|t| t.contains(&said))
            })
            .await;
        }
        let s = stored(api).unwrap();
        let g = s["spec"]["pool"]["generation"].as_i64().unwrap();
        if i < 2 {
            assert!(g > generation, "{level}: a new pool generation");
        } else {
            // GPU 0 was left out already: the same devices, the same slice.
            assert_eq!(g, generation, "{level}: nothing to publish anew");
        }
        generation = g;
        // Every slice sent passed the API server's checks, and the issue's policy rules hold.
        assert_all_accepted(api);
        assert_policies_sane(&s);
        // GPU 1 is untouched: its full capacities and policies.
        assert_eq!(device(&s, &dev1), Some(&gpu1_full), "{level}");

        // A claim for 4Gi/250: the scheduler's rules put it on GPU 1, and the plugin prepares
        // it there.
        let a = allocate(&s, &placed, &[("memory", "4Gi"), ("compute", "250")])
            .unwrap_or_else(|e| panic!("{level}: not placed: {e}"));
        assert_eq!(a.device, dev1, "{level}");
        assert_eq!(a.quantities()["memory"], (4 * GI).to_string());
        assert_eq!(a.quantities()["compute"], "250");
        hold_claim(api, &claims[i], &a);
        let r = dra.prepare(&[&claims[i]]).await;
        assert_eq!(r.claims[claims[i].uid].error, "", "{level}");
        assert_eq!(r.claims[claims[i].uid].devices[0].device_name, dev1);
        let snap = ledger.snapshot();
        let made = snap
            .slices
            .iter()
            .find(|x| x.name == format!("k8s-{}", claims[i].uid))
            .unwrap();
        assert_eq!(
            (made.memory_limit, made.compute_share.ppm()),
            (Some(4 * GI), 250_000),
            "{level}"
        );
        placed.push(a);

        if i == 0 {
            // With its compute all reserved, GPU 0 still takes a best-effort claim (no
            // compute named: it consumes the value, 0); asking for any compute does not fit.
            let be = allocate(&s, &placed, &[("memory", "4Gi")]).unwrap();
            assert_eq!(be.device, dev0);
            assert_eq!(be.quantities()["compute"], "0");
            let some = allocate(&s, &placed, &[("memory", "1Gi"), ("compute", "1")]).unwrap();
            assert_eq!(some.device, dev1);
            // `gpuslice-dra slice` prints the same devices, a slice the API server accepts
            // (what docs/kubernetes.md pipes into `kubectl apply --dry-run=server`).
            let out = world
                .command(env!("CARGO_BIN_EXE_gpuslice-dra"))
                .args(["slice", "--node-name", NODE, "--runtime-dir"])
                .arg(world.runtime_dir())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
            common::strict::check_resource_slice(&printed).unwrap();
            assert_eq!(printed["spec"]["devices"], s["spec"]["devices"]);
            // A request that names a capacity no device has fits nowhere (exact names).
            let e = allocate(&s, &placed, &[("gpuslice.dev/memory", "1Gi")]).unwrap_err();
            assert!(e.contains("no capacity named"), "{e}");
        }
    }
    // GPU 1 has taken three claims; its published capacities never changed (claims are the
    // scheduler's to count), and what is left there is what the allocator sees.
    let s = stored(api).unwrap();
    let fourth = allocate(&s, &placed, &[("memory", "5Gi")]).unwrap_err();
    assert!(fourth.contains("memory"), "{fourth}");

    // The operator's slice gone: GPU 0 is back, whole.
    ledger.remove_slice("ops").unwrap();
    wait_until("GPU 0 back", log, || {
        stored(api).is_some_and(|s| device(&s, &dev0).is_some_and(|d| values(d) == full))
    })
    .await;
    assert_all_accepted(api);
    wait_until("GPU 0 back, logged", log, || {
        std::fs::read_to_string(log).is_ok_and(|t| t.contains(&format!("{dev0} has room again")))
    })
    .await;

    // Uninstall (SIGTERM as the DaemonSet is deleted): no ResourceSlice of the node is left.
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(plugin.id() as i32, libc::SIGTERM) }, 0);
    assert!(exited(&mut plugin).await.success());
    assert!(api
        .lock()
        .slices
        .values()
        .all(|s| s["spec"]["nodeName"] != NODE));
}

/// A cluster policy that refuses any device offering more than 900 compute (as a
/// ValidatingAdmissionPolicy of the cluster could), naming the device.
fn at_most_900_compute(slice: &Value) -> Option<String> {
    slice["spec"]["devices"].as_array()?.iter().find_map(|d| {
        let v = d["capacity"]["compute"]["value"].as_str()?;
        (quantity_milli(v)? > 900_000).then(|| {
            format!(
                "device {} offers compute {v}: this cluster allows at most 900 per device",
                d["name"].as_str().unwrap_or("")
            )
        })
    })
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_slice_is_reported_once_and_sent_again_when_reservations_change() {
    let cluster = Cluster::new(1, NODE).await;
    let (world, api, log) = (&cluster.world, &cluster.api, &cluster.log);
    api.lock().admission = Some(at_most_900_compute);
    let mut plugin = cluster.spawn_plugin(&[]);
    let refused = "the API server refused ResourceSlice";
    wait_until("the refusal logged", log, || {
        std::fs::read_to_string(log).is_ok_and(|t| t.contains(refused))
    })
    .await;
    let text = std::fs::read_to_string(log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(refused))
        .unwrap()
        .to_string();
    let dev = {
        let s = api.lock();
        s.verdicts[0].object["spec"]["devices"][0]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The server's message and the device, once.
    assert!(line.contains("HTTP 422"), "{line}");
    assert!(line.contains(&format!("for device(s) {dev}:")), "{line}");
    assert!(
        line.contains("denied request: device")
            && line.contains("this cluster allows at most 900 per device"),
        "{line}"
    );
    assert!(stored(api).is_none());
    // Many resyncs (0.1 s each) with nothing changed: not sent again, not logged again. The
    // plugin keeps resyncing all along (the change below is seen by it).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    {
        let s = api.lock();
        assert_eq!(s.count("PATCH"), 1, "sent once");
    }
    let text = std::fs::read_to_string(log).unwrap();
    assert_eq!(text.matches(refused).count(), 1, "{text}");

    // The reservation changes (an operator takes 10% of the compute): the slice is sent again,
    // and this one is accepted.
    let ledger = Ledger::open(&world.runtime_dir()).unwrap();
    let uuid = ledger.snapshot().devices[0].uuid.clone();
    reserve(&ledger, &uuid, GI, PPM / 10);
    wait_until("the slice accepted", log, || stored(api).is_some()).await;
    let s = stored(api).unwrap();
    assert_eq!(
        values(device(&s, &dev).unwrap()),
        ("15Gi".into(), "900".into())
    );
    // (The plugin logs once it has the answer.)
    let published = format!("published ResourceSlice {SLICE}");
    wait_until("the publication logged", log, || {
        std::fs::read_to_string(log).is_ok_and(|t| t.contains(&published))
    })
    .await;
    assert_eq!(api.lock().count("PATCH"), 2);

    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(plugin.id() as i32, libc::SIGTERM) }, 0);
    assert!(exited(&mut plugin).await.success());
    assert!(stored(api).is_none());
}

/// The strict checks refuse what the issue found the plugin sending before, in the API
/// server's words, and an unknown field.
#[test]
fn the_strict_checks_refuse_the_slices_the_issue_found() {
    use common::strict::check_resource_slice;
    let slice = |capacity: Value| {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": SLICE},
            "spec": {"driver": "gpuslice.dev", "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                    "capacity": capacity}]},
        })
    };
    let message = |v: &Value| {
        let r = check_resource_slice(v).unwrap_err();
        (
            r.code,
            r.status(SLICE)["message"].as_str().unwrap().to_string(),
        )
    };
    // All of the compute reserved: value 0, min 0, step 1.
    let (code, m) = message(&slice(serde_json::json!({"compute": {"value": "0",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}}}})));
    assert_eq!(code, 422);
    assert!(m.contains(&format!("ResourceSlice.resource.k8s.io \"{SLICE}\" is invalid: spec.devices[0].capacity[compute].requestPolicy.validRange.step: Invalid value: \"1\": one step 1 is larger than capacity value: 0")), "{m}");
    // 15.75 of 16 GiB reserved: 256Mi left, steps of 512Mi (default 1Gi).
    let (_, m) = message(&slice(serde_json::json!({"memory": {"value": "256Mi",
        "requestPolicy": {"default": "1Gi", "validRange": {"min": "512Mi", "step": "512Mi"}}}})));
    assert!(m.contains("min is larger than capacity value"), "{m}");
    assert!(m.contains("one step"), "{m}");
    // Off the grid.
    let (_, m) = message(&slice(serde_json::json!({"memory": {"value": "16Gi",
        "requestPolicy": {"default": "300Mi", "validRange": {"min": "256Mi", "step": "256Mi"}}}})));
    assert!(
        m.contains("value is not a multiple of a given step (256Mi) from (256Mi)"),
        "{m}"
    );
    // A policy on a device that is not shareable.
    let mut v = slice(serde_json::json!({"compute": {"value": "1000",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}}}}));
    v["spec"]["devices"][0]["allowMultipleAllocations"] = false.into();
    assert!(message(&v)
        .1
        .contains("Forbidden: allowMultipleAllocations must be true"));
    // Unknown fields and wrong types are refused as strict decoding does (400).
    let mut v = slice(serde_json::json!({"compute": {"value": "1000"}}));
    v["spec"]["devices"][0]["capacity"]["compute"]["requestpolicy"] = serde_json::json!({});
    v["spec"]["pool"]["generation"] = "1".into();
    let (code, m) = message(&v);
    assert_eq!(code, 400);
    assert!(
        m.contains("unknown field \"spec.devices[0].capacity[compute].requestpolicy\""),
        "{m}"
    );
    assert!(
        m.contains("spec.pool.generation: expected an integer"),
        "{m}"
    );
    // A bad quantity, a missing required field, a capacity name that is not a C identifier.
    let mut v = slice(serde_json::json!({"compute-share": {"value": "1 thousand"}}));
    v["spec"]["pool"]
        .as_object_mut()
        .unwrap()
        .remove("resourceSliceCount");
    let (code, m) = message(&v);
    assert_eq!(code, 400);
    assert!(
        m.contains("quantities must match")
            && m.contains("spec.pool.resourceSliceCount: Required value"),
        "{m}"
    );
    let v = slice(serde_json::json!({"compute-share": {"value": "1"}}));
    assert!(message(&v).1.contains("a valid C identifier"));
    // And what the plugin publishes now passes.
    assert_eq!(
        check_resource_slice(&slice(serde_json::json!({"compute": {"value": "0"}}))),
        Ok(())
    );
}
