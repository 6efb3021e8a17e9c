//! Node mode: the descriptor scan. A record nobody but descriptors holds (its exporter and
//! importers gone) stays charged to its last exporter's slice while any process on the node
//! holds a descriptor of it, as the driver keeps the memory: [`release_unheld`], run by the
//! reaper's tick and only while such records exist, looks for their identities in
//! `/proc/*/fd`, and keeps what may be held where no scan sees it (docs/architecture/memory.md,
//! "In flight").

use gpuslice_ledger::{Ledger, RemovedSlice, ShareKey};

/// At most this many open descriptors are looked at per scan; a node with more keeps every
/// record charged (the safe side: an overcharge, never memory charged to nobody).
const MAX_SCANNED: usize = 1 << 20;

/// Whose processes may hold a record's descriptor where no scan of `/proc/*/fd` sees it: its
/// exporter's uid, in its exporter's PID namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The exporter's uid.
    pub uid: u32,
    /// The inode of the exporter's PID namespace; 0 if unknown (any namespace matches).
    pub pid_ns: u64,
}

impl Owner {
    /// Root of the monitor's own PID namespace (the host's) is trusted, and its daemons never
    /// all exit: its exports are let go by their descriptors alone. Root of a container's PID
    /// namespace is a tenant like any other.
    fn exempt(&self, host_ns: u64) -> bool {
        self.uid == 0 && host_ns != 0 && self.pid_ns == host_ns
    }

    /// Whether a process of the namespace `chain` (its own, then its ancestors'; `None`:
    /// unknown) is in this owner's namespace or one nested in it.
    fn in_ns(&self, chain: Option<&[u64]>) -> bool {
        self.pid_ns == 0 || chain.is_none_or(|c| c.contains(&self.pid_ns))
    }
}

/// A record no process holds a descriptor of, kept because a process of its [`Owner`] still
/// runs ([`releasable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// The record.
    pub record: usize,
    /// Its descriptor's identity (a record reused for another export is another case).
    pub key: ShareKey,
    /// Its exporter's uid and PID namespace.
    pub owner: Owner,
}

/// What [`release_unheld`] did.
#[derive(Debug, Default)]
pub struct Unheld {
    /// The slices that went with the records let go.
    pub removed: Vec<RemovedSlice>,
    /// A line per record it could not let go of (retried at the next scan).
    pub problems: Vec<String>,
    /// The records kept only for their owners' processes; `None` when no complete scan ran
    /// (nothing to say either way).
    pub in_flight: Option<Vec<InFlight>>,
    /// A complete scan let nothing go and kept every record only for its owner's processes:
    /// only one of those exiting changes that, so the next scans may come less often.
    pub only_owners: bool,
    /// The processes (pid, start time) by which it found the owners present: the next scan is
    /// due as soon as one of them exits, however long the wait.
    pub witnesses: Vec<(u32, u64)>,
}

/// Node mode: let go of the records only descriptors held and of which no process on the node
/// can hold one any more ([`releasable`]: the driver released the memory): their charge goes,
/// with the slice it alone kept. Looks in `/proc/*/fd` only while such records exist.
pub fn release_unheld(ledger: &Ledger) -> Unheld {
    let mut out = Unheld::default();
    let held = ledger.descriptor_held();
    if held.is_empty() {
        return out;
    }
    let host_ns = gpuslice_ledger::procfs::pid_ns_of_pid(std::process::id());
    let owned: Vec<(usize, ShareKey, Option<Owner>)> = held
        .into_iter()
        .map(|(rec, k)| {
            let owner = ledger
                .share_owner(rec)
                .map(|(uid, pid_ns)| Owner { uid, pid_ns });
            (rec, k, owner)
        })
        .collect();
    let keys: Vec<ShareKey> = owned.iter().map(|&(_, k, _)| k).collect();
    let mut waiting: Vec<Owner> = vec![];
    for o in owned.iter().filter_map(|&(_, _, o)| o) {
        if !o.exempt(host_ns) && !waiting.contains(&o) {
            waiting.push(o);
        }
    }
    let Some(scan) = open_keys(&keys, &waiting) else {
        return out;
    };
    for (rec, key) in releasable(&owned, &scan, host_ns) {
        match ledger.share_release_unheld(rec, key) {
            Ok(r) => out.removed.extend(r),
            Err(e) => out
                .problems
                .push(format!("shared allocation record {rec}: {e}")),
        }
    }
    let kept = in_flight(&owned, &scan, host_ns);
    out.only_owners =
        out.removed.is_empty() && out.problems.is_empty() && kept.len() == owned.len();
    out.in_flight = Some(kept);
    out.witnesses = scan.witnesses;
    out
}

