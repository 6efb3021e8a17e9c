//! `gpuslice-bench`: the compute-share benchmark behind `scripts/bench.sh` (a benchmark, not a
//! test: it reports numbers, it asserts nothing).
//!
//! - `gpuslice-bench shares [--scenario A,B] [--kernel-us N,M] [--launch plain,ex,graph]
//!   [--seconds S] [--all]`: runs `gpuslice-burn` tenants under the shim on the fake GPU (or on
//!   whatever `libcuda.so.1` the environment provides) and prints, per scenario and tenant, the
//!   assigned share, the achieved fraction over the measured window (S − 2 s, default 10 s) and
//!   the worst 1 s interval. Achieved = burn's own count of completed kernels × kernel time,
//!   never the scheduler's bookkeeping.
//! - `gpuslice-bench overhead [--launches N]`: ns per `cuLaunchKernel` call, direct, under the
//!   shim alone on the device, and under the shim while another slice contends (median of the
//!   admitted calls, so time spent waiting for a turn is not counted as overhead).
//! - `gpuslice-bench freeze [--runs N] [--seconds S]`: issue 14's pair started together and
//!   0-300 ms apart, N times: longest gap without a completed kernel and worst 5 s split.
//! - `gpuslice-bench latency [--seconds S]`: a request/response client (bursts of 20 kernels)
//!   alone, next to a trainer, and next to it with `GPUSLICE_PRIORITY=latency`: p50/p99 burst
//!   latency and the trainer's GPU fraction (`burst-loop` is the client it runs).
//! - `gpuslice-bench pair [--depths 1,2,8] [--modes personal,node] [--runs 5] [--seconds 12]`:
//!   issue 20's pair (0.25 / 0.75, 1 ms kernels) at each queue depth in each mode (node mode
//!   needs root: a root monitor, the tenants two unprivileged users): the 0.25 tenant's
//!   fraction of the device over the middle of each run, and the median.
//! - `gpuslice-bench launch-loop N`: the client `overhead` runs (times N launch calls).
//!
//! Artifacts (`gpuslice-burn`, `libgpuslice.so`, `libfakegpu.so`) are looked up beside this
//! executable; `FAKEGPU=0` in the environment uses the system's `libcuda.so.1` instead.

mod client;
mod freeze;
mod harness;
mod latency;
mod overhead;
mod pair;
mod shares;

use client::{burst_loop, launch_loop};
use freeze::freeze;
use latency::latency;
use overhead::overhead;
use pair::{pair, PairOpts};
use shares::{shares, Opts};

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// One subcommand and the flags it takes: each flag's name and what its value looks like
/// (empty for a switch). The usage text and the check of a command line both come from
/// [`COMMANDS`], so they cannot drift apart (as the monitor's `commands.rs`).
struct Command {
    name: &'static str,
    flags: &'static [(&'static str, &'static str)],
}

/// Every subcommand a user runs (`launch-loop` and `burst-loop` are the harness's own).
const COMMANDS: &[Command] = &[
    Command {
        name: "shares",
        flags: &[
            ("--scenario", "pair,article,eight,cap,idle,alone"),
            ("--kernel-us", "20,1000,5000"),
            ("--launch", "plain,ex,graph"),
            ("--seconds", "S"),
            ("--all", ""),
        ],
    },
    Command {
        name: "overhead",
        flags: &[("--launches", "N")],
    },
    Command {
        name: "freeze",
        flags: &[("--runs", "N"), ("--seconds", "S")],
    },
    Command {
        name: "latency",
        flags: &[("--seconds", "S")],
    },
    Command {
        name: "pair",
        flags: &[
            ("--depths", "1,2,8"),
            ("--modes", "personal,node"),
            ("--runs", "N"),
            ("--seconds", "S"),
        ],
    },
];

