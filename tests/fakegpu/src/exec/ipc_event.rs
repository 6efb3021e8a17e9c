//! Interprocess events (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): an event created with
//! `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING` whose records another process waits on.
//!
//! The exporter mirrors each record of such an event (its generation, then the generation the
//! executor planned and its simulated end time) into a slot of a node-wide file
//! (`FAKEGPU_STATE_DIR/ipc-events`, lock-free: slots are claimed by compare-and-swap of their
//! pid, a dead owner's slot is taken over, and a serial number tells a reused slot from the
//! one a handle named). The importer's event reads that slot: `cuEventQuery` and
//! `cuEventSynchronize` see the exporter's last record as the driver would. Apart from
//! `event.rs` because only these events pay for it.
//!
//! What the fake does differently: `cuStreamWaitEvent` on an opened event waits on the host,
//! at the call, for the exporter's last record (the driver queues the wait on the stream);
//! recording an opened event is not seen by its exporter.

use super::{Event, HostWait};
use crate::mem::map_node_file;
use crate::runtime::{rt, rt_unchecked, CuResult};
use crate::shared::{now_ns, slot_alive};
use gpuslice_abi::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};

const SLOTS: usize = 4096;
const MAGIC: u64 = 0x6661_6b65_6970_6365; // "fakeipce"
const HANDLE_MAGIC: u32 = u32::from_le_bytes(*b"FGIE");
/// Set in an opened event's flags (above the driver's 32 bits of flags).
pub(super) const IMPORTED: u64 = 1 << 32;

#[repr(C)]
struct Slot {
    /// The exporter's pid; 0 while free.
    pid: AtomicU32,
    /// Its slot in the node state, so its liveness can be checked.
    proc_slot: AtomicU32,
    /// That slot's claim ([`crate::shared::ProcSlot::claim`]).
    claim: AtomicU64,
    serial: AtomicU64,
    /// Latest record generation issued.
    gen: AtomicU64,
    /// Latest generation the executor planned, and its simulated end time.
    done: AtomicU64,
    ts: AtomicU64,
}

#[repr(C)]
struct File {
    magic: AtomicU64,
    serial: AtomicU64,
    slots: [Slot; SLOTS],
}

static FILE: OnceLock<Result<&'static File, CUresult>> = OnceLock::new();
/// Exported events of this process: event address -> slot.
static EXPORTED: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
/// Opened events of this process: event address -> (slot, serial).
static OPENED: Mutex<Option<HashMap<usize, (usize, u64)>>> = Mutex::new(None);

fn with<V, T>(
    m: &Mutex<Option<HashMap<usize, V>>>,
    f: impl FnOnce(&mut HashMap<usize, V>) -> T,
) -> T {
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn file() -> CuResult<&'static File> {
    *FILE.get_or_init(|| {
        let (p, fd) = map_node_file("ipc-events", std::mem::size_of::<File>(), MAGIC)?;
        // SAFETY: the mapping outlives the process and a zeroed `File` (all atomics) is all
        // slots free; the fd is ours and no longer needed once mapped.
        unsafe {
            libc::close(fd);
            Ok(&*(p as *const File))
        }
    })
}

/// Whether the slot's exporter is still the live process that claimed it.
fn owner_alive(s: &Slot) -> bool {
    let n = rt_unchecked().node;
    let (pid, i) = (s.pid.load(Acquire), s.proc_slot.load(Acquire) as usize);
    pid != 0
        && i < n.state.procs.len()
        && n.state.procs[i].pid.load(Acquire) == pid
        && n.state.procs[i].claim.load(Acquire) == s.claim.load(Acquire)
        && slot_alive(n, i)
}

fn encode(pid: u32, slot: usize, serial: u64) -> CUipcEventHandle {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&pid.to_le_bytes());
    b[8..12].copy_from_slice(&(slot as u32).to_le_bytes());
    b[16..24].copy_from_slice(&serial.to_le_bytes());
    CUipcEventHandle {
        reserved: b.map(|x| x as std::ffi::c_char),
    }
}

fn decode(h: &CUipcEventHandle) -> Option<(u32, usize, u64)> {
    let b = h.reserved.map(|x| x as u8);
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let serial = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    (u32_at(0) == HANDLE_MAGIC && (u32_at(8) as usize) < SLOTS)
        .then(|| (u32_at(4), u32_at(8) as usize, serial))
}

