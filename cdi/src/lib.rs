//! The Container Device Interface spec that puts a container in a slice, built in one place for
//! `gpuslice cdi` (one spec an operator writes by hand) and `gpuslice-dra` (one spec per
//! Kubernetes claim). A crate of its own, above the ledger, so neither the ledger nor the shim
//! carries JSON.
//!
//! The spec describes one device, `<kind>=<name>`, used beside the GPU's own CDI device (which
//! brings the device nodes and driver libraries). Its container edits mount the host's
//! `libgpuslice.so` read-only at [`CONTAINER_LIBRARY`] and the host's ledger directory at
//! [`CONTAINER_RUNTIME_DIR`] (fixed paths, so the spec does not depend on the image's layout),
//! and set `LD_PRELOAD`, `GPUSLICE_RUNTIME_DIR` and the caller's variables (`GPUSLICE_SLICE`,
//! ...). JSON is valid CDI (runtimes read `.json` and `.yaml` from `/etc/cdi` and `/var/run/cdi`).
//!
//! A spec written to a file also has files of its own on the host, in a root-only directory
//! beside it ([`write_files`]), mounted read-only over the container's [`CONTAINER_PRELOAD`]
//! (naming the library, so the loader puts the shim into every dynamically linked program,
//! whatever its environment) and at [`CONTAINER_SETTINGS`] (the same variables, for the
//! programs that lost them).

#![deny(missing_docs)]

/// The CDI version written: the lowest that has everything this spec uses (env and mounts need
/// 0.3.0; 0.5.0 is understood by every CDI-enabled runtime release, newer ones too).
pub const CDI_VERSION: &str = "0.5.0";
/// The default kind (`vendor/class`) of the device.
pub const DEFAULT_KIND: &str = "gpuslice.dev/slice";
/// Where the library appears inside the container.
pub const CONTAINER_LIBRARY: &str = "/usr/lib/gpuslice/libgpuslice.so";
/// Where the ledger directory appears inside the container (`GPUSLICE_RUNTIME_DIR` there).
pub const CONTAINER_RUNTIME_DIR: &str = "/run/gpuslice";
/// The dynamic loader's list of libraries for every program, in the container.
pub const CONTAINER_PRELOAD: &str = "/etc/ld.so.preload";
/// The settings file in the container (the shim's one path for it).
pub const CONTAINER_SETTINGS: &str = gpuslice_quantity::settings_file::CONTAINER_PATH;
/// The host files of a spec, in its files directory ([`files_dir`]).
const PRELOAD_FILE: &str = "ld.so.preload";
const SETTINGS_FILE: &str = "slice.env";

/// The container's variables: `LD_PRELOAD`, `GPUSLICE_RUNTIME_DIR`, then `env`.
fn container_env(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut all = vec![
        ("LD_PRELOAD".to_string(), CONTAINER_LIBRARY.to_string()),
        (
            "GPUSLICE_RUNTIME_DIR".to_string(),
            CONTAINER_RUNTIME_DIR.to_string(),
        ),
    ];
    all.extend_from_slice(env);
    all
}

/// The spec as JSON: one device `name` of `kind`, whose edits add `env` (`KEY`, `VALUE` pairs)
/// after `LD_PRELOAD` and `GPUSLICE_RUNTIME_DIR`, and mount `host_library` and
/// `host_runtime_dir` (absolute host paths) and, with `files` (the directory [`write_files`]
/// made for it), the loader's preload list and the settings file.
pub fn spec(
    kind: &str,
    name: &str,
    env: &[(String, String)],
    host_library: &str,
    host_runtime_dir: &str,
    files: Option<&std::path::Path>,
) -> serde_json::Value {
    let all: Vec<String> = container_env(env)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut spec = serde_json::json!({
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{
            "name": name,
            "containerEdits": {
                "env": all,
                "mounts": [
                    {
                        "hostPath": host_library,
                        "containerPath": CONTAINER_LIBRARY,
                        "options": ["ro", "nosuid", "nodev", "bind"],
                    },
                    {
                        "hostPath": host_runtime_dir,
                        "containerPath": CONTAINER_RUNTIME_DIR,
                        // A node policy is read-only for containers (they reach the monitor's socket,
                        // which a read-only mount does not block); a personal ledger is written
                        // by its user's processes.
                        "options": [
                            if is_node_dir(host_runtime_dir) { "ro" } else { "rw" },
                            "nosuid", "nodev", "noexec", "bind",
                        ],
                    },
                ],
            },
        }],
    });
    if let (Some(dir), Some(mounts)) = (
        files,
        spec["devices"][0]["containerEdits"]["mounts"].as_array_mut(),
    ) {
        for (file, at) in [
            (PRELOAD_FILE, CONTAINER_PRELOAD),
            (SETTINGS_FILE, CONTAINER_SETTINGS),
        ] {
            mounts.push(serde_json::json!({
                "hostPath": dir.join(file).to_string_lossy(),
                "containerPath": at,
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            }));
        }
    }
    spec
}

/// The directory of the host files of the spec at `spec_path`, beside it: `NAME.json` has
/// `NAME.d/` (runtimes read only the files directly in a CDI directory, never a subdirectory).
pub fn files_dir(spec_path: &std::path::Path) -> std::path::PathBuf {
    spec_path.with_extension("d")
}

