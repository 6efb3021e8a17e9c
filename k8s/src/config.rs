//! The plugin's settings: command-line flags, with the environment a DaemonSet sets as
//! defaults (`NODE_NAME`, `GPUSLICE_RUNTIME_DIR`).

use gpuslice_quantity::{kubernetes_bytes, parse_kubernetes};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The default driver name (`ResourceSlice.spec.driver`, `DeviceClass` selectors).
pub const DEFAULT_DRIVER: &str = "gpuslice.dev";

/// Where claims are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimsFrom {
    /// The API server (in-cluster service account, or `KUBECONFIG`).
    Api,
    /// `DIR/<namespace>/<name>.json`, each a ResourceClaim object (tests, dry runs).
    Dir(PathBuf),
}

/// Where the node's ResourceSlice goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishTo {
    /// Server-side apply to the API server.
    Api,
    /// Written (atomically) to this JSON file (tests, dry runs).
    File(PathBuf),
}

/// How the NVIDIA device's own CDI id names a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvidiaCdiName {
    /// `nvidia.com/gpu=GPU-...` (what `nvidia-ctk cdi generate` also writes; stable).
    Uuid,
    /// `nvidia.com/gpu=0`.
    Index,
    /// No NVIDIA CDI id (the runtime gets the GPU some other way).
    None,
}

/// Which kind of gpuslice runtime directory the plugin works in (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerMode {
    /// An existing ledger's own mode; with none yet, node mode for root on the node's default
    /// directory (the root monitor's own rule), else personal.
    Auto,
    /// A node policy made by the root `gpuslice monitor`: the plugin never writes it; slices
    /// are created and removed over `monitor.sock`. It waits for the monitor to create it.
    Node,
    /// A personal ledger the plugin opens (or creates) and writes itself.
    Personal,
}

/// Everything the plugin is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// Driver name.
    pub driver: String,
    /// This node's name (the pool name and `spec.nodeName`).
    pub node_name: String,
    /// The kubelet's plugin registration directory.
    pub registry_dir: PathBuf,
    /// This plugin's directory (its DRA socket is `dra.sock` there).
    pub plugin_dir: PathBuf,
    /// Where CDI specs are written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The gpuslice ledger directory on the host.
    pub runtime_dir: PathBuf,
    /// `libgpuslice.so` on the host (mounted into containers by the CDI spec).
    pub library: PathBuf,
    /// The CDI kind of the claim devices this plugin writes.
    pub cdi_kind: String,
    /// The NVIDIA CDI kind (`nvidia.com/gpu`).
    pub nvidia_cdi_kind: String,
    /// How the NVIDIA CDI device is named.
    pub nvidia_cdi_name: NvidiaCdiName,
    /// Claim source.
    pub claims: ClaimsFrom,
    /// ResourceSlice destination.
    pub publish: PublishTo,
    /// How often devices and reservations are re-read.
    pub resync: Duration,
    /// Memory request policy: the step and minimum (bytes).
    pub memory_step: u64,
    /// Memory a request that names no memory consumes (bytes).
    pub memory_default: u64,
    /// Node or personal mode.
    pub mode: LedgerMode,
    /// Leave the published ResourceSlice in place at a clean exit (the kubelet then deletes
    /// it 30 s after the plugin unregistered, unless a new plugin registers first).
    pub keep_slice_on_exit: bool,
    /// The effect of the taint on a GPU that is gone (`NoSchedule`, `NoExecute`, `None`).
    pub gone_taint_effect: TaintEffect,
}

/// A DRA device taint's effect (`DeviceTaint.effect`, resource.k8s.io/v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    /// No new claim is allocated the device; pods already using it keep running.
    NoSchedule,
    /// As `NoSchedule`, and pods using the device are evicted (deleted) by
    /// kube-controller-manager, unless their claims tolerate the taint.
    NoExecute,
    /// Informational only.
    None,
}

impl TaintEffect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
            TaintEffect::None => "None",
        }
    }
}

