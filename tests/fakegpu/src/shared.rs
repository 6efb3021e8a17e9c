//! The node-wide state every process on the fake node shares: one `mmap`ed file in
//! `FAKEGPU_STATE_DIR` holding, per device, the memory in use (reserved by compare-and-swap
//! against the total, so processes cannot overcommit together), the execution engine's owner
//! token and busy time; and per process, a slot with what it holds.
//!
//! **Who is alive is the kernel's answer, not a pid's.** Processes of different PID namespaces
//! (pods) share the state, so a pid names nobody node-wide: each attached process holds a
//! classic POSIX lock (`F_SETLK`) on byte `slot` of `FAKEGPU_STATE_DIR/slot-locks`, which the
//! kernel drops when the process dies (or execs: the fd is close-on-exec), and which a fork
//! does not pass on. A slot whose byte nobody holds belongs to nobody alive. `F_GETLK` names
//! the holder as the *caller's* PID namespace sees it (0 when it cannot see it), as the real
//! driver reports its clients' pids (`os_find_ns_pid`), so NVML's process list is the
//! caller's view: host pids for a monitor with the host's PIDs, a container's own otherwise.
//!
//! Any process can be SIGKILLed at any instruction, so the byte is taken *before* the slot
//! and kept until death: a claimer locks a free slot's byte, then writes its pid; a reclaimer
//! locks a dead slot's byte (it cannot while the owner lives), marks the slot `RECLAIMING`,
//! returns what it held and frees it, then unlocks. A reclaimer killed midway drops the byte,
//! and the next one finishes the job. The slot's words are not locks: the hot paths (launch,
//! alloc, free) touch only atomics, never the lock file.

use crate::config::{Config, MAX_DEVICES};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;

/// Most processes the state file has slots for.
pub const MAX_PROCS: usize = 1024;
const MAGIC: u64 = 0x6661_6b65_6770_7531; // "fakegpu1"
const LAYOUT: u32 = 4;
/// A slot's pid while its owner's remains are being reclaimed.
pub const RECLAIMING: u32 = u32::MAX;
/// Utilization buckets: 16 of 100 ms.
const BUCKETS: usize = 16;
const BUCKET_NS: u64 = 100_000_000;

/// One device's node-wide state.
#[repr(C)]
pub struct DevState {
    /// Bytes of device memory.
    pub total: AtomicU64,
    /// Bytes in use by every process on the node.
    pub used: AtomicU64,
    /// Cumulative engine busy time, ns.
    pub busy_ns: AtomicU64,
    /// Engine owner: process slot + 1; 0 when free.
    pub owner: AtomicU32,
    /// Futex word, bumped at every hand-off and release of the engine.
    pub seq: AtomicU32,
    /// Simulated time (CLOCK_MONOTONIC ns) at which the last holder's work ended.
    pub free_at: AtomicU64,
    /// Real time the engine's holder last showed it is running (a stopped holder loses it).
    pub beat: AtomicU64,
    util: [AtomicU64; BUCKETS],
    util_epoch: [AtomicU64; BUCKETS],
}

/// One process's slot.
#[repr(C)]
pub struct ProcSlot {
    /// The process's pid in its own PID namespace (which may not be the reader's: see
    /// [`visible_pid`]); 0 when the slot is free, `RECLAIMING` (`u32::MAX`) while being
    /// reclaimed.
    pub pid: AtomicU32,
    _pad: u32,
    /// Which claim of the slot this is (node-wide, never reused): what records of other files
    /// (`shared-mem`, `ipc-events`) compare to tell the process that wrote them from a later
    /// one in the same slot, whatever the pids of namespaces.
    pub claim: AtomicU64,
    /// Device memory it holds, per device.
    pub used: [AtomicU64; MAX_DEVICES],
    /// Engine time its kernels used, per device, ns.
    pub busy_ns: [AtomicU64; MAX_DEVICES],
    /// While it waits for the engine of that device: when it last said so (ms, never 0).
    pub want: [AtomicU32; MAX_DEVICES],
}