/// `cuIpcGetEventHandle`.
pub fn get_event_handle(e: &'static Event) -> CuResult<CUipcEventHandle> {
    let want = (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) as u64;
    let flags = e.flags.load(Relaxed);
    if flags & want != want || flags & IMPORTED != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let f = file()?;
    let n = rt()?.node;
    let pid = std::process::id();
    let me = e as *const Event as usize;
    if let Some(i) = with(&EXPORTED, |m| m.get(&me).copied()) {
        return Ok(encode(pid, i, f.slots[i].serial.load(Acquire)));
    }
    let claim = n.state.procs[n.slot].claim.load(Acquire);
    for (i, s) in f.slots.iter().enumerate() {
        let cur = s.pid.load(Acquire);
        if (cur != 0 && owner_alive(s))
            || s.pid.compare_exchange(cur, pid, AcqRel, Relaxed).is_err()
        {
            continue;
        }
        s.proc_slot.store(n.slot as u32, Release);
        s.claim.store(claim, Release);
        let serial = f.serial.fetch_add(1, AcqRel) + 1;
        let (gen, done, ts) = e.snapshot();
        s.gen.store(gen, Release);
        s.ts.store(ts, Release);
        s.done.store(done, Release);
        s.serial.store(serial, Release);
        with(&EXPORTED, |m| m.insert(me, i));
        return Ok(encode(pid, i, serial));
    }
    Err(CUDA_ERROR_OUT_OF_MEMORY)
}

/// `cuIpcOpenEventHandle`: a new event of this process mirroring the exporter's.
pub fn open_event_handle(h: &CUipcEventHandle) -> CuResult<&'static Event> {
    let (pid, i, serial) = decode(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if pid == std::process::id() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let s = &file()?.slots[i];
    if s.pid.load(Acquire) != pid || s.serial.load(Acquire) != serial || !owner_alive(s) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = Event::create(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
    e.flags.fetch_or(IMPORTED, AcqRel);
    with(&OPENED, |m| {
        m.insert(e as *const Event as usize, (i, serial))
    });
    Ok(e)
}

fn exported_slot(e: &Event) -> Option<&'static Slot> {
    let i = with(&EXPORTED, |m| m.get(&(e as *const Event as usize)).copied())?;
    file().ok().map(|f| &f.slots[i])
}

/// An exported event was recorded: generation `gen` issued.
pub(super) fn recorded(e: &Event, gen: u64) {
    if let Some(s) = exported_slot(e) {
        s.gen.fetch_max(gen, AcqRel);
    }
}

/// An exported event's generation `gen` was planned to end at simulated time `at`.
pub(super) fn planned(e: &Event, gen: u64, at: u64) {
    if let Some(s) = exported_slot(e) {
        s.ts.store(at, Release);
        s.done.fetch_max(gen, AcqRel);
    }
}

/// An exported or opened event is destroyed: forget it (an exported one's slot is freed, and
/// events opened from it then read as complete).
pub(super) fn forget(e: &Event) {
    let me = e as *const Event as usize;
    if let Some(i) = with(&EXPORTED, |m| m.remove(&me)) {
        if let Ok(f) = file() {
            f.slots[i].serial.store(0, Release);
            f.slots[i].pid.store(0, Release);
        }
    }
    with(&OPENED, |m| m.remove(&me));
}

/// The exporter's slot an opened event reads, while it is the one its handle named.
fn remote(e: &Event) -> Option<&'static Slot> {
    let (i, serial) = with(&OPENED, |m| m.get(&(e as *const Event as usize)).copied())?;
    let s = &file().ok()?.slots[i];
    (s.serial.load(Acquire) == serial && owner_alive(s)).then_some(s)
}

/// Whether an opened event's exporter has completed its last record (a gone exporter's
/// work is over).
pub(super) fn complete(e: &Event) -> bool {
    remote(e).is_none_or(|s| {
        let gen = s.gen.load(Acquire);
        s.done.load(Acquire) >= gen && now_ns() >= s.ts.load(Acquire)
    })
}

/// Wait until an opened event's exporter has completed the record that was last when called.
pub(super) fn synchronize(e: &Event) -> CuResult<()> {
    let Some(s) = remote(e) else { return Ok(()) };
    let gen = s.gen.load(Acquire);
    while s.done.load(Acquire) < gen {
        if remote(e).is_none() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    HostWait::of_event(e.flags.load(Relaxed)).until(s.ts.load(Acquire), false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_handle_reads_back_and_names_only_slots_that_exist() {
        let h = encode(77, 12, 5);
        assert_eq!(decode(&h), Some((77, 12, 5)));
        let mut far = h;
        far.reserved[8..12]
            .copy_from_slice(&(SLOTS as u32).to_le_bytes().map(|b| b as std::ffi::c_char));
        assert_eq!(decode(&far), None, "a slot past the table");
        assert_eq!(decode(&CUipcEventHandle { reserved: [0; 64] }), None);
    }
}
