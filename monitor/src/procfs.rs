//! What `/proc/<pid>/status` says of a process, for the daemon's servers: the kernel's word on
//! who it is, never the process's own. Low in the monitor (it imports nothing of it), so the
//! admission socket, the audit and the descriptor scan all read a process the same way.

use gpuslice_ledger::procfs::{status_ids, uids_of};

/// The effective uid of `pid` (the second `Uid:` field), read as bytes by the ledger's
/// `procfs` (a process name that is not UTF-8 hides nothing).
pub fn uid_of(pid: u32) -> Option<u32> {
    uids_of(pid).map(|[_, euid, ..]| euid)
}

/// Whether `pid` is in group `gid`: any of its `Gid:` fields or its supplementary `Groups:`.
pub fn in_group(pid: u32, gid: u32) -> bool {
    let pid = pid.to_string();
    ["Gid", "Groups"]
        .iter()
        .any(|f| status_ids(&pid, f).is_some_and(|ids| ids.contains(&gid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!(uid_of(std::process::id()), Some(uid));
        assert!(in_group(std::process::id(), gid));
        assert_eq!(uid_of(u32::MAX), None);
        assert!(!in_group(u32::MAX, gid));
    }
}