/// The whole file.
#[repr(C)]
pub struct State {
    magic: AtomicU64,
    layout: AtomicU32,
    /// Devices on the node (from the creator's `FAKEGPU_DEVICES`).
    pub ndev: AtomicU32,
    /// Slots ever claimed: each claim's [`ProcSlot::claim`] is this, bumped.
    claims: AtomicU64,
    /// Per-device state.
    pub dev: [DevState; MAX_DEVICES],
    /// Per-process slots.
    pub procs: [ProcSlot; MAX_PROCS],
}

/// This process's attachment: the mapped state, its own slot, and the lock file whose byte
/// `slot` it holds while it lives.
pub struct Node {
    /// The mapped state.
    pub state: &'static State,
    /// This process's slot index.
    pub slot: usize,
    /// `FAKEGPU_STATE_DIR/slot-locks`, open for the process's life. Closing ANY descriptor of
    /// that file drops all of the process's POSIX locks on it, so nothing else opens it.
    locks: i32,
}

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();

/// Attach to (creating if needed) the node state described by `cfg`; `at_exit` (the runtime's
/// teardown) is registered with `atexit` once this process holds a slot.
pub fn node(cfg: &Config, at_exit: extern "C" fn()) -> Result<&'static Node, String> {
    NODE.get_or_init(|| attach(cfg, at_exit))
        .as_ref()
        .map_err(|e| e.clone())
}

/// The node, if this process attached already.
pub fn attached() -> Option<&'static Node> {
    NODE.get().and_then(|r| r.as_ref().ok())
}

fn attach(cfg: &Config, at_exit: extern "C" fn()) -> Result<Node, String> {
    let (state, locks) = open_state(&cfg.state_dir, cfg.devices, cfg.memory)?;
    reap_slots(state, locks, usize::MAX);
    let pid = std::process::id();
    let Some(slot) = claim(state, locks, pid) else {
        return Err(format!(
            "fakegpu: all {MAX_PROCS} process slots of {} are taken",
            cfg.state_dir.join("state").display()
        ));
    };
    // An exiting process gives its slot back at once (a killed one is reaped).
    // SAFETY: registers plain `extern "C" fn()`s: `at_exit` catches its own panics, and
    // `in_forked_child` only stores to an atomic (async-signal-safe, as a fork handler must be).
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(in_forked_child));
    }
    Ok(Node { state, slot, locks })
}

/// Map `dir/state` (creating it, or starting it afresh when it is new or of another layout,
/// with `devices` devices of `memory` bytes) and open `dir/slot-locks` beside it with the
/// state file's permissions, so whoever may use the state may also lock.
fn open_state(
    dir: &std::path::Path,
    devices: usize,
    memory: u64,
) -> Result<(&'static State, i32), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("fakegpu: FAKEGPU_STATE_DIR={}: {e}", dir.display()))?;
    let path = dir.join("state");
    let lock_path = dir.join("slot-locks");
    let c = |p: &std::path::Path| {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| "fakegpu: FAKEGPU_STATE_DIR contains a NUL byte".to_string())
    };
    let (cpath, clock) = (c(&path)?, c(&lock_path)?);
    let size = std::mem::size_of::<State>();
    let os_err = |what: &str, p: &std::path::Path| {
        format!(
            "fakegpu: cannot {what} {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        )
    };
    // SAFETY: plain syscalls on paths of the state directory; the mapping is checked for
    // failure, and the file is grown to `size` before it is mapped, so every byte of `State`
    // is backed. The state is zeroed and stamped only under the file's flock.
    unsafe {
        let fd = libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        );
        if fd < 0 {
            return Err(os_err("open", &path));
        }
        // Creation is serialised by flock, which the kernel drops if its holder dies.
        libc::flock(fd, libc::LOCK_EX);
        let fail = |msg: String| {
            libc::flock(fd, libc::LOCK_UN);
            libc::close(fd);
            Err(msg)
        };
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st);
        if (st.st_size as usize) < size && libc::ftruncate(fd, size as libc::off_t) != 0 {
            return fail(os_err("size", &path));
        }
        let locks = libc::open(
            clock.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        );
        if locks < 0 {
            return fail(os_err("open", &lock_path));
        }
        let mut lst: libc::stat = std::mem::zeroed();
        libc::fstat(locks, &mut lst);
        let mode = st.st_mode & 0o777;
        if lst.st_mode & 0o777 != mode && lst.st_uid == libc::geteuid() {
            libc::fchmod(locks, mode);
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if p == libc::MAP_FAILED {
            libc::close(locks);
            return fail(os_err("map", &path));
        }
        let state = &*(p as *const State);
        if state.magic.load(Acquire) != MAGIC || state.layout.load(Relaxed) != LAYOUT {
            // Fresh (or foreign) file: the zeroed file is the empty state; set the devices.
            std::ptr::write_bytes(p as *mut u8, 0, size);
            state.ndev.store(devices as u32, Relaxed);
            for d in &state.dev[..devices] {
                d.total.store(memory, Relaxed);
            }
            state.layout.store(LAYOUT, Relaxed);
            state.magic.store(MAGIC, Release);
        } else if state.ndev.load(Relaxed) as usize != devices
            || (devices > 0 && state.dev[0].total.load(Relaxed) != memory)
        {
            eprintln!(
                "fakegpu: {} was created with {} devices of {} bytes; using it, not FAKEGPU_DEVICES={} FAKEGPU_MEMORY={}",
                path.display(),
                state.ndev.load(Relaxed),
                state.dev[0].total.load(Relaxed),
                devices,
                memory
            );
        }
        libc::flock(fd, libc::LOCK_UN);
        libc::close(fd);
        Ok((state, locks))
    }
}

