//! Stream-ordered pools at the quota's edge, through two processes of one slice: memory a
//! process frees into its pool (`cuMemFreeAsync`) stays on the device until the pool releases
//! it, so it stays the slice's until then, and comes back to the slice when it is released (a
//! synchronize under the release threshold, `cuMemPoolTrimTo`). Whatever the threshold and
//! however the pool grows, the device never holds more for the slice's processes than the
//! quota: a sampler outside gpuslice (the fake GPU's own NVML) watches every step.

use gpuslice_e2e::{artifact, fake_context_bytes, in_slice, World, GI, MI};
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

/// A `gpuslice-e2e-helper pool-steps` process of slice `edge` (1 GiB quota).
struct Steps {
    child: Child,
    input: ChildStdin,
    output: Lines<BufReader<ChildStdout>>,
}

impl Steps {
    fn start(w: &World) -> Steps {
        let mut child = w
            .wrapped(artifact("gpuslice-e2e-helper"))
            .arg("pool-steps")
            .envs(in_slice("edge", "1Gi"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(output.next().unwrap().unwrap(), "ready");
        Steps {
            child,
            input,
            output,
        }
    }

    /// Run one step; the driver's status it returned.
    fn step(&mut self, s: &str) -> u64 {
        writeln!(self.input, "{s}").unwrap();
        let line = self.output.next().expect("the helper ended").unwrap();
        line.strip_prefix("done ")
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{s}: {line}"))
    }

    fn ok(&mut self, s: &str) {
        assert_eq!(self.step(s), 0, "{s}");
    }

    fn refused(&mut self, s: &str) {
        assert_eq!(self.step(s), 2, "{s}: CUDA_ERROR_OUT_OF_MEMORY expected");
    }

    fn end(mut self) {
        drop(self.input);
        assert!(self.child.wait().unwrap().success());
    }
}

/// The fake GPU's NVML sampled without the shim, for the whole run: the most the device held.
struct Sampler(Child);

impl Sampler {
    fn start(w: &World) -> Sampler {
        Sampler(
            w.command(artifact("gpuslice-e2e-helper"))
                .arg("node-usage")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    /// The most the device held (the world's fake GPU holds nothing before the test). Waits
    /// until the sampler says it has taken 3 samples, however slow the machine, then stops it.
    fn max_held(mut self) -> u64 {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(self.0.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok);
        assert_eq!(
            first.as_deref(),
            Some("sampling"),
            "the node-usage sampler stopped"
        );
        drop(self.0.stdin.take());
        let last = lines.map_while(Result::ok).last().unwrap_or_default();
        assert!(
            self.0.wait().unwrap().success(),
            "the node-usage sampler failed"
        );
        let v: serde_json::Value = serde_json::from_str(last.trim()).unwrap();
        assert!(v["samples"].as_u64().unwrap() >= 3, "{v}");
        v["max_used"].as_u64().unwrap()
    }
}

/// What the device holds now (at least 3 samples).
fn held_now(w: &World) -> u64 {
    Sampler::start(w).max_held()
}

/// The device held at most the slice's 1 GiB quota (`held`, as a [`Sampler`] saw it), beside
/// the contexts of its two processes (on the 16 GiB device, which no quota counts).
fn assert_within_quota(held: u64, when: &str) {
    let contexts = 2 * fake_context_bytes(16 * GI);
    assert!(
        held <= GI + contexts,
        "{when}: the device held {held} bytes for the slice, {contexts} of them contexts"
    );
}

/// The end of a test of two processes: [`assert_within_quota`], and both exit cleanly.
fn end_within_quota(held: u64, when: &str, a: Steps, b: Steps) {
    assert_within_quota(held, when);
    a.end();
    b.end();
}

fn mib(n: u64) -> u64 {
    n * MI
}

/// A pool that keeps what is freed into it (release threshold at its maximum, as PyTorch's
/// `cudaMallocAsync` backend sets it): the freed memory is the slice's until the pool is
/// trimmed, then a neighbour gets it.
#[test]
fn memory_a_pool_keeps_stays_the_slices_until_trimmed() {
    let w = World::new(1, "16Gi");
    let sampler = Sampler::start(&w);
    let (mut a, mut b) = (Steps::start(&w), Steps::start(&w));
    a.ok("threshold max");
    a.ok(&format!("async x {}", mib(768)));
    a.ok("freeasync x");
    a.ok("sync");
    b.refused(&format!("async y {}", mib(512)));
    b.refused(&format!("plain y {}", mib(512)));
    // The pool's own next allocation is served from what it keeps.
    a.ok(&format!("async x {}", mib(700)));
    a.ok("freeasync x");
    a.ok("sync");
    a.ok("trim");
    b.ok(&format!("async y {}", mib(512)));
    a.refused(&format!("async z {}", mib(768)));
    a.ok(&format!("async z {}", mib(512)));
    end_within_quota(sampler.max_held(), "over the run", a, b);
}

/// The default release threshold (0): the pool gives freed memory back at the next
/// synchronize, and so the slice gets it back there, without a trim.
#[test]
fn a_synchronize_under_the_release_threshold_gives_pool_memory_back_to_the_slice() {
    let w = World::new(1, "16Gi");
    let sampler = Sampler::start(&w);
    let (mut a, mut b) = (Steps::start(&w), Steps::start(&w));
    a.ok(&format!("async x {}", mib(768)));
    a.ok("freeasync x");
    // Freed, not yet synchronized: the pool still holds it.
    b.refused(&format!("plain y {}", mib(512)));
    a.ok("sync");
    b.ok(&format!("plain y {}", mib(512)));
    a.ok(&format!("async x {}", mib(512)));
    a.refused(&format!("async w {}", 1));
    end_within_quota(sampler.max_held(), "over the run", a, b);
}

/// A pool that holds a freed block too large to reuse for a small request grows instead (the
/// fake reuses a block only up to twice the request, real pools fragment too): the credit
/// of the kept block cannot pay for the growth. At the quota's edge the shim releases the
/// unusable block (as the driver does when the device runs short) instead of letting the
/// slice's processes together hold more than the quota; the block's free is pending or done,
/// both ways. The device is checked after each step: between the driver's growth and the
/// shim's trim (microseconds) it does hold the growth (`memory/pools.rs`).
#[test]
fn a_pool_that_grows_while_it_holds_freed_memory_stays_within_the_quota() {
    for sync_first in [true, false] {
        let w = World::new(1, "16Gi");
        let (mut a, mut b) = (Steps::start(&w), Steps::start(&w));
        a.ok("threshold max");
        a.ok(&format!("async x {}", mib(600)));
        a.ok("freeasync x");
        if sync_first {
            a.ok("sync");
        }
        b.ok(&format!("plain y {}", mib(400)));
        a.ok(&format!("async w {}", mib(100)));
        assert_within_quota(held_now(&w), &format!("sync first {sync_first}, grown"));
        a.ok("sync");
        // What is left of the quota is still to be had, and no more.
        b.ok(&format!("plain v {}", mib(500)));
        b.refused(&format!("plain u {}", mib(30)));
        end_within_quota(
            held_now(&w),
            &format!("sync first {sync_first}, at the end"),
            a,
            b,
        );
    }
}
