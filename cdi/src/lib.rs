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

/// The spec as JSON: one device `name` of `kind`, whose edits add `env` (`KEY`, `VALUE` pairs)
/// after `LD_PRELOAD` and `GPUSLICE_RUNTIME_DIR`, and mount `host_library` and
/// `host_runtime_dir` (absolute host paths).
pub fn spec(
    kind: &str,
    name: &str,
    env: &[(String, String)],
    host_library: &str,
    host_runtime_dir: &str,
) -> serde_json::Value {
    let mut all = vec![
        format!("LD_PRELOAD={CONTAINER_LIBRARY}"),
        format!("GPUSLICE_RUNTIME_DIR={CONTAINER_RUNTIME_DIR}"),
    ];
    all.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    serde_json::json!({
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
    })
}

/// Write `bytes` to `path` through a temporary file in the same directory and rename it, so a
/// runtime watching the CDI directory never reads half a spec (mode 0644 less the umask).
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    write_via_temporary(path, bytes, 0o644)
}

/// [`write_atomically`] for a spec that carries a secret (a claim slice's join secret): the
/// file is mode 0600 from its creation, readable by root (the container runtime) only.
pub fn write_private_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    write_via_temporary(path, bytes, 0o600)
}

/// The temporary file is created exclusively with `mode`, never through a symlink, synced,
/// then renamed over `path`; removed on any failure.
fn write_via_temporary(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
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
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()));
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
