//! Operator slices (`slice create|set|rm`): the device named on the command line resolved,
//! then the change made in the ledger, or asked of the node's monitor by an operator who
//! cannot write the policy.

use super::LedgerWindow;
use crate::cli::Failure;
use crate::view::SliceView;
use gpuslice_ledger::secret::Secret;
use gpuslice_ledger::OperatorSlice;
use gpuslice_quantity::{Cap, Share, Size};

/// What `slice create` asks for, parsed but not yet resolved against a device.
#[derive(Debug, Clone)]
pub struct SliceSpec {
    pub name: String,
    pub memory: Size,
    /// Guarantee.
    pub compute: Share,
    /// Ceiling.
    pub cap: Cap,
    /// `I` (NVML index where NVML is available, else ledger index) or a UUID.
    pub device: String,
    /// Node mode: the only uid whose processes may join it (`None`: any).
    pub owner: Option<u32>,
    /// Node mode: the slice's join secret (`None`: none).
    pub secret: Option<SecretArg>,
}

/// Where `slice create` takes a join secret from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretArg {
    /// `--secret-file PATH`: an existing file (mode 0600 or stricter).
    File(std::path::PathBuf),
    /// `--new-secret-file PATH`: a new random secret, written to PATH (mode 0600, never over an
    /// existing file).
    New(std::path::PathBuf),
}

