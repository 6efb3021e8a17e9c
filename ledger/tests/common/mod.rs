//! What the node-mode ledger tests share: the root check, the monitor's table of slice regions,
//! and a tenant's credentials as `SO_PEERCRED` would give them.

#![allow(dead_code)] // each test binary uses a part

use gpuslice_ledger::node::{Peer, Regions};
use gpuslice_ledger::region::Region;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
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
        host_pid: pid,
        nspid: pid,
        uid,
        start_time: 1000 + pid as u64,
    }
}
