//! Exported VMM allocations: telling the ledger (a personal ledger, under its lock:
//! [`Personal`]) or the node's monitor (node mode, over `monitor.sock`: the policy is
//! read-only here; [`Node`]) that this process exported, imported, let go of or left one, so
//! that the exporter's slice stays charged while any process holds the memory, and an importer
//! of memory nobody is charged for any more is charged for it (`gpuslice_ledger`'s
//! `ledger/shared/`). Cold paths
//! only (an export, an import, a last release or unmap). A failure never fails the driver
//! call: the charge then stays with its exporter until it exits (never less than the driver
//! holds), or an importer's hold is not counted; said once in the log.

use crate::admit::DevState;
use crate::init::State;
use crate::log::log;
use core::ffi::c_int;
use gpuslice_ledger::{Import, LetGo, ShareKey};
use gpuslice_protocol::{
    self as protocol, Call, Imported, ShareExport, ShareImport, ShareLeave, ShareLetGo,
};

/// How long one question to the monitor may take (it answers at once).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Where exports and imports are told: one implementation a mode, so each reads whole. The
/// mode is the ledger's (a node's policy or a personal ledger, fixed when start-up opened it).
trait Sharing {
    /// The record of an export of `bytes` on `dev` as descriptor `fd` (`None`: not registered).
    fn export(
        &self,
        st: &State,
        dev: &DevState,
        fd: c_int,
        bytes: u64,
    ) -> Result<Option<usize>, String>;
    /// What importing descriptor `fd` charges.
    fn import(&self, st: &State, fd: c_int) -> Result<Import, String>;
    /// The exporter let go of record `rec`: what to do with its charge.
    fn let_go(&self, st: &State, rec: usize) -> Result<LetGo, String>;
    /// This process let go of its last handle and mapping of record `rec`.
    fn leave(&self, st: &State, rec: usize) -> Result<(), String>;
}

/// The implementation of the ledger's mode.
fn sharing(st: &State) -> &'static dyn Sharing {
    if st.ledger.is_node() {
        &Node
    } else {
        &Personal
    }
}

/// A personal ledger: this process changes the records itself, under the ledger's lock.
struct Personal;

impl Sharing for Personal {
    fn export(
        &self,
        st: &State,
        dev: &DevState,
        fd: c_int,
        bytes: u64,
    ) -> Result<Option<usize>, String> {
        let Some(key) = ShareKey::of_fd(fd) else {
            return Ok(None);
        };
        (st.ledger.share_export(st.me, dev.ledger_dev, key, bytes)).map_err(|e| e.to_string())
    }

    fn import(&self, st: &State, fd: c_int) -> Result<Import, String> {
        let Some(key) = ShareKey::of_fd(fd) else {
            return Ok(Import::Unknown);
        };
        st.ledger
            .share_import(st.me, key)
            .map_err(|e| e.to_string())
    }

    fn let_go(&self, st: &State, rec: usize) -> Result<LetGo, String> {
        st.ledger
            .share_let_go(st.me, rec)
            .map_err(|e| e.to_string())
    }

    fn leave(&self, st: &State, rec: usize) -> Result<(), String> {
        (st.ledger.share_leave(st.me, rec).map(drop)).map_err(|e| e.to_string())
    }
}

/// A node's policy (read-only here): the monitor changes the records, asked over
/// `monitor.sock`, reading a descriptor's identity itself from the one passed with the request.
struct Node;

/// Ask the monitor `req`, passing descriptor `fd` if any.
fn ask<C: Call>(st: &State, req: C, fd: Option<c_int>) -> Result<C::Reply, String> {
    let fds: Vec<c_int> = fd.into_iter().collect();
    let (answer, _) =
        protocol::exchange(st.ledger.dir().fd(), req, &fds, TIMEOUT).map_err(|e| e.to_string())?;
    answer.map_err(|refusal| refusal.message)
}

impl Sharing for Node {
    fn export(
        &self,
        st: &State,
        dev: &DevState,
        fd: c_int,
        bytes: u64,
    ) -> Result<Option<usize>, String> {
        let req = ShareExport {
            device: dev.uuid.clone(),
            bytes,
        };
        ask(st, req, Some(fd)).map(|e| e.record)
    }

    fn import(&self, st: &State, fd: c_int) -> Result<Import, String> {
        Ok(match ask(st, ShareImport, Some(fd))? {
            Imported::Held(rec) => Import::Held(rec),
            Imported::Adopted { rec, dev, bytes } => Import::Adopted { rec, dev, bytes },
            Imported::Refused { dev, bytes } => Import::Refused { dev, bytes },
            Imported::Charge { dev, bytes } => Import::Charge { dev, bytes },
            Imported::Unknown => Import::Unknown,
        })
    }

    fn let_go(&self, st: &State, rec: usize) -> Result<LetGo, String> {
        Ok(match ask(st, ShareLetGo { record: rec }, None)? {
            protocol::LetGo::HandedOver => LetGo::HandedOver,
            protocol::LetGo::Uncharge => LetGo::Uncharge,
            protocol::LetGo::Keep => LetGo::Keep,
        })
    }

    fn leave(&self, st: &State, rec: usize) -> Result<(), String> {
        ask(st, ShareLeave { record: rec }, None).map(drop)
    }
}

/// This process exported `bytes` charged on `dev` as the POSIX descriptor `fd`: the record
/// of the export (`None`: not registered, charged here until this process exits).
pub(super) fn export(st: &State, dev: &DevState, fd: c_int, bytes: u64) -> Option<usize> {
    match sharing(st).export(st, dev, fd, bytes) {
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

/// This process is importing the POSIX descriptor `fd` (asked before the driver's import):
/// counted on a record someone is charged for, charged for an orphan (or refused, or told to
/// charge itself), or neither.
pub(super) fn import(st: &State, fd: c_int) -> Import {
    sharing(st).import(st, fd).unwrap_or_else(|e| {
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
    sharing(st).let_go(st, rec).unwrap_or_else(|e| {
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
    if let Err(e) = sharing(st).leave(st, rec) {
        log!(
            Warn,
            "could not tell that an imported allocation was let go ({e}): its exporter's slice \
             stays charged until this process exits"
        );
    }
}
