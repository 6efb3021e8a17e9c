//! A new user's first hour (issue 22), through real processes on the fake GPU: the README's
//! first screen holds the two commands, the demo prints no cargo line, `gpuslice --help` and
//! every usage error name every subcommand and flag, `status` lists NVML's devices with nothing
//! running and no program once it has exited, the monitor log names an emptied slice once, and
//! the Grafana dashboard queries only metrics the monitor exports.

use gpuslice_e2e::{artifact, spawn_holding, words, World};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn repo_file(path: &str) -> String {
    let p = repo().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A child killed (SIGKILL) and reaped when the test ends, whatever happens.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Poll `f` every 50 ms until it returns `Some`, for up to 30 s; then fail saying `what`.
fn wait_for<T>(what: impl Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", what());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `gpuslice monitor ARGS` in `w` with its log in `log`; returns once it holds its lock.
fn monitor(w: &World, args: &[&str], log: &Path) -> Killed {
    let out = std::fs::File::create(log).unwrap();
    let m = Killed(
        w.gpuslice()
            .arg("monitor")
            .args(args)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap(),
    );
    let pid = m.0.id().to_string();
    wait_for(
        || format!("the monitor did not start: {}", read(log)),
        || {
            let s = std::fs::read_to_string(w.runtime_dir().join("monitor.lock")).ok()?;
            (s.trim() == pid).then_some(())
        },
    );
    m
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

// --- README and versions -------------------------------------------------------------------

#[test]
fn the_readme_first_screen_holds_both_commands_and_one_rust_version_everywhere() {
    let readme = repo_file("README.md");
    let first: String = readme.lines().take(30).collect::<Vec<_>>().join("\n");
    for cmd in ["scripts/demo.sh", "scripts/test.sh", "--no-frameworks"] {
        assert!(
            first.contains(cmd),
            "{cmd} is not in README's first 30 lines"
        );
    }
    // The workspace's rust-version is the one every README and doc line names.
    let manifest = repo_file("Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = \""))
        .and_then(|v| v.split('"').next())
        .expect("Cargo.toml sets rust-version");
    let mut texts = vec![("README.md".to_string(), readme.clone())];
    for e in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "md") {
            texts.push((p.display().to_string(), read(&p)));
        }
    }
    let mut named = 0;
    for (file, text) in &texts {
        for (at, _) in text.match_indices("Rust 1.") {
            let v: String = text[at + 5..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let v = v.trim_end_matches('.');
            assert_eq!(v, version, "{file} names Rust {v}, Cargo.toml {version}");
            named += 1;
        }
    }
    assert!(named > 0, "README names no Rust version");
    // Every crate takes the workspace's (none sets its own).
    for e in walk_manifests(&repo()) {
        let text = read(&e);
        if let Some(line) = text.lines().find(|l| l.starts_with("rust-version")) {
            assert!(
                line.contains("workspace = true") || e == repo().join("Cargo.toml"),
                "{}: {line}",
                e.display()
            );
        }
    }
}

/// Every Cargo.toml of the repository (outside target/ and hidden folders).
fn walk_manifests(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() && !name.starts_with('.') && name != "target" {
            out.extend(walk_manifests(&p));
        } else if name == "Cargo.toml" {
            out.push(p);
        }
    }
    out
}

// --- The demo -------------------------------------------------------------------------------

/// A `cargo` that talks like cargo on both streams (and fails when `fail` is set), and a target
/// directory whose `release/` holds this build's artifacts: the demo's build path, without a
/// release build.
fn noisy_cargo(dir: &Path, fail: bool) -> (PathBuf, PathBuf) {
    let bin = dir.join("bin");
    let target = dir.join("target");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(target.join("release")).unwrap();
    for a in [
        "gpuslice",
        "gpuslice-burn",
        "libgpuslice.so",
        "libfakegpu.so",
    ] {
        let _ = std::os::unix::fs::symlink(artifact(a), target.join("release").join(a));
    }
    let cargo = bin.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\necho '   Compiling twox-hash v1.6.3'\n\
             echo '   Compiling gpuslice v0.1.0' >&2\n\
             echo '    Finished `release` profile [optimized] target(s) in 22.13s' >&2\n\
             exit {}\n",
            u8::from(fail)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (bin, target)
}