/// Every argument after the subcommand is a known flag or a flag's value: a misspelt flag
/// (or `--help`) must not start a run of several minutes with the defaults.
fn check_flags(args: &[String]) {
    let Some(cmd) = COMMANDS.iter().find(|c| c.name == args[0]) else {
        return;
    };
    let mut i = 1;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--help" || a == "-h" {
            usage_to(0);
        }
        let Some((_, value)) = cmd.flags.iter().find(|(f, _)| *f == a) else {
            let known: Vec<&str> = cmd.flags.iter().map(|(f, _)| *f).collect();
            eprintln!(
                "gpuslice-bench {}: unknown argument {a:?}; it takes {}",
                args[0],
                known.join(", ")
            );
            usage();
        };
        if !value.is_empty() && i + 1 >= args.len() {
            eprintln!("gpuslice-bench {}: {a} needs a value", args[0]);
            usage();
        }
        i += if value.is_empty() { 1 } else { 2 };
    }
}

fn usage() -> ! {
    usage_to(2)
}

fn usage_to(code: i32) -> ! {
    let mut lines = vec![];
    for c in COMMANDS {
        let mut line = format!("gpuslice-bench {}", c.name);
        for (f, v) in c.flags {
            if v.is_empty() {
                line.push_str(&format!(" [{f}]"));
            } else {
                line.push_str(&format!(" [{f} {v}]"));
            }
        }
        lines.push(line);
    }
    lines.push("gpuslice-bench launch-loop N".into());
    eprintln!("usage: {}", lines.join("\n       "));
    std::process::exit(code)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { usage() };
    if cmd == "--help" || cmd == "-h" {
        usage_to(0);
    }
    check_flags(&args);
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    match cmd.as_str() {
        "shares" => {
            let all = args.iter().any(|a| a == "--all");
            let mut o = Opts {
                scenarios: list("pair,article,eight,cap,idle,alone"),
                kernels: vec![1000],
                launches: list("plain"),
                seconds: 12.0,
            };
            if all {
                o.kernels = vec![20, 1000, 5000];
                o.launches = list("plain,ex,graph");
            }
            if let Some(v) = value("--scenario") {
                o.scenarios = list(v);
            }
            if let Some(v) = value("--kernel-us") {
                o.kernels = list(v)
                    .iter()
                    .map(|k| k.parse().unwrap_or_else(|_| usage()))
                    .collect();
            }
            if let Some(v) = value("--launch") {
                o.launches = list(v);
            }
            if let Some(v) = value("--seconds") {
                o.seconds = v.parse().unwrap_or_else(|_| usage());
            }
            shares(&o);
        }
        "overhead" => {
            let n = value("--launches").map_or(20_000, |v| v.parse().unwrap_or_else(|_| usage()));
            overhead(n);
        }
        "freeze" => {
            let runs = value("--runs").map_or(50, |v| v.parse().unwrap_or_else(|_| usage()));
            let secs = value("--seconds").map_or(6.0, |v| v.parse().unwrap_or_else(|_| usage()));
            freeze(runs, secs);
        }
        "pair" => {
            let number = |v: &str| -> f64 { v.parse().unwrap_or_else(|_| usage()) };
            let o = PairOpts {
                depths: value("--depths").map_or(vec![1, 2, 8], |v| {
                    list(v).iter().map(|d| number(d) as u64).collect()
                }),
                modes: list(value("--modes").map_or("personal,node", |v| v)),
                runs: value("--runs").map_or(5, |v| number(v) as usize),
                seconds: value("--seconds").map_or(12.0, |v| number(v)),
            };
            pair(&o);
        }
        "latency" => {
            let secs = value("--seconds").map_or(8.0, |v| v.parse().unwrap_or_else(|_| usage()));
            latency(secs);
        }
        "burst-loop" => {
            let secs: f64 = args
                .get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            let us: u64 = args
                .get(2)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            burst_loop(secs, us);
        }
        "launch-loop" => {
            let n = args
                .get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            launch_loop(n);
        }
        _ => usage(),
    }
}
