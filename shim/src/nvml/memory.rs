//! Memory (`nvmlDeviceGetMemoryInfo`, `_v2`): the quota as the total, the slice's usage as
//! used, the rest as free, with the formula of the driver hooks (`report::view_of`). Apart
//! because it is the one answer an attached process must give exactly as CUDA does.

use super::place::{corrected, with_place, Place};
use crate::report::view_of;
use gpuslice_abi::*;

/// `(total, free, used, reserved)` for a device inside a slice, given NVML's own total/free.
fn memory(place: &Place, total: u64, free: u64) -> Option<(u64, u64, u64, u64)> {
    let (Place::Inside {
        memory: Some(fig), ..
    }
    | Place::Outside { memory: Some(fig) }) = *place
    else {
        return None;
    };
    let (t, f) = view_of(fig, total, free);
    let (quota, used) = (fig.quota, fig.used);
    // v1 `used` counts everything not free (NVML's meaning); v2 splits it into the slice's
    // usage and `reserved`: quota the device cannot give right now.
    let not_free = t.saturating_sub(f);
    let used = if quota { used.min(not_free) } else { not_free };
    Some((t, f, not_free, not_free - used))
}

/// The memory structs NVML fills (`nvmlMemory_t`, `nvmlMemory_v2_t`): what differs between
/// `nvmlDeviceGetMemoryInfo` and its `_v2`.
pub trait MemoryStruct {
    /// NVML's own `(total, free)`.
    fn total_free(&self) -> (u64, u64);
    /// Store the slice's figures: `not_free` = total − free, `reserved` of it quota the
    /// device cannot give right now.
    fn store(&mut self, total: u64, free: u64, not_free: u64, reserved: u64);
}

impl MemoryStruct for nvmlMemory_t {
    fn total_free(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn store(&mut self, total: u64, free: u64, not_free: u64, _reserved: u64) {
        // v1 `used` counts everything not free (NVML's meaning).
        (self.total, self.free, self.used) = (total, free, not_free);
    }
}

impl MemoryStruct for nvmlMemory_v2_t {
    fn total_free(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn store(&mut self, total: u64, free: u64, not_free: u64, reserved: u64) {
        (self.total, self.free) = (total, free);
        (self.used, self.reserved) = (not_free - reserved, reserved);
    }
}

/// `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2` (the struct tells them apart).
pub unsafe fn memory_info<M: MemoryStruct>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut M) -> NvmlReturn,
    dev: nvmlDevice_t,
    mem: *mut M,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(dev, mem) };
    // SAFETY: mem is the program's struct, the one NVML's call `r` was given.
    unsafe {
        corrected(r, mem, |mem| {
            let (total, free) = mem.total_free();
            if let Some(Some((t, f, not_free, reserved))) =
                with_place(dev, total, |c| memory(&c.place, total, free))
            {
                mem.store(t, f, not_free, reserved);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Figures;

    #[test]
    fn memory_inside_a_slice() {
        let inside = |limit, used, quota| Place::Inside {
            memory: Some(Figures {
                quota,
                limit,
                used,
                held: 0,
            }),
            found: None,
        };
        // Quota 1 GiB, 256 MiB used, the device has plenty: v2 used + free = total.
        let (t, f, nf, res) =
            memory(&inside(1 << 30, 256 << 20, true), 16 << 30, 10 << 30).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 768 << 20, 256 << 20, 0));
        // The device has less free than the quota has left: free follows the device, the
        // gap is v2 `reserved`, v1 `used` counts it (NVML's v1 meaning).
        let (t, f, nf, res) =
            memory(&inside(1 << 30, 256 << 20, true), 16 << 30, 512 << 20).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 512 << 20, 512 << 20, 256 << 20));
        // Usage past the quota (a hostile counter): never negative.
        let (t, f, nf, res) = memory(&inside(1 << 30, u64::MAX, true), 16 << 30, 8 << 30).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 0, 1 << 30, 0));
        // Best effort: the device's total, free capped by what is not reserved.
        let (t, f, nf, _) = memory(&inside(4 << 30, 1 << 30, false), 16 << 30, 10 << 30).unwrap();
        assert_eq!((t, f, nf), (16 << 30, 3 << 30, 13 << 30));
        assert!(memory(&Place::Outside { memory: None }, 16 << 30, 1).is_none());
        // A CUDA process outside any slice: its best-effort figures, as CUDA reports them.
        let (t, f, _, _) = memory(
            &Place::Outside {
                memory: Some(Figures {
                    quota: false,
                    limit: 4 << 30,
                    used: 1 << 30,
                    held: 0,
                }),
            },
            16 << 30,
            10 << 30,
        )
        .unwrap();
        assert_eq!((t, f), (16 << 30, 3 << 30));
        // Node mode, the device's free memory all this slice's own balloon: free is what the
        // quota has left (an allocation gets the balloon back), never more.
        let ballooned = |held| Place::Inside {
            memory: Some(Figures {
                quota: true,
                limit: 1 << 30,
                used: 256 << 20,
                held,
            }),
            found: None,
        };
        let (t, f, nf, res) = memory(&ballooned(768 << 20), 16 << 30, 0).unwrap();
        assert_eq!((t, f, nf, res), (1 << 30, 768 << 20, 256 << 20, 0));
        let (_, f, _, res) = memory(&ballooned(512 << 20), 16 << 30, 128 << 20).unwrap();
        assert_eq!((f, res), (640 << 20, 128 << 20));
        let (_, f, _, _) = memory(&ballooned(u64::MAX), 16 << 30, u64::MAX).unwrap();
        assert_eq!(f, 768 << 20, "never past the quota, whatever the words say");
        assert!(memory(
            &Place::Inside {
                memory: None,
                found: None
            },
            16 << 30,
            1
        )
        .is_none());
    }
}
