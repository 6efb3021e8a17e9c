//! Legacy IPC memory handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle(_v2)`,
//! `cuIpcCloseMemHandle`): a `cuMemAlloc` allocation another process maps, the same bytes in
//! both.
//!
//! Device memory is a private anonymous mapping until a handle is first asked for it; then its
//! bytes move into a memfd mapped `MAP_SHARED` at the same address (pending copies finished
//! first, as a free waits for them), and the handle names the exporter's pid, the memfd's fd
//! number and inode, and the allocation's key in the node-wide table ([`super::shared_mem`]).
//! The importer opens `/proc/<pid>/fd/<fd>` (so both must be the same user, or the importer
//! root), checks the inode, and maps it. Memory stays counted to its exporter until the
//! exporter has freed it and every importer has closed it, or the exporter exits.
//!
//! The driver's errors: a handle opened in its own process is `CUDA_ERROR_INVALID_CONTEXT`; a
//! handle of memory its exporter freed, a pointer that is not the start of a `cuMemAlloc`
//! allocation, or closing what is not open (twice) is `CUDA_ERROR_INVALID_VALUE`; opening a
//! handle a process has open already returns the same pointer, counted once more.

use super::ranges::{lookup, page_round, ranges, unmap, Kind, Range};
use super::shared_mem::{self, inode};
use crate::runtime::{rt_unchecked, Ctx, CuResult};
use gpuslice_abi::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;

const MAGIC: u32 = u32::from_le_bytes(*b"FGIM");

/// An allocation this process exported: its memfd (kept open so importers can reach it) and
/// its key.
struct Exported {
    fd: i32,
    key: u64,
    ino: u64,
}

/// Allocations exported, by start address.
static EXPORTED: Mutex<Option<HashMap<u64, Exported>>> = Mutex::new(None);
/// How many: a free checks this before taking the lock.
static N_EXPORTED: AtomicUsize = AtomicUsize::new(0);
/// Memory this process opened: by key, (address, opens).
static IMPORTED: Mutex<Option<HashMap<u64, (u64, u32)>>> = Mutex::new(None);

fn with<K, V, T>(m: &Mutex<Option<HashMap<K, V>>>, f: impl FnOnce(&mut HashMap<K, V>) -> T) -> T {
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// The handle's fields, in its 64 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Handle {
    pid: u32,
    fd: i32,
    phys: u32,
    key: u64,
    ino: u64,
    size: u64,
}

impl Handle {
    fn encode(&self) -> CUipcMemHandle {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.fd.to_le_bytes());
        b[12..16].copy_from_slice(&self.phys.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.to_le_bytes());
        b[24..32].copy_from_slice(&self.ino.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        CUipcMemHandle {
            reserved: b.map(|x| x as std::ffi::c_char),
        }
    }

    fn decode(h: &CUipcMemHandle) -> Option<Handle> {
        let b = h.reserved.map(|x| x as u8);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        (u32_at(0) == MAGIC).then(|| Handle {
            pid: u32_at(4),
            fd: u32_at(8) as i32,
            phys: u32_at(12),
            key: u64_at(16),
            ino: u64_at(24),
            size: u64_at(32),
        })
    }
}