/// The records of `held` that [`releasable`] keeps only for their owners' processes (no
/// descriptor open, no unreadable process that may hold one).
fn in_flight(
    held: &[(usize, ShareKey, Option<Owner>)],
    scan: &Scan,
    host_ns: u64,
) -> Vec<InFlight> {
    held.iter()
        .filter_map(|&(record, key, owner)| {
            let owner = owner?;
            let only_owner = !scan.open.contains(&key)
                && !scan.hidden
                && !scan.unreadable.contains(&owner.uid)
                && !owner.exempt(host_ns)
                && scan.present.contains(&owner);
            only_owner.then_some(InFlight { record, key, owner })
        })
        .collect()
}

/// What a scan of `/proc/*/fd` found: the keys some process holds open; the uids of the
/// processes whose descriptors it could not read (real, effective, saved and filesystem uid:
/// any of them may be what it runs as), `hidden` when one's uids could not be told either;
/// and the owners it was asked about that have a process.
struct Scan {
    open: Vec<ShareKey>,
    unreadable: Vec<u32>,
    hidden: bool,
    present: Vec<Owner>,
    /// The processes (pid, start time) that made owners present.
    witnesses: Vec<(u32, u64)>,
}

/// The records of `held` (record, key, owner) that no process can hold a descriptor of, by
/// `scan`:
/// - none holds it open;
/// - no unreadable process of the exporter's uid (it may hold one: a tenant that hides its
///   descriptors keeps only its own exports charged, never everyone's);
/// - no process of its [`Owner`] runs: a descriptor sent with SCM_RIGHTS and not yet received
///   is in a socket's queue, in no `/proc/*/fd` (the kernel shows no queue's descriptors), and
///   so are an io_uring's registered files and a thread's private descriptor table, and a
///   descriptor passed on while the scan runs. Whoever could hold one unseen got it from the
///   exporter's side, so the record stays while its exporter's uid has a process in its PID
///   namespace (docs/security.md, "in flight"); another container of the same uid, or another
///   uid, holds nothing back. Root of the monitor's namespace is exempt ([`Owner::exempt`]).
///
/// A record whose owner is unknown is held back by any of these.
fn releasable(
    held: &[(usize, ShareKey, Option<Owner>)],
    scan: &Scan,
    host_ns: u64,
) -> Vec<(usize, ShareKey)> {
    held.iter()
        .filter(|(_, k, _)| !scan.open.contains(k) && !scan.hidden)
        .filter(|(_, _, owner)| match owner {
            Some(o) if o.exempt(host_ns) => !scan.unreadable.contains(&0),
            Some(o) => !scan.unreadable.contains(&o.uid) && !scan.present.contains(o),
            None => scan.unreadable.is_empty() && scan.present.is_empty(),
        })
        .map(|&(rec, k, _)| (rec, k))
        .collect()
}

