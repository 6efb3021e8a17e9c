//! `gpuslice-burn`: a CUDA driver-API load generator that runs unchanged on the fake GPU and on
//! real GPUs, so gpuslice's tests and benchmarks drive both the same way.
//!
//! It opens `libcuda.so.1` itself ([`driver`]), so an `LD_PRELOAD`ed shim sees exactly the
//! calls a real client makes: entry points found through `cuGetProcAddress_v2` or `dlsym`.
//! A run has phases, each optional, in this order: allocate through one allocation path
//! ([`alloc`]; `--alloc-rounds` repeats it, freeing everything between rounds), hold the
//! allocations, launch the embedded `gpuslice_spin` kernel ([`load`]) or
//! run an allocate/free loop, free, and report — as one JSON object on the last line of stdout
//! with `--json` (fields: see [`report`]). `--help` lists the options ([`cli`]).
//!
//! Exit status: 0 when everything ran (allocations refused with `CUDA_ERROR_OUT_OF_MEMORY` are
//! results, listed in `alloc_errors`); 1 when any other CUDA call failed or libcuda could not be
//! loaded (the JSON object then carries `error`); 2 on bad usage.

mod alloc;
mod cli;
mod driver;
mod load;
mod report;

use std::process::ExitCode;
use std::time::Instant;

use gpuslice_abi::*;

use crate::alloc::{Allocation, Allocator};
use crate::cli::{Options, Parsed};
use crate::driver::{cu, Driver, Failure};
use crate::report::{AllocRecord, MemInfo, Report, Round};

