//! The node-wide state every process on the fake node shares: one `mmap`ed file in
//! `FAKEGPU_STATE_DIR` holding, per device, the memory in use (reserved by compare-and-swap
//! against the total, so processes cannot overcommit together), the execution engine's owner
//! token and busy time; and per process, a slot with its pid and what it holds.
//!
//! Any process can be SIGKILLed at any instruction. Nothing here is a lock: a dead process's
//! slot is reclaimed, exactly once (whoever wins the CAS of its pid to `RECLAIMING` (`u32::MAX`)), by
//! whoever notices first, and the engine token it held is taken back the same way.

use crate::config::{Config, MAX_DEVICES};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;

/// Most processes the state file has slots for.
pub const MAX_PROCS: usize = 1024;
const MAGIC: u64 = 0x6661_6b65_6770_7531; // "fakegpu1"
const LAYOUT: u32 = 3;
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
    /// The process's pid; 0 when the slot is free, `RECLAIMING` (`u32::MAX`) while being reclaimed.
    pub pid: AtomicU32,
    _pad: u32,
    /// Its start time (clock ticks since boot, /proc/PID/stat field 22): pids are reused.
    pub start_time: AtomicU64,
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
    /// Per-device state.
    pub dev: [DevState; MAX_DEVICES],
    /// Per-process slots.
    pub procs: [ProcSlot; MAX_PROCS],
}

/// This process's attachment: the mapped state and its own slot.
pub struct Node {
    /// The mapped state.
    pub state: &'static State,
    /// This process's slot index.
    pub slot: usize,
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
    let dir = &cfg.state_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("fakegpu: FAKEGPU_STATE_DIR={}: {e}", dir.display()))?;
    let path = dir.join("state");
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "fakegpu: FAKEGPU_STATE_DIR contains a NUL byte".to_string())?;
    let size = std::mem::size_of::<State>();
    // SAFETY: plain syscalls on a path we own; the mapping is checked for failure, and the
    // file is grown to `size` before it is mapped, so every byte of `State` is backed.
    unsafe {
        let fd = libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        );
        if fd < 0 {
            return Err(format!(
                "fakegpu: cannot open {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        // Creation is serialised by flock, which the kernel drops if its holder dies.
        libc::flock(fd, libc::LOCK_EX);
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st);
        if (st.st_size as usize) < size && libc::ftruncate(fd, size as libc::off_t) != 0 {
            libc::flock(fd, libc::LOCK_UN);
            libc::close(fd);
            return Err(format!("fakegpu: cannot size {}", path.display()));
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
            libc::flock(fd, libc::LOCK_UN);
            libc::close(fd);
            return Err(format!("fakegpu: cannot map {}", path.display()));
        }
        let state = &*(p as *const State);
        if state.magic.load(Acquire) != MAGIC || state.layout.load(Relaxed) != LAYOUT {
            // Fresh (or foreign) file: the zeroed file is the empty state; set the devices.
            std::ptr::write_bytes(p as *mut u8, 0, size);
            state.ndev.store(cfg.devices as u32, Relaxed);
            for d in &state.dev[..cfg.devices] {
                d.total.store(cfg.memory, Relaxed);
            }
            state.layout.store(LAYOUT, Relaxed);
            state.magic.store(MAGIC, Release);
        } else if state.ndev.load(Relaxed) as usize != cfg.devices
            || (cfg.devices > 0 && state.dev[0].total.load(Relaxed) != cfg.memory)
        {
            eprintln!(
                "fakegpu: {} was created with {} devices of {} bytes; using it, not FAKEGPU_DEVICES={} FAKEGPU_MEMORY={}",
                path.display(),
                state.ndev.load(Relaxed),
                state.dev[0].total.load(Relaxed),
                cfg.devices,
                cfg.memory
            );
        }
        libc::flock(fd, libc::LOCK_UN);
        libc::close(fd);
        reap(state);
        let pid = libc::getpid() as u32;
        let start = start_time(pid).unwrap_or(0);
        for (i, s) in state.procs.iter().enumerate() {
            if s.pid.compare_exchange(0, pid, AcqRel, Relaxed).is_ok() {
                s.start_time.store(start, Release);
                // An exiting process gives its slot back at once (a killed one is reaped).
                libc::atexit(at_exit);
                return Ok(Node { state, slot: i });
            }
        }
        Err(format!(
            "fakegpu: all {MAX_PROCS} process slots of {} are taken",
            path.display()
        ))
    }
}

