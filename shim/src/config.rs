//! The environment of a wrapped process, as typed configuration (read once, at `cuInit`).
//!
//! Variables (see docs/configuration.md): `GPUSLICE_MEMORY`, `GPUSLICE_COMPUTE`,
//! `GPUSLICE_COMPUTE_CAP`, `GPUSLICE_SLICE`, `GPUSLICE_SLICE_SECRET`, `GPUSLICE_RUNTIME_DIR`,
//! `GPUSLICE_LOG`, `GPUSLICE_DISABLE`, and HAMi's `CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT_<i>`,
//! `CUDA_DEVICE_SM_LIMIT`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`. gpuslice's own variables win
//! over HAMi's; every variable that is set is validated, even one that is overridden, so a
//! typo is never silently ignored. Sizes and fractions use the ledger crate's one parser.
//!
//! The settings file ([`settings_file::CONTAINER_PATH`], which a slice's CDI spec mounts) fills
//! in each of its variables that the environment lacks: the environment wins, the file is
//! checked whole either way, and without it nothing changes. A secure-execution process
//! (setuid, setgid, file capabilities), which `/etc/ld.so.preload` loads the shim into too,
//! takes no variable from its environment, which a less privileged caller chose: only the file.

use crate::env::{getenv, secure_execution};
use crate::log::Level;
use crate::process::DISABLED;
use core::sync::atomic::Ordering::Relaxed;
use gpuslice_quantity::{
    self as quantity, settings_file, Cap, ComputeSetting, PerDevice, QuantityError, Share, Size,
};
use std::path::{Path, PathBuf};

/// `GPUSLICE_DISABLE=1`: pure pass-through. Read without allocating (it is asked inside
/// `dlsym`), once.
#[inline]
pub fn disabled() -> bool {
    match DISABLED.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let off = getenv(c"GPUSLICE_DISABLE").is_some_and(|v| v.to_bytes() == b"1");
            DISABLED.store(if off { 2 } else { 1 }, Relaxed);
            off
        }
    }
}

/// Where a device's quota comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// Value for every device (`GPUSLICE_MEMORY=4Gi`, `CUDA_DEVICE_MEMORY_LIMIT`).
    pub all: Option<(Size, &'static str)>,
    /// Values per device index (`0=4Gi`, `CUDA_DEVICE_MEMORY_LIMIT_<i>`).
    pub each: Vec<(u32, Size, String)>,
}

impl Memory {
    /// The quota of device `i` (as this process numbers devices) and the variable it came from.
    pub fn get(&self, i: u32) -> Option<(Size, String)> {
        if let Some((_, s, v)) = self.each.iter().find(|(j, _, _)| *j == i) {
            return Some((*s, v.clone()));
        }
        self.all.map(|(s, v)| (s, v.to_string()))
    }
}

/// The typed configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Memory quotas; `None` = best effort everywhere.
    pub memory: Option<Memory>,
    /// Compute guarantees and the variable.
    pub compute: Option<(PerDevice<Share>, &'static str)>,
    /// Compute caps and the variable.
    pub compute_cap: Option<(PerDevice<Cap>, &'static str)>,
    /// Slice name (`None`: private).
    pub slice: Option<String>,
    /// Node mode: the slice's join secret (`GPUSLICE_SLICE_SECRET`), sent at admission.
    pub secret: Option<gpuslice_ledger::secret::Secret>,
    /// The compute class of the process's own slices (`GPUSLICE_PRIORITY`; `None`: unset, so a
    /// slice whose class an operator set keeps it).
    pub priority: Option<u32>,
    /// Ledger directory.
    pub runtime_dir: PathBuf,
    /// Log threshold.
    pub log: Level,
}

/// Why the configuration cannot be used; formatted (one line for the user) where `cuInit`
/// reports it.
#[derive(Debug)]
pub enum ConfigError {
    /// A value the settings grammar refused (it names the variable, the value, the forms).
    Quantity(QuantityError),
    /// A variable this module reads itself, with a value it does not accept.
    Invalid {
        /// The variable.
        variable: String,
        /// Its value.
        value: String,
        /// What is accepted.
        accepted: &'static str,
    },
    /// A `CUDA_DEVICE_MEMORY_LIMIT_<suffix>` whose suffix is not a device index.
    BadDeviceVariable(String),
    /// A value the ledger's rules refused (the join secret, the runtime directory).
    Ledger(gpuslice_ledger::LedgerError),
    /// The settings file cannot be read, is not in its format, or sets a value its variable
    /// does not accept (the message names the file, the line and what is accepted).
    SettingsFile(String),
}

impl From<QuantityError> for ConfigError {
    fn from(e: QuantityError) -> Self {
        ConfigError::Quantity(e)
    }
}

impl From<gpuslice_ledger::LedgerError> for ConfigError {
    fn from(e: gpuslice_ledger::LedgerError) -> Self {
        ConfigError::Ledger(e)
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Quantity(e) => e.fmt(f),
            ConfigError::Invalid {
                variable,
                value,
                accepted,
            } => write!(f, "{variable}={value:?} is not valid; accepted: {accepted}"),
            ConfigError::BadDeviceVariable(k) => write!(
                f,
                "{k} is not a valid variable name; accepted: CUDA_DEVICE_MEMORY_LIMIT_<device \
                 index>, e.g. CUDA_DEVICE_MEMORY_LIMIT_0"
            ),
            ConfigError::Ledger(e) => e.fmt(f),
            ConfigError::SettingsFile(m) => f.write_str(m),
        }
    }
}

