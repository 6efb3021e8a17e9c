//! `gpuslice metrics`: the Prometheus exposition of the node, once, on stdout (for a textfile
//! collector or a quick look; the monitor serves the same at `/metrics`).

use crate::cli::{self, Failure};
use std::ffi::OsString;

const USAGE: &cli::Command = &crate::commands::METRICS;

/// Entry point of `gpuslice metrics`.
pub fn main(args: Vec<OsString>) -> i32 {
    cli::exit_status((|| {
        if let Some(arg) = cli::Args::new(args, USAGE).next()? {
            return Err(Failure::usage(arg.unexpected().to_string(), USAGE));
        }
        let snap = crate::status::load(&cli::runtime_dir())?;
        // The exposition ends with a newline of its own.
        let text = crate::prom::render(&snap, None);
        cli::outln!("{}", text.strip_suffix('\n').unwrap_or(&text))
    })())
}
