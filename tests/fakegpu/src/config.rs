//! The fake GPU's configuration: `FAKEGPU_*` variables and `CUDA_VISIBLE_DEVICES`, read once.
//!
//! A bad value is never guessed at: [`Config::from_env`] returns one line naming the variable,
//! the value and what is accepted, which `cuInit`/`nvmlInit` print before failing.

use std::path::PathBuf;

/// Most devices the shared state file has room for.
pub const MAX_DEVICES: usize = 16;

/// The configuration of this process's fake GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Physical devices on the fake node (`FAKEGPU_DEVICES`).
    pub devices: usize,
    /// Bytes of memory per device (`FAKEGPU_MEMORY`).
    pub memory: u64,
    /// Device memory a context takes (`FAKEGPU_CONTEXT_MEMORY`; `None`: the default of
    /// [`crate::runtime::context_bytes`]).
    pub context_memory: Option<u64>,
    /// Duration of a kernel other than `gpuslice_spin`, ns (`FAKEGPU_KERNEL_US`).
    pub kernel_ns: u64,
    /// Engine time slice between contexts when another is waiting, ns (`FAKEGPU_TIMESLICE_US`).
    pub timeslice_ns: u64,
    /// Directory of the node-wide state file (`FAKEGPU_STATE_DIR`).
    pub state_dir: PathBuf,
    /// Physical indices of the devices CUDA sees, in CUDA's order (`CUDA_VISIBLE_DEVICES`).
    pub visible: Vec<usize>,
    /// The CUDA version `cuDriverGetVersion` reports, e.g. 13000 (`FAKEGPU_DRIVER_VERSION`).
    pub driver_version: i32,
    /// Log unknown export tables and slots, failing calls and missing lookups on stderr
    /// (`FAKEGPU_DEBUG=1`); `2` also traces every driver call.
    pub debug: u8,
    /// An export table `cuGetExportTable` refuses, by UUID hex prefix (`FAKEGPU_WITHHOLD_TABLE`),
    /// to show the runtime needs it.
    pub withhold_table: Option<String>,
    /// Answer the runtime's integrity check wrongly (`FAKEGPU_BAD_INTEGRITY=1`), to show it is
    /// checked.
    pub bad_integrity: bool,
}

/// The driver version reported unless `FAKEGPU_DRIVER_VERSION` says otherwise: CUDA 13.0, which
/// both CUDA 12.x and 13.x runtimes accept.
pub const DEFAULT_DRIVER_VERSION: i32 = 13000;

const SIZE_FORMS: &str = "bytes, or a number with Ki, Mi, Gi, Ti (binary, also KiB..TiB) or K, M, G, T (decimal), e.g. 16Gi";

