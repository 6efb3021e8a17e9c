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

use crate::error::LedgerError;
use crate::layout::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `lock()` waits for the cold-path mutex.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// A mapped ledger file.
pub(crate) struct Mapping {
    pub fd: libc::c_int,
    pub base: *mut u8,
    pub path: PathBuf,
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

fn io(what: &str, path: &Path) -> LedgerError {
    LedgerError::Io {
        what: what.into(),
        path: path.into(),
        source: std::io::Error::last_os_error(),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_else(|_| CString::new("/nonexistent").unwrap())
}

/// Open the existing ledger in `dir`.
pub(crate) fn open(dir: &Path) -> Result<Mapping, LedgerError> {
    let path = dir.join("ledger");
    let c = cpath(&path);
    // SAFETY: c is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
            return Err(LedgerError::NotFound(path));
        }
        return Err(io("open", &path));
    }
    map_existing(fd, path)
}

/// Open the ledger in `dir`, creating the directory and the file if needed.
pub(crate) fn open_or_create(dir: &Path) -> Result<Mapping, LedgerError> {
    ensure_dir(dir)?;
    for _ in 0..5 {
        match open(dir) {
            Err(LedgerError::NotFound(_)) => {}
            other => return other,
        }
        if let Some(m) = create(dir)? {
            return Ok(m);
        }
    }
    open(dir)
}

fn ensure_dir(dir: &Path) -> Result<(), LedgerError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let c = cpath(dir);
    // SAFETY: valid path.
    if unsafe { libc::mkdir(c.as_ptr(), 0o1777) } == 0 {
        // The umask narrowed it; every user and container on the node must reach the ledger.
        // SAFETY: valid path.
        unsafe { libc::chmod(c.as_ptr(), 0o1777) };
        return Ok(());
    }
    if dir.is_dir() {
        return Ok(()); // created by someone else meanwhile
    }
    Err(io("create directory", dir))
}

/// Build a complete ledger under a temporary name and link it into place. `None` when someone
/// else's ledger appeared first.
fn create(dir: &Path) -> Result<Option<Mapping>, LedgerError> {
    let final_path = dir.join("ledger");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".ledger.{}.{nanos}.tmp", std::process::id()));
    let ct = cpath(&tmp);
    // SAFETY: valid path; O_EXCL makes the temporary ours alone.
    let fd = unsafe {
        libc::open(
            ct.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        return Err(io("create", &tmp));
    }
    let cleanup = |fd| {
        // SAFETY: our temporary and our fd.
        unsafe {
            libc::unlink(ct.as_ptr());
            libc::close(fd);
        }
    };
    // SAFETY: fd is ours. fchmod undoes the umask: other users and containers share the file.
    if unsafe { libc::fchmod(fd, 0o666) } != 0
        || unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0
    {
        let e = io("size", &tmp);
        cleanup(fd);
        return Err(e);
    }
    let base = match map(fd, &tmp) {
        Ok(b) => b,
        Err(e) => {
            cleanup(fd);
            return Err(e);
        }
    };
    // SAFETY: the mapping is FILE_SIZE bytes, zero-filled, private to us until linked.
    unsafe { init_header(base) }?;
    let cf = cpath(&final_path);
    // SAFETY: valid paths.
    let linked = unsafe { libc::link(ct.as_ptr(), cf.as_ptr()) };
    let link_err = std::io::Error::last_os_error();
    // SAFETY: the temporary name is no longer needed either way.
    unsafe { libc::unlink(ct.as_ptr()) };
    if linked == 0 {
        return Ok(Some(Mapping {
            fd,
            base,
            path: final_path,
        }));
    }
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

fn map(fd: libc::c_int, path: &Path) -> Result<*mut u8, LedgerError> {
    // SAFETY: fd is open read-write; the result is checked.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io("map", path));
    }
    Ok(p.cast())
}

/// SAFETY: `base` must be a fresh, zeroed, writable mapping of FILE_SIZE bytes nobody else sees.
unsafe fn init_header(base: *mut u8) -> Result<(), LedgerError> {
    let h = base.cast::<Header>();
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
    let mut attr: libc::pthread_mutexattr_t = core::mem::zeroed();
    libc::pthread_mutexattr_init(&mut attr);
    libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
    libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
    let rc = libc::pthread_mutex_init((*h).mutex.0.get(), &attr);
    libc::pthread_mutexattr_destroy(&mut attr);
    if rc != 0 {
        return Err(LedgerError::Io {
            what: "initialise the lock of".into(),
            path: PathBuf::from("(new ledger)"),
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    (*h).ready
        .store(READY, core::sync::atomic::Ordering::Release);
    Ok(())
}

fn map_existing(fd: libc::c_int, path: PathBuf) -> Result<Mapping, LedgerError> {
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
    let base = match map(fd, &path) {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let m = Mapping { fd, base, path };
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
    let mut ts: libc::timespec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec += LOCK_TIMEOUT.as_secs() as libc::time_t;
    // SAFETY: the mutex was initialised by the creator (checked via `ready`) and lives in the
    // shared mapping for as long as `h` is borrowed.
    let rc = unsafe { libc::pthread_mutex_timedlock(h.mutex.0.get(), &ts) };
    match rc {
        0 => Ok(Locked::Clean),
        libc::EOWNERDEAD => {
            // SAFETY: we hold the mutex (EOWNERDEAD grants it).
            unsafe { libc::pthread_mutex_consistent(h.mutex.0.get()) };
            h.mutex_recoveries
                .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            Ok(Locked::OwnerDied)
        }
        libc::ETIMEDOUT => Err(LedgerError::LockTimeout {
            path: path.into(),
            waited_ms: LOCK_TIMEOUT.as_millis() as u64,
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
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name (field 2) may hold spaces and parentheses: fields count from the last ')'.
    let Some(rest) = s.rfind(')').map(|i| &s[i + 1..]) else {
        return 0;
    };
    rest.split_whitespace()
        .nth(19)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}
