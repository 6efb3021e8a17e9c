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
use gpuslice_protocol::{self as protocol, Message};

/// How long one question to the monitor may take (it answers at once).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// In node mode ask the monitor `m` (with descriptor `fd`, if any) and read its `ok` value
/// with `node`; with a personal ledger, do `personal` on it.
fn tell<T>(
    st: &State,
    m: &Message,
    fd: Option<c_int>,
    node: impl FnOnce(&str) -> T,
    personal: impl FnOnce() -> Result<T, LedgerError>,
) -> Result<T, String> {
    if !st.ledger.is_node() {
        return personal().map_err(|e| e.to_string());
    }
    let fds: Vec<c_int> = fd.into_iter().collect();
    let (r, _) =
        protocol::call_with(st.ledger.dir().fd(), m, &fds, TIMEOUT).map_err(|e| e.to_string())?;
    match (r.get("ok"), r.get("err")) {
        (Some(v), _) => Ok(node(v)),
        (None, e) => Err(e.unwrap_or("no answer").to_string()),
    }
}

/// A record index as the monitor answers it (`-`: none).
fn record(v: &str) -> Option<usize> {
    v.parse().ok()
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
    let mut m = Message::new("op", "share-export");
    m.push("dev", &dev.uuid).push("bytes", &bytes.to_string());
    let r = tell(st, &m, Some(fd), record, || {
        keyed(fd, |k| {
            st.ledger.share_export(st.me, dev.ledger_dev, k, bytes)
        })
    });
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

/// The monitor's answer to `share-import` (`monitor/src/shared.rs`).
fn imported(v: &str) -> Import {
    let w: Vec<&str> = v.split(' ').collect();
    let n = |i: usize| w.get(i).and_then(|x| x.parse::<u64>().ok());
    let us = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
    match (w.first().copied(), n(1), n(2), n(3)) {
        (Some("held"), Some(rec), None, None) => Import::Held(us(rec)),
        (Some("adopted"), Some(rec), Some(dev), Some(bytes)) => Import::Adopted {
            rec: us(rec),
            dev: us(dev),
            bytes,
        },
        (Some("refused"), Some(dev), Some(bytes), None) => Import::Refused {
            dev: us(dev),
            bytes,
        },
        (Some("charge"), Some(dev), Some(bytes), None) => Import::Charge {
            dev: us(dev),
            bytes,
        },
        _ => Import::Unknown,
    }
}

/// This process is importing the POSIX descriptor `fd` (asked before the driver's import):
/// counted on a record someone is charged for, charged for an orphan (or refused, or told to
/// charge itself), or neither.
pub(super) fn import(st: &State, fd: c_int) -> Import {
    let m = Message::new("op", "share-import");
    let r = tell(st, &m, Some(fd), imported, || {
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
    let mut m = Message::new("op", "share-let-go");
    m.push("rec", &rec.to_string());
    let answer = |v: &str| match v {
        "handed-over" => LetGo::HandedOver,
        "uncharge" => LetGo::Uncharge,
        _ => LetGo::Keep,
    };
    let r = tell(st, &m, None, answer, || st.ledger.share_let_go(st.me, rec));
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
    let mut m = Message::new("op", "share-leave");
    m.push("rec", &rec.to_string());
    let r = tell(
        st,
        &m,
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
