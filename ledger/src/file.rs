//! Opening, creating and mapping the ledger file, and the cold-path lock inside it.
//!
//! Creation without races: the first user builds the complete file under a private temporary
//! name, then `link()`s it to `ledger`; `link` fails with `EEXIST` when someone else won, and
//! then we use theirs. So a file under the final name is always fully initialised.
//!
//! The cold-path lock is a process-shared robust pthread mutex in the header. A holder that
//! dies hands the next locker `EOWNERDEAD`; we then mark it consistent and rebuild every
//! derived sum (see `Ledger::rebuild_derived`), so a death at any instruction of a cold path
//! leaves nothing inconsistent. Locking times out instead of hanging.

use crate::dir::{OpenHow, RuntimeDir};
use crate::error::LedgerError;
use crate::layout::*;
use std::os::fd::IntoRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `lock()` waits for the cold-path mutex while nobody makes progress with it (a
/// holder stopped or stuck); a lock that keeps changing hands is waited for.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The ledger file's name in the runtime directory.
pub const LEDGER_FILE: &str = "ledger";

/// A mapped ledger file.
pub(crate) struct Mapping {
    pub fd: libc::c_int,
    pub base: *mut u8,
    pub path: PathBuf,
    /// Mapped read-write (false: read-only, and nothing may write through `base`).
    pub writable: bool,
}

// SAFETY: the mapping is shared memory accessed only through atomics and the robust mutex; the
// raw pointer is valid for the life of the Mapping and may be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping we made; fd is ours. Closing the fd drops this
        // process's liveness lock, which is what leaving means.
        unsafe {
            libc::munmap(self.base.cast(), FILE_SIZE);
            libc::close(self.fd);
        }
    }
}

