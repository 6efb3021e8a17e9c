//! The virtual memory API: physical memory made by `cuMemCreate` with a device location is
//! charged to that device (not the current one) for as long as the driver keeps it.
//!
//! The driver frees a handle's memory only when it is released *and* its last mapping is
//! unmapped (`cuMemMap` holds a reference), so a handle released while still mapped here stays
//! charged until its last `cuMemUnmap`; a reference `cuMemRetainAllocationHandle` added holds
//! it too, until its own `cuMemRelease` (counted per handle here). A handle exported as a POSIX
//! descriptor (`cuMemExportToShareableHandle`) may be imported and mapped by other processes,
//! which keep the memory alive past this process's release and exit: the export is registered
//! in the ledger (`Ledger::share_export`), importers register on it when they import and leave
//! when their last handle and mapping of it go, and the charge stays on this process's slice
//! until the last of them let go (`gpuslice_ledger`'s `shared.rs`; the reaper does the same for
//! the dead; in node mode the monitor keeps the records, asked over `monitor.sock`:
//! `shared.rs`). An export nobody imported yet, one of another handle type and one the table
//! has no room for stay charged here until this process exits (never less than the driver
//! holds). Importing and mapping charge the importer nothing: the memory is its creator's, as
//! long as someone is charged for it. A descriptor imported after everyone let go of the memory
//! (its exporter exited, say: the descriptor keeps the driver's memory alive) is an *orphan*:
//! the importer is charged for it as if it had allocated it (refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` over its quota) and becomes the export's exporter. The
//! bookkeeping of mappings, exports and imports is behind one mutex: mapping, exporting and
//! importing are not hot paths (each is a driver call of microseconds that changes page
//! tables), and `cuMemCreate`/`cuMemRelease` of a handle never mapped, exported or imported do
//! not take it; the ledger's lock is never taken under it.

use super::{charge_and_alloc, oom, record, written};
use crate::init::State;
use crate::log::log;
use crate::pointers::{self, Charge, Handle};
use gpuslice_abi::pfn;
use gpuslice_abi::*;
use gpuslice_ledger::{Import, LetGo};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Mutex;

/// What this process maps, exported and imported.
struct Maps {
    /// Mappings by address: (size, handle).
    at: BTreeMap<u64, (u64, u64)>,
    /// Mappings per handle.
    count: HashMap<u64, u32>,
    /// Handles released while still mapped here: their charge, returned at the last unmap.
    released: HashMap<u64, Charge>,
    /// Handles exported and not yet let go: the ledger's record of the export (`None`: not
    /// registered, charged here until this process exits).
    exported: HashMap<u64, Option<usize>>,
    /// Imported handles: the ledger's record of the export, and whether released.
    imported: HashMap<u64, (usize, bool)>,
    /// References `cuMemRetainAllocationHandle` added and no `cuMemRelease` took back yet:
    /// while a handle has any, the driver keeps its memory whatever else is released or
    /// unmapped.
    retained: HashMap<u64, u32>,
}

/// What happens to a charge once the driver would free the memory in this process.
enum Gone {
    /// Still held here (mapped): nothing yet.
    Held,
    /// Never exported: uncharge.
    Free(Charge),
    /// Exported: the ledger decides (`record` `None`: kept until exit).
    Exported(Option<usize>, Charge),
}

static MAPS: Mutex<Option<Maps>> = Mutex::new(None);
/// Set once anything was mapped, exported or imported: until then a release needs no lock.
static USED: AtomicBool = AtomicBool::new(false);

fn with_maps<T>(f: impl FnOnce(&mut Maps) -> T) -> T {
    let mut g = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Maps {
        at: BTreeMap::new(),
        count: HashMap::new(),
        released: HashMap::new(),
        exported: HashMap::new(),
        imported: HashMap::new(),
        retained: HashMap::new(),
    }))
}

impl Maps {
    /// The charge of a handle whose last reference here went (released, unmapped).
    fn gone(&mut self, h: u64, c: Charge) -> Gone {
        match self.exported.remove(&h) {
            Some(rec) => Gone::Exported(rec, c),
            None => Gone::Free(c),
        }
    }

    /// Handle `h` has no mapping and no retained reference left here: the charge a release
    /// left held, and the record an import released earlier leaves.
    fn unheld(&mut self, h: u64) -> (Option<Gone>, Option<usize>) {
        let gone = self.released.remove(&h).map(|c| self.gone(h, c));
        let released = self.imported.get(&h).is_some_and(|e| e.1);
        (gone, if released { self.import_gone(h) } else { None })
    }

    /// Take back one retained reference of `h`: whether it had one.
    fn unretain(&mut self, h: u64) -> bool {
        let Some(n) = self.retained.get_mut(&h) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            self.retained.remove(&h);
        }
        true
    }

    /// An imported handle's last reference here went: the record this process no longer
    /// holds any handle of (`None`: it still holds another).
    fn import_gone(&mut self, h: u64) -> Option<usize> {
        let (rec, _) = self.imported.remove(&h)?;
        (!self.imported.values().any(|&(r, _)| r == rec)).then_some(rec)
    }
}

