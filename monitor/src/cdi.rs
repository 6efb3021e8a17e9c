//! `gpuslice cdi`: a Container Device Interface spec that puts one container in a slice.
//!
//! The spec describes one device, `<kind>=<slice>` (by default `gpuslice.dev/slice=NAME`), used
//! beside the GPU's own CDI device (`--device nvidia.com/gpu=0 --device
//! gpuslice.dev/slice=NAME`). Its container edits:
//! - mount the host's `libgpuslice.so` read-only at
//!   [`gpuslice_cdi::CONTAINER_LIBRARY`] and the host's ledger directory read-write at
//!   [`gpuslice_cdi::CONTAINER_RUNTIME_DIR`] (fixed paths, so the spec does not depend
//!   on the image's layout);
//! - set `LD_PRELOAD`, `GPUSLICE_RUNTIME_DIR`, `GPUSLICE_SLICE` and whichever of
//!   `GPUSLICE_MEMORY`, `GPUSLICE_COMPUTE`, `GPUSLICE_COMPUTE_CAP` and the join secret were
//!   given;
//! - with `--output FILE`, mount the files written beside it (`FILE` less its extension, `.d`)
//!   at `/etc/ld.so.preload` and `/etc/gpuslice/slice.env`, so that programs which clear their
//!   environment are in the slice too ([`gpuslice_cdi::write_files`]).
//!
//! Values are checked with the same rules as `gpuslice run` ([`crate::run::Limits`]), and names
//! with the CDI parser's rules, so a spec this writes is one a runtime accepts. JSON is valid CDI
//! (runtimes read `.json` and `.yaml` from `/etc/cdi` and `/var/run/cdi`).

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use crate::cli::{self, Failure};
use crate::run::{self, Limits};

const USAGE: &cli::Command = &crate::commands::CDI;

// The spec builder, its constants and the atomic write live in `gpuslice_cdi`, shared
// with gpuslice-dra.
use gpuslice_cdi::{write_atomically, DEFAULT_KIND};

/// Entry point of `gpuslice cdi`; returns the exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    match cdi(args) {
        Ok(code) => code,
        Err(f) => f.report(),
    }
}

/// What `gpuslice cdi`'s command line asks for, checked.
pub(crate) struct Request {
    limits: Limits,
    slice: String,
    kind: String,
    library: Option<PathBuf>,
    output: Option<PathBuf>,
    secret_file: Option<PathBuf>,
}

/// Parse `gpuslice cdi`'s arguments (no side effects; `--help` is [`Failure::Helped`]).
pub(crate) fn parse(args: Vec<OsString>) -> Result<Request, Failure> {
    let mut limits = Limits::default();
    let mut kind: Option<String> = None;
    let mut library: Option<PathBuf> = None;
    let mut output: Option<PathBuf> = None;
    let mut secret_file: Option<PathBuf> = None;
    let mut args = cli::Args::new(args, USAGE);
    while let Some(arg) = args.next()? {
        match arg {
            lexopt::Arg::Long(name) if Limits::FLAGS.contains(&name) => {
                let name = name.to_string();
                limits.set(&name, &mut args)?;
            }
            lexopt::Arg::Long("kind") => {
                let v = args.utf8("--kind")?;
                check_kind(&v).map_err(|e| Failure::usage(format!("--kind {v:?}: {e}"), USAGE))?;
                cli::once(&mut kind, "--kind", v, USAGE)?;
            }
            lexopt::Arg::Long("library") => {
                let v = args.value()?.into();
                cli::once(&mut library, "--library", v, USAGE)?;
            }
            lexopt::Arg::Long("secret-file") => {
                let v = args.value()?.into();
                cli::once(&mut secret_file, "--secret-file", v, USAGE)?;
            }
            lexopt::Arg::Long("output") | lexopt::Arg::Short('o') => {
                let v = args.value()?.into();
                cli::once(&mut output, "--output", v, USAGE)?;
            }
            other => return Err(Failure::usage(other.unexpected().to_string(), USAGE)),
        }
    }
    limits.check(USAGE)?;
    let kind = kind.unwrap_or_else(|| DEFAULT_KIND.to_string());
    let Some(slice) = limits.slice.clone() else {
        return Err(Failure::usage("--slice NAME is required", USAGE));
    };
    check_device_name(&slice)
        .map_err(|e| Failure::usage(format!("--slice {slice:?}: {e}"), USAGE))?;
    Ok(Request {
        limits,
        slice,
        kind,
        library,
        output,
        secret_file,
    })
}