fn invalid(variable: &str, value: &str, accepted: &'static str) -> ConfigError {
    ConfigError::Invalid {
        variable: variable.into(),
        value: value.into(),
        accepted,
    }
}

/// Add to `vars` each variable of the settings file at `path` that `vars` lacks. No file, no
/// change. Every line is checked, an overridden one too, each on its own with its variable's
/// rule ([`Config::from_vars`]), so an error names the file and the line; a file that cannot
/// be read is an error too (its processes would run outside their slice).
fn add_settings_file(vars: &mut Vec<(String, String)>, path: &Path) -> Result<(), ConfigError> {
    use std::io::Read;
    let shown = path.display();
    let mut text = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => f
            .take(settings_file::MAX_LEN as u64 + 1)
            .read_to_end(&mut text)
            .map(drop),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    }
    .map_err(|e| {
        ConfigError::SettingsFile(format!(
            "{shown}: cannot be read ({e}); accepted: a file every process of the container can \
             read (a slice's CDI spec mounts it read-only, mode 0644), or none"
        ))
    })?;
    let lines = settings_file::parse(&shown.to_string(), &text)
        .map_err(|e| ConfigError::SettingsFile(e.to_string()))?;
    for (key, value, line) in lines {
        let pair = [(key.to_string(), value.to_string())];
        Config::from_vars(&pair)
            .map_err(|e| ConfigError::SettingsFile(format!("{shown} line {line}: {e}")))?;
        if !vars.iter().any(|(k, _)| k == key) {
            vars.extend(pair);
        }
    }
    Ok(())
}

