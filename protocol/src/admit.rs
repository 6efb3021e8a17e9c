//! The admission boundary: what a process asks for at `cuInit` ([`AdmitRequest`]) and what it
//! is given ([`AdmitReply`]); why not is a [`crate::Refusal`], whose reason gives the CUDA
//! status the shim returns.
//!
//! On the wire (one [`Message`]): `op=admit`, `slice=<name or empty>`, optional `secret=` and
//! `priority=<class>`, then one `dev=` per device: `uuid\tmemory|-\tshare\tcap\tmemory
//! setting\tcompute setting`. A reply is `ok=admit`, `slot=<n>`, one `dev=` per device in the
//! order asked (`uuid\tdevice\tslice\tlimit|-\tpool|-`, each with one region descriptor) and
//! `warn=` lines.

use crate::wire::{opt_num, BadMessage, Message};
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
            if devices.len() == crate::MAX_REQUEST_DEVICES {
                return Err(BadMessage::TooManyDevices);
            }
            let f: Vec<&str> = line.split('\t').collect();
            let [uuid, memory, share, cap, mem_setting, cpu_setting] = f[..] else {
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
                memory_setting: mem_setting.chars().take(MAX_SETTING).collect(),
                compute_setting: cpu_setting.chars().take(MAX_SETTING).collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Op, Refusal, Reply, Request};

    fn request() -> AdmitRequest {
        AdmitRequest {
            slice: Some("team".into()),
            secret: Some("s".repeat(32)),
            priority: Some(1),
            devices: vec![
                DeviceRequest {
                    uuid: "GPU-1".into(),
                    memory: Some(1 << 30),
                    compute_share: Share::from_ppm(250_000),
                    compute_cap: Cap::NONE,
                    memory_setting: "GPUSLICE_MEMORY".into(),
                    compute_setting: "GPUSLICE_COMPUTE".into(),
                },
                DeviceRequest {
                    uuid: "GPU-2".into(),
                    memory: None,
                    compute_share: Share::NONE,
                    compute_cap: Cap::from_ppm(500_000),
                    memory_setting: "CUDA_DEVICE_MEMORY_LIMIT_1".into(),
                    compute_setting: "GPUSLICE_COMPUTE".into(),
                },
            ],
        }
    }

    #[test]
    fn a_request_survives_the_wire() {
        for r in [request(), AdmitRequest::default()] {
            let m = Message::decode(&Request::from(r.clone()).encode().encode()).unwrap();
            assert_eq!(Request::decode(&m), Ok(Request::Admit(r)));
        }
    }

    #[test]
    fn a_bad_request_is_refused_with_its_reason() {
        for (line, why) in [
            ("GPU-1\t-\t0\t1000000\tM", "6 fields"),
            ("GPU-1\t0\t0\t1000000\tM\tC", "out of range"),
            ("GPU-1\t-\t1000001\t1000000\tM\tC", "out of range"),
            ("GPU-1\t-\t0\t2000000\tM\tC", "out of range"),
            ("GPU-1\tx\t0\t1000000\tM\tC", "memory"),
            ("GPU-1\t-\t-1\t1000000\tM\tC", "share"),
        ] {
            let mut m = Message::new("op", "admit");
            m.push("dev", line);
            let e = AdmitRequest::decode(&m).unwrap_err().to_string();
            assert!(e.contains(why), "{line:?}: {e}");
        }
        let mut m = Request::from(request()).encode();
        m.push("dev", "GPU-1\t-\t0\t1000000\tM\tC");
        assert_eq!(
            AdmitRequest::decode(&m).unwrap_err(),
            BadMessage::Twice("GPU-1".into())
        );
    }

    #[test]
    fn too_many_devices_are_refused() {
        let mut m = Message::new("op", "admit");
        for i in 0..=crate::MAX_REQUEST_DEVICES {
            m.push("dev", &format!("GPU-{i}\t-\t0\t1000000\tM\tC"));
        }
        assert_eq!(
            AdmitRequest::decode(&m).unwrap_err(),
            BadMessage::TooManyDevices
        );
    }

    #[test]
    fn a_reply_and_a_refusal_survive_the_wire() {
        let reply = AdmitReply {
            slot: 7,
            devices: vec![
                GrantedDevice {
                    uuid: "GPU-1".into(),
                    device: 0,
                    slice: 3,
                    memory_limit: Some(1 << 30),
                    allowance: None,
                },
                GrantedDevice {
                    uuid: "GPU-2".into(),
                    device: 1,
                    slice: 4,
                    memory_limit: None,
                    allowance: Some(2),
                },
            ],
            warnings: vec!["the slice keeps its own values".into()],
        };
        let m = Message::decode(&reply.encode().encode()).unwrap();
        assert_eq!(Reply::decode(Op::Admit, &m), Ok(Ok(Reply::Admitted(reply))));
        for refusal in [
            Refusal::asked("admission: slice refused: no room"),
            Refusal::other("cannot read /proc/1"),
        ] {
            let m = Message::decode(&refusal.encode().encode()).unwrap();
            assert_eq!(Reply::decode(Op::Admit, &m), Ok(Err(refusal)));
        }
        let mut bad = Message::new("ok", "admit");
        bad.push("slot", "1").push("dev", "GPU-1\t0\t0\t-");
        assert_eq!(
            AdmitReply::decode(&bad).unwrap_err(),
            BadMessage::DevLine(5)
        );
    }
}
