//! What the ledger tests share: a fresh directory per test, the root check, a node policy, the
//! monitor's table of slice regions, and a tenant's credentials as `SO_PEERCRED` would give them.

#![allow(dead_code)] // each test binary uses a part

use gpuslice_ledger::node::{Peer, Policy};
use gpuslice_ledger::region::Region;
use gpuslice_ledger::region::Regions;
use gpuslice_ledger::Ledger;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The directory of one test of `suite`: `gpuslice-SUITE-PID-TAG` in the temp directory, not
/// there yet (a leftover of an earlier run is removed).
pub fn fresh_dir(suite: &str, tag: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("gpuslice-{suite}-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Scratch(d)
}

/// A test's directory ([`fresh_dir`]), removed with all it holds when the test ends well; kept
/// after a failure, to look at. A directory that is there and cannot be removed fails the test.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        match std::fs::remove_dir_all(&self.0) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                panic!("removing {}: {e}", self.0.display())
            }
            _ => {}
        }
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The node policy in `d` (made if absent; needs root) with the devices `uuids` (16 GiB each)
/// and an empty table of regions, as the monitor holds them.
pub fn open_node(d: &Path, uuids: &[&str]) -> (Policy, Arc<Table>) {
    let l = Ledger::open_or_create_node(d).unwrap();
    for uuid in uuids {
        l.ensure_device(uuid, "Fake", 16 << 30).unwrap();
    }
    let t = Arc::new(Table::default());
    l.set_regions(t.clone());
    (l, t)
}

/// [`open_node`] in a [`fresh_dir`]; `None` without root (the test passes vacuously, saying
/// why).
pub fn node_policy(
    suite: &str,
    tag: &str,
    uuids: &[&str],
) -> Option<(Policy, Arc<Table>, Scratch)> {
    if !is_root() {
        println!("skipped: a node policy needs root");
        return None;
    }
    let d = fresh_dir(suite, tag);
    let (l, t) = open_node(&d, uuids);
    Some((l, t, d))
}

/// The regions a monitor keeps, by key.
#[derive(Default)]
pub struct Table(Mutex<HashMap<u32, Arc<Region>>>);

impl Regions for Table {
    fn get(&self, key: u32) -> Option<Arc<Region>> {
        self.0.lock().unwrap().get(&key).cloned()
    }
}

impl Table {
    /// Create and keep the region of record `key`.
    pub fn make(&self, key: u32) -> Arc<Region> {
        let r = Arc::new(Region::create(key, 0).unwrap());
        self.0.lock().unwrap().insert(key, r.clone());
        r
    }
}

/// Process `pid` of user `uid`, in the host's PID namespace.
pub fn peer(pid: u32, uid: u32) -> Peer {
    Peer {
        pid_ns: 0,
        host_pid: pid,
        nspid: pid,
        uid,
        start_time: 1000 + pid as u64,
    }
}
