//! What each live allocation was charged: handle → (bytes, device), so a free returns exactly
//! what the allocation took. A fixed, preallocated open-addressing table of atomic words: no
//! allocation and no lock on the hot path.
//!
//! Keys are the handle with its kind folded into the top bits (device pointers, arrays,
//! mipmapped arrays and VMM handles live in different spaces). A slot is claimed by a CAS from
//! empty (or tombstone) to the key; the value is written after the claim. That is safe because
//! a handle is only looked up (freed) after its allocation returned it to the program, which
//! happens after the insert finished; and a free removes its entry *before* calling the real
//! free, so a reused address is never in the table twice.

use core::sync::atomic::{AtomicU64, Ordering::*};

/// What a handle is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
pub enum Kind {
    /// A device pointer (`cuMemAlloc*`, async, pool, managed).
    Ptr = 0,
    /// A `CUarray`.
    Array = 1,
    /// A `CUmipmappedArray`.
    Mipmapped = 2,
    /// A `CUmemGenericAllocationHandle` (`cuMemCreate`).
    Vmm = 3,
}

const SLOTS: usize = 1 << 19; // 8 MiB of zero pages, touched only as used
const EMPTY: u64 = 0;
const TOMB: u64 = u64::MAX;

struct Slot {
    key: AtomicU64,
    /// bytes << 8 | device ordinal
    val: AtomicU64,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        key: AtomicU64::new(EMPTY),
        val: AtomicU64::new(0),
    }
}; SLOTS];

#[inline]
fn key(kind: Kind, h: u64) -> u64 {
    let k = h ^ ((kind as u64) << 60);
    if k == EMPTY || k == TOMB {
        k ^ 1 << 59 // never collides with the markers; distinct handles stay distinct in practice
    } else {
        k
    }
}

#[inline]
fn start(k: u64) -> usize {
    (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & (SLOTS - 1)
}

/// Remember that `h` took `bytes` on device ordinal `dev`. False when the table is full.
#[inline]
pub fn insert(kind: Kind, h: u64, bytes: u64, dev: u8) -> bool {
    let k = key(kind, h);
    let mut i = start(k);
    for _ in 0..SLOTS {
        let s = &TABLE[i];
        let cur = s.key.load(Relaxed);
        if (cur == EMPTY || cur == TOMB) && s.key.compare_exchange(cur, k, AcqRel, Relaxed).is_ok()
        {
            s.val.store(bytes << 8 | dev as u64, Release);
            return true;
        }
        i = (i + 1) & (SLOTS - 1);
    }
    false
}

/// Forget `h`, returning (bytes, device) if it was known.
#[inline]
pub fn remove(kind: Kind, h: u64) -> Option<(u64, u8)> {
    let k = key(kind, h);
    let mut i = start(k);
    for _ in 0..SLOTS {
        let s = &TABLE[i];
        let cur = s.key.load(Acquire);
        if cur == EMPTY {
            return None;
        }
        if cur == k {
            let v = s.val.load(Acquire);
            if s.key.compare_exchange(k, TOMB, AcqRel, Relaxed).is_ok() {
                return Some((v >> 8, v as u8));
            }
        }
        i = (i + 1) & (SLOTS - 1);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove() {
        assert!(insert(Kind::Ptr, 0x7000_0000_1000, 4096, 1));
        assert!(insert(Kind::Vmm, 0x7000_0000_1000, 8192, 0));
        assert_eq!(remove(Kind::Ptr, 0x7000_0000_1000), Some((4096, 1)));
        assert_eq!(remove(Kind::Ptr, 0x7000_0000_1000), None);
        assert_eq!(remove(Kind::Vmm, 0x7000_0000_1000), Some((8192, 0)));
        let handles: Vec<u64> = (1..5000u64).map(|i| i * 0x200000).collect();
        std::thread::scope(|s| {
            for chunk in handles.chunks(1000) {
                s.spawn(move || {
                    for &h in chunk {
                        assert!(insert(Kind::Array, h, h, 2));
                    }
                    for &h in chunk {
                        assert_eq!(remove(Kind::Array, h), Some((h, 2)));
                    }
                });
            }
        });
    }
}
