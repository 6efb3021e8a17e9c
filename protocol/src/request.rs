//! Every request a client sends the monitor, one type each, gathered in [`Request`]: the one
//! place that writes them to the wire and reads them back.
//!
//! On the wire: `op=<name>`, `v=<version>` (absent: 1), then the request's fields in order
//! ([`Request::encode`] is the reference). A field added later is optional, so a request
//! without it means what it always meant; a change of meaning raises [`VERSION`].

use crate::admit::AdmitRequest;
use crate::wire::{BadMessage, Message, VERSION};
use gpuslice_quantity::{Cap, Share};

/// `ping`: is the monitor there? Anyone may ask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ping;

/// `view`: a read-only descriptor of slice record `slice`'s region (its owner or root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// The slice record.
    pub slice: usize,
}

/// `release`: an admitted process the driver refused memory asks for at least `bytes` of its
/// own slice's reservation on device `device` (a UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The device's UUID.
    pub device: String,
    /// Bytes wanted.
    pub bytes: u64,
}

/// `share-export`: an admitted process exported `bytes` charged on `device` as the POSIX
/// descriptor sent with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareExport {
    /// The device's UUID.
    pub device: String,
    /// Bytes of the allocation.
    pub bytes: u64,
}

/// `share-import`: an admitted process imports the descriptor sent with the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareImport;

/// `share-leave`: an admitted process let go of its last hold on shared record `record`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLeave {
    /// The record.
    pub record: usize,
}

/// `share-let-go`: the exporter of shared record `record` let go of its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLetGo {
    /// The record.
    pub record: usize,
}

/// `slice-create`: an operator slice (an operator: root or the operator group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceCreate {
    /// Slice name.
    pub name: String,
    /// The device's UUID.
    pub device: String,
    /// Quota, bytes.
    pub memory: u64,
    /// Guaranteed compute share.
    pub share: Share,
    /// Compute cap.
    pub cap: Cap,
    /// The only uid whose processes may join it (`None`: any).
    pub owner: Option<u32>,
    /// The resource claim it was made for (the DRA plugin's).
    pub claim: Option<String>,
    /// Its join secret (never logged).
    pub secret: Option<String>,
}

/// `slice-rm`: remove operator slice `name` on every device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRemove {
    /// Slice name.
    pub name: String,
}

/// `slice-set`: change slice `name` live; a field left `None` stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceSet {
    /// Slice name.
    pub name: String,
    /// New quota, bytes.
    pub memory: Option<u64>,
    /// New guaranteed share.
    pub share: Option<Share>,
    /// New cap.
    pub cap: Option<Cap>,
    /// New compute class.
    pub class: Option<u32>,
}

/// `slice-priority`: set slice `name`'s priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePriority {
    /// Slice name.
    pub name: String,
    /// The priority.
    pub priority: u32,
}

/// Every request the monitor serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// [`Ping`].
    Ping(Ping),
    /// A shim at `cuInit` ([`AdmitRequest`]).
    Admit(AdmitRequest),
    /// [`View`].
    View(View),
    /// [`Release`].
    Release(Release),
    /// [`ShareExport`] (with a descriptor).
    ShareExport(ShareExport),
    /// [`ShareImport`] (with a descriptor).
    ShareImport(ShareImport),
    /// [`ShareLeave`].
    ShareLeave(ShareLeave),
    /// [`ShareLetGo`].
    ShareLetGo(ShareLetGo),
    /// [`SliceCreate`].
    SliceCreate(SliceCreate),
    /// [`SliceRemove`].
    SliceRemove(SliceRemove),
    /// [`SliceSet`].
    SliceSet(SliceSet),
    /// [`SlicePriority`].
    SlicePriority(SlicePriority),
}

/// The operation a request names: what its reply is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `ping`.
    Ping,
    /// `admit`.
    Admit,
    /// `view`.
    View,
    /// `release`.
    Release,
    /// `share-export`.
    ShareExport,
    /// `share-import`.
    ShareImport,
    /// `share-leave`.
    ShareLeave,
    /// `share-let-go`.
    ShareLetGo,
    /// `slice-create`.
    SliceCreate,
    /// `slice-rm`.
    SliceRemove,
    /// `slice-set`.
    SliceSet,
    /// `slice-priority`.
    SlicePriority,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 12] = [
        Op::Ping,
        Op::Admit,
        Op::View,
        Op::Release,
        Op::ShareExport,
        Op::ShareImport,
        Op::ShareLeave,
        Op::ShareLetGo,
        Op::SliceCreate,
        Op::SliceRemove,
        Op::SliceSet,
        Op::SlicePriority,
    ];

    /// Its name on the wire (`op=`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Admit => "admit",
            Op::View => "view",
            Op::Release => "release",
            Op::ShareExport => "share-export",
            Op::ShareImport => "share-import",
            Op::ShareLeave => "share-leave",
            Op::ShareLetGo => "share-let-go",
            Op::SliceCreate => "slice-create",
            Op::SliceRemove => "slice-rm",
            Op::SliceSet => "slice-set",
            Op::SlicePriority => "slice-priority",
        }
    }

    fn from_name(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }
}