fn demo(dir: &Path, fail: bool) -> (bool, String) {
    let (bin, target) = noisy_cargo(dir, fail);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = Command::new("bash")
        .arg(repo().join("scripts/demo.sh"))
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", &target)
        .env("DEMO_SECONDS", "2")
        .env("TMPDIR", dir)
        .env_remove("DEMO_BUILD_DIR")
        .env_remove("LD_PRELOAD")
        .env_remove("GPUSLICE_RUNTIME_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_demo_says_building_in_one_line_and_prints_no_cargo_line() {
    let w = World::new(1, "1Gi");
    let dir = w.fake_state_dir().join("demo");
    let (ok, text) = demo(&dir, false);
    assert!(ok, "{text}");
    assert!(text.contains("building gpuslice"), "{text}");
    for noise in ["Compiling", "Finished"] {
        assert!(!text.contains(noise), "cargo's {noise:?} leaks:\n{text}");
    }
    assert!(
        text.contains("COMPUTE USED (1 s)") && text.contains("done:"),
        "{text}"
    );
    // A failed build shows what cargo said, and stops.
    let (ok, text) = demo(&dir.join("failing"), true);
    assert!(!ok, "{text}");
    assert!(
        text.contains("Compiling twox-hash") && text.contains("the build failed"),
        "{text}"
    );
}

// --- The command line -----------------------------------------------------------------------

/// `gpuslice ARGS` in `w`: exit code, stdout, stderr.
fn cli(w: &World, args: &[&str]) -> (Option<i32>, String, String) {
    let o = w.gpuslice().args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The `--flag` words of a text.
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || "[]|,".contains(c))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(['.', ')', ':']).to_string())
        .collect()
}

