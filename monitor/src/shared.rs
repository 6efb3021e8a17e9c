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

/// Node mode: let go of the records only descriptors held and of which no process on the node
/// holds one any more (the driver released the memory): their charge goes, with the slice it
/// alone kept. Looks in `/proc/*/fd` only while such records exist; the removed slices, and
/// a line per record it could not let go of (retried at the next scan).
pub fn release_unheld(ledger: &Ledger) -> (Vec<RemovedSlice>, Vec<String>) {
    let (mut removed, mut problems) = (vec![], vec![]);
    let held = ledger.descriptor_held();
    if held.is_empty() {
        return (removed, problems);
    }
    let keys: Vec<ShareKey> = held.iter().map(|&(_, k)| k).collect();
    let Some(scan) = open_keys(&keys) else {
        return (removed, problems);
    };
    let owned: Vec<(usize, ShareKey, Option<u32>)> = held
        .into_iter()
        .map(|(rec, k)| (rec, k, ledger.share_uid(rec)))
        .collect();
    for (rec, key) in releasable(&owned, &scan) {
        match ledger.share_release_unheld(rec, key) {
            Ok(r) => removed.extend(r),
            Err(e) => problems.push(format!("shared allocation record {rec}: {e}")),
        }
    }
    (removed, problems)
}

/// What a scan of `/proc/*/fd` found: the keys some process holds open, and the uids of the
/// processes whose descriptors it could not read.
struct Scan {
    open: Vec<ShareKey>,
    unreadable: Vec<u32>,
}

/// The records of `held` (record, key, exporter's uid) that no process holds a descriptor of,
/// by `scan`. An unreadable process holds back only the records of exporters of its own uid
/// (a tenant that hides its descriptors keeps only its own exports charged, never everyone's);
/// a record whose exporter's uid is unknown is held back by any.
fn releasable(held: &[(usize, ShareKey, Option<u32>)], scan: &Scan) -> Vec<(usize, ShareKey)> {
    held.iter()
        .filter(|(_, k, _)| !scan.open.contains(k))
        .filter(|(_, _, uid)| match uid {
            Some(u) => !scan.unreadable.contains(u),
            None => scan.unreadable.is_empty(),
        })
        .map(|&(rec, k, _)| (rec, k))
        .collect()
}

/// Which of `keys` an open descriptor of some process (not this one: it closes the descriptors
/// it is sent at once) has, by `stat` of each `/proc/PID/fd/N` (the open file's identity), and
/// whose descriptors could not be read (by uid); `None` when the scan is not complete: more
/// than [`MAX_SCANNED`] descriptors, or a process it may not read whose uid it cannot tell.
/// Stops as soon as every key was found.
fn open_keys(keys: &[ShareKey]) -> Option<Scan> {
    use std::os::unix::fs::MetadataExt;
    let me = std::process::id();
    let mut found: Vec<ShareKey> = vec![];
    let mut unreadable: Vec<u32> = vec![];
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
                let uid = crate::procfs::uid_of(pid)?;
                if !unreadable.contains(&uid) {
                    unreadable.push(uid);
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
            if keys.contains(&key) && !found.contains(&key) {
                found.push(key);
                if found.len() == keys.len() {
                    return Some(Scan {
                        open: found,
                        unreadable,
                    });
                }
            }
        }
    }
    Some(Scan {
        open: found,
        unreadable,
    })
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
        };
        assert_eq!(releasable(&held, &all), [(0, k(1)), (1, k(2)), (3, k(4))]);
        let hidden = Scan {
            open: vec![k(3)],
            unreadable: vec![1000],
        };
        assert_eq!(releasable(&held, &hidden), [(1, k(2))]);
    }
}
