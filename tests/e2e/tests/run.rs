//! `gpuslice run` through real processes: quotas reach the wrapped program, exit statuses and
//! signals pass through, a user's `LD_PRELOAD` survives, the monitor is started once, and bad
//! input (a flag, a value, a missing library) is exit 2 before anything starts.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpuslice_e2e::{artifact, in_slice, run_json, wait_for_file, World};

/// A world of one 16 GiB device for `gpuslice run`; the monitor a run starts in its ledger
/// directory is stopped when the test ends (the world's directory goes away, the daemon would
/// not).
struct RunWorld(World);

impl std::ops::Deref for RunWorld {
    type Target = World;
    fn deref(&self) -> &World {
        &self.0
    }
}

impl RunWorld {
    fn new() -> RunWorld {
        RunWorld(World::new(1, "16Gi"))
    }

    /// The pid in `monitor.lock` while someone holds that lock, as `gpuslice` tests it.
    fn monitor_pid(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        let lock = self.runtime_dir().join("monitor.lock");
        let f = std::fs::File::open(&lock).ok()?;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return None;
        }
        std::fs::read_to_string(&lock).ok()?.trim().parse().ok()
    }
}

impl Drop for RunWorld {
    fn drop(&mut self) {
        if let Some(pid) = self.monitor_pid() {
            // SAFETY: kill() on the pid that holds this test's private monitor lock.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let t0 = Instant::now();
            while self.monitor_pid().is_some() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// `gpuslice run ARGS...` in `world`.
fn run(world: &World, args: &[&str]) -> Command {
    let mut c = world.gpuslice();
    c.arg("run").args(args).stdin(Stdio::null());
    c
}

fn output(cmd: &mut Command) -> (i32, String, String) {
    // A binary copied by this test while another test thread forks is briefly open for writing
    // in that child (ETXTBSY until it execs): try again rather than fail.
    let mut tries = 0;
    let Output {
        status,
        stdout,
        stderr,
    } = loop {
        match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => break r.expect("spawn gpuslice"),
        }
    };
    let code = status
        .code()
        .unwrap_or_else(|| panic!("{cmd:?} was killed: {status:?}"));
    (
        code,
        String::from_utf8_lossy(&stdout).into(),
        String::from_utf8_lossy(&stderr).into(),
    )
}

fn burn() -> String {
    artifact("gpuslice-burn").display().to_string()
}

/// `gpuslice run RUN_ARGS -- gpuslice-burn BURN_ARGS` in `world`: burn's JSON report.
fn run_burn(world: &World, run_args: &[&str], burn_args: &[&str]) -> serde_json::Value {
    let b = burn();
    let args: Vec<&str> = [run_args, &["--", &b], burn_args].concat();
    run_json(&mut run(world, &args))
}

fn wait_for(path: &Path) {
    wait_for_file(path, || format!("{} never appeared", path.display()));
}

/// The C library this test process runs with: a real library that is harmless to preload.
fn libc_path() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .expect("libc in /proc/self/maps")
        .to_string()
}

#[test]
fn quota_is_enforced_on_a_wrapped_burn() {
    let world = RunWorld::new();
    let report = run_burn(
        &world,
        &["--memory", "1Gi"],
        &["--alloc", "512Mi,512Mi,512Mi", "--json"],
    );
    assert_eq!(report["allocated_bytes"], 1u64 << 30, "{report}");
    assert_eq!(report["alloc_errors"], serde_json::json!([2]), "{report}");
    // The device's memory is reported as the quota.
    assert_eq!(report["mem_total"], 1u64 << 30, "{report}");

    // Without gpuslice run, the same program gets all three.
    let free = run_json(
        world
            .burn()
            .args(["--alloc", "512Mi,512Mi,512Mi", "--json"]),
    );
    assert_eq!(free["allocated_bytes"], 3u64 << 29, "{free}");
}

#[test]
fn flags_reach_the_program_and_variables_apply_without_flags() {
    let world = RunWorld::new();
    let (code, out, err) = output(&mut run(
        &world,
        &[
            "--memory",
            "2Gi",
            "--compute",
            "0.25",
            "--compute-cap",
            "50%",
            "--slice",
            "team-a",
            "sh",
            "-c",
            "env | grep ^GPUSLICE_ | sort",
        ],
    ));
    assert_eq!(code, 0, "{err}");
    for want in [
        "GPUSLICE_MEMORY=2Gi",
        "GPUSLICE_COMPUTE=0.25",
        "GPUSLICE_COMPUTE_CAP=50%",
        "GPUSLICE_SLICE=team-a",
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "{want} missing from:\n{out}"
        );
    }
    // A variable already set applies when its flag is not given; a flag wins over it.
    let (_, out, _) = output(
        run(
            &world,
            &[
                "--memory",
                "3Gi",
                "sh",
                "-c",
                "echo $GPUSLICE_MEMORY $GPUSLICE_SLICE",
            ],
        )
        .envs(in_slice("from-env", "1Gi")),
    );
    assert_eq!(out.trim(), "3Gi from-env");
}

