//! The operating-system calls of the ledger, in one place: the clock every timestamp uses,
//! the process-shared futex the compute scheduler sleeps on, and the OFD record locks that
//! carry liveness, and the shared mapping of a ledger file or slice region. Nothing here
//! allocates; each call is one syscall.

use core::sync::atomic::AtomicU32;

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

/// One OFD record lock call (`F_OFD_SETLK` / `F_OFD_GETLK`) on the byte at `offset` of `fd`:
/// returns the lock type the kernel reports (for GETLK: `F_UNLCK` when nobody else holds it).
pub(crate) fn ofd_lock(
    fd: libc::c_int,
    cmd: libc::c_int,
    l_type: i16,
    offset: i64,
) -> Result<i16, ()> {
    // SAFETY: flock is plain data; l_pid must be 0 for OFD locks.
    let mut fl: libc::flock = unsafe { core::mem::zeroed() };
    fl.l_type = l_type;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = offset;
    fl.l_len = 1;
    // SAFETY: fd is open; fl is valid for the call.
    if unsafe { libc::fcntl(fd, cmd, &mut fl) } != 0 {
        return Err(());
    }
    Ok(fl.l_type)
}

/// Map the first `len` bytes of `fd` shared, readable, and writable too when `write`; `None`
/// when the kernel refuses (`errno` says why). Using the pointer is the caller's business: it is
/// valid for `len` bytes only as long as the file is at least that long (the ledger and the
/// sealed regions cannot shrink).
pub(crate) fn map_shared(fd: libc::c_int, len: usize, write: bool) -> Option<*mut u8> {
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a new mapping at an address the kernel picks (never over an existing one) of a
    // descriptor the caller holds; the result is checked.
    let p = unsafe { libc::mmap(core::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    (p != libc::MAP_FAILED).then(|| p.cast())
}
