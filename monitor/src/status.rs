//! `gpuslice status [--json]`: the node once — devices, slices, processes — as tables for
//! people or as the contract's JSON object.

use crate::cli::{self, Failure};
use crate::ledger_window::LedgerWindow;
use crate::view::NodeView;
use std::ffi::OsString;
use std::path::Path;

const USAGE: &cli::Command = &crate::commands::STATUS;

/// Entry point of `gpuslice status`.
pub fn main(args: Vec<OsString>) -> i32 {
    cli::exit_status((|| {
        let json = cli::json_flag(args, USAGE)?;
        let dir = cli::runtime_dir();
        let snap = load(&dir)?;
        if json {
            return cli::outln!("{}", snap.to_json());
        }
        cli::outln!("{}\n", header(&dir))?;
        for line in crate::table::render(&snap) {
            cli::outln!("{line}")?;
        }
        Ok(())
    })())
}

/// The node's snapshot; an absent ledger is a node where nothing has run yet, a broken one
/// is an error naming the file and what is wrong with it. The GPUs NVML lists are in it
/// either way, whether or not a monitor or a process has registered them.
pub fn load(dir: &Path) -> Result<NodeView, Failure> {
    let mut view = match LedgerWindow::open(dir) {
        Ok(node) => node.snapshot(),
        Err(e) if LedgerWindow::is_missing(&e) => NodeView::default(),
        Err(e) => return Err(e.into()),
    };
    crate::nvml::add_unregistered(&mut view);
    Ok(view)
}

/// `gpuslice 0.1.0 · ledger /dev/shm/gpuslice · monitor running (pid 42)`.
pub fn header(dir: &Path) -> String {
    let monitor = match crate::daemon::monitor_running(dir) {
        Some(pid) => format!("monitor running (pid {pid})"),
        None => "monitor not running (start it: gpuslice monitor)".to_string(),
    };
    format!(
        "gpuslice {} · ledger {} · {monitor}",
        env!("CARGO_PKG_VERSION"),
        dir.display()
    )
}