/// A POSIX lock request on byte `slot`.
fn byte(slot: usize, ty: i32) -> libc::flock {
    // SAFETY: `flock` is plain data, for which all zeroes is a valid value.
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = ty as libc::c_short;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = slot as libc::off_t;
    f.l_len = 1;
    f
}

/// Take byte `slot` of the lock file without waiting; false when another process holds it
/// (or the descriptor is unusable: then nothing is judged dead).
fn try_lock(fd: i32, slot: usize) -> bool {
    let f = byte(slot, libc::F_WRLCK);
    // SAFETY: F_SETLK reads the flock we pass; a bad descriptor is an error, not UB.
    unsafe { libc::fcntl(fd, libc::F_SETLK, &f) == 0 }
}

/// Give byte `slot` back.
fn unlock(fd: i32, slot: usize) {
    let f = byte(slot, libc::F_UNLCK);
    // SAFETY: as in `try_lock`.
    unsafe { libc::fcntl(fd, libc::F_SETLK, &f) };
}

/// Which other process holds byte `slot`: its pid in this process's PID namespace (0 when it
/// is in one this process cannot see, or cannot be asked), None when no other process does.
fn holder(fd: i32, slot: usize) -> Option<u32> {
    let mut f = byte(slot, libc::F_WRLCK);
    // SAFETY: F_GETLK fills the flock we pass.
    if unsafe { libc::fcntl(fd, libc::F_GETLK, &mut f) } != 0 {
        return Some(0);
    }
    (f.l_type != libc::F_UNLCK as libc::c_short).then_some(f.l_pid.max(0) as u32)
}

/// Claim a free slot for this process (`pid`, as it sees itself): its byte first, then the
/// slot, so there is no instant at which the slot is taken and its byte free for a reaper.
/// The byte stays locked until the process dies.
fn claim(state: &State, fd: i32, pid: u32) -> Option<usize> {
    for (i, s) in state.procs.iter().enumerate() {
        if s.pid.load(Acquire) != 0 || !try_lock(fd, i) {
            continue;
        }
        if s.pid.compare_exchange(0, pid, AcqRel, Relaxed).is_ok() {
            s.claim
                .store(state.claims.fetch_add(1, AcqRel) + 1, Release);
            return Some(i);
        }
        unlock(fd, i);
    }
    None
}

