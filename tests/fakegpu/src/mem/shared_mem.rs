//! The node-wide table of device memory shared between processes (legacy IPC handles and VMM
//! allocations exported as POSIX fds): which process allocated it (its memory stays counted
//! to that process, which NVML shows, as the driver attributes memory to its allocator) and
//! which live processes hold it. The memory leaves its owner's count when the last holder lets
//! go, as the driver frees shared memory when its last reference goes, whichever process that
//! is in.
//!
//! A file of its own (`FAKEGPU_STATE_DIR/shared-mem`) beside the state file, changed only
//! under `flock` plus a process-wide mutex (an `flock` is per open file, so threads of one
//! process would not exclude each other): exports, imports and closes are rare, and the kernel
//! drops the lock of a process that dies holding it. Holders that died are dropped at every
//! change, so a SIGKILLed importer never keeps its exporter charged past the next one.

use crate::runtime::{rt_unchecked, CuResult};
use crate::shared::{slot_alive, State, RECLAIMING};
use gpuslice_abi::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering::*;
use std::sync::Mutex;

/// Shared allocations the node can hold at once.
const RECS: usize = 2048;
/// Processes that can hold one at once.
const HOLDERS: usize = 32;
const MAGIC: u64 = 0x6661_6b65_7368_6d31; // "fakeshm1"
/// Keys of legacy IPC allocations (a node-wide counter) and of VMM ones (the memfd's inode)
/// never meet.
pub const VMM_KEY: u64 = 1 << 63;

/// A process, as a holder or owner: its pid, state-file slot and the slot's claim
/// ([`crate::shared::ProcSlot::claim`]).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Debug, Default)]
struct Proc {
    pid: u32,
    slot: u32,
    claim: u64,
}

#[repr(C)]
struct Rec {
    /// 0 while the record is free.
    key: u64,
    owner: Proc,
    /// Physical device the memory is counted on.
    phys: u32,
    /// 1 while the owner itself still holds it (has not freed or released it).
    owner_holds: u32,
    size: u64,
    holders: [Proc; HOLDERS],
}

#[repr(C)]
struct Table {
    magic: u64,
    next_key: u64,
    recs: [Rec; RECS],
}

/// This process's view: the mapped table, its lock file, and how many local references it
/// holds on each key (a process is one holder however often it opens the same memory).
struct Local {
    table: *mut Table,
    fd: i32,
    refs: HashMap<u64, u32>,
}

// SAFETY: the mapping is only touched under LOCAL's mutex (and the file lock).
unsafe impl Send for Local {}

static LOCAL: Mutex<Option<Local>> = Mutex::new(None);

/// What a holder learns about shared memory it joins.
#[derive(Clone, Copy, Debug)]
pub struct Joined {
    /// Physical device it is counted on.
    pub phys: usize,
    /// Bytes counted.
    pub size: u64,
}

fn me() -> Proc {
    let n = rt_unchecked().node;
    let s = &n.state.procs[n.slot];
    Proc {
        pid: s.pid.load(Acquire),
        slot: n.slot as u32,
        claim: s.claim.load(Acquire),
    }
}

/// Whether `p` is still the live process of its slot. The table is hostile input (any process
/// of the user can write it): indices are checked before use, here and in [`give_back`].
fn alive(state: &State, p: &Proc) -> bool {
    let Some(s) = state.procs.get(p.slot as usize) else {
        return false;
    };
    p.pid != 0
        && s.pid.load(Acquire) == p.pid
        && s.claim.load(Acquire) == p.claim
        && slot_alive(rt_unchecked().node, p.slot as usize)
}

/// Open (creating if needed) the table.
fn open() -> CuResult<Local> {
    let (p, fd) = map_node_file("shared-mem", std::mem::size_of::<Table>(), MAGIC)?;
    Ok(Local {
        table: p as *mut Table,
        fd,
        refs: HashMap::new(),
    })
}

