//! Node mode: exported VMM allocations, for the processes that ask over `monitor.sock`
//! (`gpuslice_ledger`'s `shared.rs` keeps the records; docs/architecture.md, "Memory shared
//! between processes").
//!
//! A tenant cannot write the policy, so its shim asks here ([`gpuslice_protocol`]'s requests):
//! `ShareExport` (with the exported POSIX descriptor), `ShareImport` (with the descriptor it
//! imports: an orphan's importer is charged here, in its slice's region, before its driver
//! call), `ShareLeave` and `ShareLetGo` (a record index). Who asks is the monitor's record of the connected process
//! (`SO_PEERCRED`, its start time); the allocation's identity is what the monitor itself reads
//! from the descriptor (`fstat`), which it closes at once (holding it would keep the memory
//! alive). So a process can only export on its own account, import what it holds a
//! descriptor of, and leave or let go of its own part; what it says is the size only, which
//! is clamped to what it was charged.
//!
//! A record nobody but descriptors holds (its exporter and importers gone) stays charged to
//! its last exporter's slice while any process on the node holds a descriptor of it, as the
//! driver keeps the memory: [`release_unheld`], run by the reaper's tick at most once a second
//! and only while such records exist, looks for their identities in `/proc/*/fd`.

use crate::error::RequestError;
use gpuslice_ledger::{Import, Ledger, LetGo, ProcHandle, RemovedSlice, ShareKey};
use gpuslice_protocol::{self as protocol, Exported, Imported, Left, ShareExport};
use std::os::fd::{AsRawFd, OwnedFd};

/// The allocation's identity, read from the descriptor that came with the request.
fn key(fds: &[OwnedFd]) -> Result<ShareKey, RequestError> {
    let fd = fds.first().ok_or(RequestError::NoDescriptor)?;
    ShareKey::of_fd(fd.as_raw_fd()).ok_or(RequestError::NoDescriptor)
}

/// `share-export` of the admitted process `me`, with the exported descriptor.
pub fn export(
    ledger: &Ledger,
    me: ProcHandle,
    r: &ShareExport,
    fds: &[OwnedFd],
) -> Result<Exported, RequestError> {
    let dev = ledger
        .find_device(&r.device)
        .ok_or_else(|| RequestError::UnknownDevice(r.device.clone()))?;
    Ok(Exported {
        record: ledger.share_export(me, dev, key(fds)?, r.bytes)?,
    })
}

/// `share-import` of the admitted process `me`, with the descriptor it imports.
pub fn import(ledger: &Ledger, me: ProcHandle, fds: &[OwnedFd]) -> Result<Imported, RequestError> {
    Ok(match ledger.share_import(me, key(fds)?)? {
        Import::Held(rec) => Imported::Held(rec),
        Import::Adopted { rec, dev, bytes } => Imported::Adopted { rec, dev, bytes },
        Import::Refused { dev, bytes } => Imported::Refused { dev, bytes },
        Import::Charge { dev, bytes } => Imported::Charge { dev, bytes },
        Import::Unknown => Imported::Unknown,
    })
}

/// `share-leave` of the admitted process `me`.
pub fn leave(
    ledger: &Ledger,
    me: ProcHandle,
    r: &protocol::ShareLeave,
) -> Result<Left, RequestError> {
    ledger.share_leave(me, r.record)?;
    Ok(Left)
}

/// `share-let-go` of the admitted process `me`.
pub fn let_go(
    ledger: &Ledger,
    me: ProcHandle,
    r: &protocol::ShareLetGo,
) -> Result<protocol::LetGo, RequestError> {
    Ok(match ledger.share_let_go(me, r.record)? {
        LetGo::HandedOver => protocol::LetGo::HandedOver,
        LetGo::Uncharge => protocol::LetGo::Uncharge,
        LetGo::Keep => protocol::LetGo::Keep,
    })
}

/// At most this many open descriptors are looked at per scan; a node with more keeps every
/// record charged (the safe side: an overcharge, never memory charged to nobody).
const MAX_SCANNED: usize = 1 << 20;