#[test]
fn exit_status_passes_through() {
    let world = RunWorld::new();
    for (script, want) in [
        ("exit 0", 0),
        ("exit 7", 7),
        ("exit 255", 255),
        ("kill -KILL $$", 128 + 9),
        ("kill -SEGV $$", 128 + 11),
    ] {
        let (code, _, err) = output(&mut run(&world, &["--", "sh", "-c", script]));
        assert_eq!(code, want, "sh -c {script:?}: {err}");
    }
    // A program that cannot be found: 127, as a shell says, and nothing else happens.
    let (code, _, err) = output(&mut run(&world, &["no-such-program-gpuslice"]));
    assert_eq!(code, 127, "{err}");
    assert!(
        err.contains("no-such-program-gpuslice") && err.contains("not found"),
        "{err}"
    );
    // Found but not executable: 126.
    let file = world.fake_state_dir().join("not-executable");
    std::fs::write(&file, "echo hi\n").unwrap();
    let (code, _, err) = output(&mut run(&world, &[file.to_str().unwrap()]));
    assert_eq!(code, 126, "{err}");
}

const FORWARDED: [(i32, &str); 6] = [
    (libc::SIGTERM, "TERM"),
    (libc::SIGINT, "INT"),
    (libc::SIGHUP, "HUP"),
    (libc::SIGQUIT, "QUIT"),
    (libc::SIGUSR1, "USR1"),
    (libc::SIGUSR2, "USR2"),
];

/// Start `gpuslice run -- sh -c SCRIPT` with the forwarded signals at their default action, as
/// in an interactive shell: the test may itself run under `nohup` or as a background job,
/// where SIGHUP or SIGINT are ignored, and an ignored signal stays ignored through the wrapper
/// (and cannot be trapped by `sh`).
fn spawn_with_default_signals(world: &World, script: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = run(world, &["--", "sh", "-c", script]);
    cmd.stderr(Stdio::null());
    // SAFETY: runs in the forked child before exec; signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for (sig, _) in FORWARDED {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn gpuslice run")
}

/// The exit status of `child`, failing (and killing it) if it does not end within 30 s.
fn wait_status(mut child: std::process::Child, what: &str) -> std::process::ExitStatus {
    gpuslice_e2e::wait_within(&mut child, Duration::from_secs(30), what)
}

#[test]
fn signals_are_forwarded_to_the_program() {
    let world = RunWorld::new();
    let dir = world.fake_state_dir();
    for (sig, name) in FORWARDED {
        // The program traps the signal and exits with a status naming it, once its trap is set.
        let ready = dir.join(format!("ready-{name}"));
        let script = format!(
            "trap 'exit {sig}' {name}; touch '{}'; while :; do sleep 0.05; done",
            ready.display()
        );
        let child = spawn_with_default_signals(&world, &script);
        wait_for(&ready);
        // SAFETY: kill() on the wrapper we just spawned.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = wait_status(child, &format!("SIG{name}"));
        assert_eq!(
            status.code(),
            Some(sig),
            "SIG{name} did not reach the program: {status:?}"
        );
    }
    // A program that does not catch SIGTERM dies of it: the wrapper exits 128+15.
    let ready = dir.join("ready-plain");
    let child = spawn_with_default_signals(
        &world,
        &format!("touch '{}'; exec sleep 60", ready.display()),
    );
    wait_for(&ready);
    std::thread::sleep(Duration::from_millis(100)); // let `exec sleep` happen
                                                    // SAFETY: kill() on the wrapper we just spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(
        wait_status(child, "SIGTERM").code(),
        Some(128 + libc::SIGTERM)
    );
}

