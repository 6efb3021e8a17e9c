//! Admission at start-up, one interface ([`Admission`]) with two implementations: a personal
//! ledger admits the process itself ([`Personal`]: joins under the ledger's lock); on a shared
//! node the monitor does ([`Node`]: the request goes over `monitor.sock`, the process charges
//! into the slice regions it is sent). Both take the one request start-up builds
//! ([`request`]) and give the same result, so `init.rs` has one path for both modes.

use crate::config::Config;
use crate::log::log;
pub use crate::process::DevState;
use gpuslice_ledger::region::Region;
use gpuslice_ledger::{Account, Ledger, LedgerError, ProcHandle, SliceRequest};
use gpuslice_protocol::{
    self as protocol, AdmitReply, AdmitRequest, DeviceRequest, ProtocolError, Refusal,
};
use std::time::Duration;

/// A device found at start-up: ordinal, UUID, name, memory.
pub type Found = (i32, String, String, u64);

/// What admission gives a process: its record and, per CUDA ordinal, where it charges.
pub struct Admitted {
    /// The process's record in the ledger (node mode: in the policy).
    pub me: ProcHandle,
    /// By CUDA ordinal.
    pub devices: Vec<DevState>,
}

/// Where a process is admitted.
pub trait Admission {
    /// Admit the process with `req` on the devices `found` (in the same order).
    fn admit(&self, req: &AdmitRequest, found: Vec<Found>) -> Result<Admitted, Refusal>;
}

/// The one admission request of this process: its configuration on every device it sees.
pub fn request(config: &Config, found: &[Found]) -> AdmitRequest {
    let compute_setting = config
        .compute
        .as_ref()
        .map_or("GPUSLICE_COMPUTE", |c| c.1)
        .to_string();
    AdmitRequest {
        slice: config.slice.clone(),
        // A secret is only ever sent for a named slice.
        secret: config
            .slice
            .as_ref()
            .and(config.secret.as_ref())
            .map(|s| s.expose().to_string()),
        priority: config.priority,
        devices: found
            .iter()
            .map(|(ord, uuid, _, total)| {
                let (memory, memory_setting) =
                    match config.memory.as_ref().and_then(|m| m.get(*ord as u32)) {
                        Some((size, var)) => (Some(size.resolve(*total)), var),
                        None => (None, "GPUSLICE_MEMORY".to_string()),
                    };
                DeviceRequest {
                    uuid: uuid.clone(),
                    memory,
                    compute_share: config.share(*ord as u32),
                    compute_cap: config.cap(*ord as u32),
                    memory_setting,
                    compute_setting: compute_setting.clone(),
                }
            })
            .collect(),
    }
}

/// What the request asks for on device `d`, as the personal ledger joins it (the monitor's
/// `admission.rs` reads the same request for a node's policy).
fn slice_request(slice: &Option<String>, d: &DeviceRequest) -> SliceRequest {
    SliceRequest {
        name: slice.clone(),
        memory: d.memory,
        compute_share: d.compute_share,
        compute_cap: d.compute_cap,
        memory_setting: d.memory_setting.clone(),
        compute_setting: d.compute_setting.clone(),
    }
}

/// A ledger error during admission, as the refusal `cuInit` reports.
fn refusal(e: LedgerError) -> Refusal {
    if e.refuses_the_request() {
        Refusal::asked(format!("slice refused: {e}"))
    } else {
        Refusal::other(format!("cannot use the node ledger: {e}"))
    }
}

fn log_joined(ord: i32, uuid: &str, mode: &str, slice: Option<&str>, limit: Option<u64>) {
    log!(
        Info,
        "device {ord} ({uuid}): {mode}slice {:?}, memory {}",
        slice.unwrap_or("(private)"),
        limit
            .map(gpuslice_ledger::human_bytes)
            .unwrap_or_else(|| "best effort".into())
    );
}