fn main() -> ExitCode {
    let o = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            cli::emit(cli::USAGE.trim_end());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpuslice-burn: {e}");
            return ExitCode::from(2);
        }
    };
    let mut rep = Report::new(&o);
    let d = match Driver::open(o.resolve) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpuslice-burn: {e}");
            rep.error = Some(serde_json::json!({ "call": "dlopen", "message": e }));
            rep.print(o.json);
            return ExitCode::from(1);
        }
    };
    rep.set_driver(&d);
    let result = run(&d, &o, &mut rep);
    if let Err(e) = &result {
        eprintln!("gpuslice-burn: {e}");
        rep.error = Some(e.to_json());
    }
    let unexpected_alloc = rep
        .all_allocs()
        .any(|a| matches!(a.error, Some(ref f) if f.code() != Some(CUDA_ERROR_OUT_OF_MEMORY)));
    rep.print(o.json);
    if result.is_err() || unexpected_alloc {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Everything after the driver is open; the first unexpected failure ends the run.
fn run(d: &Driver, o: &Options, rep: &mut Report) -> Result<(), Failure> {
    cu!(d, cuInit(0))?;
    let mut count = 0;
    cu!(d, cuDeviceGetCount(&mut count))?;
    let mut dev: CUdevice = 0;
    cu!(d, cuDeviceGet(&mut dev, o.device))?;
    let mut name = [0 as core::ffi::c_char; 256];
    cu!(
        d,
        cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
    )?;
    let mut uuid = CUuuid::default();
    cu!(d, cuDeviceGetUuid(&mut uuid, dev))?;
    rep.set_device(o.device, count, &name, &uuid);

    let mut ctx: CUcontext = std::ptr::null_mut();
    cu!(d, cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
    let r = with_context(d, o, rep, dev, ctx);
    let released = cu!(d, cuDevicePrimaryCtxRelease(dev));
    r.and(released)
}

fn with_context(
    d: &Driver,
    o: &Options,
    rep: &mut Report,
    dev: CUdevice,
    ctx: CUcontext,
) -> Result<(), Failure> {
    cu!(d, cuCtxSetCurrent(ctx))?;
    let start = mem_info(d)?;
    rep.mem_start = Some(start);
    let sizes: Vec<u64> = o
        .alloc
        .iter()
        .map(|s| s.resolve(start.free, start.total))
        .collect();

    let mut allocator = Allocator::new(o.alloc_path, dev, o.touch);
    let mut live: Vec<Allocation> = Vec::new();
    let r = phases(d, o, &sizes, rep, &mut allocator, &mut live);
    // Free what is still held even after a failure, so a fake or a shim sees a clean exit.
    let mut freed = Ok(());
    for a in live.drain(..) {
        let bytes = a.bytes;
        match allocator.free(d, a) {
            Ok(()) => rep.freed_bytes += bytes,
            Err(e) => freed = freed.and(Err(e)),
        }
    }
    let finished = allocator.finish(d);
    r?;
    freed?;
    finished?;
    if o.free {
        rep.mem_after_free = Some(mem_info(d)?);
    }
    Ok(())
}

fn phases(
    d: &Driver,
    o: &Options,
    sizes: &[u64],
    rep: &mut Report,
    allocator: &mut Allocator,
    live: &mut Vec<Allocation>,
) -> Result<(), Failure> {
    if !o.alloc_loop && !sizes.is_empty() {
        for round in 0..o.alloc_rounds {
            if round > 0 {
                // Everything the last round got goes back first: this round shows whether
                // the same amount can be had again in the same process.
                free_all(d, allocator, live, rep)?;
            }
            let mut r = Round::default();
            for &size in sizes {
                match allocator.alloc(d, size) {
                    Ok(a) => {
                        r.allocs.push(AllocRecord {
                            size,
                            bytes: a.bytes,
                            error: None,
                        });
                        live.push(a);
                    }
                    Err(e @ Failure::Missing { .. }) => return Err(e),
                    Err(e) => r.allocs.push(AllocRecord {
                        size,
                        bytes: 0,
                        error: Some(e),
                    }),
                }
            }
            r.mem_after_alloc = Some(mem_info(d)?);
            rep.rounds.push(r);
        }
    }
    if let Some(hold) = o.hold {
        let line = serde_json::json!({
            "event": "holding",
            "pid": std::process::id(),
            "allocated_bytes": live.iter().map(|a| a.bytes).sum::<u64>(),
            "seconds": hold.as_secs_f64(),
        });
        cli::emit(line);
        std::thread::sleep(hold);
    }
    if o.launches() {
        let mut load = load::Load::new(d, o)?;
        let r = load.run(o.seconds, o.kernels, o.report_interval);
        let closed = load.close();
        rep.load = Some(r?);
        closed?;
    }
    if o.alloc_loop {
        rep.alloc_loop = Some(alloc_loop(d, o, sizes, allocator)?);
    }
    if !o.free {
        // Without --free the allocations are still released before exit (see with_context),
        // but not counted as a phase of their own.
        return Ok(());
    }
    free_all(d, allocator, live, rep)
}

/// Free every live allocation, counting `freed_bytes`; the first failure ends it (what is
/// left is freed on the way out, see `with_context`).
fn free_all(
    d: &Driver,
    allocator: &mut Allocator,
    live: &mut Vec<Allocation>,
    rep: &mut Report,
) -> Result<(), Failure> {
    while let Some(a) = live.pop() {
        let bytes = a.bytes;
        allocator.free(d, a)?;
        rep.freed_bytes += bytes;
    }
    Ok(())
}

/// `--alloc-loop`: allocate sizes picked at random from `--alloc` and free random live ones,
/// holding at most 8 at a time, for `--seconds`.
fn alloc_loop(
    d: &Driver,
    o: &Options,
    sizes: &[u64],
    allocator: &mut Allocator,
) -> Result<report::LoopStats, Failure> {
    const MAX_LIVE: usize = 8;
    let mut st = report::LoopStats::default();
    let mut live: Vec<Allocation> = Vec::with_capacity(MAX_LIVE);
    let mut rng = (std::process::id() as u64) << 32 | 0x9e37_79b9;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let t0 = Instant::now();
    let seconds = o.seconds.unwrap_or_default();
    let r = (|| {
        while t0.elapsed() < seconds {
            let r = next();
            if live.len() < MAX_LIVE && (live.is_empty() || r & 1 == 0) {
                let size = sizes[(r >> 8) as usize % sizes.len()];
                match allocator.alloc(d, size) {
                    Ok(a) => {
                        st.allocs += 1;
                        live.push(a);
                    }
                    Err(e) if e.code() == Some(CUDA_ERROR_OUT_OF_MEMORY) => st.out_of_memory += 1,
                    Err(e) => return Err(e),
                }
            } else {
                let a = live.swap_remove((r >> 8) as usize % live.len());
                allocator.free(d, a)?;
                st.frees += 1;
            }
        }
        Ok(())
    })();
    for a in live.drain(..) {
        allocator.free(d, a)?;
        st.frees += 1;
    }
    st.wall_seconds = t0.elapsed().as_secs_f64();
    r.map(|()| st)
}

fn mem_info(d: &Driver) -> Result<MemInfo, Failure> {
    let (mut free, mut total) = (0usize, 0usize);
    cu!(d, cuMemGetInfo(&mut free, &mut total))?;
    Ok(MemInfo {
        free: free as u64,
        total: total as u64,
    })
}
