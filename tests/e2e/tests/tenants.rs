//! Tenants against each other (issue #10, docs/security.md): a root monitor in node mode and
//! unprivileged users (`setpriv` to uids that exist nowhere else), each trying what the issue
//! measured on the old main. Every test needs root (to be the node's root and to become other
//! users); without root it prints why and passes vacuously. CI runs as root.
//!
//! The node world is `gpuslice_e2e::node` (shared with `turns.rs`, compute in node mode); hostile
//! tenants that do more than a CUDA program can are this test binary run again as another user
//! with `TENANTS_CHILD` set (see `tenant_child`).

use gpuslice_e2e::need_root;
use gpuslice_e2e::node::*;
use gpuslice_e2e::World;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The first items: a tenant truncating or scribbling over every file it can open in
/// the runtime directory (on main: SIGBUS for every wrapped process, quotas raised and cut)
/// harms no other tenant's running or new process and cannot raise its own quota, even when
/// it also scribbles over every word of its own slice's region.
#[test]
fn a_tenant_scribbling_everything_it_can_open_harms_no_one_else() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let a = holder_in(&n, TENANT_A, ("a", "2Gi"), "1Gi", "6");
    // B: the files in the directory (truncate, overwrite, append), then its own region.
    let o = n.child(TENANT_B, "scribble-files").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = n.child(TENANT_B, "scribble-region").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // A is still running and holding; its quota is what it was.
    let s = n.status();
    assert_eq!(slice_named(&s, "a")["memory_limit"], 2u64 << 30, "{s:#}");
    let out = a.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "A's running process was harmed: {}",
        text(&out)
    );
    assert_eq!(burn_json(&out)["allocated_bytes"], 1u64 << 30);
    // A's new process: admitted, held to its quota (its context, 512 MiB, inside it).
    let o = n.allocate(TENANT_A, &in_slice("a2", "2Gi"), "512Mi,512Mi,512Mi,512Mi");
    let r = burn_json(&o);
    assert_eq!(r["allocated_bytes"], 1536u64 << 20, "{}", text(&o));
    // B's own quota cannot be raised: a fresh B process gets exactly what it asks (its quota
    // less its context).
    let o = n.allocate(TENANT_B, &in_slice("b", "1Gi"), "512Mi,512Mi,512Mi");
    assert_eq!(
        burn_json(&o)["allocated_bytes"],
        512u64 << 20,
        "{}",
        text(&o)
    );
    assert!(
        n.monitor.is_some() && n.cli(0, &["status"]).status.success(),
        "{}",
        n.monitor_log()
    );
}

/// Symlink plants: a directory a tenant controls is refused by root (the lock or log it links
/// elsewhere is never followed, truncated or written); a directory writable by others too.
#[test]
fn root_refuses_a_runtime_dir_a_tenant_controls() {
    need_root!();
    let w = World::new(1, "16Gi");
    let base = w.fake_state_dir().parent().unwrap().to_path_buf();
    let target = base.join("root-only");
    std::fs::write(&target, "precious\n").unwrap();
    chmod(&target, 0o600);
    let planted = base.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::symlink(&target, planted.join("monitor.lock")).unwrap();
    std::os::unix::fs::symlink(&target, planted.join("monitor.log")).unwrap();
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: valid paths; lchown does not follow the links.
    unsafe {
        libc::chown(c(&planted).as_ptr(), TENANT_A, TENANT_A);
        libc::lchown(
            c(&planted.join("monitor.lock")).as_ptr(),
            TENANT_A,
            TENANT_A,
        );
        libc::lchown(c(&planted.join("monitor.log")).as_ptr(), TENANT_A, TENANT_A);
    }
    for args in [&["monitor"][..], &["run", "--", "true"]] {
        let o = w
            .gpuslice()
            .args(args)
            .env("GPUSLICE_RUNTIME_DIR", &planted)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        // `monitor` fails; `run` says why it cannot start one (and runs the command, whose
        // CUDA start-up would refuse the directory the same way).
        if args[0] == "monitor" {
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        }
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("owned by uid {TENANT_A}")),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
    // Writable by others (the old mode 1777): refused even when root owns it.
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o1777);
    let o = w
        .gpuslice()
        .arg("monitor")
        .env("GPUSLICE_RUNTIME_DIR", &open)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("writable by group or others"));
}

