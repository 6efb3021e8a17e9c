//! The command line of `gpuslice monitor` (its flags, checked, with one usage line) and the
//! operator group it accepts. Apart from the loop so that what the monitor is asked to do is
//! read in one place.

use crate::cli::{self, Failure};
use std::ffi::OsString;
use std::time::Duration;

pub(super) const USAGE: &cli::Command = &crate::commands::MONITOR;

/// The operator group's default name (docs/operations.md).
pub const OPERATOR_GROUP: &str = "gpuslice";

/// The gid of a group, if it exists.
pub(super) fn group_gid(name: &str) -> Option<u32> {
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
    /// Also SIGKILL the processes that are over (`AuditRow::to_kill`) and tenants' bypasses.
    Kill,
}

impl OnViolation {
    /// The default: `kill` in node mode (its defaults are the safe ones: a tenant over its
    /// slice by a bypass or a scribbled counter does not keep what it took; the cost, a process
    /// whose context grows past its charge and `--context-allowance`, is in docs/security.md),
    /// `report` in personal mode (one user's own programs).
    pub fn default_for(node_mode: bool) -> OnViolation {
        if node_mode {
            OnViolation::Kill
        } else {
            OnViolation::Report
        }
    }
}

pub(super) struct Options {
    pub(super) listen: Option<String>,
    pub(super) interval: Duration,
    /// `Some(true)`: node mode; `None`: node mode for root on the default directory.
    pub(super) node: Option<bool>,
    pub(super) limits: gpuslice_ledger::node::Limits,
    pub(super) operator_group: String,
    /// `None`: the mode's default ([`OnViolation::default_for`]).
    pub(super) on_violation: Option<OnViolation>,
    /// Node mode: hold every slice's unused reservation physically (`crate::balloon`).
    pub(super) balloons: bool,
    /// Device memory the audit allows each process beyond what it charged: its CUDA context,
    /// which the driver takes and NVML counts but no quota does (`--context-allowance`).
    pub(super) context_allowance: u64,
    /// Node mode: what each CUDA context is charged to its slice, inside the quota
    /// (`--context-memory`; `None`: what the monitor's own context takes, measured at start).
    pub(super) context_memory: Option<u64>,
}

/// `--context-allowance`'s default: more than a real driver's context takes (a few hundred
/// MiB on current GPUs with lazy module loading; docs/operations.md, "The audit").
pub const CONTEXT_ALLOWANCE: u64 = 512 << 20;

pub(super) fn parse(args: Vec<OsString>) -> Result<Option<Options>, Failure> {
    use lexopt::Arg::*;
    let mut p = cli::Args::new(args, USAGE);
    let mut o = Options {
        listen: None,
        interval: Duration::from_millis(250),
        node: None,
        limits: Default::default(),
        operator_group: OPERATOR_GROUP.into(),
        on_violation: None,
        balloons: true,
        context_allowance: CONTEXT_ALLOWANCE,
        context_memory: None,
    };
    let mut interval = None;
    loop {
        let arg = match p.next() {
            Ok(Some(arg)) => arg,
            Ok(None) => break,
            Err(Failure::Helped) => return Ok(None),
            Err(e) => return Err(e),
        };
        match arg {
            Long("metrics-listen") => {
                let v = cli::utf8(p.value()?, "--metrics-listen", USAGE)?;
                if !v.contains(':') {
                    return Err(Failure::usage(
                        format!("--metrics-listen {v:?}: expected HOST:PORT, e.g. 127.0.0.1:9400 or [::1]:9400"),
                        USAGE,
                    ));
                }
                cli::once(&mut o.listen, "--metrics-listen", v, USAGE)?;
            }
            Long("mode") => {
                let v = cli::utf8(p.value()?, "--mode", USAGE)?;
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
                let v = cli::utf8(p.value()?, "--on-violation", USAGE)?;
                o.on_violation = Some(match v.as_str() {
                    "report" => OnViolation::Report,
                    "kill" => OnViolation::Kill,
                    _ => {
                        return Err(Failure::usage(
                            format!("--on-violation {v:?}: expected report or kill"),
                            USAGE,
                        ))
                    }
                });
            }
            Long("context-allowance") => {
                let v = cli::utf8(p.value()?, "--context-allowance", USAGE)?;
                o.context_allowance = match gpuslice_quantity::parse_size("--context-allowance", &v)
                {
                    Ok(gpuslice_quantity::Size::Bytes(n)) => n,
                    _ => {
                        return Err(Failure::usage(
                            format!(
                                "--context-allowance {v:?}: expected a size in bytes, like \
                                 512Mi or 0 (default 512Mi)"
                            ),
                            USAGE,
                        ))
                    }
                };
            }
            Long("context-memory") => {
                let v = cli::utf8(p.value()?, "--context-memory", USAGE)?;
                let n = match gpuslice_quantity::parse_size("--context-memory", &v) {
                    Ok(gpuslice_quantity::Size::Bytes(n)) => n,
                    _ => {
                        return Err(Failure::usage(
                            format!(
                                "--context-memory {v:?}: expected a size in bytes, like 512Mi \
                                 or 0 (contexts not charged; default: what the monitor's own \
                                 context takes)"
                            ),
                            USAGE,
                        ))
                    }
                };
                cli::once(&mut o.context_memory, "--context-memory", n, USAGE)?;
            }
            Long("balloons") => {
                let v = cli::utf8(p.value()?, "--balloons", USAGE)?;
                o.balloons = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => {
                        return Err(Failure::usage(
                            format!("--balloons {v:?}: expected on or off"),
                            USAGE,
                        ))
                    }
                };
            }
            Long(flag @ ("max-procs-per-user" | "max-slices-per-user")) => {
                let flag = format!("--{flag}");
                let v = cli::utf8(p.value()?, &flag, USAGE)?;
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
                o.operator_group = cli::utf8(p.value()?, "--operator-group", USAGE)?;
            }
            Long("interval") => {
                let v = cli::utf8(p.value()?, "--interval", USAGE)?;
                cli::millis(&mut interval, "--interval", &v, 10..=5000, USAGE)?;
            }
            _ => return Err(Failure::usage(arg.unexpected().to_string(), USAGE)),
        }
    }
    o.interval = interval.unwrap_or(o.interval);
    Ok(Some(o))
}