fn cdi(args: Vec<OsString>) -> Result<i32, Failure> {
    let r = parse(args)?;
    let (limits, slice, kind, output) = (r.limits, r.slice, r.kind, r.output);
    let library = match r.library {
        Some(p) if p.is_file() => p.canonicalize().unwrap_or(p),
        Some(p) => {
            return Err(Failure::usage(
                format!("--library {}: no such file", p.display()),
                USAGE,
            ))
        }
        None => match run::find_library() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("gpuslice: {e}; or name it with --library PATH");
                return Ok(cli::EXIT_USAGE);
            }
        },
    };
    // A mount's hostPath is absolute; the runtime does not run in our working directory.
    let runtime_dir = std::path::absolute(cli::runtime_dir())
        .map_err(|e| Failure::Other(format!("cdi: the ledger directory: {e}")))?;
    if !runtime_dir.is_dir() {
        eprintln!(
            "gpuslice: note: the ledger directory {} does not exist yet; start the node monitor \
             (`gpuslice monitor`) before containers use this spec, or their start fails on the \
             mount",
            runtime_dir.display()
        );
    }
    let secret = r
        .secret_file
        .map(|p| gpuslice_ledger::secret::Secret::read_file(&p))
        .transpose()?;
    let env = env(&limits, secret.as_ref());
    // The spec's own files (the preload list, the settings file) go beside it, first: a
    // runtime never reads a spec whose files are missing. On stdout there is no beside.
    let files = match &output {
        Some(path) => Some(gpuslice_cdi::write_files(path, &env).map_err(|e| {
            Failure::Other(format!(
                "cdi: writing {}: {e}",
                gpuslice_cdi::files_dir(path).display()
            ))
        })?),
        None => {
            eprintln!(
                "gpuslice: note: a spec on stdout has no /etc/ld.so.preload or settings file (they \
                 are written beside a spec written with --output): programs of the container that \
                 clear their environment run outside the slice"
            );
            None
        }
    };
    let spec = gpuslice_cdi::spec(
        &kind,
        &slice,
        &env,
        &library.to_string_lossy(),
        &runtime_dir.to_string_lossy(),
        files.as_deref(),
    );
    let text = serde_json::to_string_pretty(&spec).expect("a JSON value serializes") + "\n";
    match output {
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|e| Failure::Other(format!("cdi: writing the spec to stdout: {e}")))?,
        Some(path) => {
            // A spec with a secret is root's alone (the container runtime reads it as root).
            let write = if secret.is_some() {
                gpuslice_cdi::write_private_atomically
            } else {
                write_atomically
            };
            write(&path, text.as_bytes())
                .map_err(|e| Failure::Other(format!("cdi: writing {}: {e}", path.display())))?;
            eprintln!(
                "gpuslice: wrote {}; run containers with --device nvidia.com/gpu=<N> --device \
                 {kind}={slice}",
                path.display()
            );
        }
    }
    Ok(0)
}

/// The spec's variables besides `LD_PRELOAD` and `GPUSLICE_RUNTIME_DIR`: the limits' (with
/// `GPUSLICE_SLICE`, which is required here) and the join secret.
fn env(limits: &Limits, secret: Option<&gpuslice_ledger::secret::Secret>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = limits
        .env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(s) = secret {
        env.push((
            gpuslice_ledger::secret::SECRET_VAR.to_string(),
            s.expose().to_string(),
        ));
    }
    env
}