/// `cuIpcGetMemHandle`: a handle for the `cuMemAlloc` allocation containing `ptr` (the
/// importer maps the whole allocation, as on the driver).
pub fn get_mem_handle(ctx: &'static Ctx, ptr: u64) -> CuResult<CUipcMemHandle> {
    let (base, r) = lookup(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if r.kind != Kind::Device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let phys = super::ranges::phys(r.dev) as u32;
    let pid = std::process::id();
    let known = |m: &mut HashMap<u64, Exported>| m.get(&base).map(|e| (e.fd, e.key, e.ino));
    if with(&EXPORTED, known).is_none() {
        // Queued copies may still read or write it: let them finish before its bytes move
        // (outside the lock, which the executor's frees take).
        let dev = &rt_unchecked().devices[r.dev];
        if dev.exec.pending_mem.load(Acquire) > 0 {
            let _ = crate::exec::ctx_synchronize(ctx);
        }
    }
    // Under the lock, so two threads asking at once export it once.
    let (fd, key, ino) = with(&EXPORTED, |m| -> CuResult<(i32, u64, u64)> {
        if let Some(f) = known(m) {
            return Ok(f);
        }
        let e = export(base, &r, phys as usize)?;
        let f = (e.fd, e.key, e.ino);
        m.insert(base, e);
        N_EXPORTED.fetch_add(1, Release);
        Ok(f)
    })?;
    Ok(Handle {
        pid,
        fd,
        phys,
        key,
        ino,
        size: r.size,
    }
    .encode())
}

/// Export the allocation `r` at `base`: its bytes into a memfd, its entry in the node-wide
/// table.
fn export(base: u64, r: &Range, phys: usize) -> CuResult<Exported> {
    let fd = share_mapping(base, r.map_len)?;
    let shared = inode(fd)
        .ok_or(CUDA_ERROR_OPERATING_SYSTEM)
        .and_then(|ino| Ok((ino, shared_mem::share(None, phys, r.size)?)));
    match shared {
        Ok((ino, key)) => Ok(Exported { fd, key, ino }),
        Err(e) => {
            // SAFETY: our memfd, not handed out; the mapping keeps the memory.
            unsafe { libc::close(fd) };
            Err(e)
        }
    }
}

/// Move the private mapping `base..base+len` into a memfd mapped shared at the same address;
/// its fd.
fn share_mapping(base: u64, len: usize) -> CuResult<i32> {
    // SAFETY: memfd_create with a static name; the fd is checked.
    let fd = unsafe { libc::memfd_create(c"fakegpu-ipc".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let fail = || {
        // SAFETY: our own memfd, not handed out.
        unsafe { libc::close(fd) };
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    };
    // SAFETY: sizing our own memfd.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        return fail();
    }
    const CHUNK: usize = 1 << 20;
    let resident = resident_pages(base, len);
    let mut off = 0;
    while off < len {
        let n = CHUNK.min(len - off);
        // A page never touched is not resident and reads as zeros: skip what holds none.
        if resident.as_ref().is_some_and(|v| {
            v[off / PAGE..(off + n).div_ceil(PAGE)]
                .iter()
                .all(|&b| b & 1 == 0)
        }) {
            off += n;
            continue;
        }
        // SAFETY: `base..base+len` is a live range of ours (readable, read-write mapped).
        let src = unsafe { std::slice::from_raw_parts((base as usize + off) as *const u8, n) };
        // Untouched memory reads as zeros, which the memfd already holds: copy only the rest.
        if src.iter().any(|&b| b != 0) {
            // SAFETY: pwrite of a readable slice into our memfd.
            let wrote = unsafe { libc::pwrite(fd, src.as_ptr().cast(), n, off as libc::off_t) };
            if wrote != n as isize {
                return fail();
            }
        }
        off += n;
    }
    // SAFETY: replaces our own mapping of `base..base+len` (same length, same protection) by
    // the memfd now holding the same bytes.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return fail();
    }
    Ok(fd)
}

const PAGE: usize = 4096;

/// Which pages of the private mapping `base..base+len` are resident (`mincore`), when that
/// tells which were never written: only without swap, where a written page is always resident
/// (a swapped-out one would read as untouched).
fn resident_pages(base: u64, len: usize) -> Option<Vec<u8>> {
    static NO_SWAP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let no_swap = *NO_SWAP.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo").is_ok_and(|m| {
            m.lines()
                .any(|l| l.starts_with("SwapTotal:") && l.split_whitespace().nth(1) == Some("0"))
        })
    });
    if !no_swap {
        return None;
    }
    let mut v = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: `base..base+len` is a page-aligned mapping of ours; `v` has a byte per page.
    let r = unsafe { libc::mincore(base as *mut libc::c_void, len, v.as_mut_ptr()) };
    (r == 0).then_some(v)
}

