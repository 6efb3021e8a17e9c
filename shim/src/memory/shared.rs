//! Exported VMM allocations: telling the ledger (a personal ledger, under its lock) or the
//! node's monitor (node mode, over `monitor.sock`: the policy is read-only here) that this
//! process exported, imported, let go of or left one, so that the exporter's slice stays
//! charged while any process holds the memory, and an importer of memory nobody is charged
//! for any more is charged for it (`gpuslice_ledger`'s `shared.rs`). Cold paths
//! only (an export, an import, a last release or unmap). A failure never fails the driver
//! call: the charge then stays with its exporter until it exits (never less than the driver
//! holds), or an importer's hold is not counted; said once in the log.

use crate::admit::DevState;
use crate::init::State;
use crate::log::log;
use core::ffi::c_int;
use gpuslice_ledger::{Import, LedgerError, LetGo, ShareKey};
use gpuslice_protocol::{
    self as protocol, Call, Imported, ShareExport, ShareImport, ShareLeave, ShareLetGo,
};

/// How long one question to the monitor may take (it answers at once).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// In node mode ask the monitor `req` (with descriptor `fd`, if any) and read its reply with
/// `node`; with a personal ledger, do `personal` on it.
fn tell<C: Call, T>(
    st: &State,
    req: C,
    fd: Option<c_int>,
    node: impl FnOnce(C::Reply) -> T,
    personal: impl FnOnce() -> Result<T, LedgerError>,
) -> Result<T, String> {
    if !st.ledger.is_node() {
        return personal().map_err(|e| e.to_string());
    }
    let fds: Vec<c_int> = fd.into_iter().collect();
    let (answer, _) =
        protocol::exchange(st.ledger.dir().fd(), req, &fds, TIMEOUT).map_err(|e| e.to_string())?;
    answer.map(node).map_err(|refusal| refusal.message)
}

/// The personal ledger's part for descriptor `fd`: `f` with its identity (`None` when it is
/// not a descriptor).
fn keyed<T>(
    fd: c_int,
    f: impl FnOnce(ShareKey) -> Result<Option<T>, LedgerError>,
) -> Result<Option<T>, LedgerError> {
    ShareKey::of_fd(fd).map_or(Ok(None), f)
}

/// This process exported `bytes` charged on `dev` as the POSIX descriptor `fd`: the record
/// of the export (`None`: not registered, charged here until this process exits).
pub(super) fn export(st: &State, dev: &DevState, fd: c_int, bytes: u64) -> Option<usize> {
    let req = ShareExport {
        device: dev.uuid.clone(),
        bytes,
    };
    let r = tell(
        st,
        req,
        Some(fd),
        |e| e.record,
        || {
            keyed(fd, |k| {
                st.ledger.share_export(st.me, dev.ledger_dev, k, bytes)
            })
        },
    );
    match r {
        Ok(Some(rec)) => Some(rec),
        Ok(None) => {
            log!(
                Debug,
                "exported VMM allocation of {bytes} bytes not registered (the table of exports \
                 is full, or the descriptor is another process's): it stays charged here until \
                 this process exits"
            );
            None
        }
        Err(e) => {
            log!(
                Warn,
                "could not register an exported VMM allocation ({e}): its {bytes} bytes stay \
                 charged here until this process exits"
            );
            None
        }
    }
}

/// The monitor's answer to `share-import`, as the ledger's.
fn imported(i: Imported) -> Import {
    match i {
        Imported::Held(rec) => Import::Held(rec),
        Imported::Adopted { rec, dev, bytes } => Import::Adopted { rec, dev, bytes },
        Imported::Refused { dev, bytes } => Import::Refused { dev, bytes },
        Imported::Charge { dev, bytes } => Import::Charge { dev, bytes },
        Imported::Unknown => Import::Unknown,
    }
}

/// This process is importing the POSIX descriptor `fd` (asked before the driver's import):
/// counted on a record someone is charged for, charged for an orphan (or refused, or told to
/// charge itself), or neither.
pub(super) fn import(st: &State, fd: c_int) -> Import {
    let r = tell(st, ShareImport, Some(fd), imported, || {
        ShareKey::of_fd(fd).map_or(Ok(Import::Unknown), |k| st.ledger.share_import(st.me, k))
    });
    r.unwrap_or_else(|e| {
        log!(
            Warn,
            "could not register an imported VMM allocation ({e}): its exporter's slice may be \
             uncharged while this process still maps it"
        );
        Import::Unknown
    })
}

/// The exporter let go of record `rec`'s allocation: what to do with its charge.
pub(super) fn let_go(st: &State, rec: usize) -> LetGo {
    let answer = |l: protocol::LetGo| match l {
        protocol::LetGo::HandedOver => LetGo::HandedOver,
        protocol::LetGo::Uncharge => LetGo::Uncharge,
        protocol::LetGo::Keep => LetGo::Keep,
    };
    let req = ShareLetGo { record: rec };
    let r = tell(st, req, None, answer, || st.ledger.share_let_go(st.me, rec));
    r.unwrap_or_else(|e| {
        log!(
            Warn,
            "could not tell that an exported VMM allocation was let go ({e}): it stays charged \
             here until this process exits"
        );
        LetGo::Keep
    })
}

/// This process let go of its last handle and mapping of record `rec`'s allocation.
pub(super) fn leave(st: &State, rec: usize) {
    let r = tell(
        st,
        ShareLeave { record: rec },
        None,
        |_| (),
        || st.ledger.share_leave(st.me, rec).map(|_| ()),
    );
    if let Err(e) = r {
        log!(
            Warn,
            "could not tell that an imported allocation was let go ({e}): its exporter's slice \
             stays charged until this process exits"
        );
    }
}
