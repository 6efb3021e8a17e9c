//! Virtual memory management: `cuMemCreate` handles are memfds, counted on their device,
//! mapped (`cuMemMap`) into `PROT_NONE` reservations (`cuMemAddressReserve`), shared between
//! processes as POSIX fds; a handle's memory goes back when it is released *and* unmapped,
//! in every process that imported it (an exported handle is in the node-wide table of
//! [`super::shared_mem`], which keeps it counted to its creator until then). Apart because
//! VMM memory is never a registered range: handles and mappings are its own.

use super::ranges::unmap;
use super::shared_mem::{inode, VMM_KEY};
use crate::runtime::{rt, rt_unchecked, CuResult};
use gpuslice_abi::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

/// VMM allocation granularity, as on current GPUs.
pub const GRANULARITY: u64 = 2 << 20;

/// A physical allocation (`CUmemGenericAllocationHandle`): its memfd and where it is counted.
struct Phys {
    fd: i32,
    size: u64,
    dev: usize,
    maps: usize,
    /// cuMemCreate/cuMemImportFromShareableHandle and cuMemRetainAllocationHandle references
    /// not yet released.
    refs: u32,
    /// Whether this handle counted the memory on the device (an imported one did not: its
    /// exporter did).
    counted: bool,
    /// Its key in the node-wide table once exported or imported (0: never shared); the
    /// table then returns the memory when its last holder lets go.
    shared: u64,
    prop: CUmemAllocationProp,
}

// SAFETY: the prop's one pointer (win32HandleMetaData) is never dereferenced.
unsafe impl Send for Phys {}

static HANDLES: Mutex<Option<HashMap<u64, Phys>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
/// Mapped ranges by start address: (size, handle).
static MAPPINGS: Mutex<BTreeMap<u64, (u64, u64)>> = Mutex::new(BTreeMap::new());

