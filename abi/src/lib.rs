//! The binary interface of NVIDIA's CUDA driver API and NVML, as far as gpuslice needs it.
//!
//! The shim (`libgpuslice.so`), the fake GPU (`tests/fakegpu`) and the load generator
//! (`gpuslice-burn`) all speak this ABI; this crate is its single definition, so the three
//! can never disagree on a status code, a handle width or a struct layout. It holds only
//! `#[repr(C)]` types, constants and names, no code that talks to a driver.
//!
//! Layouts follow `cuda.h` and `nvml.h` of CUDA 12.x; tests at the bottom pin sizes and
//! offsets against those headers. [`pfn`] holds the C signature of every driver and NVML entry
//! point, generated from the headers by `abi/gen/pfn.py`; every table in gpuslice that declares
//! or defines one of these functions is checked against it at compile time.

#![deny(missing_docs)]

#[rustfmt::skip] // generated; one line per entry point
pub mod pfn;
mod result;
mod types;

pub use result::*;
pub use types::*;

/// Render a driver status code for a person: `CUDA_ERROR_OUT_OF_MEMORY (2)`.
pub fn describe_cu(code: CUresult) -> String {
    match cu_result_name(code) {
        Some(n) => format!("{n} ({code})"),
        None => format!("unknown CUresult ({code})"),
    }
}

/// Render a device UUID as NVML and nvidia-smi write it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(u: &CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let h =
        |r: core::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_reads_as_nvml_writes_it() {
        let mut u = CUuuid { bytes: [0; 16] };
        for (i, b) in u.bytes.iter_mut().enumerate() {
            *b = (i as u8 * 17) as _;
        }
        assert_eq!(uuid_text(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
