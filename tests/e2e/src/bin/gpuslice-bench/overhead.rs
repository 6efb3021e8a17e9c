//! `overhead`: what a `cuLaunchKernel` costs through the shim, alone and contended.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{burn_args, spawn_burn, Env, Spec};

pub(crate) fn overhead(launches: usize) {
    let me = std::env::current_exe().unwrap();
    let run = |env: &Env, wrapped: bool| -> Value {
        let out = env
            .command(&me, wrapped)
            .args(["launch-loop", &launches.to_string()])
            .env("GPUSLICE_COMPUTE", "0.5")
            .output()
            .expect("spawn launch-loop");
        let s = String::from_utf8_lossy(&out.stdout);
        s.lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| {
                panic!(
                    "launch-loop printed nothing: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    let env = Env::new("overhead");
    let mut rows = vec![];
    for _ in 0..3 {
        rows.push(("direct", run(&env, false)));
        rows.push(("shim, alone", run(&env, true)));
    }
    // Contended: a neighbour slice saturating the device with 1 ms kernels at share 0.5. The
    // fake's own launch costs more while its engine is busy, so the contended shim is compared
    // with a direct run next to the same neighbour, alternated.
    let spec = Spec::share(0.5);
    let neighbour = spawn_burn(&env, "neighbour", &spec, &burn_args(1000, "plain", 60.0));
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        rows.push(("direct, busy", run(&env, false)));
        rows.push(("shim, contended", run(&env, true)));
    }
    let mut neighbour = neighbour;
    let _ = neighbour.kill();
    let _ = neighbour.wait();
    let med = |name: &str, k: &str| -> f64 {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, r)| r[k].as_f64().unwrap())
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!(
        "{:<16} {:>10} {:>10} {:>12}",
        "launch", "median ns", "p90 ns", "over direct"
    );
    for (name, base) in [
        ("direct", "direct"),
        ("shim, alone", "direct"),
        ("direct, busy", "direct, busy"),
        ("shim, contended", "direct, busy"),
    ] {
        let m = med(name, "median_ns");
        println!(
            "{:<16} {:>10.0} {:>10.0} {:>12.0}",
            name,
            m,
            med(name, "p90_ns"),
            m - med(base, "median_ns")
        );
    }
}
