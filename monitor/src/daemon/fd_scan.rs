//! When the descriptor scan (`crate::descriptor_scan`) runs, on a thread of its own, how it
//! backs off, and what the daemon says of the records it keeps.

use super::Monitor;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Monitor {
    /// Node mode: exported allocations only descriptors hold are looked for in every process's
    /// descriptors (`shared.rs`) at most once a second, only while there are any, on a thread
    /// of their own: a `stat` of a tenant's descriptor can block (a FUSE or NFS file), and the
    /// reaper must not wait on it (a blocked scan keeps the records charged, the safe side).
    pub(super) fn scan_descriptors(&mut self, ledger: Option<Arc<gpuslice_ledger::Ledger>>) {
        if self.fd_scan.as_ref().is_some_and(|h| h.is_finished()) {
            match self.fd_scan.take().map(std::thread::JoinHandle::join) {
                Some(Ok((lines, found))) => {
                    lines.iter().for_each(|l| log!("{l}"));
                    if let Some(now) = found.in_flight {
                        self.log_in_flight(ledger.as_deref(), now);
                    }
                    self.fd_scan_every = next_fd_scan_every(self.fd_scan_every, found.only_owners);
                    self.fd_scan_witnesses = found.witnesses;
                }
                Some(Err(_)) => log!("the scan for exported allocations' descriptors failed"),
                None => {}
            }
        }
        let Some(ledger) = ledger.filter(|_| self.node_mode && self.fd_scan.is_none()) else {
            return;
        };
        let held = ledger.descriptor_held();
        if held != self.fd_scan_held {
            self.fd_scan_every = FD_SCAN_MIN;
        }
        // Backed off, the next scan is still due at once when a process that kept a record
        // exits (a check of a few pids, at most once a second).
        let due = self.last_fd_scan.is_none_or(|t| {
            let since = t.elapsed();
            since >= self.fd_scan_every
                || (since >= FD_SCAN_MIN
                    && self
                        .fd_scan_witnesses
                        .iter()
                        .any(|&(pid, start)| !gpuslice_ledger::is_running(pid, start)))
        });
        if !due {
            return;
        }
        if held.is_empty() {
            self.fd_scan_held.clear();
            self.fd_scan_witnesses.clear();
            self.in_flight.clear();
            return;
        }
        self.fd_scan_held = held;
        self.last_fd_scan = Some(Instant::now());
        let scan = move || crate::ledger_window::release_unheld(&ledger);
        match std::thread::Builder::new()
            .name("fd-scan".into())
            .spawn(scan)
        {
            Ok(h) => self.fd_scan = Some(h),
            Err(e) => log!("cannot start the scan for exported allocations' descriptors: {e}"),
        }
    }
}

/// What the descriptor scan's thread returns: its log lines, and what it found.
pub(super) type FdScan = (Vec<String>, crate::descriptor_scan::Unheld);

/// The least wait between descriptor scans.
pub(super) const FD_SCAN_MIN: Duration = Duration::from_secs(1);
/// The most: records a tenant keeps by its processes alone cost a scan of every process's
/// descriptors this often, not every second forever; their release waits this long at most.
const FD_SCAN_MAX: Duration = Duration::from_secs(30);
/// A record kept for its owner's processes is said at most this often (one that flips in and
/// out of that state would say it every scan).
pub(super) const IN_FLIGHT_LOG_EVERY: Duration = Duration::from_secs(600);

/// The wait before the next descriptor scan: doubled, up to [`FD_SCAN_MAX`], after a scan that
/// let nothing go and kept every record only for its owner's processes (only one of those
/// exiting changes that); else [`FD_SCAN_MIN`]. A change in the records brings it back to
/// [`FD_SCAN_MIN`] too (`scan_descriptors`).
pub(super) fn next_fd_scan_every(every: Duration, only_owners: bool) -> Duration {
    if only_owners {
        every.saturating_mul(2).clamp(FD_SCAN_MIN, FD_SCAN_MAX)
    } else {
        FD_SCAN_MIN
    }
}

impl Monitor {
    /// Say when it starts (at most every [`IN_FLIGHT_LOG_EVERY`]) that a record is kept only
    /// because its exporter's uid still has processes in its PID namespace, where its
    /// descriptor may be held unseen: the operator's answer to why an exporter's slice stays
    /// charged with no process holding the memory (docs/security.md).
    fn log_in_flight(
        &mut self,
        ledger: Option<&gpuslice_ledger::Ledger>,
        now: Vec<crate::descriptor_scan::InFlight>,
    ) {
        self.in_flight_said
            .retain(|(_, t)| t.elapsed() < IN_FLIGHT_LOG_EVERY);
        for f in now.iter().filter(|f| !self.in_flight.contains(f)) {
            if self.in_flight_said.iter().any(|(s, _)| s == f) {
                continue;
            }
            self.in_flight_said.push((*f, Instant::now()));
            let what = ledger.and_then(|l| {
                let r = l.shared().get(f.record)?;
                let held = r.held.load(std::sync::atomic::Ordering::SeqCst);
                let account = r.account.load(std::sync::atomic::Ordering::SeqCst);
                let slice = l.slices().get(account as usize)?.name.get();
                Some(format!(
                    " ({} of slice {slice:?})",
                    crate::table::size(held)
                ))
            });
            log!(
                "exported memory{}: no process holds its descriptor, but its exporter's uid {} \
                 still has processes in its PID namespace ({}), which may hold it unseen (in \
                 flight in a unix socket, in an io_uring): kept charged until none is left",
                what.unwrap_or_default(),
                f.owner.uid,
                ns_name(f.owner.pid_ns)
            );
        }
        self.in_flight = now;
    }
}

/// A PID namespace as `/proc/PID/ns/pid` names it (`pid:[INODE]`), for the log.
fn ns_name(ino: u64) -> String {
    match ino {
        0 => "unknown: any".into(),
        ino => format!("pid:[{ino}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #34: records a tenant keeps only by its processes cost a scan of every process's
    /// descriptors at most every 30 s once the waits have doubled up, not every second; any
    /// other outcome brings the wait back to a second.
    #[test]
    fn the_descriptor_scan_backs_off_while_only_owners_keep_records() {
        let mut every = FD_SCAN_MIN;
        let mut waits = vec![];
        for _ in 0..7 {
            every = next_fd_scan_every(every, true);
            waits.push(every.as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(next_fd_scan_every(every, false), FD_SCAN_MIN);
    }
}