/// FNV-1a, for a stable slice name from a path.
fn fnv1a(s: &[u8]) -> u64 {
    s.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Config {
    /// Read the process environment, and the settings file where there is one (the
    /// environment wins; in a secure-execution process, the file alone).
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut vars: Vec<(String, String)> = if secure_execution() {
            Vec::new()
        } else {
            std::env::vars_os()
                .filter_map(|(k, v)| {
                    Some((
                        k.into_string().ok()?,
                        v.into_string()
                            .unwrap_or_else(|v| v.to_string_lossy().into_owned()),
                    ))
                })
                .filter(|(k, _)| k.starts_with("GPUSLICE_") || k.starts_with("CUDA_DEVICE_"))
                .collect()
        };
        add_settings_file(&mut vars, Path::new(settings_file::CONTAINER_PATH))?;
        Config::from_vars(&vars)
    }

    /// Parse from explicit `(name, value)` pairs (tests, and `from_env`).
    pub fn from_vars(vars: &[(String, String)]) -> Result<Config, ConfigError> {
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());

        let log = match Level::parse(get("GPUSLICE_LOG")) {
            Some(l) => l,
            None => {
                return Err(invalid(
                    "GPUSLICE_LOG",
                    get("GPUSLICE_LOG").unwrap_or_default(),
                    "error, warn, info, debug",
                ))
            }
        };
        match get("GPUSLICE_DISABLE") {
            None | Some("") | Some("0") | Some("1") => {}
            Some(v) => return Err(invalid("GPUSLICE_DISABLE", v, "1 (pass-through) or 0")),
        }

        // HAMi's variables: validated whenever set.
        let hami_all = match get("CUDA_DEVICE_MEMORY_LIMIT") {
            Some(v) => Some(quantity::parse_hami_size("CUDA_DEVICE_MEMORY_LIMIT", v)?),
            None => None,
        };
        let mut hami_each = vec![];
        for (k, v) in vars {
            let Some(idx) = k.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_") else {
                continue;
            };
            let i: u32 = match idx.parse() {
                Ok(i) if idx.bytes().all(|b| b.is_ascii_digit()) && i < 64 => i,
                _ => return Err(ConfigError::BadDeviceVariable(k.clone())),
            };
            hami_each.push((i, Size::Bytes(quantity::parse_hami_size(k, v)?), k.clone()));
        }
        let hami_sm = match get("CUDA_DEVICE_SM_LIMIT") {
            Some(v) => Some(quantity::parse_hami_sm_limit("CUDA_DEVICE_SM_LIMIT", v)?),
            None => None,
        };
        let hami_cache = match get("CUDA_DEVICE_MEMORY_SHARED_CACHE") {
            Some(v) if v.trim().is_empty() => {
                return Err(invalid(
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                    v,
                    "a file path (processes naming the same path share one slice)",
                ))
            }
            Some(v) => Some(format!("hami-{:016x}", fnv1a(v.trim().as_bytes()))),
            None => None,
        };

        let memory = match get("GPUSLICE_MEMORY") {
            Some(v) => Some(
                match quantity::parse_size_per_device("GPUSLICE_MEMORY", v)? {
                    PerDevice::All(s) => Memory {
                        all: Some((s, "GPUSLICE_MEMORY")),
                        each: vec![],
                    },
                    PerDevice::Each(list) => Memory {
                        all: None,
                        each: list
                            .into_iter()
                            .map(|(i, s)| (i, s, "GPUSLICE_MEMORY".to_string()))
                            .collect(),
                    },
                },
            ),
            None if hami_all.is_some() || !hami_each.is_empty() => Some(Memory {
                all: hami_all.map(|b| (Size::Bytes(b), "CUDA_DEVICE_MEMORY_LIMIT")),
                each: hami_each,
            }),
            None => None,
        };
        let compute = match get("GPUSLICE_COMPUTE") {
            Some(v) => Some((
                quantity::parse_fraction_per_device("GPUSLICE_COMPUTE", v)?,
                "GPUSLICE_COMPUTE",
            )),
            None => None,
        };
        let compute_cap = match get("GPUSLICE_COMPUTE_CAP") {
            Some(v) => Some((
                quantity::parse_cap_per_device("GPUSLICE_COMPUTE_CAP", v)?,
                "GPUSLICE_COMPUTE_CAP",
            )),
            None => hami_sm.map(|c| (PerDevice::All(c), "CUDA_DEVICE_SM_LIMIT")),
        };
        if let (Some((share, share_var)), Some((cap, cap_var))) = (&compute, &compute_cap) {
            let raw = |k: &str| get(k).unwrap_or_default();
            quantity::check_cap_not_below_share(
                ComputeSetting {
                    setting: share_var,
                    value: raw(share_var),
                    parsed: share,
                },
                ComputeSetting {
                    setting: cap_var,
                    value: raw(cap_var),
                    parsed: cap,
                },
            )?;
        }
        let slice = match get("GPUSLICE_SLICE") {
            Some(v) => {
                quantity::check_slice_name("GPUSLICE_SLICE", v)?;
                Some(v.to_string())
            }
            None => hami_cache,
        };
        let secret = get(gpuslice_ledger::secret::SECRET_VAR)
            .map(|v| gpuslice_ledger::secret::Secret::parse(gpuslice_ledger::secret::SECRET_VAR, v))
            .transpose()?;
        // Read here only, so a bad value fails cuInit; admission and the compute gate use it.
        let priority = get("GPUSLICE_PRIORITY")
            .map(|v| {
                gpuslice_sched::parse_class(v)
                    .ok_or_else(|| invalid("GPUSLICE_PRIORITY", v, "latency, normal"))
            })
            .transpose()?;
        // The ledger crate's one rule (absolute, or refused; the default depends on the user).
        let runtime_dir = match get("GPUSLICE_RUNTIME_DIR") {
            Some(v) => {
                let p = PathBuf::from(v);
                gpuslice_ledger::dir::check_absolute(&p)?;
                p
            }
            None => gpuslice_ledger::dir::default_runtime_dir(),
        };
        Ok(Config {
            memory,
            compute,
            compute_cap,
            slice,
            secret,
            priority,
            runtime_dir,
            log,
        })
    }

    /// Compute share of device `i`.
    pub fn share(&self, i: u32) -> Share {
        self.compute
            .as_ref()
            .and_then(|(p, _)| p.get(i))
            .unwrap_or(Share::NONE)
    }

    /// Compute cap of device `i`.
    pub fn cap(&self, i: u32) -> Cap {
        self.compute_cap
            .as_ref()
            .and_then(|(p, _)| p.get(i))
            .unwrap_or(Cap::NONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(
            &v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn precedence_and_hami() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "512m"),
        ])
        .unwrap();
        let m = c.memory.unwrap();
        assert_eq!(m.get(0).unwrap().0, Size::Bytes(1 << 30));
        assert_eq!(
            m.get(1).unwrap(),
            (Size::Bytes(512 << 20), "CUDA_DEVICE_MEMORY_LIMIT_1".into())
        );
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("GPUSLICE_MEMORY", "2Gi"),
        ])
        .unwrap();
        assert_eq!(c.memory.unwrap().get(3).unwrap().0, Size::Bytes(2 << 30));
        let c = cfg(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x"),
        ])
        .unwrap();
        assert_eq!(c.cap(0), Cap::from_ppm(300_000));
        assert!(c.slice.unwrap().starts_with("hami-"));
        let secret = "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy";
        let c = cfg(&[("GPUSLICE_SLICE", "s"), ("GPUSLICE_SLICE_SECRET", secret)]).unwrap();
        assert_eq!(c.secret.as_ref().map(|s| s.expose()), Some(secret));
        assert!(!format!("{c:?}").contains(secret), "Debug never shows it");
        let c = cfg(&[
            ("GPUSLICE_COMPUTE", "0.25"),
            ("GPUSLICE_COMPUTE_CAP", "50%"),
        ])
        .unwrap();
        assert_eq!(
            (c.share(0), c.cap(0)),
            (Share::from_ppm(250_000), Cap::from_ppm(500_000))
        );
    }

    #[test]
    fn every_variable_rejects_bad_values() {
        for (k, v) in [
            ("GPUSLICE_MEMORY", "12XB"),
            ("GPUSLICE_MEMORY", "-1"),
            ("GPUSLICE_MEMORY", "1.5"),
            ("GPUSLICE_COMPUTE", "1.5"),
            ("GPUSLICE_COMPUTE_CAP", "0"),
            ("GPUSLICE_COMPUTE_CAP", "2"),
            ("GPUSLICE_SLICE", "a b"),
            ("GPUSLICE_SLICE", ""),
            ("GPUSLICE_SLICE", "pid-7"),
            ("GPUSLICE_SLICE_SECRET", "short"),
            ("GPUSLICE_SLICE_SECRET", ""),
            ("GPUSLICE_SLICE_SECRET", "0123456789abcdef 0123456789abcdef"),
            ("GPUSLICE_PRIORITY", "urgent"),
            ("GPUSLICE_PRIORITY", ""),
            ("GPUSLICE_RUNTIME_DIR", "relative"),
            ("GPUSLICE_LOG", "loud"),
            ("GPUSLICE_DISABLE", "yes"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "12XB"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "99999999999999999999g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_x", "1g"),
            ("CUDA_DEVICE_SM_LIMIT", "150"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", ""),
        ] {
            let e = cfg(&[(k, v)]).expect_err(&format!("{k}={v}")).to_string();
            assert!(e.contains(k) && e.contains("accepted"), "{k}={v}: {e}");
        }
        // A cap below the share it caps: both settings named.
        for (share, cap, var) in [
            ("0.5", "GPUSLICE_COMPUTE_CAP", "0.25"),
            ("0.5", "CUDA_DEVICE_SM_LIMIT", "25"),
        ] {
            let e = cfg(&[("GPUSLICE_COMPUTE", share), (cap, var)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("GPUSLICE_COMPUTE=\"0.5\"") && e.contains(cap) && e.contains("accepted"),
                "{e}"
            );
        }
        assert!(cfg(&[("GPUSLICE_COMPUTE", "0.5"), ("CUDA_DEVICE_SM_LIMIT", "0")]).is_ok());
        // Overridden HAMi values are still checked.
        assert!(cfg(&[
            ("GPUSLICE_MEMORY", "1Gi"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1XB")
        ])
        .is_err());
    }

    /// A settings file with `text` in a fresh directory; the file's path.
    fn settings(name: &str, text: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("gpuslice-settings-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("slice.env");
        std::fs::write(&f, text).unwrap();
        f
    }

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn the_settings_file_fills_in_what_the_environment_lacks() {
        let secret = "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy";
        let f = settings(
            "fill",
            &format!(
                "# header\nGPUSLICE_RUNTIME_DIR=/run/gpuslice\nGPUSLICE_SLICE=claim\n\
                 GPUSLICE_SLICE_SECRET={secret}\nGPUSLICE_MEMORY=4Gi\n"
            ),
        );
        // Nothing in the environment: all from the file.
        let mut v = vec![];
        add_settings_file(&mut v, &f).unwrap();
        let c = Config::from_vars(&v).unwrap();
        assert_eq!(c.slice.as_deref(), Some("claim"));
        assert_eq!(c.secret.as_ref().map(|s| s.expose()), Some(secret));
        assert_eq!(c.runtime_dir, PathBuf::from("/run/gpuslice"));
        assert_eq!(c.memory.unwrap().get(0).unwrap().0, Size::Bytes(4 << 30));
        // The environment wins, variable by variable; the rest comes from the file.
        let mut v = vars(&[("GPUSLICE_MEMORY", "1Gi"), ("GPUSLICE_LOG", "info")]);
        add_settings_file(&mut v, &f).unwrap();
        let c = Config::from_vars(&v).unwrap();
        assert_eq!(c.memory.unwrap().get(0).unwrap().0, Size::Bytes(1 << 30));
        assert_eq!(c.slice.as_deref(), Some("claim"));
        // No file: exactly the environment.
        let mut v = vars(&[("GPUSLICE_SLICE", "x")]);
        add_settings_file(&mut v, &f.with_file_name("none")).unwrap();
        assert_eq!(v, vars(&[("GPUSLICE_SLICE", "x")]));
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }

    #[test]
    fn a_bad_settings_file_is_one_line_naming_the_file_the_line_and_what_is_accepted() {
        for (name, text, want) in [
            (
                "format",
                "GPUSLICE_SLICE=a\nGPUSLICE_MEMROY=1Gi\n",
                "line 2: \"GPUSLICE_MEMROY\"",
            ),
            (
                "value",
                "GPUSLICE_SLICE=a\n\nGPUSLICE_MEMORY=12XB\n",
                "line 3: GPUSLICE_MEMORY",
            ),
            (
                "dir",
                "GPUSLICE_RUNTIME_DIR=run/gpuslice\n",
                "line 1: GPUSLICE_RUNTIME_DIR",
            ),
            (
                "secret",
                "GPUSLICE_SLICE_SECRET=shortsecret\n",
                "line 1: GPUSLICE_SLICE_SECRET",
            ),
        ] {
            let f = settings(name, text);
            // Overridden by the environment or not, a bad line is an error.
            let mut v = vars(&[("GPUSLICE_MEMORY", "1Gi"), ("GPUSLICE_SLICE", "b")]);
            let e = add_settings_file(&mut v, &f).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{} {want}", f.display()))
                    && e.contains("accepted")
                    && !e.contains('\n'),
                "{name}: {e}"
            );
            assert!(!e.contains("shortsecret"), "{e}");
            let _ = std::fs::remove_dir_all(f.parent().unwrap());
        }
        // A directory where the file should be: cannot be read, said so.
        let f = settings("isdir", "");
        std::fs::remove_file(&f).unwrap();
        std::fs::create_dir(&f).unwrap();
        let e = add_settings_file(&mut vec![], &f).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: cannot be read", f.display())) && e.contains("accepted"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }
}
