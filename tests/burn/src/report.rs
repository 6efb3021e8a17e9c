//! What a run found, printed as one JSON object (`--json`, the last line of stdout) or as a
//! short human summary.
//!
//! JSON fields (sizes in bytes, times in seconds):
//! - `pid`, `device` {`index`, `name`, `uuid` (`GPU-xxxxxxxx-...`), `count`}, `driver_version`,
//!   `resolve` (`proc-address`|`dlsym`), `cuda_version` (asked of cuGetProcAddress_v2, or null),
//!   `missing` (entry points the driver did not resolve).
//! - kernel phase: `kernels` (completed), `launches`, `gpu_seconds`, `event_seconds`,
//!   `wall_seconds`, `gpu_fraction` (= gpu_seconds / wall_seconds), `kernel_us`, `launch`,
//!   `streams`, `depth`, `graph` (see `load.rs` for what each time measures).
//! - memory: `alloc_path`, `allocs` [{`size`, `bytes`, `ok`, `code`, `name`}] in request order,
//!   `allocated_bytes` (sum of `bytes` that succeeded), `alloc_errors` (codes of the failed
//!   ones, in order) and `alloc_error_names`, `freed_bytes`, `mem_total` and `mem_free`
//!   (cuMemGetInfo_v2 at start), `mem` {`start`, `after_alloc`, `after_free`: {`free`,
//!   `total`} or null}, `alloc_loop` {`allocs`, `frees`, `out_of_memory`, `wall_seconds`} or null.
//!   With `--alloc-rounds N`: `rounds`, one object per round {`allocs`, `allocated_bytes`,
//!   `alloc_errors`, `alloc_error_names`, `mem_after_alloc`}; the top-level fields of those
//!   names (and `mem.after_alloc`) describe round 1. `freed_bytes` counts every free, between
//!   rounds too. `rounds` is empty without `--alloc`.
//! - `error`: null, or the failure that ended the run {`call`, `code`, `name`} (or
//!   {`call`, `missing`} / {`call`, `message`}).

use serde_json::{json, Value};

use gpuslice_abi::{cu_result_name, uuid_text, CUuuid};

use crate::cli::{emit, Options};
use crate::driver::{Driver, Failure};
use crate::load::LoadStats;

/// `cuMemGetInfo_v2` at one moment.
#[derive(Debug, Clone, Copy)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// One `--alloc` request and its outcome.
#[derive(Debug, Clone)]
pub struct AllocRecord {
    pub size: u64,
    pub bytes: u64,
    pub error: Option<Failure>,
}

/// One pass over the `--alloc` list (`--alloc-rounds`).
#[derive(Debug, Default)]
pub struct Round {
    /// Outcomes in request order.
    pub allocs: Vec<AllocRecord>,
    /// `cuMemGetInfo_v2` once the round allocated.
    pub mem_after_alloc: Option<MemInfo>,
}

impl Round {
    /// Bytes of the allocations that succeeded.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocs
            .iter()
            .filter(|a| a.error.is_none())
            .map(|a| a.bytes)
            .sum()
    }

    /// `allocs`, `allocated_bytes`, `alloc_errors`, `alloc_error_names`: the fields a round
    /// shares with the top level of the report.
    fn fields(&self) -> serde_json::Map<String, Value> {
        let failed = || self.allocs.iter().filter_map(|a| a.error.as_ref());
        let v = json!({
            "allocs": self.allocs.iter().map(|a| json!({
                "size": a.size,
                "bytes": a.bytes,
                "ok": a.error.is_none(),
                "code": a.error.as_ref().and_then(Failure::code),
                "name": a.error.as_ref().and_then(Failure::code).and_then(cu_result_name),
            })).collect::<Vec<_>>(),
            "allocated_bytes": self.allocated_bytes(),
            "alloc_errors": failed().filter_map(Failure::code).collect::<Vec<_>>(),
            "alloc_error_names": failed()
                .filter_map(Failure::code)
                .map(|c| cu_result_name(c).unwrap_or("unknown CUresult"))
                .collect::<Vec<_>>(),
        });
        match v {
            Value::Object(m) => m,
            _ => unreachable!("json! of an object literal"),
        }
    }
}

/// Counters of `--alloc-loop`.
#[derive(Debug, Default)]
pub struct LoopStats {
    pub allocs: u64,
    pub frees: u64,
    pub out_of_memory: u64,
    pub wall_seconds: f64,
}

pub struct Report {
    pub options: Value,
    pub driver: Value,
    pub device: Value,
    pub mem_start: Option<MemInfo>,
    pub mem_after_free: Option<MemInfo>,
    /// `--alloc` rounds in order; only the last one's allocations are still held.
    pub rounds: Vec<Round>,
    pub freed_bytes: u64,
    pub load: Option<LoadStats>,
    pub alloc_loop: Option<LoopStats>,
    pub error: Option<Value>,
}