/// Usage line.
pub const USAGE: &str = "gpuslice-dra [--node-name NAME] [--driver NAME] [--registry-dir DIR] \
[--plugin-dir DIR] [--cdi-dir DIR] [--runtime-dir DIR] [--library PATH] [--cdi-kind VENDOR/CLASS] \
[--nvidia-cdi-kind VENDOR/CLASS] [--nvidia-cdi-name uuid|index|none] [--claims api|dir:DIR] \
[--publish api|file:PATH] [--resync SECONDS] [--memory-step Q] [--memory-default Q] \
[--mode auto|node|personal] [--keep-slice-on-exit] [--gone-taint-effect NoSchedule|NoExecute|None]";

/// Help text.
pub const HELP: &str = "\
The gpuslice DRA kubelet plugin: publishes this node's GPUs as shareable devices with
`memory` and `compute` capacity, and turns each allocated ResourceClaim into a gpuslice slice
(a VRAM quota and a compute share) plus a CDI device that puts the claim's containers in it.
  --node-name NAME       this node (default $NODE_NAME)
  --driver NAME          driver name (default gpuslice.dev)
  --registry-dir DIR     kubelet plugin registration dir (default /var/lib/kubelet/plugins_registry)
  --plugin-dir DIR       this plugin's socket dir (default /var/lib/kubelet/plugins/<driver>)
  --cdi-dir DIR          where CDI specs (and each one's files, NAME.d/) go (default /var/run/cdi)
  --runtime-dir DIR      gpuslice ledger dir (default $GPUSLICE_RUNTIME_DIR or /dev/shm/gpuslice)
  --library PATH         libgpuslice.so on the host (default /usr/lib/gpuslice/libgpuslice.so)
  --cdi-kind K           CDI kind of claim devices (default gpuslice.dev/slice)
  --nvidia-cdi-kind K    the NVIDIA CDI kind returned beside it (default nvidia.com/gpu)
  --nvidia-cdi-name N    uuid (default), index, or none
  --claims SRC           api (default) or dir:DIR (DIR/<namespace>/<name>.json)
  --publish DST          api (default) or file:PATH (the ResourceSlice as JSON)
  --resync SECONDS       how often GPUs and reservations are re-read (default 10)
  --memory-step Q        memory request step and minimum (default 256Mi)
  --memory-default Q     memory of a request that asks for none (default 1Gi)
  --mode M               node: the root monitor's policy, slices made over monitor.sock;
                         personal: a ledger the plugin writes itself; auto (default): an
                         existing ledger's mode, else node for root on /dev/shm/gpuslice
  --keep-slice-on-exit   leave the ResourceSlice at a clean exit (default: delete it)
  --gone-taint-effect E  the effect of the taint <driver>/gone on a published GPU that NVML
                         no longer lists or reports lost: NoSchedule (default: no new claims
                         there), NoExecute (also evicts the pods using it), or None
A GPU with less than two --memory-step steps of memory left after operator slices is left
out of the ResourceSlice (logged); a slice the API server refuses is logged once and sent
again when the GPUs or their reservations change.
`gpuslice-dra slice [FLAGS]` prints the ResourceSlice the plugin would publish now (JSON;
for `kubectl apply --dry-run=server --validate=strict -f -`), reading NVML and the ledger only.
`gpuslice-dra cleanup --help`: removing the driver's ResourceSlices at uninstall.";

/// The value of the flag just read, as UTF-8.
fn value(p: &mut lexopt::Parser) -> Result<String, ConfigError> {
    p.value()
        .map_err(|e| ConfigError::Usage(e.to_string()))?
        .into_string()
        .map_err(|v| ConfigError::Usage(format!("{v:?} is not UTF-8")))
}

/// `gpuslice-dra cleanup`: the ResourceSlices to remove when the driver is uninstalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleanup {
    /// Driver name (`spec.driver` of the slices removed).
    pub driver: String,
    /// Only this node's slices; `None`: every node's (`--all-nodes`).
    pub node: Option<String>,
    /// Where the slices are (`api`; `file:PATH` removes that file).
    pub publish: PublishTo,
}

/// Usage line of `cleanup`.
pub const CLEANUP_USAGE: &str =
    "gpuslice-dra cleanup [--node-name NAME | --all-nodes] [--driver NAME] [--publish api|file:PATH]";

/// Help text of `cleanup`.
pub const CLEANUP_HELP: &str = "\
Removes the driver's ResourceSlices (uninstall: the chart's pre-delete Job runs it with
--all-nodes, deploy/cleanup.yaml; a plugin stopped by SIGTERM does the same for its node).
  --node-name NAME   that node's slices (default $NODE_NAME)
  --all-nodes        every node's slices of the driver
  --driver NAME      driver name (default gpuslice.dev)
  --publish DST      api (default) or file:PATH (removes the file)";