/// In a child made by `fork()` (from a `pthread_atfork` child handler): let go of `m` without
/// touching the file, so that the child does not keep the parent's liveness lock (or anything
/// else of the ledger) alive. An OFD lock lives as long as its open file description, which the
/// child inherited twice: through the descriptor and through the shared mapping. The mapping is
/// replaced, at the same address, by a private copy (what the child's code still reads stays
/// readable, and nothing it writes reaches the node), and the descriptor is pointed at
/// `/dev/null` (its number stays taken, so no later `open` in the child reuses it for a file a
/// stray `fcntl` could lock). Only async-signal-safe calls: `mmap`, `mremap`, `open`, `dup3`,
/// `close`, and a byte copy.
pub(crate) fn forget_after_fork(m: &Mapping) {
    // SAFETY: `m.base` is our mapping of FILE_SIZE bytes; `tmp` is a fresh private mapping of
    // the same size. mremap moves `tmp` over `m.base` atomically (MREMAP_FIXED unmaps what was
    // there), so the range stays mapped throughout. The descriptor calls act on our own fd.
    unsafe {
        let tmp = libc::mmap(
            core::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if tmp != libc::MAP_FAILED {
            core::ptr::copy_nonoverlapping(m.base.cast_const(), tmp.cast::<u8>(), FILE_SIZE);
            let moved = libc::mremap(
                tmp,
                FILE_SIZE,
                FILE_SIZE,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                m.base.cast::<libc::c_void>(),
            );
            if moved == libc::MAP_FAILED {
                libc::munmap(tmp, FILE_SIZE);
            }
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup3(null, m.fd, libc::O_CLOEXEC);
            libc::close(null);
        } else {
            libc::close(m.fd);
        }
    }
}

fn io(what: &str, path: &Path) -> LedgerError {
    LedgerError::Io {
        what: what.into(),
        path: path.into(),
        source: std::io::Error::last_os_error(),
    }
}

/// Open the existing ledger in `dir` (read-write, or read-only when `write` is false).
pub(crate) fn open(dir: &RuntimeDir, write: bool) -> Result<Mapping, LedgerError> {
    let how = if write { OpenHow::WRITE } else { OpenHow::READ };
    let fd = dir.open_file(LEDGER_FILE, how)?;
    map_existing(fd.into_raw_fd(), dir.path().join(LEDGER_FILE), write)
}

/// Open the existing ledger in `path` read-only (`O_RDONLY`, `PROT_READ`), with the same
/// directory and file checks as [`open`]; nothing is created or written (`view.rs`).
pub(crate) fn open_read_only(path: &Path) -> Result<Mapping, LedgerError> {
    let dir = RuntimeDir::open(path)?;
    open(&dir, false)
}

/// Open the ledger in `dir`, creating the file if needed (only in a directory of the caller's)
/// with permissions `perm` and header mode `mode`.
pub(crate) fn open_or_create(
    dir: &RuntimeDir,
    perm: u32,
    mode: u32,
) -> Result<Mapping, LedgerError> {
    for _ in 0..5 {
        match open(dir, true) {
            Err(LedgerError::NotFound(_)) => {}
            other => return other,
        }
        if let Some(m) = create(dir, perm, mode)? {
            return Ok(m);
        }
    }
    open(dir, true)
}

/// Build a complete ledger under a temporary name and link it into place. `None` when someone
/// else's ledger appeared first.
fn create(dir: &RuntimeDir, perm: u32, mode: u32) -> Result<Option<Mapping>, LedgerError> {
    let final_path = dir.path().join(LEDGER_FILE);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp_name = format!(".ledger.{}.{nanos}.tmp", std::process::id());
    let tmp = dir.path().join(&tmp_name);
    // O_EXCL makes the temporary ours alone; 0600: only the directory's owner (the one user of
    // a personal ledger) ever opens it.
    let fd = dir
        .open_file(
            &tmp_name,
            OpenHow {
                write: true,
                create: Some(0o600),
                exclusive: true,
                append: false,
            },
        )?
        .into_raw_fd();
    let cleanup = |fd| {
        let _ = dir.unlink(&tmp_name);
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
    };
    // SAFETY: fd is ours. fchmod: the umask must not decide who may read a node policy.
    if unsafe { libc::fchmod(fd, perm as libc::mode_t) } != 0
        // SAFETY: fd is ours, open for writing.
        || unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0
    {
        let e = io("size", &tmp);
        cleanup(fd);
        return Err(e);
    }
    let base = match map(fd, &tmp, true) {
        Ok(b) => b,
        Err(e) => {
            cleanup(fd);
            return Err(e);
        }
    };
    // SAFETY: the mapping is FILE_SIZE bytes, zero-filled, private to us until linked.
    unsafe { init_header(base, mode) }?;
    let linked = dir.link(&tmp_name, LEDGER_FILE);
    // The temporary name is no longer needed either way.
    let _ = dir.unlink(&tmp_name);
    match linked {
        Ok(()) => Ok(Some(Mapping {
            fd,
            base,
            path: final_path,
            writable: true,
        })),
        Err(link_err) => {
            // SAFETY: our mapping and fd.
            unsafe {
                libc::munmap(base.cast(), FILE_SIZE);
                libc::close(fd);
            }
            if link_err.raw_os_error() == Some(libc::EEXIST) {
                return Ok(None);
            }
            Err(LedgerError::Io {
                what: "link".into(),
                path: final_path,
                source: link_err,
            })
        }
    }
}

fn map(fd: libc::c_int, path: &Path, write: bool) -> Result<*mut u8, LedgerError> {
    crate::sys::map_shared(fd, FILE_SIZE, write).ok_or_else(|| io("map", path))
}

/// SAFETY: `base` must be a fresh, zeroed, writable mapping of FILE_SIZE bytes nobody else sees.
unsafe fn init_header(base: *mut u8, mode: u32) -> Result<(), LedgerError> {
    let h = base.cast::<Header>();
    // SAFETY: by the contract `h` points at a writable, page-aligned Header (FILE_SIZE covers
    // it) that no other thread or process sees yet, so plain writes cannot race.
    unsafe {
        (*h).magic = MAGIC;
        (*h).layout_version = LAYOUT_VERSION;
        (*h).header_size = core::mem::size_of::<Header>() as u32;
        (*h).device_size = core::mem::size_of::<Device>() as u32;
        (*h).slice_size = core::mem::size_of::<Slice>() as u32;
        (*h).proc_size = core::mem::size_of::<Proc>() as u32;
        (*h).max_devices = MAX_DEVICES as u32;
        (*h).max_slices = MAX_SLICES as u32;
        (*h).max_procs = MAX_PROCS as u32;
        (*h).total_size = FILE_SIZE as u64;
        (*h).mode.store(mode, core::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: pthread_mutexattr_t is a plain C struct; all-zero is a valid value to pass to
    // pthread_mutexattr_init, which is what happens next.
    let mut attr: libc::pthread_mutexattr_t = unsafe { core::mem::zeroed() };
    // SAFETY: `attr` is a live local, initialised by the first call and set by the others.
    unsafe {
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
    }
    // SAFETY: the mutex lies in the unshared Header of the contract, not yet initialised, so
    // nobody can be using it; `attr` was initialised just above.
    let rc = unsafe { libc::pthread_mutex_init((*h).mutex.0.get(), &attr) };
    // SAFETY: `attr` was initialised above and is not used after this.
    unsafe { libc::pthread_mutexattr_destroy(&mut attr) };
    if rc != 0 {
        return Err(LedgerError::Io {
            what: "initialise the lock of".into(),
            path: PathBuf::from("(new ledger)"),
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    // SAFETY: `h` is the Header of the contract; `ready` is an atomic, published last so
    // readers see the fields above.
    let ready = unsafe { &(*h).ready };
    ready.store(READY, core::sync::atomic::Ordering::Release);
    Ok(())
}

fn map_existing(fd: libc::c_int, path: PathBuf, write: bool) -> Result<Mapping, LedgerError> {
    let fail = |e: LedgerError| {
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        Err(e)
    };
    // SAFETY: fd valid; st is plain data.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return fail(io("stat", &path));
    }
    if (st.st_size as u64) < core::mem::size_of::<Header>() as u64 {
        return fail(LedgerError::Incompatible {
            path,
            detail: format!("file of {} bytes, too small", st.st_size),
        });
    }
    // Read and check the header before mapping the whole size.
    let mut raw = [0u8; 48];
    // SAFETY: reading into our buffer.
    if unsafe { libc::pread(fd, raw.as_mut_ptr().cast(), raw.len(), 0) } != raw.len() as isize {
        return fail(io("read", &path));
    }
    let u32_at = |o: usize| u32::from_ne_bytes(raw[o..o + 4].try_into().unwrap());
    if raw[..8] != MAGIC {
        return fail(LedgerError::Incompatible {
            path,
            detail: "bad magic: not a gpuslice ledger".into(),
        });
    }
    let expect = [
        ("layout version", u32_at(8), LAYOUT_VERSION),
        (
            "header size",
            u32_at(12),
            core::mem::size_of::<Header>() as u32,
        ),
        (
            "device record size",
            u32_at(16),
            core::mem::size_of::<Device>() as u32,
        ),
        (
            "slice record size",
            u32_at(20),
            core::mem::size_of::<Slice>() as u32,
        ),
        (
            "process record size",
            u32_at(24),
            core::mem::size_of::<Proc>() as u32,
        ),
        ("device count", u32_at(28), MAX_DEVICES as u32),
        ("slice count", u32_at(32), MAX_SLICES as u32),
        ("process count", u32_at(36), MAX_PROCS as u32),
    ];
    for (what, got, want) in expect {
        if got != want {
            return fail(LedgerError::Incompatible {
                path,
                detail: format!("{what} {got}, this gpuslice expects {want}"),
            });
        }
    }
    if st.st_size as u64 != FILE_SIZE as u64 {
        return fail(LedgerError::Incompatible {
            path,
            detail: format!("file of {} bytes, expected {FILE_SIZE}", st.st_size),
        });
    }
    let base = match map(fd, &path, write) {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let m = Mapping {
        fd,
        base,
        path,
        writable: write,
    };
    // SAFETY: mapped FILE_SIZE ≥ size_of::<Header>() bytes.
    let h = unsafe { &*m.base.cast::<Header>() };
    if h.ready.load(core::sync::atomic::Ordering::Acquire) != READY {
        return Err(LedgerError::NotReady(m.path.clone()));
    }
    Ok(m)
}

/// Outcome of taking the lock: whether the previous holder died holding it.
pub(crate) enum Locked {
    Clean,
    OwnerDied,
}

/// Take the header's robust mutex, with a timeout.
pub(crate) fn lock(h: &Header, path: &Path) -> Result<Locked, LedgerError> {
    // Wait in short slices and give up only when the lock made no progress for LOCK_TIMEOUT:
    // every unlock bumps `generation`, so many processes queueing behind each other (512
    // starting at once on a busy machine) never time out, while a holder that is stopped or
    // stuck delays the others by LOCK_TIMEOUT at most.
    let mut seen = h.generation.load(core::sync::atomic::Ordering::Acquire);
    let mut quiet_since = std::time::Instant::now();
    let rc = loop {
        let mut ts: libc::timespec = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid out-parameter.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        ts.tv_nsec += 250_000_000;
        if ts.tv_nsec >= 1_000_000_000 {
            ts.tv_sec += 1;
            ts.tv_nsec -= 1_000_000_000;
        }
        // SAFETY: the mutex was initialised by the creator (checked via `ready`) and lives in
        // the shared mapping for as long as `h` is borrowed.
        let rc = unsafe { libc::pthread_mutex_timedlock(h.mutex.0.get(), &ts) };
        if rc != libc::ETIMEDOUT {
            break rc;
        }
        let now = h.generation.load(core::sync::atomic::Ordering::Acquire);
        if now != seen {
            seen = now;
            quiet_since = std::time::Instant::now();
        } else if quiet_since.elapsed() >= LOCK_TIMEOUT {
            break libc::ETIMEDOUT;
        }
    };
    let me = std::process::id();
    match rc {
        0 => {
            // SeqCst: a lock-free snapshot sees the holder before any change it makes.
            h.lock_holder
                .store(me, core::sync::atomic::Ordering::SeqCst);
            Ok(Locked::Clean)
        }
        libc::EOWNERDEAD => {
            // SAFETY: we hold the mutex (EOWNERDEAD grants it).
            unsafe { libc::pthread_mutex_consistent(h.mutex.0.get()) };
            h.mutex_recoveries
                .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            h.lock_holder
                .store(me, core::sync::atomic::Ordering::SeqCst);
            Ok(Locked::OwnerDied)
        }
        libc::ETIMEDOUT => Err(LedgerError::LockTimeout {
            path: path.into(),
            waited_ms: LOCK_TIMEOUT.as_millis() as u64,
            holder: h.lock_holder.load(core::sync::atomic::Ordering::Relaxed),
        }),
        e => Err(LedgerError::Io {
            what: "lock".into(),
            path: path.into(),
            source: std::io::Error::from_raw_os_error(e),
        }),
    }
}

/// Release the header's mutex.
pub(crate) fn unlock(h: &Header) {
    h.lock_holder.store(0, core::sync::atomic::Ordering::SeqCst);
    // SAFETY: called only by the holder (LockGuard's drop).
    unsafe { libc::pthread_mutex_unlock(h.mutex.0.get()) };
}

/// Liveness: take the OFD write lock on `slot`'s byte. OFD locks belong to the open file
/// description, so the kernel drops them when the process dies, whatever its PID namespace.
pub(crate) fn take_liveness(fd: libc::c_int, slot: usize) -> bool {
    ofd(fd, libc::F_OFD_SETLK, libc::F_WRLCK as i16, slot)
        .map(|_| true)
        .unwrap_or(false)
}

/// Release our liveness lock on `slot`.
pub(crate) fn drop_liveness(fd: libc::c_int, slot: usize) {
    let _ = ofd(fd, libc::F_OFD_SETLK, libc::F_UNLCK as i16, slot);
}

/// Whether some other open file description holds `slot`'s liveness lock.
pub(crate) fn is_alive(fd: libc::c_int, slot: usize) -> bool {
    match ofd(fd, libc::F_OFD_GETLK, libc::F_WRLCK as i16, slot) {
        Ok(l_type) => l_type != libc::F_UNLCK as i16,
        Err(_) => true, // cannot tell: never reap on doubt
    }
}

fn ofd(fd: libc::c_int, cmd: libc::c_int, l_type: i16, slot: usize) -> Result<i16, ()> {
    crate::sys::ofd_lock(fd, cmd, l_type, LIVENESS_LOCK_BASE + slot as i64)
}

/// Field 22 of `/proc/self/stat`: the start time of this process in clock ticks since boot.
pub fn own_start_time() -> u64 {
    start_time_of("self")
}

/// Start time of a pid (as this process's PID namespace sees it); 0 when unknown.
pub fn start_time_of(pid: &str) -> u64 {
    stat_of(pid).map_or(0, |(_, start)| start)
}

/// Start time of a pid that has not exited; 0 when unknown, gone, or exited and not yet waited
/// for (a zombie, state `Z`, or `X`): a zombie has released its memory and descriptors, so its
/// record must be reaped at once, as a personal ledger's OFD lock is dropped at exit.
pub fn live_start_time_of(pid: &str) -> u64 {
    match stat_of(pid) {
        Some((b'Z' | b'X' | b'x', _)) | None => 0,
        Some((_, start)) => start,
    }
}

/// Whether the process `pid` (this namespace's) with start time `start_time` is still running
/// (not exited, not a zombie, not another process that took its pid since).
pub fn is_running(pid: u32, start_time: u64) -> bool {
    start_time != 0 && live_start_time_of(&pid.to_string()) == start_time
}

/// State (field 3) and start time (field 22) of `/proc/<pid>/stat`.
fn stat_of(pid: &str) -> Option<(u8, u64)> {
    crate::procfs::stat(pid).map(|s| (s.state, s.start_time))
}
