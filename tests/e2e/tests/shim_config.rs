//! Bad configuration through real processes: every variable's bad values give one clear
//! `gpuslice:` line (variable, value, accepted forms) and `cuInit` fails with
//! `CUDA_ERROR_INVALID_VALUE`; never "unlimited".

use gpuslice_e2e::World;
use serde_json::Value;

fn burn(w: &World, env: &[(&str, &str)]) -> (Value, String) {
    let mut c = w.wrapped_burn();
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c
        .args(["--alloc", "1Mi", "--json"])
        .output()
        .expect("spawn");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON for {env:?}: {stdout}"));
    (v, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_values_of_every_variable_fail_cuinit_with_one_clear_line() {
    let w = World::new(1, "16Gi");
    let cases: &[(&str, &str)] = &[
        ("GPUSLICE_MEMORY", "12XB"),
        ("GPUSLICE_MEMORY", "-1"),
        ("GPUSLICE_MEMORY", "1.5"),
        ("GPUSLICE_MEMORY", "4gb"),
        ("GPUSLICE_MEMORY", ""),
        ("GPUSLICE_MEMORY", "18446744073709551616"),
        ("GPUSLICE_MEMORY", "0=1Gi,0=2Gi"),
        ("GPUSLICE_MEMORY", "150%"),
        ("GPUSLICE_MEMORY", "0"),
        ("GPUSLICE_MEMORY", "0=0"),
        ("GPUSLICE_COMPUTE", "1.5"),
        ("GPUSLICE_COMPUTE", "-0.2"),
        ("GPUSLICE_COMPUTE", "half"),
        ("GPUSLICE_COMPUTE_CAP", "0"),
        ("GPUSLICE_COMPUTE_CAP", "120%"),
        ("GPUSLICE_SLICE", "has space"),
        ("GPUSLICE_SLICE", "pid-7"),
        ("GPUSLICE_PRIORITY", "urgent"),
        ("GPUSLICE_RUNTIME_DIR", "relative/dir"),
        ("GPUSLICE_LOG", "verbose"),
        ("GPUSLICE_DISABLE", "true"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "12XB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "99999999999g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1.5g"),
        ("CUDA_DEVICE_SM_LIMIT", "200"),
        ("CUDA_DEVICE_SM_LIMIT", "-5"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", ""),
    ];
    for (k, v) in cases {
        let (r, err) = burn(&w, &[(k, v)]);
        assert_eq!(r["error"]["call"], "cuInit", "{k}={v:?}: {r:#}\n{err}");
        assert_eq!(
            r["error"]["code"], 1,
            "{k}={v:?}: CUDA_ERROR_INVALID_VALUE expected: {r:#}"
        );
        assert_eq!(r["allocated_bytes"], 0, "{k}={v:?}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpuslice:")).collect();
        assert_eq!(lines.len(), 1, "{k}={v:?}: one line expected:\n{err}");
        assert!(
            lines[0].contains(k) && lines[0].contains("accepted"),
            "{k}={v:?}: {}",
            lines[0]
        );
        if !v.is_empty() {
            assert!(
                lines[0].contains(v),
                "{k}={v:?}: the line names the value: {}",
                lines[0]
            );
        }
    }
    // A bad value never creates a slice.
    if let Ok(l) = gpuslice_ledger::Ledger::open(&w.runtime_dir()) {
        assert!(l.snapshot().slices.is_empty());
    }
}

/// A cap below the guaranteed share is contradictory: cuInit fails with one line naming both
/// variables and their values (the same rule `gpuslice run` and `slice create` apply).
#[test]
fn a_cap_below_the_share_fails_cuinit_naming_both_variables() {
    let w = World::new(1, "16Gi");
    for (cap_var, cap) in [
        ("GPUSLICE_COMPUTE_CAP", "0.25"),
        ("GPUSLICE_COMPUTE_CAP", "0=0.25"),
        ("CUDA_DEVICE_SM_LIMIT", "25"),
    ] {
        let (r, err) = burn(&w, &[("GPUSLICE_COMPUTE", "0.5"), (cap_var, cap)]);
        assert_eq!(
            r["error"]["call"], "cuInit",
            "{cap_var}={cap}: {r:#}\n{err}"
        );
        assert_eq!(r["error"]["code"], 1, "{cap_var}={cap}: {r:#}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpuslice:")).collect();
        assert_eq!(lines.len(), 1, "{cap_var}={cap}: one line expected:\n{err}");
        assert!(
            lines[0].contains(cap_var)
                && lines[0].contains(cap)
                && lines[0].contains("GPUSLICE_COMPUTE=\"0.5\"")
                && lines[0].contains("accepted"),
            "{}",
            lines[0]
        );
    }
    // Equal, or on different devices, is fine.
    for (share, cap) in [("0.5", "0.5"), ("0=0.5", "1=0.25")] {
        let (r, err) = burn(
            &w,
            &[("GPUSLICE_COMPUTE", share), ("GPUSLICE_COMPUTE_CAP", cap)],
        );
        assert!(r["error"].is_null(), "{share} / {cap}: {r:#}\n{err}");
    }
}

#[test]
fn good_values_in_every_form_are_accepted() {
    let w = World::new(1, "16Gi");
    for (v, total) in [
        ("1073741824", 1u64 << 30),
        ("1Gi", 1 << 30),
        ("1024Mi", 1 << 30),
        ("1GiB", 1 << 30),
        ("2G", 2_000_000_000),
        ("1.5Gi", 3 << 29),
        ("0=1Gi", 1 << 30),
        ("50%", 8 << 30),
    ] {
        let (r, err) = burn(&w, &[("GPUSLICE_MEMORY", v)]);
        assert!(r["error"].is_null(), "{v}: {r:#}\n{err}");
        assert_eq!(r["mem_total"], total, "{v}");
    }
    for (k, v) in [
        ("GPUSLICE_COMPUTE", "0.25"),
        ("GPUSLICE_COMPUTE", "25%"),
        ("GPUSLICE_COMPUTE_CAP", "0.5"),
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("GPUSLICE_LOG", "debug"),
    ] {
        let (r, err) = burn(&w, &[(k, v)]);
        assert!(r["error"].is_null(), "{k}={v}: {r:#}\n{err}");
    }
}