#[test]
fn help_and_every_usage_error_name_every_subcommand_and_flag_and_end_with_a_newline() {
    let w = World::new(1, "1Gi");
    let (code, top, _) = cli(&w, &["--help"]);
    assert_eq!(code, Some(0));
    for want in [
        "gpuslice run",
        "gpuslice status",
        "gpuslice top",
        "gpuslice monitor",
        "gpuslice slice create",
        "gpuslice slice set",
        "gpuslice slice rm",
        "gpuslice slice ls",
        "gpuslice metrics",
        "gpuslice cdi",
        "gpuslice version",
        "--priority",
        "--owner",
        "--secret-file",
        "--new-secret-file",
        "--on-violation",
    ] {
        assert!(
            top.contains(want),
            "{want:?} missing from gpuslice --help:\n{top}"
        );
    }
    for (line, bad) in [
        ("run", "run --bogus true"),
        ("status", "status --bogus"),
        ("top", "top --bogus"),
        ("monitor", "monitor --bogus"),
        ("slice create", "slice create x --bogus"),
        ("slice set", "slice set x --bogus"),
        ("slice rm", "slice rm x --bogus"),
        ("slice ls", "slice ls --bogus"),
        ("metrics", "metrics --bogus"),
        ("cdi", "cdi --bogus"),
    ] {
        // The subcommand's own --help: on stdout, ending with a newline, naming flags that
        // the overview names for it too.
        let (code, help, err) = cli(&w, &words(&format!("{line} --help")));
        assert_eq!(code, Some(0), "{line} --help: {err}");
        assert!(
            help.ends_with('\n'),
            "{line} --help ends without a newline: {help:?}"
        );
        let usage: String = help.split("\n\n").next().unwrap().into();
        let section = top
            .split("\n  gpuslice ")
            .find(|s| {
                s.strip_prefix(line)
                    .is_some_and(|r| r.starts_with([' ', '\n']))
            })
            .unwrap_or_else(|| panic!("{line} not in the overview"));
        assert_eq!(
            flags(&usage),
            flags(section),
            "{line}: --help and the overview differ"
        );
        // Its usage error: the message, the same usage (every flag), a newline at the end.
        let (code, out, err) = cli(&w, &words(bad));
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(out.is_empty(), "{bad}: {out}");
        assert!(
            err.contains("--bogus") && err.ends_with('\n'),
            "{bad}: {err:?}"
        );
        assert!(
            err.contains(&usage),
            "{bad}: the usage is not --help's:\n{err}\n{usage}"
        );
    }
    // `gpuslice slice` alone lists each slice subcommand with its flags.
    let (code, _, err) = cli(&w, &["slice"]);
    assert_eq!(code, Some(2));
    for want in [
        "slice create NAME --memory Q",
        "slice set NAME",
        "--priority",
        "slice rm",
        "slice ls",
    ] {
        assert!(err.contains(want), "{want:?} missing:\n{err}");
    }
    // Output a terminal shows next to another message ends with a newline.
    let (code, out, err) = cli(&w, &["cdi", "--help"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.ends_with('\n'), "{out:?}");
}

/// The synopses of docs/operations.md (a code line `gpuslice NAME ...` and the indented lines
/// after it) name the flags `gpuslice NAME --help` names.
#[test]
fn the_operations_guide_synopses_name_the_flags_help_names() {
    let w = World::new(1, "1Gi");
    let doc = repo_file("docs/operations.md");
    let lines: Vec<&str> = doc.lines().collect();
    let mut checked = 0;
    for name in [
        "monitor",
        "slice create",
        "slice set",
        "slice rm",
        "slice ls",
    ] {
        let head = format!("gpuslice {name}");
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("{head} ")) || *l == head)
            .unwrap_or_else(|| panic!("docs/operations.md has no `{head}` synopsis"));
        let synopsis: Vec<&str> = std::iter::once(lines[at])
            .chain(
                lines[at + 1..]
                    .iter()
                    .copied()
                    .take_while(|l| l.starts_with(' ')),
            )
            .collect();
        let (code, help, _) = cli(&w, &words(&format!("{name} --help")));
        assert_eq!(code, Some(0));
        let usage = help.split("\n\n").next().unwrap();
        assert_eq!(
            flags(&synopsis.join(" ")),
            flags(usage),
            "docs/operations.md's `{head}` and its --help differ"
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
    // And README's synopsis of `gpuslice run`.
    let readme = repo_file("README.md");
    let run = readme
        .split("`gpuslice run [")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .expect("README shows `gpuslice run [...]`");
    let (_, help, _) = cli(&w, &["run", "--help"]);
    assert_eq!(
        flags(run),
        flags(help.split("\n\n").next().unwrap()),
        "README's `gpuslice run` synopsis and its --help differ"
    );
}

// --- status -------------------------------------------------------------------------------

#[test]
fn status_lists_nvml_devices_with_no_monitor_and_no_process() {
    let w = World::new(2, "16Gi");
    let st = w.status();
    let devices = st["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{st:#}");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["index"], i as u64, "{d}");
        assert_eq!(d["memory_total"], 16u64 << 30, "{d}");
        assert!(d["uuid"].as_str().unwrap().starts_with("GPU-"), "{d}");
    }
    let (_, table, _) = cli(&w, &["status"]);
    assert!(
        table.contains("Fake GPU") && !table.contains("no devices"),
        "{table}"
    );
    // Nothing was written: status only looks.
    let made: Vec<_> = std::fs::read_dir(w.runtime_dir()).unwrap().collect();
    assert!(made.is_empty(), "status made {made:?}");
}

/// `gpuslice run -- gpuslice-burn` holding memory; returns once it holds it.
fn run_holding(w: &World, hold: &str) -> Killed {
    let burn = artifact("gpuslice-burn");
    let (child, _) = spawn_holding(w.gpuslice().args([
        "run",
        "--memory",
        "1Gi",
        "--compute",
        "0.25",
        "--",
        burn.to_str().unwrap(),
        "--alloc",
        "256Mi",
        "--hold",
        hold,
        "--json",
    ]));
    Killed(child)
}

