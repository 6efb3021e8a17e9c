//! Every reply the monitor gives, one type each, gathered in [`Reply`]; which one a message is
//! follows from the request it answers ([`Op`]), so a reply is read as that request's or not at
//! all. A refusal is a [`Refusal`], whatever was asked.
//!
//! On the wire: `ok=<value>` (and for [`AdmitReply`] its own fields), or a refusal's fields.

use crate::admit::AdmitReply;
use crate::refusal::Refusal;
use crate::request::Op;
use crate::wire::{opt_num, BadMessage, Message};

/// The answer to [`crate::request::Ping`]: the monitor's pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pong {
    /// The monitor's pid.
    pub pid: u32,
}

/// The answer to [`crate::request::View`]: the region's read-only descriptor travels beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Viewed;

/// The answer to [`crate::request::Release`]: how many bytes the monitor handed back (0: none held).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Bytes handed back.
    pub bytes: u64,
}

/// The answer to [`crate::request::ShareExport`]: the export's record (`None`: not registered, charged
/// to the exporter until it exits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// The record.
    pub record: Option<usize>,
}

/// The answer to [`crate::request::ShareImport`] (the ledger's `Import`, on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Someone is charged for the memory: the importer is counted on record `.0`.
    Held(usize),
    /// An orphan: the importer was charged `bytes` on ledger device `dev` and is record `rec`'s
    /// exporter now.
    Adopted {
        /// The record.
        rec: usize,
        /// Its ledger device.
        dev: usize,
        /// Bytes charged.
        bytes: u64,
    },
    /// An orphan that does not fit the importer's quota: refused as an allocation would be.
    Refused {
        /// Its ledger device.
        dev: usize,
        /// Bytes of the allocation.
        bytes: u64,
    },
    /// An orphan the importer charges itself for (its account keeps no record).
    Charge {
        /// Its ledger device.
        dev: usize,
        /// Bytes of the allocation.
        bytes: u64,
    },
    /// Not an allocation anyone exported.
    Unknown,
}

/// The answer to [`crate::request::ShareLeave`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Left;

/// The answer to [`crate::request::ShareLetGo`] (the ledger's `LetGo`, on the wire): what the exporter
/// does with its charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetGo {
    /// A live importer holds the memory and its charge now.
    HandedOver,
    /// Nobody else holds it: uncharge it.
    Uncharge,
    /// Keep it charged until the exporter exits.
    Keep,
}

/// The answer to an operator request (`slice-create`, `slice-rm`, `slice-set`,
/// `slice-priority`): on how many slice records it acted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Slice records changed.
    pub records: usize,
}

/// Every reply the monitor gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// [`Pong`].
    Pong(Pong),
    /// [`AdmitReply`].
    Admitted(AdmitReply),
    /// [`Viewed`].
    Viewed(Viewed),
    /// [`Released`].
    Released(Released),
    /// [`Exported`].
    Exported(Exported),
    /// [`Imported`].
    Imported(Imported),
    /// [`Left`].
    Left(Left),
    /// [`LetGo`].
    LetGo(LetGo),
    /// [`Done`].
    Done(Done),
}

impl Imported {
    fn encode(self) -> String {
        match self {
            Imported::Held(rec) => format!("held {rec}"),
            Imported::Adopted { rec, dev, bytes } => format!("adopted {rec} {dev} {bytes}"),
            Imported::Refused { dev, bytes } => format!("refused {dev} {bytes}"),
            Imported::Charge { dev, bytes } => format!("charge {dev} {bytes}"),
            Imported::Unknown => "-".into(),
        }
    }

    fn decode(v: &str) -> Option<Imported> {
        let w: Vec<&str> = v.split(' ').collect();
        let at = |s: &str| s.parse::<usize>().ok();
        let n = |s: &str| s.parse::<u64>().ok();
        Some(match w[..] {
            ["-"] => Imported::Unknown,
            ["held", rec] => Imported::Held(at(rec)?),
            ["adopted", rec, dev, bytes] => Imported::Adopted {
                rec: at(rec)?,
                dev: at(dev)?,
                bytes: n(bytes)?,
            },
            ["refused", dev, bytes] => Imported::Refused {
                dev: at(dev)?,
                bytes: n(bytes)?,
            },
            ["charge", dev, bytes] => Imported::Charge {
                dev: at(dev)?,
                bytes: n(bytes)?,
            },
            _ => return None,
        })
    }
}

impl LetGo {
    fn name(self) -> &'static str {
        match self {
            LetGo::HandedOver => "handed-over",
            LetGo::Uncharge => "uncharge",
            LetGo::Keep => "keep",
        }
    }
}

impl Reply {
    /// As a message (descriptors travel beside it: `send`).
    pub fn encode(&self) -> Message {
        let ok = |v: &str| Message::new("ok", v);
        match self {
            Reply::Pong(p) => ok(&p.pid.to_string()),
            Reply::Admitted(a) => a.encode(),
            Reply::Viewed(Viewed) => ok("view"),
            Reply::Released(r) => ok(&r.bytes.to_string()),
            Reply::Exported(e) => ok(&opt_num(e.record)),
            Reply::Imported(i) => ok(&i.encode()),
            Reply::Left(Left) => ok("left"),
            Reply::LetGo(l) => ok(l.name()),
            Reply::Done(d) => ok(&d.records.to_string()),
        }
    }

    /// The reply `m` carries to a request of `op`: `Ok(Err(refusal))` when the monitor
    /// refused, `Err(what)` when the reply is malformed.
    pub fn decode(op: Op, m: &Message) -> Result<Result<Reply, Refusal>, BadMessage> {
        if let Some(r) = Refusal::decode(m) {
            return Ok(Err(r));
        }
        let ok = m.get("ok").ok_or(BadMessage::Field("ok"))?;
        let bad = BadMessage::Field("ok");
        Ok(Ok(match op {
            Op::Ping => Reply::Pong(Pong {
                pid: m.field("ok")?,
            }),
            Op::Admit => Reply::Admitted(AdmitReply::decode(m)?),
            Op::View if ok == "view" => Reply::Viewed(Viewed),
            Op::Release => Reply::Released(Released {
                bytes: m.field("ok")?,
            }),
            Op::ShareExport => Reply::Exported(Exported {
                record: match ok {
                    "-" => None,
                    _ => Some(m.field("ok")?),
                },
            }),
            Op::ShareImport => Reply::Imported(Imported::decode(ok).ok_or(bad)?),
            Op::ShareLeave if ok == "left" => Reply::Left(Left),
            Op::ShareLetGo => Reply::LetGo(
                [LetGo::HandedOver, LetGo::Uncharge, LetGo::Keep]
                    .into_iter()
                    .find(|l| l.name() == ok)
                    .ok_or(bad)?,
            ),
            Op::SliceCreate | Op::SliceRemove | Op::SliceSet | Op::SlicePriority => {
                Reply::Done(Done {
                    records: m.field("ok")?,
                })
            }
            Op::View | Op::ShareLeave => return Err(bad),
        }))
    }
}
