//! Node mode: every byte on the device belongs to a slice (issue #34, docs/security.md,
//! "Memory in node mode"). A root monitor in node mode with its defaults, users t1 and t2, one
//! 16 GiB fake GPU whose contexts take 1/32 of it (512 MiB, as a real driver's take a few
//! hundred MiB: docs/fakegpu.md). Each CUDA context is charged to its slice inside the quota,
//! so a slice looks like a device of its quota's size and no tenant's contexts can crowd out
//! another's reservation. Every test needs root; without root it prints why and passes
//! vacuously. CI runs as root.

use gpuslice_e2e::node::*;
use gpuslice_e2e::{fake_context_bytes, first_line, need_root, GI, MI};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The device every test runs on.
const DEVICE: u64 = 16 << 30;

/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OOM: u64 = 2;

/// A `gpuslice-burn` of `uid` under the shim with `env` that creates its context, allocates
/// `alloc` (none if empty) and holds it 60 s; returned with its first line as JSON (the
/// `holding` event, or the report of a run that failed before it).
fn start(n: &Node, uid: u32, env: &[(&str, &str)], alloc: &str) -> (Child, serde_json::Value) {
    let mut c = n.burn(uid);
    if !alloc.is_empty() {
        c.args(["--alloc", alloc]);
    }
    c.args(["--hold", "60", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut c = c.spawn().unwrap();
    let (_, v) = first_line(&mut c);
    (c, v)
}

/// Whether a [`start`]ed process holds (it got its context and reported `holding`).
fn holds(v: &serde_json::Value) -> bool {
    v["event"] == "holding"
}

/// The stderr of a process that ended (it is waited for).
fn stderr_of(c: Child) -> String {
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The device's context charge, as `status --json` shows it once the monitor measured it.
fn context_charge(n: &Node) -> u64 {
    wait_status(n, 30, "the context charge in status", |s| {
        s["devices"][0]["context_bytes"].as_u64().filter(|&b| b > 0)
    })
}

/// Wait until slice `slice`'s `memory_used` and `memory_contexts` are `used` and `contexts`.
fn wait_usage(n: &Node, slice: &str, used: u64, contexts: u64) {
    wait_status(
        n,
        30,
        &format!("slice {slice} using {used} bytes, {contexts} of them contexts"),
        |s| {
            let x = slice_named(s, slice);
            (x["memory_used"].as_u64() == Some(used)
                && x["memory_contexts"].as_u64() == Some(contexts))
            .then_some(())
        },
    );
}

/// (a) t1 starts processes that only create a context (no allocation) in its 2 GiB slice:
/// the first four hold its 2 GiB in contexts; the fifth and sixth are refused at context
/// creation with a line naming the slice, what it has left and how to raise it. `status` shows
/// the slice's context memory apart from its allocations, and t2's later 4 GiB slice gets its
/// context and the whole of what `cuMemGetInfo` says is free in it (its quota less its one
/// context), no byte more. On main t1's contexts were nobody's: 64 of them filled the device
/// and t2's admitted slice could not create a context.
#[test]
fn contexts_are_charged_to_their_slice_inside_its_quota() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let ctx = fake_context_bytes(DEVICE);
    assert_eq!(ctx, 512 * MI);
    assert_eq!(context_charge(&n), ctx, "{}", n.monitor_log());
    let t1 = in_slice("t1q", "2Gi");
    let mut held = vec![];
    for i in 0..6 {
        let (c, v) = start(&n, TENANT_A, &t1, "");
        if i < 4 {
            assert!(holds(&v), "t1's process {i}: {v}\n{}", stderr_of(c));
            held.push(c);
            continue;
        }
        assert_eq!(v["error"]["code"], OOM, "t1's process {i}: {v}");
        assert_eq!(v["error"]["call"], "cuDevicePrimaryCtxRetain", "{v}");
        let err = stderr_of(c);
        for want in [
            "slice \"t1q\" has 0 B of its 2 GiB quota left",
            "a CUDA context is charged 512 MiB",
            "--context-memory",
            "GPUSLICE_MEMORY",
        ] {
            assert!(err.contains(want), "t1's process {i}: no {want:?} in {err}");
        }
    }
    wait_usage(&n, "t1q", 2 * GI, 2 * GI);
    // The table shows it too, apart from the allocations.
    let o = n.cli(0, &["status"]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("OF IT CONTEXTS"), "{table}");
    let row = table.lines().find(|l| l.starts_with("t1q")).unwrap();
    assert!(
        row.contains("2 GiB / 2 GiB") && row.contains("2 GiB"),
        "{row}"
    );
    // t2's slice: a device of 4 GiB with its own context inside.
    let o = n.allocate(TENANT_B, &in_slice("t2q", "4Gi"), "free,1Mi");
    let r = burn_json(&o);
    assert_eq!(r["mem"]["start"]["total"], 4 * GI, "{}", text(&o));
    assert_eq!(r["mem"]["start"]["free"], 4 * GI - ctx, "{}", text(&o));
    assert_eq!(r["allocated_bytes"], 4 * GI - ctx, "{}", text(&o));
    assert_eq!(r["alloc_errors"], serde_json::json!([OOM]), "{}", text(&o));
    kill_all(held.iter_mut());
    // A dead process's context comes back with the rest of its charge (the slice, a process's,
    // goes with its last one).
    wait_slice_gone(&n, "t1q");
}

/// An unwrapped program of `uid` (no shim: a bypass) that creates its context, allocates
/// `alloc` (none if empty) and holds it 60 s; with its first line as JSON.
fn bypass(n: &Node, uid: u32, alloc: &str) -> (Child, serde_json::Value) {
    let mut c = n.command(uid, "gpuslice-burn");
    c.env_remove("LD_PRELOAD");
    if !alloc.is_empty() {
        c.args(["--alloc", alloc]);
    }
    let mut c = c
        .args(["--hold", "60", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, v) = first_line(&mut c);
    (c, v)
}

/// (a), bypassed: t1's programs without the library only create contexts until the device is
/// full (31 of 512 MiB beside the monitor's). No quota counts them, so t2's later 4 GiB slice
/// fits the ledger; it is refused up front at `cuInit`, with what it asked, what the device
/// physically has and whose memory is outside gpuslice (pid, uid) — never admitted and then
/// out of memory at context creation. Once they are gone, t2 is admitted.
///
/// With `--on-violation report`, so that the bypassers stay (node mode's default, `kill`,
/// ends them within an audit period: [`memory_outside_gpuslice_after_admission_crowds_out_no_reservation`]).
#[test]
fn context_only_bypassers_get_a_later_slice_refused_up_front() {
    need_root!();
    let n = Node::new(1, "16Gi", &["--on-violation", "report"]);
    let ctx = context_charge(&n);
    let mut held = vec![];
    for _ in 0..40 {
        let (c, v) = bypass(&n, TENANT_A, "");
        if !holds(&v) {
            assert_eq!(v["error"]["code"], OOM, "{v}");
            break;
        }
        held.push(c);
    }
    assert_eq!(
        held.len() as u64,
        (DEVICE - ctx) / ctx,
        "contexts the device holds"
    );
    let o = n.allocate(TENANT_B, &in_slice("t2q", "4Gi"), "1Mi");
    assert_eq!(burn_json(&o)["error"]["call"], "cuInit", "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "requested 4 GiB, available 0 B",
        "as the device physically is",
        "memory held outside gpuslice: pid ",
        &format!("(uid {TENANT_A}) 512 MiB"),
    ] {
        assert!(err.contains(want), "no {want:?} in {}", text(&o));
    }
    assert!(slices_named(&n.status(), "t2q").next().is_none());
    kill_all(held.iter_mut());
    // The fake frees a dead process's memory when someone notices it: retry a little.
    let t0 = Instant::now();
    loop {
        let o = n.allocate(TENANT_B, &in_slice("t2q", "4Gi"), "free");
        let r = burn_json(&o);
        if r["allocated_bytes"] == 4 * GI - ctx {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", text(&o));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// (c) Memory held outside gpuslice after t2's admission: t1's unwrapped program takes all it
/// can get. t2 keeps its reservation (a second process allocates the whole of what it is told
/// is free, the quota less two contexts and what the first holds), and the monitor names the
/// bypasser (pid, uid) in its log and, under node mode's default `--on-violation kill`, ends
/// it.
#[test]
fn memory_outside_gpuslice_after_admission_crowds_out_no_reservation() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let ctx = context_charge(&n);
    let t2 = in_slice("t2q", "4Gi");
    let (first, v) = start(&n, TENANT_B, &t2, "1Gi");
    assert!(holds(&v), "t2's first process: {v}\n{}", stderr_of(first));
    // The balloon follows the first process's allocation at the monitor's next tick.
    std::thread::sleep(Duration::from_millis(500));
    let (hog, v) = bypass(&n, TENANT_A, &["512Mi"; 32].join(","));
    assert!(holds(&v), "the bypass: {v}");
    // At most what nobody reserved: 16 GiB less t2's 4 GiB, the monitor's context and its own.
    let got = v["allocated_bytes"].as_u64().unwrap();
    let unreserved = DEVICE - 4 * GI - 2 * ctx;
    assert!(got <= unreserved && got + 2 * GI > unreserved, "{v}");
    let o = n.allocate(TENANT_B, &t2, "free,1Mi");
    let r = burn_json(&o);
    let told = 4 * GI - 2 * ctx - GI;
    assert_eq!(
        r["mem"]["start"]["free"],
        told,
        "{}\n{}",
        text(&o),
        n.monitor_log()
    );
    assert_eq!(
        r["allocated_bytes"],
        told,
        "{}\n{}",
        text(&o),
        n.monitor_log()
    );
    let line = format!("pid {} of uid {TENANT_A} holds", hog.id());
    let t0 = Instant::now();
    while !n.monitor_log().contains(&line) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the monitor never named the bypass ({line}): {}",
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = n.monitor_log();
    let named = log.lines().find(|l| l.contains(&line)).unwrap();
    assert!(named.contains("outside gpuslice"), "{named}");
    let mut hog = hog;
    let st = gpuslice_e2e::wait_within(&mut hog, Duration::from_secs(30), "the bypass");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL),
        "{}",
        n.monitor_log()
    );
    kill_all([first].iter_mut());
}

/// (e) On a full device, a second and a fifth process of t2's 4 GiB slice each allocate the
/// whole of what `cuMemGetInfo` shows them, and the slice as a whole gets its full quota:
/// `t1_fills` makes the device full (t1 over its quota by a scribbled counter, or a quota of
/// t1's that legitimately takes the rest). On main a second process took its context out of
/// its slice's reservation and then found less than it was told.
fn a_full_device_leaves_t2_its_quota(n: &Node, mut t1: Vec<Child>) {
    let ctx = fake_context_bytes(DEVICE);
    let t2 = in_slice("t2q", "4Gi");
    // Full: an unwrapped program of t1's gets no 64 MiB (nor a context), once the monitor's
    // next tick holds t2's reservation.
    let t0 = Instant::now();
    loop {
        let o = n
            .command(TENANT_A, "gpuslice-burn")
            .env_remove("LD_PRELOAD")
            .args(["--alloc", "64Mi", "--json"])
            .output()
            .unwrap();
        let r = burn_json(&o);
        if r["error"]["code"] == OOM || r["alloc_errors"] == serde_json::json!([OOM]) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the device is not full: {r}\n{:#}\n{}",
            n.status(),
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (first, v) = start(n, TENANT_B, &t2, "256Mi");
    assert!(holds(&v), "t2's first process: {v}\n{}", stderr_of(first));
    let mut held = vec![first];
    // The second: told its quota less two contexts and the first's 256 MiB, and gets it all.
    let o = n
        .burn(TENANT_B)
        .args(["--alloc", "free", "--json"])
        .envs(t2)
        .env("GPUSLICE_LOG", "debug")
        .output()
        .unwrap();
    let r = burn_json(&o);
    let told = 4 * GI - 2 * ctx - 256 * MI;
    assert_eq!(
        r["mem"]["start"]["free"],
        told,
        "{}\n{}",
        text(&o),
        n.monitor_log()
    );
    assert_eq!(
        (r["allocated_bytes"].as_u64(), r["alloc_errors"].clone()),
        (Some(told), serde_json::json!([])),
        "t2's second process: {}\n{}",
        text(&o),
        n.monitor_log()
    );
    // The third and fourth only hold their contexts; the fifth takes what is left.
    for nth in ["third", "fourth"] {
        let (c, v) = start(n, TENANT_B, &t2, "");
        assert!(holds(&v), "t2's {nth} process: {v}\n{}", stderr_of(c));
        held.push(c);
    }
    // The fifth: told its quota less four contexts and the first's 256 MiB, and gets it all.
    let told = 4 * GI - 4 * ctx - 256 * MI;
    let (fifth, v) = start(n, TENANT_B, &t2, "free");
    assert!(holds(&v), "t2's fifth process: {v}\n{}", stderr_of(fifth));
    assert_eq!(
        v["allocated_bytes"],
        told,
        "t2's fifth process: {v}\n{}",
        n.monitor_log()
    );
    held.push(fifth);
    wait_usage(n, "t2q", 4 * GI, 4 * ctx);
    let s = n.status();
    let p = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["slice"] == "t2q")
        .map(|p| p["memory_used"].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0);
    assert_eq!(
        p,
        ctx + told,
        "the fifth process holds its context and {told}: {s:#}"
    );
    kill_all(held.iter_mut().chain(t1.iter_mut()));
}

/// (e) with t1 over its 1 GiB quota by zeroing its slice's usage counter, and keeping what it
/// took (`--on-violation report`; node mode's default, `kill`, ends it:
/// [`a_scribbler_does_not_keep_what_it_took`]): its processes take every byte nobody reserved
/// and their own slice's balloon.
#[test]
fn a_scribbler_filling_the_device_leaves_t2_its_quota() {
    need_root!();
    let n = Node::new(1, "16Gi", &["--on-violation", "report"]);
    let ctx = context_charge(&n);
    // t2's slice first (an operator slice of its own, nothing used: its balloon holds 4 GiB).
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            "t2q",
            "--memory",
            "4Gi",
            "--owner",
            &TENANT_B.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let mut sidecar = n
        .child(TENANT_A, "zero-used")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The test harness's own lines come first.
    let ready = {
        let mut r = BufReader::new(sidecar.stdout.as_mut().unwrap());
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("ready") {
            line.clear();
        }
        line.contains("ready")
    };
    assert!(ready, "the sidecar did not start: {}", stderr_of(sidecar));
    let mut t1 = vec![sidecar];
    let mut got = 0u64;
    for _ in 0..40 {
        let (c, v) = start(&n, TENANT_A, &in_slice("t1s", "1Gi"), "512Mi");
        if !holds(&v) {
            break;
        }
        got += v["allocated_bytes"].as_u64().unwrap_or(0) + ctx;
        t1.push(c);
    }
    println!("the scribbler holds {} MiB on its 1 GiB quota", got >> 20);
    assert!(got > 4 * GI, "{got}");
    a_full_device_leaves_t2_its_quota(&n, t1);
}

/// (e) with a quota of t1's that takes all the rest of the device, legitimately.
#[test]
fn a_quota_filling_the_device_leaves_t2_its_quota() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let ctx = context_charge(&n);
    // The monitor's own context takes one; t2 reserves 4 GiB; t1 the rest.
    let rest = DEVICE - ctx - 4 * GI;
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            "t2q",
            "--memory",
            "4Gi",
            "--owner",
            &TENANT_B.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let (c, v) = start(&n, TENANT_A, &in_slice("t1big", &rest.to_string()), "free");
    assert!(holds(&v), "t1: {v}\n{}", stderr_of(c));
    assert_eq!(v["allocated_bytes"], rest - ctx, "{v}");
    a_full_device_leaves_t2_its_quota(&n, vec![c]);
}

/// Node mode's default `--on-violation kill`: t1, over its 1 GiB quota by zeroing its slice's
/// usage counter, does not keep what it took: once the audit finds the slice over, its largest
/// processes are ended until the rest fits the quota and the audit's allowance (each is
/// within what it charged: only the slice's own scribbled counter let them past the quota), and
/// t2's process is untouched. What it keeps past its quota is at most `--context-allowance` per
/// process left (docs/security.md, "Memory in node mode").
#[test]
fn a_scribbler_does_not_keep_what_it_took() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let ctx = context_charge(&n);
    let (mut t2, v) = start(&n, TENANT_B, &in_slice("t2q", "2Gi"), "1Gi");
    assert!(holds(&v), "{v}");
    let mut sidecar = n
        .child(TENANT_A, "zero-used")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = {
        let mut r = BufReader::new(sidecar.stdout.as_mut().unwrap());
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("ready") {
            line.clear();
        }
        line.contains("ready")
    };
    assert!(ready, "the sidecar did not start: {}", stderr_of(sidecar));
    let mut t1 = vec![];
    for _ in 0..4 {
        let (c, v) = start(&n, TENANT_A, &in_slice("t1s", "1Gi"), "512Mi");
        assert!(holds(&v), "{v}");
        t1.push(c);
    }
    // 4 x (512 MiB + a context) on a 1 GiB quota: the audit ends processes until what is left
    // fits the quota and `--context-allowance` (512 MiB) per process left: two of them.
    let t0 = Instant::now();
    let killed = loop {
        let k = t1
            .iter_mut()
            .filter_map(|c| c.try_wait().unwrap())
            .filter(|s| std::os::unix::process::ExitStatusExt::signal(s) == Some(9))
            .count();
        if k >= 2 {
            break k;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{k} of t1's processes ended\n{}",
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "{killed} of t1's 4 scribbling processes ended ({} each)",
        512 * MI + ctx
    );
    assert!(n.monitor_log().contains("--on-violation kill: killed pid"));
    assert!(t2.try_wait().unwrap().is_none(), "t2's process was harmed");
    kill_all(t1.iter_mut().chain([&mut t2, &mut sidecar]));
}

#[test]
fn tenant_child() {
    serve_child(&[("zero-used", zero_used)]);
}

/// Child mode `zero-used`: admitted to t1's slice `t1s` (1 GiB), it stores 0 into the slice's
/// usage counter whenever it is not 0, for 60 s (its processes may write their region).
fn zero_used(dir: &Path) {
    let region = admitted_region(dir, Some("t1s"), Some(1 << 30), 0);
    println!("ready");
    let used = &region.header().memory_used;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if used.load(std::sync::atomic::Ordering::SeqCst) != 0 {
            used.store(0, std::sync::atomic::Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}
