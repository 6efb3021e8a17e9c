//! Node mode: the slice regions the monitor makes and hands out at admission, by key (one per
//! slice and per best-effort allowance on a device, `gpuslice_ledger::region::region_key`). A
//! region has no path: the monitor keeps it here, its members hold its descriptor, and after a
//! monitor restart it is found again through a live member's `/proc/<pid>/fd`.

use gpuslice_ledger::layout::STATE_FREE;
use gpuslice_ledger::region::region_key;
use gpuslice_ledger::region::{Region, Regions};
use gpuslice_ledger::{Ledger, LedgerError};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

/// The monitor's regions, by key.
#[derive(Default)]
pub struct RegionTable {
    map: Mutex<HashMap<u32, Arc<Region>>>,
}

impl Regions for RegionTable {
    fn get(&self, key: u32) -> Option<Arc<Region>> {
        self.map.lock().ok()?.get(&key).cloned()
    }
}

impl RegionTable {
    /// The region of `key`, recovered from a live member (after a monitor restart) or created.
    pub(crate) fn get_or_make(
        &self,
        ledger: &Ledger,
        key: u32,
    ) -> Result<Arc<Region>, LedgerError> {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = m.get(&key) {
            return Ok(r.clone());
        }
        let r = Arc::new(match recover(ledger, key) {
            Some(r) => r,
            None => Region::create(key, ledger.header().generation.load(SeqCst))?,
        });
        m.insert(key, r.clone());
        Ok(r)
    }

    /// Make a region for `key` (tests).
    #[cfg(test)]
    pub fn make_for_test(&self, key: u32) -> Arc<Region> {
        let r = Arc::new(Region::create(key, 0).unwrap());
        self.map.lock().unwrap().insert(key, r.clone());
        r
    }

    /// Drop the regions of slices that no longer exist (best-effort allowances stay).
    pub fn retain_live(&self, ledger: &Ledger) {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|&k, _| match ledger.slices().get(k as usize) {
            Some(s) => s.state.load(SeqCst) != STATE_FREE,
            None => k
                .checked_sub(gpuslice_ledger::layout::ALLOWANCE_ACCOUNT_BASE)
                .and_then(|i| ledger.allowances().get(i as usize))
                .is_some_and(|p| p.state.load(SeqCst) != STATE_FREE),
        });
    }

    /// After a restart: find every region live processes still hold, so reaping and usage go
    /// on where they were.
    pub fn recover_all(&self, ledger: &Ledger) -> usize {
        let mut keys = vec![];
        for k in ledger.members().filter_map(|m| m.region) {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let mut n = 0;
        for k in keys {
            if let Some(r) = recover(ledger, k) {
                self.map
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(k, Arc::new(r));
                n += 1;
            }
        }
        n
    }

    /// After a restart, once [`Self::recover_all`] ran: the slices charged by exported memory
    /// their records hold (`Ledger::record_charges`: an importer or a descriptor holds it) whose
    /// region no live member gave back (their processes gone, or their exporter died while
    /// the monitor was down) had it held by the dead monitor alone. Each is made again, its
    /// counter at what the records hold plus, in each still registered exporter's own word,
    /// what it exported, so a new process of the slice finds the charge, the reaper hands a
    /// dead exporter's part to its records, and their let-go returns it from there (never from
    /// a fresh counter that lacks it). The exporters' part is their word, bounded by nothing
    /// but the slice's quota now: an overcharge of their own slice at worst. The (region key,
    /// bytes) restored.
    pub fn restore_held(&self, ledger: &Ledger) -> Result<Vec<(u32, u64)>, LedgerError> {
        let mut restored = vec![];
        for c in ledger.record_charges()? {
            let Some(key) = region_key(c.account, c.device) else {
                continue;
            };
            let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if m.contains_key(&key) {
                continue; // recovered from a live member: its counter already has the bytes
            }
            let r = Region::create(key, ledger.header().generation.load(SeqCst))?;
            // Nobody else has the region yet: no member, so the words are the records' alone.
            let mut budget = c.limit.saturating_sub(c.held);
            let mut total = c.held;
            for &(slot, bytes) in &c.exported {
                let Some(p) = r.proc_(slot) else {
                    continue;
                };
                let n = bytes.min(budget);
                budget -= n;
                p.charged.fetch_add(n, SeqCst);
                total = total.saturating_add(n);
            }
            r.header().memory_used.0.store(total, SeqCst);
            m.insert(key, Arc::new(r));
            restored.push((key, total));
        }
        Ok(restored)
    }
}

