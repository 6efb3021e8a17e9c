//! `gpuslice monitor`: the node daemon, and the monitor lock by which everyone else finds it.
//!
//! The monitor keeps the ledger healthy; it never enforces anything (the shim does, in each
//! process), so it may die and restart at any moment: all state lives in the ledger, and the
//! monitor recomputes everything it shows from there.
//!
//! Each tick (a few times a second) it reaps processes that are gone, returning their memory
//! and compute leases to their slices ([`crate::node::Node::reap`]); every second it audits
//! real per-process device memory through NVML and flags slices whose processes hold more than
//! their quota. `--metrics-listen` serves the Prometheus exposition from a second thread.
//!
//! While running it holds an exclusive `flock` on `$GPUSLICE_RUNTIME_DIR/monitor.lock`, which
//! contains its pid: [`monitor_running`] tests that lock (no race with a monitor starting or
//! dying), a second monitor refuses to start, and [`start_background`] is how `gpuslice run`
//! starts one when none is there.

use crate::cli::{self, Failure};
use crate::node::Node;
use crate::nvml::Nvml;
use crate::prom::{AuditRow, MonitorFacts};
use crate::view::NodeView;
use gpuslice_ledger::dir::{OpenHow, Owner, RuntimeDir};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const USAGE: &str = "gpuslice monitor [--metrics-listen ADDR] [--interval MS] [--mode node|personal] \
[--on-violation report|kill] [--max-procs-per-user N] [--max-slices-per-user N] [--operator-group NAME]";

/// The operator group's default name (docs/operations.md).
pub const OPERATOR_GROUP: &str = "gpuslice";

static OPERATOR_GROUP_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The operator group this monitor accepts (`--operator-group`).
pub fn operator_group_name() -> &'static str {
    OPERATOR_GROUP_NAME
        .get()
        .map_or(OPERATOR_GROUP, |s| s.as_str())
}

/// The gid of a group, if it exists.
fn group_gid(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: valid name; getgrnam returns null or a pointer to static data read at once.
    let g = unsafe { libc::getgrnam(c.as_ptr()) };
    // SAFETY: non-null pointer from getgrnam.
    (!g.is_null()).then(|| unsafe { (*g).gr_gid })
}

/// What the audit does with a slice over its quota by NVML (memory taken around gpuslice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnViolation {
    /// Log it, count it in metrics and `status`.
    Report,
    /// Also SIGKILL the slice's processes that hold memory on that device.
    Kill,
}

/// The lock file's name inside the runtime directory.
pub const LOCK_FILE: &str = "monitor.lock";
/// Where a monitor started by [`start_background`] writes its log, inside the runtime directory.
pub const LOG_FILE: &str = "monitor.log";

/// The pid of the monitor serving the ledger in `dir`, if one is running (as far as the
/// caller can tell: only the directory's owner can open the lock).
pub fn monitor_running(dir: &Path) -> Option<u32> {
    let d = RuntimeDir::open(dir).ok()?;
    if d.owner() == Owner::Root {
        // A node directory seen by a tenant: the lock is root's; ask the monitor itself.
        let (r, _) = gpuslice_ledger::protocol::call(
            d.fd(),
            &gpuslice_ledger::protocol::Message::new("op", "ping"),
            Duration::from_secs(2),
        )
        .ok()?;
        return r.get("ok").and_then(|p| p.parse().ok());
    }
    let mut f = File::from(d.open_file(LOCK_FILE, OpenHow::READ).ok()?);
    // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        // Nobody holds it exclusively: no monitor. Our shared lock goes with `f`.
        return None;
    }
    // A monitor holds it; it writes its pid right after locking, so wait a moment for that.
    for _ in 0..50 {
        let mut s = String::new();
        if f.read_to_string(&mut s).is_ok() {
            if let Ok(pid) = s.trim().parse() {
                return Some(pid);
            }
        }
        let _ = std::io::Seek::rewind(&mut f);
        std::thread::sleep(Duration::from_millis(2));
    }
    Some(0)
}