/// CDI's rule for a vendor or class name: a letter first, a letter or digit last, letters,
/// digits, `_`, `-`, `.` between.
fn check_vendor_or_class(name: &str) -> Result<(), Broken> {
    let b = name.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return Err(Broken::Empty);
    };
    if !first.is_ascii_alphabetic() || !last.is_ascii_alphanumeric() {
        return Err(Broken::Ends);
    }
    match first_outside(b, b"_-.") {
        Some(c) => Err(Broken::Char(c)),
        None => Ok(()),
    }
}

/// Which of CDI's rules for a name a name breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// It is empty.
    Empty,
    /// It starts or ends with a character the rule does not allow there.
    Ends,
    /// It has this character, allowed nowhere.
    Char(char),
}

/// A CDI kind or device name that CDI's rules refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// A kind without `/`.
    NotAKind,
    /// The kind's `vendor` or `class` (`part`), `name`, breaks the rule.
    KindPart {
        /// `vendor` or `class`.
        part: &'static str,
        /// The part as given.
        name: String,
        /// The rule broken.
        broken: Broken,
    },
    /// A device name breaks the rule.
    Device(Broken),
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::NotAKind => {
                write!(f, "a kind is VENDOR/CLASS, for example gpuslice.dev/slice")
            }
            NameError::KindPart {
                part,
                broken: Broken::Empty,
                ..
            } => write!(f, "{part} empty"),
            NameError::KindPart {
                part,
                name,
                broken: Broken::Ends,
            } => write!(
                f,
                "{part} {name:?} must start with a letter and end with a letter or digit"
            ),
            NameError::KindPart {
                part,
                name,
                broken: Broken::Char(c),
            } => {
                write!(
                    f,
                    "{part} {name:?} has {c:?}; allowed: letters, digits, _ - ."
                )
            }
            NameError::Device(Broken::Empty) => write!(f, "a CDI device name cannot be empty"),
            NameError::Device(Broken::Ends) => {
                write!(
                    f,
                    "a CDI device name starts and ends with a letter or digit"
                )
            }
            NameError::Device(Broken::Char(c)) => write!(
                f,
                "a CDI device name cannot contain {c:?}; allowed: letters, digits, _ - . :"
            ),
        }
    }
}

/// The first character of `name` that is neither a letter, a digit, nor one of `extra`.
fn first_outside(name: &[u8], extra: &[u8]) -> Option<char> {
    let allowed = |c: &u8| c.is_ascii_alphanumeric() || extra.contains(c);
    name.iter().find(|c| !allowed(c)).map(|&c| c as char)
}

/// A CDI kind: `vendor/class`.
pub fn check_kind(kind: &str) -> Result<(), NameError> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(NameError::NotAKind);
    };
    for (part, name) in [("vendor", vendor), ("class", class)] {
        check_vendor_or_class(name).map_err(|broken| NameError::KindPart {
            part,
            name: name.to_string(),
            broken,
        })?;
    }
    Ok(())
}