fn mem_json(m: Option<MemInfo>) -> Value {
    m.map_or(Value::Null, |m| json!({ "free": m.free, "total": m.total }))
}

impl Report {
    pub fn new(o: &Options) -> Report {
        Report {
            options: json!({
                "launch": o.launch.name(),
                "streams": o.streams,
                "depth": o.depth,
                "graph": o.graph,
                "kernel_us": o.kernel_us,
                "alloc_path": o.alloc_path.name(),
            }),
            driver: Value::Null,
            device: Value::Null,
            mem_start: None,
            mem_after_free: None,
            rounds: Vec::new(),
            freed_bytes: 0,
            load: None,
            alloc_loop: None,
            error: None,
        }
    }

    pub fn set_driver(&mut self, d: &Driver) {
        // Only the proc-address path asks for a CUDA version.
        let resolve = if d.cuda_version.is_some() {
            "proc-address"
        } else {
            "dlsym"
        };
        self.driver = json!({
            "driver_version": d.driver_version,
            "resolve": resolve,
            "cuda_version": d.cuda_version,
            "missing": d.missing.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        });
    }

    pub fn set_device(
        &mut self,
        index: i32,
        count: i32,
        name: &[core::ffi::c_char],
        uuid: &CUuuid,
    ) {
        let name: Vec<u8> = name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        self.device = json!({
            "index": index,
            "count": count,
            "name": String::from_utf8_lossy(&name),
            "uuid": uuid_text(uuid),
        });
    }

    /// Every allocation outcome of every round.
    pub fn all_allocs(&self) -> impl Iterator<Item = &AllocRecord> {
        self.rounds.iter().flat_map(|r| r.allocs.iter())
    }

    pub fn to_json(&self) -> Value {
        let empty = Round::default();
        let first = self.rounds.first().unwrap_or(&empty);
        let load = self.load.clone().unwrap_or_default();
        let fraction = if load.wall_seconds > 0.0 {
            load.gpu_seconds / load.wall_seconds
        } else {
            0.0
        };
        let mut v = json!({
            "pid": std::process::id(),
            "device": self.device,
            "kernels": load.kernels,
            "launches": load.launches,
            "gpu_seconds": load.gpu_seconds,
            "event_seconds": load.event_seconds,
            "wall_seconds": load.wall_seconds,
            "gpu_fraction": fraction,
            "rounds": self.rounds.iter().map(|r| {
                let mut m = r.fields();
                m.insert("mem_after_alloc".into(), mem_json(r.mem_after_alloc));
                Value::Object(m)
            }).collect::<Vec<_>>(),
            "freed_bytes": self.freed_bytes,
            "mem_total": self.mem_start.map(|m| m.total),
            "mem_free": self.mem_start.map(|m| m.free),
            "mem": {
                "start": mem_json(self.mem_start),
                "after_alloc": mem_json(first.mem_after_alloc),
                "after_free": mem_json(self.mem_after_free),
            },
            "alloc_loop": self.alloc_loop.as_ref().map(|l| json!({
                "allocs": l.allocs,
                "frees": l.frees,
                "out_of_memory": l.out_of_memory,
                "wall_seconds": l.wall_seconds,
            })),
            "error": self.error,
        });
        if let Some(dst) = v.as_object_mut() {
            dst.extend(first.fields());
        }
        for src in [&self.options, &self.driver] {
            if let (Some(dst), Some(src)) = (v.as_object_mut(), src.as_object()) {
                dst.extend(src.iter().map(|(k, x)| (k.clone(), x.clone())));
            }
        }
        v
    }

    /// Print the report: the JSON object as the last stdout line, or a summary for a person.
    pub fn print(&self, json: bool) {
        let v = self.to_json();
        if json {
            emit(&v);
            return;
        }
        let get = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
        emit(format_args!(
            "device: {} {}",
            v["device"]["name"], v["device"]["uuid"]
        ));
        emit(format_args!(
            "memory: free {} of {} at start",
            get("mem_free"),
            get("mem_total")
        ));
        if !self.rounds.is_empty() {
            emit(format_args!(
                "allocated {} bytes ({}), errors {}",
                get("allocated_bytes"),
                get("alloc_path"),
                get("alloc_error_names")
            ));
            for (i, r) in v["rounds"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .skip(1)
            {
                emit(format_args!(
                    "round {}: allocated {} bytes, errors {}",
                    i + 1,
                    r["allocated_bytes"],
                    r["alloc_error_names"]
                ));
            }
        }
        if self.load.is_some() {
            emit(format_args!(
                "kernels {} in {:.3}s: gpu {:.3}s ({:.1}%)",
                get("kernels"),
                get("wall_seconds").as_f64().unwrap_or(0.0),
                get("gpu_seconds").as_f64().unwrap_or(0.0),
                get("gpu_fraction").as_f64().unwrap_or(0.0) * 100.0
            ));
        }
        if let Some(e) = &self.error {
            emit(format_args!("error: {e}"));
        }
    }
}
