//! The virtual memory API: physical memory made by `cuMemCreate` with a device location is
//! charged to that device (not the current one) until `cuMemRelease`. Mapping and unmapping
//! (`cuMemMap`, `cuMemUnmap`) take no memory and pass through.

use super::{charge_and_alloc, free_and_uncharge, written};
use crate::pointers::Handle;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

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

/// `cuMemRelease`.
pub unsafe fn mem_release(
    real: pfn::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let st = ready!();
    // SAFETY: the handler contract: `real` with the program's arguments.
    free_and_uncharge(st, Handle::Vmm, handle, || unsafe { real(handle) })
}
