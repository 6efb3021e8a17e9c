//! `libgpuslice.so`: loaded with `LD_PRELOAD` into an unmodified CUDA program, it intercepts the
//! driver API and NVML, and holds the program's slice to its VRAM quota and compute share through
//! the node ledger (`gpuslice-ledger`).
//!
//! How the parts meet:
//! - [`symbols`]: the one table of symbols (hooked ones with their handlers, and real-only
//!   ones), expanded twice: [`real`] below every handler (each real function's accessor,
//!   `real::cuMemAlloc_v2()`, resolved one symbol at a time, and the real `dlsym`; a handler
//!   gets the same function as its `real` parameter) and [`hooks`] above them all (the
//!   exported wrappers, and the wrapper for a name or a real function's address).
//! - [`dlsym`] and `cuGetProcAddress` (in [`hooks`]): how clients that look functions up
//!   (rather than link to them) still get our wrappers.
//! - [`init`]: start-up at the first `cuInit` (configuration from [`config`], devices, the
//!   ledger, admission), then one read-only [`init::State`].
//! - [`memory`] (quotas on every allocation path, with [`pointers`] remembering sizes),
//!   [`report`] and [`nvml`] (what the program is told), [`launch`] (the compute gate of
//!   `compute/`, owned by the compute scheduler).
//! - [`log`]: non-allocating `gpuslice:` lines on stderr, filtered by a variable read through
//!   [`env`](mod@env) (the environment without allocating, as `config` reads it too);
//!   [`process`]: the process-wide state (what start-up publishes, and every static that lives
//!   as long as the process, listed).
//!
//! Nothing runs in a constructor; a process that never calls CUDA pays only for the `dlsym`
//! hook. `GPUSLICE_DISABLE=1` makes every hook a pass-through.

// Its only API is the C ABI: these docs are for its maintainers, read with
// `cargo rustdoc -p gpuslice-shim --lib -- --document-private-items`, so they link to private items.
#![allow(rustdoc::private_intra_doc_links)]

mod admit;
mod capture;
mod capturing;
mod compute;
mod config;
mod contexts;
mod dlsym;
mod env;
mod hooks;
mod init;
mod launch;
mod log;
mod memory;
mod nvml;
mod pointers;
mod process;
mod real;
mod report;
mod symbols;
mod sync;
