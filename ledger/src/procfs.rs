//! `/proc/PID/stat` and `/proc/PID/status`, read as bytes: the kernel writes a process's name
//! (`comm`, which any process sets with `prctl(PR_SET_NAME)`) into both without escaping its
//! bytes of 0x80 and above, so a process could otherwise make itself unreadable as UTF-8 and
//! look gone to whoever judges it (a reaper, a descriptor scan). Every reader of these files
//! goes through here.

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

    /// This process, renamed to bytes that are not UTF-8 (as any tenant may rename itself),
    /// is still read: its start time and its uids.
    #[test]
    fn a_process_renamed_to_non_utf8_is_still_read() {
        // A thread of its own: renaming it renames no other test's thread.
        std::thread::spawn(|| {
            // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
            let r = unsafe { libc::prctl(libc::PR_SET_NAME, c"gs\xff\xfe)x".as_ptr()) };
            assert_eq!(r, 0);
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let task = format!("self/task/{tid}");
            let comm = std::fs::read(format!("/proc/{task}/comm")).unwrap();
            assert!(std::str::from_utf8(&comm).is_err(), "the name took");
            // The reaper's question: a renamed process must not look gone.
            assert_ne!(
                crate::live_start_time_of(&task),
                0,
                "a renamed thread looks gone"
            );
            let st = stat(&task).expect("stat of a renamed thread");
            assert_eq!(st.ppid, stat("self").unwrap().ppid);
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            assert_eq!(uids_of(tid as u32).map(|u| u[0]), Some(uid));
        })
        .join()
        .unwrap();
    }
}
