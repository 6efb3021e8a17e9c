//! The node-wide ledger: one versioned `#[repr(C)]` file in shared memory through which every
//! gpuslice process on a node agrees on devices, slices, processes, quotas and compute leases.
//!
//! Both the shim (inside each wrapped program) and the monitor (`gpuslice`) map the same file;
//! this crate is the only definition of its layout and the only code that mutates it.