/// Map `FAKEGPU_STATE_DIR/<name>` shared and read-write, created and grown to `size` bytes if
/// need be: (address, its open fd). A file whose first eight bytes are not `magic` (new, or of
/// another layout) is zeroed and then stamped, under `flock`, so exactly one process starts it.
pub(crate) fn map_node_file(name: &str, size: usize, magic: u64) -> CuResult<(*mut u8, i32)> {
    let path = rt_unchecked().cfg.state_dir.join(name);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)?;
    // SAFETY: plain syscalls on a path of the state directory; the file is grown to `size`
    // before it is mapped, so every byte of the mapping is backed; failures are checked; the
    // first eight bytes are read and written only under the file lock.
    unsafe {
        let fd = libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        );
        if fd < 0 {
            return Err(CUDA_ERROR_OPERATING_SYSTEM);
        }
        libc::flock(fd, libc::LOCK_EX);
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st);
        let ok = (st.st_size as usize) >= size || libc::ftruncate(fd, size as libc::off_t) == 0;
        let p = if ok {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        if p != libc::MAP_FAILED && std::ptr::read_volatile(p as *const u64) != magic {
            std::ptr::write_bytes(p as *mut u8, 0, size);
            std::ptr::write_volatile(p as *mut u64, magic);
        }
        libc::flock(fd, libc::LOCK_UN);
        if p == libc::MAP_FAILED {
            libc::close(fd);
            return Err(CUDA_ERROR_OPERATING_SYSTEM);
        }
        Ok((p as *mut u8, fd))
    }
}

/// Run `f` on the table, exclusively on the node, after dropping dead holders.
fn with_table<T>(f: impl FnOnce(&mut Table, &mut HashMap<u64, u32>, &State) -> T) -> CuResult<T> {
    let mut g = LOCAL.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(open()?);
    }
    let l = g.as_mut().expect("opened");
    let state = rt_unchecked().node.state;
    // SAFETY: the table is mapped for the life of the process and, under LOCAL's mutex and
    // the file lock, no other thread or process touches it.
    unsafe {
        libc::flock(l.fd, libc::LOCK_EX);
        let t = &mut *l.table;
        collect(t, state);
        let r = f(t, &mut l.refs, state);
        libc::flock(l.fd, libc::LOCK_UN);
        Ok(r)
    }
}

/// Drop holders that died; free records nobody holds, returning their memory.
fn collect(t: &mut Table, state: &State) {
    for r in t.recs.iter_mut().filter(|r| r.key != 0) {
        for h in r.holders.iter_mut().filter(|h| h.pid != 0) {
            if !alive(state, h) {
                if *h == r.owner {
                    r.owner_holds = 0;
                }
                *h = Proc::default();
            }
        }
        if r.holders.iter().all(|h| h.pid == 0) {
            give_back(r, state);
        }
    }
}

/// The last holder is gone: the owner's count drops by the record's size (unless the owner
/// died, whose whole count went when its slot was reclaimed), and the record is free.
fn give_back(r: &mut Rec, state: &State) {
    let phys = r.phys as usize;
    if phys < state.dev.len() && alive(state, &r.owner) {
        let s = &state.procs[r.owner.slot as usize];
        // Only what the slot still holds: a slot being reclaimed has swapped its count to 0
        // and returns that to the device itself.
        if s.pid.load(Acquire) != RECLAIMING
            && s.used[phys]
                .fetch_update(AcqRel, Acquire, |u| u.checked_sub(r.size))
                .is_ok()
        {
            let _ = state.dev[phys]
                .used
                .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(r.size)));
        }
    }
    *r = Rec {
        key: 0,
        owner: Proc::default(),
        phys: 0,
        owner_holds: 0,
        size: 0,
        holders: [Proc::default(); HOLDERS],
    };
}

fn find(t: &mut Table, key: u64) -> Option<&mut Rec> {
    t.recs.iter_mut().find(|r| r.key == key)
}

