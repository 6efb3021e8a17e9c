//! The node world of the root tests (`tenants.rs`, `turns.rs`, the DRA plugin's `node_mode.rs`):
//! a root monitor in node mode on a private fake GPU, and unprivileged users (`setpriv` to uids
//! that exist nowhere else).
//! Every test needs root (to be the node's root and to become other users); without root it
//! prints why and passes vacuously. CI runs as root.
//!
//! Unprivileged users need to execute the artifacts and use the fake GPU: [`Node`] copies the
//! binaries and the fake libraries into a world-readable directory and prepares the fake's
//! state (`FAKEGPU_STATE_DIR`) for every user. Hostile tenants that do more than a CUDA program
//! can are the test binary run again as another user with `TENANTS_CHILD` set (each binary's
//! `tenant_child`).

pub use crate::in_slice;
use crate::{artifact, fake_lib_dir, wait_for_file, World};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const TENANT_A: u32 = 47001;
pub const TENANT_B: u32 = 47002;

/// The operator group of the root tests, and its gid.
pub const OPERATOR_GROUP: &str = "gpuslice-tenants-test";
pub const OPERATOR_GID: &str = "47100";

/// Create [`OPERATOR_GROUP`] on this machine (`groupadd -f`); whether it exists now (a test
/// runs its operator-group half only then).
pub fn operator_group() -> bool {
    Command::new("groupadd")
        .args(["-f", "-g", OPERATOR_GID, OPERATOR_GROUP])
        .status()
        .is_ok_and(|s| s.success())
}

/// The test binary's child mode (`TENANTS_CHILD`) and the runtime directory it is given
/// (`TENANTS_DIR`); None when it runs as a test, not as a child.
pub fn child_mode() -> Option<(String, PathBuf)> {
    let mode = std::env::var("TENANTS_CHILD").ok()?;
    Some((mode, PathBuf::from(std::env::var("TENANTS_DIR").ok()?)))
}