/// The runtime directory, if the caller may run its monitor there (it owns it), else a
/// message saying whose monitor it is.
fn own_dir(dir: &Path) -> Result<RuntimeDir, String> {
    let d = RuntimeDir::open_or_create(dir).map_err(|e| e.to_string())?;
    if d.owner() != Owner::Caller {
        return Err(format!(
            "the runtime directory {} belongs to root: only root runs its monitor \
             (`sudo gpuslice monitor`, or the node's service); set GPUSLICE_RUNTIME_DIR to a \
             directory of your own for a personal one",
            dir.display()
        ));
    }
    Ok(d)
}

/// The held monitor lock; released when the process exits (or this is dropped).
pub struct MonitorLock {
    _file: File,
}

impl MonitorLock {
    /// Take the lock for `dir`, or say which monitor holds it. The lock file is opened
    /// relative to the checked directory, never through a symlink, and must belong to the
    /// directory's owner (the caller): a planted file is refused, never truncated.
    pub fn acquire(dir: &Path) -> Result<MonitorLock, String> {
        let path = dir.join(LOCK_FILE);
        let d = own_dir(dir)?;
        let how = OpenHow {
            write: true,
            create: Some(0o600),
            exclusive: false,
            append: false,
        };
        let mut f = File::from(d.open_file(LOCK_FILE, how).map_err(|e| e.to_string())?);
        // A `monitor_running` probe holds a shared lock for microseconds: retry briefly so a
        // probe never makes a starting monitor believe another one runs.
        let mut tries = 0;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            tries += 1;
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) && tries < 50 {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let who = monitor_running(dir)
                    .map_or("another process".to_string(), |p| format!("pid {p}"));
                return Err(format!(
                    "a monitor is already running for {} ({who} holds {})",
                    dir.display(),
                    path.display()
                ));
            }
            return Err(format!("cannot lock {}: {err}", path.display()));
        }
        f.set_len(0)
            .and_then(|_| writeln!(f, "{}", std::process::id()))
            .map_err(|e| format!("cannot write the monitor's pid to {}: {e}", path.display()))?;
        Ok(MonitorLock { _file: f })
    }
}

/// Make sure a monitor serves `dir`: return the pid of the running one, or start one in the
/// background (detached, its log in `dir/monitor.log`) and return its pid once it holds the
/// lock. `started` tells whether this call started it. Only in a directory the caller owns.
pub fn start_background(dir: &Path) -> Result<(u32, bool), String> {
    if let Some(pid) = monitor_running(dir) {
        return Ok((pid, false));
    }
    let d = own_dir(dir)?;
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the gpuslice binary: {e}"))?;
    let log_path = dir.join(LOG_FILE);
    let how = OpenHow {
        write: true,
        create: Some(0o600),
        exclusive: false,
        append: true,
    };
    let log = File::from(
        d.open_file(LOG_FILE, how)
            .map_err(|e| format!("cannot open the monitor log: {e}"))?,
    );
    let log2 = log
        .try_clone()
        .map_err(|e| format!("cannot open the monitor log: {e}"))?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("monitor")
        .env("GPUSLICE_RUNTIME_DIR", dir)
        // The monitor must see the real driver, never a shim's view of it.
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: the closure runs in the forked child before exec and calls only async-signal-safe
    // functions (setsid, fork, _exit). The double fork detaches the monitor: it is reparented to
    // init, so it never becomes a zombie of the caller, and setsid keeps terminal signals away.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {} monitor: {e}", exe.display()))?;
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(pid) = monitor_running(dir) {
            return Ok((pid, true));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(3).collect();
    Err(format!(
        "started `{} monitor` but it did not come up within 5 s; last lines of {}: {}",
        exe.display(),
        log_path.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    ))
}

/// A monitor log line on stderr, with a UTC timestamp (journald and `monitor.log` both read it).
/// A closed stderr loses the line but never stops the monitor (`eprintln!` would panic).
macro_rules! log {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let s = now.as_secs();
        let _ = writeln!(
            std::io::stderr(),
            "{:02}:{:02}:{:02}.{:03} gpuslice monitor: {}",
            (s / 3600) % 24,
            (s / 60) % 60,
            s % 60,
            now.subsec_millis(),
            format!($($t)*)
        );
    }};
}