/// /proc/PID/stat field 3 (state), or None when the process is gone or a zombie. Readable
/// across users, so a waiter can judge any holder it can see.
fn proc_state(pid: u32) -> Option<u8> {
    // Bytes: the name (field 2) may hold anything, ')' and bytes >= 0x80 too (PR_SET_NAME):
    // the fields start after the last ')'.
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let st = *s.get(s.iter().rposition(|&b| b == b')')? + 2)?;
    (st != b'Z').then_some(st)
}

/// What the process in a slot is doing, as far as a waiter for its engine cares.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Liveness {
    /// Gone (nobody holds the slot's byte), or the slot is free or being reclaimed.
    Dead,
    /// Stopped (SIGSTOP, SIGTSTP, a debugger: state `T` or `t`): its CPU side cannot act.
    Stopped,
    /// Running or runnable (maybe descheduled on a busy host) or sleeping; or alive in a PID
    /// namespace this process cannot see (whose state only the engine's heartbeat tells).
    Live,
}

/// Whether the process in `slot` is alive (it holds the slot's byte) and, if so and this
/// process can see it, whether it is stopped. System calls: for waiters that already waited,
/// not hot paths.
pub fn slot_liveness(n: &Node, slot: usize) -> Liveness {
    let pid = n.state.procs[slot].pid.load(Acquire);
    if pid == 0 || pid == RECLAIMING {
        return Liveness::Dead;
    }
    if slot == n.slot {
        return Liveness::Live;
    }
    match holder(n.locks, slot) {
        None => Liveness::Dead,
        Some(0) => Liveness::Live,
        Some(p) => match proc_state(p) {
            Some(b'T' | b't') => Liveness::Stopped,
            _ => Liveness::Live,
        },
    }
}

/// Whether the process in `slot` is still alive.
pub fn slot_alive(n: &Node, slot: usize) -> bool {
    slot_liveness(n, slot) != Liveness::Dead
}

/// The pid of slot `i`'s process as this process sees it (its own for its own slot), or None
/// when it cannot see it (another PID namespace) or nobody alive holds the slot.
pub fn visible_pid(n: &Node, i: usize) -> Option<u32> {
    match holder(n.locks, i) {
        Some(0) => None,
        Some(p) => Some(p),
        None => (i == n.slot).then(std::process::id),
    }
}

/// Set while a thread of this process reaps. One reaper per process at a time: POSIX locks
/// belong to the process, so two of its threads could both take a byte, and the first to
/// unlock would leave the other reclaiming unlocked. Not a `Mutex`: a child forked while
/// another thread reaps would inherit it locked for good (and hang in its first NVML call);
/// the fork handler ([`in_forked_child`]) clears this flag instead.
static REAPING: AtomicBool = AtomicBool::new(false);

/// This thread reaps while it holds one.
struct Reaping;

impl Reaping {
    /// Wait for another thread's reap (a few system calls a slot) to end, then reap.
    fn enter() -> Reaping {
        while REAPING
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        Reaping
    }
}

impl Drop for Reaping {
    fn drop(&mut self) {
        REAPING.store(false, Release);
    }
}

/// `pthread_atfork` child handler: the child's only thread is the one that forked, so no
/// reap is under way there, whatever the parent's other threads were doing.
extern "C" fn in_forked_child() {
    REAPING.store(false, Relaxed);
}

/// Reclaim the slots of dead processes: their memory returns to the devices, their engine
/// token is released. Each dead slot is reclaimed exactly once.
pub fn reap(n: &Node) {
    reap_slots(n.state, n.locks, n.slot);
}

/// [`reap`] for a process holding slot `mine` (`usize::MAX`: none yet).
fn reap_slots(state: &State, fd: i32, mine: usize) {
    let _one = Reaping::enter();
    for (i, s) in state.procs.iter().enumerate() {
        if i == mine || s.pid.load(Acquire) == 0 || !try_lock(fd, i) {
            continue;
        }
        // The byte is ours, so the slot's process is dead (or it is a reclaimer's that died
        // midway: the slot still reads RECLAIMING), and nobody can claim or reclaim the slot
        // before we unlock.
        if s.pid.load(Acquire) != 0 {
            s.pid.store(RECLAIMING, Release);
            release_slot(state, i);
        }
        unlock(fd, i);
    }
}