/// A child mode of a test binary: its name (`TENANTS_CHILD`) and what it runs, given the node's
/// runtime directory.
pub type ChildMode = (&'static str, fn(&Path));

/// The body of a test binary's `tenant_child` test: run as a child ([`child_mode`]), the mode
/// of `modes` it names, given the runtime directory (a mode not there fails); run as a test,
/// nothing.
pub fn serve_child(modes: &[ChildMode]) {
    let Some((mode, dir)) = child_mode() else {
        return;
    };
    match modes.iter().find(|(m, _)| *m == mode) {
        Some((_, run)) => run(&dir),
        None => panic!("unknown TENANTS_CHILD {mode}"),
    }
}

/// What a child mode asks the node's monitor to admit it with, as the shim asks it: device 0
/// of the node in `dir`, with the memory quota `memory` (`None`: best effort) and the compute
/// share `share_ppm`, into slice `slice` (`None`: its user's best-effort slice). The socket's
/// directory, to send it through (`gpuslice_protocol::exchange`).
pub fn admit_request(
    dir: &Path,
    slice: Option<&str>,
    memory: Option<u64>,
    share_ppm: u32,
) -> (gpuslice_ledger::RuntimeDir, gpuslice_protocol::AdmitRequest) {
    let d = gpuslice_ledger::RuntimeDir::open(dir).unwrap();
    let l = gpuslice_ledger::Ledger::open(dir).unwrap();
    let uuid = l.snapshot().devices[0].uuid.clone();
    let req = gpuslice_protocol::AdmitRequest {
        slice: slice.map(String::from),
        devices: vec![gpuslice_protocol::DeviceRequest {
            uuid,
            memory,
            compute_share: gpuslice_ledger::Share::from_ppm(share_ppm),
            compute_cap: gpuslice_ledger::Cap::NONE,
            memory_setting: "X".into(),
            compute_setting: "Y".into(),
        }],
        ..Default::default()
    };
    (d, req)
}

/// Admitted by the node's monitor with [`admit_request`] (the test fails if it is refused): the
/// region it was given, mapped writable.
pub fn admitted_region(
    dir: &Path,
    slice: Option<&str>,
    memory: Option<u64>,
    share_ppm: u32,
) -> gpuslice_ledger::region::Region {
    let (d, req) = admit_request(dir, slice, memory, share_ppm);
    let (answer, fds) =
        gpuslice_protocol::exchange(d.fd(), req, &[], Duration::from_secs(10)).unwrap();
    assert!(answer.is_ok(), "{answer:?}");
    gpuslice_ledger::region::Region::from_fd(fds.into_iter().next().unwrap(), true).unwrap()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The variable that lets root-only tests be skipped when not root (`skip`); anything else,
/// or unset, makes them fail, so a run without root never reads as a pass.
pub const ROOT_TESTS_VAR: &str = "GPUSLICE_ROOT_TESTS";
/// Where each skipped root-only test is recorded, one name a line (scripts/test.sh counts
/// them and prints them as not run).
pub const NOT_RUN_FILE_VAR: &str = "GPUSLICE_NOT_RUN_FILE";

/// A root-only test that cannot run here: with `GPUSLICE_ROOT_TESTS=skip`, record it as not
/// run (in `$GPUSLICE_NOT_RUN_FILE`) and let the caller return; otherwise fail, naming what
/// it needs.
pub fn not_run_without_root() {
    let name = std::thread::current()
        .name()
        .unwrap_or("a root-only test")
        .to_string();
    if std::env::var(ROOT_TESTS_VAR).as_deref() != Ok("skip") {
        panic!(
            "{name} needs root (it runs the node's monitor and becomes other users): run the \
             tests as root, or set {ROOT_TESTS_VAR}=skip to count it as not run"
        );
    }
    println!("NOT RUN (needs root): {name}");
    if let Ok(path) = std::env::var(NOT_RUN_FILE_VAR) {
        use std::io::Write;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        // One short line in O_APPEND: tests running at once do not interleave.
        let _ = f.and_then(|mut f| f.write_all(format!("{name}\n").as_bytes()));
    }
}

/// Return from a test unless it runs as root, after [`not_run_without_root`] (which fails the
/// test unless skipping was asked for, and records the skip); with a value, return that (from
/// a test's helper).
#[macro_export]
macro_rules! need_root {
    () => {
        $crate::need_root!(())
    };
    ($ret:expr) => {
        if !$crate::node::is_root() {
            $crate::node::not_run_without_root();
            return $ret;
        }
    };
}

pub fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A node: a world whose runtime directory is root's, a root monitor in node mode, and copies
/// of the artifacts every user can run.
pub struct Node {
    pub world: World,
    pub bin: PathBuf,
    pub monitor: Option<Child>,
    monitor_args: Vec<String>,
}

impl Node {
    pub fn new(devices: u32, memory: &str, monitor_args: &[&str]) -> Node {
        let world = World::new(devices, memory);
        let base = world.fake_state_dir().parent().unwrap().to_path_buf();
        chmod(&base, 0o755);
        chmod(&world.runtime_dir(), 0o755);
        // The fake GPU's shared state, usable by every user of the test.
        chmod(&world.fake_state_dir(), 0o777);
        let state = world.fake_state_dir().join("state");
        std::fs::write(&state, b"").unwrap();
        chmod(&state, 0o666);
        let bin = base.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for a in ["libgpuslice.so", "gpuslice-burn", "gpuslice"] {
            std::fs::copy(artifact(a), bin.join(a)).unwrap();
        }
        let fake = std::fs::read(fake_lib_dir().join("libcuda.so.1")).unwrap();
        for l in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            std::fs::write(bin.join(l), &fake).unwrap();
        }
        for e in std::fs::read_dir(&bin).unwrap() {
            chmod(&e.unwrap().path(), 0o755);
        }
        chmod(&bin, 0o755);
        let mut n = Node {
            world,
            bin,
            monitor: None,
            monitor_args: monitor_args.iter().map(|s| s.to_string()).collect(),
        };
        n.start_monitor();
        n
    }

    pub fn start_monitor(&mut self) {
        // Appended: a restarted monitor's log follows the first one's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root().join("monitor.out"))
            .unwrap();
        let child = self
            .command(0, "gpuslice")
            .args(["monitor", "--mode", "node", "--interval", "50"])
            .args(&self.monitor_args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.monitor = Some(child);
        let sock = self.world.runtime_dir().join("monitor.sock");
        wait_for_file(&sock, || {
            format!("the monitor did not come up: {}", self.monitor_log())
        });
    }

    /// Kill the monitor (SIGKILL: as if it crashed).
    pub fn stop_monitor(&mut self) {
        if let Some(mut c) = self.monitor.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop the monitor cleanly (SIGTERM, as an operator or the kubelet would).
    pub fn terminate_monitor(&mut self) {
        if let Some(mut c) = self.monitor.take() {
            // SAFETY: kill(2) on the pid of our unreaped child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }

    pub fn root(&self) -> PathBuf {
        self.bin.parent().unwrap().to_path_buf()
    }

    pub fn monitor_log(&self) -> String {
        std::fs::read_to_string(self.root().join("monitor.out")).unwrap_or_default()
    }

    /// `program` (one of the copied binaries) as `uid` (0: root) on the fake GPU.
    pub fn command(&self, uid: u32, program: &str) -> Command {
        self.command_as(uid, None, program)
    }

    /// `program` as `uid` with the supplementary groups `groups` (comma-separated gids).
    pub fn command_as(&self, uid: u32, groups: Option<&str>, program: &str) -> Command {
        let base = self.world.command(self.bin.join(program));
        let mut c = if uid == 0 {
            Command::new(self.bin.join(program))
        } else {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"));
            match groups {
                Some(g) => c.arg(format!("--groups={g}")),
                None => c.arg("--clear-groups"),
            };
            c.arg("--").arg(self.bin.join(program));
            c
        };
        for (k, v) in base.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.env("LD_LIBRARY_PATH", &self.bin).current_dir("/");
        c
    }

    /// `gpuslice-burn` under the shim, as `uid`.
    pub fn burn(&self, uid: u32) -> Command {
        let mut c = self.command(uid, "gpuslice-burn");
        c.env("LD_PRELOAD", self.bin.join("libgpuslice.so"));
        c
    }

    /// `gpuslice-burn --alloc ALLOC --json` under the shim as `uid`, with `env`, run to its end
    /// (read its report with [`burn_json`]).
    pub fn allocate(&self, uid: u32, env: &[(&str, &str)], alloc: &str) -> Output {
        let mut c = self.burn(uid);
        c.args(["--alloc", alloc, "--json"]);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// `gpuslice ARGS` as `uid`.
    pub fn cli(&self, uid: u32, args: &[&str]) -> Output {
        self.command(uid, "gpuslice").args(args).output().unwrap()
    }

    pub fn status(&self) -> serde_json::Value {
        let o = self.cli(0, &["status", "--json"]);
        assert!(o.status.success(), "{o:?}");
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// This test binary run as `uid` in child mode `mode` (copied where every user can run it,
    /// the first time).
    pub fn child(&self, uid: u32, mode: &str) -> Command {
        let exe = self.bin.join("tenants");
        if !exe.exists() {
            std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
            chmod(&exe, 0o755);
        }
        let mut c = self.command(uid, "tenants");
        c.args(["--exact", "tenant_child", "--nocapture", "--test-threads=1"])
            .env("TENANTS_CHILD", mode)
            .env("TENANTS_DIR", self.world.runtime_dir());
        c
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_monitor();
    }
}

pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A burn that allocates `alloc` and holds it `hold` seconds, started in the background; its
/// stdout and stderr are kept.
pub fn holder(n: &Node, uid: u32, env: &[(&str, &str)], alloc: &str, hold: &str) -> Child {
    let mut c = n.burn(uid);
    c.args(["--alloc", alloc, "--hold", hold, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// A [`holder`] of slice `slice` with the quota `memory` ([`in_slice`]), returned once the
/// node's `status` shows it in the slice.
pub fn holder_in(
    n: &Node,
    uid: u32,
    (slice, memory): (&str, &str),
    alloc: &str,
    hold: &str,
) -> Child {
    let c = holder(n, uid, &in_slice(slice, memory), alloc, hold);
    wait_for_slice(n, slice, 1);
    c
}

/// Poll the node's `status` every 50 ms until `f` answers, at most `secs` seconds; on time-out
/// panic naming `what`, with the last status and the monitor's log.
pub fn wait_status<T>(
    n: &Node,
    secs: u64,
    what: &str,
    mut f: impl FnMut(&serde_json::Value) -> Option<T>,
) -> T {
    let t0 = Instant::now();
    loop {
        let s = n.status();
        if let Some(v) = f(&s) {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{what}: not within {secs} s: {s:#}\n{}",
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The slices named `slice` in a status.
pub fn slices_named<'a>(
    s: &'a serde_json::Value,
    slice: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> {
    s["slices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |x| x["name"] == slice)
}

/// The slice named `slice` in a status (the first, if it is on several devices); the test fails
/// showing the status when there is none.
pub fn slice_named<'a>(s: &'a serde_json::Value, slice: &'a str) -> &'a serde_json::Value {
    slices_named(s, slice)
        .next()
        .unwrap_or_else(|| panic!("no slice {slice:?}: {s:#}"))
}

/// Kill the background processes `children` and reap them.
pub fn kill_all<'a>(children: impl IntoIterator<Item = &'a mut Child>) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Wait until `status` shows `procs` live processes of slice `slice`.
pub fn wait_for_slice(n: &Node, slice: &str, procs: usize) {
    wait_status(
        n,
        60,
        &format!("slice {slice} with {procs} processes"),
        |s| {
            let have = slices_named(s, slice)
                .map(|x| x["pids"].as_array().map_or(0, |p| p.len()))
                .max()
                .unwrap_or(0);
            (have >= procs).then_some(())
        },
    )
}

/// Wait until the monitor has reaped slice `slice` (10 s at most).
pub fn wait_slice_gone(n: &Node, slice: &str) {
    wait_status(n, 10, &format!("slice {slice} reaped"), |s| {
        slices_named(s, slice).next().is_none().then_some(())
    })
}

pub fn burn_json(o: &Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON: {}", text(o)));
    serde_json::from_str(line).unwrap()
}

/// `cmd`, a `gpuslice-burn` in a 4 GiB slice whose CUDA context is charged `context` bytes
/// inside the quota (node mode: [`crate::fake_context_bytes`]; 0 in personal mode), run with
/// `--alloc 3Gi,<the rest>,512Mi --json`: it sees a 4 GiB GPU, gets 3 GiB and the rest of the
/// quota, and the next 512 MiB is refused with CUDA_ERROR_OUT_OF_MEMORY (2); the test fails
/// showing its output otherwise.
pub fn assert_held_to_4_gib(cmd: &mut Command, context: u64) {
    let gi = 1u64 << 30;
    let rest = gi - context;
    let o = cmd
        .args(["--alloc", &format!("3Gi,{rest},512Mi"), "--json"])
        .output()
        .unwrap();
    let v = burn_json(&o);
    assert_eq!(v["mem_total"], 4 * gi, "{}", text(&o));
    assert_eq!(v["allocated_bytes"], 4 * gi - context, "{}", text(&o));
    assert_eq!(v["alloc_errors"], serde_json::json!([2]), "{}", text(&o));
}
