//! The shim's NVML hooks in situations pynvml cannot make: a process forked (without exec)
//! while another of its threads is inside a hooked NVML call, holding the NVML cache's lock.

use gpuslice_e2e::{artifact, in_slice, run_json_within, World};
use std::time::Duration;

/// A monitoring tool that forks workers while a thread polls NVML (`nvitop`, a DCGM-style
/// exporter with a process pool): every child's NVML call returns. The lock a thread of the
/// parent held does not exist in the child; the shim's fork handler frees it there (on main
/// the child waited on it forever).
#[test]
fn a_child_forked_while_a_thread_holds_the_nvml_cache_still_answers() {
    let w = World::new(1, "16Gi");
    for slice in [true, false] {
        let mut c = w.wrapped(artifact("gpuslice-e2e-helper"));
        c.args(["nvml-fork", "60"]);
        if slice {
            c.envs(in_slice("watch", "1Gi"));
        }
        let v = run_json_within(&mut c, Duration::from_secs(120));
        assert_eq!(v["hung"], 0, "slice {slice}: a forked child hung: {v}");
        assert_eq!(v["ok"], 60, "slice {slice}: {v}");
    }
}