/// A signal ignored when the wrapper starts (`nohup`) stays ignored for the program too.
#[test]
fn an_ignored_signal_stays_ignored() {
    use std::os::unix::process::CommandExt;
    let world = RunWorld::new();
    let ready = world.fake_state_dir().join("ready");
    let script = format!("touch '{}'; sleep 1; exit 3", ready.display());
    let mut cmd = run(&world, &["--", "sh", "-c", &script]);
    cmd.stderr(Stdio::null());
    // SAFETY: runs in the forked child before exec; signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    wait_for(&ready);
    // SAFETY: kill() on the wrapper we just spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    assert_eq!(wait_status(child, "nohup'd program").code(), Some(3));
}

#[test]
fn an_existing_ld_preload_is_kept() {
    let world = RunWorld::new();
    let ours = artifact("libgpuslice.so")
        .canonicalize()
        .unwrap()
        .display()
        .to_string();
    let user = libc_path();
    // The user's entry stays (after ours); one already naming libgpuslice.so is not doubled.
    let (code, out, err) = output(
        run(&world, &["sh", "-c", "printf %s \"$LD_PRELOAD\""])
            .env("LD_PRELOAD", format!("{user} {ours}")),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("{ours}:{user}"));
    // And the shim is really active next to it.
    let b = burn();
    let report = run_json(
        run(
            &world,
            &["--memory", "1Gi", &b, "--alloc", "768Mi,768Mi", "--json"],
        )
        .env("LD_PRELOAD", &user),
    );
    assert_eq!(report["allocated_bytes"], 768u64 << 20, "{report}");
    assert_eq!(report["alloc_errors"], serde_json::json!([2]), "{report}");
}

#[test]
fn the_monitor_is_started_once() {
    let world = RunWorld::new();
    assert_eq!(world.monitor_pid(), None);
    let (code, _, err) = output(&mut run(&world, &["true"]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("started the node monitor"), "{err}");
    let pid = world
        .monitor_pid()
        .expect("a monitor holds the lock after `gpuslice run`");
    let (code, _, err) = output(&mut run(&world, &["true"]));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("monitor"), "said it again: {err}");
    assert_eq!(
        world.monitor_pid(),
        Some(pid),
        "the same monitor keeps serving"
    );
}