/// Settle a charge whose memory the driver no longer holds for this process.
fn settle(st: &State, g: Gone) {
    let c = match g {
        Gone::Held => return,
        Gone::Free(c) => c,
        Gone::Exported(rec, c) => {
            let what = rec.map_or(LetGo::Keep, |rec| super::shared::let_go(st, rec));
            match what {
                LetGo::Uncharge => c,
                LetGo::HandedOver => {
                    log!(
                        Debug,
                        "exported VMM allocation let go while an importer holds it: its {} \
                         bytes stay charged to this slice until the last importer lets go",
                        c.bytes
                    );
                    return;
                }
                LetGo::Keep => {
                    log!(
                        Debug,
                        "exported VMM allocation let go: its {} bytes stay charged until this \
                         process exits",
                        c.bytes
                    );
                    return;
                }
            }
        }
    };
    if let Some(dev) = st.device(c.device as CUdevice) {
        dev.account.uncharge(c.bytes);
    }
}

/// This process let go of its last handle and mapping of an imported allocation.
fn leave(st: &State, rec: Option<usize>) {
    if let Some(rec) = rec {
        super::shared::leave(st, rec);
    }
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
/// mapped here, and no importer holds it if it was exported).
pub unsafe fn mem_release(
    real: pfn::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let st = ready!();
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(handle) };
    // A reference cuMemRetainAllocationHandle added: the driver counts references, not which
    // is which, so this release takes back a retained one and the handle's own stays.
    if USED.load(Acquire) && with_maps(|m| m.unretain(handle)) {
        let r = pass();
        if r != CUDA_SUCCESS {
            with_maps(|m| *m.retained.entry(handle).or_insert(0) += 1);
            return r;
        }
        // The last retained reference of a handle released and unmapped before: now the
        // driver lets go of it.
        let (gone, left) = with_maps(|m| {
            let held = m.count.contains_key(&handle) || m.retained.contains_key(&handle);
            if held {
                (None, None)
            } else {
                m.unheld(handle)
            }
        });
        if let Some(g) = gone {
            settle(st, g);
        }
        leave(st, left);
        return r;
    }
    let Some(c) = pointers::remove(Handle::Vmm, handle) else {
        // Imported, or made before start-up: charged to nobody here.
        let r = pass();
        if r == CUDA_SUCCESS && USED.load(Acquire) {
            let left = with_maps(|m| {
                let mapped = m.count.get(&handle).is_some_and(|&n| n > 0);
                match m.imported.get_mut(&handle) {
                    Some(e) if mapped => {
                        e.1 = true;
                        None
                    }
                    Some(_) => m.import_gone(handle),
                    None => None,
                }
            });
            leave(st, left);
        }
        return r;
    };
    let r = pass();
    if r != CUDA_SUCCESS {
        pointers::insert(Handle::Vmm, handle, c);
        return r;
    }
    let gone = if USED.load(Acquire) {
        with_maps(|m| {
            if m.count.get(&handle).is_some_and(|&n| n > 0) {
                m.released.insert(handle, c);
                Gone::Held
            } else {
                m.gone(handle, c)
            }
        })
    } else {
        Gone::Free(c)
    };
    settle(st, gone);
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

/// `cuMemUnmap`: a handle released earlier whose last mapping this was returns its charge (an
/// exported one as the ledger says), or, imported, leaves its export's record.
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
    let (gone, left) = with_maps(|m| {
        let unmapped: Vec<u64> = m.at.range(ptr..end).map(|(&a, _)| a).collect();
        let (mut gone, mut left) = (Vec::new(), Vec::new());
        for a in unmapped {
            let Some((_, h)) = m.at.remove(&a) else {
                continue;
            };
            let n = m.count.entry(h).or_insert(1);
            *n -= 1;
            if *n != 0 {
                continue;
            }
            m.count.remove(&h);
            if m.retained.contains_key(&h) {
                continue; // a retained reference still holds it: its release settles
            }
            let (g, l) = m.unheld(h);
            gone.extend(g);
            left.push(l);
        }
        (gone, left)
    });
    for g in gone {
        settle(st, g);
    }
    for rec in left {
        leave(st, rec);
    }
    r
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, with one more reference the
/// program must release. Counted, so that neither the handle's own release nor its last
/// unmap returns a charge (or leaves an import) while this reference still holds the memory,
/// and its release is not taken for the handle's own.
pub unsafe fn mem_retain(
    real: pfn::cuMemRetainAllocationHandle,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut core::ffi::c_void,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(handle, addr) };
    if r == CUDA_SUCCESS && !handle.is_null() {
        // SAFETY: the program's out-pointer, non-null (checked), written by the driver
        // (success).
        let h = unsafe { *handle };
        USED.store(true, Release);
        with_maps(|m| *m.retained.entry(h).or_insert(0) += 1);
    }
    r
}