/// The operator CLI refuses tenants (exit 1, a clear message), works for root and for members
/// of the operator group.
#[test]
fn the_operator_cli_refuses_tenants() {
    need_root!();
    let (group, have_group) = (OPERATOR_GROUP, operator_group());
    let n = Node::new(1, "16Gi", &["--operator-group", group]);
    let o = n.cli(0, &["slice", "create", "ops", "--memory", "2Gi"]);
    assert!(o.status.success(), "{}", text(&o));
    for args in [
        &["slice", "create", "hog", "--memory", "100%"][..],
        &["slice", "rm", "ops"],
        &["slice", "set", "ops", "--memory", "8Gi"],
    ] {
        let o = n.cli(TENANT_A, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("permission denied") && err.contains(group),
            "{args:?}: {err}"
        );
    }
    // An operator slice given to one user: another user's process cannot join it.
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            "owned",
            "--memory",
            "1Gi",
            "--owner",
            &TENANT_A.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = n.allocate(TENANT_B, &[("GPUSLICE_SLICE", "owned")], "1Mi");
    assert_eq!(burn_json(&o)["error"]["call"], "cuInit", "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("belongs to uid {TENANT_A}")),
        "{}",
        text(&o)
    );
    let o = n.allocate(TENANT_A, &[("GPUSLICE_SLICE", "owned")], "1Mi");
    assert_eq!(burn_json(&o)["allocated_bytes"], 1u64 << 20, "{}", text(&o));
    assert!(n.cli(0, &["slice", "rm", "owned"]).status.success());
    let s = n.status();
    let names: Vec<&str> = s["slices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    // The tenants' attempts changed nothing ("owned" may linger until its process is reaped).
    assert!(names.contains(&"ops") && !names.contains(&"hog"), "{s:#}");
    if have_group {
        // Another tenant, a member of the operator group.
        let o = n
            .command_as(TENANT_B, Some(OPERATOR_GID), "gpuslice")
            .args(["slice", "create", "team", "--memory", "1Gi"])
            .output()
            .unwrap();
        assert!(o.status.success(), "an operator was refused: {}", text(&o));
        // ... who changes a slice live through the monitor (the policy is read-only to it).
        let o = n
            .command_as(TENANT_B, Some(OPERATOR_GID), "gpuslice")
            .args(["slice", "set", "ops", "--memory", "3Gi", "--compute", "0.2"])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "an operator's set was refused: {}",
            text(&o)
        );
        let s = n.status();
        let ops = slice_named(&s, "ops");
        assert_eq!(ops["memory_limit"], 3u64 << 30, "{s:#}");
        assert_eq!(ops["compute_share"], 0.2, "{s:#}");
    } else {
        println!("groupadd unavailable: the operator-group half was not run");
    }
}

/// One user cannot squat the process table: past its limit its processes are refused with a
/// message naming the limit, and another user's still start. One process cannot take more
/// than one record however often it asks.
#[test]
fn one_user_cannot_squat_the_process_slots() {
    need_root!();
    let n = Node::new(1, "16Gi", &["--max-procs-per-user", "3"]);
    let mut held: Vec<Child> = (0..3)
        .map(|_| holder(&n, TENANT_A, &[("GPUSLICE_SLICE", "squat")], "1Mi", "20"))
        .collect();
    wait_for_slice(&n, "squat", 3);
    let o = n.allocate(TENANT_A, &[], "1Mi");
    let r = burn_json(&o);
    assert_eq!(r["error"]["call"], "cuInit", "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("its limit"),
        "{}",
        text(&o)
    );
    let o = n.allocate(TENANT_B, &[], "1Mi");
    assert_eq!(burn_json(&o)["allocated_bytes"], 1u64 << 20, "{}", text(&o));
    let o = n.child(TENANT_B, "admit-twice").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    kill_all(&mut held);
}

/// A tenant's process stopped (SIGSTOP) while it holds memory delays no other tenant: in node
/// mode tenants never take the policy's lock, and a slice's hot-path words are its own; others
/// start, allocate, exit and are reaped while it stays stopped.
#[test]
fn a_stopped_tenant_delays_no_one() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let a = holder_in(&n, TENANT_A, ("a", "1Gi"), "512Mi", "30");
    let pid = a.id() as i32;
    // SAFETY: our child (setpriv exec'd into the burn, same pid).
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let t0 = Instant::now();
    for _ in 0..3 {
        let o = n.allocate(TENANT_B, &in_slice("b", "1Gi"), "256Mi");
        assert_eq!(
            burn_json(&o)["allocated_bytes"],
            256u64 << 20,
            "{}",
            text(&o)
        );
    }
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "three short processes took {:?} beside a stopped one",
        t0.elapsed()
    );
    // B's exited processes are reaped: slice b goes away while A is still stopped.
    wait_slice_gone(&n, "b");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = a.wait_with_output();
}

