//! The registry of live ranges (every allocation the fake hands out a pointer to, whatever made
//! it: device, managed, pool, array, graph, host memory, module globals) and the anonymous
//! mappings behind them. One registry serves frees, `cuMemGetAddressRange` and pointer
//! attributes; apart from the allocators because each of them registers here, and a lookup
//! must not care which one made a range.

use crate::runtime::{rt_unchecked, Ctx, CuResult};
use crate::shared::Node;
use gpuslice_abi::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// What a registered range is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// cuMemAlloc / cuMemAllocPitch.
    Device,
    /// cuMemAllocManaged.
    Managed,
    /// A block handed out by a pool (`*const Pool`).
    Pool(usize),
    /// An array's backing store.
    Array,
    /// A graph memory node's range; `true` while its memory is allocated.
    Graph(bool),
    /// Page-locked host memory (cuMemAllocHost / cuMemHostAlloc).
    Host,
    /// Registered host memory (cuMemHostRegister): not ours to unmap.
    Registered,
    /// A module global's backing buffer.
    Global,
    /// Device memory another process exported (`cuIpcOpenMemHandle`): counted to it, not here.
    Imported,
}

/// A live range.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    /// Bytes the client asked for.
    pub size: u64,
    /// Bytes mapped (page-rounded).
    pub map_len: usize,
    /// CUDA ordinal of its device.
    pub dev: usize,
    /// Context that allocated it (`*const Ctx`, 0 for none).
    pub ctx: usize,
    /// What it is.
    pub kind: Kind,
}

impl Range {
    /// A range of `size` bytes (`map_len` mapped) made by `ctx` (on its device), or by no
    /// context (device 0).
    pub(super) fn new(ctx: Option<&'static Ctx>, size: u64, map_len: usize, kind: Kind) -> Range {
        let (dev, ctx) = ctx.map_or((0, 0), |c| (c.dev, c as *const Ctx as usize));
        Range {
            size,
            map_len,
            dev,
            ctx,
            kind,
        }
    }

    /// Whether its bytes count as device memory.
    pub(super) fn counted(&self) -> bool {
        matches!(
            self.kind,
            Kind::Device | Kind::Managed | Kind::Array | Kind::Graph(true)
        )
    }
}

/// Live ranges by start address.
static RANGES: Mutex<BTreeMap<u64, Range>> = Mutex::new(BTreeMap::new());

pub(super) fn ranges() -> std::sync::MutexGuard<'static, BTreeMap<u64, Range>> {
    RANGES.lock().unwrap_or_else(|e| e.into_inner())
}

const PAGE: usize = 4096;

/// `size` bytes rounded up to whole pages.
pub(super) fn page_round(size: u64) -> usize {
    (size as usize).div_ceil(PAGE) * PAGE
}

/// A fresh read-write anonymous mapping of `len` bytes, reserved lazily.
pub(super) fn map_anon(len: usize) -> Option<u64> {
    // SAFETY: a fresh anonymous mapping; nothing else refers to that address range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// Map `size` bytes already reserved on physical device `phys`: (pointer, mapped length). If
/// the mapping fails the reservation goes back.
pub(super) fn map_reserved(node: &Node, phys: usize, size: u64) -> CuResult<(u64, usize)> {
    let map_len = page_round(size);
    let Some(ptr) = map_anon(map_len) else {
        node.unreserve(phys, size);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    Ok((ptr, map_len))
}

/// Unmap what [`map_anon`] (or a VMM reservation) mapped.
pub(super) fn unmap(p: u64, len: usize) {
    // SAFETY: `p..p+len` is a mapping `mem` created and no longer lists (registry or VMM).
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

/// The physical device of CUDA ordinal `dev`.
pub(super) fn phys(dev: usize) -> usize {
    rt_unchecked().devices[dev].phys
}

/// The live range containing `ptr`: (start, range).
pub fn lookup(ptr: u64) -> Option<(u64, Range)> {
    let g = ranges();
    let (&start, r) = g.range(..=ptr).next_back()?;
    (ptr < start + r.size.max(1)).then_some((start, *r))
}