/// Bad input: exit 2 and a message naming what was wrong, and nothing started (the program
/// never ran, no monitor).
#[test]
fn bad_flags_are_exit_2_before_anything_starts() {
    let world = RunWorld::new();
    let marker = world.fake_state_dir().join("ran");
    let touch = format!("touch '{}'", marker.display());
    for (args, says) in [
        (vec!["--memory", "12XB"], "12XB"),
        (vec!["--memory", "-1"], "--memory"),
        (vec!["--compute", "1.5"], "--compute"),
        (vec!["--compute-cap", "abc"], "--compute-cap"),
        (
            vec!["--compute", "0.5", "--compute-cap", "0.25"],
            "--compute-cap",
        ),
        (vec!["--slice", ""], "--slice"),
        (vec!["--slice", "pid-7"], "--slice"),
        (vec!["--compute-cap", "0"], "--compute-cap"),
        (
            vec!["--compute", "0=0.5", "--compute-cap", "0=0.4"],
            "--compute=\"0=0.5\"",
        ),
        (vec!["--bogus"], "--bogus"),
        // One rule for 0 with the shim's GPUSLICE_MEMORY and `slice create`: never a quota.
        (vec!["--memory", "0"], "quota of 0 bytes"),
        (vec!["--memory", "0=1Gi,1=0"], "quota of 0 bytes"),
        // A repeated flag is bad usage, never a silent choice of one value.
        (
            vec!["--memory", "1Gi", "--memory", "2Gi"],
            "--memory is given twice",
        ),
        (
            vec!["--slice", "a", "--slice", "b"],
            "--slice is given twice",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--", "sh", "-c", &touch]);
        let (code, _, err) = output(&mut run(&world, &all));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(says) && err.contains("usage: gpuslice run"),
            "{args:?}: {err}"
        );
    }
    let (code, _, err) = output(&mut run(&world, &[]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing the program"), "{err}");
    let (code, _, err) = output(&mut run(&world, &["--memory"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--memory"), "{err}");
    assert!(!marker.exists(), "the program ran");
    assert_eq!(world.monitor_pid(), None, "a monitor was started");
}

#[test]
fn a_missing_library_is_exit_2_with_what_to_do() {
    let world = RunWorld::new();
    // A gpuslice binary alone in a directory: neither beside it nor in ../lib.
    let lonely = world.fake_state_dir().join("bin");
    std::fs::create_dir_all(&lonely).unwrap();
    std::fs::copy(artifact("gpuslice"), lonely.join("gpuslice")).unwrap();
    let marker = world.fake_state_dir().join("ran");
    let touch = format!("touch '{}'", marker.display());
    let (code, _, err) = output(
        world
            .command(lonely.join("gpuslice"))
            .args(["run", "--", "sh", "-c", &touch]),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("libgpuslice.so not found") && err.contains("GPUSLICE_LIBRARY"),
        "{err}"
    );
    assert!(
        err.contains(&lonely.join("libgpuslice.so").display().to_string()),
        "{err}"
    );

    // GPUSLICE_LIBRARY names it: found; pointing nowhere: an error, not a fallback.
    let (code, _, err) = output(
        world
            .command(lonely.join("gpuslice"))
            .args(["run", "true"])
            .env("GPUSLICE_LIBRARY", artifact("libgpuslice.so")),
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = output(
        run(&world, &["sh", "-c", &touch]).env("GPUSLICE_LIBRARY", "/nonexistent/libgpuslice.so"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("GPUSLICE_LIBRARY=/nonexistent/libgpuslice.so"),
        "{err}"
    );
    assert!(!marker.exists(), "the program ran");
}

/// The install layout: PREFIX/bin/gpuslice finds PREFIX/lib/libgpuslice.so.
#[test]
fn an_installed_layout_finds_its_library() {
    let world = RunWorld::new();
    let prefix = world.fake_state_dir().join("prefix");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::copy(artifact("gpuslice"), prefix.join("bin/gpuslice")).unwrap();
    std::fs::copy(
        artifact("libgpuslice.so"),
        prefix.join("lib/libgpuslice.so"),
    )
    .unwrap();
    let (code, out, err) = output(world.command(prefix.join("bin/gpuslice")).args([
        "run",
        "sh",
        "-c",
        "printf %s \"$LD_PRELOAD\"",
    ]));
    assert_eq!(code, 0, "{err}");
    let want = prefix.join("lib/libgpuslice.so").canonicalize().unwrap();
    assert_eq!(out, want.display().to_string());
}

/// `scripts/demo.sh` runs to the end on the fake GPU and shows the shares, the out-of-memory
/// and the status (with this build's artifacts, a short share phase).
#[test]
fn demo_runs_to_the_end() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let profile = gpuslice_e2e::profile_dir();
    let out = Command::new("bash")
        .arg(repo.join("scripts/demo.sh"))
        .env("DEMO_BUILD_DIR", &profile)
        .env("DEMO_SECONDS", "3")
        .env_remove("LD_PRELOAD")
        .env_remove("GPUSLICE_RUNTIME_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/demo.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo.sh failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for want in [
        "tenant-a (share 25%)",
        "of the GPU",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "gpuslice status",
        "tenant-c",
        "done:",
    ] {
        assert!(
            stdout.contains(want),
            "{want:?} missing from the demo's output:\n{stdout}\n{stderr}"
        );
    }
    // It shows what it says: three allocations of one round (not the report's two lists of
    // them), the last refused.
    let allocations: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("allocation "))
        .collect();
    assert_eq!(allocations.len(), 3, "{stdout}");
    assert!(
        allocations[2].contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{stdout}"
    );
    // The GPU is never shown more than 100% busy.
    for line in stdout
        .lines()
        .filter(|l| l.ends_with('%') && l.contains("of the GPU"))
    {
        let busy: f64 = line
            .split_whitespace()
            .last()
            .and_then(|p| p.strip_suffix('%'))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no busy figure in {line:?}"));
        assert!(busy <= 100.0, "{line}");
    }
}

/// What `/etc/ld.so.preload` mode relies on (docs/containers.md): a process that never calls
/// CUDA, with the shim preloaded, neither creates nor opens the ledger.
#[test]
fn programs_without_cuda_never_touch_the_ledger() {
    let world = World::new(1, "16Gi");
    let dir = world.fake_state_dir().join("no-ledger-here");
    for script in [
        "ls / >/dev/null && echo ok",
        "cat /proc/self/maps | grep -c libgpuslice",
    ] {
        let out = world
            .wrapped("sh")
            .args(["-c", script])
            .env("GPUSLICE_RUNTIME_DIR", &dir)
            .env("GPUSLICE_MEMORY", "1Gi")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{script}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_ne!(stdout.trim(), "0", "the shim was not loaded");
    }
    assert!(
        !dir.exists(),
        "a program that never used CUDA created {}",
        dir.display()
    );
}

/// `--compute-cap` reaches the scheduler: a lone tenant capped at 0.3 stays well under the
/// whole device (a loose bound; the compute tests measure accuracy).
#[test]
fn compute_cap_holds_a_wrapped_burn() {
    let report = run_burn(
        &RunWorld::new(),
        &["--compute-cap", "0.3"],
        &["--seconds", "2", "--json"],
    );
    let fraction = report["gpu_fraction"].as_f64().expect("gpu_fraction");
    assert!(
        fraction > 0.05 && fraction < 0.5,
        "capped at 0.3, got {fraction}: {report}"
    );
}

/// `gpuslice run --memory Q CMD` without `--slice`: CMD and every CUDA process it starts form
/// one slice with quota Q (issue 13). A 3-worker spawn pool under `--memory 8Gi` on a 16 GiB
/// device: every worker runs (on main the third failed `cuInit`, the first two holding 8 GiB
/// each), they hold at most 8 GiB together, in one generated slice that goes away with them.
#[test]
fn a_process_tree_under_run_is_one_slice() {
    let world = RunWorld::new();
    let dir = world.fake_state_dir();
    let b = burn();
    // Each worker asks for 2 GiB, then 2 GiB more, holding both: 12 GiB asked, 8 GiB quota.
    let script = format!(
        "for i in 1 2 3; do '{b}' --alloc 2Gi,2Gi --hold 4 --json > '{d}/w'$i.json 2>'{d}/w'$i.err & done; wait",
        d = dir.display()
    );
    let child = run(&world, &["--memory", "8Gi", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // While they hold: one slice, three processes, within its quota.
    let t0 = Instant::now();
    let held = loop {
        let st = run_json(world.gpuslice().args(["status", "--json"]));
        let slices = st["slices"].as_array().unwrap().clone();
        let pids = slices
            .first()
            .and_then(|s| s["pids"].as_array())
            .map_or(0, Vec::len);
        if slices.len() == 1 && pids == 3 {
            break slices[0].clone();
        }
        assert!(slices.len() <= 1, "more than one slice: {st:#}");
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never saw one slice with three workers: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let name = held["name"].as_str().unwrap();
    assert!(name.starts_with("run-"), "{held:#}");
    assert_eq!(held["memory_limit"], 8u64 << 30, "{held:#}");
    assert!(held["memory_used"].as_u64().unwrap() <= 8 << 30, "{held:#}");
    let status = wait_status(child, "the spawn pool");
    assert!(status.success(), "{status:?}");
    let mut total = 0;
    for i in 1..=3 {
        let out = std::fs::read_to_string(dir.join(format!("w{i}.json"))).unwrap();
        let err = std::fs::read_to_string(dir.join(format!("w{i}.err"))).unwrap();
        let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("worker {i}: {e}: {out}\n{err}"));
        // Every worker ran (cuInit worked); what the quota refused was refused as memory.
        assert!(r["error"].is_null(), "worker {i}: {r:#}\n{err}");
        for e in r["alloc_error_names"].as_array().unwrap() {
            assert_eq!(e, "CUDA_ERROR_OUT_OF_MEMORY", "worker {i}: {r:#}");
        }
        assert_eq!(r["mem_total"], 8u64 << 30, "worker {i}: {r:#}");
        total += r["allocated_bytes"].as_u64().unwrap();
    }
    assert!(total <= 8 << 30, "the workers held {total} bytes together");
    // The generated slice goes with its last process.
    let t0 = Instant::now();
    loop {
        let st = run_json(world.gpuslice().args(["status", "--json"]));
        if st["slices"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the generated slice stayed: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