/// Reopen the region of `key` through `/proc/<pid>/fd` of a live process the policy says is
/// charged there (a region has no path; its members hold it). Only members are asked, and only
/// while their pid is still theirs (its start time: a dead member's pid may be anyone's now),
/// and only a memfd the monitor made (its owner: a tenant cannot make one owned by the
/// monitor's uid), so no process can offer a region of its own making.
fn recover(ledger: &Ledger, key: u32) -> Option<Region> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let monitor_uid = unsafe { libc::geteuid() };
    // Memberships come grouped by process: ask each member once.
    let mut asked = None;
    for m in ledger.members().filter(|m| m.region == Some(key)) {
        if asked.replace(m.slot) == Some(m.slot) {
            continue;
        }
        let p = m.proc_;
        let pid = p.host_pid.load(SeqCst);
        let start = p.start_time.load(SeqCst);
        if !gpuslice_ledger::is_running(pid, start) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in fds.flatten() {
            let Ok(target) = std::fs::read_link(e.path()) else {
                continue;
            };
            if !target
                .to_string_lossy()
                .starts_with("/memfd:gpuslice-region")
            {
                continue;
            }
            let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(e.path())
            else {
                continue;
            };
            if f.metadata().map_or(true, |m| m.uid() != monitor_uid) {
                continue;
            }
            if let Ok(r) = Region::from_fd(OwnedFd::from(f), true) {
                // Still that member after its descriptors were read: the pid was not reused
                // meanwhile.
                if r.header().key == key && gpuslice_ledger::is_running(pid, start) {
                    return Some(r);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::node::{DeviceAsk, Limits, Peer};
    use gpuslice_ledger::SliceRequest;

    /// Issue #34: after a restart a region is reopened only from the member the ledger names,
    /// while its pid is still its own (start time), and only a memfd the monitor made (owner).
    #[test]
    fn recovery_trusts_only_the_recorded_member_and_the_monitors_memfd() {
        // A node policy is root's to make.
        gpuslice_e2e::need_root!();
        let dir = std::env::temp_dir().join(format!("gpuslice-recover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let l = Ledger::open_or_create_node(&dir).unwrap();
        let uuid = "GPU-00000000-0000-0000-0000-00000000000a";
        l.ensure_device(uuid, "Fake", 16 << 30).unwrap();
        let regions = Arc::new(RegionTable::default());
        l.set_regions(regions.clone());
        // This process, recorded as a member with a start time not its own: what a process
        // that took a dead member's pid looks like.
        let me = std::process::id();
        let real = gpuslice_ledger::live_start_time_of(&me.to_string());
        let peer = Peer {
            pid_ns: 0,
            host_pid: me,
            nspid: me,
            uid: 0,
            start_time: real + 1,
        };
        let ask = [DeviceAsk {
            uuid: uuid.into(),
            req: SliceRequest::new(Some("a"), Some(1 << 30)),
        }];
        l.admit(&peer, "", &ask, &Limits::default()).unwrap();
        let m = l.members().next().unwrap();
        let (p, key) = (m.proc_, m.region.unwrap());
        // The region it offers (made by this process, root, as the monitor would).
        let held = Region::create(key, 0).unwrap();
        assert!(recover(&l, key).is_none(), "a reused pid offered a region");
        p.start_time.store(real, SeqCst);
        assert!(recover(&l, key).is_some(), "the member's own region");
        // The same member offering a memfd the monitor did not make.
        drop(held);
        let regions_open = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:gpuslice-region"))
                })
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect::<Vec<_>>()
        };
        let before = regions_open();
        let forged = Region::create(key, 0).unwrap();
        // Its descriptors only (another test's regions are left alone).
        for fd in regions_open().into_iter().filter(|fd| !before.contains(fd)) {
            // SAFETY: fchown on a descriptor of this process; a closed one fails harmlessly.
            unsafe { libc::fchown(fd, 47_097, 47_097) };
        }
        assert!(
            recover(&l, key).is_none(),
            "a memfd the monitor did not make"
        );
        drop(forged);
        drop(l);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
