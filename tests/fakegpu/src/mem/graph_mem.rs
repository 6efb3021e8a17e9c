//! Graph memory: a graph memory node's range holds device memory from `cuGraphLaunch` to its
//! free node, and the per-device figures `cuDeviceGetGraphMemAttribute` reports. Apart because
//! a graph range outlives its frees (the address belongs to the graph) and is counted only
//! while live.

use super::ranges::{ranges, Kind};
use crate::config::MAX_DEVICES;
use crate::runtime::CuResult;
use gpuslice_abi::*;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Mark a graph memory node's range as holding (or not holding) device memory.
pub fn set_graph_live(ptr: u64, live: bool) {
    if let Some(r) = ranges().get_mut(&ptr) {
        if r.kind != Kind::Graph(live) && r.dev < MAX_DEVICES {
            if live {
                let now = GRAPH_USED[r.dev].fetch_add(r.size, AcqRel) + r.size;
                GRAPH_HIGH[r.dev].fetch_max(now, AcqRel);
            } else {
                let _ = GRAPH_USED[r.dev]
                    .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(r.size)));
            }
        }
        r.kind = Kind::Graph(live);
    }
}

/// Graph memory in use per CUDA ordinal, and its high-water mark (`cuDeviceGetGraphMemAttribute`).
static GRAPH_USED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static GRAPH_HIGH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// `cuDeviceGetGraphMemAttribute`: the fake reserves exactly what graphs use, so the used and
/// reserved figures agree.
pub fn graph_mem_attribute(dev: usize, attr: i32) -> CuResult<u64> {
    let d = dev.min(MAX_DEVICES - 1);
    match attr {
        0 | 2 => Ok(GRAPH_USED[d].load(Acquire)),
        1 | 3 => Ok(GRAPH_HIGH[d].load(Acquire)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuDeviceSetGraphMemAttribute`: only the high-water marks may be reset, with zero.
pub fn set_graph_mem_attribute(dev: usize, attr: i32, v: u64) -> CuResult<()> {
    let d = dev.min(MAX_DEVICES - 1);
    match attr {
        1 | 3 if v == 0 => {
            GRAPH_HIGH[d].store(GRAPH_USED[d].load(Acquire), Release);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