#[test]
fn status_lists_no_process_of_a_run_program_0_3_s_after_it_exits() {
    let w = World::new(1, "16Gi");
    let log = w.fake_state_dir().join("monitor.log");
    // A monitor that reaps rarely: what status shows is its own look, not the reaper's.
    let _m = monitor(&w, &["--interval", "5000"], &log);
    for round in 0..3 {
        let mut prog = run_holding(&w, "0.5");
        let st = w.status();
        assert_eq!(
            st["processes"].as_array().unwrap().len(),
            1,
            "round {round}: {st:#}"
        );
        assert_eq!(st["devices"][0]["compute_reserved"], 0.25, "{st:#}");
        assert!(prog.0.wait().unwrap().success());
        std::thread::sleep(Duration::from_millis(300));
        let st = w.status();
        assert_eq!(
            st["processes"],
            serde_json::json!([]),
            "round {round}: {st:#}"
        );
        assert_eq!(st["slices"], serde_json::json!([]), "round {round}: {st:#}");
        let d = &st["devices"][0];
        assert_eq!(
            (
                &d["memory_used"],
                &d["memory_reserved"],
                &d["compute_reserved"]
            ),
            (&Value::from(0), &Value::from(0), &Value::from(0.0)),
            "round {round}: {st:#}"
        );
    }
}

#[test]
fn node_mode_status_lists_no_process_of_an_exited_program_before_the_reaper_runs() {
    gpuslice_e2e::need_root!();
    let n = gpuslice_e2e::node::Node::new(1, "16Gi", &[]);
    let mut run = n.command(0, "gpuslice");
    run.args(["run", "--memory", "1Gi", "--"])
        .arg(n.bin.join("gpuslice-burn"))
        .args(["--alloc", "256Mi", "--hold", "0.5", "--json"]);
    let (child, _) = spawn_holding(&mut run);
    let mut prog = Killed(child);
    let st = n.status();
    assert_eq!(st["processes"].as_array().unwrap().len(), 1, "{st:#}");
    // The reaper stopped: only a look at the process itself can tell that it has gone (node
    // mode keeps its record active until the monitor reaps it).
    let monitor = n.monitor.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on our own child, the monitor.
    unsafe { libc::kill(monitor, libc::SIGSTOP) };
    let exited = prog.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let st = n.status();
    // SAFETY: as above.
    unsafe { libc::kill(monitor, libc::SIGCONT) };
    assert!(exited.success(), "{exited:?}");
    assert_eq!(st["processes"], serde_json::json!([]), "{st:#}");
    assert_eq!(st["slices"], serde_json::json!([]), "{st:#}");
}

// --- The monitor's log ------------------------------------------------------------------------

#[test]
fn the_monitor_log_names_each_emptied_slice_once_with_its_devices() {
    let w = World::new(3, "16Gi");
    let log = w.fake_state_dir().join("monitor.log");
    let _m = monitor(&w, &["--interval", "50"], &log);
    // A killed process leaves its slice (one record per device) to the reaper.
    let (child, _) = spawn_holding(
        w.wrapped_burn()
            .env("GPUSLICE_SLICE", "lonely")
            .args(["--alloc", "64Mi", "--hold", "60", "--json"]),
    );
    drop(Killed(child));
    let line = wait_for(
        || format!("no removal logged:\n{}", read(&log)),
        || {
            read(&log)
                .lines()
                .find(|l| l.contains("removed emptied slice"))
                .map(String::from)
        },
    );
    assert!(
        line.ends_with("removed emptied slice \"lonely\" (GPU 0, 1, 2)"),
        "{line}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let text = read(&log);
    assert_eq!(text.matches("lonely").count(), 1, "{text}");
    assert_eq!(text.matches("reaped pid").count(), 1, "{text}");
}

// --- The Grafana dashboard --------------------------------------------------------------------

/// Every PromQL expression of a Grafana dashboard: its panels' targets (rows' panels too) and
/// its template variables' queries.
fn dashboard_queries(d: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for p in list.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["expr"].as_str().expect("a target without expr").into());
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" {
            let q = &v["query"];
            out.push(q["query"].as_str().or(q.as_str()).unwrap().into());
        }
    }
    out
}

