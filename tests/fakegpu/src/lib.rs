//! The fake GPU: one shared library that answers as `libcuda.so.1` and `libnvidia-ml.so.1`,
//! so gpuslice and real clients (numba, pynvml, `gpuslice-burn`) run on machines without a GPU.
//!
//! How the parts meet:
//! - [`config`] reads `FAKEGPU_*` and `CUDA_VISIBLE_DEVICES` once;
//! - [`shared`] is the node-wide state file every process maps: device memory counters,
//!   per-process records, the execution engine's owner token;
//! - [`runtime`] holds devices, contexts (each with its [`ctx_storage`]) and the thread's
//!   context stack;
//! - [`mem`] backs device memory with lazily reserved host memory and counts it in [`shared`];
//! - [`exec`] runs streams' work with simulated time on the shared engine, time-sliced
//!   between processes; [`graph`] records and replays captured work; [`module`] reads kernel
//!   names from images; [`handle`] turns the opaque handles clients pass back into objects;
//! - [`export`] serves `cuGetExportTable`: the private tables NVIDIA's CUDA runtime needs,
//!   with its integrity check (HMAC-MD2);
//! - [`lost`] records devices lost at run time (fallen off the bus) for every process;
//! - [`api`] and [`nvml`] are the exports: thin wrappers, one table ([`api::EXPORTS`]) that
//!   [`procaddr`] resolves `cuGetProcAddress` against with its version table; [`debug`] is
//!   the `FAKEGPU_DEBUG` log they write to.
//!
//! The library links with `-Bsymbolic` and never calls its own exports, so an interposer
//! such as `libgpuslice.so` sees exactly the client's calls.

mod abi_check;
pub mod api;
pub mod config;
pub mod ctx_storage;
pub mod debug;
pub mod exec;
pub mod export;
pub mod graph;
pub mod handle;
pub mod lost;
pub mod mem;
pub mod module;
pub mod nvml;
pub mod procaddr;
pub mod runtime;
pub mod shared;

/// Run an export's body: `Ok` becomes `success`, an error is the code returned, and a panic
/// becomes `panicked` instead of unwinding into the C caller.
pub(crate) fn catch<R>(success: R, panicked: R, f: impl FnOnce() -> Result<(), R>) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => success,
        Ok(Err(e)) => e,
        Err(_) => panicked,
    }
}