/// Give back everything slot `i` holds and free it (the caller owns the slot).
pub fn release_slot(state: &State, i: usize) {
    let s = &state.procs[i];
    for d in 0..MAX_DEVICES {
        let held = s.used[d].swap(0, AcqRel);
        if held > 0 {
            sub_saturating(&state.dev[d].used, held);
        }
        s.want[d].store(0, Release);
        s.busy_ns[d].store(0, Relaxed);
        let dev = &state.dev[d];
        if dev
            .owner
            .compare_exchange(i as u32 + 1, 0, AcqRel, Relaxed)
            .is_ok()
        {
            dev.seq.fetch_add(1, Release);
            futex_wake(&dev.seq);
        }
    }
    s.claim.store(0, Relaxed);
    s.pid.store(0, Release);
}

fn sub_saturating(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(n)));
}

impl Node {
    /// Reserve `bytes` of device `dev` for this process; false (and nothing changed) if the
    /// device has not that much left.
    pub fn reserve(&self, dev: usize, bytes: u64) -> bool {
        let d = &self.state.dev[dev];
        let total = d.total.load(Relaxed);
        let ok = d
            .used
            .fetch_update(AcqRel, Acquire, |u| {
                u.checked_add(bytes).filter(|&n| n <= total)
            })
            .is_ok();
        if ok {
            self.state.procs[self.slot].used[dev].fetch_add(bytes, AcqRel);
        }
        ok
    }

    /// Reserve, reaping dead processes and retrying once when the device looks full.
    pub fn reserve_or_reap(&self, dev: usize, bytes: u64) -> bool {
        self.reserve(dev, bytes) || {
            reap(self);
            self.reserve(dev, bytes)
        }
    }

    /// Return `bytes` of device `dev`.
    pub fn unreserve(&self, dev: usize, bytes: u64) {
        sub_saturating(&self.state.procs[self.slot].used[dev], bytes);
        sub_saturating(&self.state.dev[dev].used, bytes);
    }

    /// (free, total) of device `dev`, node-wide.
    pub fn mem_info(&self, dev: usize) -> (u64, u64) {
        let d = &self.state.dev[dev];
        let total = d.total.load(Relaxed);
        (total.saturating_sub(d.used.load(Acquire)), total)
    }

    /// Charge `ns` of engine time on `dev` at simulated time `at`.
    pub fn charge(&self, dev: usize, ns: u64, at: u64) {
        let d = &self.state.dev[dev];
        d.busy_ns.fetch_add(ns, Relaxed);
        self.state.procs[self.slot].busy_ns[dev].fetch_add(ns, Relaxed);
        let epoch = at / BUCKET_NS;
        let b = (epoch as usize) % BUCKETS;
        if d.util_epoch[b].swap(epoch, AcqRel) != epoch {
            d.util[b].store(0, Relaxed);
        }
        d.util[b].fetch_add(ns, Relaxed);
    }
}

/// Percent of the last second (the ten complete 100 ms buckets before now) device `dev` was busy.
pub fn utilization(state: &State, dev: usize, now: u64) -> u32 {
    let d = &state.dev[dev];
    let cur = now / BUCKET_NS;
    let mut busy = 0u64;
    for e in cur.saturating_sub(10)..cur {
        let b = (e as usize) % BUCKETS;
        if d.util_epoch[b].load(Acquire) == e {
            busy += d.util[b].load(Relaxed);
        }
    }
    ((busy * 100) / (10 * BUCKET_NS)).min(100) as u32
}

/// Live processes holding memory on `dev` that this process can see: (pid as it sees it,
/// bytes). As the driver does, a process of a PID namespace the caller cannot see is left
/// out, and a monitor with the host's PIDs sees host pids.
pub fn processes(n: &Node, dev: usize) -> Vec<(u32, u64)> {
    reap(n);
    (0..MAX_PROCS)
        .filter_map(|i| {
            let s = &n.state.procs[i];
            let pid = s.pid.load(Acquire);
            let used = s.used[dev].load(Acquire);
            if pid == 0 || pid == RECLAIMING || used == 0 {
                return None;
            }
            visible_pid(n, i).map(|p| (p, used))
        })
        .collect()
}

