//! Node mode: the slice regions the monitor makes and hands out at admission, by key (one per
//! slice and per best-effort allowance on a device, `gpuslice_ledger::node::region_key`). A
//! region has no path: the monitor keeps it here, its members hold its descriptor, and after a
//! monitor restart it is found again through a live member's `/proc/<pid>/fd`.

use gpuslice_ledger::layout::{STATE_ACTIVE, STATE_FREE};
use gpuslice_ledger::node::region_key;
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
        for p in ledger.procs() {
            if p.state.load(SeqCst) != STATE_ACTIVE {
                continue;
            }
            for (d, pd) in p.devices.iter().enumerate() {
                if let Some(k) = region_key(pd.account.load(SeqCst), d) {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
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
/// charged there (a region has no path; its members hold it). Only members are asked, so a
/// process can offer a forged region only for a slice it belongs to.
fn recover(ledger: &Ledger, key: u32) -> Option<Region> {
    for p in ledger.procs() {
        if p.state.load(SeqCst) != STATE_ACTIVE {
            continue;
        }
        let member = p
            .devices
            .iter()
            .enumerate()
            .any(|(d, pd)| region_key(pd.account.load(SeqCst), d) == Some(key));
        if !member {
            continue;
        }
        let pid = p.host_pid.load(SeqCst);
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
            if let Ok(r) = Region::from_fd(OwnedFd::from(f), true) {
                if r.header().key == key {
                    return Some(r);
                }
            }
        }
    }
    None
}
