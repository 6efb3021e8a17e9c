//! The admission boundary: what a process asks for at `cuInit` ([`AdmitRequest`]) and what it
//! is given ([`AdmitReply`]); why not is a `Refusal`, whose reason gives the CUDA
//! status the shim returns.
//!
//! On the wire (one [`Message`]): `op=admit`, `slice=<name or empty>`, optional `secret=` and
//! `priority=<class>`, then one `dev=` per device: `uuid\tmemory|-\tshare\tcap\tmemory
//! setting\tcompute setting`. A reply is `ok=admit`, `slot=<n>`, one `dev=` per device in the
//! order asked (`uuid\tdevice\tslice\tlimit|-\tpool|-`, each with one region descriptor) and
//! `warn=` lines.

use crate::wire::{opt_num, BadMessage, Message, MAX_REQUEST_DEVICES};
use gpuslice_quantity::{Cap, Share, PPM};

/// What a process asks for on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// The device's UUID (`GPU-...`).
    pub uuid: String,
    /// Quota in bytes (`None`: best effort); never 0.
    pub memory: Option<u64>,
    /// Guaranteed compute share.
    pub compute_share: Share,
    /// Compute cap.
    pub compute_cap: Cap,
    /// Where the memory setting came from, for messages (a variable or a flag).
    pub memory_setting: String,
    /// Where the compute share came from, for messages.
    pub compute_setting: String,
}

/// What a process asks to be admitted with, on every device it sees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmitRequest {
    /// Slice name (`None`: a private slice of the process).
    pub slice: Option<String>,
    /// The slice's join secret, when the process has one (never logged).
    pub secret: Option<String>,
    /// The compute class of the process's own slices (`gpuslice_sched::CLASS_*`).
    pub priority: Option<u32>,
    /// One per device, in CUDA ordinal order.
    pub devices: Vec<DeviceRequest>,
}

/// Where an admitted process charges on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedDevice {
    /// The UUID asked for.
    pub uuid: String,
    /// Ledger device index.
    pub device: usize,
    /// Slice record joined.
    pub slice: usize,
    /// The slice's quota (`None`: best effort).
    pub memory_limit: Option<u64>,
    /// Best effort: the allowance it charges into.
    pub allowance: Option<usize>,
}

/// An admitted process: its record and, per device asked for and in the same order, where it
/// charges (each with one region descriptor beside the message).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmitReply {
    /// Its policy record.
    pub slot: usize,
    /// Per device, in the order asked.
    pub devices: Vec<GrantedDevice>,
    /// Lines for the user.
    pub warnings: Vec<String>,
}

/// Longest setting name carried (a variable or a flag); longer ones are cut.
const MAX_SETTING: usize = 64;

impl AdmitRequest {
    /// Its fields, after `op=admit`.
    pub(crate) fn encode_into(&self, m: &mut Message) {
        m.push("slice", self.slice.as_deref().unwrap_or(""));
        if let Some(s) = &self.secret {
            m.push("secret", s);
        }
        if let Some(c) = self.priority {
            m.push("priority", &c.to_string());
        }
        for d in &self.devices {
            m.push(
                "dev",
                &format!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    d.uuid,
                    opt_num(d.memory),
                    d.compute_share.ppm(),
                    d.compute_cap.ppm(),
                    d.memory_setting,
                    d.compute_setting
                ),
            );
        }
    }

    /// The request `m` carries (`op=admit` already matched), every field checked: a share or
    /// cap past [`PPM`], a quota of 0, a device named twice or a malformed line is refused with
    /// the reason. Names are the caller's to check against its rules.
    pub(crate) fn decode(m: &Message) -> Result<AdmitRequest, BadMessage> {
        let mut devices: Vec<DeviceRequest> = vec![];
        for line in m.all("dev") {
            if devices.len() == MAX_REQUEST_DEVICES {
                return Err(BadMessage::TooManyDevices);
            }
            let f: Vec<&str> = line.split('\t').collect();
            let [uuid, memory, share, cap, memory_setting, compute_setting] = f[..] else {
                return Err(BadMessage::DevLine(6));
            };
            let memory = match memory {
                "-" => None,
                m => Some(m.parse::<u64>().map_err(|_| BadMessage::Field("memory"))?),
            };
            let share: u32 = share.parse().map_err(|_| BadMessage::Field("share"))?;
            let cap: u32 = cap.parse().map_err(|_| BadMessage::Field("cap"))?;
            if share > PPM || cap > PPM || memory == Some(0) {
                return Err(BadMessage::OutOfRange);
            }
            if devices.iter().any(|d| d.uuid == uuid) {
                return Err(BadMessage::Twice(uuid.into()));
            }
            devices.push(DeviceRequest {
                uuid: uuid.into(),
                memory,
                compute_share: Share::from_ppm(share),
                compute_cap: Cap::from_ppm(cap),
                memory_setting: memory_setting.chars().take(MAX_SETTING).collect(),
                compute_setting: compute_setting.chars().take(MAX_SETTING).collect(),
            });
        }
        Ok(AdmitRequest {
            slice: m.get("slice").filter(|n| !n.is_empty()).map(String::from),
            secret: m.get("secret").map(String::from),
            priority: m.optional("priority")?,
            devices,
        })
    }
}

impl AdmitReply {
    /// As a reply message (the region descriptors travel beside it, one per device).
    pub(crate) fn encode(&self) -> Message {
        let mut m = Message::new("ok", "admit");
        m.push("slot", &self.slot.to_string());
        for d in &self.devices {
            m.push(
                "dev",
                &format!(
                    "{}\t{}\t{}\t{}\t{}",
                    d.uuid,
                    d.device,
                    d.slice,
                    opt_num(d.memory_limit),
                    opt_num(d.allowance.map(|p| p as u64))
                ),
            );
        }
        for w in &self.warnings {
            m.push("warn", w);
        }
        m
    }

    /// The reply to an admission (not a refusal), every field checked but index bounds, which
    /// are the caller's to check against its tables.
    pub(crate) fn decode(m: &Message) -> Result<AdmitReply, BadMessage> {
        let slot = m
            .get("slot")
            .and_then(|v| v.parse().ok())
            .ok_or(BadMessage::Field("slot"))?;
        let mut devices = vec![];
        for line in m.all("dev") {
            let f: Vec<&str> = line.split('\t').collect();
            let [uuid, device, slice, limit, allowance] = f[..] else {
                return Err(BadMessage::DevLine(5));
            };
            let opt = |v: &str, what: &'static str| match v {
                "-" => Ok(None),
                v => v
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| BadMessage::Field(what)),
            };
            devices.push(GrantedDevice {
                uuid: uuid.into(),
                device: device.parse().map_err(|_| BadMessage::Field("device"))?,
                slice: slice.parse().map_err(|_| BadMessage::Field("slice"))?,
                memory_limit: opt(limit, "limit")?,
                allowance: opt(allowance, "allowance")?.map(|p| p as usize),
            });
        }
        Ok(AdmitReply {
            slot,
            devices,
            warnings: m.all("warn").map(String::from).collect(),
        })
    }
}