struct Options {
    listen: Option<String>,
    interval: Duration,
    /// `Some(true)`: node mode; `None`: node mode for root on the default directory.
    node: Option<bool>,
    limits: gpuslice_ledger::node::Limits,
    operator_group: String,
    on_violation: OnViolation,
}

fn parse(args: Vec<OsString>) -> Result<Option<Options>, Failure> {
    use lexopt::Arg::*;
    let mut p = cli::parser(args);
    let mut o = Options {
        listen: None,
        interval: Duration::from_millis(250),
        node: None,
        limits: Default::default(),
        operator_group: OPERATOR_GROUP.into(),
        on_violation: OnViolation::Report,
    };
    let mut interval = None;
    while let Some(arg) = p.next().map_err(cli::lex(USAGE))? {
        if cli::is_help(&arg) {
            cli::outln!("usage: {USAGE}")?;
            return Ok(None);
        }
        match arg {
            Long("metrics-listen") => {
                let v = cli::utf8(
                    p.value().map_err(cli::lex(USAGE))?,
                    "--metrics-listen",
                    USAGE,
                )?;
                if !v.contains(':') {
                    return Err(Failure::usage(
                        format!("--metrics-listen {v:?}: expected HOST:PORT, e.g. 127.0.0.1:9400 or [::1]:9400"),
                        USAGE,
                    ));
                }
                cli::once(&mut o.listen, "--metrics-listen", v, USAGE)?;
            }
            Long("mode") => {
                let v = cli::utf8(p.value().map_err(cli::lex(USAGE))?, "--mode", USAGE)?;
                o.node = Some(match v.as_str() {
                    "node" => true,
                    "personal" => false,
                    _ => {
                        return Err(Failure::usage(
                            format!("--mode {v:?}: expected node or personal"),
                            USAGE,
                        ))
                    }
                });
            }
            Long("on-violation") => {
                let v = cli::utf8(p.value().map_err(cli::lex(USAGE))?, "--on-violation", USAGE)?;
                o.on_violation = match v.as_str() {
                    "report" => OnViolation::Report,
                    "kill" => OnViolation::Kill,
                    _ => {
                        return Err(Failure::usage(
                            format!("--on-violation {v:?}: expected report or kill"),
                            USAGE,
                        ))
                    }
                };
            }
            Long(flag @ ("max-procs-per-user" | "max-slices-per-user")) => {
                let flag = format!("--{flag}");
                let v = cli::utf8(p.value().map_err(cli::lex(USAGE))?, &flag, USAGE)?;
                let max = if flag == "--max-procs-per-user" {
                    gpuslice_ledger::MAX_PROCS
                } else {
                    gpuslice_ledger::MAX_SLICES
                };
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| {
                        Failure::usage(format!("{flag} {v:?}: expected 1 to {max}"), USAGE)
                    })?;
                if flag == "--max-procs-per-user" {
                    o.limits.procs_per_uid = n;
                } else {
                    o.limits.slices_per_uid = n;
                }
            }
            Long("operator-group") => {
                o.operator_group = cli::utf8(
                    p.value().map_err(cli::lex(USAGE))?,
                    "--operator-group",
                    USAGE,
                )?;
            }
            Long("interval") => {
                let v = cli::utf8(p.value().map_err(cli::lex(USAGE))?, "--interval", USAGE)?;
                cli::millis(&mut interval, "--interval", &v, 10..=5000, USAGE)?;
            }
            _ => return Err(Failure::usage(arg.unexpected().to_string(), USAGE)),
        }
    }
    o.interval = interval.unwrap_or(o.interval);
    Ok(Some(o))
}

/// Entry point of `gpuslice monitor`.
pub fn main(args: Vec<OsString>) -> i32 {
    cli::exit_status((|| {
        let Some(opts) = parse(args)? else {
            return Ok(());
        };
        run(opts)
    })())
}

/// What the metrics thread reads: the monitor's own facts (the node's come from the ledger).
type Shared = Arc<Mutex<MonitorFacts>>;

