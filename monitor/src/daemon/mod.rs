//! `gpuslice monitor`: the node daemon, and the monitor lock by which everyone else finds it.
//!
//! The monitor keeps the ledger healthy; it never enforces anything (the shim does, in each
//! process), so it may die and restart at any moment: all state lives in the ledger, and the
//! monitor recomputes everything it shows from there.
//!
//! Each tick (a few times a second) it reaps processes that are gone, returning their memory
//! and compute leases to their slices ([`crate::ledger_window::LedgerWindow::reap`]); every second it audits
//! real per-process device memory through NVML and flags slices whose processes hold more than
//! their quota. `--metrics-listen` serves the Prometheus exposition from a second thread.
//!
//! While running it holds an exclusive `flock` on `$GPUSLICE_RUNTIME_DIR/monitor.lock`, which
//! contains its pid: [`monitor_running`] tests that lock (no race with a monitor starting or
//! dying), a second monitor refuses to start, and [`start_background`] is how `gpuslice run`
//! starts one when none is there.
//!
//! One file a job: this one the start-up (node mode's admission socket and compute turns, the
//! metrics thread) and the loop (reaping, reopening a replaced ledger); `options.rs` the
//! command line; `lock.rs` the monitor lock, [`monitor_running`] and [`start_background`];
//! `audit.rs` the memory audit through NVML; `fd_scan.rs` when the descriptor scan runs
//! (`crate::descriptor_scan`), on its own thread, and what it says.

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

mod audit;
mod fd_scan;
mod lock;
pub(crate) mod options;

pub use lock::{monitor_running, start_background, MonitorLock, LOG_FILE};
pub use options::OnViolation;

use crate::cli::{self, Failure};
use crate::ledger_window::LedgerWindow;
use crate::nvml::{Gpu, Nvml};
use crate::prom::MonitorFacts;
use fd_scan::{FdScan, FD_SCAN_MIN};
use options::{group_gid, parse, Options, USAGE};
use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Entry point of `gpuslice monitor`.
pub fn main(args: Vec<OsString>) -> i32 {
    cli::exit_status((|| {
        let Some(opts) = parse(args)? else {
            return Ok(());
        };
        run(opts)
    })())
}

/// Parse `gpuslice monitor`'s arguments and nothing more (for the command-line tests).
#[cfg(test)]
pub(crate) fn parse_options(args: Vec<OsString>) -> Result<(), Failure> {
    parse(args).map(drop)
}

/// What the metrics thread reads: the monitor's own facts (the node's come from the ledger).
type Shared = Arc<Mutex<MonitorFacts>>;