impl Cleanup {
    /// Parse the flags after `cleanup`.
    pub fn parse(args: Vec<OsString>) -> Result<Cleanup, ConfigError> {
        use lexopt::Arg::Long;
        let mut p = lexopt::Parser::from_args(args);
        let mut driver = DEFAULT_DRIVER.to_string();
        let mut node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
        let mut all = false;
        let mut publish = PublishTo::Api;
        let usage = |e: lexopt::Error| ConfigError::Usage(e.to_string());
        while let Some(arg) = p.next().map_err(usage)? {
            match arg {
                Long("help") | lexopt::Arg::Short('h') => return Err(ConfigError::Help),
                Long("driver") => driver = value(&mut p)?,
                Long("node-name") => node = Some(value(&mut p)?),
                Long("all-nodes") => all = true,
                Long("publish") => {
                    let v = value(&mut p)?;
                    publish = match api_or("--publish", &v, "file:", "api or file:PATH")? {
                        None => PublishTo::Api,
                        Some(f) => PublishTo::File(f.into()),
                    }
                }
                other => return Err(ConfigError::Usage(other.unexpected().to_string())),
            }
        }
        let node = match (all, node) {
            (true, _) => None,
            (false, Some(n)) => Some(n),
            (false, None) => {
                return Err(ConfigError::Usage(
                    "cleanup: name the node (--node-name, or NODE_NAME) or pass --all-nodes".into(),
                ))
            }
        };
        Ok(Cleanup {
            driver,
            node,
            publish,
        })
    }
}

/// Why the flags were refused.
#[derive(Debug)]
pub enum ConfigError {
    /// `--help`.
    Help,
    /// A bad flag or value.
    Usage(String),
}

/// A `--claims`/`--publish` value: `api`, or `PREFIX` and a non-empty rest (`dir:DIR`,
/// `file:PATH`), `Some(rest)`; anything else is bad usage, `expected` saying what is taken.
fn api_or<'v>(
    flag: &str,
    v: &'v str,
    prefix: &str,
    expected: &str,
) -> Result<Option<&'v str>, ConfigError> {
    match v.strip_prefix(prefix) {
        _ if v == "api" => Ok(None),
        Some(rest) if !rest.is_empty() => Ok(Some(rest)),
        _ => Err(ConfigError::Usage(format!("{flag} {v:?}: {expected}"))),
    }
}

/// The value named `v` among `choices`; bad usage naming `flag` and every choice otherwise.
fn one_of<T: Copy>(flag: &str, v: &str, choices: &[(&str, T)]) -> Result<T, ConfigError> {
    match choices.iter().find(|c| c.0 == v) {
        Some(c) => Ok(c.1),
        None => {
            let names: Vec<&str> = choices.iter().map(|c| c.0).collect();
            let names = names.join(", ");
            Err(ConfigError::Usage(format!("{flag} {v:?}: one of {names}")))
        }
    }
}

fn size(flag: &str, v: &str) -> Result<u64, ConfigError> {
    let b = parse_kubernetes(flag, v).map_err(|e| ConfigError::Usage(e.to_string()))?;
    u64::try_from(b)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| ConfigError::Usage(format!("{flag} {v:?}: must be above 0 and below 16Ei")))
}

