//! Command-line options of `gpuslice-burn`.

use std::time::Duration;

use crate::driver::Resolve;
use gpuslice_quantity::{parse_size, Size};

/// Print one line on stdout and flush it, so a reader sees it at once. A reader that went away
/// (closed pipe) is not burn's failure: the error is ignored rather than panicking.
pub fn emit(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

pub const USAGE: &str = "\
gpuslice-burn: a CUDA driver-API load generator (runs on the fake GPU and on real GPUs)

USAGE: gpuslice-burn [OPTIONS]

Phases, in this order: allocate (--alloc, --alloc-rounds times with frees between), hold
(--hold), launch kernels (--seconds/--kernels) or run the allocation loop (--alloc-loop), free
(--free), report.

Driver:
  --resolve proc-address|dlsym   how entry points are found (default proc-address:
                                 cuGetProcAddress_v2; dlsym: versioned exports like cuMemAlloc_v2)
  --cuda-version N|driver        version asked of cuGetProcAddress_v2 (default 12000)
  --device I                     device ordinal (default 0)
Kernels (gpuslice_spin: spins on %globaltimer for --kernel-us):
  --seconds S                    launch for S seconds (fractions allowed)
  --kernels N                    stop after N kernels (with --seconds: whichever comes first;
                                 a graph replay launches all --graph kernels)
  --kernel-us N                  duration of one kernel in microseconds (default 1000)
  --depth D                      launches in flight per stream, paced with events (default 2)
  --streams N                    streams launched round-robin (default 1)
  --graph N                      capture N launches per stream into a graph; replay it with
                                 cuGraphLaunch (each replay counts as one launch for --depth)
  --launch plain|ex|cooperative  cuLaunchKernel / cuLaunchKernelEx / cuLaunchCooperativeKernel
                                 (default plain)
  --report-interval S            print a JSON line every S seconds with the achieved GPU fraction
Memory:
  --alloc SIZE[,SIZE...]         allocate these sizes in order (4Gi, 512Mi, 1G, bytes, 25%
                                 of the device's total memory, or `free`: what cuMemGetInfo
                                 says is free at start); keeps
                                 going after a failure so the report shows which one failed
  --alloc-path plain|pitch|managed|async|pool|vmm|array|array3d|mipmap|graph|capture
                                 (default plain)
                                 array: cuArrayCreate_v2, 16-byte float4 elements, SIZE/16
                                 of them as W≤65536 wide rows; array3d: cuArray3DCreate_v2,
                                 float4, n=⌈SIZE/16⌉ elements as W=min(n,2048) wide rows,
                                 the ⌈n/W⌉ rows split into H×D (H,D≤2048) with the least
                                 excess; mipmap: cuMipmappedArrayCreate, float4, 2D, 4
                                 levels (each halving W and H, floor, ≥1), the W×H (H a
                                 power of two) whose levels together hold the fewest
                                 elements ≥ n. Exact (bytes = SIZE): array3d for any
                                 multiple of 1Mi up to 2000Mi and every power of two ≥1Mi;
                                 mipmap for powers of two from 1Mi to 32Gi. Freed with
                                 cuArrayDestroy / cuMipmappedArrayDestroy
                                 graph: a graph with one cuGraphAddMemAllocNode; capture: a
                                 graph captured from one cuMemAllocAsync; either instantiated
                                 and launched (graph memory is taken at launch), freed with
                                 cuMemFreeAsync, then the graph destroyed
  --alloc-rounds N               allocate the --alloc list N times in one process (default 1):
                                 after each round but the last, free everything it got, so
                                 round 2 shows whether the freed memory can be had again. JSON:
                                 `rounds` lists each round's allocs, allocated_bytes,
                                 alloc_errors, alloc_error_names and mem_after_alloc; the
                                 top-level fields of the same names describe round 1
  --touch                        memset every allocation (not arrays) so its memory is backed
  --hold S                       keep the allocations and sleep S seconds (prints a JSON
                                 line {\"event\":\"holding\",...} first)
  --alloc-loop                   allocate and free random sizes taken from --alloc for --seconds
  --free                         free everything, then read cuMemGetInfo again
Output:
  --json                         print one JSON object as the last line of stdout

Exit status: 0 success (allocation failures with CUDA_ERROR_OUT_OF_MEMORY are results, listed
in alloc_errors); 1 a CUDA call failed otherwise, or libcuda could not be loaded; 2 bad usage.
";

/// Which launch entry point is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    Plain,
    Ex,
    Cooperative,
}

impl Launch {
    pub fn name(self) -> &'static str {
        match self {
            Launch::Plain => "plain",
            Launch::Ex => "ex",
            Launch::Cooperative => "cooperative",
        }
    }
}

/// Which allocation entry point `--alloc` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocPath {
    Plain,
    Pitch,
    Managed,
    Async,
    Pool,
    Vmm,
    Array,
    Array3d,
    Mipmap,
    Graph,
    Capture,
}