/// `ns` nanoseconds as a `timespec`.
fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// Wait on a shared futex word while it equals `val`, at most `timeout_ns`.
pub fn futex_wait(word: &AtomicU32, val: u32, timeout_ns: u64) {
    let ts = timespec(timeout_ns);
    // SAFETY: a non-private FUTEX_WAIT on a word inside the shared mapping, with a relative
    // timeout; spurious returns are handled by the callers' loops.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
        );
    }
}

/// Wake every waiter on a shared futex word.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: a non-private FUTEX_WAKE on a word inside the shared mapping.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// CLOCK_MONOTONIC in ns: the one clock every process on the node agrees on.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleep until CLOCK_MONOTONIC reaches `t` (ns); no system call when it has already.
pub fn sleep_until(t: u64) {
    if now_ns() >= t {
        return;
    }
    let ts = timespec(t);
    // SAFETY: an absolute clock_nanosleep; EINTR just ends the sleep early, callers re-check.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        );
    }
}

/// Engine time, ns, the fake has accounted to process `pid` (as the caller sees it: a host
/// pid for a caller with the host's PIDs; 0: the caller) on physical device `dev`, or
/// `u64::MAX` when this process is not attached or it sees no such process on the node.
/// Exported as `fakegpu_engine_ns` so tests can measure what each process got from the fake's
/// own accounting, independently of gpuslice's scheduler.
#[no_mangle]
pub extern "C" fn fakegpu_engine_ns(pid: u32, dev: u32) -> u64 {
    let Some(n) = attached() else {
        return u64::MAX;
    };
    let d = dev as usize;
    if d >= MAX_DEVICES {
        return u64::MAX;
    }
    if pid == 0 {
        return n.state.procs[n.slot].busy_ns[d].load(Relaxed);
    }
    let recorded = |i: usize| n.state.procs[i].pid.load(Acquire);
    let is_it = |i: usize| {
        let p = recorded(i);
        p != 0 && p != RECLAIMING && visible_pid(n, i) == Some(pid)
    };
    // The slot that recorded this very pid first (one lock query), then every slot (a process
    // in another PID namespace records its own pid): a reader asking for dozens of processes
    // would otherwise make a lock query per slot per process, and its reading would take
    // milliseconds on a busy host.
    (0..MAX_PROCS)
        .find(|&i| recorded(i) == pid && is_it(i))
        .or_else(|| (0..MAX_PROCS).find(|&i| is_it(i)))
        .map_or(u64::MAX, |i| n.state.procs[i].busy_ns[d].load(Relaxed))
}

#[cfg(test)]
mod tests {
    //! The slot protocol between real processes: a forked child stands for another process
    //! (POSIX locks are per process, so threads could not). A child only makes system calls
    //! and touches the mapping (no allocation: the parent has other threads), then `_exit`s.
    use super::*;

    /// A fresh state directory of one 1 GiB device, mapped, with its lock file.
    fn fresh(name: &str) -> (std::path::PathBuf, &'static State, i32) {
        let dir =
            std::env::temp_dir().join(format!("fakegpu-shared-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (state, fd) = open_state(&dir, 1, 1 << 30).unwrap();
        (dir, state, fd)
    }

    /// A forked child running `f(to_parent)`, then `_exit(0)` (1 if `f` panicked).
    struct Child {
        pid: i32,
        from: i32,
    }

    fn pipe() -> [i32; 2] {
        let mut p = [0; 2];
        // SAFETY: pipe fills the two descriptors.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        p
    }

    fn spawn(f: impl FnOnce(i32)) -> Child {
        let up = pipe();
        // SAFETY: the child runs only `f` (system calls and atomics, no allocation) and exits
        // with `_exit`, so nothing of the parent's other threads' state is touched.
        match unsafe { libc::fork() } {
            0 => {
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(up[1])));
                // SAFETY: ends the child without running the parent's exit handlers or
                // returning into the test.
                unsafe { libc::_exit(ok.is_err() as i32) }
            }
            pid => {
                assert!(pid > 0, "fork failed");
                Child { pid, from: up[0] }
            }
        }
    }