/// `cuMemExportToShareableHandle`: other processes may now map the memory. A POSIX descriptor
/// of memory charged here is registered in the ledger, so the charge stays on this slice until
/// the last importer lets go, past this process's release and exit; any other export stays
/// charged here until this process exits.
pub unsafe fn mem_export(
    real: pfn::cuMemExportToShareableHandle,
    out: *mut core::ffi::c_void,
    handle: CUmemGenericAllocationHandle,
    ty: CUmemAllocationHandleType,
    flags: u64,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(out, handle, ty, flags) };
    if r != CUDA_SUCCESS {
        return r;
    }
    USED.store(true, Release);
    let rec = match (crate::init::state(), pointers::get(Handle::Vmm, handle)) {
        (Ok(st), Some(c)) if ty == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && !out.is_null() => {
            // SAFETY: for a POSIX descriptor the driver wrote an `int` to `out` (non-null,
            // checked), the program's out-pointer; read after success only.
            let fd = unsafe { *out.cast::<core::ffi::c_int>() };
            register_export(st, fd, c)
        }
        _ => None,
    };
    with_maps(|m| m.exported.insert(handle, rec));
    r
}

/// The record of an export of `c` as descriptor `fd` (`None`: not registered).
fn register_export(st: &State, fd: core::ffi::c_int, c: Charge) -> Option<usize> {
    let dev = st.device(c.device as CUdevice)?;
    super::shared::export(st, dev, fd, c.bytes)
}

/// `cuMemImportFromShareableHandle`: charges nothing when someone is charged for the memory;
/// an import of a POSIX descriptor registered by its exporter keeps the exporter's slice
/// charged while this process holds a handle or mapping of it. Registered before the driver
/// call, so an exporter that lets go or dies meanwhile finds the importer already there. An
/// orphan (nobody charged for it any more) is charged here: [`import_orphan`].
pub unsafe fn mem_import(
    real: pfn::cuMemImportFromShareableHandle,
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut core::ffi::c_void,
    ty: CUmemAllocationHandleType,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(handle, os_handle, ty) };
    let st = match crate::init::state() {
        Ok(st) if ty == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && !handle.is_null() => st,
        _ => return pass(),
    };
    // A POSIX descriptor travels as the pointer's value (cuda.h: `(void *)(uintptr_t) fd`).
    let rec = match super::shared::import(st, os_handle as usize as core::ffi::c_int) {
        Import::Held(rec) => Some(rec),
        Import::Unknown => None,
        // SAFETY: the handler contract; handle is non-null (checked).
        orphan => return unsafe { import_orphan(st, pass, handle, orphan) },
    };
    let r = pass();
    match rec {
        Some(rec) if r == CUDA_SUCCESS => {
            // SAFETY: handle is non-null (checked) and the driver wrote it (success).
            let h = unsafe { *handle };
            USED.store(true, Release);
            with_maps(|m| m.imported.insert(h, (rec, false)));
        }
        Some(rec) if !with_maps(|m| m.imported.values().any(|&(x, _)| x == rec)) => {
            leave(st, Some(rec)); // the driver refused, and no other handle holds it
        }
        _ => {}
    }
    r
}

/// Import an orphan, as the ledger (or the monitor) answered: adopted (charged there, under
/// its lock; this process is the record's exporter now, and lets go of it as one, also when
/// the driver refuses), refused over the quota (`CUDA_ERROR_OUT_OF_MEMORY` without calling
/// the driver, as an allocation), or to be charged here as an allocation of this handle
/// (an account that keeps no record).
///
/// # Safety
/// `handle` is non-null, the program's out-pointer; `pass` is the driver's import.
unsafe fn import_orphan(
    st: &State,
    pass: impl Fn() -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    found: Import,
) -> CUresult {
    let (dev, bytes) = match found {
        Import::Adopted { dev, bytes, .. }
        | Import::Refused { dev, bytes }
        | Import::Charge { dev, bytes } => (dev, bytes),
        Import::Held(_) | Import::Unknown => return pass(),
    };
    // The ledger charges only an account this process joined, which has its state here.
    let Some(d) = st.devices.iter().find(|d| d.ledger_dev == dev) else {
        log!(
            Warn,
            "imported VMM allocation of {bytes} bytes on a device this process does not use: \
             {}",
            if matches!(found, Import::Adopted { .. }) {
                "charged until this process exits"
            } else {
                "charged to no slice"
            }
        );
        return pass();
    };
    let alloc = || {
        let r = pass();
        // SAFETY: handle is non-null (this function's contract), read after success only.
        let h = unsafe { written(r, handle) };
        (r, h.unwrap_or(0))
    };
    match found {
        Import::Adopted { rec, .. } => {
            let c = Charge::new(bytes, d, 0);
            let (r, h) = alloc();
            if r != CUDA_SUCCESS {
                settle(st, Gone::Exported(Some(rec), c));
                return r;
            }
            USED.store(true, Release);
            record(Handle::Vmm, h, c);
            with_maps(|m| m.exported.insert(h, Some(rec)));
            CUDA_SUCCESS
        }
        // SAFETY: d is a device of the started state.
        Import::Charge { .. } => unsafe { charge_and_alloc(d, Handle::Vmm, bytes, alloc) },
        _ => oom(d, bytes),
    }
}