impl Config {
    /// Read the configuration from `get` (the process environment in production).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let bad = |var: &str, val: &str, why: &str, accepted: &str| {
            format!("fakegpu: {var}={val}: {why}; accepted: {accepted}")
        };
        let devices = match get("FAKEGPU_DEVICES") {
            None => 1,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    return Err(bad(
                        "FAKEGPU_DEVICES",
                        &v,
                        "not a device count",
                        &format!("an integer from 0 to {MAX_DEVICES}"),
                    ))
                }
            },
        };
        let memory = match get("FAKEGPU_MEMORY") {
            None => 16 << 30,
            Some(v) => match parse_size(&v) {
                Ok(0) => return Err(bad("FAKEGPU_MEMORY", &v, "zero bytes", SIZE_FORMS)),
                Ok(n) => n,
                Err(why) => return Err(bad("FAKEGPU_MEMORY", &v, &why, SIZE_FORMS)),
            },
        };
        let context_memory = match get("FAKEGPU_CONTEXT_MEMORY") {
            None => None,
            Some(v) => match parse_size(&v) {
                Ok(n) => Some(n),
                Err(why) => return Err(bad("FAKEGPU_CONTEXT_MEMORY", &v, &why, SIZE_FORMS)),
            },
        };
        let micros = |var: &str, default: u64, min: u64| -> Result<u64, String> {
            match get(var) {
                None => Ok(default * 1000),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n >= min && n <= 3_600_000_000 => Ok(n * 1000),
                    _ => Err(bad(
                        var,
                        &v,
                        "not a duration in microseconds",
                        &format!("an integer from {min} to 3600000000"),
                    )),
                },
            }
        };
        let kernel_ns = micros("FAKEGPU_KERNEL_US", 100, 0)?;
        let timeslice_ns = micros("FAKEGPU_TIMESLICE_US", 2000, 100)?;
        let state_dir = match get("FAKEGPU_STATE_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            // SAFETY: getuid has no preconditions.
            _ => PathBuf::from(format!("/dev/shm/fakegpu-{}", unsafe { libc::getuid() })),
        };
        let visible = match get("CUDA_VISIBLE_DEVICES") {
            None => (0..devices).collect(),
            Some(v) => parse_visible(&v, devices),
        };
        let driver_version = match get("FAKEGPU_DRIVER_VERSION") {
            None => DEFAULT_DRIVER_VERSION,
            Some(v) => match v.trim().parse::<i32>() {
                Ok(n) if (1000..100_000).contains(&n) => n,
                _ => {
                    return Err(bad(
                        "FAKEGPU_DRIVER_VERSION",
                        &v,
                        "not a CUDA version number",
                        "1000 * major + 10 * minor, e.g. 12090 or 13000",
                    ))
                }
            },
        };
        let flag = |var: &str| -> Result<bool, String> {
            match get(var).as_deref().map(str::trim) {
                None | Some("") | Some("0") => Ok(false),
                Some("1") => Ok(true),
                Some(v) => Err(bad(var, v, "not a switch", "0 or 1")),
            }
        };
        let debug = match get("FAKEGPU_DEBUG").as_deref().map(str::trim) {
            None | Some("") | Some("0") => 0,
            Some("1") => 1,
            Some("2") => 2,
            Some(v) => return Err(bad("FAKEGPU_DEBUG", v, "not a debug level", "0, 1 or 2")),
        };
        let bad_integrity = flag("FAKEGPU_BAD_INTEGRITY")?;
        let withhold_table = match get("FAKEGPU_WITHHOLD_TABLE") {
            None => None,
            Some(v) if v.is_empty() => None,
            Some(v) => {
                let t = v.trim().to_ascii_lowercase();
                if t.len() < 8 || t.len() > 32 || !t.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(bad(
                        "FAKEGPU_WITHHOLD_TABLE",
                        &v,
                        "not an export table UUID",
                        "8 to 32 hex digits of the UUID's raw bytes, e.g. d4082055",
                    ));
                }
                Some(t)
            }
        };
        Ok(Config {
            devices,
            memory,
            context_memory,
            kernel_ns,
            timeslice_ns,
            state_dir,
            visible,
            driver_version,
            debug,
            withhold_table,
            bad_integrity,
        })
    }
}

/// Parse a size: plain bytes or a number with a binary or decimal unit.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err("not a number".into());
    }
    let n: u64 = num.parse().map_err(|_| "number too large".to_string())?;
    let mult: u64 = match unit {
        "" => 1,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        u => return Err(format!("unknown unit \"{u}\"")),
    };
    n.checked_mul(mult).ok_or_else(|| "too large".to_string())
}