    /// Wait (in a child) until killed.
    fn wait_forever() -> ! {
        loop {
            // SAFETY: pause only waits for a signal.
            unsafe { libc::pause() };
        }
    }

    /// Send one byte over `fd`.
    fn put(fd: i32, b: u8) {
        // SAFETY: writes one byte from a local.
        let n = unsafe { libc::write(fd, &b as *const u8 as *const _, 1) };
        assert_eq!(n, 1);
    }

    /// Receive one byte from `fd`.
    fn get(fd: i32) -> u8 {
        let mut b = 0u8;
        // SAFETY: reads one byte into a local.
        assert_eq!(unsafe { libc::read(fd, &mut b as *mut u8 as *mut _, 1) }, 1);
        b
    }

    impl Child {
        fn signal(&self, sig: i32) {
            // SAFETY: signalling our own child, not yet waited for.
            unsafe { libc::kill(self.pid, sig) };
        }
        /// SIGKILL it and wait until it is gone.
        fn kill(self) {
            drop(self);
        }
    }

    impl Drop for Child {
        /// A test that fails midway leaves no child behind.
        fn drop(&mut self) {
            self.signal(libc::SIGKILL);
            // SAFETY: waits for our own child; the descriptor is ours.
            unsafe {
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
                libc::close(self.from);
            }
        }
    }

