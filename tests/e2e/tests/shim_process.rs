//! The shim across a process's life, through real processes on the fake GPU: a child forked
//! without exec (a DataLoader worker) does not keep its parent counted alive, and a CUDA call
//! from a library constructor while another thread makes the process's first CUDA call does
//! not deadlock.

use gpuslice_e2e::{artifact, first_line, in_slice, succeeds, World, GI};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Kills (SIGKILL) a pid when dropped: for processes the test did not spawn itself.
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill() on a pid this test made (the helper's forked child).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the pid exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// A parent that allocated 1 GiB and forked a worker (no exec, no CUDA) is SIGKILLed: it is
/// reaped and its memory returned while the worker still lives. On main the worker inherited
/// the ledger's descriptor and mapping, so the parent's liveness lock outlived it.
#[test]
fn a_killed_parent_is_reaped_while_its_forked_child_lives() {
    let w = World::new(1, "16Gi");
    let mut parent = w
        .wrapped(artifact("gpuslice-e2e-helper"))
        .args(["fork-hold", &GI.to_string(), "60"])
        .envs(in_slice("forked", "4Gi"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (line, _) = first_line(&mut parent);
    let pids: Vec<libc::pid_t> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "the helper said {line:?}");
    let child = KillOnDrop(pids[1]);
    let ledger = gpuslice_ledger::Ledger::open(&w.runtime_dir()).unwrap();
    let used = |l: &gpuslice_ledger::Ledger| {
        l.snapshot()
            .slices
            .iter()
            .filter(|s| s.name == "forked")
            .map(|s| s.memory_used)
            .sum::<u64>()
    };
    assert_eq!(used(&ledger), GI);

    parent.kill().unwrap();
    parent.wait().unwrap();
    assert!(alive(child.0), "the forked worker should still run");
    let t0 = Instant::now();
    loop {
        let reaped = ledger.reap_dead().unwrap();
        if reaped.processes.iter().any(|p| p.pid == pids[0] as u32) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the killed parent was never reaped while its forked worker lives"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(used(&ledger), 0, "the parent's 1 GiB was not returned");
    assert!(alive(child.0), "the forked worker should still run");
}

/// A forked child of a process that started CUDA is no member of the ledger: its CUDA calls
/// fail with `CUDA_ERROR_NOT_INITIALIZED` (3), as CUDA itself does not survive a fork, and one
/// line says why.
#[test]
fn a_forked_child_cannot_use_cuda_and_is_told_why() {
    let w = World::new(1, "16Gi");
    let out = w
        .wrapped(artifact("gpuslice-e2e-helper"))
        .arg("fork-cuda")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "child cuInit 3", "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("forked")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("gpuslice:"), "{stderr}");
}

/// Thread A is inside `dlopen` (holding the loader lock) running a library constructor that
/// calls CUDA, while thread B makes the process's first CUDA call and needs the loader lock to
/// resolve the real driver. On main B marked the library "resolving" and A's constructor spun
/// on that mark forever: a deadlock. Now each symbol is resolved by whoever needs it.
#[test]
fn a_cuda_call_from_a_library_constructor_does_not_deadlock() {
    let w = World::new(1, "16Gi");
    let dir = w.fake_state_dir();
    let src = dir.join("ctor.c");
    let lib = dir.join("libctor.so");
    std::fs::write(
        &src,
        r#"
#include <dlfcn.h>
#include <unistd.h>
#include <stdlib.h>
#include <stdio.h>
__attribute__((constructor)) static void ctor(void) {
    /* Wait for thread B to start its first CUDA call, then let it reach the loader lock. */
    const char *flag = getenv("CTOR_FLAG");
    char inside[4096];
    if (!flag || snprintf(inside, sizeof inside, "%s.in", flag) >= (int)sizeof inside) abort();
    FILE *f = fopen(inside, "w");
    if (!f) abort();
    fclose(f);
    for (int i = 0; access(flag, F_OK) != 0 && i < 4000; i++) usleep(5000);
    usleep(300000);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    unsigned (*init)(unsigned) = cuda ? (unsigned (*)(unsigned))dlsym(cuda, "cuInit") : 0;
    if (!init || init(0) != 0) abort();
}
"#,
    )
    .unwrap();
    // A C compiler (cc) is needed for this test.
    succeeds(
        std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src),
    );
    let mut c = w
        .wrapped(artifact("gpuslice-e2e-helper"))
        .arg("ctor-cuda")
        .arg(&lib)
        .env("CTOR_FLAG", dir.join("b-started"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = gpuslice_e2e::wait_within(
        &mut c,
        Duration::from_secs(20),
        "deadlock: a CUDA call from a library constructor",
    );
    let out = c.wait_with_output().unwrap();
    assert!(
        status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{status:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
