//! The operating-system calls of the compute scheduler, in one place: the clock every
//! timestamp uses and the process-shared futex a waiter sleeps on (the word lives in the
//! ledger's shared memory), and [`Os`], through which the scheduler uses them, so the unit tests
//! inject a simulated clock and CPU (`sim.rs`). Nothing here allocates; each call is one syscall.

use core::sync::atomic::AtomicU32;

/// What the scheduler needs from the operating system: one clock for every process of the
/// node, and a futex in shared memory. [`SYSTEM`] is the real one; the unit tests use a
/// simulated clock and scheduler.
pub trait Os: Sync {
    /// CLOCK_MONOTONIC in ns.
    fn now_ns(&self) -> u64;
    /// Sleep while `word` equals `val`, at most `timeout_ns` (any return means "look again").
    fn futex_wait(&self, word: &AtomicU32, val: u32, timeout_ns: u64);
    /// Wake every sleeper on `word`.
    fn futex_wake(&self, word: &AtomicU32);
}

/// The operating system itself (the functions below).
pub struct SystemOs;

/// The one [`SystemOs`].
pub static SYSTEM: SystemOs = SystemOs;

impl Os for SystemOs {
    fn now_ns(&self) -> u64 {
        now_ns()
    }
    fn futex_wait(&self, word: &AtomicU32, val: u32, timeout_ns: u64) {
        futex_wait(word, val, timeout_ns)
    }
    fn futex_wake(&self, word: &AtomicU32) {
        futex_wake(word)
    }
}

/// CLOCK_MONOTONIC in ns: the clock of every scheduler timestamp (one clock for all processes).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleep on `word` while it equals `val`, for at most `timeout_ns` (a process-shared futex:
/// the word lives in the ledger mapping). Returns on a wake-up, a timeout, a signal, or at
/// once when the word already differs: every return means "look again".
pub fn futex_wait(word: &AtomicU32, val: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word` (valid for the call) and sleeps at
    // most `ts`; EAGAIN, EINTR and ETIMEDOUT are all "look again" for the caller.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

/// Wake every sleeper on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key; it touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}