impl Request {
    /// The operation it names.
    pub fn op(&self) -> Op {
        match self {
            Request::Ping(_) => Op::Ping,
            Request::Admit(_) => Op::Admit,
            Request::View(_) => Op::View,
            Request::Release(_) => Op::Release,
            Request::ShareExport(_) => Op::ShareExport,
            Request::ShareImport(_) => Op::ShareImport,
            Request::ShareLeave(_) => Op::ShareLeave,
            Request::ShareLetGo(_) => Op::ShareLetGo,
            Request::SliceCreate(_) => Op::SliceCreate,
            Request::SliceRemove(_) => Op::SliceRemove,
            Request::SliceSet(_) => Op::SliceSet,
            Request::SlicePriority(_) => Op::SlicePriority,
        }
    }

    /// As a message.
    pub fn encode(&self) -> Message {
        let mut m = Message::new("op", self.op().name());
        m.push("v", &VERSION.to_string());
        match self {
            Request::Ping(Ping) | Request::ShareImport(ShareImport) => {}
            Request::Admit(a) => a.encode_into(&mut m),
            Request::View(v) => {
                m.push("slice", &v.slice.to_string());
            }
            Request::Release(Release { device, bytes })
            | Request::ShareExport(ShareExport { device, bytes }) => {
                m.push("dev", device).push("bytes", &bytes.to_string());
            }
            Request::ShareLeave(ShareLeave { record })
            | Request::ShareLetGo(ShareLetGo { record }) => {
                m.push("rec", &record.to_string());
            }
            Request::SliceCreate(c) => {
                m.push("name", &c.name)
                    .push("device", &c.device)
                    .push("memory", &c.memory.to_string())
                    .push("share", &c.share.ppm().to_string())
                    .push("cap", &c.cap.ppm().to_string())
                    .push_some("owner", c.owner)
                    .push_some("claim", c.claim.as_ref())
                    .push_some("secret", c.secret.as_ref());
            }
            Request::SliceRemove(r) => {
                m.push("name", &r.name);
            }
            Request::SliceSet(s) => {
                m.push("name", &s.name)
                    .push_some("memory", s.memory)
                    .push_some("share", s.share.map(Share::ppm))
                    .push_some("cap", s.cap.map(Cap::ppm))
                    .push_some("class", s.class);
            }
            Request::SlicePriority(p) => {
                m.push("name", &p.name)
                    .push("priority", &p.priority.to_string());
            }
        }
        m
    }

    /// The request `m` carries, every field checked; an unknown op, a newer version or a
    /// malformed field is an error, never a guess. Names and values are the monitor's to check
    /// against its rules.
    pub fn decode(m: &Message) -> Result<Request, BadMessage> {
        let op = m.get("op").ok_or(BadMessage::Field("op"))?;
        let op = Op::from_name(op)
            .ok_or_else(|| BadMessage::UnknownOp(op.chars().take(64).collect()))?;
        let v = m.optional::<u32>("v")?.unwrap_or(1);
        if v > VERSION {
            return Err(BadMessage::Version(v));
        }
        Ok(match op {
            Op::Ping => Request::Ping(Ping),
            Op::Admit => Request::Admit(AdmitRequest::decode(m)?),
            Op::View => Request::View(View {
                slice: m.field("slice")?,
            }),
            Op::Release => Request::Release(Release {
                device: m.text("dev")?,
                bytes: m.field("bytes")?,
            }),
            Op::ShareExport => Request::ShareExport(ShareExport {
                device: m.text("dev")?,
                bytes: m.field("bytes")?,
            }),
            Op::ShareImport => Request::ShareImport(ShareImport),
            Op::ShareLeave => Request::ShareLeave(ShareLeave {
                record: m.field("rec")?,
            }),
            Op::ShareLetGo => Request::ShareLetGo(ShareLetGo {
                record: m.field("rec")?,
            }),
            Op::SliceCreate => Request::SliceCreate(SliceCreate {
                name: m.text("name")?,
                device: m.text("device")?,
                memory: m.field("memory")?,
                share: Share::from_ppm(m.field("share")?),
                cap: Cap::from_ppm(m.field("cap")?),
                owner: m.optional("owner")?,
                // An older plugin sent `claim=` for none.
                claim: m.get("claim").filter(|c| !c.is_empty()).map(String::from),
                secret: m.get("secret").map(String::from),
            }),
            Op::SliceRemove => Request::SliceRemove(SliceRemove {
                name: m.text("name")?,
            }),
            Op::SliceSet => Request::SliceSet(SliceSet {
                name: m.text("name")?,
                memory: m.optional("memory")?,
                share: m.optional("share")?.map(Share::from_ppm),
                cap: m.optional("cap")?.map(Cap::from_ppm),
                class: m.optional("class")?,
            }),
            Op::SlicePriority => Request::SlicePriority(SlicePriority {
                name: m.text("name")?,
                priority: m.field("priority")?,
            }),
        })
    }
}
