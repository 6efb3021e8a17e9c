//! The plugin on a node-mode runtime directory (docs/security.md), as on a real GPU node: the
//! directory is root's, a root `gpuslice monitor --mode node` owns the policy, registers the
//! GPUs and admits processes over `monitor.sock`; the plugin (`--mode node`) only reads the
//! policy and makes and removes claim slices by operator requests over that socket. The
//! claim's processes run as an unprivileged user (`setpriv` to a uid that exists nowhere), in
//! the environment the claim's CDI device gives a container.
//!
//! Needs root (to be the node's root and to become another user); without root it prints why
//! and passes vacuously, like tests/e2e/tests/tenants.rs, whose node world (`gpuslice_e2e::node`)
//! it shares. CI runs as root.

use gpuslice_dra::proto::health_v1alpha1::HealthStatus;
use gpuslice_dra::proto::v1;
use gpuslice_e2e::node::{slice_named, wait_for_slice, Node};
use gpuslice_e2e::{artifact, World};
use gpuslice_ledger::Ledger;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::*;

const GI: u64 = 1 << 30;
/// The tenant: a uid with no account anywhere.
const TENANT: u32 = 47101;

/// `gpuslice-burn` as the tenant, in the container environment of the claim's CDI device
/// (`ids`: the gpuslice device, then the NVIDIA one, whose UUID is the visible GPU).
fn tenant_burn(node: &Node, dirs: &Dirs, ids: &[String]) -> Command {
    let mut c = node.command(TENANT, "gpuslice-burn");
    for (k, v) in container_env(&dirs.cdi(), &ids[0]) {
        c.env(k, v);
    }
    let (kind, gpu) = ids[1].split_once('=').unwrap();
    assert_eq!(kind, "nvidia.com/gpu");
    c.env("CUDA_VISIBLE_DEVICES", gpu);
    c
}

/// What node mode charges a context inside its slice's quota on the tests' 16 GiB fake GPU.
const CONTEXT: u64 = 512 << 20;

fn plugin(node: &Node, dirs: &Dirs) -> Child {
    start_plugin_with(
        &node.world,
        dirs,
        &node.bin.join("libgpuslice.so"),
        &["--mode", "node"],
    )
}

async fn prepare(endpoint: &Path, claims: &[&TestClaim]) -> v1::NodePrepareResourcesResponse {
    Kubelet::connect(endpoint).await.prepare(claims).await
}

/// Unprepare `claim` alone: the error for it.
async fn unprepare(endpoint: &Path, claim: &TestClaim) -> String {
    let r = Kubelet::connect(endpoint).await.unprepare(&[claim]).await;
    r.claims[claim.uid].error.clone()
}

fn spec_file(dirs: &Dirs, c: &TestClaim) -> PathBuf {
    dirs.cdi()
        .join(format!("gpuslice.dev-slice_k8s-{}.json", c.uid))
}

