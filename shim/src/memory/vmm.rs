//! The virtual memory API: physical memory made by `cuMemCreate` with a device location is
//! charged to that device (not the current one) until `cuMemRelease`. Mapping and unmapping
//! (`cuMemMap`, `cuMemUnmap`) take no memory and pass through.

use super::{charge_and_alloc, free_and_uncharge};
use crate::hooks::pfn;
use crate::pointers::Kind;
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
    let st = ready!();
    if handle.is_null()
        || prop.is_null()
        || size == 0
        || (*prop).location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return real(handle, size, prop, flags);
    }
    let Some(dev) = st.device((*prop).location.id) else {
        return real(handle, size, prop, flags);
    };
    charge_and_alloc(dev, Kind::Vmm, size as u64, 0, || {
        (real(handle, size, prop, flags), *handle)
    })
}

/// `cuMemRelease`.
pub unsafe fn mem_release(
    real: pfn::cuMemRelease,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let st = ready!();
    free_and_uncharge(st, Kind::Vmm, handle, || real(handle))
}