fn run(opts: Options) -> Result<(), Failure> {
    let dir = cli::runtime_dir();
    gpuslice_ledger::dir::check_absolute(&dir).map_err(|e| Failure::usage(e.to_string(), USAGE))?;
    let _ = OPERATOR_GROUP_NAME.set(opts.operator_group.clone());
    // Node mode for root on the node's default directory, or where a node policy already is
    // (a monitor restarted without --mode, or started by `gpuslice run`).
    let node_mode = opts.node.unwrap_or_else(|| {
        gpuslice_ledger::dir::euid() == 0
            && (dir == Path::new(gpuslice_ledger::DEFAULT_RUNTIME_DIR)
                || crate::node::is_node_dir(&dir.to_string_lossy()))
    });
    let _lock = MonitorLock::acquire(&dir)?;
    let nvml = match Nvml::load() {
        Ok(n) => Some(n),
        Err(e) => {
            log!("NVML unavailable ({e}): devices come from the ledger only, no memory audit");
            None
        }
    };
    let first = if node_mode {
        let node = Node::open_or_create_node(&dir)?;
        // The devices first: admission accepts only devices the monitor registered (a tenant
        // naming a device cannot register it, or its size).
        if nvml.is_none() {
            log!("node mode needs NVML to register the GPUs: until it loads, no process can be admitted");
        }
        if let Some(devs) = nvml.as_ref().and_then(|n| n.devices().ok()) {
            for d in &devs {
                if let Err(e) = node.register_device(d) {
                    log!("cannot register device {} ({}): {e}", d.index, d.uuid);
                }
            }
        }
        let (ledger, regions) = node.parts().expect("node mode has regions");
        // Compute turns: granted by this monitor from here on (tenants cannot write leases).
        crate::turns::spawn(ledger.clone(), regions.clone())?;
        let listener = crate::admission::bind(&ledger)?;
        let server = Arc::new(crate::admission::Server {
            ledger,
            regions,
            limits: opts.limits,
            operator_gid: group_gid(&opts.operator_group),
        });
        std::thread::Builder::new()
            .name("admission".into())
            .spawn(move || crate::admission::serve(listener, server))
            .map_err(|e| format!("cannot start the admission thread: {e}"))?;
        log!(
            "node mode: the policy {} is written by this monitor only; processes are admitted \
             at {} (operator group {:?}, at most {} processes and {} slices per user)",
            dir.join("ledger").display(),
            dir.join(gpuslice_ledger::protocol::SOCKET_FILE).display(),
            opts.operator_group,
            opts.limits.procs_per_uid,
            opts.limits.slices_per_uid
        );
        Some(node)
    } else {
        // A ledger that cannot be used is reported (and retried) by the loop below.
        Node::open_or_create(&dir).ok()
    };
    // SIGTERM/SIGINT/SIGHUP: finish the tick and exit (after at most one --interval sleep).
    cli::stop_on_signals(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
    let facts: Shared = Arc::default();
    if let Some(addr) = &opts.listen {
        let listener = crate::http::bind(addr)?;
        if let Some(w) = listener
            .local_addr()
            .ok()
            .and_then(|a| crate::http::exposure_warning(&a))
        {
            log!("{w}");
        }
        let (dir, facts) = (dir.clone(), facts.clone());
        log!(
            "serving metrics at http://{}/metrics",
            listener
                .local_addr()
                .map_or(addr.clone(), |a| a.to_string())
        );
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || crate::http::serve(listener, move || scrape(&dir, &facts)))
            .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    }
    log!(
        "started (pid {}) for the ledger in {}",
        std::process::id(),
        dir.display()
    );
    let mut m = Monitor {
        dir,
        nvml,
        node: None,
        node_mode,
        on_violation: opts.on_violation,
        fresh: first,
        last_error: None,
        over: HashSet::new(),
        facts,
    };
    let mut last_audit = Instant::now() - Duration::from_secs(10);
    while !cli::stop_requested() {
        m.tick();
        if last_audit.elapsed() >= Duration::from_secs(1) {
            last_audit = Instant::now();
            m.audit();
        }
        std::thread::sleep(opts.interval);
    }
    log!("stopping on signal; the ledger stays, enforcement continues without the monitor");
    Ok(())
}

