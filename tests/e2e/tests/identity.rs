//! Memory and identity against tenants on a node's default settings (issue #27,
//! docs/security.md): a root monitor in node mode (its defaults unless a test names an option)
//! and unprivileged users, each test one attack the issue measured on the old main: an audit
//! aimed at a victim, names taken before their owner uses them, a pid reused to redirect
//! admission, a zombie left charged, a planted secret file, and reserved memory taken by a
//! tenant that scribbles its counters or runs an unwrapped program. Every test needs root; without
//! root it prints why and passes vacuously. CI runs as root.
//!
//! The node world is `gpuslice_e2e::node`; tenants that do more than a CUDA program can are this
//! test binary run again as another user with `TENANTS_CHILD` set (see `tenant_child`).

use gpuslice_e2e::need_root;
use gpuslice_e2e::node::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `gpuslice-burn` of `uid` WITHOUT the shim (an unwrapped program), with `env`, allocating
/// `alloc` and holding it `hold` seconds, in the background.
fn unwrapped(n: &Node, uid: u32, env: &[(&str, &str)], alloc: &str, hold: &str) -> Child {
    let mut c = n.command(uid, "gpuslice-burn");
    c.args(["--alloc", alloc, "--hold", hold, "--json"])
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// `sh -c SCRIPT` (root's shell) with `"$@"` the shim-wrapped `gpuslice-burn` of `uid` (as
/// [`Node::burn`] runs it) and its environment; the caller adds burn's arguments.
fn burn_in_sh(n: &Node, uid: u32, script: &str) -> Command {
    let burn = n.burn(uid);
    let mut c = Command::new("sh");
    c.args(["-c", script, "sh"])
        .arg(burn.get_program())
        .args(burn.get_args())
        .envs(
            burn.get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        );
    c
}

/// Wait until the monitor's log has a line with every one of `words` (60 s at most); the line.
fn wait_log(n: &Node, words: &[&str]) -> String {
    let t0 = Instant::now();
    loop {
        if let Some(l) = n
            .monitor_log()
            .lines()
            .find(|l| words.iter().all(|w| l.contains(w)))
        {
            return l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no monitor log line with {words:?}:\n{}",
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fail, with the monitor's log, when one of `children` (`what`) has exited (the audit killed it).
fn still_running<'a>(n: &Node, children: impl IntoIterator<Item = &'a mut Child>, what: &str) {
    for c in children {
        assert!(
            c.try_wait().unwrap().is_none(),
            "{what} was killed: {}",
            n.monitor_log()
        );
    }
}

/// Issue #27, "the audit can be aimed at a victim": t2 holds 512 MiB in its slice `tq` (1 GiB);
/// t1 runs an unwrapped program that names `tq` and takes 1 GiB. The audit attributes it to t1
/// (its uid), not to t2's slice: `tq` is never flagged, t2's process is never killed, and t1's
/// bypass is the one reported (`--on-violation report`) or killed (node mode's default,
/// `kill`).
#[test]
fn an_aimed_audit_hits_the_bypass_not_the_victim() {
    need_root!();
    for kill in [false, true] {
        let opts: &[&str] = if kill {
            &[]
        } else {
            &["--on-violation", "report"]
        };
        let n = Node::new(1, "16Gi", opts);
        let mut victim = holder_in(&n, TENANT_B, ("tq", "1Gi"), "512Mi", "60");
        let mut bypass = unwrapped(&n, TENANT_A, &[("GPUSLICE_SLICE", "tq")], "1Gi", "60");
        let pid = bypass.id().to_string();
        // The audit pass that sees the bypass says whose it is ...
        let line = wait_log(&n, &["pid", &pid, "outside gpuslice"]);
        assert!(
            line.contains(&format!("uid {TENANT_A}")) && line.contains("not its uid's"),
            "{line}"
        );
        if kill {
            let st = wait_within(&mut bypass, Duration::from_secs(30), "the bypass");
            assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
        }
        // ... and records no violation against t2's slice (the ledger is written in that same
        // pass), nor in the passes after it; t2's process runs on.
        std::thread::sleep(Duration::from_millis(2500));
        let s = n.status();
        assert_eq!(s["violations"], serde_json::json!([]), "{s:#}");
        let tq = slices_named(&s, "tq")
            .find(|x| x["owner"] == TENANT_B)
            .unwrap_or_else(|| panic!("{s:#}"));
        assert_eq!(tq["violations_total"], 0, "{s:#}");
        still_running(&n, [&mut victim], "t2's process");
        assert!(
            !n.monitor_log().contains("of slice \"tq\""),
            "{}",
            n.monitor_log()
        );
        kill_all([&mut victim, &mut bypass]);
    }
}

/// Issues #26/#27/#34: NVML counts each process's CUDA context (the fake models it: 512 MiB on
/// a 16 GiB device, docs/fakegpu.md), which node mode charges inside the quota. Under
/// `--on-violation kill`, t2's 2 GiB slice filled to its quota by two processes sharing it (a
/// context and 512 MiB each) is neither reported nor killed (the audit also allows each process
/// `--context-allowance`, 512 MiB by default, for a context that grows past its charge); an
/// unwrapped program of t2 in that slice that takes 1.5 GiB past it all is reported and is the
/// only one killed.
#[test]
fn a_full_quota_and_its_contexts_are_no_violation() {
    need_root!();
    let n = Node::new(1, "16Gi", &["--on-violation", "kill"]);
    assert_eq!(gpuslice_e2e::fake_context_bytes(16 << 30), 512 << 20);
    let mut a = holder_in(&n, TENANT_B, ("full", "2Gi"), "512Mi", "60");
    let mut b = holder(&n, TENANT_B, &in_slice("full", "2Gi"), "512Mi", "60");
    for c in [&mut a, &mut b] {
        let (_, v) = gpuslice_e2e::first_line(c);
        assert_eq!(v["allocated_bytes"], 512u64 << 20, "{v}");
    }
    wait_for_slice(&n, "full", 2);
    // Several audit passes (one a second) see 1 GiB + 2 contexts on a 2 GiB quota.
    std::thread::sleep(Duration::from_millis(3500));
    let s = n.status();
    assert_eq!(s["violations"], serde_json::json!([]), "{s:#}");
    assert_eq!(slice_named(&s, "full")["violations_total"], 0, "{s:#}");
    still_running(&n, [&mut a, &mut b], "a process within its quota");
    assert!(
        !n.monitor_log().contains("over its quota"),
        "{}",
        n.monitor_log()
    );
    // t2's own program without the library, in its own slice: 1 GiB past quota + allowances.
    let mut over = unwrapped(&n, TENANT_B, &[("GPUSLICE_SLICE", "full")], "1536Mi", "60");
    let st = wait_within(&mut over, Duration::from_secs(30), "the unwrapped program");
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "{st:?}\n{}",
        n.monitor_log()
    );
    let line = wait_log(&n, &["slice \"full\"", "over its quota"]);
    assert!(line.contains("--context-allowance 512 MiB each"), "{line}");
    still_running(&n, [&mut a, &mut b], "a process within its quota");
    kill_all([&mut a, &mut b]);
}

/// Issue #27, "names can be taken": t1 keeps processes in slices called `tq`, `team` and a
/// claim's name. Names are namespaced by owner: t2's job starts in `tq` (its own, with its own
/// quota); root's `slice create team --owner t2` and the claim's slice succeed and are the ones
/// t2 joins; `status` shows each slice's owner.
#[test]
fn names_cannot_be_taken() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let claim = "k8s-8f0c5a3e-5d5e-4c1b-9d7e-0a1b2c3d4e5f";
    let mut squats: Vec<Child> = ["tq", "team", claim]
        .iter()
        .map(|name| holder_in(&n, TENANT_A, (name, "1Gi"), "1Mi", "60"))
        .collect();
    // t2's job in the name it uses: its own slice, its own 2 GiB quota.
    let o = n.allocate(TENANT_B, &in_slice("tq", "2Gi"), "1536Mi");
    let r = burn_json(&o);
    assert_eq!(
        (r["mem_total"].as_u64(), r["allocated_bytes"].as_u64()),
        (Some(2 << 30), Some(1536 << 20)),
        "{}",
        text(&o)
    );
    // Operator names: root's slices of those names are made, owned as asked.
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            "team",
            "--memory",
            "2Gi",
            "--owner",
            &TENANT_B.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = n.cli(0, &["slice", "create", claim, "--memory", "1Gi"]);
    assert!(o.status.success(), "{}", text(&o));
    // t2 joins the operator's `team` (its quota), t1's processes stay in t1's own.
    let o = n.allocate(TENANT_B, &[("GPUSLICE_SLICE", "team")], "1Gi");
    let r = burn_json(&o);
    assert_eq!(
        (r["mem_total"].as_u64(), r["allocated_bytes"].as_u64()),
        (Some(2 << 30), Some(1 << 30)),
        "{}",
        text(&o)
    );
    // The name is the operator's now: a new t1 process naming it is refused (it is t2's).
    let o = n.allocate(TENANT_A, &[("GPUSLICE_SLICE", "team")], "1Mi");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("belongs to uid {TENANT_B}")),
        "{}",
        text(&o)
    );
    // t2's finished jobs are reaped (its own `tq` goes with the first).
    wait_status(&n, 10, "t2's jobs reaped", |s| {
        let t2 = s["processes"]
            .as_array()?
            .iter()
            .any(|p| p["uid"] == TENANT_B);
        (!t2 && slices_named(s, "tq").count() == 1).then_some(())
    });
    let s = n.status();
    let owners = |name: &str| {
        let mut v: Vec<String> = slices_named(&s, name)
            .map(|x| format!("{}:{}", x["owner"], x["pids"].as_array().unwrap().len()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(owners("tq"), [format!("{TENANT_A}:1")], "{s:#}");
    assert_eq!(
        owners("team"),
        [format!("{TENANT_A}:1"), format!("{TENANT_B}:0")],
        "{s:#}"
    );
    assert_eq!(
        owners(claim),
        [format!("{TENANT_A}:1"), "null:0".into()],
        "{s:#}"
    );
    let table = String::from_utf8_lossy(&n.cli(0, &["status"]).stdout).into_owned();
    assert!(
        table.contains("OWNER") && table.contains(&format!("uid {TENANT_B}")),
        "{table}"
    );
    kill_all(squats.iter_mut());
}

/// Issue #27, "a zombie stays charged": t1's process in slice `z` (2 GiB) holding 768 MiB and
/// its context (512 MiB, charged inside the quota) is killed while its parent never waits for
/// it (a zombie, which has released its memory). Its memory returns to the slice at the
/// monitor's next reap, the zombie still there, and t1 can use the whole quota again.
#[test]
fn a_zombies_memory_returns_to_its_slice() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let ctx = gpuslice_e2e::fake_context_bytes(16 << 30);
    let mut keep = holder_in(&n, TENANT_A, ("z", "2Gi"), "1Mi", "60");
    // sh starts the burn in the background and becomes `sleep`, which never waits for it.
    let mut parent = burn_in_sh(&n, TENANT_A, "\"$@\" & exec sleep 60")
        .args(["--alloc", "768Mi", "--hold", "60", "--json"])
        .envs(in_slice("z", "2Gi"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let used = |s: &serde_json::Value| slice_named(s, "z")["memory_used"].as_u64();
    wait_status(&n, 60, "768 MiB more in z", |s| {
        (used(s) == Some(((768 + 1) << 20) + 2 * ctx)).then_some(())
    });
    let s = n.status();
    let pid = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["slice"] == "z" && p["memory_used"] == (768u64 << 20) + ctx)
        .and_then(|p| p["pid"].as_u64())
        .unwrap_or_else(|| panic!("{s:#}")) as i32;
    // SAFETY: kill(2) on a pid of this test's world (t1's burn).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let state = || gpuslice_ledger::procfs::stat(&pid.to_string()).map(|s| char::from(s.state));
    let t0 = Instant::now();
    while state() != Some('Z') {
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", state());
        std::thread::sleep(Duration::from_millis(5));
    }
    let zombie_at = Instant::now();
    // `status` never shows the zombie alive (it has exited; only its parent has not waited):
    // it shows the node as the reaper will leave it.
    let s = n.status();
    assert!(
        s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["pid"] != pid || p["alive"] == false),
        "{s:#}"
    );
    wait_status(&n, 10, "the zombie's 768 MiB back in z", |s| {
        (used(s) == Some((1 << 20) + ctx)).then_some(())
    });
    // And the monitor's reaper does so (its log line), the zombie still there.
    let reaped = format!("reaped pid {pid}:");
    while !n.monitor_log().contains(&reaped) {
        assert!(
            zombie_at.elapsed() < Duration::from_secs(10),
            "not reaped: {}",
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "the zombie's memory was back in {:?} (monitor interval 50 ms, status polled every 50 ms)",
        zombie_at.elapsed()
    );
    assert_eq!(
        state(),
        Some('Z'),
        "still a zombie: reaped by the monitor, not by its parent"
    );
    // What is left with a context each: 2 GiB less 1 MiB and two contexts.
    let o = n.allocate(TENANT_A, &in_slice("z", "2Gi"), "1023Mi");
    assert_eq!(
        burn_json(&o)["allocated_bytes"],
        1023u64 << 20,
        "{}",
        text(&o)
    );
    kill_all([&mut keep, &mut parent]);
}

/// Issue #27, "an operator's secret file can be planted": `--secret-file` refuses a file the
/// caller does not own (t1 wrote it first, mode 0600) and one group or others may write,
/// saying so; nothing is made. The caller's own private file is taken.
#[test]
fn a_planted_secret_file_is_refused() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let drop = n.root().join("drop");
    std::fs::create_dir(&drop).unwrap();
    chmod(&drop, 0o1777);
    let secret = "planted-by-t1-0123456789abcdef0123456789";
    let planted = drop.join("team.secret");
    // t1 writes the file, as it would (sh as t1: umask 077, so mode 0600, owner t1).
    let st = Command::new("setpriv")
        .args([
            &format!("--reuid={TENANT_A}"),
            &format!("--regid={TENANT_A}"),
            "--clear-groups",
            "--",
            "sh",
            "-c",
            "umask 077; printf '%s\\n' \"$1\" > \"$2\"",
            "sh",
            secret,
        ])
        .arg(&planted)
        .status()
        .unwrap();
    assert!(st.success());
    let create = |file: &Path| {
        n.cli(
            0,
            &[
                "slice",
                "create",
                "team",
                "--memory",
                "1Gi",
                "--secret-file",
                file.to_str().unwrap(),
            ],
        )
    };
    let o = create(&planted);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("owned by uid {TENANT_A}")) && err.contains("not by you"),
        "{}",
        text(&o)
    );
    assert!(!err.contains(secret), "never echoed: {err}");
    // Root's own file that group may write: refused too.
    let writable = n.root().join("writable.secret");
    std::fs::write(&writable, format!("{secret}\n")).unwrap();
    chmod(&writable, 0o620);
    let o = create(&writable);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("lets group or others write it"),
        "{}",
        text(&o)
    );
    assert!(slices_named(&n.status(), "team").next().is_none());
    // The caller's own private file is taken, and t1 cannot join with the secret it chose.
    let own = n.root().join("own.secret");
    std::fs::write(&own, "root-chose-this-0123456789abcdef0123456789\n").unwrap();
    chmod(&own, 0o600);
    let o = create(&own);
    assert!(o.status.success(), "{}", text(&o));
    let o = n.allocate(
        TENANT_A,
        &[
            ("GPUSLICE_SLICE", "team"),
            ("GPUSLICE_SLICE_SECRET", secret),
        ],
        "1Mi",
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not match"),
        "{}",
        text(&o)
    );
}

