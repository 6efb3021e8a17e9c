//! The reference docs name everything the product exposes: every metric family `gpuslice`
//! emits (`gpuslice metrics`, and the monitor's `/metrics`) is in docs/operations.md, and
//! every variable the shim's configuration reads is in docs/configuration.md. A new metric or
//! variable without its documentation fails here. And docs/architecture.md's map matches the
//! folders: every workspace crate is in it, and every path it and its detail pages
//! (docs/architecture/) name exists (a rename or move that leaves the map behind fails here).

use gpuslice_e2e::World;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The family names of a Prometheus text exposition (its `# TYPE` lines).
fn families(exposition: &str) -> Vec<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// What the monitor serves at `/metrics` (its own families included).
fn monitor_scrape(w: &World) -> String {
    let mut m = w
        .gpuslice()
        .args(["monitor", "--metrics-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(m.stderr.take().unwrap()).lines();
    let t0 = Instant::now();
    let addr = loop {
        let line = lines
            .next()
            .expect("the monitor stopped before serving metrics")
            .unwrap();
        if let Some(rest) = line.split("serving metrics at http://").nth(1) {
            break rest.trim_end_matches("/metrics").to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no metrics address");
    };
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let _ = m.kill();
    let _ = m.wait();
    out
}

#[test]
fn every_metric_is_documented_in_operations_md() {
    let w = World::new(1, "16Gi");
    let once = w.gpuslice().arg("metrics").output().unwrap();
    assert!(once.status.success());
    let mut names = families(&String::from_utf8_lossy(&once.stdout));
    names.extend(families(&monitor_scrape(&w)));
    names.sort();
    names.dedup();
    assert!(
        names.len() > 10 && names.iter().any(|n| n.starts_with("gpuslice_monitor_")),
        "{names:?}"
    );
    let doc = repo_file("docs/operations.md");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics missing from docs/operations.md's table: {missing:?}"
    );
}

#[test]
fn every_variable_the_shim_reads_is_documented_in_configuration_md() {
    let config = repo_file("shim/src/config.rs");
    // The configuration code, not its tests (which spell variables that do not exist).
    let code = config.split("#[cfg(test)]").next().unwrap();
    let mut vars: Vec<&str> = code
        .split('"')
        .skip(1)
        .step_by(2) // the insides of string literals (`c"..."` included)
        .filter(|s| {
            (s.starts_with("GPUSLICE_") || s.starts_with("CUDA_DEVICE_"))
                && s.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
        // Bare family prefixes (used to look for unknown variables) are not variables.
        .filter(|s| !matches!(*s, "GPUSLICE_" | "CUDA_DEVICE_"))
        .collect();
    vars.sort();
    vars.dedup();
    assert!(vars.contains(&"GPUSLICE_MEMORY"), "{vars:?}");
    let doc = repo_file("docs/configuration.md");
    let missing: Vec<&&str> = vars
        .iter()
        .filter(|v| {
            if v.ends_with('_') {
                // A per-device family: `CUDA_DEVICE_MEMORY_LIMIT_<i>`.
                !doc.contains(&format!("`{v}<"))
            } else {
                !doc.contains(&format!("`{v}`"))
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "variables shim/src/config.rs reads that docs/configuration.md does not name: {missing:?}"
    );
}

/// The `code` spans of a Markdown text.
fn code_spans(md: &str) -> Vec<&str> {
    md.split('`').skip(1).step_by(2).collect()
}

/// Whether `path` (under `root`) exists; with a `*`, whether anything matches what comes before
/// it (`tests/python/test_frameworks_*.py`).
fn exists(root: &Path, path: &str) -> bool {
    let Some((before, _)) = path.split_once('*') else {
        return root.join(path).exists();
    };
    let (dir, stem) = before.rsplit_once('/').unwrap_or(("", before));
    std::fs::read_dir(root.join(dir)).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with(stem))
    })
}

#[test]
fn architecture_md_names_every_crate_and_only_paths_that_exist() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let md = repo_file("docs/architecture.md");
    let spans = code_spans(&md);
    // Every workspace member, as `dir/`.
    let manifest = repo_file("Cargo.toml");
    let members: Vec<&str> = manifest
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .expect("Cargo.toml lists workspace members")
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .collect();
    assert!(members.contains(&"shim"), "{members:?}");
    let unnamed: Vec<&&str> = members
        .iter()
        .filter(|m| !spans.contains(&format!("{m}/").as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "workspace crates docs/architecture.md does not name (as `dir/`): {unnamed:?}"
    );
    // Every path it and its detail pages (docs/architecture/) name.
    let mut missing = missing_paths(&repo, "docs/architecture.md", &md);
    let details = repo.join("docs/architecture");
    let mut pages: Vec<_> = std::fs::read_dir(&details)
        .unwrap_or_else(|e| panic!("{}: {e}", details.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    assert!(
        !pages.is_empty(),
        "no detail pages in {}",
        details.display()
    );
    for page in pages {
        let name = format!(
            "docs/architecture/{}",
            page.file_name().unwrap().to_string_lossy()
        );
        missing.extend(missing_paths(&repo, &name, &repo_file(&name)));
    }
    assert!(
        missing.is_empty(),
        "paths the architecture docs name that do not exist: {missing:?}"
    );
}

/// The paths `md` (the file `name`) names from the top of the repository that do not exist.
fn missing_paths(repo: &Path, name: &str, md: &str) -> Vec<String> {
    let tops = [
        "abi/",
        "cdi/",
        "deploy/",
        "docs/",
        "k8s/",
        "ledger/",
        "monitor/",
        "nvml/",
        "protocol/",
        "quantity/",
        "sched/",
        "scripts/",
        "shim/",
        "tests/",
    ];
    let mut missing: Vec<String> = code_spans(md)
        .iter()
        .filter(|s| tops.iter().any(|t| s.starts_with(t)) && !s.contains(' '))
        .filter(|s| !exists(repo, s))
        .map(|s| format!("{s} (in {name})"))
        .collect();
    // A section heading names its files relative to its first path: `shim/src/hooks.rs`,
    // `dlsym.rs` is shim/src/dlsym.rs (or beside the first path's folder).
    for heading in md
        .lines()
        .filter(|l| l.starts_with("# ") || l.starts_with("## "))
    {
        let names = code_spans(heading);
        let Some(first) = names.first().filter(|f| f.contains('/')) else {
            continue;
        };
        let base = repo.join(first.trim_end_matches('/'));
        let dir = if first.ends_with('/') {
            base.clone()
        } else {
            base.parent().unwrap().to_path_buf()
        };
        for n in names.iter().skip(1).filter(|n| !n.contains('/')) {
            if !exists(&dir, n) && !exists(dir.parent().unwrap(), n) {
                missing.push(format!("{n} (in {name}, {heading:?})"));
            }
        }
    }
    missing
}