/// Write the host files of the spec at `spec_path` whose variables are `env` (as given to
/// [`spec`]): the preload list naming [`CONTAINER_LIBRARY`] and the settings file; the
/// directory, made for them. Call it before writing the spec (a runtime never sees a spec
/// whose files are missing); an unchanged file is left alone.
///
/// The directory is root-only (0700: no one else on the host opens what is in it, a join
/// secret included); the files are 0644, whatever the umask, so that the container's
/// processes of any uid read them through the bind mount, which reaches the file without
/// passing through the directory.
pub fn write_files(
    spec_path: &std::path::Path,
    env: &[(String, String)],
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = files_dir(spec_path);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => other?,
    }
    // Never a directory someone else made or can write (or a symlink to one).
    let md = std::fs::symlink_metadata(&dir)?;
    if !md.is_dir() || md.uid() != gpuslice_ledger::dir::euid() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of uid {}",
            dir.display(),
            gpuslice_ledger::dir::euid()
        )));
    }
    if md.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let settings = gpuslice_quantity::settings_file::render(&container_env(env))
        .map_err(std::io::Error::other)?;
    for (file, text) in [
        (PRELOAD_FILE, format!("{CONTAINER_LIBRARY}\n")),
        (SETTINGS_FILE, settings),
    ] {
        let path = dir.join(file);
        if std::fs::read(&path).is_ok_and(|b| b == text.as_bytes()) {
            continue;
        }
        write_via_temporary(&path, text.as_bytes(), 0o644, true)?;
    }
    Ok(dir)
}

/// Remove what [`write_files`] wrote for the spec at `spec_path` (after the spec itself); what
/// is already gone is not an error.
pub fn remove_files(spec_path: &std::path::Path) -> std::io::Result<()> {
    let dir = files_dir(spec_path);
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    for file in [PRELOAD_FILE, SETTINGS_FILE] {
        gone(std::fs::remove_file(dir.join(file)))?;
    }
    gone(std::fs::remove_dir(&dir))
}

/// Write `bytes` to `path` through a temporary file in the same directory and rename it, so a
/// runtime watching the CDI directory never reads half a spec (mode 0644 less the umask).
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    write_via_temporary(path, bytes, 0o644, false)
}

/// [`write_atomically`] for a spec that carries a secret (a claim slice's join secret): the
/// file is mode 0600 from its creation, readable by root (the container runtime) only.
pub fn write_private_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    write_via_temporary(path, bytes, 0o600, false)
}

/// The temporary file is created exclusively with `mode` (less the umask, or exactly `mode`
/// when `exact`), never through a symlink, synced, then renamed over `path`; removed on any
/// failure.
fn write_via_temporary(
    path: &std::path::Path,
    bytes: &[u8],
    mode: u32,
    exact: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut f| {
            if exact {
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            }
            f.write_all(bytes).and_then(|()| f.sync_all())
        });
    written
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

/// Whether `dir` holds a node-mode policy (root's monitor owns it; containers mount it
/// read-only).
pub fn is_node_dir(dir: &str) -> bool {
    gpuslice_ledger::Ledger::open(std::path::Path::new(dir)).is_ok_and(|l| l.is_node())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_specs_files_are_written_beside_it_and_removed_after_it() {
        let d = std::env::temp_dir().join(format!("gpuslice-cdi-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let spec_path = d.join("gpuslice.dev-slice_k8s-x.json");
        let env = [("GPUSLICE_SLICE".to_string(), "k8s-x".to_string())];
        let files = write_files(&spec_path, &env).unwrap();
        assert_eq!(files, d.join("gpuslice.dev-slice_k8s-x.d"));
        assert_eq!(mode(&files), 0o700);
        for f in [PRELOAD_FILE, SETTINGS_FILE] {
            assert_eq!(mode(&files.join(f)), 0o644, "{f}");
        }
        let settings = std::fs::read_to_string(files.join(SETTINGS_FILE)).unwrap();
        let read = gpuslice_quantity::settings_file::parse("f", settings.as_bytes()).unwrap();
        let read: Vec<(&str, &str)> = read.iter().map(|(k, v, _)| (*k, *v)).collect();
        assert_eq!(
            read,
            [
                ("GPUSLICE_RUNTIME_DIR", CONTAINER_RUNTIME_DIR),
                ("GPUSLICE_SLICE", "k8s-x")
            ]
        );
        // The spec mounts exactly those files, read-only, where the loader and the shim look.
        let s = spec("a.dev/b", "x", &env, "/lib.so", "/run/x", Some(&files));
        let mounts = s["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .unwrap();
        for (f, at) in [
            (PRELOAD_FILE, "/etc/ld.so.preload"),
            (SETTINGS_FILE, "/etc/gpuslice/slice.env"),
        ] {
            let m = mounts
                .iter()
                .find(|m| m["containerPath"] == at)
                .unwrap_or_else(|| panic!("{s}"));
            assert_eq!(m["hostPath"], files.join(f).to_str().unwrap());
            assert_eq!(m["options"][0], "ro");
        }
        // A directory loosened by hand is made root-only again; a repeat changes nothing else.
        std::fs::set_permissions(&files, std::fs::Permissions::from_mode(0o755)).unwrap();
        write_files(&spec_path, &env).unwrap();
        assert_eq!(mode(&files), 0o700);
        // Removed (what is gone already is no error); the spec's directory is left as it was.
        remove_files(&spec_path).unwrap();
        remove_files(&spec_path).unwrap();
        assert!(!files.exists());
        // A symlink where the directory would be is refused, never followed.
        std::os::unix::fs::symlink("/tmp", &files).unwrap();
        assert!(write_files(&spec_path, &env).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