/// The OOM status (`CUDA_ERROR_OUT_OF_MEMORY`) in a burn report's `alloc_errors`.
const OOM: u64 = 2;

/// Poll until an unwrapped program of t1 asking for `alloc` is refused by the (fake) driver
/// with out-of-memory: the balloons are in place (30 s at most).
fn wait_held(n: &Node, alloc: &str) {
    let t0 = Instant::now();
    loop {
        let o = n
            .command(TENANT_A, "gpuslice-burn")
            .env_remove("LD_PRELOAD")
            .args(["--alloc", alloc, "--json"])
            .output()
            .unwrap();
        if burn_json(&o)["alloc_errors"] == serde_json::json!([OOM]) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the balloons never held: {}\n{}",
            text(&o),
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Root's slice `name` of 1 GiB for t2 (on a 4 GiB device), once the balloons hold it.
fn reserve_for_t2(n: &Node, name: &str) {
    let o = n.cli(
        0,
        &[
            "slice",
            "create",
            name,
            "--memory",
            "1Gi",
            "--owner",
            &TENANT_B.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    wait_held(n, "3584Mi");
}

/// t1's unwrapped program holding, for `hold` seconds, all of the 4 GiB device where t2
/// reserved 1 GiB ([`reserve_for_t2`]) but one context's room: what a probe of the balloons
/// (`wait_held`) needs for its own context before it asks for memory.
fn hold_the_rest(n: &Node, hold: &str) -> Child {
    // Contexts take memory on the fake (docs/fakegpu.md): 128 MiB each on a 4 GiB device. Of
    // the 4 GiB, the monitor's context takes one, t2res's balloon 1 GiB (its contexts are
    // inside it), the hog's own context one more: 2.75 GiB are left, of which the hog leaves
    // one context's room.
    let ctx = gpuslice_e2e::fake_context_bytes(4 << 30);
    let mut hog = unwrapped(
        n,
        TENANT_A,
        &[],
        "512Mi,512Mi,512Mi,512Mi,512Mi,128Mi",
        hold,
    );
    let (_, v) = gpuslice_e2e::first_line(&mut hog);
    let left = (4u64 << 30) - 2 * ctx - (1 << 30);
    assert_eq!(v["allocated_bytes"], left - ctx, "{v}");
    hog
}

/// Issue #27, "reserved memory can be taken": on a 4 GiB device t2 has 1 GiB reserved (an
/// operator slice of its own, nothing used yet). Node mode's default settings hold it
/// physically (balloons), so (b) t1's unwrapped program that asks for everything gets
/// `CUDA_ERROR_OUT_OF_MEMORY` from the driver, and while t1 holds all it could get t2 still
/// allocates its whole 1 GiB; (a) the same while t1's processes zero their slice's usage counter
/// before every allocation. With `--on-violation report`, so that t1 keeps what it took (node
/// mode's default, `kill`, ends it: `contexts.rs`).
#[test]
fn reserved_memory_is_held_against_a_bypass_and_a_scribbler() {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "report"]);
    reserve_for_t2(&n, "t2res");
    // All of its 1 GiB but its own context (charged inside the quota, 128 MiB on 4 GiB).
    let t2_allocates = |n: &Node| {
        let o = n.allocate(
            TENANT_B,
            &[("GPUSLICE_SLICE", "t2res"), ("GPUSLICE_LOG", "debug")],
            "free",
        );
        let r = burn_json(&o);
        let ctx = gpuslice_e2e::fake_context_bytes(4 << 30);
        assert_eq!(
            (r["allocated_bytes"].as_u64(), r["alloc_errors"].clone()),
            (Some((1 << 30) - ctx), serde_json::json!([])),
            "t2 could not allocate what it reserved: {}\n{}",
            text(&o),
            n.monitor_log()
        );
    };
    // (b) An unwrapped program asking for everything: the driver says out of memory.
    let o = n
        .command(TENANT_A, "gpuslice-burn")
        .env_remove("LD_PRELOAD")
        .args(["--alloc", "4Gi", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        burn_json(&o)["alloc_errors"],
        serde_json::json!([OOM]),
        "{}",
        text(&o)
    );
    // It holds what it can get in 512 MiB pieces: all but t2's reservation (its contexts
    // inside it), the monitor's context and its own (docs/fakegpu.md): 5 pieces of the 2.75 GiB
    // left ...
    let mut hog = unwrapped(
        &n,
        TENANT_A,
        &[],
        "512Mi,512Mi,512Mi,512Mi,512Mi,512Mi,512Mi,512Mi",
        "60",
    );
    let (_, v) = gpuslice_e2e::first_line(&mut hog);
    let left = (3u64 << 30) - 2 * gpuslice_e2e::fake_context_bytes(4 << 30);
    assert_eq!(
        v["allocated_bytes"],
        left / (512 << 20) * (512 << 20),
        "{v}"
    );
    // ... and t2 still creates its context (its admission handed one context's charge of its
    // balloon back) and gets the rest of its 1 GiB.
    t2_allocates(&n);
    kill_all([&mut hog]);
    // (a) t1's own slice (1 GiB), whose usage counter t1's sidecar zeroes without pause while
    // t1's wrapped program allocates 256 MiB pieces.
    wait_held(&n, "3584Mi");
    let mut sidecar = n
        .child(TENANT_A, "zero-used")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = read_until(&mut sidecar, "ready");
    if !line.starts_with("ready") {
        let o = sidecar.wait_with_output().unwrap();
        panic!("the sidecar did not start: {}", text(&o));
    }
    // t1's processes of `t1s`, one after another, each taking 256 MiB while the sidecar has
    // zeroed the counter again: past the quota, up to what the device physically has.
    let mut greedy = vec![];
    let mut got = 0u64;
    for _ in 0..14 {
        let mut c = holder(&n, TENANT_A, &in_slice("t1s", "1Gi"), "256Mi", "60");
        let (_, v) = gpuslice_e2e::first_line(&mut c);
        got += v["allocated_bytes"].as_u64().unwrap_or(0);
        greedy.push(c);
    }
    // What it overspent came from memory nobody reserved or from its own slice's balloon,
    // never from t2's.
    println!("the scribbler holds {} MiB on its 1 GiB quota", got >> 20);
    assert!(got > 1 << 30 && got <= 3 << 30, "{got}");
    t2_allocates(&n);
    kill_all(greedy.iter_mut().chain([&mut sidecar]));
}

/// t2 allocates 768 MiB in its slice `t2res` through `path`
/// ([`every_allocation_path_gets_its_balloon_back`]): it succeeds; whether the shim took the
/// slow path (its log).
fn takes_the_slow_path(n: &Node, path: &str) -> bool {
    // The balloon is refilled after the last hand-back: one context's room is free (the
    // probe's context fits, its 128 MiB do not). t2's admission hands back one context's
    // charge of its balloon (128 MiB), which its context takes: 128 MiB are free, so 768 MiB
    // can only come from the balloon.
    wait_held(n, "128Mi");
    let mut c = n.burn(TENANT_B);
    c.args(["--alloc", "768Mi", "--alloc-path", path, "--json"])
        .env("GPUSLICE_SLICE", "t2res")
        .env("GPUSLICE_LOG", "debug");
    let o = c.output().unwrap();
    let r = burn_json(&o);
    assert!(
        r["alloc_errors"] == serde_json::json!([])
            && r["allocated_bytes"].as_u64() >= Some(768 << 20),
        "{path}: t2 could not allocate within its quota: {}\n{}",
        text(&o),
        n.monitor_log()
    );
    // And it was told so: cuMemGetInfo counts its own balloon as free (a framework that sizes
    // its pool by free memory, TensorFlow's, would otherwise get nothing here).
    assert!(
        r["mem_free"].as_u64() >= Some(768 << 20),
        "{path}: cuMemGetInfo said {} free where the slice could allocate 768 MiB: {}",
        r["mem_free"],
        text(&o)
    );
    let taken = String::from_utf8_lossy(&o.stderr)
        .lines()
        .any(|l| l.contains("slow path for") && l.contains("allocated after"));
    if !taken {
        println!("{path}: allocated without the slow path (a tick deflated the balloon first)");
    }
    taken
}

/// Issue #27: every allocation path that reserves in the slice takes the balloons' slow path.
/// On a 4 GiB device t2 has 1 GiB reserved and t1's unwrapped program holds all the rest but
/// one context's room, so the device's memory is t2's balloon; t2 then allocates 768 MiB
/// (within its quota, more than its admission hands back) through each path of the driver
/// API, one process each, stream-ordered pools included (`cuMemAllocAsync`,
/// `cuMemAllocFromPoolAsync`): each succeeds, and its log shows it got the memory through the
/// slow path (the monitor handed back part of the balloon).
#[test]
fn every_allocation_path_gets_its_balloon_back() {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "report"]);
    reserve_for_t2(&n, "t2res");
    let mut hog = hold_the_rest(&n, "120");
    let paths = [
        "async", "pool", "plain", "pitch", "managed", "vmm", "array", "array3d", "mipmap", "graph",
        "capture",
    ];
    for path in paths {
        // The shim charges the slice before the driver call; a monitor tick that falls in
        // between deflates the balloon by the charge, so the driver has the memory and the slow
        // path is not needed (right, and more likely on a loaded host). Such a run shows
        // nothing: the path is tried again, at most 5 times.
        let mut tries = 0;
        while !takes_the_slow_path(&n, path) {
            tries += 1;
            assert!(
                tries < 5,
                "{path}: allocated without the slow path in 5 tries (was the balloon held?)\n{}",
                n.monitor_log()
            );
        }
    }
    kill_all([&mut hog]);
}

/// Issue #27, "a reused pid redirects admission": t1 connects to the monitor from a child that
/// exits, and sends its request once t2's new job holds the child's pid. Admission is bound to
/// the process that connected (a pidfd), so t1's request is refused and t2's job is admitted,
/// in each of 5 attempts where the pid really came round.
#[test]
fn a_reused_pid_cannot_redirect_admission() {
    need_root!();
    let n = Node::new(1, "16Gi", &[]);
    let (mut done, mut tries) = (0, 0);
    while done < 5 {
        tries += 1;
        assert!(
            tries <= 100,
            "the pid came round in only {done} of {tries} attempts"
        );
        let mut t1 = n
            .child(TENANT_A, "stale-peer")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = read_until(&mut t1, "pid ");
        let x: i32 = line.trim().trim_start_matches("pid ").parse().unwrap();
        // t2's job takes pid x (the kernel hands out ns_last_pid + 1 next), sleeps, then
        // becomes the CUDA program.
        let mut job = burn_in_sh(&n, TENANT_B, "sleep 0.5; exec \"$@\"");
        job.args(["--alloc", "1Mi", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::fs::write("/proc/sys/kernel/ns_last_pid", (x - 1).to_string()).unwrap();
        let job = job.spawn().unwrap();
        if job.id() as i32 != x {
            // Another process took it first: not an attempt.
            let _ = t1.kill();
            let _ = t1.wait();
            let _ = job.wait_with_output();
            continue;
        }
        write_line(&mut t1, "go");
        let reply = read_until(&mut t1, "reply ");
        let o = job.wait_with_output().unwrap();
        assert_eq!(
            burn_json(&o)["allocated_bytes"],
            1u64 << 20,
            "attempt {}: t2's job was not admitted (t1 got: {reply}): {}",
            done + 1,
            text(&o)
        );
        assert!(
            reply.contains("err") && reply.contains("exited"),
            "t1's request from a process that is gone: {reply}"
        );
        let _ = t1.wait();
        done += 1;
    }
    println!("5 pid reuses in {tries} attempts");
}

/// Issue #27: the slow path's hand-back and the restart: when the monitor dies the balloons
/// fall away (memory enforcement goes on in software); a restarted monitor holds them again
/// without touching what running processes hold.
#[test]
fn balloons_fall_away_with_the_monitor_and_come_back_with_it() {
    need_root!();
    let mut n = Node::new(1, "4Gi", &[]);
    let mut h = holder_in(&n, TENANT_B, ("b", "2Gi"), "512Mi", "60");
    wait_held(&n, "2560Mi");
    n.stop_monitor();
    // The driver freed the monitor's memory: 3.5 GiB are free (4 GiB less t2's 512 MiB).
    let t0 = Instant::now();
    loop {
        let o = n
            .command(TENANT_A, "gpuslice-burn")
            .env_remove("LD_PRELOAD")
            .args(["--alloc", "3Gi", "--json"])
            .output()
            .unwrap();
        if burn_json(&o)["allocated_bytes"] == 3u64 << 30 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", text(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
    n.start_monitor();
    wait_held(&n, "2560Mi");
    assert!(
        h.try_wait().unwrap().is_none(),
        "t2's process was harmed by the restart"
    );
    // Its quota still holds in software, and what it holds is intact: 2 GiB less its 512 MiB
    // and two contexts of 128 MiB.
    let o = n.allocate(TENANT_B, &in_slice("b", "2Gi"), "1280Mi,1Mi");
    let r = burn_json(&o);
    assert_eq!(
        (r["allocated_bytes"].as_u64(), r["alloc_errors"].clone()),
        (Some(1280 << 20), serde_json::json!([OOM])),
        "{}",
        text(&o)
    );
    kill_all([&mut h]);
}

/// A benchmark, not a test: the balloons' costs for docs/benchmarks.md ("balloon slow path"). It is
/// `#[ignore]`d on purpose: it asserts nothing about time (only what its figures rest on: each
/// run allocated, the hog filled the device), so a default `cargo test` would spend its 10-20 s
/// (15 slow paths, 5 monitor restarts) on numbers nobody reads. Run it, as root, with
/// `cargo test -p gpuslice-e2e --test identity balloon_costs -- --ignored --nocapture`.
/// Prints the monitor's own device memory with nothing reserved, the slow path's latency (the
/// driver full, a 768 MiB allocation asks the monitor for its slice's reservation and
/// retries; median of 15) and the monitor's start-up holding 3 GiB (two 1 GiB slices and
/// their context room). What the balloons must do is tested by the tests above
/// (`reserved_memory_is_held_against_a_bypass_and_a_scribbler`,
/// `every_allocation_path_gets_its_balloon_back`,
/// `balloons_fall_away_with_the_monitor_and_come_back_with_it`) and
/// `tests/python/test_node_balloons.py`.
#[test]
#[ignore = "a benchmark (docs/benchmarks.md, \"balloon slow path\"): run with --ignored --nocapture"]
fn balloon_costs() {
    need_root!();
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let mut n = Node::new(1, "4Gi", &["--on-violation", "report"]);
    // The monitor's own device memory with nothing reserved: what the driver shows free to an
    // unwrapped program, against the device's size.
    let o = n
        .command(TENANT_A, "gpuslice-burn")
        .env_remove("LD_PRELOAD")
        .args(["--alloc", "1Mi", "--json"])
        .output()
        .unwrap();
    let start = &burn_json(&o)["mem"]["start"];
    println!(
        "monitor alone: the driver shows {} of {} bytes free (the monitor's own: {} bytes)",
        start["free"],
        start["total"],
        start["total"].as_u64().unwrap() - start["free"].as_u64().unwrap()
    );
    // The slow path: t2's slice s0 (1 GiB) held, a hog holding the rest of the device.
    reserve_for_t2(&n, "s0");
    // (All but s0's 1 GiB, its contexts inside, and the contexts: 256 MiB pieces.)
    let mut hog = unwrapped(&n, TENANT_A, &[], &["256Mi"; 16].join(","), "300");
    let (_, v) = gpuslice_e2e::first_line(&mut hog);
    assert!(v["allocated_bytes"].as_u64() >= Some(2 << 30), "{v}");
    let mut slow = vec![];
    let mut runs = 0;
    while slow.len() < 15 {
        runs += 1;
        assert!(runs <= 60, "{slow:?}\n{}", n.monitor_log());
        std::thread::sleep(Duration::from_millis(600)); // the balloon is refilled
        let o = n.allocate(
            TENANT_B,
            &[("GPUSLICE_SLICE", "s0"), ("GPUSLICE_LOG", "debug")],
            // More than its admission handed back for its context leaves free.
            "768Mi",
        );
        assert_eq!(
            burn_json(&o)["allocated_bytes"],
            768u64 << 20,
            "{}",
            text(&o)
        );
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        // A run that found memory free (the balloon not refilled yet) took no slow path.
        if let Some(us) = err
            .lines()
            .find(|l| l.contains("slow path for"))
            .and_then(|l| l.split(" after ").nth(1))
            .and_then(|v| v.trim_end_matches(" µs").parse::<f64>().ok())
        {
            slow.push(us);
        } else if runs == 1 {
            println!("{err}");
        }
    }
    println!(
        "slow path (768 MiB, device full), {} of {runs} runs: median {} µs of {slow:?}",
        slow.len(),
        median(slow.clone())
    );
    kill_all([&mut hog]);
    // Start-up: the first tick holds 3 GiB: two 1 GiB slices and the room each holds for a
    // context (512 MiB, `--context-allowance`).
    for i in 1..2 {
        let o = n.cli(0, &["slice", "create", &format!("s{i}"), "--memory", "1Gi"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let mut starts = vec![];
    for _ in 0..5 {
        let before = n.monitor_log().matches("start-up").count();
        n.stop_monitor();
        n.start_monitor();
        let t0 = Instant::now();
        let line = loop {
            let log = n.monitor_log();
            if log.matches("start-up").count() > before {
                break log
                    .lines()
                    .rev()
                    .find(|l| l.contains("start-up"))
                    .unwrap()
                    .to_string();
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "{log}");
            std::thread::sleep(Duration::from_millis(20));
        };
        println!("{line}");
        let ms: f64 = line
            .rsplit("start-up ")
            .next()
            .unwrap()
            .trim_end_matches(" ms)")
            .parse()
            .unwrap();
        starts.push(ms);
    }
    println!(
        "start-up with 3 GiB held for two 1 GiB slices: median {} ms of {starts:?}",
        median(starts.clone())
    );
}

/// The hostile tenants (run as another user by the tests above). Not a test of its own: without
/// `TENANTS_CHILD` it returns at once.
#[test]
fn tenant_child() {
    serve_child(&[("zero-used", zero_used), ("stale-peer", stale_peer)]);
}

/// Child mode `zero-used`: admitted to t1's slice `t1s` (1 GiB), it stores 0 into the slice's
/// usage counter whenever it is not 0, for 30 s (its processes may write their region).
fn zero_used(dir: &Path) {
    let region = admitted_region(dir, Some("t1s"), Some(1 << 30), 0);
    println!("ready");
    let used = &region.header().memory_used;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if used.load(std::sync::atomic::Ordering::SeqCst) != 0 {
            used.store(0, std::sync::atomic::Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Child mode `stale-peer`: connect to the monitor from a child that exits at once, say the
/// child's pid (`pid X`), wait for a line on stdin, then send an admission request on that
/// connection and say the reply (`reply ...`).
fn stale_peer(dir: &Path) {
    use gpuslice_protocol as protocol;
    let (d, req) = admit_request(dir, None, None, 0);
    let m = protocol::Request::from(req).encode();
    // SAFETY: constants.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(s >= 0);
    let addr = protocol::unix_addr(&format!(
        "/proc/self/fd/{}/{}",
        d.fd(),
        protocol::SOCKET_FILE
    ))
    .unwrap();
    // SAFETY: the child only connects and exits (async-signal-safe calls).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: valid socket and address; _exit never returns.
        unsafe {
            let r = libc::connect(
                s,
                (&addr as *const libc::sockaddr_un).cast(),
                size_of::<libc::sockaddr_un>() as u32,
            );
            libc::_exit(if r == 0 { 0 } else { 1 });
        }
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert_eq!(st, 0, "the child could not connect");
    println!("pid {pid}");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    let reply = protocol::send(s, &m, &[]).and_then(|()| protocol::recv(s));
    println!("reply {:?}", reply.map(|r| r.map(|(m, _)| m)));
}

/// Read `c`'s stdout up to the first line with `prefix` (the test harness prints its own
/// lines first, and `test tenant_child ... ` before the child's first line); that line from
/// `prefix` on (empty at the end of the output).
fn read_until(c: &mut Child, prefix: &str) -> String {
    let mut r = BufReader::new(c.stdout.as_mut().unwrap());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            return line;
        }
        if let Some(i) = line.find(prefix) {
            return line[i..].to_string();
        }
    }
}

fn write_line(c: &mut Child, s: &str) {
    writeln!(c.stdin.as_mut().unwrap(), "{s}").unwrap();
}

use gpuslice_e2e::wait_within;
