//! The process lists (compute v1/v2/v3, graphics and MPS, the detail list) and accounting
//! (pids and stats): only the slice's live processes, in NVML's count protocol. Apart because
//! these are the answers that filter neighbours out, and they share one protocol.

use super::place::{answer_or_pass, with_slice_processes};
use core::ffi::{c_uint, c_void};
use core::mem::size_of;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// `nvmlProcessInfo_v1_t`, what the unversioned process queries fill.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// The element types of NVML's process arrays, as the hooked functions' header types them.
pub trait ProcessEntry {
    /// Store entry `k`: the member's pid as the caller sees it and its bytes.
    ///
    /// # Safety
    /// `infos` holds more than `k` entries of the query's layout (the caller's count,
    /// checked by `running_processes`).
    unsafe fn put(infos: *mut Self, k: usize, pid: u32, bytes: u64);
}

/// The unversioned lists, whose header types leave the array untyped: `nvmlProcessInfo_v1_t`.
impl ProcessEntry for c_void {
    unsafe fn put(infos: *mut c_void, k: usize, pid: u32, bytes: u64) {
        let e = ProcessInfoV1 {
            pid,
            used_gpu_memory: bytes,
        };
        // SAFETY: entry k is inside the program's array (this function's contract); unaligned
        // writes ask nothing of the program's alignment.
        unsafe { infos.cast::<ProcessInfoV1>().add(k).write_unaligned(e) };
    }
}

/// The `_v2`/`_v3` lists (one layout).
impl ProcessEntry for nvmlProcessInfo_t {
    unsafe fn put(infos: *mut nvmlProcessInfo_t, k: usize, pid: u32, bytes: u64) {
        let e = nvmlProcessInfo_t {
            pid,
            usedGpuMemory: bytes,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        };
        // SAFETY: as for the v1 entries.
        unsafe { infos.add(k).write_unaligned(e) };
    }
}

/// The accounting pids: a bare pid.
impl ProcessEntry for c_uint {
    unsafe fn put(infos: *mut c_uint, k: usize, pid: u32, _bytes: u64) {
        // SAFETY: as for the v1 entries.
        unsafe { infos.add(k).write_unaligned(pid) };
    }
}

/// What a process query lists inside a slice.
#[derive(Clone, Copy, PartialEq)]
enum Listing {
    /// The slice's processes (compute lists).
    Slice,
    /// Nothing (graphics and MPS lists: slices hold CUDA processes, which the compute lists
    /// show; a neighbour is never shown).
    Nothing,
    /// The slice's processes, while NVML has accounting on (else NVML's own refusal).
    Accounting,
}