/// Which of `keys` an open descriptor of some process (not this one: it closes the descriptors
/// it is sent at once) has, by `stat` of each `/proc/PID/fd/N` (the open file's identity); whose
/// descriptors could not be read (by uid); and which of `waiting` have a process (a process's
/// PID namespace costs a `stat`, and its uids a read of its `status` only where that namespace
/// is a waiting owner's). `None` when the scan is not complete: more than [`MAX_SCANNED`]
/// descriptors. A process whose uids it cannot tell holds back what it may hold, never the
/// whole scan. Stops as soon as every key was found.
fn open_keys(keys: &[ShareKey], waiting: &[Owner]) -> Option<Scan> {
    use std::os::unix::fs::MetadataExt;
    let me = std::process::id();
    let mut scan = Scan {
        open: vec![],
        unreadable: vec![],
        hidden: false,
        present: vec![],
        witnesses: vec![],
    };
    let mut namespaces = Namespaces::default();
    let mut budget = MAX_SCANNED;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        if waiting.iter().any(|o| !scan.present.contains(o))
            && owners_of(pid, waiting, &mut namespaces, &mut scan.present)
        {
            let start = gpuslice_ledger::start_time_of(&pid.to_string());
            scan.witnesses.push((pid, start));
        }
        let fds = match std::fs::read_dir(entry.path().join("fd")) {
            Ok(fds) => fds,
            // Gone meanwhile (or a kernel thread's): it holds nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => {
                match owner_uids(pid) {
                    Some(uids) => add(&mut scan.unreadable, &uids),
                    None if !entry.path().exists() => {}
                    None => scan.hidden = true,
                }
                continue;
            }
        };
        for fd in fds.flatten() {
            budget = budget.checked_sub(1)?;
            // A descriptor closed meanwhile holds nothing any more.
            let Ok(st) = std::fs::metadata(fd.path()) else {
                continue;
            };
            let key = ShareKey {
                dev: st.dev(),
                ino: st.ino(),
            };
            if keys.contains(&key) && !scan.open.contains(&key) {
                scan.open.push(key);
                if scan.open.len() == keys.len() {
                    return Some(scan);
                }
            }
        }
    }
    Some(scan)
}

/// Adds to `present` the owners of `waiting` that process `pid` is one of: in the owner's PID
/// namespace or one nested in it (any tenant may make one, unshare(2), and pass a descriptor
/// into it), running as its uid (any of the four). Its uids are read only where its namespace
/// is a waiting owner's; a process whose namespace or uids cannot be told counts as any owner
/// it may be. A zombie (its namespace gone with its descriptors) or a process gone meanwhile
/// is no one. Whether it added any.
fn owners_of(
    pid: u32,
    waiting: &[Owner],
    namespaces: &mut Namespaces,
    present: &mut Vec<Owner>,
) -> bool {
    let chain = match namespaces.chain_of(pid) {
        Some(c) => Some(c),
        None => match gpuslice_ledger::procfs::stat(&pid.to_string()) {
            None
            | Some(gpuslice_ledger::procfs::Stat {
                state: b'Z' | b'X', ..
            }) => return false,
            Some(_) => None,
        },
    };
    let maybe: Vec<Owner> = waiting
        .iter()
        .filter(|o| o.in_ns(chain) && !present.contains(o))
        .copied()
        .collect();
    if maybe.is_empty() {
        return false;
    }
    let uids = owner_uids(pid);
    if uids.is_none() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return false;
    }
    let before = present.len();
    for o in maybe {
        if uids.as_ref().is_none_or(|u| u.contains(&o.uid)) {
            present.push(o);
        }
    }
    present.len() > before
}

/// The PID namespaces one scan met, each with its ancestors (`NS_GET_PARENT`), so each
/// namespace's chain costs its ioctls once per scan, and each process one `open`.
#[derive(Default)]
struct Namespaces(std::collections::HashMap<u64, Vec<u64>>);

impl Namespaces {
    /// The inode of `pid`'s PID namespace, then of each one above it up to the monitor's (or
    /// the highest it may see); `None` when its namespace cannot be opened.
    fn chain_of(&mut self, pid: u32) -> Option<&[u64]> {
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::File::open(format!("/proc/{pid}/ns/pid")).ok()?;
        let ino = f.metadata().ok()?.ino();
        let chain = self.0.entry(ino).or_insert_with(|| {
            let mut chain = vec![ino];
            let mut ns = f;
            // PID namespaces nest at most 32 deep; the bound only guards the loop.
            for _ in 0..64 {
                // SAFETY: NS_GET_PARENT takes no argument and returns a new descriptor (or -1)
                // for the parent of the namespace `ns` refers to; `ns` is open.
                let parent = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_PARENT) };
                if parent < 0 {
                    break; // the top, or above what the monitor may see
                }
                // SAFETY: a fresh descriptor the kernel just gave this process, owned here.
                ns = unsafe { std::fs::File::from_raw_fd(parent) };
                match ns.metadata() {
                    Ok(m) => chain.push(m.ino()),
                    Err(_) => break,
                }
            }
            chain
        });
        Some(chain.as_slice())
    }
}