    /// A child that claims a slot, reserves `bytes` on device 0, reports its slot and waits.
    fn claimer(state: &'static State, fd: i32, bytes: u64) -> (Child, usize) {
        let c = spawn(move |up| {
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() } as u32;
            let slot = claim(state, fd, pid).unwrap();
            let n = Node {
                state,
                slot,
                locks: fd,
            };
            assert!(n.reserve(0, bytes));
            put(up, slot as u8);
            wait_forever();
        });
        let slot = get(c.from) as usize;
        (c, slot)
    }

    #[test]
    fn a_live_process_keeps_its_slot_and_a_killed_ones_slot_is_reclaimed() {
        let (dir, state, fd) = fresh("reclaim");
        let (child, slot) = claimer(state, fd, 300 << 20);
        // Whatever its pid looks like from here (another PID namespace's, colliding or
        // unknown), a process that holds its byte is alive.
        state.procs[slot].pid.store(0x7fff_fff0, Release);
        reap_slots(state, fd, usize::MAX);
        assert_eq!(state.procs[slot].used[0].load(Acquire), 300 << 20);
        assert_eq!(state.dev[0].used.load(Acquire), 300 << 20);
        assert_eq!(holder(fd, slot), Some(child.pid as u32));
        let me = Node {
            state,
            slot: claim(state, fd, std::process::id()).unwrap(),
            locks: fd,
        };
        assert_ne!(me.slot, slot);
        assert_eq!(slot_liveness(&me, slot), Liveness::Live);
        assert_eq!(visible_pid(&me, slot), Some(child.pid as u32));
        assert_eq!(processes(&me, 0), vec![(child.pid as u32, 300 << 20)]);

        child.kill();
        assert_eq!(slot_liveness(&me, slot), Liveness::Dead);
        reap(&me);
        assert_eq!(state.procs[slot].pid.load(Acquire), 0);
        assert_eq!(state.dev[0].used.load(Acquire), 0);
        assert!(processes(&me, 0).is_empty());
        // Its own slot is never reaped by itself, though it holds the byte (own locks never
        // conflict with a process's own requests).
        assert_eq!(state.procs[me.slot].pid.load(Acquire), std::process::id());
        assert_eq!(visible_pid(&me, me.slot), Some(std::process::id()));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_stopped_process_is_told_from_a_live_one() {
        let (dir, state, fd) = fresh("stopped");
        let (child, slot) = claimer(state, fd, 1);
        let me = Node {
            state,
            slot: usize::MAX,
            locks: fd,
        };
        child.signal(libc::SIGSTOP);
        let stopped = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            slot_liveness(&me, slot) == Liveness::Stopped
        });
        assert!(stopped);
        child.signal(libc::SIGCONT);
        let live = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            slot_liveness(&me, slot) == Liveness::Live
        });
        assert!(live);
        child.kill();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_slot_being_claimed_or_reclaimed_is_left_alone() {
        let (dir, state, fd) = fresh("claiming");
        // A claimer that has its byte but not yet the slot (pid still 0).
        let c = spawn(move |up| {
            assert!(try_lock(fd, 0));
            put(up, 1);
            wait_forever();
        });
        get(c.from);
        assert_eq!(claim(state, fd, std::process::id()), Some(1));
        // A reclaimer (or the slot's live owner) holds byte 0 while the slot reads taken:
        // nobody else touches it.
        state.procs[0].pid.store(4242, Release);
        state.procs[0].used[0].store(7, Release);
        state.dev[0].used.store(7, Release);
        reap_slots(state, fd, 1);
        assert_eq!(state.procs[0].pid.load(Acquire), 4242);
        assert_eq!(state.dev[0].used.load(Acquire), 7);
        c.kill();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_reclaimer_killed_midway_is_finished_by_the_next() {
        let (dir, state, fd) = fresh("midway");
        // Slot 3: a reclaimer died after marking it (its byte went with it); slot 5: a
        // process died before anyone noticed.
        for (i, pid) in [(3, RECLAIMING), (5, 77)] {
            state.procs[i].pid.store(pid, Release);
            state.procs[i].used[0].store(1 << 20, Release);
            state.dev[0].used.fetch_add(1 << 20, AcqRel);
            state.dev[0].owner.store(4, Release);
        }
        reap_slots(state, fd, usize::MAX);
        for i in [3, 5] {
            assert_eq!(state.procs[i].pid.load(Acquire), 0);
            assert_eq!(state.procs[i].used[0].load(Acquire), 0);
        }
        assert_eq!(state.dev[0].used.load(Acquire), 0);
        assert_eq!(state.dev[0].owner.load(Acquire), 0, "slot 3's engine token");
        // The bytes were given back: the slots can be claimed.
        assert!(holder(fd, 3).is_none() && holder(fd, 5).is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A child forked while another thread of its parent reaps (a monitor's NVML poller) can
    /// reap, and so answer NVML: a lock held in the parent does not exist in the child.
    #[test]
    fn a_child_forked_during_a_reap_can_reap() {
        let (dir, state, fd) = fresh("forkreap");
        // SAFETY: registers the handler `attach` registers; it only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        let reaping = Reaping::enter();
        let c = spawn(move |up| {
            reap_slots(state, fd, usize::MAX);
            put(up, 1);
        });
        drop(reaping);
        let mut p = libc::pollfd {
            fd: c.from,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one descriptor we own, for at most 10 s.
        let ready = unsafe { libc::poll(&mut p, 1, 10_000) };
        assert!(ready == 1 && get(c.from) == 1, "the child hung in its reap");
        c.kill();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_forked_child_does_not_hold_its_parents_slot() {
        let (dir, state, fd) = fresh("fork");
        let mine = claim(state, fd, std::process::id()).unwrap();
        let c = spawn(move |up| {
            // The child cannot take the parent's byte, and sees the parent holding it.
            put(up, try_lock(fd, mine) as u8);
            // SAFETY: getppid has no preconditions.
            let parent = unsafe { libc::getppid() } as u32;
            put(up, (holder(fd, mine) == Some(parent)) as u8);
        });
        assert_eq!(get(c.from), 0, "the child took the parent's byte");
        assert_eq!(
            get(c.from),
            1,
            "the child did not see its parent hold the slot"
        );
        c.kill();
        let _ = std::fs::remove_dir_all(dir);
    }
}
