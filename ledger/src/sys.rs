//! The operating-system calls of the ledger, in one place: the OFD record locks that carry
//! liveness, and the shared mapping of a ledger file or slice region (the clock and the futex
//! are the scheduler's, `gpuslice_sched`). Nothing here allocates; each call is one syscall.

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
