//! What `/proc/<pid>/status` says of a process, for the daemon's servers: the kernel's word on
//! who it is, never the process's own. Low in the monitor (it imports nothing of it), so the
//! admission socket, the audit and the descriptor scan all read a process the same way.

/// The lines of `/proc/<pid>/status` (`None`: the process is gone or unreadable).
fn status(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// The effective uid of `pid` (the second `Uid:` field).
pub fn uid_of(pid: u32) -> Option<u32> {
    status(pid)?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` is in group `gid`: any of its `Gid:` fields or its supplementary `Groups:`.
pub fn in_group(pid: u32, gid: u32) -> bool {
    status(pid).is_some_and(|s| {
        s.lines().any(|l| {
            (l.starts_with("Groups:") || l.starts_with("Gid:"))
                && l.split_whitespace()
                    .skip(1)
                    .any(|g| g.parse::<u32>() == Ok(gid))
        })
    })
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
