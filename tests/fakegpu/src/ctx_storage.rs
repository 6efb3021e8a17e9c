//! Per-context storage, the runtime's (key, value, destructor) slots on each context (export
//! table `c693336e`, `export/storage.rs`). Apart, below the runtime, because each context holds
//! one and `get` is on cudart's path of nearly every call: a lock-free scan whose ordering the
//! type's doc explains.

use gpuslice_abi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;

/// A destructor the runtime registers with a value: `(ctx, key, value)`.
pub type Dtor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

const SLOTS: usize = 16;

/// Per-context storage: a few (key, value, destructor) slots read without a lock. Writers
/// (`put`, `del`, teardown: rare) serialise on one mutex; `get` (nearly every runtime call)
/// is a scan of at most `SLOTS` atomics. A value is published before its key (Release), so a
/// reader that sees the key sees the value.
pub struct CtxStorage {
    keys: [AtomicUsize; SLOTS],
    values: [AtomicUsize; SLOTS],
    dtors: [AtomicUsize; SLOTS],
}

static WRITERS: Mutex<()> = Mutex::new(());

impl CtxStorage {
    pub const fn new() -> CtxStorage {
        CtxStorage {
            keys: [const { AtomicUsize::new(0) }; SLOTS],
            values: [const { AtomicUsize::new(0) }; SLOTS],
            dtors: [const { AtomicUsize::new(0) }; SLOTS],
        }
    }

    /// The value under `key`.
    pub fn get(&self, key: usize) -> Option<usize> {
        if key == 0 {
            return None;
        }
        for i in 0..SLOTS {
            if self.keys[i].load(Acquire) == key {
                return Some(self.values[i].load(Acquire));
            }
        }
        None
    }

    /// Store `value` under `key` (replacing an earlier one); `false` when every slot is taken.
    pub fn put(&self, key: usize, value: usize, dtor: usize) -> bool {
        if key == 0 {
            return false;
        }
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (0..SLOTS)
            .find(|&i| self.keys[i].load(Relaxed) == key)
            .or_else(|| (0..SLOTS).find(|&i| self.keys[i].load(Relaxed) == 0));
        let Some(i) = slot else { return false };
        self.values[i].store(value, Release);
        self.dtors[i].store(dtor, Release);
        self.keys[i].store(key, Release);
        true
    }

    /// Remove `key`; `false` if it was not there.
    pub fn del(&self, key: usize) -> bool {
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        match (0..SLOTS).find(|&i| key != 0 && self.keys[i].load(Relaxed) == key) {
            Some(i) => {
                self.keys[i].store(0, Release);
                true
            }
            None => false,
        }
    }

    /// Empty the storage, returning what was there as (key, value, destructor), for a context
    /// being destroyed: the caller runs the destructors without the lock held.
    pub fn drain(&self) -> Vec<(usize, usize, usize)> {
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for i in 0..SLOTS {
            let k = self.keys[i].swap(0, AcqRel);
            if k != 0 {
                out.push((k, self.values[i].load(Acquire), self.dtors[i].load(Acquire)));
            }
        }
        out
    }
}

impl Default for CtxStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl CtxStorage {
    /// Run the destructors of the storage of context `ctx` (called when it is torn down).
    ///
    /// # Safety
    /// `ctx` is the handle of the context this storage belongs to: the destructors the runtime
    /// registered are handed it.
    pub unsafe fn run_dtors(&self, ctx: CUcontext) {
        for (k, v, d) in self.drain() {
            if d != 0 {
                // SAFETY: `d` was registered by the runtime as a destructor of this signature.
                let f: unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void) =
                    unsafe { std::mem::transmute(d) };
                // SAFETY: the destructor's contract: the context, the key and the value it
                // stored.
                unsafe { f(ctx, k as *mut c_void, v as *mut c_void) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_get_put_del() {
        let s = CtxStorage::new();
        assert_eq!(s.get(5), None);
        assert!(s.put(5, 50, 0));
        assert!(s.put(6, 60, 0));
        assert_eq!(s.get(5), Some(50));
        assert!(s.put(5, 51, 0));
        assert_eq!(s.get(5), Some(51));
        assert!(s.del(5));
        assert!(!s.del(5));
        assert_eq!(s.get(5), None);
        for k in 10..10 + SLOTS - 1 {
            assert!(s.put(k, k, 0));
        }
        assert!(!s.put(99, 1, 0), "full storage refuses");
        assert_eq!(s.drain().len(), SLOTS);
        assert_eq!(s.get(6), None);
    }
}
