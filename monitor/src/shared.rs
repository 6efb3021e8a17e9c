//! Node mode: exported VMM allocations, for the processes that ask over `monitor.sock`
//! (`gpuslice_ledger`'s `shared.rs` keeps the records; docs/architecture.md, "Memory shared
//! between processes").
//!
//! A tenant cannot write the policy, so its shim asks here: `share-export` (with the exported
//! POSIX descriptor), `share-import` (with the descriptor it imported), `share-leave` and
//! `share-let-go` (a record index). Who asks is the monitor's record of the connected process
//! (`SO_PEERCRED`, its start time); the allocation's identity is what the monitor itself reads
//! from the descriptor (`fstat`), which it closes at once (holding it would keep the memory
//! alive). So a process can only export on its own account, import what it holds a
//! descriptor of, and leave or let go of its own part; what it says is the size only, which
//! is clamped to what it was charged.

use gpuslice_ledger::{Ledger, LetGo, ProcHandle, ShareKey};
use gpuslice_protocol::Message;
use std::os::fd::{AsRawFd, OwnedFd};

/// Answer one `share-*` request of the admitted process `slot`: the reply's `ok` value.
pub fn answer(
    ledger: &Ledger,
    op: &str,
    req: &Message,
    fds: &[OwnedFd],
    slot: usize,
) -> Result<String, String> {
    let me = ProcHandle { slot };
    let key = || {
        let fd = fds
            .first()
            .ok_or("bad request: no descriptor came with it")?;
        ShareKey::of_fd(fd.as_raw_fd()).ok_or_else(|| "bad request: not a descriptor".to_string())
    };
    let rec = || {
        req.get("rec")
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or_else(|| "bad request: field \"rec\" missing or not a number".to_string())
    };
    let shown = |r: Option<usize>| r.map_or("-".to_string(), |i| i.to_string());
    let e = |e: gpuslice_ledger::LedgerError| e.to_string();
    match op {
        "share-export" => {
            let dev = ledger
                .find_device(req.get("dev").unwrap_or(""))
                .ok_or("bad request: a device the node's monitor does not know")?;
            let bytes = req
                .get("bytes")
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or("bad request: field \"bytes\" missing or not a number")?;
            Ok(shown(
                ledger.share_export(me, dev, key()?, bytes).map_err(e)?,
            ))
        }
        "share-import" => Ok(shown(ledger.share_import(me, key()?).map_err(e)?)),
        "share-leave" => {
            ledger.share_leave(me, rec()?).map_err(e)?;
            Ok("left".into())
        }
        "share-let-go" => Ok(match ledger.share_let_go(me, rec()?).map_err(e)? {
            LetGo::HandedOver => "handed-over",
            LetGo::Uncharge => "uncharge",
            LetGo::Keep => "keep",
        }
        .into()),
        _ => Err(format!("bad request: unknown operation {op:?}")),
    }
}
