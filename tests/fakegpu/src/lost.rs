//! Devices lost at run time, as a real GPU is when it falls off the bus (XID 79), and brought
//! back, as a GPU reset or a reboot brings it back: for tests of what gpuslice and its
//! Kubernetes plugin do with a GPU that is gone.
//!
//! The node-wide record is a small file of its own, `FAKEGPU_STATE_DIR/lost` (kept apart from
//! the state file's layout): one generation word per device, even while the device is there,
//! odd while it is lost, bumped at every loss and every return. `fakegpu_set_lost` (exported;
//! `fakegpu-client lose DEV` / `restore DEV` call it) changes it.
//!
//! What a lost device answers, as the real driver does:
//! - NVML: the device is still counted (`nvmlDeviceGetCount`), but its handle
//!   (`nvmlDeviceGetHandleByIndex`, `..ByPciBusId`) and every query on a handle taken before
//!   are `NVML_ERROR_GPU_IS_LOST` (nvml.h: "the target GPU has fallen off the bus or is
//!   otherwise inaccessible"; `nvidia-smi` then prints "Unable to determine the device handle
//!   for GPU 0000:02:00.0: GPU is lost"); `..ByUUID` is `GPU_IS_LOST` when the UUID is not
//!   among the devices that answer and some device is lost ("if any GPU has fallen off the
//!   bus").
//! - CUDA: a context on the device fails every call with `CUDA_ERROR_UNKNOWN` (999), which is
//!   what running programs get from the driver after an XID 79 (e.g. gpu-burn's copy after
//!   "Xid 79, GPU has fallen off the bus": `CUDA_ERROR_UNKNOWN`, wilicc/gpu-burn#1), and no
//!   context can be made on it (`cuCtxCreate`, `cuDevicePrimaryCtxRetain`: the same error). A
//!   context made before the loss stays dead after the device comes back (a reset invalidates
//!   it, as on the hardware); contexts made after work again.

use crate::config::{config, MAX_DEVICES};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;

const MAGIC: u64 = 0x6661_6b65_6c6f_7331; // "fakelos1"

/// The file.
#[repr(C)]
struct Table {
    magic: AtomicU64,
    /// Per physical device: even while present, odd while lost.
    generation: [AtomicU32; MAX_DEVICES],
}

/// The mapped table, and whether this process may change it; `None` when the state
/// directory cannot hold it (then nothing is lost).
fn table() -> Option<(&'static Table, bool)> {
    static TABLE: OnceLock<Option<(&'static Table, bool)>> = OnceLock::new();
    *TABLE.get_or_init(|| map(&config().ok()?.state_dir))
}

/// Map `dir/lost`: read-write (made, zeroed and stamped under `flock` if new, readable by
/// every user of the node as the state of a GPU is), or read-only for a user who may not
/// write it (a tenant of a file root made: it still sees losses).
fn map(dir: &std::path::Path) -> Option<(&'static Table, bool)> {
    std::fs::create_dir_all(dir).ok()?;
    let path = std::ffi::CString::new(dir.join("lost").as_os_str().as_encoded_bytes()).ok()?;
    let size = std::mem::size_of::<Table>();
    // SAFETY: plain syscalls on a path of the state directory, each checked; the file is at
    // least `size` bytes before it is mapped, so the whole mapping is backed; it is never
    // unmapped, so the reference lives as long as the process. Every field is an atomic,
    // valid for any bytes; a read-only mapping is only ever loaded from.
    unsafe {
        let mut writable = true;
        let mut fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            writable = false;
            fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        }
        if fd < 0 {
            return None;
        }
        if writable {
            libc::flock(fd, libc::LOCK_EX);
        }
        let mut st: libc::stat = std::mem::zeroed();
        let big_enough = libc::fstat(fd, &mut st) == 0
            && ((st.st_size as usize) >= size
                || (writable && libc::ftruncate(fd, size as libc::off_t) == 0));
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let p = if big_enough {
            libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd, 0)
        } else {
            libc::MAP_FAILED
        };
        if p != libc::MAP_FAILED && writable && std::ptr::read_volatile(p as *const u64) != MAGIC {
            std::ptr::write_bytes(p as *mut u8, 0, size);
            std::ptr::write_volatile(p as *mut u64, MAGIC);
        }
        if writable {
            // Explicitly: the mapping keeps the file description, and with it the lock, alive.
            libc::flock(fd, libc::LOCK_UN);
        }
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return None;
        }
        Some((&*(p as *const Table), writable))
    }
}

impl Table {
    fn generation(&self, phys: usize) -> u32 {
        self.generation.get(phys).map_or(0, |g| g.load(Acquire))
    }

    /// Lose or bring back `d` (a no-op when it is so already).
    fn set(&self, d: usize, lost: bool) {
        let _ = self.generation[d].fetch_update(AcqRel, Acquire, |g| {
            (g & 1 != u32::from(lost)).then_some(g.wrapping_add(1))
        });
    }
}

/// The generation of physical device `phys` (odd: lost).
pub fn generation(phys: usize) -> u32 {
    table().map_or(0, |(t, _)| t.generation(phys))
}

/// Whether physical device `phys` is lost now.
pub fn is_lost(phys: usize) -> bool {
    generation(phys) & 1 == 1
}

/// Whether a context made at generation `born` still works at generation `now`: the device is
/// there and has not been lost since.
pub fn usable(now: u32, born: u32) -> bool {
    now == born && born & 1 == 0
}

/// Lose (`lost` non-zero) or bring back physical device `dev` for every process on the node.
/// 0 when done (or already so), -1 for a device index past the fake's limit, -2 when the file
/// cannot be made or written in `FAKEGPU_STATE_DIR`.
#[no_mangle]
pub extern "C" fn fakegpu_set_lost(dev: u32, lost: i32) -> i32 {
    let d = dev as usize;
    if d >= MAX_DEVICES {
        return -1;
    }
    let Some((t, true)) = table() else { return -2 };
    t.set(d, lost != 0);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_dies_with_its_device_and_new_ones_live_after_the_return() {
        let t = Table {
            magic: AtomicU64::new(MAGIC),
            generation: Default::default(),
        };
        let born = t.generation(1);
        assert!(usable(t.generation(1), born));
        t.set(1, true);
        let lost = t.generation(1);
        t.set(1, true);
        assert_eq!(
            t.generation(1),
            lost,
            "losing a lost device changes nothing"
        );
        assert!(lost & 1 == 1 && t.generation(0) & 1 == 0);
        assert!(
            !usable(lost, born) && !usable(lost, lost),
            "nothing works on a lost device"
        );
        t.set(1, false);
        let back = t.generation(1);
        assert!(
            back & 1 == 0 && !usable(back, born),
            "a reset does not revive old contexts"
        );
        assert!(usable(back, back));
        assert_eq!(t.generation(MAX_DEVICES), 0);
    }
}
