//! Device memory: host memory reserved lazily (`mmap` with `MAP_NORESERVE`), so the device
//! pointer *is* the host address and copies are plain `memcpy`s, while every byte is counted
//! against the node-wide device total in the shared state (see [`crate::shared`]). One file a
//! job:
//!
//! - `ranges.rs`: the one registry of live ranges ([`Range`], [`lookup`]) that frees,
//!   `cuMemGetAddressRange` and pointer attributes read, and the mappings behind them;
//! - `device.rs`: counted allocations and the frees every kind of range ends in;
//! - `host.rs`: page-locked and registered host memory, never counted;
//! - `pool.rs`: stream-ordered pools ([`Pool`]), their retained blocks and release threshold;
//! - `vmm.rs`: VMM handles (memfds) mapped into `PROT_NONE` reservations;
//! - `ipc.rs`: legacy IPC memory handles: an allocation's bytes moved into a memfd other
//!   processes map;
//! - `shared_mem.rs`: the node-wide table of memory shared between processes (legacy IPC and
//!   exported VMM), which keeps it counted to its allocator until its last holder lets go;
//! - `array.rs`: arrays ([`Array`]) and their backing store;
//! - `graph_mem.rs`: graph memory nodes' ranges and the per-device graph memory figures.

mod array;
mod device;
mod graph_mem;
mod host;
mod ipc;
mod pool;
mod ranges;
mod shared_mem;
mod vmm;

pub use array::{array_create, array_destroy, array_of, array_pitch, format_bytes, Array};
pub use device::{alloc, free, free_all_of, free_now};
pub use graph_mem::{graph_mem_attribute, set_graph_live, set_graph_mem_attribute};
pub use host::{alloc_host, free_host, host_register, host_unregister};
pub use ipc::{close_mem_handle, get_mem_handle, open_mem_handle};
pub use pool::{after_sync, after_sync_phys, free_async_called, Pool};
pub use ranges::{lookup, Kind, Range};
pub(crate) use shared_mem::{leave_all as release_shared, map_node_file};
pub use vmm::{
    vmm_address_free, vmm_covers, vmm_create, vmm_export, vmm_import, vmm_lookup, vmm_map,
    vmm_properties, vmm_release, vmm_reserve, vmm_retain, vmm_set_access, vmm_unmap, GRANULARITY,
};
