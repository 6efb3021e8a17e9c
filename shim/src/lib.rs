//! `libgpuslice.so`: loaded with `LD_PRELOAD` into an unmodified CUDA program, it intercepts the
//! driver API and NVML, and holds the program's slice to its VRAM quota and compute share through
//! the node ledger (`gpuslice-ledger`).
//!
//! How the parts meet:
//! - [`hooks`]: the one table of hooked symbols; it generates the exported wrappers, the
//!   name → wrapper map used by [`dlsym`], and the accessors of the real driver's functions
//!   (`hooks::real::cuMemAlloc_v2()`; a handler gets the same function as its `real`
//!   parameter). [`resolve`] finds them, one symbol at a time, and the real `dlsym`.
//! - [`dlsym`] and [`procaddr`]: how clients that look functions up (rather than link to
//!   them) still get our wrappers; `procaddr` maps by the real function's address.
//! - [`init`]: start-up at the first `cuInit` (configuration from [`config`], devices, the
//!   ledger, admission), then one read-only [`init::State`].
//! - [`memory`] (quotas on every allocation path, with [`pointers`] remembering sizes),
//!   [`report`] and [`nvml`] (what the program is told), [`launch`] (the compute gate of
//!   `compute/`, owned by the compute scheduler).
//! - [`log`]: non-allocating `gpuslice:` lines on stderr.
//!
//! Nothing runs in a constructor; a process that never calls CUDA pays only for the `dlsym`
//! hook. `GPUSLICE_DISABLE=1` makes every hook a pass-through.

mod admit;
mod compute;
mod config;
mod dlsym;
mod hooks;
mod init;
mod launch;
mod log;
mod memory;
mod nvml;
mod pointers;
mod procaddr;
mod report;
mod resolve;
