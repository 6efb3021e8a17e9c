//! Many processes at once and processes killed mid-allocation, observed from outside through
//! the ledger (this test plays the monitor's part: it samples and reaps).

use gpuslice_e2e::{artifact, fake_context_bytes, spawn_holding, wait_within, World, GI, MI};
use gpuslice_ledger::{Cap, Ledger, OperatorSlice, Share};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Register the fake device in a fresh ledger and create an operator slice on it.
fn operator_slice(w: &World, name: &str, memory: u64) -> Ledger {
    let out = w.burn().arg("--json").output().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let uuid = v["device"]["uuid"].as_str().unwrap().to_string();
    let ledger = Ledger::open_or_create(&w.runtime_dir()).unwrap();
    ledger
        .ensure_device(&uuid, "fake", v["mem_total"].as_u64().unwrap())
        .unwrap();
    ledger
        .create_operator_slice(&OperatorSlice {
            name: name.into(),
            device: uuid,
            memory,
            compute_share: Share::NONE,
            compute_cap: Cap::NONE,
            claim: None,
        })
        .unwrap();
    ledger
}

/// A wrapped `gpuslice-burn` of slice `slice` that allocates and frees the sizes `sizes` at
/// random for `secs` seconds (`--alloc-loop`).
fn alloc_loop(w: &World, slice: &str, sizes: &str, secs: &str) -> std::process::Command {
    let mut c = w.wrapped_burn();
    c.env("GPUSLICE_SLICE", slice)
        .args(["--alloc-loop", "--alloc", sizes, "--seconds", secs]);
    c
}

fn slice_used(l: &Ledger, name: &str) -> (u64, u64) {
    let s = l
        .snapshot()
        .slices
        .into_iter()
        .find(|s| s.name == name)
        .expect("slice");
    (s.memory_used, s.memory_limit.unwrap())
}

/// 16 processes allocate and free in a loop in one 1 GiB slice. What must hold is what the
/// device really holds: the fake GPU's node-wide usage (sampled through its NVML by a process
/// without the shim) never exceeds the quota, while the processes did contend for it (some
/// allocations were refused). The ledger's own counter is sampled too, but it cannot exceed
/// its limit by construction (a CAS against it), so it proves little on its own.
#[test]
fn sixteen_processes_in_one_slice_never_exceed_the_quota() {
    let w = World::new(1, "16Gi");
    let ledger = operator_slice(&w, "shared", GI);
    let mut sampler = w
        .command(artifact("gpuslice-e2e-helper"))
        .arg("node-usage")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut kids: Vec<Child> = (0..16)
        .map(|_| {
            alloc_loop(&w, "shared", "16Mi,64Mi,128Mi,200Mi", "3")
                .args(["--free", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut samples, mut max, mut nonzero) = (0u64, 0u64, 0u64);
    let t = Instant::now();
    while kids.iter_mut().any(|k| k.try_wait().unwrap().is_none()) {
        let (used, limit) = slice_used(&ledger, "shared");
        assert!(used <= limit, "slice usage {used} above its quota {limit}");
        max = max.max(used);
        nonzero += (used > 0) as u64;
        samples += 1;
        assert!(t.elapsed() < Duration::from_secs(120), "processes hung");
    }
    let mut refused = 0;
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                .unwrap();
        refused += v["alloc_loop"]["out_of_memory"]
            .as_u64()
            .expect("an --alloc-loop report counts out_of_memory");
    }
    drop(sampler.stdin.take());
    let out = sampler.wait_with_output().unwrap();
    assert!(out.status.success(), "the node-usage sampler failed");
    let node: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let node_max = node["max_used"].as_u64().unwrap() - node["min_used"].as_u64().unwrap();
    assert!(node["samples"].as_u64().unwrap() > 10, "{node}");
    // Each process also holds a context, which no quota counts (docs/fakegpu.md).
    let contexts = 16 * fake_context_bytes(16 * GI);
    assert!(
        node_max <= GI + contexts,
        "the device held {node_max} bytes for the slice's processes, above the 1 GiB quota \
         and their {contexts} bytes of contexts"
    );
    assert!(
        max > GI / 2 && node_max > GI / 2,
        "the device never held much: the processes did not contend ({node})"
    );
    assert!(
        refused > 0,
        "no allocation was refused: the test never pressed on the quota"
    );
    assert!(
        samples > 10 && nonzero > 0,
        "sampled {samples} times, {nonzero} non-zero"
    );
    assert!(
        max > GI / 2,
        "the processes did contend for the quota (max {max})"
    );
    ledger.reap_dead().unwrap();
    assert_eq!(
        slice_used(&ledger, "shared").0,
        0,
        "everything returned at the end"
    );
}

/// xorshift: reproducible kill points without a dependency.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn processes_killed_while_allocating_give_everything_back() {
    let w = World::new(1, "16Gi");
    let ledger = operator_slice(&w, "victims", GI);
    // A live neighbour holding 256 MiB all along: what it holds must never be taken from it.
    let (mut holder, _) = spawn_holding(
        w.wrapped_burn()
            .env("GPUSLICE_SLICE", "victims")
            .args(["--alloc", "256Mi", "--hold", "600", "--json"]),
    );
    assert_eq!(slice_used(&ledger, "victims").0, 256 * MI);

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let runs = 120;
    for i in 0..runs {
        let mut kid = alloc_loop(&w, "victims", "1Mi,16Mi,48Mi,96Mi", "60")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until it is attached and allocating, then kill it at a random point.
        let t = Instant::now();
        loop {
            let snap = ledger.snapshot();
            if snap
                .slices
                .iter()
                .any(|s| s.name == "victims" && s.pids.contains(&kid.id()))
            {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "run {i}: the process never attached"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_micros(next(&mut seed) % 20_000));
        kid.kill().unwrap();
        wait_within(&mut kid, Duration::from_secs(10), "killed process");
        let t = Instant::now();
        ledger.reap_dead().unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "run {i}: reaping took {:?}",
            t.elapsed()
        );
        let (used, _) = slice_used(&ledger, "victims");
        assert_eq!(
            used,
            256 * MI,
            "run {i}: the slice holds exactly what live processes hold"
        );

        if i % 30 == 29 {
            // The next process really gets the memory back.
            let mut c = w.wrapped_burn();
            c.env("GPUSLICE_SLICE", "victims")
                .args(["--alloc", "768Mi,1", "--json"]);
            let out = c.output().unwrap();
            let v: serde_json::Value =
                serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                    .unwrap();
            let oks: Vec<bool> = v["allocs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["ok"].as_bool().unwrap())
                .collect();
            assert_eq!(oks, [true, false], "run {i}: {v:#}");
        }
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    ledger.reap_dead().unwrap();
    assert_eq!(slice_used(&ledger, "victims").0, 0);
}
