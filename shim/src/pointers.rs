//! What each live allocation was charged ([`Charge`]: bytes, device, pool slot), by handle, so
//! a free returns exactly what the allocation took, to the device and pool it came from. A
//! fixed, preallocated open-addressing table of atomic words: no allocation and no lock on the
//! hot path.
//!
//! Each slot is two words. `key` is the handle with its [`Handle`] folded into the top bits
//! (device pointers, arrays, mipmapped arrays and VMM handles live in different spaces); `val`
//! is the [`Charge`], packed in one place ([`Charge::word`]): bytes in the low 48 bits, the
//! pool slot in the next 8, the device ordinal in the top 8. A slot is claimed by a CAS from
//! empty (or tombstone) to the key; the value is written after the claim. That is safe because
//! a handle is only looked up (freed) after its allocation returned it to the program, which
//! happens after the insert finished; and a free removes its entry *before* calling the real
//! free, so a reused address is never in the table twice.

use core::sync::atomic::{AtomicU64, Ordering::*};

/// What a handle is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
pub enum Handle {
    /// A device pointer (`cuMemAlloc*`, async, pool, managed).
    Ptr = 0,
    /// A `CUarray`.
    Array = 1,
    /// A `CUmipmappedArray`.
    Mipmapped = 2,
    /// A `CUmemGenericAllocationHandle` (`cuMemCreate`).
    Vmm = 3,
}

/// What one live allocation was charged.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Charge {
    /// Bytes charged (at most [`Charge::MAX_BYTES`]).
    pub bytes: u64,
    /// CUDA ordinal of the device charged.
    pub device: u8,
    /// The pool slot the memory came from (`memory::pools`; 0: not pool memory). Its free
    /// moves the bytes into that pool's retained credit instead of returning them.
    pub pool: u8,
}

impl Charge {
    /// The most bytes one entry records (2^48 - 1: more than any device has).
    pub const MAX_BYTES: u64 = (1 << 48) - 1;

    /// `bytes` charged on `dev`, from pool slot `pool`.
    #[inline]
    pub fn new(bytes: u64, dev: &crate::admit::DevState, pool: usize) -> Charge {
        // Callers record only what they charged, and no quota or device reaches 2^48 bytes.
        debug_assert!(bytes <= Self::MAX_BYTES && pool <= u8::MAX as usize);
        Charge {
            bytes,
            device: dev.ordinal as u8,
            pool: pool as u8,
        }
    }

    /// The table's one-word form.
    #[inline]
    fn word(self) -> u64 {
        (self.device as u64) << 56 | (self.pool as u64) << 48 | (self.bytes & Self::MAX_BYTES)
    }

    #[inline]
    fn from_word(w: u64) -> Charge {
        Charge {
            bytes: w & Self::MAX_BYTES,
            pool: (w >> 48) as u8,
            device: (w >> 56) as u8,
        }
    }
}

const SLOTS: usize = 1 << 19; // 8 MiB of zero pages, touched only as used
const EMPTY: u64 = 0;
const TOMB: u64 = u64::MAX;

struct Slot {
    key: AtomicU64,
    /// A [`Charge`] in its one-word form.
    val: AtomicU64,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        key: AtomicU64::new(EMPTY),
        val: AtomicU64::new(0),
    }
}; SLOTS];

#[inline]
fn key(kind: Handle, h: u64) -> u64 {
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

/// Remember that `h` was charged `c`. False when the table is full.
#[inline]
pub fn insert(kind: Handle, h: u64, c: Charge) -> bool {
    let k = key(kind, h);
    let mut i = start(k);
    for _ in 0..SLOTS {
        let s = &TABLE[i];
        let cur = s.key.load(Relaxed);
        if (cur == EMPTY || cur == TOMB) && s.key.compare_exchange(cur, k, AcqRel, Relaxed).is_ok()
        {
            s.val.store(c.word(), Release);
            return true;
        }
        i = (i + 1) & (SLOTS - 1);
    }
    false
}

/// Walk `h`'s probe sequence up to the first empty slot: the first `Some` that `at` gives for
/// a slot holding `h`'s key.
#[inline]
fn probe(kind: Handle, h: u64, mut at: impl FnMut(&Slot, u64) -> Option<Charge>) -> Option<Charge> {
    let k = key(kind, h);
    let mut i = start(k);
    for _ in 0..SLOTS {
        let s = &TABLE[i];
        let cur = s.key.load(Acquire);
        if cur == EMPTY {
            return None;
        }
        if cur == k {
            if let Some(c) = at(s, k) {
                return Some(c);
            }
        }
        i = (i + 1) & (SLOTS - 1);
    }
    None
}

/// Forget `h`, returning what it was charged if it was known.
#[inline]
pub fn remove(kind: Handle, h: u64) -> Option<Charge> {
    probe(kind, h, |s, k| {
        let v = s.val.load(Acquire);
        s.key
            .compare_exchange(k, TOMB, AcqRel, Relaxed)
            .is_ok()
            .then(|| Charge::from_word(v))
    })
}

/// What `h` was charged, if it is known (the table unchanged).
pub fn get(kind: Handle, h: u64) -> Option<Charge> {
    probe(kind, h, |s, _| Some(Charge::from_word(s.val.load(Acquire))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(bytes: u64, device: u8, pool: u8) -> Charge {
        Charge {
            bytes,
            device,
            pool,
        }
    }

    #[test]
    fn a_charge_survives_its_one_word_form() {
        for x in [c(0, 0, 0), c(Charge::MAX_BYTES, 255, 63), c(4096, 7, 17)] {
            assert_eq!(Charge::from_word(x.word()), x);
        }
    }

    #[test]
    fn insert_remove() {
        assert!(insert(Handle::Ptr, 0x7000_0000_1000, c(4096, 1, 3)));
        assert!(insert(Handle::Vmm, 0x7000_0000_1000, c(8192, 0, 0)));
        assert_eq!(get(Handle::Ptr, 0x7000_0000_1000), Some(c(4096, 1, 3)));
        assert_eq!(remove(Handle::Ptr, 0x7000_0000_1000), Some(c(4096, 1, 3)));
        assert_eq!(get(Handle::Ptr, 0x7000_0000_1000), None);
        assert_eq!(remove(Handle::Ptr, 0x7000_0000_1000), None);
        assert_eq!(remove(Handle::Vmm, 0x7000_0000_1000), Some(c(8192, 0, 0)));
        let handles: Vec<u64> = (1..5000u64).map(|i| i * 0x200000).collect();
        std::thread::scope(|s| {
            for chunk in handles.chunks(1000) {
                s.spawn(move || {
                    for &h in chunk {
                        assert!(insert(Handle::Array, h, c(h, 2, 0)));
                    }
                    for &h in chunk {
                        assert_eq!(remove(Handle::Array, h), Some(c(h, 2, 0)));
                    }
                });
            }
        });
    }
}