/// A `/metrics` scrape: a fresh snapshot of the ledger plus the monitor's facts.
fn scrape(dir: &Path, facts: &Shared) -> String {
    let facts = facts.lock().map(|f| f.clone()).unwrap_or_default();
    match Node::open(dir) {
        Ok(node) => crate::prom::render(&node.snapshot(), Some(&facts)),
        Err(e) => format!(
            "# the ledger cannot be read: {}\n{}",
            e.to_string().replace('\n', " "),
            crate::prom::render(&Default::default(), Some(&facts))
        ),
    }
}

struct Monitor {
    dir: PathBuf,
    nvml: Option<Nvml>,
    node: Option<Node>,
    /// Node mode: the policy and the admission socket are this process's; they are never
    /// reopened (a replaced policy ends the monitor, for its supervisor to restart it).
    node_mode: bool,
    on_violation: OnViolation,
    /// The ledger opened before the lock was taken, used by the first tick.
    fresh: Option<Node>,
    /// The last error opening the ledger, logged once until it changes.
    last_error: Option<String>,
    /// Slices currently flagged over quota, to log transitions only.
    over: HashSet<(String, String)>,
    facts: Shared,
}

impl Monitor {
    fn tick(&mut self) {
        if self.node.is_none() {
            let opened = match self.fresh.take() {
                Some(n) => Ok(n),
                None => Node::open_or_create(&self.dir),
            };
            match opened {
                Ok(node) => {
                    if let Some(nvml) = &self.nvml {
                        match nvml.devices() {
                            Ok(devs) => {
                                for d in &devs {
                                    if let Err(e) = node.register_device(d) {
                                        log!(
                                            "cannot register device {} ({}): {e}",
                                            d.index,
                                            d.uuid
                                        );
                                    }
                                }
                            }
                            Err(e) => log!("NVML cannot list devices: {e}"),
                        }
                    }
                    // Said once the devices are registered: `status` then shows them.
                    if self.last_error.take().is_some() {
                        log!("the ledger in {} is usable again", self.dir.display());
                    }
                    self.node = Some(node);
                }
                Err(e) => {
                    let e = e.to_string();
                    if self.last_error.as_deref() != Some(e.as_str()) {
                        log!("{e} (retrying; enforcement in wrapped processes is unaffected)");
                        self.last_error = Some(e);
                    }
                    return;
                }
            }
        }
        let Some(node) = &self.node else { return };
        if !node.is_current() && self.node_mode {
            log!("the node policy was removed or replaced; exiting so that a fresh monitor serves it");
            std::process::exit(1);
        }
        if !node.is_current() {
            log!("the ledger file was removed or replaced; attaching to the one there now");
            self.node = None;
            return self.tick();
        }
        match node.reap() {
            Ok((reaped, lines)) => {
                for l in &lines {
                    log!("{l}");
                }
                if reaped > 0 {
                    if let Ok(mut f) = self.facts.lock() {
                        f.reaped_total += reaped;
                    }
                }
            }
            Err(e) if self.node_mode => log!("{e}; retrying at the next tick"),
            Err(e) => {
                log!("{e}; reopening the ledger");
                self.node = None;
            }
        }
    }

