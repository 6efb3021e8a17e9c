//! Node mode: exported VMM allocations, for the processes that ask over `monitor.sock`
//! (`gpuslice_ledger`'s `shared.rs` keeps the records; docs/architecture.md, "Memory shared
//! between processes").
//!
//! A tenant cannot write the policy, so its shim asks here ([`gpuslice_protocol`]'s requests):
//! `ShareExport` (with the exported POSIX descriptor), `ShareImport` (with the descriptor it
//! imports: an orphan's importer is charged here, in its slice's region, before its driver
//! call), `ShareLeave` and `ShareLetGo` (a record index). Who asks is the monitor's record of the connected process
//! (`SO_PEERCRED`, its start time); the allocation's identity is what the monitor itself reads
//! from the descriptor (`fstat`), which it closes at once (holding it would keep the memory
//! alive). So a process can only export on its own account, import what it holds a
//! descriptor of, and leave or let go of its own part; what it says is the size only, which
//! is clamped to what it was charged.
//!
//! What happens to a record nobody but descriptors holds is the descriptor scan's
//! (`descriptor_scan.rs`).

use crate::error::RequestError;
use gpuslice_ledger::{Import, Ledger, LetGo, ProcHandle, ShareKey};
use gpuslice_protocol::{self as protocol, Exported, Imported, Left, ShareExport};
use std::os::fd::{AsRawFd, OwnedFd};

/// The allocation's identity, read from the descriptor that came with the request.
fn key(fds: &[OwnedFd]) -> Result<ShareKey, RequestError> {
    let fd = fds.first().ok_or(RequestError::NoDescriptor)?;
    ShareKey::of_fd(fd.as_raw_fd()).ok_or(RequestError::NoDescriptor)
}

/// `share-export` of the admitted process `me`, with the exported descriptor.
pub fn export(
    ledger: &Ledger,
    me: ProcHandle,
    r: &ShareExport,
    fds: &[OwnedFd],
) -> Result<Exported, RequestError> {
    let dev = ledger
        .find_device(&r.device)
        .ok_or_else(|| RequestError::UnknownDevice(r.device.clone()))?;
    Ok(Exported {
        record: ledger.share_export(me, dev, key(fds)?, r.bytes)?,
    })
}

/// `share-import` of the admitted process `me`, with the descriptor it imports.
pub fn import(ledger: &Ledger, me: ProcHandle, fds: &[OwnedFd]) -> Result<Imported, RequestError> {
    Ok(match ledger.share_import(me, key(fds)?)? {
        Import::Held(rec) => Imported::Held(rec),
        Import::Adopted { rec, dev, bytes } => Imported::Adopted { rec, dev, bytes },
        Import::Refused { dev, bytes } => Imported::Refused { dev, bytes },
        Import::Charge { dev, bytes } => Imported::Charge { dev, bytes },
        Import::Unknown => Imported::Unknown,
    })
}

/// `share-leave` of the admitted process `me`.
pub fn leave(
    ledger: &Ledger,
    me: ProcHandle,
    r: &protocol::ShareLeave,
) -> Result<Left, RequestError> {
    ledger.share_leave(me, r.record)?;
    Ok(Left)
}

/// `share-let-go` of the admitted process `me`.
pub fn let_go(
    ledger: &Ledger,
    me: ProcHandle,
    r: &protocol::ShareLetGo,
) -> Result<protocol::LetGo, RequestError> {
    Ok(match ledger.share_let_go(me, r.record)? {
        LetGo::HandedOver => protocol::LetGo::HandedOver,
        LetGo::Uncharge => protocol::LetGo::Uncharge,
        LetGo::Keep => protocol::LetGo::Keep,
    })
}
