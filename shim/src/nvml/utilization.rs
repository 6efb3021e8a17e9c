//! Utilisation (`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetProcessUtilization`,
//! `nvmlDeviceGetProcessesUtilizationInfo`): the slice's own `compute_used`, per-process
//! samples only of its processes. Apart because its figures come from the scheduler's
//! statistics, not from the memory accounts.

use super::place::{answer_or_pass, corrected, with_place, with_slice_processes, Place};
use core::ffi::{c_uint, c_void};
use core::mem::size_of;
use gpuslice_abi::pfn;
use gpuslice_abi::*;

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessUtilizationSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// The slice's compute figures on `dev`: (its used fraction, the device's), `None` outside.
fn slice_compute(dev: nvmlDevice_t) -> Option<(f64, f64)> {
    with_place(dev, 0, |c| match (c.place, c.view) {
        (Place::Outside { .. }, _) => None,
        (
            Place::Inside {
                found: Some((ld, si)),
                ..
            },
            Some(v),
        ) => Some((
            v.slice(si).map_or(0.0, |s| s.compute_used),
            v.device(ld).map_or(0.0, |d| d.compute_used),
        )),
        (Place::Inside { .. }, _) => Some((0.0, 0.0)),
    })
    .flatten()
}

fn percent(f: f64) -> c_uint {
    (f.clamp(0.0, 1.0) * 100.0).round() as c_uint
}

/// `nvmlDeviceGetUtilizationRates`: the slice's share of the device's time; memory-controller
/// use is the device's, in the proportion of the slice's part of the device's GPU time.
pub unsafe fn utilization_rates(
    real: pfn::nvmlDeviceGetUtilizationRates,
    dev: nvmlDevice_t,
    util: *mut nvmlUtilization_t,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(dev, util) };
    // SAFETY: util is the program's struct, the one NVML's call `r` was given.
    unsafe {
        corrected(r, util, |util| {
            if let Some((mine, all)) = slice_compute(dev) {
                let mem = if all > 0.0 {
                    (util.memory as f64 * (mine / all).min(1.0)).round() as c_uint
                } else {
                    0
                };
                util.gpu = percent(mine);
                util.memory = mem.min(100);
            }
        })
    }
}

/// The slice's per-process utilisation samples on `dev`, newer than `last_seen` (µs since the
/// epoch): one per live process of the slice while the slice used the device over the
/// scheduler's window, the slice's share divided evenly between them (the ledger measures GPU
/// time per slice). Written with `write(k, pid, time stamp, sm %)` into a buffer of `cap`
/// entries (`ok`: the buffer is there). `(status, count)`: `NVML_ERROR_NOT_FOUND` (no samples:
/// an idle slice) with no count to store, `NVML_ERROR_INSUFFICIENT_SIZE` with the count
/// needed, or success with the count written. `None`: outside any slice.
fn utilization_samples(
    dev: nvmlDevice_t,
    last_seen: u64,
    cap: usize,
    ok: bool,
    mut write: impl FnMut(usize, u32, u64, c_uint),
) -> Option<(u32, Option<usize>)> {
    let (mine, _) = slice_compute(dev)?;
    let now_us = {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid out-parameter.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
    };
    let busy = percent(mine) > 0 && now_us > last_seen;
    let answer = with_slice_processes(dev, |list| {
        let n = if busy { list.len() } else { 0 };
        if n == 0 {
            return (NVML_ERROR_NOT_FOUND, None);
        }
        if !ok || cap < n {
            return (NVML_ERROR_INSUFFICIENT_SIZE, Some(n));
        }
        let each = percent(mine / n as f64);
        for (k, m) in list.iter().enumerate() {
            write(k, m.pid, now_us, each);
        }
        (NVML_SUCCESS, Some(n))
    });
    Some(answer.unwrap_or((NVML_ERROR_NOT_FOUND, None)))
}

/// `nvmlDeviceGetProcessUtilization` (see [`utilization_samples`]).
pub unsafe fn process_utilization(
    real: pfn::nvmlDeviceGetProcessUtilization,
    dev: nvmlDevice_t,
    samples: *mut c_void,
    count: *mut c_uint,
    last_seen: u64,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dev, samples, count, last_seen) };
    if count.is_null() {
        return pass();
    }
    // SAFETY: count is non-null (checked above), the program's in/out count.
    let cap = unsafe { *count } as usize;
    let out = samples.cast::<ProcessUtilizationSample>();
    let answer = utilization_samples(dev, last_seen, cap, !out.is_null(), |k, pid, ts, sm| {
        let s = ProcessUtilizationSample {
            pid,
            time_stamp: ts,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        };
        // SAFETY: the caller's buffer holds cap > k samples (checked by utilization_samples).
        unsafe { out.add(k).write_unaligned(s) };
    });
    answer_or_pass(answer, pass, |n| {
        // SAFETY: as above: the program's non-null count, valid for writes.
        unsafe { *count = n as c_uint };
    })
}

/// `nvmlProcessesUtilizationInfo_v1_t`.
#[repr(C)]
struct ProcessesUtilizationInfo {
    version: c_uint,
    process_samples_count: c_uint,
    last_seen_time_stamp: u64,
    proc_util_array: *mut ProcessUtilizationInfo,
}

/// `nvmlProcessUtilizationInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessUtilizationInfo {
    time_stamp: u64,
    pid: c_uint,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
    jpg_util: c_uint,
    ofa_util: c_uint,
}

/// `nvmlProcessesUtilizationInfo_v1`.
const PROCESSES_UTILIZATION_INFO_V1: c_uint =
    size_of::<ProcessesUtilizationInfo>() as c_uint | (1 << 24);

/// `nvmlDeviceGetProcessesUtilizationInfo` (the versioned form of the same samples). Inside a
/// slice a struct version this shim does not know is refused, never passed through.
pub unsafe fn processes_utilization_info(
    real: pfn::nvmlDeviceGetProcessesUtilizationInfo,
    dev: nvmlDevice_t,
    info: *mut c_void,
) -> u32 {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let pass = || unsafe { real(dev, info) };
    let p = info.cast::<ProcessesUtilizationInfo>();
    if p.is_null() {
        return pass();
    }
    if slice_compute(dev).is_none() {
        return pass();
    }
    // SAFETY: p is non-null (checked above), the program's struct; every version starts with
    // its version word.
    if unsafe { (*p).version } != PROCESSES_UTILIZATION_INFO_V1 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: p is non-null and, by its version, a v1 struct (checked above).
    let (cap, last, out) = unsafe {
        (
            (*p).process_samples_count as usize,
            (*p).last_seen_time_stamp,
            (*p).proc_util_array,
        )
    };
    let answer = utilization_samples(dev, last, cap, !out.is_null(), |k, pid, ts, sm| {
        let s = ProcessUtilizationInfo {
            time_stamp: ts,
            pid,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
            jpg_util: 0,
            ofa_util: 0,
        };
        // SAFETY: the caller's array holds cap > k entries (checked by utilization_samples).
        unsafe { out.add(k).write_unaligned(s) };
    });
    answer_or_pass(answer, pass, |n| {
        // SAFETY: the program's non-null v1 struct (checked above), valid for writes.
        unsafe { (*p).process_samples_count = n as c_uint };
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_are_clamped() {
        assert_eq!(percent(0.424), 42);
        assert_eq!(percent(7.0), 100);
        assert_eq!(percent(-1.0), 0);
        assert_eq!(percent(f64::NAN), 0);
    }
}
