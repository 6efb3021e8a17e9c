//! `/proc/PID/stat` and `/proc/PID/status`, read as bytes: the kernel writes a process's name
//! (`comm`, which any process sets with `prctl(PR_SET_NAME)`) into both without escaping its
//! bytes of 0x80 and above, so a process could otherwise make itself unreadable as UTF-8 and
//! look gone to whoever judges it (a reaper, a descriptor scan). Every reader of these files
//! goes through here, and so do the PID-namespace readings (`/proc/PID/ns/pid`, `NSpid`) that
//! tell which process a record names from another namespace.

/// What the node needs of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `D`, `T`, `t`, `Z`, `X`, ...
    pub state: u8,
    /// Field 4: the parent's pid (in the reader's namespace).
    pub ppid: u32,
    /// Field 22: the start time, in clock ticks since boot.
    pub start_time: u64,
}

/// `/proc/<pid>/stat` (`pid` may be `self`); `None` when it cannot be read (gone) or parsed.
pub fn stat(pid: &str) -> Option<Stat> {
    parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a `stat` file. The name (field 2) may hold anything, spaces and ')' included: the
/// fields are counted from after its LAST ')'.
pub fn parse_stat(s: &[u8]) -> Option<Stat> {
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(s.get(close + 1..)?).ok()?;
    let mut f = rest.split_ascii_whitespace();
    let state = *f.next()?.as_bytes().first()?;
    let ppid = f.next()?.parse().ok()?;
    let start_time = f.nth(17)?.parse().ok()?;
    Some(Stat {
        state,
        ppid,
        start_time,
    })
}

/// The numbers of the line `field` (`"Uid"`, `"Gid"`, `"Groups"`, `"NSpid"`) of
/// `/proc/<pid>/status`; `None` when the file cannot be read or the line parsed.
pub fn status_ids(pid: &str, field: &str) -> Option<Vec<u32>> {
    parse_status_ids(&std::fs::read(format!("/proc/{pid}/status")).ok()?, field)
}

/// Parses the line `field` of a `status` file. Only that line need be text: the `Name:` line
/// (escaped for newlines, not for bytes >= 0x80) is never looked at.
pub fn parse_status_ids(s: &[u8], field: &str) -> Option<Vec<u32>> {
    let line = s.split(|&b| b == b'\n').find_map(|l| {
        l.strip_prefix(field.as_bytes())
            .and_then(|l| l.strip_prefix(b":"))
    })?;
    std::str::from_utf8(line)
        .ok()?
        .split_ascii_whitespace()
        .map(|x| x.parse().ok())
        .collect()
}

/// The real, effective, saved and filesystem uids of `pid` (`Uid:` of its `status`).
pub fn uids_of(pid: u32) -> Option<[u32; 4]> {
    status_ids(&pid.to_string(), "Uid")?.try_into().ok()
}

/// This process's PID-namespace identity, as [`crate::Ledger::attach`] records it: the inode of
/// `/proc/self/ns/pid` (0 if unknown) and the first `NSpid` entry of `/proc/self/status` (the
/// pid in the namespace of our `/proc` mount; our own pid when that cannot be read).
pub fn own_pid_identity() -> (u64, u32) {
    let ns = pid_ns_of("self").unwrap_or(0);
    let outer = ns_pids("self")
        .and_then(|v| v.first().copied())
        .unwrap_or_else(std::process::id);
    (ns, outer)
}

/// Inode of the PID namespace of `pid` (this namespace's), 0 when unknown.
pub fn pid_ns_of_pid(pid: u32) -> u64 {
    pid_ns_of(&pid.to_string()).unwrap_or(0)
}

pub(crate) fn pid_ns_of(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// The `NSpid` entries of `/proc/<pid>/status`, outermost (the `/proc` mount's namespace) first.
pub(crate) fn ns_pids(pid: &str) -> Option<Vec<u32>> {
    status_ids(pid, "NSpid")
}

/// The pid `pid` (of this process's `/proc`) has in its own PID namespace: the last `NSpid`
/// entry of `/proc/<pid>/status`; `None` when that cannot be read.
pub fn innermost_pid_of(pid: u32) -> Option<u32> {
    ns_pids(&pid.to_string())?.last().copied()
}

/// The inode of the initial PID namespace (Linux's `PROC_PID_INIT_INO`): pids there are the
/// ones the GPU driver and NVML know.
pub const INITIAL_PID_NS: u64 = 0xEFFF_FFFC;

#[cfg(test)]
mod tests {
    use super::*;

    /// A name with bytes >= 0x80, spaces and parentheses (all a process may set) does not
    /// hide its state, parent or start time.
    #[test]
    fn a_stat_parses_whatever_the_name() {
        let mut s = b"4242 (".to_vec();
        s.extend_from_slice(b"\xff\xfe) R 1 (x\x80");
        s.extend_from_slice(b") S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 ");
        s.extend_from_slice(b"1 2 3\n");
        assert_eq!(
            parse_stat(&s),
            Some(Stat {
                state: b'S',
                ppid: 17,
                start_time: 98765
            })
        );
        assert_eq!(parse_stat(b"4242 (x) S 1"), None, "truncated");
    }

    /// The `Uid:` line is read whatever the `Name:` line holds; a line only starting like
    /// another field's name is not taken for it.
    #[test]
    fn a_status_line_parses_whatever_the_name() {
        let s = b"Name:\t\xff\xfeUid:\t7\nUidx:\t9\nUid:\t1000\t1001\t1002\t1003\nGroups:\t\n";
        assert_eq!(
            parse_status_ids(s, "Uid"),
            Some(vec![1000, 1001, 1002, 1003])
        );
        assert_eq!(parse_status_ids(s, "Groups"), Some(vec![]));
        assert_eq!(parse_status_ids(s, "Gid"), None);
        assert_eq!(parse_status_ids(b"Uid:\t1 x\n", "Uid"), None);
    }
}