impl LedgerWindow {
    /// Resolve `--device`: an NVML index (or, without NVML, a ledger index) or a UUID, to the
    /// device's UUID and size, registering it from NVML when the ledger does not know it yet.
    fn resolve_device(&self, key: &str) -> Result<(String, u64), Failure> {
        let is_index = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit());
        let named = |index: usize, uuid: &str| {
            if is_index {
                index.to_string() == key
            } else {
                uuid == key
            }
        };
        let nvml = crate::nvml::Nvml::load()
            .and_then(|n| n.devices())
            .unwrap_or_default();
        if let Some(d) = nvml.iter().find(|d| named(d.index as usize, &d.uuid)) {
            self.register_device(d)?;
            return Ok((d.uuid.clone(), d.memory_total));
        }
        // Indices are NVML's where NVML answers; only without it do the ledger's own count.
        let s = self.ledger.snapshot();
        let known: Vec<String> = if nvml.is_empty() {
            if let Some(d) = s.devices.iter().find(|d| named(d.index, &d.uuid)) {
                return Ok((d.uuid.clone(), d.memory_total));
            }
            s.devices
                .iter()
                .map(|d| format!("{} ({})", d.index, d.uuid))
                .collect()
        } else {
            nvml.iter()
                .map(|d| format!("{} ({})", d.index, d.uuid))
                .collect()
        };
        Err(Failure::Other(format!(
            "--device {key}: no such device; known: {}",
            if known.is_empty() {
                "none (NVML is unavailable and no process has registered a device yet)".to_string()
            } else {
                known.join(", ")
            }
        )))
    }

    /// Create an operator slice; returns it as views show it.
    pub fn create_operator_slice(&self, req: &SliceSpec) -> Result<SliceView, Failure> {
        let (uuid, total) = self.resolve_device(&req.device)?;
        let memory = req.memory.resolve(total);
        if memory == 0 {
            return Err(Failure::Other(format!(
                "--memory: resolves to 0 bytes on {uuid} ({} total)",
                crate::table::size(total)
            )));
        }
        let (secret, written) = match &req.secret {
            None => (None, None),
            Some(_) if !self.ledger.is_node() => {
                return Err(Failure::Other(format!(
                    "--secret-file: {} is a personal runtime directory; join secrets apply to \
                     node mode only (a root monitor's directory): in a personal one every \
                     process is its one user's (docs/security.md)",
                    self.ledger.dir().path().display()
                )))
            }
            Some(SecretArg::File(p)) => (Some(Secret::read_file(p)?), None),
            Some(SecretArg::New(p)) => {
                let s = Secret::generate()?;
                s.write_new_file(p)?;
                (Some(s), Some(p.clone()))
            }
        };
        let made = self.create_with(req, &uuid, memory, secret.as_ref());
        if made.is_err() {
            if let Some(p) = written {
                let _ = std::fs::remove_file(p);
            }
        }
        made?;
        self.snapshot()
            .slices
            .into_iter()
            .find(|s| s.name == req.name && s.device_uuid == uuid)
            .ok_or_else(|| {
                Failure::Other(format!(
                    "slice {:?} vanished right after its creation",
                    req.name
                ))
            })
    }

    fn create_with(
        &self,
        req: &SliceSpec,
        uuid: &str,
        memory: u64,
        secret: Option<&Secret>,
    ) -> Result<(), Failure> {
        let slice = OperatorSlice {
            name: req.name.clone(),
            device: uuid.to_string(),
            memory,
            compute_share: req.compute,
            compute_cap: req.cap,
            claim: None,
        };
        self.operator
            .create(&self.ledger, &slice, req.owner, secret)
    }

    /// Change slice `name` live (every device it is on); returns on how many devices. In node
    /// mode a non-root operator asks the monitor (the policy is read-only to it).
    pub fn set_slice(
        &self,
        name: &str,
        change: &gpuslice_ledger::SliceChange,
    ) -> Result<usize, Failure> {
        self.operator.set(&self.ledger, name, change)
    }

    /// Remove an operator slice on every device; how many records went away at once (one with
    /// processes attached goes with its last process).
    pub fn remove_slice(&self, name: &str) -> Result<usize, Failure> {
        self.operator.remove(&self.ledger, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::SliceRequest;

    const GI: u64 = 1 << 30;

    #[test]
    fn snapshot_translates_the_ledger_for_every_view() {
        let dir = std::env::temp_dir().join(format!("gpuslice-node-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let node = LedgerWindow::open_or_create(&dir).unwrap();
        let uuid = "GPU-11111111-2222-3333-4444-555555555555";
        node.ledger
            .ensure_device(uuid, "Test GPU", 16 * GI)
            .unwrap();
        let req = |memory: &str, compute: u32, cap: Option<u32>| SliceSpec {
            name: "op".into(),
            memory: gpuslice_quantity::parse_size("--memory", memory).unwrap(),
            compute: Share::from_ppm(compute),
            cap: cap.map_or(Cap::NONE, Cap::from_ppm),
            device: "0".into(),
            owner: None,
            secret: None,
        };
        let made = node
            .create_operator_slice(&req("25%", 250_000, Some(500_000)))
            .unwrap();
        assert_eq!(
            (made.memory_limit, made.compute_share, made.compute_cap),
            (Some(4 * GI), 0.25, 0.5)
        );
        assert!(made.operator);

        // This test process joins the slice asking for more; it gets the operator's quota.
        let me = node.ledger.attach("op").unwrap();
        let join = SliceRequest {
            name: Some("op".into()),
            memory: Some(8 * GI),
            compute_share: Share::NONE,
            compute_cap: Cap::NONE,
            memory_setting: "GPUSLICE_MEMORY".into(),
            compute_setting: "GPUSLICE_COMPUTE".into(),
        };
        let j = node.ledger.join(me, 0, &join).unwrap();
        assert_eq!(j.memory_limit, Some(4 * GI));
        assert!(node.ledger.account(me, 0).unwrap().try_charge(GI));

        // Liveness is an OFD lock: only another open file description sees ours, as the
        // monitor (another process) does.
        let s = LedgerWindow::open(&dir).unwrap().snapshot();
        let d = &s.devices[0];
        assert_eq!(
            (d.uuid.as_str(), d.index, d.memory_total),
            (uuid, 0, 16 * GI)
        );
        assert_eq!(
            (d.memory_reserved, d.memory_used, d.compute_reserved),
            (4 * GI, GI, 0.25)
        );
        let sl = &s.slices[0];
        assert_eq!((sl.memory_limit, sl.memory_used), (Some(4 * GI), GI));
        assert_eq!(sl.pids, vec![std::process::id()]);
        let p = &s.processes[0];
        assert_eq!(
            (p.pid, p.slice.as_str(), p.memory_used, p.alive),
            (std::process::id(), "op", GI, true)
        );

        // Admission names requested and available; a second slice too big is refused.
        let big = node.create_operator_slice(&SliceSpec {
            name: "big".into(),
            ..req("13Gi", 0, None)
        });
        let Err(Failure::Other(msg)) = big else {
            panic!("{big:?}")
        };
        assert!(
            msg.contains("requested 13 GiB") && msg.contains("available 12 GiB"),
            "{msg}"
        );
        let unknown = node.create_operator_slice(&SliceSpec {
            device: "5".into(),
            ..req("1Gi", 0, None)
        });
        let Err(Failure::Other(msg)) = unknown else {
            panic!("{unknown:?}")
        };
        assert!(msg.contains("--device 5") && msg.contains(uuid), "{msg}");

        node.ledger.account(me, 0).unwrap().uncharge(GI);
        node.ledger.detach(me).unwrap();
        assert_eq!(node.remove_slice("op").unwrap(), 1);
        assert!(node.snapshot().slices.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
