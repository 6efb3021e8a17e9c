//! What every benchmark runs in: a private fake GPU and ledger ([`Env`]), `gpuslice-burn`
//! tenants started under the shim ([`spawn_burn`]) and their interval lines read back
//! ([`collect`], [`window`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

pub(crate) fn bin_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Environment of one benchmark run: a private fake-GPU state and ledger.
pub(crate) struct Env {
    pub(crate) root: PathBuf,
    pub(crate) fake_libs: Option<PathBuf>,
}

impl Env {
    pub(crate) fn new(tag: &str) -> Env {
        let root =
            std::env::temp_dir().join(format!("gpuslice-bench-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("fakegpu")).unwrap();
        std::fs::create_dir_all(root.join("ledger")).unwrap();
        let fake_libs = (std::env::var("FAKEGPU").as_deref() != Ok("0")).then(|| {
            let lib = bin_dir().join("libfakegpu.so");
            assert!(
                lib.exists(),
                "{} is missing: build with scripts/bench.sh",
                lib.display()
            );
            let dir = root.join("libs");
            std::fs::create_dir_all(&dir).unwrap();
            for n in [
                "libcuda.so.1",
                "libcuda.so",
                "libnvidia-ml.so.1",
                "libnvidia-ml.so",
            ] {
                std::os::unix::fs::symlink(&lib, dir.join(n)).unwrap();
            }
            dir
        });
        Env { root, fake_libs }
    }

    pub(crate) fn command(&self, program: &Path, wrapped: bool) -> Command {
        let mut c = Command::new(program);
        if let Some(l) = &self.fake_libs {
            c.env("LD_LIBRARY_PATH", l)
                .env("FAKEGPU_DEVICES", "1")
                .env("FAKEGPU_MEMORY", "16Gi");
        }
        c.env("FAKEGPU_STATE_DIR", self.root.join("fakegpu"))
            .env("GPUSLICE_RUNTIME_DIR", self.root.join("ledger"))
            .env_remove("LD_PRELOAD");
        for (k, _) in std::env::vars() {
            if k.starts_with("GPUSLICE_COMPUTE") || k == "GPUSLICE_SLICE" || k == "GPUSLICE_MEMORY"
            {
                c.env_remove(k);
            }
        }
        if wrapped {
            c.env("LD_PRELOAD", bin_dir().join("libgpuslice.so"));
        }
        c
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One tenant of a scenario.
#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) share: Option<f64>,
    pub(crate) cap: Option<f64>,
    /// Stop after this many seconds (work conservation); None: the whole run.
    pub(crate) seconds: Option<f64>,
    pub(crate) wrapped: bool,
}

impl Spec {
    pub(crate) fn share(s: f64) -> Spec {
        Spec {
            share: Some(s),
            cap: None,
            seconds: None,
            wrapped: true,
        }
    }
}

pub(crate) struct Ran {
    pub(crate) intervals: Vec<(f64, f64)>, // (t at end, gpu_seconds in the interval)
    pub(crate) report: Value,
}

pub(crate) fn spawn_burn(env: &Env, name: &str, spec: &Spec, args: &[String]) -> Child {
    let mut c = env.command(&bin_dir().join("gpuslice-burn"), spec.wrapped);
    c.args(args)
        .args(["--json", "--report-interval", "1"])
        .env("GPUSLICE_SLICE", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(s) = spec.share {
        c.env("GPUSLICE_COMPUTE", s.to_string());
    }
    if let Some(s) = spec.cap {
        c.env("GPUSLICE_COMPUTE_CAP", s.to_string());
    }
    c.spawn().expect("spawn gpuslice-burn")
}

pub(crate) fn collect(child: Child) -> Ran {
    let out = child.wait_with_output().expect("wait gpuslice-burn");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let report = lines.last().cloned().unwrap_or(Value::Null);
    if !out.status.success() || !report["error"].is_null() {
        eprintln!(
            "gpuslice-bench: a tenant failed: {report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let intervals = lines
        .iter()
        .filter(|v| v["event"] == "interval")
        .map(|v| {
            (
                v["t"].as_f64().unwrap_or(0.0),
                v["gpu_seconds"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    Ran { intervals, report }
}

/// Fraction over the intervals ending in `(from, to]`, and the worst ~1 s window's deviation
/// from `expect`. burn reports on a fixed schedule, so after a launch that blocked past a report
/// time the next report comes early: short intervals are merged into the next one.
pub(crate) fn window(r: &Ran, from: f64, to: f64, expect: f64) -> (f64, f64) {
    let (mut gpu, mut span, mut worst) = (0.0, 0.0, 0.0f64);
    let (mut prev, mut acc_g, mut acc_t) = (0.0, 0.0, 0.0);
    for &(t, g) in &r.intervals {
        if t > from && t <= to + 0.05 {
            gpu += g;
            span += t - prev;
            acc_g += g;
            acc_t += t - prev;
            if acc_t >= 0.9 {
                worst = worst.max((acc_g / acc_t - expect).abs());
                (acc_g, acc_t) = (0.0, 0.0);
            }
        }
        prev = t;
    }
    if span == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    (gpu / span, worst)
}

pub(crate) fn burn_args(kernel_us: u64, launch: &str, seconds: f64) -> Vec<String> {
    let mut a = vec![
        "--kernel-us".into(),
        kernel_us.to_string(),
        "--seconds".into(),
        format!("{seconds}"),
        "--depth".into(),
        "8".into(),
    ];
    match launch {
        "graph" => {
            let n = (1000 / kernel_us).clamp(1, 50);
            a.extend(["--graph".into(), n.to_string()]);
        }
        l => a.extend(["--launch".into(), l.into()]),
    }
    a
}