/// A personal ledger: the process joins its slices itself.
pub struct Personal(pub &'static Ledger);

impl Admission for Personal {
    fn admit(&self, req: &AdmitRequest, found: Vec<Found>) -> Result<Admitted, Refusal> {
        let ledger = self.0;
        let me = ledger
            .attach(req.slice.as_deref().unwrap_or(""))
            .map_err(refusal)?;
        let mut items = vec![];
        for ((_, uuid, name, total), d) in found.iter().zip(&req.devices) {
            let dev = ledger.ensure_device(uuid, name, *total).map_err(refusal)?;
            items.push((dev, slice_request(&req.slice, d)));
        }
        // One taking of the lock for every device (512 processes may start at once).
        let joins = ledger.join_all(me, &items).map_err(refusal)?;
        let mut devices = vec![];
        for (((ord, uuid, _, _), (ledger_dev, _)), joined) in
            found.into_iter().zip(items).zip(joins)
        {
            for w in &joined.warnings {
                log!(Warn, "{w}");
            }
            log_joined(ord, &uuid, "", req.slice.as_deref(), joined.memory_limit);
            let account = ledger
                .account(me, ledger_dev)
                .ok_or_else(|| refusal(LedgerError::Full("account")))?;
            devices.push(DevState {
                ordinal: ord,
                ledger_dev,
                uuid,
                account,
                region: None,
            });
        }
        Ok(Admitted { me, devices })
    }
}

/// How long a node-mode process keeps trying to reach the monitor before `cuInit` fails.
const MONITOR_WAIT: Duration = Duration::from_secs(3);

/// A shared node: the monitor admits the process. The policy stays mapped read-only; nothing
/// here takes its lock.
pub struct Node(pub &'static Ledger);

impl Admission for Node {
    fn admit(&self, req: &AdmitRequest, found: Vec<Found>) -> Result<Admitted, Refusal> {
        let ledger = self.0;
        let sock = ledger.dir().path().join(protocol::SOCKET_FILE);
        let bad = |what: &str| {
            Refusal::other(format!(
                "the node's monitor answered something unexpected ({what})"
            ))
        };
        let t0 = std::time::Instant::now();
        let (answer, fds) = loop {
            match protocol::exchange(ledger.dir().fd(), req.clone(), &[], Duration::from_secs(10)) {
                Ok(r) => break r,
                Err(ProtocolError::Unexpected(what)) => return Err(bad(&what.to_string())),
                Err(_) if t0.elapsed() < MONITOR_WAIT => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => {
                    return Err(Refusal::other(format!(
                        "the node's monitor did not answer at {} for {} s ({e}); ask the \
                         operator to start `gpuslice monitor`",
                        sock.display(),
                        MONITOR_WAIT.as_secs()
                    )))
                }
            }
        };
        let reply: AdmitReply = answer.map_err(|r| Refusal {
            why: r.why,
            message: format!("the node's monitor refused: {}", r.message),
        })?;
        if reply.slot >= gpuslice_ledger::MAX_PROCS {
            return Err(bad("slot"));
        }
        if reply.devices.len() != found.len() || fds.len() != found.len() {
            return Err(bad("device count"));
        }
        for w in &reply.warnings {
            log!(Warn, "{w}");
        }
        let mut devices = vec![];
        for (((ord, uuid, _, _), granted), fd) in found.into_iter().zip(reply.devices).zip(fds) {
            if granted.device >= gpuslice_ledger::MAX_DEVICES || granted.uuid != uuid {
                return Err(bad("device"));
            }
            if granted.slice >= gpuslice_ledger::MAX_SLICES {
                return Err(bad("slice"));
            }
            let region: &'static Region = Box::leak(Box::new(
                Region::from_fd(fd, true).map_err(|e| bad(&e.to_string()))?,
            ));
            let account = match granted.memory_limit {
                Some(_) => {
                    let slice = Some(&ledger.slices()[granted.slice]);
                    let dev = &ledger.devices()[granted.device];
                    Account::in_region(dev, slice, region, reply.slot)
                }
                // Best effort: this user's allowance on the device, held to the monitor's grant.
                None => {
                    let allowance = granted
                        .allowance
                        .and_then(|p| ledger.allowances().get(p))
                        .ok_or_else(|| bad("allowance"))?;
                    Account::in_allowance(allowance, region, reply.slot)
                }
            }
            .ok_or_else(|| bad("slot"))?;
            log_joined(
                ord,
                &uuid,
                "node mode, ",
                req.slice.as_deref(),
                granted.memory_limit,
            );
            devices.push(DevState {
                ordinal: ord,
                ledger_dev: granted.device,
                uuid,
                account,
                region: Some(region),
            });
        }
        Ok(Admitted {
            me: ProcHandle { slot: reply.slot },
            devices,
        })
    }
}