/// `cuIpcOpenMemHandle(_v2)`: map memory another process exported, in context `ctx`.
pub fn open_mem_handle(ctx: &'static Ctx, h: &CUipcMemHandle, flags: u32) -> CuResult<u64> {
    if flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = Handle::decode(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if h.pid == std::process::id() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    if let Some(p) = open_again(h.key) {
        return Ok(p);
    }
    let joined = shared_mem::join(h.key, true)?;
    let (ptr, len) = map_remote(&h, joined.size).inspect_err(|_| shared_mem::leave(h.key))?;
    // Another thread may have opened it meanwhile: then its mapping is the one.
    let raced = with(&IMPORTED, |m| match m.get_mut(&h.key) {
        Some((p, n)) => {
            *n += 1;
            Some(*p)
        }
        None => {
            ranges().insert(ptr, Range::new(Some(ctx), joined.size, len, Kind::Imported));
            m.insert(h.key, (ptr, 1));
            None
        }
    });
    match raced {
        Some(p) => {
            unmap(ptr, len);
            shared_mem::leave(h.key);
            Ok(p)
        }
        None => Ok(ptr),
    }
}

/// The address memory `key` is open at in this process, opened once more.
fn open_again(key: u64) -> Option<u64> {
    with(&IMPORTED, |m| {
        m.get_mut(&key).map(|(p, n)| {
            *n += 1;
            *p
        })
    })
}

/// Map the exporter's memfd: (address, mapped length).
fn map_remote(h: &Handle, size: u64) -> CuResult<(u64, usize)> {
    let path = format!("/proc/{}/fd/{}\0", h.pid, h.fd);
    // SAFETY: open of a NUL-terminated path; the fd is checked and closed below.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = page_round(size);
    // The memfd the handle names, and as large as the (writable by anyone) table says: a
    // mapping past its end would fault on access.
    // SAFETY: libc::stat is plain data; fstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of the fd we opened into a local.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0
        && st.st_ino == h.ino
        && st.st_size as u64 >= len as u64;
    // SAFETY: a fresh shared mapping of the memfd we opened; checked below.
    let p = ok.then(|| unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    });
    // SAFETY: the mapping (if any) keeps the memory; the fd is ours.
    unsafe { libc::close(fd) };
    match p {
        Some(p) if p != libc::MAP_FAILED => Ok((p as u64, len)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuIpcCloseMemHandle`: one open fewer; the last unmaps it.
pub fn close_mem_handle(ptr: u64) -> CuResult<()> {
    let key = with(&IMPORTED, |m| {
        let (&k, v) = m.iter_mut().find(|(_, (p, _))| *p == ptr)?;
        v.1 -= 1;
        if v.1 == 0 {
            m.remove(&k);
            Some((k, true))
        } else {
            Some((k, false))
        }
    });
    match key {
        None => Err(CUDA_ERROR_INVALID_VALUE),
        Some((_, false)) => Ok(()),
        Some((k, true)) => {
            if let Some(r) = ranges().remove(&ptr) {
                unmap(ptr, r.map_len);
            }
            shared_mem::leave(k);
            Ok(())
        }
    }
}

/// An imported range went with its context: forget it as if closed as often as opened.
pub(super) fn imported_gone(ptr: u64) {
    let key = with(&IMPORTED, |m| {
        let k = *m.iter().find(|(_, (p, _))| *p == ptr)?.0;
        m.remove(&k);
        Some(k)
    });
    if let Some(k) = key {
        shared_mem::leave(k);
    }
}

/// The allocation at `ptr` is being freed: if it was exported, this process stops holding it
/// and true is returned (its count goes back when the last importer closes it, not now).
pub(super) fn exported_freed(ptr: u64) -> bool {
    if N_EXPORTED.load(Acquire) == 0 {
        return false;
    }
    let Some(e) = with(&EXPORTED, |m| m.remove(&ptr)) else {
        return false;
    };
    N_EXPORTED.fetch_sub(1, Release);
    // SAFETY: the memfd this export owned; importers' mappings keep their memory.
    unsafe { libc::close(e.fd) };
    shared_mem::leave(e.key);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_reads_back_as_written_and_a_foreign_one_not_at_all() {
        let h = Handle {
            pid: 4242,
            fd: 17,
            phys: 3,
            key: 99,
            ino: 1 << 40,
            size: 256 << 20,
        };
        assert_eq!(Handle::decode(&h.encode()), Some(h));
        let mut other = h.encode();
        other.reserved[0] ^= 1;
        assert_eq!(Handle::decode(&other), None, "not a handle of this driver");
        let zero = CUipcMemHandle { reserved: [0; 64] };
        assert_eq!(Handle::decode(&zero), None);
    }
}