/// A record no process holds a descriptor of, kept because a process of its exporter's uid
/// holds a unix socket, where the descriptor may be in flight ([`releasable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// The record.
    pub record: usize,
    /// Its descriptor's identity (a record reused for another export is another case).
    pub key: ShareKey,
    /// Its exporter's uid.
    pub uid: u32,
}

/// What [`release_unheld`] did.
#[derive(Debug, Default)]
pub struct Unheld {
    /// The slices that went with the records let go.
    pub removed: Vec<RemovedSlice>,
    /// A line per record it could not let go of (retried at the next scan).
    pub problems: Vec<String>,
    /// The records kept only for a descriptor that may be in flight; `None` when no complete
    /// scan ran (nothing to say either way).
    pub in_flight: Option<Vec<InFlight>>,
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
    let keys: Vec<ShareKey> = held.iter().map(|&(_, k)| k).collect();
    let Some(scan) = open_keys(&keys) else {
        return out;
    };
    let owned: Vec<(usize, ShareKey, Option<u32>)> = held
        .into_iter()
        .map(|(rec, k)| (rec, k, ledger.share_uid(rec)))
        .collect();
    for (rec, key) in releasable(&owned, &scan) {
        match ledger.share_release_unheld(rec, key) {
            Ok(r) => out.removed.extend(r),
            Err(e) => out
                .problems
                .push(format!("shared allocation record {rec}: {e}")),
        }
    }
    out.in_flight = Some(in_flight(&owned, &scan));
    out
}

/// The records of `held` that [`releasable`] keeps only for the unix sockets of their
/// exporter's uid (no descriptor open, no unreadable process of that uid).
fn in_flight(held: &[(usize, ShareKey, Option<u32>)], scan: &Scan) -> Vec<InFlight> {
    held.iter()
        .filter_map(|&(record, key, uid)| {
            let uid = uid?;
            let only_sockets = !scan.open.contains(&key)
                && !scan.unreadable.contains(&uid)
                && uid != 0
                && (scan.sockets.contains(&uid) || scan.anyone);
            only_sockets.then_some(InFlight { record, key, uid })
        })
        .collect()
}

/// What a scan of `/proc/*/fd` found: the keys some process holds open, the uids of the
/// processes whose descriptors it could not read, and the uids of the processes holding a unix
/// socket (real, effective, saved and filesystem uid: any of them may be what it runs as);
/// `anyone` when a process holding a unix socket ran as uids it could not tell, `hidden` when
/// one whose descriptors it could not read did (either may be any uid's).
struct Scan {
    open: Vec<ShareKey>,
    unreadable: Vec<u32>,
    sockets: Vec<u32>,
    anyone: bool,
    hidden: bool,
}

/// The records of `held` (record, key, exporter's uid) that no process can hold a descriptor
/// of, by `scan`:
/// - none holds it open;
/// - no unreadable process of the exporter's uid (it may hold one: a tenant that hides its
///   descriptors keeps only its own exports charged, never everyone's);
/// - no process of the exporter's uid holds a unix socket: a descriptor sent with SCM_RIGHTS
///   and not yet received is in the receiving socket's queue, in no `/proc/*/fd`, and the
///   kernel shows no socket's queued descriptors (docs/security.md, "in flight"). Root's
///   exports are exempt (root is trusted, and its daemons always hold unix sockets).
///
/// A record whose exporter's uid is unknown is held back by any of these.
fn releasable(held: &[(usize, ShareKey, Option<u32>)], scan: &Scan) -> Vec<(usize, ShareKey)> {
    held.iter()
        .filter(|(_, k, _)| !scan.open.contains(k) && !scan.hidden)
        .filter(|(_, _, uid)| match uid {
            Some(0) => !scan.unreadable.contains(&0),
            Some(u) => !scan.anyone && !scan.unreadable.contains(u) && !scan.sockets.contains(u),
            None => {
                !scan.anyone && scan.unreadable.is_empty() && scan.sockets.iter().all(|&u| u == 0)
            }
        })
        .map(|&(rec, k, _)| (rec, k))
        .collect()
}

