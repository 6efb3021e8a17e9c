//! Node mode: exported VMM allocations, for the processes that ask over `monitor.sock`
//! (`gpuslice_ledger`'s `shared.rs` keeps the records; docs/architecture.md, "Memory shared
//! between processes").
//!
//! A tenant cannot write the policy, so its shim asks here: `share-export` (with the exported
//! POSIX descriptor), `share-import` (with the descriptor it imports: an orphan's importer is
//! charged here, in its slice's region, before its driver call), `share-leave` and
//! `share-let-go` (a record index). Who asks is the monitor's record of the connected process
//! (`SO_PEERCRED`, its start time); the allocation's identity is what the monitor itself reads
//! from the descriptor (`fstat`), which it closes at once (holding it would keep the memory
//! alive). So a process can only export on its own account, import what it holds a
//! descriptor of, and leave or let go of its own part; what it says is the size only, which
//! is clamped to what it was charged.

use crate::error::RequestError;
use gpuslice_ledger::{Import, Ledger, LetGo, ProcHandle, ShareKey};
use gpuslice_protocol::Message;
use std::os::fd::{AsRawFd, OwnedFd};

/// Answer one `share-*` request of the admitted process `slot`: the reply's `ok` value
/// (`share-import`: `held REC`, `adopted REC DEV BYTES`, `refused DEV BYTES`, `charge DEV
/// BYTES` or `-`; the shim's `memory/shared.rs` reads them).
pub fn answer(
    ledger: &Ledger,
    op: &str,
    req: &Message,
    fds: &[OwnedFd],
    slot: usize,
) -> Result<String, RequestError> {
    let me = ProcHandle { slot };
    let key = || {
        let fd = fds.first().ok_or(RequestError::NoDescriptor)?;
        ShareKey::of_fd(fd.as_raw_fd()).ok_or(RequestError::NoDescriptor)
    };
    let num = |k: &str| {
        req.get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| RequestError::BadField(k.to_string()))
    };
    let rec = || num("rec").map(|r| usize::try_from(r).unwrap_or(usize::MAX));
    let shown = |r: Option<usize>| r.map_or("-".to_string(), |i| i.to_string());
    match op {
        "share-export" => {
            let uuid = req.get("dev").unwrap_or("");
            let dev = ledger
                .find_device(uuid)
                .ok_or_else(|| RequestError::UnknownDevice(uuid.to_string()))?;
            let bytes = num("bytes")?;
            Ok(shown(ledger.share_export(me, dev, key()?, bytes)?))
        }
        "share-import" => Ok(match ledger.share_import(me, key()?)? {
            Import::Held(rec) => format!("held {rec}"),
            Import::Adopted { rec, dev, bytes } => format!("adopted {rec} {dev} {bytes}"),
            Import::Refused { dev, bytes } => format!("refused {dev} {bytes}"),
            Import::Charge { dev, bytes } => format!("charge {dev} {bytes}"),
            Import::Unknown => "-".into(),
        }),
        "share-leave" => {
            ledger.share_leave(me, rec()?)?;
            Ok("left".into())
        }
        "share-let-go" => Ok(match ledger.share_let_go(me, rec()?)? {
            LetGo::HandedOver => "handed-over",
            LetGo::Uncharge => "uncharge",
            LetGo::Keep => "keep",
        }
        .into()),
        _ => Err(RequestError::UnknownOp),
    }
}
