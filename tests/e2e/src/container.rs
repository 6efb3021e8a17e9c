//! A container as a CDI runtime (runc under containerd, podman, docker) makes one for a device
//! of a CDI spec, for the tests of what a container's processes get: a private mount namespace
//! (`unshare -m`), whose root is the host's own root under a copy-on-write overlay (the image:
//! mount points are created in it, never on the host), with the device's mounts applied by
//! bind mounts exactly as the spec lists them (read from the spec, in its order, with its
//! options), the fake GPU's libraries where the GPU's own CDI device puts the driver's (the
//! system library directory, then `ldconfig`, as the NVIDIA toolkit's hook runs it), and the
//! test's own directories (the fake GPU's state, the binaries) at their host paths.
//!
//! Each [`Container::command`] is a process started in such a container (`chroot`), as a
//! given uid (`setpriv`), with exactly the environment given and nothing else (`env -i`): what
//! a container's process that cleared its environment has. Needs root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A device of a CDI spec, ready to start processes in ([`Container::command`]).
pub struct Container {
    /// Scratch space: the overlay's layer and the root it is mounted at.
    scratch: PathBuf,
    /// The shell commands that build the container's root at `$R`.
    setup: String,
    /// The device's environment edits.
    env: Vec<(String, String)>,
}

/// `s` quoted for `sh`.
fn q(s: impl AsRef<std::ffi::OsStr>) -> String {
    let s = s.as_ref().to_string_lossy();
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The system library directory of this architecture (glibc's default search path, where the
/// NVIDIA toolkit mounts the driver's libraries).
fn system_lib_dir() -> String {
    format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH)
}

impl Container {
    /// The container of device `id` (`KIND=NAME`) of the specs in `cdi_dir`, with the fake
    /// GPU's libraries of `driver_dir` (`libcuda.so.1`, `libnvidia-ml.so.1`) as its driver and
    /// the host directories `shared` at their own paths.
    pub fn new(cdi_dir: &Path, id: &str, driver_dir: &Path, shared: &[&Path]) -> Container {
        let (kind, name) = id.split_once('=').expect("a CDI device id is KIND=NAME");
        let edits = std::fs::read_dir(cdi_dir)
            .unwrap()
            .filter_map(|e| {
                let spec: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(e.ok()?.path()).ok()?).ok()?;
                (spec["kind"] == kind).then_some(spec)
            })
            .find_map(|spec| {
                spec["devices"]
                    .as_array()?
                    .iter()
                    .find(|d| d["name"] == name)
                    .map(|d| d["containerEdits"].clone())
            })
            .unwrap_or_else(|| panic!("no CDI device {id} in {}", cdi_dir.display()));
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch =
            std::env::temp_dir().join(format!("gpuslice-container-{}-{n}", std::process::id()));
        std::fs::create_dir_all(scratch.join("layer")).unwrap();
        std::fs::create_dir_all(scratch.join("root")).unwrap();

        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        line("set -e".into());
        line(format!("D={}; R=$D/root", q(&scratch)));
        // The image: the host's root, copy-on-write, on a layer of its own (a tmpfs, so the
        // layer is never on the filesystem it covers).
        line("mount -t tmpfs -o mode=0755 gpuslice-test-layer \"$D/layer\"".into());
        line("mkdir \"$D/layer/upper\" \"$D/layer/work\"".into());
        line(
            "mount -t overlay overlay -o \"lowerdir=/,upperdir=$D/layer/upper,workdir=$D/layer/work\" \"$R\""
                .into(),
        );
        // A bind mount as runc makes one: the mount point created (a directory for a
        // directory, an empty file for a file), the source bound, then its flags set.
        line(
            "bind() { if [ -d \"$1\" ]; then mkdir -p \"$R$2\"; else mkdir -p \"$(dirname \"$R$2\")\"; \
             [ -e \"$R$2\" ] || : > \"$R$2\"; fi; mount \"--$3\" \"$1\" \"$R$2\"; \
             [ -z \"$4\" ] || mount -o \"remount,bind,$4\" \"$R$2\"; }"
                .into(),
        );
        for p in ["/proc", "/dev", "/sys"] {
            line(format!("bind {p} {p} rbind ''"));
        }
        for p in shared {
            line(format!("bind {} {} bind ''", q(p), q(p)));
        }
        for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let at = format!("{}/{lib}", system_lib_dir());
            line(format!(
                "bind {} {} bind ro,nosuid,nodev",
                q(driver_dir.join(lib)),
                q(at)
            ));
        }
        // The device's mounts, as the spec says.
        for m in edits["mounts"].as_array().expect("the spec's mounts") {
            let host = m["hostPath"].as_str().unwrap();
            let at = m["containerPath"].as_str().unwrap();
            let mut how = "bind";
            let mut flags = vec![];
            for o in m["options"].as_array().unwrap() {
                match o.as_str().unwrap() {
                    "bind" => how = "bind",
                    "rbind" => how = "rbind",
                    f @ ("ro" | "rw" | "nosuid" | "nodev" | "noexec") => flags.push(f),
                    other => panic!("mount option {other:?} of {m}: teach the test runtime it"),
                }
            }
            if flags.is_empty() {
                flags.push("rw");
            }
            line(format!(
                "bind {} {} {how} {}",
                q(host),
                q(at),
                flags.join(",")
            ));
        }
        line("chroot \"$R\" ldconfig".into());
        let env = edits["env"]
            .as_array()
            .map(|e| {
                e.iter()
                    .map(|v| {
                        let (k, v) = v.as_str().unwrap().split_once('=').unwrap();
                        (k.to_string(), v.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Container {
            scratch,
            setup: s,
            env,
        }
    }

    /// The device's environment edits: what the runtime gives the container's first process,
    /// and `kubectl exec` shells.
    pub fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// `program` (a path inside the container; add its arguments to the command) started in
    /// the container as `uid` (0: root), with `env` its whole environment.
    pub fn command(&self, uid: u32, env: &[(&str, &str)], program: &Path) -> Command {
        self.command_after(uid, env, program, "")
    }

    /// [`Container::command`], with the shell commands `prepare` run as root in the container's
    /// root (`$R` on the host side) before the program starts.
    pub fn command_after(
        &self,
        uid: u32,
        env: &[(&str, &str)],
        program: &Path,
        prepare: &str,
    ) -> Command {
        let mut script = self.setup.clone();
        script.push_str(prepare);
        script.push_str("\nexec chroot \"$R\"");
        if uid != 0 {
            script.push_str(&format!(
                " setpriv --reuid={uid} --regid={uid} --clear-groups --"
            ));
        }
        script.push_str(" env -i");
        for (k, v) in env {
            script.push_str(&format!(" {}", q(format!("{k}={v}"))));
        }
        script.push_str(&format!(" {} \"$@\"\n", q(program)));
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(script)
            .arg("container")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .current_dir("/");
        c
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // The mounts died with their namespaces: what is left are empty mount points.
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// The fake GPU's own variables for `world` (its state directory, devices and memory): what
/// stands for the hardware, which a real driver finds without any variable. A container
/// process that cleared its environment is given these and nothing else.
pub fn fake_gpu_env(world: &crate::World) -> Vec<(String, String)> {
    let mut env = vec![(
        "FAKEGPU_STATE_DIR".to_string(),
        world.fake_state_dir().to_string_lossy().into_owned(),
    )];
    env.extend(world.env.iter().cloned());
    env
}