/// Add this process as a holder of `r` (once per process: `refs` counts the local uses).
fn hold(r: &mut Rec, refs: &mut HashMap<u64, u32>, me: Proc) -> CuResult<()> {
    let n = refs.entry(r.key).or_insert(0);
    if *n == 0 && !r.holders.contains(&me) {
        let free = r
            .holders
            .iter_mut()
            .find(|h| h.pid == 0)
            .ok_or(CUDA_ERROR_TOO_MANY_PEERS)?;
        *free = me;
    }
    *n += 1;
    Ok(())
}

/// Share memory this process allocated: `size` bytes counted on physical device `phys`.
/// `key` names it (a VMM memfd's inode | [`VMM_KEY`]); `None` draws a fresh legacy key. An
/// allocation already shared is joined again. Returns its key.
pub fn share(key: Option<u64>, phys: usize, size: u64) -> CuResult<u64> {
    let me = me();
    with_table(|t, refs, _| {
        if let Some(r) = key.and_then(|k| find(t, k)) {
            hold(r, refs, me)?;
            return Ok(r.key);
        }
        let key = key.unwrap_or_else(|| {
            t.next_key = (t.next_key + 1) & !VMM_KEY;
            t.next_key.max(1)
        });
        let r = t
            .recs
            .iter_mut()
            .find(|r| r.key == 0)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        r.key = key;
        r.owner = me;
        r.phys = phys as u32;
        r.size = size;
        r.owner_holds = 1;
        r.holders[0] = me;
        refs.insert(key, 1);
        Ok(key)
    })?
}

/// Join memory another process shares under `key`; for legacy IPC (`need_owner`) only while
/// its owner still holds it (a handle of freed memory is `CUDA_ERROR_INVALID_VALUE`).
pub fn join(key: u64, need_owner: bool) -> CuResult<Joined> {
    let me = me();
    with_table(|t, refs, _| {
        let r = find(t, key).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if need_owner && r.owner_holds == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        hold(r, refs, me)?;
        Ok(Joined {
            phys: r.phys as usize,
            size: r.size,
        })
    })?
}

/// This process lets go of one use of `key`; when it was its last, it stops holding the
/// memory (the owner freeing it: the memory stays counted while others hold it), and the
/// last holder anywhere returns the memory to the device.
pub fn leave(key: u64) {
    let me = me();
    let _ = with_table(|t, refs, state| {
        let Some(n) = refs.get_mut(&key) else { return };
        *n -= 1;
        if *n == 0 {
            refs.remove(&key);
            stop_holding(t, state, key, me);
        }
    });
}

/// At exit: this process stops holding all it still holds, as a driver's teardown drops a
/// process's references (a SIGKILLed process is dropped by the next change anyone makes).
/// Skipped when another thread is inside the table now: exit must not wait.
pub fn leave_all() {
    let Ok(mut g) = LOCAL.try_lock() else { return };
    let Some(l) = g.as_mut() else { return };
    let me = me();
    let state = rt_unchecked().node.state;
    // SAFETY: as in `with_table`: under LOCAL's mutex and the file lock, only we touch it.
    unsafe {
        libc::flock(l.fd, libc::LOCK_EX);
        let t = &mut *l.table;
        for (key, _) in l.refs.drain() {
            stop_holding(t, state, key, me);
        }
        libc::flock(l.fd, libc::LOCK_UN);
    }
}

/// `me` no longer holds `key`: the last holder anywhere returns the memory.
fn stop_holding(t: &mut Table, state: &State, key: u64, me: Proc) {
    let Some(r) = find(t, key) else { return };
    if r.owner == me {
        r.owner_holds = 0;
    }
    for h in r.holders.iter_mut().filter(|h| **h == me) {
        *h = Proc::default();
    }
    if r.holders.iter().all(|h| h.pid == 0) {
        give_back(r, state);
    }
}

/// The inode of a memfd: what names shared memory across processes (an fd passed on or
/// reopened through `/proc` keeps it).
pub(super) fn inode(fd: i32) -> Option<u64> {
    // SAFETY: libc::stat is plain data; fstat writes it or fails on a bad fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino)
}
