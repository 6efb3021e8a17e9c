//! `latency`: a request/response client alone, next to a trainer, and next to it with
//! `GPUSLICE_PRIORITY=latency`.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{burn_args, collect, spawn_burn, window, Env, Spec};

/// `latency`: the request/response client (20 kernels of 50 us a burst) alone, next to a
/// trainer (burn, 2 ms kernels 16 deep, share 0.6) without priority, and with
/// `GPUSLICE_PRIORITY=latency`; its p50/p99 burst latency and the trainer's GPU fraction.
pub(crate) fn latency(seconds: f64) {
    let me = std::env::current_exe().unwrap();
    println!(
        "{:<26} {:>8} {:>8} {:>10}",
        "case", "p50 ms", "p99 ms", "trainer"
    );
    for case in ["alone", "colocated, normal", "colocated, latency"] {
        let env = Env::new("latency");
        let trainer = (case != "alone").then(|| {
            let spec = Spec::share(0.6);
            let mut args = burn_args(2000, "plain", seconds + 1.0);
            let d = args.iter().position(|a| a == "--depth").unwrap();
            args[d + 1] = "16".into();
            spawn_burn(&env, "trainer", &spec, &args)
        });
        std::thread::sleep(Duration::from_millis(500));
        let mut c = env.command(&me, true);
        c.args(["burst-loop", &seconds.to_string(), "50"])
            .env("GPUSLICE_SLICE", "server")
            .env("GPUSLICE_COMPUTE", "0.2");
        if case.ends_with("latency") {
            c.env("GPUSLICE_PRIORITY", "latency");
        }
        let out = c.output().expect("spawn burst-loop");
        let v: Value = String::from_utf8_lossy(&out.stdout)
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        let tf = trainer
            .map(collect)
            .map_or(f64::NAN, |r| window(&r, 1.0, seconds, 0.6).0);
        println!(
            "{:<26} {:>8.2} {:>8.2} {:>10.3}",
            case,
            v["p50_ms"].as_f64().unwrap_or(f64::NAN),
            v["p99_ms"].as_f64().unwrap_or(f64::NAN),
            tf
        );
    }
}
