//! System tests of the `gpuslice` monitor and operator CLI (issue 4), through real processes on
//! the fake GPU: wrapped `gpuslice-burn` processes hold memory in slices; `gpuslice status
//! --json` must agree with what they allocated; killing processes (or the monitor itself) must
//! neither lose nor double-count a byte; operator slices cap what processes ask for.
//!
//! Timing bounds are loose: every wait polls up to a generous deadline, and the one bound the
//! issue states (a killed process gone within 2 s) is the only timed assertion.

use gpuslice_e2e::node::slice_named;
use gpuslice_e2e::{fake_context_bytes, in_slice, run_json, words, World, GI, MI};
use serde_json::Value;
use std::io::{BufRead, BufReader, Lines, Read, Write};
use std::process::{Child, ChildStderr, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped when the test ends, whatever happens.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL it and reap it.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Poll `f` until it returns `Some`, for up to `secs` seconds; panic with `what` otherwise.
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Start `gpuslice <args>` (a monitor) with its stderr readable line by line, for tests that
/// wait on what it says.
fn monitor_saying(w: &World, args: &[&str]) -> (Child, Lines<BufReader<ChildStderr>>) {
    let mut m = w
        .gpuslice()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpuslice monitor");
    let lines = BufReader::new(m.stderr.take().unwrap()).lines();
    (m, lines)
}

/// Start `gpuslice monitor` in the world; returns once it holds its lock.
fn start_monitor(w: &World) -> Proc {
    let child = w
        .gpuslice()
        .args(["monitor", "--interval", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpuslice monitor");
    let p = Proc(child);
    wait_for(20, "the monitor to hold its lock", || {
        let s = std::fs::read_to_string(w.runtime_dir().join("monitor.lock")).ok()?;
        (s.trim() == p.pid().to_string()).then_some(())
    });
    p
}

/// A wrapped `gpuslice-burn` that allocates `alloc` in `slice` (quota `memory`) and holds it;
/// returns once it says it holds its allocations, with the bytes it got.
fn start_burn(w: &World, slice: &str, memory: &str, alloc: &str) -> (Proc, u64) {
    let (child, v) = gpuslice_e2e::spawn_holding(
        w.wrapped_burn()
            .envs(in_slice(slice, memory))
            .args(["--alloc", alloc, "--hold", "120", "--json"]),
    );
    (Proc(child), v["allocated_bytes"].as_u64().unwrap())
}

fn process(st: &Value, pid: u32) -> Option<&Value> {
    st["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
}

fn pids(s: &Value) -> Vec<u64> {
    let mut v: Vec<u64> = s["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    v.sort();
    v
}

/// Three wrapped burns in two slices, the monitor running, every process accounted.
struct Scene {
    w: World,
    monitor: Proc,
    a1: (Proc, u64),
    a2: (Proc, u64),
    b: (Proc, u64),
}

fn scene() -> Scene {
    let w = World::new(1, "16Gi");
    let monitor = start_monitor(&w);
    let a1 = start_burn(&w, "alpha", "4Gi", "1Gi");
    let a2 = start_burn(&w, "alpha", "4Gi", "512Mi");
    let b = start_burn(&w, "beta", "2Gi", "256Mi,256Mi");
    assert_eq!(
        (a1.1, a2.1, b.1),
        (GI, 512 * MI, 512 * MI),
        "burns got what they asked"
    );
    Scene {
        w,
        monitor,
        a1,
        a2,
        b,
    }
}

#[test]
fn status_json_lists_devices_slices_and_processes_that_agree() {
    let s = scene();
    let st = s.w.status();

    let devs = st["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 1, "{st}");
    let d = &devs[0];
    assert_eq!(d["memory_total"], 16 * GI, "{st}");
    assert_eq!(d["index"], 0, "{st}");
    assert!(d["uuid"].as_str().unwrap().starts_with("GPU-"), "{st}");
    assert!(!d["name"].as_str().unwrap().is_empty(), "{st}");
    assert_eq!(
        d["memory_reserved"],
        6 * GI,
        "both quotas are reserved: {st}"
    );
    assert_eq!(d["memory_used"], 2 * GI, "1Gi + 512Mi + 512Mi: {st}");
    assert_eq!(d["compute_reserved"], 0.0, "{st}");

    let alpha = slice_named(&st, "alpha");
    assert_eq!(alpha["device_uuid"], d["uuid"]);
    assert_eq!(alpha["memory_limit"], 4 * GI);
    assert_eq!(alpha["memory_used"], GI + 512 * MI);
    assert_eq!(pids(alpha), {
        let mut v = vec![s.a1.0.pid() as u64, s.a2.0.pid() as u64];
        v.sort();
        v
    });
    let beta = slice_named(&st, "beta");
    assert_eq!(beta["memory_limit"], 2 * GI);
    assert_eq!(beta["memory_used"], 512 * MI);
    assert_eq!(pids(beta), vec![s.b.0.pid() as u64]);
    for sl in [alpha, beta] {
        for k in ["compute_share", "compute_cap", "compute_used"] {
            assert!(sl[k].is_number(), "slice field {k}: {sl}");
        }
    }

    for (p, held, name) in [
        (&s.a1, GI, "alpha"),
        (&s.a2, 512 * MI, "alpha"),
        (&s.b, 512 * MI, "beta"),
    ] {
        let pr =
            process(&st, p.0.pid()).unwrap_or_else(|| panic!("pid {} missing: {st}", p.0.pid()));
        assert_eq!(pr["slice"], name, "{pr}");
        assert_eq!(pr["memory_used"], held, "{pr}");
        assert_eq!(pr["alive"], true, "{pr}");
    }
    assert_eq!(st["processes"].as_array().unwrap().len(), 3, "{st}");

    // The human table says the same, in GiB/MiB and percentages.
    let text = s.w.cli_ok(&["status"]);
    assert!(text.contains("1.50 GiB / 4 GiB (37.5%)"), "{text}");
    assert!(text.contains("512 MiB / 2 GiB (25%)"), "{text}");
    assert!(
        text.contains(&format!("monitor running (pid {})", s.monitor.pid())),
        "{text}"
    );
}

#[test]
fn a_killed_process_is_gone_within_two_seconds_and_its_memory_returned() {
    let mut s = scene();
    let victim = s.a1.0.pid();
    let before = s.w.status();
    assert_eq!(slice_named(&before, "alpha")["memory_used"], GI + 512 * MI);

    s.a1.0.kill();
    let killed = Instant::now();
    let after = wait_for(10, "the killed process to leave status", || {
        let st = s.w.status();
        process(&st, victim).is_none().then_some(st)
    });
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let alpha = slice_named(&after, "alpha");
    assert_eq!(
        alpha["memory_used"],
        512 * MI,
        "dropped by exactly the 1Gi it held: {after}"
    );
    assert_eq!(pids(alpha), vec![s.a2.0.pid() as u64]);
    assert_eq!(
        slice_named(&after, "beta")["memory_used"],
        512 * MI,
        "{after}"
    );
    assert_eq!(after["devices"][0]["memory_used"], GI, "{after}");
    assert_eq!(after["processes"].as_array().unwrap().len(), 2, "{after}");
}

/// Everything but `compute_used` (a moving window) must survive a monitor crash unchanged.
fn stable(st: &Value) -> Value {
    let mut st = st.clone();
    for s in st["slices"].as_array_mut().unwrap() {
        s.as_object_mut().unwrap().remove("compute_used");
    }
    st
}

#[test]
fn the_monitor_can_be_sigkilled_and_restarted_without_losing_or_double_counting() {
    let mut s = scene();
    let before = s.w.status();

    // Kill the monitor while the processes run; a second monitor meanwhile is refused clearly.
    let (code, err) = fails(&s.w, &["monitor"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("already running") && err.contains(&s.monitor.pid().to_string()),
        "{err}"
    );
    s.monitor.kill();
    assert_eq!(
        stable(&s.w.status()),
        stable(&before),
        "state lives in the ledger, not the monitor"
    );

    // Processes die while no monitor runs: one of the two in alpha (1Gi) and beta's only one
    // (its slice goes away with it). The restarted monitor returns their memory exactly once.
    let (a1_pid, beta_pid) = (s.a1.0.pid(), s.b.0.pid());
    s.a1.0.kill();
    s.b.0.kill();
    let _monitor = start_monitor(&s.w);
    let after = wait_for(
        10,
        "the restarted monitor to reap the dead processes",
        || {
            let st = s.w.status();
            (process(&st, a1_pid).is_none() && process(&st, beta_pid).is_none()).then_some(st)
        },
    );
    // Give the new monitor several more ticks: nothing may be reaped or returned twice.
    std::thread::sleep(Duration::from_millis(800));
    let settled = s.w.status();
    assert_eq!(stable(&settled), stable(&after));
    let alpha = slice_named(&settled, "alpha");
    assert_eq!(
        alpha["memory_used"],
        512 * MI,
        "1.5Gi less the 1Gi of the dead: {settled}"
    );
    assert_eq!(alpha["memory_limit"], 4 * GI, "{settled}");
    assert_eq!(pids(alpha), vec![s.a2.0.pid() as u64]);
    assert!(
        settled["slices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["name"] != "beta"),
        "beta left with its last process: {settled}"
    );
    let d = &settled["devices"][0];
    assert_eq!(d["memory_used"], 512 * MI, "{settled}");
    assert_eq!(
        d["memory_reserved"],
        4 * GI,
        "only alpha's quota is reserved: {settled}"
    );
    assert_eq!(
        settled["processes"].as_array().unwrap().len(),
        1,
        "{settled}"
    );
    assert_eq!(
        process(&settled, s.a2.0.pid()).unwrap()["memory_used"],
        s.a2.1,
        "{settled}"
    );
}

#[test]
fn an_operator_slice_caps_what_its_processes_ask_and_admission_refuses_what_does_not_fit() {
    let w = World::new(1, "16Gi");
    w.cli_ok(&[
        "slice",
        "create",
        "op",
        "--memory",
        "2Gi",
        "--compute",
        "0.5",
    ]);

    // The process asks for 8Gi in the operator's 2Gi slice: it gets 2Gi.
    let r = run_json(w.wrapped_burn().envs(in_slice("op", "8Gi")).args([
        "--alloc",
        "1Gi,1Gi,1Gi",
        "--json",
    ]));
    assert_eq!(r["allocated_bytes"], 2 * GI, "{r}");
    assert_eq!(
        r["alloc_errors"],
        serde_json::json!([2]),
        "the third GiB is out of memory: {r}"
    );
    assert_eq!(
        r["mem"]["start"]["total"],
        2 * GI,
        "cuMemGetInfo shows the operator's quota: {r}"
    );

    // The operator is told why a request was overridden, but a process that asks for nothing
    // joins the slice silently.
    let asked = w
        .wrapped_burn()
        .envs(in_slice("op", "8Gi"))
        .args(["--alloc", "1Mi"])
        .output()
        .unwrap();
    let warned = String::from_utf8_lossy(&asked.stderr);
    assert!(
        warned.contains("already exists") && warned.contains("8 GiB"),
        "{warned}"
    );
    let plain = w
        .wrapped_burn()
        .env("GPUSLICE_SLICE", "op")
        .args(["--alloc", "1Mi"])
        .output()
        .unwrap();
    let quiet = String::from_utf8_lossy(&plain.stderr);
    assert!(
        plain.status.success() && !quiet.contains("gpuslice:"),
        "{quiet}"
    );

    let ls = run_json(w.gpuslice().args(["slice", "ls", "--json"]));
    let op = &ls["slices"][0];
    assert_eq!(
        (op["name"].as_str(), op["memory_limit"].as_u64()),
        (Some("op"), Some(2 * GI)),
        "{ls}"
    );
    assert_eq!(op["compute_share"], 0.5, "{ls}");
    assert_eq!(op["memory_used"], 0, "the burn has exited: {ls}");

    // Memory that does not fit: 2Gi are reserved of 16Gi, 15Gi is refused with both numbers.
    let (code, err) = fails(&w, &["slice", "create", "big", "--memory", "15Gi"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("requested") && err.contains("available"),
        "{err}"
    );
    assert!(
        err.contains("15") && err.contains("14"),
        "names 15 GiB requested and 14 GiB available: {err}"
    );
    // Compute guarantees past 1.0 are refused too.
    let greedy = [
        "slice",
        "create",
        "greedy",
        "--memory",
        "1Gi",
        "--compute",
        "0.6",
    ];
    let (code, err) = fails(&w, &greedy);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("requested") && err.contains("available"),
        "{err}"
    );
    // What fits still fits, and rm frees it for others.
    w.cli_ok(&["slice", "create", "big", "--memory", "14Gi"]);
    w.cli_ok(&["slice", "rm", "big"]);
    let ls = run_json(w.gpuslice().args(["slice", "ls", "--json"]));
    assert_eq!(ls["slices"].as_array().unwrap().len(), 1, "{ls}");
    let st = w.status();
    assert_eq!(st["devices"][0]["memory_reserved"], 2 * GI, "{st}");
    assert_eq!(st["devices"][0]["compute_reserved"], 0.5, "{st}");
    let (code, err) = fails(&w, &["slice", "rm", "nosuch"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nosuch"), "{err}");
}

/// Run `gpuslice ARGS`, expected to fail: its exit status and stderr.
fn fails(w: &World, args: &[&str]) -> (Option<i32>, String) {
    let out = w.gpuslice().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gpuslice ARGS` is bad usage: exit status 2 and one `gpuslice:` message that contains
/// `says` and the usage line.
fn bad_usage(w: &World, args: &[&str], says: &str) {
    let (code, err) = fails(w, args);
    assert_eq!(code, Some(2), "gpuslice {args:?}: {err}");
    assert!(
        err.starts_with("gpuslice: ") && err.contains(says) && err.contains("usage: gpuslice"),
        "gpuslice {args:?}: {err}"
    );
}

#[test]
fn help_prints_the_usage_on_stdout_exits_0_and_touches_nothing() {
    let w = World::new(1, "16Gi");
    for line in [
        "--help",
        "status --help",
        "metrics -h",
        "top --help",
        "slice --help",
        "slice create --help",
        "slice create x --memory 1Gi -h",
        "slice set x --help",
        "slice rm -h",
        "slice ls --help",
        "run --help",
        "run --memory 1Gi --help",
        "cdi --help",
        "monitor --help",
    ] {
        let out = w.cli_ok(&words(line));
        assert!(out.starts_with("usage: gpuslice"), "gpuslice {line}: {out}");
    }
    let made: Vec<_> = std::fs::read_dir(w.runtime_dir()).unwrap().collect();
    assert!(made.is_empty(), "--help made {made:?}");
}

#[test]
fn bad_usage_exits_2_with_a_usage_line_and_other_failures_exit_1_naming_what_failed() {
    let w = World::new(1, "16Gi");
    for line in [
        "",
        "frobnicate",
        "status --yaml",
        "status extra",
        "metrics --bogus",
        "top --interval fast",
        "monitor --metrics-listen 9400",
        "monitor --metrics-listen",
        "slice",
        "slice explode",
        "slice create x",
        "slice create x --memory 12XB",
        "slice create x --memory -1",
        "slice create x --memory 1Gi --compute 1.5",
        "slice rm",
        // Bad usage everywhere: a device of the wrong form, a quota of 0 (the shim's rule for
        // GPUSLICE_MEMORY too), a repeated flag, arguments to `version`.
        "slice create x --memory 1Gi --device -1",
        "slice create x --memory 0",
        "slice create x --memory 1Gi --memory 2Gi",
        "version extra",
        "top --interval 500 --interval 600",
        "monitor --interval 100 --interval 200",
        "monitor --metrics-listen a:1 --metrics-listen a:1",
    ] {
        bad_usage(&w, &words(line), "");
    }
    let (_, err) = fails(&w, &["slice", "create", "x", "--memory", "12XB"]);
    assert!(err.contains("--memory") && err.contains("12XB"), "{err}");
    // The ledger's rules, as the shim and `run` apply them: names, caps, cap vs share.
    bad_usage(
        &w,
        &["slice", "create", "a b", "--memory", "1Gi"],
        "NAME=\"a b\"",
    );
    for (line, says) in [
        ("slice create pid-3 --memory 1Gi", "NAME=\"pid-3\""),
        (
            "slice create x --memory 1Gi --compute-cap 0",
            "--compute-cap",
        ),
        (
            "slice create x --memory 1Gi --compute 0.5 --compute-cap 0.25",
            "--compute=\"0.5\"",
        ),
    ] {
        bad_usage(&w, &words(line), says);
    }

    // A device that does not exist is an error naming it.
    let (code, err) = fails(
        &w,
        &["slice", "create", "x", "--memory", "1Gi", "--device", "7"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains('7'), "{err}");
    // A port that is taken is an error naming the address.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let (code, err) = fails(&w, &["monitor", "--metrics-listen", &addr]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&addr), "{err}");
}

/// The ledger file in a world's runtime directory (whatever the ledger crate names it).
fn ledger_file(w: &World) -> std::path::PathBuf {
    std::fs::read_dir(w.runtime_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            !n.starts_with("monitor.") && p.is_file()
        })
        .expect("a ledger file")
}

#[test]
fn a_corrupt_ledger_is_a_clear_error_and_the_monitor_keeps_running() {
    let w = World::new(1, "16Gi");
    // Create a real ledger, then break its magic.
    w.cli_ok(&["slice", "create", "op", "--memory", "1Gi"]);
    let path = ledger_file(&w);
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all(b"NOTALEDG").unwrap();
    drop(f);

    let (code, err) = fails(&w, &["status", "--json"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&*path.to_string_lossy()),
        "names the file: {err}"
    );

    let (mut m, mut lines) = monitor_saying(&w, &["monitor"]);
    let said = wait_for(20, "the monitor to report the broken ledger", || {
        let l = lines.next()?.ok()?;
        l.contains(&*path.to_string_lossy()).then_some(l)
    });
    assert!(said.contains("gpuslice monitor:"), "{said}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        m.try_wait().unwrap().is_none(),
        "the monitor keeps running through a bad ledger"
    );
    // The operator removes the broken file: the monitor makes a fresh ledger and says so.
    std::fs::remove_file(&path).unwrap();
    wait_for(20, "the monitor to recover", || {
        let l = lines.next()?.ok()?;
        l.contains("usable again").then_some(())
    });
    let st = w.status();
    assert_eq!(st["slices"], serde_json::json!([]), "{st}");
    assert_eq!(
        st["devices"][0]["memory_total"],
        16 * GI,
        "registered from NVML: {st}"
    );
    // SIGTERM: a clean stop, exit 0.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(m.id() as i32, libc::SIGTERM) };
    let st = wait_for(10, "the monitor to stop on SIGTERM", || {
        m.try_wait().unwrap()
    });
    assert_eq!(st.code(), Some(0));
}

#[test]
fn the_monitor_serves_prometheus_text_over_http() {
    let w = World::new(1, "16Gi");
    let (mut m, mut lines) = monitor_saying(&w, &["monitor", "--metrics-listen", "127.0.0.1:0"]);
    let url = wait_for(20, "the monitor to say where it serves metrics", || {
        let l = lines.next()?.ok()?;
        l.split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(str::to_string)
    });
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let (_b, _) = start_burn(&w, "gamma", "1Gi", "256Mi");
    let body = wait_for(10, "the slice in the metrics", || {
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        // The audit (NVML's view of the slice's processes) runs once a second.
        out.contains("gpuslice_slice_memory_observed_bytes{slice=\"gamma\"")
            .then_some(out)
    });
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("# TYPE gpuslice_build_info gauge"), "{body}");
    assert!(
        body.contains("gpuslice_slice_memory_used_bytes{slice=\"gamma\""),
        "{body}"
    );
    let used = body
        .lines()
        .find(|l| l.starts_with("gpuslice_slice_memory_used_bytes{slice=\"gamma\""))
        .unwrap();
    assert!(used.ends_with(" 268435456"), "{used}");
    let line = |prefix: &str| {
        body.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {body}"))
            .to_string()
    };
    // NVML sees what the ledger accounts plus the process's context, which no quota counts
    // (docs/fakegpu.md): the slice is within its quota.
    let held = format!(" {}", 256 * MI + fake_context_bytes(16 * GI));
    let observed = line("gpuslice_slice_memory_observed_bytes{slice=\"gamma\"");
    assert!(observed.ends_with(&held), "{observed}");
    assert!(line("gpuslice_slice_over_quota{slice=\"gamma\"").ends_with(" 0"));
    assert!(line("gpuslice_device_memory_observed_bytes{").ends_with(&held));
    let _ = m.kill();
    let _ = m.wait();
}

#[test]
fn a_stale_lock_file_is_not_a_running_monitor() {
    // `status` finds the monitor by its lock, not by a pid file that may outlive it.
    let w = World::new(1, "1Gi");
    std::fs::write(w.runtime_dir().join("monitor.lock"), "999999\n").unwrap();
    let text = w.cli_ok(&["status"]);
    assert!(text.contains("monitor not running"), "{text}");
}

#[test]
fn status_and_metrics_show_the_compute_a_slice_uses() {
    let w = World::new(1, "16Gi");
    let _burn = Proc(
        w.wrapped_burn()
            .env("GPUSLICE_SLICE", "busy")
            .env("GPUSLICE_COMPUTE", "0.5")
            .args(["--seconds", "20", "--json"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Alone on the device, the slice uses it (loosely: well above nothing).
    let st = wait_for(20, "the busy slice to use the device", || {
        let st = w.status();
        let s = st["slices"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "busy")?;
        (s["compute_used"].as_f64()? > 0.2).then_some(st.clone())
    });
    let busy = slice_named(&st, "busy");
    assert_eq!(busy["compute_share"], 0.5, "{st}");
    assert_eq!(busy["compute_cap"], 1.0, "{st}");
    assert!(busy["compute_used"].as_f64().unwrap() <= 1.0, "{st}");
    assert_eq!(st["devices"][0]["compute_reserved"], 0.5, "{st}");
    let out = w.gpuslice().arg("metrics").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let launches = text
        .lines()
        .find(|l| l.starts_with("gpuslice_slice_launches_total{slice=\"busy\""))
        .unwrap_or_else(|| panic!("{text}"));
    let n: f64 = launches.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n > 0.0, "{launches}");
}
