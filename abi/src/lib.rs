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