/// The selectors of a PromQL expression: each metric name (an identifier that is not a
/// function, keyword or label) with the label names its `{...}` matches on. Grouping labels
/// (`by (...)`, `on(...)`) are returned under the name "".
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    const WORDS: [&str; 20] = [
        "rate",
        "irate",
        "increase",
        "sum",
        "avg",
        "max",
        "min",
        "count",
        "by",
        "on",
        "without",
        "ignoring",
        "label_values",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    ];
    let b = expr.as_bytes();
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    while i < b.len() {
        match b[i] {
            b'"' => {
                // A string: skip it (escapes included).
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'[' => {
                // A range (`[5m]`, `[$__rate_interval]`).
                while i < b.len() && b[i] != b']' {
                    i += 1;
                }
            }
            b'$' => {
                // A Grafana variable.
                i += 1;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let rest = expr[i..].trim_start();
                if WORDS.contains(&word) {
                    if matches!(word, "by" | "on" | "without" | "ignoring") && rest.starts_with('(')
                    {
                        let close = rest.find(')').unwrap();
                        let labels = rest[1..close]
                            .split(',')
                            .map(|l| l.trim().to_string())
                            .filter(|l| !l.is_empty())
                            .collect();
                        out.push((String::new(), labels));
                        i = expr.len() - rest.len() + close + 1;
                    }
                    continue;
                }
                // A label of `label_values(metric, label)`: after a comma at depth 1.
                if expr[..start].trim_end().ends_with(',') && expr.starts_with("label_values") {
                    out.push((String::new(), vec![word.to_string()]));
                    continue;
                }
                let mut labels = Vec::new();
                if rest.starts_with('{') {
                    let (names, len) = matchers(rest);
                    labels = names;
                    i = expr.len() - rest.len() + len;
                }
                out.push((word.to_string(), labels));
            }
            _ => i += 1,
        }
    }
    out
}

/// The label names of the matchers `{a="x", b=~"y"}` at the start of `text`, and the length
/// of the braces (strings may hold `}` and `,`).
fn matchers(text: &str) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut name = String::new();
    let mut chars = text.char_indices().skip(1);
    while let Some((at, c)) = chars.next() {
        match c {
            '}' => return (names, at + 1),
            '"' => {
                // The value: to the closing quote, escapes included.
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            c if c.is_alphanumeric() || c == '_' => name.push(c),
            _ => {
                if !name.is_empty() {
                    names.push(std::mem::take(&mut name));
                }
            }
        }
    }
    panic!("unclosed matchers: {text}");
}

#[test]
fn promql_selectors_are_read_as_prometheus_reads_them() {
    let s = selectors("rate(a_total{x=~\"$v\", y=\"}\"}[$__rate_interval]) / on(x, y) b > bool 1");
    assert_eq!(
        s,
        [
            (
                "a_total".to_string(),
                vec!["x".to_string(), "y".to_string()]
            ),
            (String::new(), vec!["x".to_string(), "y".to_string()]),
            ("b".to_string(), vec![]),
        ]
    );
    let s = selectors("label_values(m{instance=~\"$instance\"}, uuid)");
    assert_eq!(
        s,
        [
            ("m".to_string(), vec!["instance".to_string()]),
            (String::new(), vec!["uuid".to_string()]),
        ]
    );
}