/// One process query with NVML's count protocol: `*count` in is the room in `infos`, out the
/// number listed; too little room is `NVML_ERROR_INSUFFICIENT_SIZE` with the number needed.
///
/// # Safety
/// The handler contract for the query `real` is: `count` is null or the program's in/out
/// count, `infos` null or an array of `*count` entries.
unsafe fn running_processes<E: ProcessEntry>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut E) -> NvmlReturn,
    listing: Listing,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut E,
) -> u32 {
    // SAFETY: NVML's query with the program's arguments (this function's contract).
    let pass = || unsafe { real(dev, count, infos) };
    if count.is_null() {
        return pass();
    }
    // SAFETY: count is non-null (checked above), the program's in/out count.
    let cap = unsafe { *count } as usize;
    let answer = with_slice_processes(dev, |list| {
        if listing == Listing::Accounting {
            // Whether NVML keeps accounting on this device at all: it says by its answer to
            // a count query (off or unsupported: its refusal stands).
            let mut n: c_uint = 0;
            // SAFETY: NVML's query with a count of our own and no array.
            let r = unsafe { real(dev, &mut n, core::ptr::null_mut()) };
            if r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE {
                return (r, None);
            }
        }
        let list = if listing == Listing::Nothing {
            &[][..]
        } else {
            list
        };
        if list.len() > cap {
            return (NVML_ERROR_INSUFFICIENT_SIZE, Some(list.len()));
        }
        if !list.is_empty() && infos.is_null() {
            return (NVML_ERROR_INVALID_ARGUMENT, None);
        }
        for (k, m) in list.iter().enumerate() {
            // SAFETY: the caller's array holds cap ≥ list.len() entries.
            unsafe { E::put(infos, k, m.pid, m.bytes) };
        }
        (NVML_SUCCESS, Some(list.len()))
    });
    answer_or_pass(answer, pass, |n| {
        // SAFETY: as above: the program's non-null count, valid for writes.
        unsafe { *count = n as c_uint };
    })
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 entries), `_v2` and `_v3`.
pub unsafe fn compute_processes<E: ProcessEntry>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut E) -> NvmlReturn,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut E,
) -> u32 {
    // SAFETY: the handler contract; E is this query's entry layout (its header type).
    unsafe { running_processes(real, Listing::Slice, dev, count, infos) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses*` and `nvmlDeviceGetMPSComputeRunningProcesses*`:
/// none inside a slice.
pub unsafe fn unlisted_processes<E: ProcessEntry>(
    real: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut E) -> NvmlReturn,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut E,
) -> u32 {
    // SAFETY: the handler contract; E is this query's entry layout (its header type).
    unsafe { running_processes(real, Listing::Nothing, dev, count, infos) }
}

/// `nvmlDeviceGetAccountingPids`: the slice's processes.
pub unsafe fn accounting_pids(
    real: pfn::nvmlDeviceGetAccountingPids,
    dev: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> u32 {
    // SAFETY: the handler contract; the array holds pids.
    unsafe { running_processes(real, Listing::Accounting, dev, count, pids) }
}

/// `nvmlDeviceGetAccountingStats`: inside a slice, only for its own processes (pids as the
/// caller sees them, asked of NVML by the pid it knows).
pub unsafe fn accounting_stats(
    real: pfn::nvmlDeviceGetAccountingStats,
    dev: nvmlDevice_t,
    pid: c_uint,
    stats: *mut c_void,
) -> u32 {
    let answer = with_slice_processes(dev, |list| {
        list.iter().find(|m| m.pid == pid).and_then(|m| m.nvml_pid)
    });
    match answer {
        // SAFETY: the handler contract: `real` with the program's arguments.
        None => unsafe { real(dev, pid, stats) },
        // SAFETY: as above, with the member's pid as NVML knows it.
        Some(Some(nvml_pid)) => unsafe { real(dev, nvml_pid, stats) },
        // A neighbour, a process gone, or one NVML could not be asked about by its pid.
        Some(None) => NVML_ERROR_NOT_FOUND,
    }
}

/// `nvmlProcessDetailList_v1_t`.
#[repr(C)]
struct ProcessDetailList {
    version: c_uint,
    mode: c_uint,
    num_proc_array_entries: c_uint,
    proc_array: *mut ProcessDetail,
}

/// `nvmlProcessDetail_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessDetail {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
    used_gpu_cc_protected_memory: u64,
}

/// `nvmlProcessDetailList_v1`: the struct's size with the version in the top byte.
const PROCESS_DETAIL_LIST_V1: c_uint = size_of::<ProcessDetailList>() as c_uint | (1 << 24);
/// `NVML_PROCESS_MODE_COMPUTE`; graphics (1) and MPS (2) list nothing inside a slice.
const PROCESS_MODE_COMPUTE: c_uint = 0;
const PROCESS_MODE_MPS: c_uint = 2;

/// `nvmlDeviceGetRunningProcessDetailList`: the v1 list, with the same count protocol
/// (`numProcArrayEntries` in and out). Inside a slice a version this shim does not know is
/// refused (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH`) rather than passed through unfiltered.
pub unsafe fn process_detail_list(
    real: pfn::nvmlDeviceGetRunningProcessDetailList,
    dev: nvmlDevice_t,
    plist: *mut c_void,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dev, plist) };
    let list = plist.cast::<ProcessDetailList>();
    if list.is_null() {
        return pass();
    }
    // SAFETY: list is non-null (checked above): the program's struct, whose first fields
    // (version, mode, count, array) every version shares.
    let (version, mode, cap, array) = unsafe {
        (
            (*list).version,
            (*list).mode,
            (*list).num_proc_array_entries as usize,
            (*list).proc_array,
        )
    };
    let answer = with_slice_processes(dev, |procs| {
        if version != PROCESS_DETAIL_LIST_V1 {
            return (NVML_ERROR_ARGUMENT_VERSION_MISMATCH, None);
        }
        let procs = match mode {
            PROCESS_MODE_COMPUTE => procs,
            1..=PROCESS_MODE_MPS => &[][..],
            _ => return (NVML_ERROR_INVALID_ARGUMENT, None),
        };
        if procs.len() > cap || (!procs.is_empty() && array.is_null()) {
            return (NVML_ERROR_INSUFFICIENT_SIZE, Some(procs.len()));
        }
        for (k, m) in procs.iter().enumerate() {
            let d = ProcessDetail {
                pid: m.pid,
                used_gpu_memory: m.bytes,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
                used_gpu_cc_protected_memory: 0,
            };
            // SAFETY: the caller's array holds cap ≥ procs.len() entries.
            unsafe { array.add(k).write_unaligned(d) };
        }
        (NVML_SUCCESS, Some(procs.len()))
    });
    answer_or_pass(answer, pass, |n| {
        // SAFETY: the program's non-null struct (checked above), valid for writes.
        unsafe { (*list).num_proc_array_entries = n as c_uint };
    })
}