#[tokio::test(flavor = "current_thread")]
async fn claims_on_a_node_mode_runtime_dir_go_through_the_monitor() {
    gpuslice_e2e::need_root!();
    let mut node = Node::new(1, "16Gi", &[]);
    let dirs = Dirs::new(&node.world);
    let mut p = plugin(&node, &dirs);
    let endpoint = register(&dirs).await;
    let s = published_slice(&dirs);
    let dev0 = s.spec.devices.as_ref().unwrap()[0].name.clone();
    assert_eq!(capacities(&s)[&dev0], ("16Gi".into(), "1000".into()));
    assert!(
        log_of(&dirs).contains("node mode: slices are made by the node's monitor"),
        "{}",
        log_of(&dirs)
    );
    let policy = Ledger::open(&node.world.runtime_dir()).unwrap();
    assert!(policy.is_node());

    // A claim prepared: its slice is in the monitor's policy, made by the monitor (the
    // plugin never writes the policy: see the monitor-down case below).
    let a = TestClaim::new("team-a", "a", "3a3a3a3a-0000-4000-8000-00000000003a");
    a.write(&dirs, &dev0, "4Gi", "250");
    let r1 = prepare(&endpoint, &[&a]).await;
    let ids = prepared_ids(&r1, a.uid);
    let slice_of = |l: &Ledger, c: &TestClaim| {
        l.snapshot()
            .slices
            .into_iter()
            .find(|s| s.name == format!("k8s-{}", c.uid))
    };
    let sa = slice_of(&policy, &a).expect("the claim's slice in the policy");
    assert_eq!(
        (sa.memory_limit, sa.compute_share.ppm(), sa.claim.as_deref()),
        (Some(4 * GI), 250_000, Some("team-a/a"))
    );
    assert!(sa.operator_defined);
    // The claim's CDI spec mounts the node's policy read-only (tenants reach the socket).
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(spec_file(&dirs, &a)).unwrap()).unwrap();
    let mounts = &spec["devices"][0]["containerEdits"]["mounts"];
    let dir_mount = mounts
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["hostPath"] == node.world.runtime_dir().to_str().unwrap())
        .unwrap_or_else(|| panic!("{mounts}"));
    assert_eq!(dir_mount["options"][0], "ro", "{mounts}");

    // The tenant, in the claim's container environment, is admitted by the monitor into the
    // claim's slice and held to its memory.
    assert_held_to_4_gib(&mut tenant_burn(&node, &dirs, &ids), CONTEXT);

    // The claim's slice has a join secret: the spec (root's alone) carries it to the claim's
    // containers; it is not in the policy every tenant reads; a process that names the slice
    // without it (any pod can reach monitor.sock and knows claim UIDs) is refused at cuInit.
    let secret = spec_secret(&dirs, &a);
    assert_eq!(secret.len(), 64, "256 random bits as hex");
    assert_eq!(
        std::fs::metadata(spec_file(&dirs, &a))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let bytes = std::fs::read(node.world.runtime_dir().join("ledger")).unwrap();
    assert!(!bytes.windows(64).any(|w| w == secret.as_bytes()));
    assert_refused_without_secret(&node, &dirs, &ids, &a);

    // A pod of the claim runs (3 GiB held: 2.5 GiB and its context) while the plugin is killed
    // and restarted.
    let (mut holder, _) = gpuslice_e2e::spawn_holding(
        tenant_burn(&node, &dirs, &ids)
            .args(["--alloc", "2560Mi", "--hold", "60", "--json"])
            .stderr(Stdio::null()),
    );
    p.kill().unwrap();
    p.wait().unwrap();
    let mut p = plugin(&node, &dirs);
    let endpoint = register(&dirs).await;
    let r2 = prepare(&endpoint, &[&a]).await;
    assert_eq!(
        r2.claims[a.uid], r1.claims[a.uid],
        "prepared before the restart"
    );
    assert_eq!(
        spec_secret(&dirs, &a),
        secret,
        "the restarted plugin keeps the secret"
    );
    assert_eq!(
        slice_of(&policy, &a).unwrap().index,
        sa.index,
        "the same slice"
    );

    // Unprepare while the tenant's process lives: refused, nothing removed.
    let e = unprepare(&endpoint, &a).await;
    assert!(
        e.contains("live process") && e.contains(&holder.id().to_string()),
        "{e}"
    );
    assert!(spec_file(&dirs, &a).exists());
    assert!(slice_of(&policy, &a).is_some());

    // The monitor down: a new claim is refused with a retryable error naming the monitor,
    // and nothing is made for it (no slice, no spec). The running process keeps its quota.
    let b = TestClaim::new("team-b", "b", "3b3b3b3b-0000-4000-8000-00000000003b");
    b.write(&dirs, &dev0, "2Gi", "100");
    let mut health = health_watch(&endpoint).await;
    next_health(&mut health, "a healthy GPU", |h| {
        h.get(&dev0).is_some_and(|g| g.0 == HealthStatus::Healthy)
    })
    .await;
    node.terminate_monitor();
    // The kubelet hears that the GPU cannot take new processes now, and why.
    let h = next_health(&mut health, "the GPU unhealthy", |h| {
        h.get(&dev0).is_some_and(|g| g.0 == HealthStatus::Unhealthy)
    })
    .await;
    assert!(h[&dev0].1.contains("monitor does not answer"), "{h:?}");
    let r = prepare(&endpoint, &[&b]).await;
    let err = &r.claims[b.uid].error;
    assert!(r.claims[b.uid].devices.is_empty());
    assert!(
        err.contains("team-b/b")
            && err.contains("monitor does not answer")
            && err.contains("monitor.sock")
            && err.contains("retries"),
        "{err}"
    );
    assert!(!spec_file(&dirs, &b).exists());
    assert!(slice_of(&policy, &b).is_none());
    // ... and the monitor back: the kubelet's retry succeeds.
    node.start_monitor();
    next_health(&mut health, "the GPU healthy again", |h| {
        h.get(&dev0)
            .is_some_and(|g| g.0 == HealthStatus::Healthy && g.1.is_empty())
    })
    .await;
    drop(health);
    let r = prepare(&endpoint, &[&b]).await;
    prepared_ids(&r, b.uid);
    assert_eq!(
        slice_of(&policy, &b).unwrap().memory_limit,
        Some(2 * GI),
        "made by the restarted monitor"
    );
    assert_ne!(spec_secret(&dirs, &b), secret, "one secret per claim");
    // The restarted monitor still holds claim a's secret: refused without, admitted with.
    assert_refused_without_secret(&node, &dirs, &ids, &a);
    let v = gpuslice_e2e::run_json(tenant_burn(&node, &dirs, &ids).args([
        "--alloc",
        "512Mi,1Gi",
        "--json",
    ]));
    // 3 GiB of 4 are held, and this process's context takes 512 MiB more.
    assert_eq!(v["allocated_bytes"], GI / 2, "3.5 GiB of 4 are held: {v}");

    // The pod ends: the claim is unprepared, its slice leaves the policy (at the monitor's
    // reaping of the process, at the latest) and its spec the CDI directory.
    holder.kill().unwrap();
    holder.wait().unwrap();
    for c in [&a, &b] {
        assert_eq!(unprepare(&endpoint, c).await, "", "claim {}", c.name);
        assert!(!spec_file(&dirs, c).exists());
        wait_for(&dirs, "the slice gone from the policy", || {
            slice_of(&policy, c).is_none()
        });
        assert_eq!(unprepare(&endpoint, c).await, "", "a repeat is a no-op");
    }
    let dev = policy.snapshot().devices[0].clone();
    assert_eq!((dev.memory_reserved, dev.compute_reserved_ppm), (0, 0));
    p.kill().unwrap();
    p.wait().unwrap();
}

