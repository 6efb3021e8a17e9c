//! Helpers for gpuslice's system tests: where the built artifacts are, and how to start
//! processes on the fake GPU, with or without the shim, each test with its own private fake-GPU
//! state and ledger so tests never see each other.
//!
//! The artifacts (`libfakegpu.so`, `libgpuslice.so`, `gpuslice-burn`, `gpuslice`) are found
//! beside the test executable's profile directory, so `cargo build --workspace && cargo test
//! --workspace` (what `scripts/test.sh` runs) uses the ones just built, whatever
//! `CARGO_TARGET_DIR` is. `cargo test -p gpuslice-e2e` alone does not rebuild them (they are
//! not dependencies of this crate), so [`artifact`] refuses one older than a source it is built
//! from and says what to run.

pub mod container;
pub mod node;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One mebibyte.
pub const MI: u64 = 1 << 20;
/// One gibibyte.
pub const GI: u64 = 1 << 30;

/// Device memory one context takes on a fake device of `total` bytes with the default
/// `FAKEGPU_CONTEXT_MEMORY` (docs/fakegpu.md, "Headroom"): 1/32 of the device, at most 512 MiB.
/// It shows in the device's used memory and in the process's NVML usage, and node mode charges
/// it inside the quota of the process's slice (issue #34).
pub fn fake_context_bytes(total: u64) -> u64 {
    (total / 32).min(512 * MI)
}

/// Every allocation path `gpuslice-burn --alloc-path` knows: the system tests run each one.
pub const ALLOC_PATHS: [&str; 11] = [
    "plain", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap", "graph",
    "capture",
];

/// A command line's words, split at white space: `words("--alloc 1Gi --json")`. For the tests'
/// command lines, none of whose arguments has a space in it.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// `target/<profile>` of this build: a test executable lives in `target/<profile>/deps`, a
/// binary of this crate (`gpuslice-bench`) in `target/<profile>`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("the executable has a directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The workspace crates each artifact the tests run is built from: `cargo test -p
/// gpuslice-e2e` does not rebuild them (nothing here depends on them as crates), so
/// [`artifact`] refuses one older than any of their sources.
const BUILT_FROM: &[(&str, &[&str])] = &[
    (
        "libgpuslice.so",
        &["shim", "ledger", "sched", "protocol", "quantity", "abi"],
    ),
    (
        "gpuslice",
        &[
            "monitor", "ledger", "sched", "protocol", "quantity", "abi", "nvml", "cdi",
        ],
    ),
    ("gpuslice-burn", &["tests/burn", "quantity", "abi"]),
];

/// The newest `.rs` file under `dir` (recursively), with its modification time.
fn newest_source(dir: &std::path::Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let found = if p.is_dir() {
            newest_source(&p)
        } else if p.extension().is_some_and(|x| x == "rs") {
            e.metadata().and_then(|m| m.modified()).ok().map(|t| (t, p))
        } else {
            None
        };
        if let Some(f) = found {
            if newest.as_ref().is_none_or(|n| f.0 > n.0) {
                newest = Some(f);
            }
        }
    }
    newest
}

/// A built artifact of the workspace; panics with what to run when it is missing, or older
/// than a source file it is built from (a test would otherwise run yesterday's shim).
pub fn artifact(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before the tests (scripts/test.sh does)",
        p.display()
    );
    // Once per artifact and test process: the walk reads a few hundred directory entries.
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if checked.iter().any(|c| c == name) {
        return p;
    }
    checked.push(name.to_string());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let crates = BUILT_FROM
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(&[][..], |(_, c)| c);
    let built = std::fs::metadata(&p).and_then(|m| m.modified()).ok();
    for c in crates {
        if let (Some(built), Some((changed, source))) =
            (built, newest_source(&root.join(c).join("src")))
        {
            assert!(
                changed <= built,
                "{} is older than {}: run `cargo build --workspace` before the tests \
                 (scripts/test.sh does)",
                p.display(),
                source.display()
            );
        }
    }
    p
}

/// A directory holding `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1` and `libnvidia-ml.so`,
/// all links to this build's `libfakegpu.so`: what goes on `LD_LIBRARY_PATH`.
pub fn fake_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = artifact("libfakegpu.so");
        let dir = profile_dir().join("fakegpu-libs");
        std::fs::create_dir_all(&dir).expect("create fakegpu-libs");
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).expect("symlink fake library");
        }
        dir
    })
}

/// Variables of the caller that a test's processes never inherit, by prefix: a developer's own
/// gpuslice, HAMi, fake-GPU and numba settings. The same list as `gpu_env` in
/// tests/python/conftest.py, so both suites start their clients alike.
pub const SCRUBBED_PREFIXES: [&str; 4] = ["GPUSLICE_", "CUDA_DEVICE_", "FAKEGPU_", "NUMBA_"];
/// Variables a test's processes never inherit, by name (as in conftest.py's `gpu_env`).
pub const SCRUBBED: [&str; 4] = [
    "LD_PRELOAD",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
];

/// Remove from `c`'s environment every variable of [`SCRUBBED_PREFIXES`] and [`SCRUBBED`]
/// that this process has.
pub fn scrub(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if SCRUBBED_PREFIXES.iter().any(|p| k.starts_with(p)) || SCRUBBED.contains(&k) {
            c.env_remove(k);
        }
    }
}