/// The audit catches a process that bypasses the shim (`GPUSLICE_DISABLE=1`) and allocates
/// past its slice's quota: reported in `status --json` and metrics, and with
/// `--on-violation kill` ended.
#[test]
fn the_audit_reports_and_kills_a_bypass() {
    need_root!();
    for kill in [false, true] {
        let mode: &[&str] = if kill {
            &[]
        } else {
            &["--on-violation", "report"]
        };
        let n = Node::new(1, "16Gi", mode);
        let o = n.cli(0, &["slice", "create", "team", "--memory", "1Gi"]);
        assert!(o.status.success(), "{}", text(&o));
        let mut c = holder(
            &n,
            TENANT_A,
            &[("GPUSLICE_SLICE", "team"), ("GPUSLICE_DISABLE", "1")],
            "2Gi",
            "20",
        );
        let found = wait_status(&n, 20, "a violation reported", |s| {
            let v = s["violations"].as_array().unwrap().clone();
            (!v.is_empty()).then_some(v)
        });
        assert_eq!(found[0]["slice"], "team");
        assert!(found[0]["observed"].as_u64().unwrap() >= 2u64 << 30);
        let m = String::from_utf8_lossy(&n.cli(0, &["metrics"]).stdout).into_owned();
        assert!(
            m.lines()
                .any(|l| l.starts_with("gpuslice_slice_violations_total{") && l.ends_with(" 1")),
            "{m}"
        );
        if kill {
            let t1 = Instant::now();
            let status = loop {
                if let Some(st) = c.try_wait().unwrap() {
                    break st;
                }
                assert!(
                    t1.elapsed() < Duration::from_secs(10),
                    "--on-violation kill did not end it\n{}",
                    n.monitor_log()
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        } else {
            assert!(c.try_wait().unwrap().is_none(), "report mode must not kill");
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Memory enforcement keeps working while the monitor is down (running processes keep their
/// mappings); a restarted monitor finds the regions again from the processes that hold them,
/// so usage and reaping go on where they were.
#[test]
fn enforcement_survives_the_monitor_and_a_restart_recovers_regions() {
    need_root!();
    let mut n = Node::new(1, "16Gi", &[]);
    // 2 GiB: each process's context (512 MiB on the fake) is inside the quota.
    let env = in_slice("a", "2Gi");
    let h = holder_in(&n, TENANT_A, ("a", "2Gi"), "512Mi", "8");
    // A second process of the slice: waits 2 s, then allocates 512 MiB pieces (up to 8 live)
    // for 2 s, while the monitor is gone.
    let mut c = n.burn(TENANT_A);
    c.args([
        "--hold",
        "2",
        "--alloc-loop",
        "--alloc",
        "512Mi",
        "--seconds",
        "2",
        "--json",
    ]);
    for (k, v) in env {
        c.env(k, v);
    }
    let looper = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_slice(&n, "a", 2);
    n.stop_monitor();
    // Meanwhile a new process cannot be admitted: it retries briefly, then fails `cuInit` with
    // a line naming the socket.
    let t = Instant::now();
    let o = n.allocate(TENANT_B, &[], "1Mi");
    assert_eq!(burn_json(&o)["error"]["call"], "cuInit", "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("monitor.sock")
            && t.elapsed() < Duration::from_secs(30),
        "{}",
        text(&o)
    );
    let o = looper.wait_with_output().unwrap();
    let r = burn_json(&o);
    let l = &r["alloc_loop"];
    assert!(
        l["allocs"].as_u64().unwrap() > 0 && l["out_of_memory"].as_u64().unwrap() > 0,
        "with the monitor down, the quota still holds (some allocations fit, the rest are \
         refused): {}",
        text(&o)
    );
    n.start_monitor();
    wait_status(&n, 10, "the restarted monitor sees slice a's usage", |s| {
        let used = slices_named(s, "a")
            .next()
            .map(|x| x["memory_used"].as_u64().unwrap_or(0));
        (used == Some(1 << 30)).then_some(()) // its 512 MiB and its context
    });
    let out = h.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // After it exits, the restarted monitor reaps it and the slice goes.
    wait_slice_gone(&n, "a");
}

/// A container-like tenant: its own PID namespace (`unshare --pid`), as another user. The
/// monitor admits it by what the kernel says (`SO_PEERCRED`), shows the pid it has inside
/// (`NSpid`), tells it is alive by its host pid and start time, and reaps it after it exits.
/// The tenant's `status` sees the node's monitor through the socket.
#[test]
fn a_tenant_in_its_own_pid_namespace_is_admitted_and_reaped() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let burn = n.burn(TENANT_A);
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(burn.get_program())
        .args(burn.get_args())
        .args(["--alloc", "256Mi", "--hold", "3", "--json"])
        .envs(in_slice("boxed", "1Gi"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in burn.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let child = c.spawn().unwrap();
    wait_for_slice(&n, "boxed", 1);
    let s = n.status();
    let p = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["slice"] == "boxed")
        .unwrap_or_else(|| panic!("{s:#}"))
        .clone();
    assert_eq!(p["pid"], 1, "the pid it has in its own namespace: {s:#}");
    assert_eq!(p["alive"], true);
    // The tenant's own view: the policy read-only, the monitor found through its socket.
    let o = n.cli(TENANT_B, &["status"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("monitor running") && out.contains("boxed"),
        "{out}"
    );
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        burn_json(&o)["allocated_bytes"],
        256u64 << 20,
        "{}",
        text(&o)
    );
    wait_slice_gone(&n, "boxed");
}

/// NVML-only processes' view: a read-only descriptor of the asker's own slice's region, and
/// nobody else's.
#[test]
fn a_view_is_read_only_and_only_of_ones_own_slice() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let mut a = holder(&n, TENANT_A, &in_slice("mine", "1Gi"), "1Mi", "20");
    let mut b = holder(&n, TENANT_B, &in_slice("theirs", "1Gi"), "1Mi", "20");
    wait_for_slice(&n, "mine", 1);
    wait_for_slice(&n, "theirs", 1);
    let o = n.child(TENANT_A, "view").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    kill_all([&mut a, &mut b]);
}

/// Best-effort processes (no quota) of different users do not share one pool: each user's
/// pool is held to a grant the monitor splits fairly, so a tenant that claims its pool holds
/// everything starves no other user's best-effort processes.
#[test]
fn best_effort_users_cannot_starve_each_other() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let mut a = holder(&n, TENANT_A, &[("GPUSLICE_SLICE", "a-be")], "4Gi", "20");
    wait_for_slice(&n, "a-be", 1);
    let mut b = n
        .child(TENANT_B, "scribble-pool")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut line = String::new();
        let mut out = std::io::BufReader::new(b.stdout.as_mut().unwrap());
        while !line.contains("ready") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the hostile tenant died"
            );
        }
    }
    std::thread::sleep(Duration::from_millis(600)); // several monitor ticks
    let o = n.allocate(TENANT_A, &[("GPUSLICE_SLICE", "a-be2")], "2Gi");
    assert_eq!(
        burn_json(&o)["allocated_bytes"],
        2u64 << 30,
        "another user's scribbled pool starved this one: {}\n{}",
        text(&o),
        n.monitor_log()
    );
    kill_all([&mut a, &mut b]);
}

/// `gpuslice run` by a tenant on a node: no monitor of its own (the node's serves it), the
/// program admitted through the socket and held to the quota asked for.
#[test]
fn gpuslice_run_by_a_tenant_uses_the_nodes_monitor() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let o = n
        .command(TENANT_A, "gpuslice")
        .args(["run", "--memory", "1536Mi", "--compute", "0.5", "--"])
        .arg(n.bin.join("gpuslice-burn"))
        .args(["--alloc", "512Mi,512Mi,512Mi", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(burn_json(&o)["allocated_bytes"], 1u64 << 30, "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("could not start"), "{}", text(&o));
    // Compute turns are the monitor's in node mode: no warning about them any more.
    assert!(!err.contains("unthrottled"), "{}", text(&o));
}

/// A tenant's own monitor (`gpuslice run` without `GPUSLICE_RUNTIME_DIR`) lives in the
/// tenant's own directory, never in the node's: it cannot stand in the way of root's monitor.
#[test]
fn a_tenant_started_monitor_lives_in_its_own_directory() {
    need_root!();
    let node_dir = Path::new(gpuslice_ledger::DEFAULT_RUNTIME_DIR);
    if node_dir.exists() {
        println!(
            "skipped: {} exists on this machine (a node)",
            node_dir.display()
        );
        return;
    }
    let n = Node::new(1, "16Gi", &[]);
    let own = PathBuf::from(format!(
        "{}-{TENANT_A}",
        gpuslice_ledger::DEFAULT_RUNTIME_DIR
    ));
    let _ = std::fs::remove_dir_all(&own);
    let o = n
        .command(TENANT_A, "gpuslice")
        .env_remove("GPUSLICE_RUNTIME_DIR")
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(!node_dir.exists(), "a tenant created the node's directory");
    use std::os::unix::fs::MetadataExt;
    let m =
        std::fs::metadata(&own).unwrap_or_else(|e| panic!("{}: {e}: {}", own.display(), text(&o)));
    assert_eq!(m.uid(), TENANT_A);
    assert_eq!(m.mode() & 0o077, 0, "the personal directory is private");
    // End the tenant's monitor (its pid is in its lock) and clean up.
    if let Ok(pid) = std::fs::read_to_string(own.join("monitor.lock")) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            // SAFETY: the pid the tenant's monitor wrote into its own lock file.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let _ = std::fs::remove_dir_all(&own);
}

/// Capacity without an attacker: 512 unnamed processes on a 16-GPU fake run at once.
#[test]
fn five_hundred_twelve_unnamed_processes_on_sixteen_gpus() {
    // Every burn uses device 0, and each context takes 512 MiB there (docs/fakegpu.md), as on
    // a GPU: 512 contexts need 256 GiB. The fake's memory costs nothing until touched.
    let w = World::new(16, "320Gi");
    let mut kids = vec![];
    for _ in 0..512 {
        kids.push(
            w.wrapped_burn()
                .args(["--alloc", "1Mi", "--hold", "60", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    // All 512 attached at once (each holds its allocation for up to a minute).
    let t0 = Instant::now();
    loop {
        let o = w.gpuslice().args(["status", "--json"]).output().unwrap();
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let alive = s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["alive"] == true)
            .count();
        if alive == 512 {
            break;
        }
        let failed: Vec<String> = kids
            .iter_mut()
            .filter_map(|k| {
                k.try_wait().unwrap().map(|st| {
                    use std::io::Read;
                    let mut e = String::new();
                    let _ = k.stderr.take().map(|mut r| r.read_to_string(&mut e));
                    format!("{st:?}: {e}")
                })
            })
            .collect();
        assert!(
            failed.is_empty() && t0.elapsed() < Duration::from_secs(300),
            "{alive} of 512 alive after {:?}; exited: {failed:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for k in &mut kids {
        let _ = k.kill();
    }
    for k in &mut kids {
        let _ = k.wait();
    }
}

/// A slice made with a join secret (docs/security.md, "Who may join a slice"): a process of
/// any other user that names it without the secret, or with a wrong one, is refused at
/// `cuInit` with a line saying so; with the secret it is admitted and held to the slice's
/// quota; root joins without. The secret is nowhere a tenant can read, and a restarted
/// monitor keeps it. An operator-group member makes one through the monitor; in a personal
/// runtime directory secrets are refused (they would protect nothing).
#[test]
fn a_secret_slice_admits_only_with_its_secret() {
    need_root!();
    let (group, have_group) = (OPERATOR_GROUP, operator_group());
    let mut n = Node::new(1, "16Gi", &["--operator-group", group]);
    let file = n.root().join("sec.secret");
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            "sec",
            "--memory",
            "1Gi",
            "--new-secret-file",
            file.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("GPUSLICE_SLICE_SECRET"),
        "{}",
        text(&o)
    );
    let secret = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Nowhere a tenant reads: not in the policy; the secrets file is root's, 0600.
    let policy = std::fs::read(n.world.runtime_dir().join("ledger")).unwrap();
    assert!(!policy.windows(secret.len()).any(|w| w == secret.as_bytes()));
    let sf = std::fs::metadata(n.world.runtime_dir().join("slice-secrets")).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&sf),
            sf.permissions().mode() & 0o777
        ),
        (0, 0o600)
    );
    // A process of `uid` allocating `alloc` in slice "sec", with `secret` if any.
    let in_sec = |n: &Node, uid: u32, secret: Option<&str>, alloc: &str| {
        let mut env = vec![("GPUSLICE_SLICE", "sec")];
        env.extend(secret.map(|s| ("GPUSLICE_SLICE_SECRET", s)));
        n.allocate(uid, &env, alloc)
    };
    let refused = |n: &Node, uid: u32, secret: Option<&str>, why: &str| {
        let o = in_sec(n, uid, secret, "1Mi");
        assert_eq!(burn_json(&o)["error"]["call"], "cuInit", "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("slice \"sec\" requires its secret") && err.contains(why),
            "{}",
            text(&o)
        );
        if let Some(s) = secret {
            assert!(!err.contains(s), "never echoed: {err}");
        }
    };
    // Its quota less its context (512 MiB).
    let admitted = |n: &Node, uid: u32, secret: Option<&str>| {
        let o = in_sec(n, uid, secret, "512Mi,1Mi");
        let v = burn_json(&o);
        assert_eq!(v["mem_total"], 1u64 << 30, "{}", text(&o));
        assert_eq!(v["allocated_bytes"], 512u64 << 20, "{}", text(&o));
        assert_eq!(v["alloc_errors"], serde_json::json!([2]), "{}", text(&o));
    };
    let wrong = "x".repeat(secret.len());
    refused(&n, TENANT_A, None, "GPUSLICE_SLICE_SECRET is not set");
    refused(&n, TENANT_A, Some(&wrong), "does not match");
    admitted(&n, TENANT_A, Some(&secret));
    admitted(&n, TENANT_B, Some(&secret));
    admitted(&n, 0, None);
    // A restarted monitor keeps the secret.
    n.stop_monitor();
    n.start_monitor();
    refused(&n, TENANT_B, None, "is not set");
    admitted(&n, TENANT_B, Some(&secret));
    // The operator CLI of a tenant cannot give itself the slice, or remove it.
    let o = n.cli(TENANT_A, &["slice", "rm", "sec"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    if have_group {
        // An operator-group member makes a secret slice through the monitor.
        let mine = n.root().join("team");
        std::fs::create_dir_all(&mine).unwrap();
        std::os::unix::fs::chown(&mine, Some(TENANT_B), Some(TENANT_B)).unwrap();
        let tfile = mine.join("team.secret");
        let o = n
            .command_as(TENANT_B, Some(OPERATOR_GID), "gpuslice")
            .args(["slice", "create", "team", "--memory", "1Gi"])
            .arg("--new-secret-file")
            .arg(&tfile)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let tsecret = std::fs::read_to_string(&tfile).unwrap().trim().to_string();
        let o = n.allocate(TENANT_A, &[("GPUSLICE_SLICE", "team")], "1Mi");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("slice \"team\" requires its secret"),
            "{}",
            text(&o)
        );
        let o = n.allocate(
            TENANT_A,
            &[
                ("GPUSLICE_SLICE", "team"),
                ("GPUSLICE_SLICE_SECRET", tsecret.as_str()),
            ],
            "1Mi",
        );
        assert_eq!(burn_json(&o)["allocated_bytes"], 1u64 << 20, "{}", text(&o));
    }
    // A personal runtime directory (a tenant's own): secrets are refused, nothing is made.
    let own = n.root().join("own");
    std::fs::create_dir_all(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(TENANT_A), Some(TENANT_A)).unwrap();
    chmod(&own, 0o700);
    let o = n
        .command(TENANT_A, "gpuslice")
        .env("GPUSLICE_RUNTIME_DIR", own.join("rt"))
        .args([
            "slice",
            "create",
            "p",
            "--memory",
            "1Gi",
            "--new-secret-file",
        ])
        .arg(own.join("p.secret"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("node mode only"),
        "{}",
        text(&o)
    );
    assert!(!own.join("p.secret").exists());
}

/// The hostile tenants (run as another user by the tests above). Not a test of its own: without
/// `TENANTS_CHILD` it returns at once.
#[test]
fn tenant_child() {
    serve_child(&[
        ("scribble-files", scribble_files),
        ("scribble-region", scribble_region),
        ("view", view),
        ("scribble-pool", scribble_pool),
        ("admit-twice", admit_twice),
    ]);
}

/// Child mode `scribble-files`, in the node's runtime directory `dir`.
fn scribble_files(dir: &Path) {
    // Every name in the directory: none may be opened for writing, truncated,
    // replaced or added to.
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        assert!(
            std::fs::OpenOptions::new().write(true).open(&p).is_err(),
            "{} opened for writing",
            p.display()
        );
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: c is a valid NUL-terminated path; truncate only reads it.
        let r = unsafe { libc::truncate(c.as_ptr(), 0) };
        assert_ne!(r, 0, "{}", p.display());
        assert!(std::fs::remove_file(&p).is_err(), "{} removed", p.display());
    }
    assert!(std::fs::write(dir.join("ledger.new"), b"x").is_err());
    assert!(std::os::unix::fs::symlink("/etc/passwd", dir.join("monitor.log2")).is_err());
    // The policy maps read-only, whatever is asked.
    let f = std::fs::File::open(dir.join("ledger")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a mapping attempt on our fd; the result is checked and unmapped.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_eq!(p, libc::MAP_FAILED, "the policy mapped writable");
}

/// Child mode `scribble-region`, in the node's runtime directory `dir`.
fn scribble_region(dir: &Path) {
    use std::sync::atomic::Ordering::SeqCst;
    let region = admitted_region(dir, Some("b-hostile"), Some(1 << 30), 0);
    // Truncation is impossible (sealed); scribble every word instead.
    // SAFETY: our fd; must fail.
    assert_ne!(unsafe { libc::ftruncate(region.fd(), 0) }, 0);
    let h = region.header();
    h.memory_used.store(u64::MAX, SeqCst);
    h.reaping.store(1, SeqCst);
    h.alloc_total.store(u64::MAX, SeqCst);
    for w in region.procs() {
        w.charged.store(u64::MAX / 3, SeqCst);
        w.ops_begun.store(7, SeqCst);
        w.ops_ended.store(3, SeqCst);
    }
}

/// Child mode `view`, in the node's runtime directory `dir`.
fn view(dir: &Path) {
    use gpuslice_ledger::region::Region;
    use gpuslice_protocol::{self as protocol, Why};
    let d = gpuslice_ledger::RuntimeDir::open(dir).unwrap();
    let l = gpuslice_ledger::Ledger::open(dir).unwrap();
    let snap = l.snapshot();
    let slice_of = |name: &str| {
        snap.slices
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no slice {name}: {snap:?}"))
            .index
    };
    let ask = |slice: usize| {
        protocol::exchange(
            d.fd(),
            protocol::View { slice },
            &[],
            Duration::from_secs(10),
        )
        .unwrap()
    };
    let (r, fds) = ask(slice_of("mine"));
    assert!(r.is_ok(), "{r:?}");
    let fd = fds.into_iter().next().expect("a descriptor");
    assert!(
        Region::from_fd(fd.try_clone().unwrap(), true).is_err(),
        "a view maps writable"
    );
    let v = Region::from_fd(fd, false).unwrap();
    assert!(
        v.header()
            .memory_used
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 1 << 20
    );
    let (r, fds) = ask(slice_of("theirs"));
    assert!(
        r.as_ref()
            .is_err_and(|e| e.why == Why::Denied && e.message.contains("not yours")),
        "{r:?}"
    );
    assert!(fds.is_empty());
}

/// Child mode `scribble-pool`, in the node's runtime directory `dir`.
fn scribble_pool(dir: &Path) {
    // A best-effort process that claims its pool holds everything.
    let region = admitted_region(dir, None, None, 0);
    region
        .header()
        .memory_used
        .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    println!("ready");
    std::thread::sleep(Duration::from_secs(8));
}

/// Child mode `admit-twice`, in the node's runtime directory `dir`.
fn admit_twice(dir: &Path) {
    use gpuslice_protocol as protocol;
    let (d, req) = admit_request(dir, None, None, 0);
    let r = protocol::ask(d.fd(), req.clone(), Duration::from_secs(10)).unwrap();
    assert!(r.is_ok(), "{r:?}");
    let r = protocol::ask(d.fd(), req, Duration::from_secs(10)).unwrap();
    assert!(
        r.is_err_and(|e| e.message.contains("admitted already")),
        "admitted twice"
    );
}
