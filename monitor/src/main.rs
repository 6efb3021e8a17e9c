//! `gpuslice`: the node monitor daemon and the operator's command line.
//!
//! `main` only dispatches: each subcommand lives in its own module and takes its arguments as
//! `Vec<OsString>` (everything after the subcommand's name), returning an exit status.
//!
//! - [`daemon`]: `gpuslice monitor`, the node daemon (reaping, NVML audit, metrics server), and
//!   the monitor lock other commands use to find or start it.
//! - [`status`], [`top`], [`slice`](mod@slice), [`metrics`]: the operator's views and controls; all read
//!   one [`view::NodeView`] of the ledger, rendered by [`table`] (people), [`view`] (JSON) or
//!   [`prom`] (Prometheus text, served by [`http`]).
//! - [`ledger_window`]: the CLI's window on a ledger: the views, `slice`, `run` and `cdi` open,
//!   read and change a ledger only through it (they use the ledger crate's types and helpers,
//!   `SliceChange`, `Secret`, `human_bytes`); [`compute`] reads the scheduler's figures for it.
//!   The node daemon's servers ([`admission`], [`balloon`], [`shared`], [`descriptor_scan`], [`turns`], the audit)
//!   and the slice regions they share ([`regions`]) work on the node's policy directly: the monitor is its one writer, and `gpuslice-ledger`
//!   owns every mutation; [`nvml`] loads NVML at run
//!   time for device names, NVML indices and the memory audit; [`procfs`] reads who a process
//!   is (uid, groups) from `/proc`.
//! - [`turns`]: node mode's compute turns, granted by the monitor (a thread of the daemon).
//! - [`run`] and [`cdi`]: `gpuslice run` and `gpuslice cdi` (wrapping a program, containers).
//! - [`cli`]: what every subcommand shares: exit statuses, usage errors, the runtime directory;
//!   [`commands`]: every subcommand and flag, defined once (help, usage lines, accepted flags).
//!
//! Exit status (contract): 0 on success, 2 on bad usage (with a usage line), 1 on other errors.

mod admission;
mod balloon;
mod cdi;
mod cli;
mod commands;
mod compute;
mod daemon;
mod descriptor_scan;
mod error;
#[cfg(test)]
mod fuzz;
mod http;
mod ledger_window;
mod metrics;
mod nvml;
#[cfg(test)]
mod parsers;
mod physical;
mod procfs;
mod prom;
mod regions;
mod run;
mod shared;
mod slice;
mod status;
mod table;
mod top;
mod turns;
mod view;

use std::ffi::OsString;

fn main() {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.is_empty() {
        eprintln!("gpuslice: missing command\n{}", commands::overview());
        std::process::exit(cli::EXIT_USAGE);
    }
    let cmd = args.remove(0);
    let code = match cmd.to_str() {
        Some("run") => run::main(args),
        Some("cdi") => cdi::main(args),
        Some("monitor") => daemon::main(args),
        Some("status") => status::main(args),
        Some("top") => top::main(args),
        Some("slice") => slice::main(args),
        Some("metrics") => metrics::main(args),
        Some("version" | "--version" | "-V") => cli::exit_status((|| {
            // `--help` is answered, any other argument is bad usage.
            if let Some(arg) = cli::Args::new(args, &commands::VERSION).next()? {
                return Err(cli::Failure::usage(
                    format!("version takes no arguments: {}", arg.unexpected()),
                    &commands::VERSION,
                ));
            }
            cli::outln!("gpuslice {}", env!("CARGO_PKG_VERSION"))
        })()),
        Some("help" | "--help" | "-h") => cli::exit_status(cli::outln!("{}", commands::overview())),
        _ => {
            eprintln!(
                "gpuslice: unknown command {:?}\n{}",
                cmd,
                commands::overview()
            );
            cli::EXIT_USAGE
        }
    };
    std::process::exit(code);
}