impl AllocPath {
    pub fn name(self) -> &'static str {
        match self {
            AllocPath::Plain => "plain",
            AllocPath::Pitch => "pitch",
            AllocPath::Managed => "managed",
            AllocPath::Async => "async",
            AllocPath::Pool => "pool",
            AllocPath::Vmm => "vmm",
            AllocPath::Array => "array",
            AllocPath::Array3d => "array3d",
            AllocPath::Mipmap => "mipmap",
            AllocPath::Graph => "graph",
            AllocPath::Capture => "capture",
        }
    }
}

/// One `--alloc` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A size, or a part of the device's total.
    Size(Size),
    /// What `cuMemGetInfo_v2` says is free when the memory phase starts.
    Free,
}

impl Request {
    /// Bytes, given `cuMemGetInfo_v2`'s `free` and `total` at start.
    pub fn resolve(self, free: u64, total: u64) -> u64 {
        match self {
            Request::Size(s) => s.resolve(total),
            Request::Free => free,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub resolve: Resolve,
    pub device: i32,
    pub seconds: Option<Duration>,
    pub kernels: Option<u64>,
    pub kernel_us: u64,
    pub depth: usize,
    pub streams: usize,
    pub graph: usize,
    pub launch: Launch,
    pub report_interval: Option<Duration>,
    /// `--alloc` sizes; percentages resolve against the device's total memory.
    pub alloc: Vec<Request>,
    pub alloc_path: AllocPath,
    /// `--alloc-rounds`: how many times the `--alloc` list is allocated (≥ 1).
    pub alloc_rounds: u32,
    pub touch: bool,
    pub hold: Option<Duration>,
    pub alloc_loop: bool,
    pub free: bool,
    pub json: bool,
}

impl Options {
    /// Whether the kernel phase runs (`--seconds 0` alone means none).
    pub fn launches(&self) -> bool {
        !self.alloc_loop && (self.seconds.is_some_and(|s| !s.is_zero()) || self.kernels.is_some())
    }
}

/// What parsing produced: options to run, or help to print.
pub enum Parsed {
    Run(Options),
    Help,
}

fn seconds(flag: &str, v: &str) -> Result<Duration, String> {
    match v.parse::<f64>() {
        Ok(s) if (0.0..1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "{flag}: invalid duration {v:?}; expected seconds ≥ 0, e.g. 2 or 0.5"
        )),
    }
}

fn count<T: TryFrom<u64>>(flag: &str, v: &str, min: u64, max: u64) -> Result<T, String> {
    match v.parse::<u64>() {
        Ok(n) if n >= min && n <= max => {
            T::try_from(n).map_err(|_| format!("{flag}: {v} is too large"))
        }
        _ => Err(format!(
            "{flag}: invalid value {v:?}; expected an integer from {min} to {max}"
        )),
    }
}

pub fn parse(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Parsed, String> {
    use lexopt::prelude::*;
    let mut o = Options {
        resolve: Resolve::ProcAddress {
            cuda_version: Some(12000),
        },
        device: 0,
        seconds: None,
        kernels: None,
        kernel_us: 1000,
        depth: 2,
        streams: 1,
        graph: 0,
        launch: Launch::Plain,
        report_interval: None,
        alloc: Vec::new(),
        alloc_path: AllocPath::Plain,
        alloc_rounds: 1,
        touch: false,
        hold: None,
        alloc_loop: false,
        free: false,
        json: false,
    };
    let mut dlsym = false;
    let mut cuda_version = Some(12000);
    let mut p = lexopt::Parser::from_iter(std::iter::once("gpuslice-burn".into()).chain(args));
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let flag = match arg {
            Long(l) => format!("--{l}"),
            Short(c) => format!("-{c}"),
            Value(v) => return Err(format!("unexpected argument {v:?}; see --help")),
        };
        let mut val = || -> Result<String, String> {
            p.value()
                .map_err(|e| e.to_string())?
                .into_string()
                .map_err(|v| format!("{flag}: value {v:?} is not UTF-8"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--resolve" => match val()?.as_str() {
                "proc-address" => dlsym = false,
                "dlsym" => dlsym = true,
                v => {
                    return Err(format!(
                        "--resolve: unknown value {v:?}; expected proc-address or dlsym"
                    ))
                }
            },
            "--cuda-version" => {
                let v = val()?;
                cuda_version = if v == "driver" {
                    None
                } else {
                    Some(
                        count::<i32>("--cuda-version", &v, 1000, 99999)
                            .map_err(|e| e + " or driver")?,
                    )
                };
            }
            "--device" => o.device = count("--device", &val()?, 0, 1023)?,
            "--seconds" => o.seconds = Some(seconds("--seconds", &val()?)?),
            "--kernels" => o.kernels = Some(count("--kernels", &val()?, 1, u64::MAX)?),
            "--kernel-us" => o.kernel_us = count("--kernel-us", &val()?, 0, 3_600_000_000)?,
            "--depth" => o.depth = count("--depth", &val()?, 1, 4096)?,
            "--streams" => o.streams = count("--streams", &val()?, 1, 256)?,
            "--graph" => o.graph = count("--graph", &val()?, 0, 100_000)?,
            "--launch" => {
                o.launch = match val()?.as_str() {
                    "plain" => Launch::Plain,
                    "ex" => Launch::Ex,
                    "cooperative" => Launch::Cooperative,
                    v => {
                        return Err(format!(
                            "--launch: unknown value {v:?}; expected plain, ex or cooperative"
                        ))
                    }
                }
            }
            "--report-interval" => {
                let d = seconds("--report-interval", &val()?)?;
                if d.is_zero() {
                    return Err("--report-interval: must be more than 0 seconds".into());
                }
                o.report_interval = Some(d);
            }
            "--alloc" => {
                for part in val()?.split(',') {
                    let part = part.trim();
                    o.alloc.push(if part == "free" {
                        Request::Free
                    } else {
                        Request::Size(parse_size("--alloc", part).map_err(|e| e.to_string())?)
                    });
                }
            }
            "--alloc-path" => {
                o.alloc_path = match val()?.as_str() {
                    "plain" => AllocPath::Plain,
                    "pitch" => AllocPath::Pitch,
                    "managed" => AllocPath::Managed,
                    "async" => AllocPath::Async,
                    "pool" => AllocPath::Pool,
                    "vmm" => AllocPath::Vmm,
                    "array" => AllocPath::Array,
                    "array3d" => AllocPath::Array3d,
                    "mipmap" => AllocPath::Mipmap,
                    "graph" => AllocPath::Graph,
                    "capture" => AllocPath::Capture,
                    v => {
                        return Err(format!(
                            "--alloc-path: unknown value {v:?}; expected plain, pitch, managed, \
                             async, pool, vmm, array, array3d, mipmap, graph or capture"
                        ))
                    }
                }
            }
            "--alloc-rounds" => o.alloc_rounds = count("--alloc-rounds", &val()?, 1, 100_000)?,
            "--touch" => o.touch = true,
            "--hold" => o.hold = Some(seconds("--hold", &val()?)?),
            "--alloc-loop" => o.alloc_loop = true,
            "--free" => o.free = true,
            "--json" => o.json = true,
            _ => return Err(format!("unknown option {flag}; see --help")),
        }
    }
    o.resolve = if dlsym {
        Resolve::Dlsym
    } else {
        Resolve::ProcAddress { cuda_version }
    };
    if o.alloc_loop && (o.alloc.is_empty() || o.seconds.is_none()) {
        return Err(
            "--alloc-loop needs --alloc SIZE[,SIZE...] (the sizes to pick from) and --seconds"
                .into(),
        );
    }
    if o.alloc_rounds > 1 && (o.alloc.is_empty() || o.alloc_loop) {
        return Err(format!(
            "--alloc-rounds {}: needs --alloc SIZE[,SIZE...] (what each round allocates) and \
             cannot be combined with --alloc-loop",
            o.alloc_rounds
        ));
    }
    Ok(Parsed::Run(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        match parse(args.iter().map(|s| s.into()))? {
            Parsed::Run(o) => Ok(o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults_and_values() {
        let o = run(&[]).unwrap();
        assert!(!o.launches() && o.depth == 2 && o.launch == Launch::Plain);
        let o = run(&[
            "--seconds",
            "0.5",
            "--launch",
            "ex",
            "--alloc",
            "1Mi,2Mi",
            "--resolve",
            "dlsym",
        ])
        .unwrap();
        assert!(o.launches());
        assert_eq!(
            o.alloc,
            vec![
                Request::Size(Size::Bytes(1 << 20)),
                Request::Size(Size::Bytes(2 << 20))
            ]
        );
        assert_eq!(o.resolve, Resolve::Dlsym);
        assert_eq!(o.alloc_rounds, 1);
        let o = run(&["--alloc", "1Mi", "--alloc-rounds", "3"]).unwrap();
        assert_eq!(o.alloc_rounds, 3);
        let o = run(&["--cuda-version", "driver"]).unwrap();
        assert_eq!(o.resolve, Resolve::ProcAddress { cuda_version: None });
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (&["--launch", "fast"][..], "--launch"),
            (&["--alloc", "12XB"], "--alloc"),
            (&["--depth", "0"], "--depth"),
            (&["--seconds", "-1"], "--seconds"),
            (&["--alloc-path", "heap"], "--alloc-path"),
            (&["--bogus"], "--bogus"),
            (&["--alloc-loop"], "--alloc-loop"),
            (&["--alloc-rounds", "0"], "--alloc-rounds"),
            (&["--alloc-rounds", "2"], "--alloc-rounds"),
            (
                &[
                    "--alloc-rounds",
                    "2",
                    "--alloc",
                    "1Mi",
                    "--alloc-loop",
                    "--seconds",
                    "1",
                ],
                "--alloc-rounds",
            ),
        ] {
            let e = run(args).unwrap_err();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }
}