/// Which of `keys` an open descriptor of some process (not this one: it closes the descriptors
/// it is sent at once) has, by `stat` of each `/proc/PID/fd/N` (the open file's identity); whose
/// descriptors could not be read (by uid); and who holds a unix socket (by uid: a process's
/// first unix socket costs a read of its `status`, and its other sockets nothing). `None` when
/// the scan is not complete: more than [`MAX_SCANNED`] descriptors. A process whose uids it
/// cannot tell holds back what it may hold ([`Scan`]), never the whole scan. Stops as soon as
/// every key was found.
fn open_keys(keys: &[ShareKey]) -> Option<Scan> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let me = std::process::id();
    let mut scan = Scan {
        open: vec![],
        unreadable: vec![],
        sockets: vec![],
        anyone: false,
        hidden: false,
    };
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
        let mut has_unix_socket = false;
        for fd in fds.flatten() {
            budget = budget.checked_sub(1)?;
            // A descriptor closed meanwhile holds nothing any more.
            let Ok(st) = std::fs::metadata(fd.path()) else {
                continue;
            };
            if !has_unix_socket && st.file_type().is_socket() && is_unix_socket(&fd.path()) {
                has_unix_socket = true;
                // A process gone meanwhile holds nothing; one whose uids cannot be told may
                // be anyone's (every record but root's is held back, the scan goes on).
                match owner_uids(pid) {
                    Some(uids) => add(&mut scan.sockets, &uids),
                    None if !entry.path().exists() => {}
                    None => scan.anyone = true,
                }
            }
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

/// Whether the socket open as `path` (a `/proc/PID/fd/N`) is a unix socket, by its protocol's
/// name (`system.sockprotoname`: "UNIX", "UNIX-STREAM", "TCP", ...). One that cannot be told is
/// taken for one (the safe side: a record is kept longer, never let go early).
fn is_unix_socket(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(p) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    let mut name = [0u8; 32];
    // SAFETY: both strings are NUL-terminated and live across the call; the kernel writes at
    // most `name.len()` bytes into `name` and returns how many.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            c"system.sockprotoname".as_ptr(),
            name.as_mut_ptr().cast(),
            name.len(),
        )
    };
    match usize::try_from(n) {
        Ok(n) => name.get(..n).is_none_or(|v| v.starts_with(b"UNIX")),
        Err(_) => true,
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
    use std::os::fd::FromRawFd;
    use std::process::{Command, Stdio};

    /// A descriptor another process holds is found; once that process is gone it is not;
    /// this process's own descriptors never count.
    #[test]
    fn a_descriptor_is_found_only_while_another_process_holds_it() {
        // Anyone else's descriptors are root's to read (the monitor's, in node mode).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to read every process's descriptors");
            return;
        }
        // SAFETY: memfd_create with a static name; the descriptor is checked and owned below.
        let fd = unsafe { libc::memfd_create(c"gpuslice-scan-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let key = ShareKey::of_fd(owned.as_raw_fd()).unwrap();
        assert_eq!(
            open_keys(&[key]).map(|s| s.open),
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
        let found = open_keys(&[key, other]).map(|s| s.open);
        eprintln!("a full scan of /proc/*/fd: {:?}", t0.elapsed());
        assert_eq!(found, Some(vec![key]));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            open_keys(&[key]).map(|s| s.open),
            Some(vec![]),
            "its holder is gone"
        );
    }

    /// Issue #34: an unreadable process holds back only the records of exporters of its own
    /// uid; every other record no process holds is let go.
    #[test]
    fn an_unreadable_process_holds_back_only_its_own_uids_records() {
        let k = |ino| ShareKey { dev: 1, ino };
        let held = [
            (0, k(1), Some(1000)),
            (1, k(2), Some(2000)),
            (2, k(3), Some(2000)),
            (3, k(4), None),
        ];
        let all = Scan {
            open: vec![k(3)],
            unreadable: vec![],
            sockets: vec![],
            anyone: false,
            hidden: false,
        };
        assert_eq!(releasable(&held, &all), [(0, k(1)), (1, k(2)), (3, k(4))]);
        let hidden = Scan {
            open: vec![k(3)],
            unreadable: vec![1000],
            sockets: vec![],
            anyone: false,
            hidden: false,
        };
        assert_eq!(releasable(&held, &hidden), [(1, k(2))]);
    }

    /// Issue #34: a descriptor may be in flight in a unix socket: a process of the exporter's
    /// uid holding one holds back that uid's records (and those of an unknown exporter), never
    /// another uid's; root's exports are let go whatever root's processes hold.
    #[test]
    fn a_unix_socket_holds_back_only_its_own_uids_records_and_never_roots() {
        let k = |ino| ShareKey { dev: 1, ino };
        let held = [
            (0, k(1), Some(1000)),
            (1, k(2), Some(2000)),
            (2, k(3), Some(0)),
            (3, k(4), None),
        ];
        let scan = |sockets| Scan {
            open: vec![],
            unreadable: vec![],
            sockets,
            anyone: false,
            hidden: false,
        };
        assert_eq!(releasable(&held, &scan(vec![1000])), [(1, k(2)), (2, k(3))]);
        assert_eq!(
            releasable(&held, &scan(vec![0])),
            [(0, k(1)), (1, k(2)), (2, k(3)), (3, k(4))]
        );
        // What the monitor says it keeps for a descriptor in flight: uid 1000's record only.
        let kept = in_flight(&held, &scan(vec![1000, 0]));
        assert_eq!(
            kept,
            [InFlight {
                record: 0,
                key: k(1),
                uid: 1000
            }]
        );
    }

    /// Issue #34: a process whose uids cannot be told holds back what it may hold, never the
    /// whole scan: holding a unix socket, every record but root's; hiding its descriptors,
    /// every record.
    #[test]
    fn a_process_of_unknown_uid_holds_back_only_what_it_may_hold() {
        let k = |ino| ShareKey { dev: 1, ino };
        let held = [(0, k(1), Some(1000)), (1, k(2), Some(0)), (2, k(3), None)];
        let scan = |anyone, hidden| Scan {
            open: vec![],
            unreadable: vec![],
            sockets: vec![],
            anyone,
            hidden,
        };
        assert_eq!(releasable(&held, &scan(true, false)), [(1, k(2))]);
        assert_eq!(releasable(&held, &scan(false, true)), []);
    }

    /// The scan sees who holds a unix socket (by every uid of the process), and not a process
    /// that holds only other sockets.
    #[test]
    fn the_scan_finds_the_holders_of_unix_sockets() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to read every process's descriptors");
            return;
        }
        let uid = 47_099;
        let spawn = |uid: u32, script: &str| {
            let mut c = Command::new("setpriv");
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
            c.spawn().unwrap()
        };
        let never = [ShareKey { dev: 0, ino: 0 }];
        let ready = |c: &mut std::process::Child| {
            let mut b = [0u8; 1];
            std::io::Read::read_exact(c.stdout.as_mut().unwrap(), &mut b).unwrap();
        };
        // A TCP socket carries no descriptors: it holds nothing back.
        let mut plain = spawn(
            uid,
            "import socket, sys; s = socket.socket(); print(1, flush=True); sys.stdin.read()",
        );
        ready(&mut plain);
        let scan = open_keys(&never).unwrap();
        assert!(!scan.sockets.contains(&uid), "{:?}", scan.sockets);
        let mut sockets = spawn(
            uid,
            "import socket, sys; a, b = socket.socketpair(); print(1, flush=True); sys.stdin.read()",
        );
        ready(&mut sockets);
        let scan = open_keys(&never).unwrap();
        assert!(scan.sockets.contains(&uid), "{:?}", scan.sockets);
        // A holder named with bytes that are not UTF-8 (PR_SET_NAME, 15) is still told by its
        // uids, and ends no scan.
        let renamed_uid = 47_098;
        let mut renamed = spawn(
            renamed_uid,
            "import ctypes, socket, sys; ctypes.CDLL(None).prctl(15, b'gs\\xff\\xfe)', 0, 0, 0); \
             a, b = socket.socketpair(); print(1, flush=True); sys.stdin.read()",
        );
        ready(&mut renamed);
        let scan = open_keys(&never).expect("a complete scan beside a renamed process");
        assert!(scan.sockets.contains(&renamed_uid), "{:?}", scan.sockets);
        assert!(!scan.anyone);
        for mut c in [plain, sockets, renamed] {
            drop(c.stdin.take());
            c.wait().unwrap();
        }
    }
}