impl Config {
    /// Parse flags (without the program name).
    pub fn parse(args: Vec<OsString>) -> Result<Config, ConfigError> {
        use lexopt::Arg::Long;
        let mut p = lexopt::Parser::from_args(args);
        let mut driver = DEFAULT_DRIVER.to_string();
        let mut node_name = std::env::var("NODE_NAME").unwrap_or_default();
        let mut registry_dir = PathBuf::from("/var/lib/kubelet/plugins_registry");
        let mut plugin_dir: Option<PathBuf> = None;
        let mut cdi_dir = PathBuf::from("/var/run/cdi");
        let mut runtime_dir = gpuslice_ledger::dir::runtime_dir_var()
            .unwrap_or_else(|| PathBuf::from(gpuslice_ledger::DEFAULT_RUNTIME_DIR));
        let mut library = PathBuf::from(gpuslice_cdi::CONTAINER_LIBRARY);
        let mut cdi_kind = gpuslice_cdi::DEFAULT_KIND.to_string();
        let mut nvidia_cdi_kind = "nvidia.com/gpu".to_string();
        let mut nvidia_cdi_name = NvidiaCdiName::Uuid;
        let mut claims = ClaimsFrom::Api;
        let mut publish = PublishTo::Api;
        let mut resync = Duration::from_secs(10);
        let mut memory_step = 256 << 20;
        let mut memory_default = 1 << 30;
        let mut mode = LedgerMode::Auto;
        let mut keep_slice_on_exit = false;
        let mut gone_taint_effect = TaintEffect::NoSchedule;
        let usage = |e: lexopt::Error| ConfigError::Usage(e.to_string());
        while let Some(arg) = p.next().map_err(usage)? {
            match arg {
                Long("help") | lexopt::Arg::Short('h') => return Err(ConfigError::Help),
                Long("driver") => driver = value(&mut p)?,
                Long("node-name") => node_name = value(&mut p)?,
                Long("registry-dir") => registry_dir = value(&mut p)?.into(),
                Long("plugin-dir") => plugin_dir = Some(value(&mut p)?.into()),
                Long("cdi-dir") => cdi_dir = value(&mut p)?.into(),
                Long("runtime-dir") => runtime_dir = value(&mut p)?.into(),
                Long("library") => library = value(&mut p)?.into(),
                Long("cdi-kind") => cdi_kind = value(&mut p)?,
                Long("nvidia-cdi-kind") => nvidia_cdi_kind = value(&mut p)?,
                Long("nvidia-cdi-name") => {
                    let names = [
                        ("uuid", NvidiaCdiName::Uuid),
                        ("index", NvidiaCdiName::Index),
                        ("none", NvidiaCdiName::None),
                    ];
                    nvidia_cdi_name = one_of("--nvidia-cdi-name", &value(&mut p)?, &names)?;
                }
                Long("claims") => {
                    let v = value(&mut p)?;
                    claims = match api_or("--claims", &v, "dir:", "api or dir:DIR")? {
                        None => ClaimsFrom::Api,
                        Some(d) => ClaimsFrom::Dir(d.into()),
                    }
                }
                Long("publish") => {
                    let v = value(&mut p)?;
                    publish = match api_or("--publish", &v, "file:", "api or file:PATH")? {
                        None => PublishTo::Api,
                        Some(f) => PublishTo::File(f.into()),
                    }
                }
                Long("resync") => {
                    let v = value(&mut p)?;
                    resync = v
                        .parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 0.05 && *s <= 86400.0)
                        .map(Duration::from_secs_f64)
                        .ok_or_else(|| {
                            ConfigError::Usage(format!(
                                "--resync {v:?}: seconds between 0.05 and 86400"
                            ))
                        })?;
                }
                Long("memory-step") => memory_step = size("--memory-step", &value(&mut p)?)?,
                Long("memory-default") => {
                    memory_default = size("--memory-default", &value(&mut p)?)?
                }
                Long("mode") => {
                    let modes = [
                        ("auto", LedgerMode::Auto),
                        ("node", LedgerMode::Node),
                        ("personal", LedgerMode::Personal),
                    ];
                    mode = one_of("--mode", &value(&mut p)?, &modes)?;
                }
                Long("keep-slice-on-exit") => keep_slice_on_exit = true,
                Long("gone-taint-effect") => {
                    let effects = [
                        ("NoSchedule", TaintEffect::NoSchedule),
                        ("NoExecute", TaintEffect::NoExecute),
                        ("None", TaintEffect::None),
                    ];
                    gone_taint_effect = one_of("--gone-taint-effect", &value(&mut p)?, &effects)?;
                }
                other => return Err(ConfigError::Usage(other.unexpected().to_string())),
            }
        }
        if node_name.is_empty() {
            return Err(ConfigError::Usage(
                "no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from \
                 spec.nodeName)"
                    .into(),
            ));
        }
        if memory_default < memory_step || !memory_default.is_multiple_of(memory_step) {
            return Err(ConfigError::Usage(format!(
                "--memory-default ({}) must be a multiple of --memory-step ({})",
                kubernetes_bytes(memory_default),
                kubernetes_bytes(memory_step)
            )));
        }
        for (flag, p) in [
            ("--runtime-dir", &runtime_dir),
            ("--library", &library),
            ("--cdi-dir", &cdi_dir),
        ] {
            if !p.is_absolute() {
                return Err(ConfigError::Usage(format!(
                    "{flag} {}: must be an absolute path (it is a host path in CDI specs)",
                    p.display()
                )));
            }
        }
        let plugin_dir =
            plugin_dir.unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&driver));
        Ok(Config {
            driver,
            node_name,
            registry_dir,
            plugin_dir,
            cdi_dir,
            runtime_dir,
            library,
            cdi_kind,
            nvidia_cdi_kind,
            nvidia_cdi_name,
            claims,
            publish,
            resync,
            memory_step,
            memory_default,
            mode,
            keep_slice_on_exit,
            gone_taint_effect,
        })
    }

    /// The registration socket the kubelet watches for.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// The DRA service socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        Config::parse(args.iter().map(Into::into).collect()).map_err(|e| match e {
            ConfigError::Help => "help".into(),
            ConfigError::Usage(m) => m,
        })
    }

    #[test]
    fn defaults_and_paths() {
        let c = parse(&["--node-name", "n1", "--runtime-dir", "/dev/shm/g"]).unwrap();
        assert_eq!(c.driver, DEFAULT_DRIVER);
        assert_eq!(
            c.plugin_dir,
            PathBuf::from("/var/lib/kubelet/plugins/gpuslice.dev")
        );
        assert_eq!(
            c.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpuslice.dev-reg.sock")
        );
        assert_eq!(
            c.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/gpuslice.dev/dra.sock")
        );
        assert_eq!((c.memory_step, c.memory_default), (256 << 20, 1 << 30));
        assert_eq!(c.claims, ClaimsFrom::Api);
        assert_eq!(c.nvidia_cdi_name, NvidiaCdiName::Uuid);
        let c = parse(&[
            "--node-name=n",
            "--claims",
            "dir:/x",
            "--publish=file:/y.json",
            "--nvidia-cdi-name",
            "index",
        ])
        .unwrap();
        assert_eq!(c.claims, ClaimsFrom::Dir("/x".into()));
        assert_eq!(c.publish, PublishTo::File("/y.json".into()));
        assert_eq!(c.nvidia_cdi_name, NvidiaCdiName::Index);
        assert_eq!((c.mode, c.keep_slice_on_exit), (LedgerMode::Auto, false));
        let c = parse(&["--node-name=n", "--mode", "node", "--keep-slice-on-exit"]).unwrap();
        assert_eq!((c.mode, c.keep_slice_on_exit), (LedgerMode::Node, true));
        assert_eq!(c.gone_taint_effect, TaintEffect::NoSchedule);
        let c = parse(&["--node-name=n", "--gone-taint-effect", "NoExecute"]).unwrap();
        assert_eq!(c.gone_taint_effect.as_str(), "NoExecute");
        let e = parse(&["--node-name=n", "--gone-taint-effect=noexecute"]).unwrap_err();
        assert!(e.contains("one of NoSchedule, NoExecute, None"), "{e}");
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (args, says) in [
            (&["--node-name", "n", "--library", "lib.so"][..], "absolute"),
            (&["--node-name", "n", "--resync", "0"][..], "--resync"),
            (&["--node-name", "n", "--resync", "x"][..], "--resync"),
            (
                &["--node-name", "n", "--memory-default", "300Mi"][..],
                "multiple of --memory-step",
            ),
            (&["--node-name", "n", "--memory-step", "0"][..], "above 0"),
            (
                &["--node-name", "n", "--memory-step", "4XB"][..],
                "--memory-step=\"4XB\" is not valid: unknown suffix",
            ),
            (
                &["--node-name", "n", "--claims", "dir:"][..],
                "api or dir:DIR",
            ),
            (
                &["--node-name", "n", "--publish", "dir:/x"][..],
                "api or file:PATH",
            ),
            (
                &["--node-name", "n", "--nvidia-cdi-name", "serial"][..],
                "uuid, index, none",
            ),
            (&["--node-name", "n", "--bogus"][..], "bogus"),
            (
                &["--node-name", "n", "--mode", "shared"][..],
                "auto, node, personal",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        assert_eq!(parse(&["--help"]).unwrap_err(), "help");
    }
}