/// CDI's rule for a device name: a letter or digit first and last, letters, digits, `_`, `-`,
/// `.`, `:` between.
pub fn check_device_name(name: &str) -> Result<(), NameError> {
    let b = name.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return Err(NameError::Device(Broken::Empty));
    };
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err(NameError::Device(Broken::Ends));
    }
    match first_outside(b, b"_-.:") {
        Some(c) => Err(NameError::Device(Broken::Char(c))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_cdi_parser() {
        assert!(check_kind("gpuslice.dev/slice").is_ok());
        assert!(check_kind("nvidia.com/gpu").is_ok());
        for bad in [
            "gpuslice.dev",
            "/slice",
            "gpuslice.dev/",
            "1vendor/x",
            "v/x-",
            "v/x y",
        ] {
            assert!(check_kind(bad).is_err(), "{bad}");
        }
        assert!(check_device_name("team-a").is_ok());
        assert!(check_device_name("0").is_ok());
        assert!(check_device_name("a:b.c_d").is_ok());
        for bad in ["", "-a", "a-", "a/b", "a=b", "a b"] {
            assert!(check_device_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_flag_given_twice_is_bad_usage() {
        for flag in ["--kind", "--output", "--library", "--memory", "--slice"] {
            let value = match flag {
                "--kind" => "x.dev/gpu",
                "--memory" => "1Gi",
                _ => "a",
            };
            let args = ["--slice", "s", flag, value, flag, value].map(OsString::from);
            match cdi(args.to_vec()) {
                Err(Failure::Usage { msg, .. }) => assert!(msg.contains("twice"), "{flag}: {msg}"),
                other => panic!("{flag} twice gave {other:?}"),
            }
        }
    }

    #[test]
    fn a_secret_goes_into_a_private_spec() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("gpuslice-cdi-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let secret = gpuslice_ledger::secret::Secret::generate().unwrap();
        let sf = d.join("s");
        secret.write_new_file(&sf).unwrap();
        let out = d.join("spec.json");
        let exe = std::env::current_exe().unwrap();
        let args = [
            "--slice".into(),
            "team".into(),
            "--secret-file".into(),
            sf.clone().into_os_string(),
            "--library".into(),
            exe.into_os_string(),
            "--output".into(),
            out.clone().into_os_string(),
        ];
        assert_eq!(cdi(args.to_vec()).unwrap(), 0);
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(
            text.contains(&format!("GPUSLICE_SLICE_SECRET={}", secret.expose())),
            "{text}"
        );
        // Beside it, in a root-only directory, the files its mounts name: the settings file
        // (with the secret) readable by any uid of the container through its bind mount.
        let files = d.join("spec.d");
        assert!(
            text.contains(&files.join("slice.env").display().to_string()),
            "{text}"
        );
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&files), 0o700);
        assert_eq!(mode(&files.join("slice.env")), 0o644);
        let settings = std::fs::read_to_string(files.join("slice.env")).unwrap();
        assert!(
            settings.contains("GPUSLICE_SLICE=team\n")
                && settings.contains(&format!("GPUSLICE_SLICE_SECRET={}\n", secret.expose())),
            "{settings}"
        );
        assert_eq!(
            std::fs::read_to_string(files.join("ld.so.preload")).unwrap(),
            "/usr/lib/gpuslice/libgpuslice.so\n"
        );
        // A secret file others can read is refused.
        std::fs::set_permissions(&sf, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut again = args.to_vec();
        again[7] = d.join("other.json").into_os_string();
        assert!(cdi(again).is_err());
        assert!(!d.join("other.json").exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn spec_sets_env_and_mounts() {
        let limits = Limits {
            memory: Some("4Gi".into()),
            compute: Some("0.25".into()),
            slice: Some("a".into()),
            ..Limits::default()
        };
        let s = gpuslice_cdi::spec(
            DEFAULT_KIND,
            "a",
            &env(&limits, None),
            "/usr/local/lib/libgpuslice.so",
            "/dev/shm/gpuslice",
            None,
        );
        let dev = &s["devices"][0];
        assert_eq!(dev["name"], "a");
        let env: Vec<&str> = dev["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(env.contains(&"LD_PRELOAD=/usr/lib/gpuslice/libgpuslice.so"));
        assert!(env.contains(&"GPUSLICE_RUNTIME_DIR=/run/gpuslice"));
        assert!(env.contains(&"GPUSLICE_MEMORY=4Gi"));
        assert!(env.contains(&"GPUSLICE_COMPUTE=0.25"));
        assert!(env.contains(&"GPUSLICE_SLICE=a"));
        assert_eq!(
            dev["containerEdits"]["mounts"][0]["hostPath"],
            "/usr/local/lib/libgpuslice.so"
        );
        assert_eq!(
            dev["containerEdits"]["mounts"][1]["containerPath"],
            "/run/gpuslice"
        );
    }
}