/// /proc/PID/stat fields 3 (state) and 22 (start time), or None when the process is gone or a
/// zombie. Readable across users, so a waiter can judge any holder.
fn proc_stat(pid: u32) -> Option<(u8, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold anything, ')' too: the fields start after the last one.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let mut f = rest.split(' ');
    let st = *f.next()?.as_bytes().first()?;
    if st == b'Z' {
        return None;
    }
    Some((st, f.nth(18)?.parse().ok()?))
}

/// /proc/PID/stat field 22 (start time), or None when the process is gone or a zombie.
fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, t)| t)
}

/// What the process in a slot is doing, as far as a waiter for its engine cares.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Liveness {
    /// Gone, a zombie, or its pid reused by another process.
    Dead,
    /// Stopped (SIGSTOP, SIGTSTP, a debugger: state `T` or `t`): its CPU side cannot act.
    Stopped,
    /// Running or runnable (maybe descheduled on a busy host) or sleeping.
    Live,
}

/// Whether the process in `slot` is alive (same pid, same start time, not a zombie) and,
/// if so, whether it is stopped. Reads /proc: for waiters that already waited, not hot paths.
pub fn slot_liveness(state: &State, slot: usize) -> Liveness {
    let s = &state.procs[slot];
    let pid = s.pid.load(Acquire);
    if pid == 0 || pid == RECLAIMING {
        return Liveness::Dead;
    }
    // SAFETY: kill with signal 0 only checks for existence.
    if unsafe { libc::kill(pid as i32, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return Liveness::Dead;
    }
    match proc_stat(pid) {
        Some((st, t)) => {
            let want = s.start_time.load(Acquire);
            if want != 0 && t != want {
                Liveness::Dead
            } else if st == b'T' || st == b't' {
                Liveness::Stopped
            } else {
                Liveness::Live
            }
        }
        None => Liveness::Dead,
    }
}

/// Whether the process in `slot` is still alive (same pid, same start time, not a zombie).
pub fn slot_alive(state: &State, slot: usize) -> bool {
    slot_liveness(state, slot) != Liveness::Dead
}

/// Reclaim the slots of dead processes: their memory returns to the devices, their engine
/// token is released. Each dead slot is reclaimed exactly once.
pub fn reap(state: &State) {
    for i in 0..MAX_PROCS {
        let pid = state.procs[i].pid.load(Acquire);
        if pid == 0 || pid == RECLAIMING || slot_alive(state, i) {
            continue;
        }
        if state.procs[i]
            .pid
            .compare_exchange(pid, RECLAIMING, AcqRel, Relaxed)
            .is_ok()
        {
            release_slot(state, i);
        }
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
    s.start_time.store(0, Relaxed);
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
            reap(self.state);
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

/// Live processes holding memory on `dev`: (pid, bytes).
pub fn processes(state: &State, dev: usize) -> Vec<(u32, u64)> {
    reap(state);
    state
        .procs
        .iter()
        .filter_map(|s| {
            let pid = s.pid.load(Acquire);
            let used = s.used[dev].load(Acquire);
            (pid != 0 && pid != RECLAIMING && used > 0).then_some((pid, used))
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

/// Engine time, ns, the fake has accounted to process `pid` (0: the caller) on physical device
/// `dev`, or `u64::MAX` when this process is not attached or no such process is on the node.
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
    n.state
        .procs
        .iter()
        .find(|p| p.pid.load(Relaxed) == pid)
        .map_or(u64::MAX, |p| p.busy_ns[d].load(Relaxed))
}
