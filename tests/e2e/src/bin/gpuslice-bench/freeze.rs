//! `freeze`: issue 14's pair started together and apart, N times: the longest gap without a
//! completed kernel and the worst 5 s split.

use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{bin_dir, Env};

/// One tenant's interval lines on CLOCK_MONOTONIC: (start, end, kernels, gpu_seconds).
pub(crate) fn mono_spans(child: Child) -> Vec<(f64, f64, u64, f64)> {
    let out = child.wait_with_output().expect("wait gpuslice-burn");
    let mut prev: Option<f64> = None;
    let mut spans = Vec::new();
    for v in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "interval")
    {
        let (t, mono) = (
            v["t"].as_f64().unwrap_or(0.0),
            v["mono"].as_f64().unwrap_or(0.0),
        );
        let start = prev.unwrap_or(mono - t);
        let k = v["kernels"].as_u64().unwrap_or(0);
        spans.push((start, mono, k, v["gpu_seconds"].as_f64().unwrap_or(0.0)));
        prev = Some(mono);
    }
    if !out.status.success() {
        eprintln!(
            "gpuslice-bench: a tenant failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    spans
}

/// `freeze`: issue 14's pair (0.25/0.75, 1 ms kernels, depth 2) `runs` times, the second tenant
/// started 0-300 ms after the first (every fifth run together); per run, over the window in
/// which both ran: each tenant's longest stretch without a completed kernel, and the worst
/// deviation of the 0.25 tenant's part from 0.25 over any 5 s window (stepped by 0.2 s).
pub(crate) fn freeze(runs: usize, seconds: f64) {
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "run", "delay_ms", "gap_0.25", "gap_0.75", "worst_5s", "part_all"
    );
    let (mut worst_gap, mut worst_dev, mut bad) = (0.0f64, 0.0f64, 0);
    for i in 0..runs {
        // A fixed sequence, so two benchmark runs try the same delays.
        let delay_ms = if i % 5 == 0 { 0 } else { (i as u64 * 97) % 301 };
        let env = Env::new(&format!("freeze{i}"));
        let args: Vec<String> = [
            "--kernel-us",
            "1000",
            "--depth",
            "2",
            "--seconds",
            &seconds.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let spawn = |name: &str, share: f64| {
            let mut c = env.command(&bin_dir().join("gpuslice-burn"), true);
            c.args(&args)
                .args(["--json", "--report-interval", "0.2"])
                .env("GPUSLICE_SLICE", name)
                .env("GPUSLICE_COMPUTE", share.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().expect("spawn gpuslice-burn")
        };
        let a = spawn("quarter", 0.25);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let b = spawn("three-quarters", 0.75);
        let (a, b) = (mono_spans(a), mono_spans(b));
        let (Some(fa), Some(fb), Some(la), Some(lb)) = (a.first(), b.first(), a.last(), b.last())
        else {
            println!("{i:>4} {delay_ms:>9} no intervals");
            bad += 1;
            continue;
        };
        let (from, to) = (fa.0.max(fb.0) + 0.2, la.1.min(lb.1) - 0.2);
        let gap = |sp: &[(f64, f64, u64, f64)]| {
            let (mut last, mut g) = (from, 0.0f64);
            for &(_, e, k, _) in sp.iter().filter(|s| s.1 >= from && s.1 <= to) {
                if k > 0 {
                    g = g.max(e - last);
                    last = e;
                }
            }
            g.max(to - last)
        };
        let gpu = |sp: &[(f64, f64, u64, f64)], x: f64, y: f64| -> f64 {
            sp.iter()
                .filter(|s| s.0 >= x - 1e-6 && s.1 <= y + 1e-6)
                .map(|s| s.3)
                .sum()
        };
        let (ga, gb) = (gap(&a), gap(&b));
        let mut dev = 0.0f64;
        let mut w = from;
        while w + 5.0 <= to + 1e-6 {
            let (x, y) = (gpu(&a, w, w + 5.0), gpu(&b, w, w + 5.0));
            if x + y > 0.0 {
                dev = dev.max((x / (x + y) - 0.25).abs());
            }
            w += 0.2;
        }
        let (x, y) = (gpu(&a, from, to), gpu(&b, from, to));
        let part = x / (x + y).max(1e-9);
        println!("{i:>4} {delay_ms:>9} {ga:>9.3} {gb:>9.3} {dev:>10.3} {part:>9.3}");
        worst_gap = worst_gap.max(ga.max(gb));
        worst_dev = worst_dev.max(dev);
        if ga.max(gb) > 1.2 || dev > 0.04 {
            bad += 1;
        }
    }
    println!(
        "freeze: {runs} runs, longest gap {worst_gap:.3} s (limit 1.2), worst 5 s deviation \
         {worst_dev:.3} (limit 0.04), runs over a limit: {bad}"
    );
}