/// The stable UUID of physical device `index`: the same in every process.
pub fn device_uuid(index: usize) -> [u8; 16] {
    let mut u = [0xfa, 0x4e, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0];
    u[14] = (index >> 8) as u8;
    u[15] = index as u8;
    u
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and `nvidia-smi` print a UUID.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// `CUDA_VISIBLE_DEVICES` as the driver reads it: indices or `GPU-` UUID prefixes, separated by
/// commas, up to the first entry that is invalid, unknown or repeated.
pub fn parse_visible(v: &str, devices: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for entry in v.split(',') {
        let e = entry.trim();
        let idx = if let Ok(i) = e.parse::<usize>() {
            (i < devices).then_some(i)
        } else if e.len() > 4 && e.starts_with("GPU-") {
            let matches: Vec<usize> = (0..devices)
                .filter(|&i| uuid_string(&device_uuid(i)).starts_with(e))
                .collect();
            (matches.len() == 1).then(|| matches[0])
        } else {
            None
        };
        match idx {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The configuration, read once; the error line is printed once, by the first caller, so
/// callers only need to know that it failed.
#[allow(clippy::result_unit_err)]
pub fn config() -> Result<&'static Config, ()> {
    static CONFIG: std::sync::OnceLock<Result<Config, String>> = std::sync::OnceLock::new();
    let r = CONFIG.get_or_init(|| {
        let r = Config::from_env(|k| std::env::var(k).ok());
        if let Err(e) = &r {
            eprintln!("{e}");
        }
        r
    });
    r.as_ref().map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_env(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!((c.devices, c.memory, c.kernel_ns), (1, 16 << 30, 100_000));
        assert_eq!(c.visible, vec![0]);
        assert_eq!(c.driver_version, DEFAULT_DRIVER_VERSION);
        assert!(c.debug == 0 && !c.bad_integrity && c.withhold_table.is_none());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16Gi"), Ok(16 << 30));
        assert_eq!(parse_size("16384Mi"), Ok(16 << 30));
        assert_eq!(parse_size("16G"), Ok(16_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        for bad in [
            "12XB",
            "-1",
            "1.5Gi",
            "",
            "Gi",
            "99999999999999999999",
            "16777216Ti",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn bad_values_name_the_variable_and_the_accepted_forms() {
        let e = cfg(&[("FAKEGPU_MEMORY", "12XB")]).unwrap_err();
        assert!(e.starts_with("fakegpu: FAKEGPU_MEMORY=12XB: "), "{e}");
        assert!(e.contains("accepted: "), "{e}");
        assert!(cfg(&[("FAKEGPU_MEMORY", "0")]).is_err());
        let e = cfg(&[("FAKEGPU_DEVICES", "two")]).unwrap_err();
        assert!(
            e.contains("FAKEGPU_DEVICES=two") && e.contains("accepted"),
            "{e}"
        );
        assert!(cfg(&[("FAKEGPU_DEVICES", "17")]).is_err());
        assert!(cfg(&[("FAKEGPU_DEVICES", "-1")]).is_err());
        assert!(cfg(&[("FAKEGPU_KERNEL_US", "1.5")]).is_err());
        assert!(cfg(&[("FAKEGPU_KERNEL_US", "-3")]).is_err());
        assert!(cfg(&[("FAKEGPU_TIMESLICE_US", "5")]).is_err());
        assert!(cfg(&[("FAKEGPU_DRIVER_VERSION", "13.0")]).is_err());
        assert!(cfg(&[("FAKEGPU_DEBUG", "yes")]).is_err());
        assert!(cfg(&[("FAKEGPU_WITHHOLD_TABLE", "xyz")]).is_err());
        assert_eq!(
            cfg(&[("FAKEGPU_DRIVER_VERSION", "12090")])
                .unwrap()
                .driver_version,
            12090
        );
        assert_eq!(
            cfg(&[("FAKEGPU_WITHHOLD_TABLE", "D4082055")])
                .unwrap()
                .withhold_table
                .as_deref(),
            Some("d4082055")
        );
        assert_eq!(
            cfg(&[("FAKEGPU_KERNEL_US", "250")]).unwrap().kernel_ns,
            250_000
        );
    }

    #[test]
    fn visible_devices_like_the_driver() {
        assert_eq!(parse_visible("1,0", 2), vec![1, 0]);
        assert_eq!(parse_visible("0,5,1", 2), vec![0]);
        assert_eq!(parse_visible("", 2), Vec::<usize>::new());
        assert_eq!(parse_visible("1,1", 2), vec![1]);
        let u1 = uuid_string(&device_uuid(1));
        assert_eq!(parse_visible(&u1, 3), vec![1]);
        assert_eq!(parse_visible(&format!("{u1},0"), 3), vec![1, 0]);
        // An ambiguous prefix stops the list.
        assert_eq!(parse_visible("GPU-fa4e", 3), Vec::<usize>::new());
    }

    #[test]
    fn uuids_are_stable_and_distinct() {
        assert_eq!(
            uuid_string(&device_uuid(0)),
            "GPU-fa4e0000-0000-4000-8000-000000000000"
        );
        assert_ne!(device_uuid(1), device_uuid(2));
    }
}