/// The monitor's families (from `# TYPE` lines): how many samples each has, and the label
/// names they carry.
fn exported(exposition: &str) -> BTreeMap<String, (usize, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (usize, BTreeSet<String>)> = BTreeMap::new();
    for l in exposition.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            out.entry(t.split_whitespace().next().unwrap().into())
                .or_default();
        } else if l.starts_with("gpuslice_") {
            let name: String = l.chars().take_while(|c| *c != '{' && *c != ' ').collect();
            let f = out.entry(name.clone()).or_default();
            f.0 += 1;
            if let Some(at) = l.find('{') {
                f.1.extend(matchers(&l[at..]).0);
            }
        }
    }
    out
}

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn every_metric_the_grafana_dashboard_queries_is_one_the_monitor_exports() {
    let dashboard: Value = serde_json::from_str(&repo_file("deploy/grafana/gpuslice.json"))
        .expect("deploy/grafana/gpuslice.json is JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 15, "{queries:?}");

    // A live monitor on the fake, with an operator slice (quota, share, cap) and a process in
    // it, so that every family has samples.
    let w = World::new(2, "16Gi");
    let mut m = Killed(
        w.gpuslice()
            .args([
                "monitor",
                "--metrics-listen",
                "127.0.0.1:0",
                "--interval",
                "100",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(m.0.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the monitor stopped").unwrap();
        if let Some(rest) = line.split("serving metrics at http://").nth(1) {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    w.cli_ok(&words(
        "slice create train --memory 2Gi --compute 0.25 --compute-cap 0.5",
    ));
    let (child, _) = spawn_holding(
        w.wrapped_burn()
            .env("GPUSLICE_SLICE", "train")
            .args(["--alloc", "512Mi", "--hold", "60", "--json"]),
    );
    let _burn = Killed(child);

    let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for q in &queries {
        let sel = selectors(q);
        assert!(
            sel.iter().any(|(m, _)| m.starts_with("gpuslice_")),
            "a query of no gpuslice metric: {q}"
        );
        for (metric, labels) in sel {
            assert!(
                metric.is_empty() || metric.starts_with("gpuslice_"),
                "{q}: {metric} is not a gpuslice metric"
            );
            wanted.entry(metric).or_default().extend(labels);
        }
    }
    // Labels Prometheus adds to every scraped series.
    let target_labels = ["instance", "job"];
    let every_label: BTreeSet<String> = wanted.values().flatten().cloned().collect();
    let grouping = wanted.remove("").unwrap_or_default();
    let last = std::cell::RefCell::new(String::new());
    let have = wait_for(
        || {
            format!(
                "metrics the dashboard queries never had samples: {}",
                last.borrow()
            )
        },
        || {
            let text = scrape(&addr);
            let have = exported(&text);
            let lacking: Vec<&String> = wanted
                .keys()
                .filter(|m| have.get(*m).is_none_or(|f| f.0 == 0))
                .collect();
            if lacking.is_empty() {
                return Some(have);
            }
            *last.borrow_mut() = format!("{lacking:?}\n{text}");
            None
        },
    );
    let missing: Vec<String> = wanted
        .iter()
        .flat_map(|(m, labels)| {
            labels
                .iter()
                .filter(|l| !have[m].1.contains(*l) && !target_labels.contains(&l.as_str()))
                .map(move |l| format!("{m}{{{l}}}"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "labels the dashboard matches on that the monitor does not export: {missing:?}"
    );
    // Grouping labels (`on(...)`, `label_values(..., L)`) exist on some exported family.
    let all: BTreeSet<&String> = have.values().flat_map(|f| &f.1).collect();
    for l in &grouping {
        assert!(
            all.contains(l) || target_labels.contains(&l.as_str()),
            "label {l} is exported by no family"
        );
    }
    assert!(
        every_label.contains("slice") && every_label.contains("uuid"),
        "{every_label:?}"
    );
    // What the issue asks the dashboard to show.
    let names: BTreeSet<&str> = wanted.keys().map(String::as_str).collect();
    for m in [
        "gpuslice_slice_memory_used_bytes",
        "gpuslice_slice_memory_limit_bytes",
        "gpuslice_slice_compute_used_ratio",
        "gpuslice_slice_compute_share_ratio",
        "gpuslice_slice_compute_cap_ratio",
        "gpuslice_slice_violations_total",
        "gpuslice_slice_processes",
        "gpuslice_device_memory_reserved_bytes",
        "gpuslice_device_memory_total_bytes",
    ] {
        assert!(names.contains(m), "the dashboard does not show {m}");
    }
}