/// The uids `pid` may run as: its real, effective, saved and filesystem uids, or, where its
/// `status` cannot be parsed, the owner of `/proc/PID` (its effective uid; root's for a
/// process that is not dumpable, where `status` is root's to read anyway).
fn owner_uids(pid: u32) -> Option<Vec<u32>> {
    use std::os::unix::fs::MetadataExt;
    match gpuslice_ledger::procfs::uids_of(pid) {
        Some(uids) => Some(uids.to_vec()),
        None => Some(vec![std::fs::metadata(format!("/proc/{pid}")).ok()?.uid()]),
    }
}

/// Adds `uids` to the set `to`.
fn add(to: &mut Vec<u32>, uids: &[u32]) {
    for &u in uids {
        if !to.contains(&u) {
            to.push(u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::process::{Command, Stdio};

    /// A descriptor another process holds is found; once that process is gone it is not;
    /// this process's own descriptors never count.
    #[test]
    fn a_descriptor_is_found_only_while_another_process_holds_it() {
        // Anyone else's descriptors are root's to read (the monitor's, in node mode).
        gpuslice_e2e::need_root!();
        // SAFETY: memfd_create with a static name; the descriptor is checked and owned below.
        let fd = unsafe { libc::memfd_create(c"gpuslice-scan-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let key = ShareKey::of_fd(owned.as_raw_fd()).unwrap();
        assert_eq!(
            open_keys(&[key], &[]).map(|s| s.open),
            Some(vec![]),
            "our own descriptor"
        );
        // Not close-on-exec: the child inherits it (and only holds it).
        let mut child = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let other = ShareKey {
            dev: key.dev,
            ino: u64::MAX,
        };
        let t0 = std::time::Instant::now();
        let found = open_keys(&[key, other], &[]).map(|s| s.open);
        eprintln!("a full scan of /proc/*/fd: {:?}", t0.elapsed());
        assert_eq!(found, Some(vec![key]));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            open_keys(&[key], &[]).map(|s| s.open),
            Some(vec![]),
            "its holder is gone"
        );
    }

    const HOST: u64 = 4_026_531_836;
    const POD: u64 = 4_026_532_001;

    fn owner(uid: u32, pid_ns: u64) -> Option<Owner> {
        Some(Owner { uid, pid_ns })
    }

    fn scan(unreadable: Vec<u32>, hidden: bool, present: Vec<Option<Owner>>) -> Scan {
        Scan {
            open: vec![ShareKey { dev: 1, ino: 3 }],
            unreadable,
            hidden,
            present: present.into_iter().flatten().collect(),
            witnesses: vec![],
        }
    }

    /// Issue #34: an unreadable process holds back only the records of exporters of its own
    /// uid; every other record no process holds is let go. One whose uids cannot be told
    /// either holds back every record, never ends the scan.
    #[test]
    fn an_unreadable_process_holds_back_only_its_own_uids_records() {
        let k = |ino| ShareKey { dev: 1, ino };
        let held = [
            (0, k(1), owner(1000, POD)),
            (1, k(2), owner(2000, POD)),
            (2, k(3), owner(2000, POD)),
            (3, k(4), None),
        ];
        let all = scan(vec![], false, vec![]);
        assert_eq!(
            releasable(&held, &all, HOST),
            [(0, k(1)), (1, k(2)), (3, k(4))]
        );
        let hidden = scan(vec![1000], false, vec![]);
        assert_eq!(releasable(&held, &hidden, HOST), [(1, k(2))]);
        assert_eq!(releasable(&held, &scan(vec![], true, vec![]), HOST), []);
    }

    /// Issue #34: a record no descriptor holds stays while its owner (exporter's uid, in its
    /// PID namespace) has a process: never for the same uid in another namespace (another pod
    /// of uid 1000), nor another uid; root of the host's namespace is exempt, root of a pod's
    /// is not.
    #[test]
    fn an_owners_process_holds_back_only_its_owners_records_and_never_host_roots() {
        let k = |ino| ShareKey { dev: 1, ino };
        let held = [
            (0, k(1), owner(1000, POD)),
            (1, k(2), owner(2000, POD)),
            (2, k(4), owner(0, HOST)),
            (3, k(5), owner(0, POD)),
            (4, k(6), None),
        ];
        let other_pod = owner(1000, POD + 1);
        assert_eq!(
            releasable(&held, &scan(vec![], false, vec![other_pod]), HOST),
            [(0, k(1)), (1, k(2)), (2, k(4)), (3, k(5))]
        );
        assert_eq!(
            releasable(&held, &scan(vec![], false, vec![owner(1000, POD)]), HOST),
            [(1, k(2)), (2, k(4)), (3, k(5))]
        );
        assert_eq!(
            releasable(&held, &scan(vec![], false, vec![owner(0, POD)]), HOST),
            [(0, k(1)), (1, k(2)), (2, k(4))]
        );
        // What the monitor says it keeps for its owner's processes: those records only.
        let both = scan(vec![], false, vec![owner(1000, POD), owner(0, POD)]);
        let kept = in_flight(&held, &both, HOST);
        assert_eq!(
            kept.iter().map(|f| f.record).collect::<Vec<_>>(),
            [0, 3],
            "{kept:?}"
        );
        assert_eq!(kept[0].owner, owner(1000, POD).unwrap());
    }

    /// The scan finds an owner's processes: of its uid (any of the four), in its PID
    /// namespace or one nested in it, never in another; a process named with bytes that are not
    /// UTF-8 (PR_SET_NAME) is told by its uids all the same, and ends no scan.
    #[test]
    fn the_scan_finds_an_owners_processes_in_its_namespace_only() {
        use std::os::unix::fs::MetadataExt;
        gpuslice_e2e::need_root!();
        // `own_ns`: in a PID namespace of its own (`unshare` stays outside, its child inside).
        let spawn = |uid: u32, own_ns: bool, script: &str| {
            let mut c = Command::new(if own_ns { "unshare" } else { "setpriv" });
            if own_ns {
                c.args(["--pid", "--fork", "setpriv"]);
            }
            c.args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
            ])
            // The system's interpreter: one any user may run (not a root-only shim).
            .args(["--", "/usr/bin/python3", "-c", script])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
            // SAFETY: close_range(2) only, async-signal-safe, in the child before exec: it
            // must not keep the descriptors another test's thread left inheritable meanwhile
            // (that test checks that nobody holds its own once its child is gone).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut c, || {
                    libc::syscall(
                        libc::SYS_close_range,
                        3u32,
                        u32::MAX,
                        libc::CLOSE_RANGE_CLOEXEC,
                    );
                    Ok(())
                })
            };
            let mut c = c.spawn().unwrap();
            let mut b = [0u8; 1];
            std::io::Read::read_exact(c.stdout.as_mut().unwrap(), &mut b).unwrap();
            let ns = if own_ns { "pid_for_children" } else { "pid" };
            let ns = std::fs::metadata(format!("/proc/{}/ns/{ns}", c.id()))
                .unwrap()
                .ino();
            (c, ns)
        };
        let wait = "import sys; print(1, flush=True); sys.stdin.read()";
        let renamed =
            "import ctypes, sys; ctypes.CDLL(None).prctl(15, b'gs\\xff\\xfe)', 0, 0, 0); \
                       print(1, flush=True); sys.stdin.read()";
        let (a, b, c) = (47_099, 47_098, 47_097);
        let (host_proc, host) = spawn(a, false, renamed);
        let (pod_proc, pod) = spawn(b, true, wait);
        let (other_proc, other) = spawn(c, true, wait);
        assert_eq!(
            host,
            gpuslice_ledger::procfs::pid_ns_of_pid(std::process::id())
        );
        assert!(pod != host && other != host && pod != other);
        let never = [ShareKey { dev: 0, ino: 0 }];
        let found = |uid, pid_ns| {
            let o = Owner { uid, pid_ns };
            let scan = open_keys(&never, &[o]).expect("a complete scan");
            assert_eq!(scan.present.is_empty(), scan.witnesses.is_empty());
            scan.present == [o]
        };
        assert!(found(a, host), "the renamed process");
        assert!(found(b, pod));
        assert!(found(b, host), "in a namespace nested in the owner's");
        assert!(found(c, other));
        assert!(!found(a, pod), "its uid, in another namespace");
        assert!(!found(b, other), "its uid, in another pod's namespace");
        assert!(!found(47_096, host), "nobody's");
        for mut c in [host_proc, pod_proc, other_proc] {
            drop(c.stdin.take());
            c.wait().unwrap();
        }
    }
}