    /// Compare what NVML says the slices' processes hold with their quotas (the policy's,
    /// which no tenant can write in node mode). A process that holds device memory without
    /// being in the ledger (`GPUSLICE_DISABLE=1`, no `LD_PRELOAD`) is counted in the slice its
    /// environment names (`GPUSLICE_SLICE`, read from `/proc/<pid>/environ` by the monitor).
    /// A slice over its quota is a violation: logged once, flagged in the ledger for `status`
    /// and metrics, and with `--on-violation kill` its processes on that device are killed.
    fn audit(&mut self) {
        let (Some(nvml), Some(node)) = (&self.nvml, &self.node) else {
            return;
        };
        let Ok(devs) = nvml.devices() else { return };
        let held: Vec<(String, Vec<Held>)> = devs
            .iter()
            .filter_map(|d| match nvml.processes(d.index) {
                Ok(Some(p)) => Some((
                    d.uuid.clone(),
                    p.into_iter()
                        .map(|(pid, bytes)| Held {
                            pid,
                            key: proc_key(pid),
                            bytes,
                            env_slice: env_slice(pid),
                        })
                        .collect(),
                )),
                _ => None,
            })
            .collect();
        let rows = audit_rows(&node.snapshot(), &held);
        for line in audit_transitions(&mut self.over, &rows) {
            log!("{line}");
        }
        node.record_audit(&rows);
        if self.on_violation == OnViolation::Kill {
            for r in rows.iter().filter(|r| r.over_quota()) {
                for &pid in &r.pids {
                    // SAFETY: kill() on a pid NVML reports on the device right now, attributed
                    // to the slice over its quota; checked against reuse by its start time.
                    let ok = unsafe { libc::kill(pid as i32, libc::SIGKILL) } == 0;
                    log!(
                        "audit: --on-violation kill: {} pid {pid} of slice {:?} on {}",
                        if ok { "killed" } else { "could not kill" },
                        r.slice,
                        r.device_uuid
                    );
                }
            }
        }
        if let Ok(mut f) = self.facts.lock() {
            f.audit = rows;
            f.device_observed = devs
                .iter()
                .map(|d| (d.uuid.clone(), d.memory_used))
                .collect();
        }
    }
}

/// One process NVML reports on a device.
#[derive(Debug, Clone)]
struct Held {
    /// pid as NVML (the monitor's namespace) sees it.
    pid: u32,
    key: ProcKey,
    bytes: u64,
    /// `GPUSLICE_SLICE` in its environment, for processes the ledger does not know.
    env_slice: Option<String>,
}

