//! The virtual memory API: physical memory made by `cuMemCreate` with a device location is
//! charged to that device (not the current one) for as long as the driver keeps it.
//!
//! The driver frees a handle's memory only when it is released *and* its last mapping is
//! unmapped (`cuMemMap` holds a reference), so a handle released while still mapped here stays
//! charged until its last `cuMemUnmap`. A handle exported (`cuMemExportToShareableHandle`) may
//! be mapped by other processes too, which this process cannot see: its memory stays charged
//! here, to the slice that created it, until this process exits (never less than the driver
//! holds). Importing (`cuMemImportFromShareableHandle`) and mapping charge nothing: the memory
//! is its creator's. The bookkeeping of mappings and exports is behind one mutex: mapping and
//! exporting are not hot paths (each is a driver call of microseconds that changes page
//! tables), and `cuMemCreate`/`cuMemRelease` of a never-mapped handle do not take it.

use super::{charge_and_alloc, written};
use crate::log::log;
use crate::pointers::{self, Charge, Handle};
use gpuslice_abi::pfn;
use gpuslice_abi::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Mutex;

/// What this process maps and exported.
struct Maps {
    /// Mappings by address: (size, handle).
    at: BTreeMap<u64, (u64, u64)>,
    /// Mappings per handle.
    count: HashMap<u64, u32>,
    /// Handles released while still mapped here: their charge, returned at the last unmap.
    released: HashMap<u64, Charge>,
    /// Handles exported and not yet released.
    exported: HashSet<u64>,
}

static MAPS: Mutex<Option<Maps>> = Mutex::new(None);
/// Set once anything was mapped or exported: until then a release needs no lock.
static USED: AtomicBool = AtomicBool::new(false);

fn with_maps<T>(f: impl FnOnce(&mut Maps) -> T) -> T {
    let mut g = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Maps {
        at: BTreeMap::new(),
        count: HashMap::new(),
        released: HashMap::new(),
        exported: HashSet::new(),
    }))
}

/// `cuMemCreate`: physical memory for the virtual memory API; charged when the location is a
/// device.
pub unsafe fn mem_create(
    real: pfn::cuMemCreate,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(handle, size, prop, flags) };
    let st = ready!();
    if handle.is_null() || prop.is_null() || size == 0 {
        return pass();
    }
    // SAFETY: prop is non-null (checked above), the program's descriptor for the driver to read.
    let location = unsafe { (*prop).location };
    if location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return pass();
    }
    let Some(dev) = st.device(location.id) else {
        return pass();
    };
    // SAFETY: dev is the started state's; handle is non-null (checked above), the program's
    // out-pointer.
    unsafe {
        charge_and_alloc(dev, Handle::Vmm, size as u64, || {
            let r = pass();
            (r, written(r, handle).unwrap_or(0))
        })
    }
}

/// `cuMemRelease`: the charge goes back now only if the driver frees the memory now (not
/// mapped here, never exported).
pub unsafe fn mem_release(
    real: pfn::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let st = ready!();
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(handle) };
    let Some(c) = pointers::remove(Handle::Vmm, handle) else {
        return pass(); // imported, or made before start-up: charged to nobody here
    };
    let r = pass();
    if r != CUDA_SUCCESS {
        pointers::insert(Handle::Vmm, handle, c);
        return r;
    }
    let keep = USED.load(Acquire)
        && with_maps(|m| {
            if m.count.get(&handle).is_some_and(|&n| n > 0) {
                m.released.insert(handle, c);
                true
            } else {
                m.exported.remove(&handle)
            }
        });
    if keep {
        log!(
            Debug,
            "VMM handle {handle:#x} released while mapped or exported: its {} bytes stay charged",
            c.bytes
        );
    } else if let Some(dev) = st.device(c.device as CUdevice) {
        dev.account.uncharge(c.bytes);
    }
    r
}

/// `cuMemMap`: takes no memory; remembered so the charge of a released handle lasts until its
/// last mapping goes.
pub unsafe fn mem_map(
    real: pfn::cuMemMap,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(ptr, size, offset, handle, flags) };
    if r == CUDA_SUCCESS {
        USED.store(true, Release);
        with_maps(|m| {
            m.at.insert(ptr, (size as u64, handle));
            *m.count.entry(handle).or_insert(0) += 1;
        });
    }
    r
}

/// `cuMemUnmap`: a handle released earlier whose last mapping this was returns its charge
/// (unless it was exported).
pub unsafe fn mem_unmap(real: pfn::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(ptr, size) };
    if r != CUDA_SUCCESS || !USED.load(Acquire) {
        return r;
    }
    let Ok(st) = crate::init::state() else {
        return r;
    };
    let end = ptr.saturating_add(size as u64);
    let freed: Vec<Charge> = with_maps(|m| {
        let gone: Vec<u64> = m.at.range(ptr..end).map(|(&a, _)| a).collect();
        let mut freed = Vec::new();
        for a in gone {
            let Some((_, h)) = m.at.remove(&a) else {
                continue;
            };
            let n = m.count.entry(h).or_insert(1);
            *n -= 1;
            if *n == 0 {
                m.count.remove(&h);
                if let Some(c) = m.released.remove(&h) {
                    if !m.exported.remove(&h) {
                        freed.push(c);
                    }
                }
            }
        }
        freed
    });
    for c in freed {
        if let Some(dev) = st.device(c.device as CUdevice) {
            dev.account.uncharge(c.bytes);
        }
    }
    r
}

/// `cuMemExportToShareableHandle`: other processes may now map the memory; its charge stays
/// here until this process exits.
pub unsafe fn mem_export(
    real: pfn::cuMemExportToShareableHandle,
    out: *mut core::ffi::c_void,
    handle: CUmemGenericAllocationHandle,
    ty: CUmemAllocationHandleType,
    flags: u64,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(out, handle, ty, flags) };
    if r == CUDA_SUCCESS {
        USED.store(true, Release);
        with_maps(|m| m.exported.insert(handle));
    }
    r
}