/// The join secret the claim's CDI spec gives its containers.
fn spec_secret(dirs: &Dirs, c: &TestClaim) -> String {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(spec_file(dirs, c)).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix("GPUSLICE_SLICE_SECRET="))
        .unwrap_or_else(|| panic!("no GPUSLICE_SLICE_SECRET in {spec}"))
        .to_string()
}

/// Another pod's process naming claim `c`'s slice, without its secret or with a wrong one:
/// refused at cuInit, with the line the shim prints.
fn assert_refused_without_secret(node: &Node, dirs: &Dirs, ids: &[String], c: &TestClaim) {
    for wrong in [None, Some("0".repeat(64))] {
        let mut cmd = tenant_burn(node, dirs, ids);
        cmd.env_remove("GPUSLICE_SLICE_SECRET")
            .env("GPUSLICE_SLICE", format!("k8s-{}", c.uid))
            .args(["--alloc", "1Mi", "--json"]);
        if let Some(w) = &wrong {
            cmd.env("GPUSLICE_SLICE_SECRET", w);
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success()
                && err.contains("cuInit")
                && err.contains(&format!("slice \"k8s-{}\" requires its secret", c.uid)),
            "{wrong:?}: {o:?}"
        );
    }
}

#[test]
fn a_plugin_started_before_the_monitor_waits_for_its_policy() {
    gpuslice_e2e::need_root!();
    // The DaemonSet starts both containers at once: a plugin in node mode that comes first
    // creates nothing (a personal ledger there would keep the monitor from starting), and
    // serves once the monitor's policy is there.
    let world = World::new(1, "8Gi");
    std::fs::remove_dir(world.runtime_dir()).unwrap();
    let dirs = Dirs::new(&world);
    let mut p = start_plugin_waiting(&world, &dirs);
    wait_for(&dirs, "the plugin to say it waits", || {
        log_of(&dirs).contains("waiting for the node's gpuslice monitor")
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!world.runtime_dir().exists(), "the plugin created nothing");
    assert!(!dirs.reg_socket().exists(), "and does not register yet");
    let mut monitor = world
        .gpuslice()
        .args(["monitor", "--mode", "node", "--interval", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&dirs, "the registration socket", || {
        dirs.reg_socket().exists()
    });
    assert!(Ledger::open(&world.runtime_dir()).unwrap().is_node());
    p.kill().unwrap();
    p.wait().unwrap();
    // SAFETY: kill(2) on our unreaped child.
    unsafe { libc::kill(monitor.id() as i32, libc::SIGTERM) };
    monitor.wait().unwrap();
}

/// The plugin in node mode, not waiting for its registration socket.
fn start_plugin_waiting(world: &World, dirs: &Dirs) -> Child {
    spawn_plugin(
        world,
        dirs,
        &artifact("libgpuslice.so"),
        &["--mode", "node"],
    )
}

/// Issue #33: every process of a claim's container runs under the shim in the claim's slice,
/// those that clear their environment too. The claim's spec mounts `/etc/ld.so.preload` and
/// the settings file (with the join secret) from a root-only directory beside the spec; a
/// container made from it as a runtime makes one (`gpuslice_e2e::container`) runs the tenant's
/// programs with `env -i`. What escapes (docs/kubernetes.md): a program that turns the shim
/// off in its own environment, which the monitor's audit reports as its uid's bypass.
#[tokio::test(flavor = "current_thread")]
async fn every_process_of_a_claims_container_is_in_its_slice() {
    use gpuslice_e2e::container::{fake_gpu_env, Container};
    gpuslice_e2e::need_root!();
    let node = Node::new(1, "16Gi", &[]);
    let dirs = Dirs::new(&node.world);
    let mut p = plugin(&node, &dirs);
    let endpoint = register(&dirs).await;
    let s = published_slice(&dirs);
    let dev0 = s.spec.devices.as_ref().unwrap()[0].name.clone();
    let a = TestClaim::new("team-a", "a", "3c3c3c3c-0000-4000-8000-00000000003c");
    a.write(&dirs, &dev0, "4Gi", "250");
    let ids = prepared_ids(&prepare(&endpoint, &[&a]).await, a.uid);
    let slice = format!("k8s-{}", a.uid);

    // Beside the spec, root's alone: the files its mounts name, the secret among them.
    let files = spec_file(&dirs, &a).with_extension("d");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&files), 0o700);
    let settings = std::fs::read_to_string(files.join("slice.env")).unwrap();
    let secret = spec_secret(&dirs, &a);
    assert!(
        settings.contains(&format!("GPUSLICE_SLICE={slice}\n"))
            && settings.contains(&format!("GPUSLICE_SLICE_SECRET={secret}\n")),
        "{settings}"
    );
    // Another user of the host cannot open it; the claim's processes read it in the container.
    let o = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={TENANT}"),
            &format!("--regid={TENANT}"),
            "--clear-groups",
            "--",
        ])
        .arg("cat")
        .arg(files.join("slice.env"))
        .output()
        .unwrap();
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{o:?}"
    );

    let c = Container::new(&dirs.cdi(), &ids[0], &node.bin, &[&node.root()]);
    let hw = fake_gpu_env(&node.world);
    let hw: Vec<(&str, &str)> = hw.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let burn = node.bin.join("gpuslice-burn");

    // The tenant's program with `env -i`: admitted into the claim's slice with the file's
    // secret, held to its 4 GiB.
    assert_held_to_4_gib(&mut c.command(TENANT, &hw, &burn), CONTEXT);
    // Root in the container (what most images run as) too, though the node's directory, its
    // own on the host, is read-only there.
    assert_held_to_4_gib(&mut c.command(0, &hw, &burn), CONTEXT);
    // A setuid program (euid root, its caller's environment) loads the shim from
    // /etc/ld.so.preload, which ignores every variable of that environment: in the claim's
    // slice, whatever its caller says.
    let hostile: Vec<(&str, &str)> = hw
        .iter()
        .copied()
        .chain([
            ("GPUSLICE_DISABLE", "1"),
            ("GPUSLICE_SLICE", "elsewhere"),
            ("GPUSLICE_MEMORY", "15Gi"),
            ("GPUSLICE_RUNTIME_DIR", "/tmp"),
        ])
        .collect();
    let setuid = Path::new("/usr/local/bin/gpuslice-burn-setuid");
    assert_held_to_4_gib(
        &mut c.command_after(
            TENANT,
            &hostile,
            setuid,
            &format!(
                "cp {} \"$R{}\" && chmod 4755 \"$R{}\"",
                burn.display(),
                setuid.display(),
                setuid.display()
            ),
        ),
        CONTEXT,
    );

    // Recorded in the slice: the node's status lists it there while it holds 1 GiB.
    let (mut holder, _) = gpuslice_e2e::spawn_holding(
        c.command(TENANT, &hw, &burn)
            .args(["--alloc", "1Gi", "--hold", "60", "--json"])
            .stderr(Stdio::null()),
    );
    wait_for_slice(&node, &slice, 1);
    let st = node.status();
    assert_eq!(
        slice_named(&st, &slice)["pids"],
        serde_json::json!([holder.id()]),
        "{st:#}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();

    // What escapes: a program that turns the shim off in its own environment (and has no
    // GPUSLICE_SLICE there) runs unwrapped; the audit reports it as its uid's bypass.
    let mut off = hw.clone();
    off.push(("GPUSLICE_DISABLE", "1"));
    let (mut escaped, _) = gpuslice_e2e::spawn_holding(
        c.command(TENANT, &off, &burn)
            .args(["--alloc", "5Gi", "--hold", "60", "--json"])
            .stderr(Stdio::null()),
    );
    let pid = escaped.id().to_string();
    wait_for(&dirs, "the audit to report the escape", || {
        node.monitor_log().lines().any(|l| {
            l.contains(&format!("pid {pid} of uid {TENANT}")) && l.contains("outside gpuslice")
        })
    });
    escaped.kill().unwrap();
    escaped.wait().unwrap();

    // The pod ends: unprepare removes the spec and its files.
    wait_for(&dirs, "the holder reaped", || {
        node.status()["slices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|x| x["name"] == slice.as_str())
            .all(|x| x["pids"].as_array().is_none_or(|p| p.is_empty()))
    });
    assert_eq!(unprepare(&endpoint, &a).await, "");
    assert!(!spec_file(&dirs, &a).exists());
    assert!(!files.exists(), "{}", files.display());
    p.kill().unwrap();
    p.wait().unwrap();
}