fn run(opts: Options) -> Result<(), Failure> {
    let dir = cli::runtime_dir();
    gpuslice_ledger::dir::check_absolute(&dir).map_err(|e| Failure::usage(e.to_string(), USAGE))?;
    // Node mode for root on the node's default directory, or where a node policy already is
    // (a monitor restarted without --mode, or started by `gpuslice run`).
    let node_mode = opts.node.unwrap_or_else(|| {
        gpuslice_ledger::dir::euid() == 0
            && (dir == Path::new(gpuslice_ledger::DEFAULT_RUNTIME_DIR)
                || crate::ledger_window::is_node_dir(&dir.to_string_lossy()))
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
        let (node, restored) = LedgerWindow::open_or_create_node(&dir)?;
        restored.iter().for_each(|l| log!("{l}"));
        // The devices first: admission accepts only devices the monitor registered (a tenant
        // naming a device cannot register it, or its size).
        if nvml.is_none() {
            log!("node mode needs NVML to register the GPUs: until it loads, no process can be admitted");
        }
        if let Some(devs) = nvml.as_ref().and_then(|n| n.devices().ok()) {
            register_devices(&node, &devs);
        }
        let (policy, regions) = node.parts().expect("node mode has regions");
        let ledger = policy.ledger().clone();
        let balloons = if opts.balloons {
            start_balloons(
                &ledger,
                regions.as_ref(),
                nvml.as_ref(),
                opts.context_memory,
            )
        } else {
            log!(
                "balloons off (--balloons off): reserved memory is held in software only; a \
                 program without the library can take memory other slices reserved"
            );
            // Contexts are charged all the same: unless --context-memory says what one costs,
            // the driver is opened to measure the monitor's own (its primary contexts stay
            // retained, as with balloons: the device memory they take is the monitor's).
            let probe = opts
                .context_memory
                .is_none()
                .then(crate::balloon::Balloons::open)
                .and_then(Result::ok);
            charge_contexts(&ledger, nvml.as_ref(), opts.context_memory, probe.is_some());
            drop(probe);
            None
        };
        // Compute turns: granted by this monitor from here on (tenants cannot write leases).
        crate::turns::spawn(ledger.clone(), regions.clone())?;
        let listener = crate::admission::bind(&ledger)?;
        let server = Arc::new(crate::admission::Server {
            policy,
            regions,
            limits: opts.limits,
            operator_group: crate::admission::OperatorGroup {
                gid: group_gid(&opts.operator_group),
                name: opts.operator_group.clone(),
            },
            balloons: balloons.clone(),
            nvml: Nvml::load().ok(),
        });
        std::thread::Builder::new()
            .name("admission".into())
            .spawn(move || crate::admission::serve(listener, server))
            .map_err(|e| format!("cannot start the admission thread: {e}"))?;
        log!(
            "node mode: the policy {} is written by this monitor only; processes are admitted \
             at {} (operator group {:?}, at most {} processes and {} slices per user)",
            dir.join("ledger").display(),
            dir.join(gpuslice_protocol::SOCKET_FILE).display(),
            opts.operator_group,
            opts.limits.procs_per_uid,
            opts.limits.slices_per_uid
        );
        Some((node, balloons))
    } else {
        // A ledger that cannot be used is reported (and retried) by the loop below.
        LedgerWindow::open_or_create(&dir).ok().map(|n| (n, None))
    };
    let (first, balloons) = match first {
        Some((n, b)) => (Some(n), b),
        None => (None, None),
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
        on_violation: opts
            .on_violation
            .unwrap_or(OnViolation::default_for(node_mode)),
        context_allowance: opts.context_allowance,
        fresh: first,
        last_error: None,
        over: HashSet::new(),
        bypassing: HashSet::new(),
        balloons,
        facts,
        last_fd_scan: None,
        fd_scan: None,
        fd_scan_every: FD_SCAN_MIN,
        fd_scan_held: vec![],
        fd_scan_witnesses: vec![],
        in_flight: vec![],
        in_flight_said: vec![],
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
    match LedgerWindow::open(dir) {
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
    node: Option<LedgerWindow>,
    /// Node mode: the policy and the admission socket are this process's; they are never
    /// reopened (a replaced policy ends the monitor, for its supervisor to restart it).
    node_mode: bool,
    on_violation: OnViolation,
    /// What the audit allows each process beyond what it charged (`--context-allowance`).
    context_allowance: u64,
    /// The ledger opened before the lock was taken, used by the first tick.
    fresh: Option<LedgerWindow>,
    /// The last error opening the ledger, logged once until it changes.
    last_error: Option<String>,
    /// Slices (record, device) currently flagged over quota, to log transitions only.
    over: HashSet<(usize, String)>,
    /// Bypasses (pid, start time) reported already, to log each once in report mode.
    bypassing: HashSet<(u32, u64)>,
    /// Node mode: the slices' unused reservations, held on the GPUs (`--balloons`).
    balloons: Option<Arc<crate::balloon::Balloons>>,
    facts: Shared,
    /// Node mode: when `/proc/*/fd` was last scanned for exported allocations' descriptors.
    last_fd_scan: Option<Instant>,
    /// That scan while it runs (`scan_descriptors`): its log lines.
    fd_scan: Option<std::thread::JoinHandle<FdScan>>,
    /// The wait between scans ([`fd_scan::next_fd_scan_every`]).
    fd_scan_every: Duration,
    /// The records the last scan was started for (a change brings the wait back to its least).
    fd_scan_held: Vec<(usize, gpuslice_ledger::ShareKey)>,
    /// The processes whose exit makes the next scan due at once (`Unheld::witnesses`).
    fd_scan_witnesses: Vec<(u32, u64)>,
    /// The records the last complete scan kept only for their owners' processes (each logged
    /// when it starts being kept so).
    in_flight: Vec<crate::descriptor_scan::InFlight>,
    /// When each record was last logged so ([`fd_scan::IN_FLIGHT_LOG_EVERY`]).
    in_flight_said: Vec<(crate::descriptor_scan::InFlight, Instant)>,
}

impl Monitor {
    fn tick(&mut self) {
        if self.node.is_none() {
            let opened = match self.fresh.take() {
                Some(n) => Ok(n),
                None => LedgerWindow::open_or_create(&self.dir),
            };
            match opened {
                Ok(node) => {
                    if let Some(nvml) = &self.nvml {
                        match nvml.devices() {
                            Ok(devs) => register_devices(&node, &devs),
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
                return;
            }
        }
        let ledger = node.parts().map(|(p, _)| p.ledger().clone());
        // After the reap: what the dead held is back in their slices' unused reservations.
        if let (Some(b), Some((ledger, regions))) = (&self.balloons, node.parts()) {
            for (l, short_on) in b.tick(&ledger, regions.as_ref()) {
                log!(
                    "{l}{}",
                    crowding(&ledger, regions.as_ref(), self.nvml.as_ref(), short_on)
                );
            }
            if let Ok(mut f) = self.facts.lock() {
                f.balloons = b.held().into_iter().collect();
                f.balloons.sort();
            }
        }
        self.scan_descriptors(ledger);
    }
}

/// For a balloon that cannot be filled on device `short_on`: whose memory outside gpuslice
/// crowds the reservation out (pid, uid, bytes by NVML), as the rest of its log line.
fn crowding(
    ledger: &gpuslice_ledger::Ledger,
    regions: &dyn gpuslice_ledger::region::Regions,
    nvml: Option<&Nvml>,
    short_on: Option<String>,
) -> String {
    let (Some(uuid), Some(nvml)) = (short_on, nvml) else {
        return String::new();
    };
    let Some(dev) = ledger.find_device(&uuid) else {
        return String::new();
    };
    match crate::physical::room(ledger, regions, nvml, true, dev, &uuid) {
        Some(r) if !r.outside.is_empty() => format!(" (crowded out{})", r.outside_text()),
        _ => " (nothing outside gpuslice by NVML: another slice's memory, or the driver's)"
            .to_string(),
    }
}

/// Node mode: set what each CUDA context is charged to its slice on every GPU
/// (`Device::context_bytes`): `--context-memory`, else what this monitor's own context takes
/// there by NVML (`measured`: its primary contexts are retained and nothing else allocated
/// yet), rounded up to 2 MiB. Where neither is known contexts are not charged, said once.
fn charge_contexts(
    ledger: &gpuslice_ledger::Ledger,
    nvml: Option<&Nvml>,
    flag: Option<u64>,
    measured: bool,
) {
    let devs = nvml.and_then(|n| n.devices().ok()).unwrap_or_default();
    let me = std::process::id();
    for d in &devs {
        let own = || {
            let procs = nvml?.processes(d.index).ok()??;
            procs.iter().find(|p| p.0 == me).map(|p| p.1)
        };
        let bytes = match flag {
            Some(b) => Some(b),
            None if measured => own().map(|b| b.div_ceil(2 << 20) * (2 << 20)),
            None => None,
        };
        let Some(bytes) = bytes else {
            log!(
                "WARNING: contexts are not charged to slices on {}: the monitor could not \
                 measure one (balloons off, or NVML reports no per-process memory); give \
                 --context-memory SIZE",
                d.uuid
            );
            ledger.record_context_bytes(&d.uuid, 0);
            continue;
        };
        ledger.record_context_bytes(&d.uuid, bytes);
        log!(
            "contexts: each CUDA context on {} is charged {} to its slice, inside the quota \
             ({})",
            d.uuid,
            crate::table::size(bytes),
            if flag.is_some() {
                "--context-memory"
            } else {
                "what the monitor's own context takes; --context-memory to change it"
            }
        );
    }
}

/// Node mode: load the driver and hold every slice's unused reservation (the first tick, timed
/// for the log); `None`, with a warning, where the driver cannot be used.
fn start_balloons(
    ledger: &gpuslice_ledger::Ledger,
    regions: &dyn gpuslice_ledger::region::Regions,
    nvml: Option<&Nvml>,
    context_memory: Option<u64>,
) -> Option<Arc<crate::balloon::Balloons>> {
    let t0 = Instant::now();
    let b = match crate::balloon::Balloons::open() {
        Ok(b) => b,
        Err(e) => {
            log!(
                "WARNING: balloons unavailable ({e}): reserved memory is held in software only; \
                 a program without the library can take memory other slices reserved"
            );
            charge_contexts(ledger, nvml, context_memory, false);
            return None;
        }
    };
    // Before the first balloon: NVML then shows the monitor's own contexts alone.
    charge_contexts(ledger, nvml, context_memory, true);
    for (l, short_on) in b.tick(ledger, regions) {
        let l = l + &crowding(ledger, regions, nvml, short_on);
        log!("{l}");
    }
    let mut held: Vec<(String, u64)> = b.held().into_iter().collect();
    held.sort();
    log!(
        "balloons: holding every slice's unused reservation on the GPUs ({}; start-up {} ms)",
        if held.is_empty() {
            "nothing reserved yet".to_string()
        } else {
            held.iter()
                .map(|(u, n)| format!("{} on {u}", crate::table::size(*n)))
                .collect::<Vec<_>>()
                .join(", ")
        },
        t0.elapsed().as_millis()
    );
    Some(Arc::new(b))
}

/// Register the devices NVML lists in the ledger (admission accepts only registered devices);
/// a device that cannot be registered is logged and the others go on.
fn register_devices(node: &LedgerWindow, devs: &[Gpu]) {
    for d in devs {
        if let Err(e) = node.register_device(d) {
            log!("cannot register device {} ({}): {e}", d.index, d.uuid);
        }
    }
}