fn with_handles<T>(f: impl FnOnce(&mut HashMap<u64, Phys>) -> T) -> T {
    let mut g = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// `cuMemCreate`.
pub fn vmm_create(size: u64, prop: &CUmemAllocationProp) -> CuResult<u64> {
    let r = rt()?;
    if size == 0
        || !size.is_multiple_of(GRANULARITY)
        || prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = usize::try_from(prop.location.id)
        .ok()
        .filter(|&d| d < r.devices.len())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let p = r.devices[dev].phys;
    if !r.node.reserve_or_reap(p, size) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: memfd_create with a static name; the fd is checked and owned by the handle.
    let fd = unsafe { libc::memfd_create(c"fakegpu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: sizing the memfd we just created.
    if fd < 0 || unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        r.node.unreserve(p, size);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(new_handle(fd, size, dev, true, *prop))
}

/// A new handle on memfd `fd` (which it owns), with one reference and no mapping.
fn new_handle(fd: i32, size: u64, dev: usize, counted: bool, prop: CUmemAllocationProp) -> u64 {
    let h = NEXT_HANDLE.fetch_add(1, Relaxed);
    with_handles(|m| {
        m.insert(
            h,
            Phys {
                fd,
                size,
                dev,
                maps: 0,
                refs: 1,
                counted,
                shared: 0,
                prop,
            },
        )
    });
    h
}

fn drop_phys_if_done(m: &mut HashMap<u64, Phys>, h: u64) {
    if m.get(&h).is_some_and(|p| p.refs == 0 && p.maps == 0) {
        let p = m.remove(&h).expect("present");
        // SAFETY: closing the memfd this handle owned.
        unsafe { libc::close(p.fd) };
        if p.shared != 0 {
            super::shared_mem::leave(p.shared);
        } else if p.counted {
            let r = rt_unchecked();
            r.node.unreserve(r.devices[p.dev].phys, p.size);
        }
    }
}

/// The allocation of handle `h` while the program still holds it (not released), or
/// `CUDA_ERROR_INVALID_VALUE`.
fn held(m: &mut HashMap<u64, Phys>, h: u64) -> CuResult<&mut Phys> {
    m.get_mut(&h)
        .filter(|p| p.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// `cuMemRelease`: the memory goes when its last mapping does.
pub fn vmm_release(h: u64) -> CuResult<()> {
    rt()?;
    with_handles(|m| {
        held(m, h)?.refs -= 1;
        drop_phys_if_done(m, h);
        Ok(())
    })
}

/// `cuMemExportToShareableHandle`: a POSIX fd of the allocation (a dup of its memfd), if it
/// was created asking for that handle type, as the driver requires.
pub fn vmm_export(h: u64, ty: CUmemAllocationHandleType) -> CuResult<i32> {
    rt()?;
    with_handles(|m| {
        let p = held(m, h)?;
        if ty != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            || p.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if p.shared == 0 && p.counted {
            let ino = inode(p.fd).ok_or(CUDA_ERROR_OPERATING_SYSTEM)?;
            let phys = rt_unchecked().devices[p.dev].phys;
            // Without the node-wide table (a state directory another user made) the fd still
            // works; the memory is then counted only while this process holds it.
            p.shared = super::shared_mem::share(Some(VMM_KEY | ino), phys, p.size).unwrap_or(0);
        }
        // SAFETY: duplicating the memfd this handle owns; the caller owns the copy.
        let fd = unsafe { libc::dup(p.fd) };
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(fd)
    })
}

/// `cuMemImportFromShareableHandle`: a handle to memory another handle (maybe in another
/// process) exported. The memory stays counted to its exporter, until this handle too is
/// released and unmapped.
pub fn vmm_import(fd: i32, ty: CUmemAllocationHandleType) -> CuResult<u64> {
    rt()?;
    if ty != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: libc::stat is a plain C struct; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a valid local stat; a bad fd is an error return, not UB.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: our own copy of the caller's fd, owned by the new handle.
    let own = unsafe { libc::dup(fd) };
    if own < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    };
    let key = VMM_KEY | st.st_ino;
    let r = rt_unchecked();
    let (size, dev, shared) = match super::shared_mem::join(key, false) {
        Ok(j) => {
            let dev = r.devices.iter().position(|d| d.phys == j.phys).unwrap_or(0);
            // The table is anyone's to write: never more than the memfd holds.
            (j.size.min(st.st_size as u64), dev, key)
        }
        // Not exported through cuMemExportToShareableHandle (or its holders are all gone).
        Err(_) => (st.st_size as u64, 0, 0),
    };
    let prop = CUmemAllocationProp {
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev as i32,
        },
        ..prop
    };
    let h = new_handle(own, size, dev, false, prop);
    with_handles(|m| m.get_mut(&h).map(|p| p.shared = shared));
    Ok(h)
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `ptr`, with one more reference.
pub fn vmm_retain(ptr: u64) -> CuResult<u64> {
    rt()?;
    let (_, _, h) = mapping_at(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    with_handles(|m| {
        let p = m.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs += 1;
        Ok(h)
    })
}

/// `cuMemGetAllocationPropertiesFromHandle`.
pub fn vmm_properties(h: u64) -> CuResult<CUmemAllocationProp> {
    rt()?;
    with_handles(|m| m.get(&h).map(|p| p.prop).ok_or(CUDA_ERROR_INVALID_VALUE))
}

/// `cuMemAddressReserve`.
pub fn vmm_reserve(size: u64, align: u64) -> CuResult<u64> {
    rt()?;
    if size == 0 || !size.is_multiple_of(GRANULARITY) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let align = align.max(GRANULARITY);
    let len = (size + align) as usize;
    // SAFETY: a fresh PROT_NONE reservation; the unaligned head and tail are unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let base = p as u64;
    let start = base.div_ceil(align) * align;
    if start > base {
        unmap(base, (start - base) as usize);
    }
    let tail = base + len as u64 - (start + size);
    if tail > 0 {
        unmap(start + size, tail as usize);
    }
    Ok(start)
}

/// `cuMemAddressFree`.
pub fn vmm_address_free(ptr: u64, size: u64) -> CuResult<()> {
    rt()?;
    if ptr == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    unmap(ptr, size as usize);
    Ok(())
}

/// `cuMemMap`.
pub fn vmm_map(ptr: u64, size: u64, offset: u64, h: u64) -> CuResult<()> {
    rt()?;
    with_handles(|m| {
        let p = m.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if size == 0
            || offset.checked_add(size).is_none_or(|e| e > p.size)
            || !ptr.is_multiple_of(GRANULARITY)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: replaces part of a reservation the client made with cuMemAddressReserve by
        // the handle's memfd; access stays PROT_NONE until cuMemSetAccess.
        let r = unsafe {
            libc::mmap(
                ptr as *mut libc::c_void,
                size as usize,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                p.fd,
                offset as libc::off_t,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.maps += 1;
        MAPPINGS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr, (size, h));
        Ok(())
    })
}

/// `cuMemSetAccess`.
pub fn vmm_set_access(ptr: u64, size: u64, flags: CUmemAccess_flags) -> CuResult<()> {
    rt()?;
    let prot = match flags {
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE => libc::PROT_READ | libc::PROT_WRITE,
        CU_MEM_ACCESS_FLAGS_PROT_READ => libc::PROT_READ,
        _ => libc::PROT_NONE,
    };
    // SAFETY: changes protection of mapped VMM ranges the client names.
    if unsafe { libc::mprotect(ptr as *mut libc::c_void, size as usize, prot) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuMemUnmap`.
pub fn vmm_unmap(ptr: u64, size: u64) -> CuResult<()> {
    rt()?;
    let gone: Vec<(u64, (u64, u64))> = {
        let mut g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<u64> = g.range(ptr..ptr + size).map(|(&k, _)| k).collect();
        keys.into_iter()
            .filter_map(|k| g.remove(&k).map(|v| (k, v)))
            .collect()
    };
    if gone.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: puts the PROT_NONE reservation back over the unmapped range.
    unsafe {
        libc::mmap(
            ptr as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
    with_handles(|m| {
        for (_, (_, h)) in gone {
            if let Some(p) = m.get_mut(&h) {
                p.maps = p.maps.saturating_sub(1);
            }
            drop_phys_if_done(m, h);
        }
    });
    Ok(())
}

/// The VMM mapping containing `ptr`: (start, size).
pub fn vmm_lookup(ptr: u64) -> Option<(u64, u64)> {
    mapping_at(ptr).map(|(s, len, _)| (s, len))
}

/// Whether `ptr..ptr+len` lies in VMM mappings end to end (a range the program reserved once
/// and mapped piece by piece, as PyTorch's expandable segments do, is copied as one).
pub fn vmm_covers(ptr: u64, len: u64) -> bool {
    let end = ptr.saturating_add(len);
    let g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    let Some((&s, &(n, _))) = g.range(..=ptr).next_back() else {
        return false;
    };
    let mut covered = s + n;
    if ptr >= covered {
        return false;
    }
    for (&s, &(n, _)) in g.range(ptr + 1..end) {
        if s != covered {
            return false;
        }
        covered = s + n;
    }
    covered >= end
}

/// The mapping containing `ptr`: (start, size, handle).
fn mapping_at(ptr: u64) -> Option<(u64, u64, u64)> {
    let g = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    let (&s, &(len, h)) = g.range(..=ptr).next_back()?;
    (ptr < s + len).then_some((s, len, h))
}