/// `GPUSLICE_SLICE` from `/proc/<pid>/environ` (root reads any process's).
fn env_slice(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"GPUSLICE_SLICE="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// How the audit recognises a process: its pid in its own (innermost) PID namespace, as it
/// recorded itself in the ledger, and its start time; `0` when unknown.
type ProcKey = (u32, u64);

/// The [`ProcKey`] of a pid NVML reports (a pid of the monitor's namespace, normally the
/// host's): the last `NSpid` of `/proc/<pid>/status` and field 22 of `/proc/<pid>/stat`.
fn proc_key(pid: u32) -> ProcKey {
    let inner = gpuslice_ledger::innermost_pid_of(pid).unwrap_or(pid);
    (inner, gpuslice_ledger::start_time_of(&pid.to_string()))
}

/// Per slice and device NVML reports on: what the slice's live processes hold there by NVML.
/// A process is matched by its pid and start time, or by pid alone where the start time could
/// not be read; NVML processes the ledger does not know count in the slice their environment
/// names. Each row keeps the NVML pids it counted (what `--on-violation kill` ends).
fn audit_rows(snap: &NodeView, held: &[(String, Vec<Held>)]) -> Vec<AuditRow> {
    let start: HashMap<u32, u64> = snap
        .processes
        .iter()
        .filter(|p| p.alive)
        .map(|p| (p.pid, p.start_time))
        .collect();
    let known: HashSet<ProcKey> = snap
        .processes
        .iter()
        .filter(|p| p.alive)
        .flat_map(|p| [(p.pid, p.start_time), (p.pid, 0)])
        .collect();
    let mut rows = Vec::new();
    for (uuid, procs) in held {
        for s in snap.slices.iter().filter(|s| &s.device_uuid == uuid) {
            let mut row = AuditRow {
                slice: s.name.clone(),
                device_uuid: s.device_uuid.clone(),
                observed: 0,
                limit: s.memory_limit,
                pids: vec![],
            };
            for h in procs {
                let member = s.pids.iter().any(|pid| {
                    let st = start.get(pid).copied().unwrap_or(0);
                    h.key == (*pid, st) || (h.key.0 == *pid && h.key.1 == 0)
                });
                let named = !known.contains(&h.key)
                    && !known.contains(&(h.key.0, 0))
                    && h.env_slice.as_deref() == Some(s.name.as_str());
                if member || named {
                    row.observed = row.observed.saturating_add(h.bytes);
                    row.pids.push(h.pid);
                }
            }
            rows.push(row);
        }
    }
    rows
}

/// Log lines for slices that went over their quota or came back, updating `over` (the slices
/// flagged now), so a slice that stays over is reported once, not every second.
fn audit_transitions(over: &mut HashSet<(String, String)>, rows: &[AuditRow]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in rows {
        let key = (r.slice.clone(), r.device_uuid.clone());
        if r.over_quota() && over.insert(key.clone()) {
            lines.push(format!(
                "audit: slice {:?} on {} holds {} by NVML, over its quota of {} \
                 (memory taken outside gpuslice's accounting?)",
                r.slice,
                r.device_uuid,
                crate::table::size(r.observed),
                crate::table::size(r.limit.unwrap_or(0))
            ));
        } else if !r.over_quota() && over.remove(&key) {
            lines.push(format!(
                "audit: slice {:?} on {} is back within its quota",
                r.slice, r.device_uuid
            ));
        }
    }
    // A slice that went away is no longer over anything.
    over.retain(|k| rows.iter().any(|r| r.slice == k.0 && r.device_uuid == k.1));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_lock_or_log_is_refused_and_never_written() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let d = std::env::temp_dir().join(format!("gpuslice-plant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let rt = d.join("rt");
        std::fs::create_dir_all(&rt).unwrap();
        std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
        let target = d.join("root-only");
        std::fs::write(&target, "secret\n").unwrap();
        symlink(&target, rt.join(LOCK_FILE)).unwrap();
        let e = MonitorLock::acquire(&rt).err().expect("refused");
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(monitor_running(&rt), None);
        std::fs::remove_file(rt.join(LOCK_FILE)).unwrap();
        symlink(&target, rt.join(LOG_FILE)).unwrap();
        let e = start_background(&rt).expect_err("refused");
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_process_is_keyed_as_it_recorded_itself() {
        let me = std::process::id();
        assert_eq!(proc_key(me), (me, gpuslice_ledger::own_start_time()));
    }

    #[test]
    fn the_audit_flags_a_slice_over_its_quota_once_and_its_return() {
        let mut snap = crate::view::tests::sample();
        let uuid = snap.devices[0].uuid.clone();
        snap.slices[1].pids = vec![102];
        // train (4 GiB quota): pids 100 and 101; 102 is in a best-effort slice.
        let held = |a: u64, b: u64| {
            vec![(
                uuid.clone(),
                // 100 matches by pid and start time; 101's start time was unreadable; a process
                // with 100's pid but another start time (another namespace) is not train's.
                // 555 bypasses gpuslice (not in the ledger) but names train in its environment.
                [
                    ((100, 7), a, None),
                    ((101, 0), b, None),
                    ((100, 8), 1 << 40, None),
                    ((102, 7), 9 << 30, None),
                    ((999, 7), 1 << 40, None),
                    ((555, 3), a / 3, Some("train")),
                ]
                .into_iter()
                .map(|(key, bytes, env)| Held {
                    pid: key.0 + 10_000,
                    key,
                    bytes,
                    env_slice: env.map(String::from),
                })
                .collect::<Vec<_>>(),
            )]
        };
        let rows = audit_rows(&snap, &held(3 << 30, 2 << 30));
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].observed, rows[0].over_quota()), (6 << 30, true));
        let mut pids = rows[0].pids.clone();
        pids.sort();
        assert_eq!(
            pids,
            [10_100, 10_101, 10_555],
            "the NVML pids kill would end"
        );
        assert!(
            !rows[1].over_quota(),
            "a best-effort slice has no quota to exceed"
        );
        let mut over = HashSet::new();
        let lines = audit_transitions(&mut over, &rows);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains("\"train\"")
                && lines[0].contains("6 GiB")
                && lines[0].contains("4 GiB"),
            "{lines:?}"
        );
        assert!(
            audit_transitions(&mut over, &rows).is_empty(),
            "reported once"
        );
        let back = audit_rows(&snap, &held(1 << 30, 1 << 30));
        let lines = audit_transitions(&mut over, &back);
        assert!(
            lines.len() == 1 && lines[0].contains("back within"),
            "{lines:?}"
        );
        assert!(over.is_empty());
    }
}
