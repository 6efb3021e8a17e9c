//! `/proc` read as the reaper and the audit read it, from a process that renamed itself.

use gpuslice_ledger::procfs;

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
            gpuslice_ledger::live_start_time_of(&task),
            0,
            "a renamed thread looks gone"
        );
        let st = procfs::stat(&task).expect("stat of a renamed thread");
        assert_eq!(st.ppid, procfs::stat("self").unwrap().ppid);
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(procfs::uids_of(tid as u32).map(|u| u[0]), Some(uid));
    })
    .join()
    .unwrap();
}
