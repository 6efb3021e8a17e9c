//! `pair`: issue 20's headline pair, 0.25 / 0.75 with 1 ms kernels, at several queue depths,
//! in personal mode (the tenants' own scheduler, one user) and in node mode (a root monitor
//! granting turns to two unprivileged users; needs root): what the 0.25 tenant got of the
//! device over the run's middle, per run and the median. Before each run, a control: one
//! launcher at the same depth alone on the fake without gpuslice, for a third of the run: how
//! busy such a launcher can keep the device on this host now (at depth 1 its own gaps between
//! kernels, a wake-up and a launch each, idle the device however it is shared).

use std::process::{Child, Stdio};

use crate::harness::{bin_dir, collect, window, Env, Ran};
use gpuslice_e2e::node::{in_slice, wait_for_slice, Node, TENANT_A, TENANT_B};

pub(crate) struct PairOpts {
    pub(crate) depths: Vec<u64>,
    pub(crate) modes: Vec<String>,
    pub(crate) runs: usize,
    pub(crate) seconds: f64,
}

/// burn's arguments: 1 ms kernels `depth` deep for `seconds`, an interval line every second.
fn args(depth: u64, seconds: f64) -> Vec<String> {
    [
        "--kernel-us",
        "1000",
        "--depth",
        &depth.to_string(),
        "--seconds",
        &seconds.to_string(),
        "--json",
        "--report-interval",
        "1",
    ]
    .map(String::from)
    .to_vec()
}

/// The control: one launcher alone on the fake, without gpuslice; its fraction of the device.
fn alone(depth: u64, seconds: f64) -> f64 {
    let env = Env::new("pair-alone");
    let c = env
        .command(&bin_dir().join("gpuslice-burn"), false)
        .args(args(depth, seconds))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpuslice-burn");
    window(&collect(c), 1.0, seconds, 1.0).0
}

/// One personal-mode run: both tenants under the shim as this user.
fn personal(depth: u64, seconds: f64) -> (Ran, Ran) {
    let env = Env::new("pair");
    let start = |slice: &str, share: &str| -> Child {
        env.command(&bin_dir().join("gpuslice-burn"), true)
            .args(args(depth, seconds))
            .env("GPUSLICE_SLICE", slice)
            .env("GPUSLICE_COMPUTE", share)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gpuslice-burn")
    };
    let (a, b) = (start("quarter", "0.25"), start("three-quarters", "0.75"));
    (collect(a), collect(b))
}

/// One node-mode run: a root monitor in node mode, the tenants two unprivileged users.
fn node(depth: u64, seconds: f64) -> (Ran, Ran) {
    let n = Node::new(1, "16Gi", &[]);
    let start = |uid: u32, slice: &str, share: &str| -> Child {
        n.burn(uid)
            .args(args(depth, seconds))
            .envs(in_slice(slice, "1Gi"))
            .env("GPUSLICE_COMPUTE", share)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gpuslice-burn")
    };
    let a = start(TENANT_A, "quarter", "0.25");
    let b = start(TENANT_B, "three-quarters", "0.75");
    wait_for_slice(&n, "quarter", 1);
    (collect(a), collect(b))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn pair(o: &PairOpts) {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let control = (o.seconds / 3.0).max(3.0);
    println!(
        "0.25 / 0.75, 1 ms kernels, {} runs of {} s each, measured from 1 s to {} s (burn's own \
         count): the 0.25 tenant's fraction of the device, its part of what the two got, and \
         the device's busy fraction against one launcher's alone without gpuslice just before \
         ({control} s, from 1 s); {build} build (the launch round trip at depth 1 is the \
         build's)",
        o.runs,
        o.seconds,
        o.seconds - 1.0,
        build = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    );
    for mode in &o.modes {
        if mode == "node" && !root {
            println!("node     skipped: needs root (a root monitor, tenants as other users)");
            continue;
        }
        for &depth in &o.depths {
            let (mut quarter, mut part, mut each) = (vec![], vec![], vec![]);
            let (mut busy, mut lone) = (vec![], vec![]);
            for _ in 0..o.runs {
                let solo = alone(depth, control);
                let (a, b) = match mode.as_str() {
                    "node" => node(depth, o.seconds),
                    _ => personal(depth, o.seconds),
                };
                let fa = window(&a, 1.0, o.seconds - 1.0, 0.25).0;
                let fb = window(&b, 1.0, o.seconds - 1.0, 0.75).0;
                quarter.push(fa);
                part.push(fa / (fa + fb));
                busy.push(fa + fb);
                lone.push(solo);
                each.push(format!("{fa:.3}/{fb:.3} (alone {solo:.3})"));
            }
            println!(
                "{mode:<8} depth {depth}: 0.25 tenant median {:.3} of the device, part {:.3}; \
                 device busy {:.3}, one launcher alone {:.3}; each run 0.25/0.75: {}",
                median(quarter),
                median(part),
                median(busy),
                median(lone),
                each.join(", ")
            );
        }
    }
}
