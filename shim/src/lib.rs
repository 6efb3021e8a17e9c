//! `libgpuslice.so`: loaded with `LD_PRELOAD` into an unmodified CUDA program, it intercepts the
//! driver API and NVML, and holds the program's slice to its VRAM quota and compute share through
//! the node ledger.
