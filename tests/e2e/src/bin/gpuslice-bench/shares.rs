//! `shares`: the scenarios (pair, article, eight, cap, idle, alone) and the table of achieved
//! fractions against the assigned shares.

use std::process::Child;

use crate::harness::{burn_args, collect, spawn_burn, window, Env, Ran, Spec};

/// What a scenario expects each tenant to achieve over the window (and after the idle point).
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) tenants: Vec<Spec>,
    /// Expected fraction per tenant.
    pub(crate) expect: Vec<f64>,
    /// Run the tenants one after another (each alone on the device), not together.
    pub(crate) sequential: bool,
}

pub(crate) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "pair",
            tenants: vec![Spec::share(0.25), Spec::share(0.75)],
            expect: vec![0.25, 0.75],
            sequential: false,
        },
        Scenario {
            name: "article",
            tenants: vec![Spec::share(0.2), Spec::share(0.5), Spec::share(0.3)],
            expect: vec![0.2, 0.5, 0.3],
            sequential: false,
        },
        Scenario {
            name: "eight",
            tenants: vec![Spec::share(0.125); 8],
            expect: vec![0.125; 8],
            sequential: false,
        },
        Scenario {
            name: "cap",
            tenants: vec![Spec {
                share: None,
                cap: Some(0.3),
                seconds: None,
                wrapped: true,
            }],
            expect: vec![0.3],
            sequential: false,
        },
        // Work conservation: the second tenant stops halfway; the first should then have all of
        // it. Reported over the second half for the first tenant.
        Scenario {
            name: "idle",
            tenants: vec![
                Spec::share(0.5),
                Spec {
                    seconds: Some(0.5),
                    ..Spec::share(0.5)
                },
            ],
            expect: vec![1.0, 0.5],
            sequential: false,
        },
        // Alone with a share, against the same load unwrapped (the ratio is what counts).
        Scenario {
            name: "alone",
            tenants: vec![
                Spec::share(0.25),
                Spec {
                    wrapped: false,
                    ..Spec::share(0.25)
                },
            ],
            expect: vec![1.0, 1.0],
            sequential: true,
        },
    ]
}

pub(crate) fn shares(opts: &Opts) {
    println!(
        "{:<8} {:>7} {:<6} {:>6} {:>9} {:>9} {:>9} {:>10}",
        "scenario", "kernel", "launch", "tenant", "assigned", "expected", "achieved", "worst-1s"
    );
    for sc in scenarios()
        .into_iter()
        .filter(|s| opts.scenarios.iter().any(|n| n == s.name))
    {
        for &k in &opts.kernels {
            for launch in &opts.launches {
                let env = Env::new(sc.name);
                let total = opts.seconds;
                let start = |(i, spec): (usize, &Spec)| {
                    let secs = spec.seconds.map_or(total, |f| total * f);
                    let args = burn_args(k, launch, secs);
                    spawn_burn(&env, &format!("{}{i}", sc.name), spec, &args)
                };
                let runs: Vec<Ran> = if sc.sequential {
                    sc.tenants
                        .iter()
                        .enumerate()
                        .map(|t| collect(start(t)))
                        .collect()
                } else {
                    let children: Vec<Child> = sc.tenants.iter().enumerate().map(start).collect();
                    children.into_iter().map(collect).collect()
                };
                for (i, (r, spec)) in runs.iter().zip(&sc.tenants).enumerate() {
                    let expect = sc.expect[i];
                    // The measured window: after a 1 s start, before the last second; for the
                    // idle scenario's stayer, the part after its neighbour left.
                    let (from, to) = match (sc.name, i) {
                        ("idle", 0) => (total * 0.5 + 1.0, total - 1.0),
                        ("idle", 1) => (1.0, total * 0.5 - 0.5),
                        _ => (1.0, total - 1.0),
                    };
                    let (got, worst) = window(r, from, to, expect);
                    let assigned = match (spec.share, spec.cap, spec.wrapped) {
                        (_, _, false) => "direct".to_string(),
                        (_, Some(c), _) => format!("cap {c}"),
                        (Some(s), _, _) => format!("{s}"),
                        _ => "-".into(),
                    };
                    println!(
                        "{:<8} {:>5}us {:<6} {:>6} {:>9} {:>9.3} {:>9.3} {:>10.3}",
                        sc.name, k, launch, i, assigned, expect, got, worst
                    );
                    let _ = &r.report;
                }
                if sc.name == "alone" {
                    let w = window(&runs[0], 1.0, total - 1.0, 1.0).0;
                    let d = window(&runs[1], 1.0, total - 1.0, 1.0).0;
                    println!(
                        "{:<8} {:>5}us {:<6} wrapped/direct throughput: {:.3}",
                        sc.name,
                        k,
                        launch,
                        w / d
                    );
                }
            }
        }
    }
}

pub(crate) struct Opts {
    pub(crate) scenarios: Vec<String>,
    pub(crate) kernels: Vec<u64>,
    pub(crate) launches: Vec<String>,
    pub(crate) seconds: f64,
}