/// Wait for `child` at most `limit`; past it, kill it and fail the test naming `what` (for
/// checks whose failure mode is a hang).
pub fn wait_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (hung?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Wait until `path` exists, at most 30 s; past that the test fails saying `why_not()`.
pub fn wait_for_file(path: &Path, why_not: impl Fn() -> String) {
    let t0 = std::time::Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "{}",
            why_not()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A private world for one test: its own fake-GPU state directory and ledger directory,
/// removed when dropped.
pub struct World {
    root: PathBuf,
    /// Extra environment applied to every command this world builds.
    pub env: Vec<(String, String)>,
}

impl World {
    /// A new world with `devices` fake devices of `memory` each (fake-GPU size syntax, e.g. `16Gi`).
    pub fn new(devices: u32, memory: &str) -> World {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("gpuslice-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("fakegpu")).unwrap();
        std::fs::create_dir_all(root.join("ledger")).unwrap();
        World {
            env: vec![
                ("FAKEGPU_DEVICES".into(), devices.to_string()),
                ("FAKEGPU_MEMORY".into(), memory.into()),
            ],
            root,
        }
    }

    /// The fake GPU's shared state directory (`FAKEGPU_STATE_DIR`).
    pub fn fake_state_dir(&self) -> PathBuf {
        self.root.join("fakegpu")
    }

    /// The ledger directory (`GPUSLICE_RUNTIME_DIR`).
    pub fn runtime_dir(&self) -> PathBuf {
        self.root.join("ledger")
    }

    /// A command that runs `program` against the fake GPU, without the shim. The caller's
    /// own settings never leak in ([`scrub`]); the world's are set after.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        scrub(&mut c);
        c.env("LD_LIBRARY_PATH", fake_lib_dir())
            .env("FAKEGPU_STATE_DIR", self.fake_state_dir())
            .env("GPUSLICE_RUNTIME_DIR", self.runtime_dir());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// A command that runs `program` on the fake GPU with `libgpuslice.so` preloaded.
    pub fn wrapped(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.command(program);
        c.env("LD_PRELOAD", artifact("libgpuslice.so"));
        c
    }

    /// `gpuslice-burn` on the fake GPU, without the shim.
    pub fn burn(&self) -> Command {
        self.command(artifact("gpuslice-burn"))
    }

    /// `gpuslice-burn` on the fake GPU under the shim.
    pub fn wrapped_burn(&self) -> Command {
        self.wrapped(artifact("gpuslice-burn"))
    }

    /// The `gpuslice` CLI pointed at this world's ledger and fake GPU.
    pub fn gpuslice(&self) -> Command {
        self.command(artifact("gpuslice"))
    }

    /// `gpuslice ARGS` in this world, which must succeed ([`succeeds`]): its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&succeeds(self.gpuslice().args(args)).stdout).into_owned()
    }

    /// `gpuslice status --json` in this world, parsed ([`run_json`]).
    pub fn status(&self) -> serde_json::Value {
        run_json(self.gpuslice().args(["status", "--json"]))
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The environment of a process of slice `slice` with the memory quota `memory`; `Command::envs` takes it.
pub fn in_slice<'a>(slice: &'a str, memory: &'a str) -> [(&'static str, &'a str); 2] {
    [("GPUSLICE_SLICE", slice), ("GPUSLICE_MEMORY", memory)]
}

/// The first line `child` printed on its piped stdout, and that line as JSON (`Null` if it is
/// not JSON). The stdout stays open in `child`, so it does not die of SIGPIPE when it prints
/// more.
pub fn first_line(child: &mut std::process::Child) -> (String, serde_json::Value) {
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("read the child's stdout");
    child.stdout = Some(out.into_inner());
    let v = serde_json::from_str(line.trim()).unwrap_or(serde_json::Value::Null);
    (line, v)
}

/// Spawn `cmd`, a `gpuslice-burn ... --hold S --json`, and return once it reports that it
/// holds its allocations (its first line, `{"event":"holding",...}`), with that report (the
/// test fails if it reports anything else).
pub fn spawn_holding(cmd: &mut Command) -> (std::process::Child, serde_json::Value) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn gpuslice-burn");
    let (line, v) = first_line(&mut child);
    if v["event"] != "holding" {
        let _ = child.kill();
        let _ = child.wait();
        panic!("burn did not report holding: {line:?}");
    }
    (child, v)
}

/// Run `cmd` to its end, which must succeed: the test fails with its status and stderr when it
/// does not, or cannot start.
pub fn succeeds(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start (is the program installed?): {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run a command to completion and parse the last line of its stdout as JSON, panicking with the
/// command's stderr when it fails or prints no JSON.
pub fn run_json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().expect("spawn");
    last_json(
        cmd,
        out.status,
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
}

/// The last line of `stdout` that parses as a JSON object; the test fails showing both streams
/// when there is none.
fn last_json(
    cmd: &Command,
    status: std::process::ExitStatus,
    stdout: &str,
    stderr: &str,
) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    match line.map(serde_json::from_str) {
        Some(Ok(v)) => v,
        _ => panic!(
            "{cmd:?} printed no JSON (status {status:?})\nstdout:\n{stdout}\nstderr:\n{stderr}"
        ),
    }
}

/// Like [`run_json`], but a command still running after `limit` is killed and the test fails
/// saying so: for checks whose failure mode is a hang.
pub fn run_json_within(cmd: &mut Command, limit: std::time::Duration) -> serde_json::Value {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Drain the pipes on threads so a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still ran after {limit:?} (hung?)\nstdout:\n{}\nstderr:\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    last_json(cmd, status, &stdout, &stderr)
}
