//! The monitor lock: an exclusive `flock` on `monitor.lock` (holding the monitor's pid) by
//! which a second monitor refuses to start, [`monitor_running`] finds the running one without a
//! race, and [`start_background`] starts one for `gpuslice run`. Apart because other commands
//! use it without running a monitor.

use crate::error::Error;
use gpuslice_ledger::dir::{OpenHow, Owner, RuntimeDir};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The lock file's name inside the runtime directory.
pub const LOCK_FILE: &str = "monitor.lock";
/// Where a monitor started by [`start_background`] writes its log, inside the runtime directory.
pub const LOG_FILE: &str = "monitor.log";

/// The pid of the monitor serving the ledger in `dir`, if one is running (as far as the
/// caller can tell: only the directory's owner can open the lock).
pub fn monitor_running(dir: &Path) -> Option<u32> {
    let d = RuntimeDir::open(dir).ok()?;
    if d.owner() == Owner::Root {
        // A node directory seen by a tenant: the lock is root's; ask the monitor itself.
        let pong = gpuslice_protocol::ask(d.fd(), gpuslice_protocol::Ping, Duration::from_secs(2))
            .ok()?
            .ok()?;
        return Some(pong.pid);
    }
    let mut f = File::from(d.open_file(LOCK_FILE, OpenHow::READ).ok()?);
    // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        // Nobody holds it exclusively: no monitor. Our shared lock goes with `f`.
        return None;
    }
    // A monitor holds it; it writes its pid right after locking, so wait a moment for that.
    for _ in 0..50 {
        let mut s = String::new();
        if f.read_to_string(&mut s).is_ok() {
            if let Ok(pid) = s.trim().parse() {
                return Some(pid);
            }
        }
        let _ = std::io::Seek::rewind(&mut f);
        std::thread::sleep(Duration::from_millis(2));
    }
    Some(0)
}

/// The runtime directory, if the caller may run its monitor there (it owns it), else a
/// message saying whose monitor it is.
fn own_dir(dir: &Path) -> Result<RuntimeDir, Error> {
    let d = RuntimeDir::open_or_create(dir)?;
    if d.owner() != Owner::Caller {
        return Err(Error::RootsDir(dir.to_path_buf()));
    }
    Ok(d)
}

/// The held monitor lock; released when the process exits (or this is dropped).
pub struct MonitorLock {
    _file: File,
}

impl MonitorLock {
    /// Take the lock for `dir`, or say which monitor holds it. The lock file is opened
    /// relative to the checked directory, never through a symlink, and must belong to the
    /// directory's owner (the caller): a planted file is refused, never truncated.
    pub fn acquire(dir: &Path) -> Result<MonitorLock, Error> {
        let path = dir.join(LOCK_FILE);
        let d = own_dir(dir)?;
        let how = OpenHow {
            write: true,
            create: Some(0o600),
            exclusive: false,
            append: false,
        };
        let mut f = File::from(d.open_file(LOCK_FILE, how)?);
        // A `monitor_running` probe holds a shared lock for microseconds: retry briefly so a
        // probe never makes a starting monitor believe another one runs.
        let mut tries = 0;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            tries += 1;
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) && tries < 50 {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(Error::AlreadyRunning {
                    dir: dir.to_path_buf(),
                    pid: monitor_running(dir),
                    lock: path,
                });
            }
            return Err(Error::os("lock", Some(path), err));
        }
        f.set_len(0)
            .and_then(|_| writeln!(f, "{}", std::process::id()))
            .map_err(|e| Error::os("write the monitor's pid to", Some(path), e))?;
        Ok(MonitorLock { _file: f })
    }
}

/// Make sure a monitor serves `dir`: return the pid of the running one, or start one in the
/// background (detached, its log in `dir/monitor.log`) and return its pid once it holds the
/// lock. `started` tells whether this call started it. Only in a directory the caller owns.
pub fn start_background(dir: &Path) -> Result<(u32, bool), Error> {
    if let Some(pid) = monitor_running(dir) {
        return Ok((pid, false));
    }
    let d = own_dir(dir)?;
    let exe =
        std::env::current_exe().map_err(|e| Error::os("find the gpuslice binary", None, e))?;
    let log_path = dir.join(LOG_FILE);
    let how = OpenHow {
        write: true,
        create: Some(0o600),
        exclusive: false,
        append: true,
    };
    let log = File::from(d.open_file(LOG_FILE, how)?);
    let log2 = log
        .try_clone()
        .map_err(|e| Error::os("open the monitor log", Some(log_path.clone()), e))?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("monitor")
        .env("GPUSLICE_RUNTIME_DIR", dir)
        // The monitor must see the real driver, never a shim's view of it.
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: the closure runs in the forked child before exec and calls only async-signal-safe
    // functions (setsid, fork, _exit). The double fork detaches the monitor: it is reparented to
    // init, so it never becomes a zombie of the caller, and setsid keeps terminal signals away.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            }
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::os("start", Some(exe.clone()), e))?;
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(pid) = monitor_running(dir) {
            return Ok((pid, true));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(3).collect();
    Err(Error::DidNotStart {
        exe,
        log: log_path,
        tail: tail.into_iter().rev().map(String::from).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_lock_or_log_is_refused_and_never_written() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let d = std::env::temp_dir().join(format!("gpuslice-plant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let rt = d.join("rt");
        std::fs::create_dir_all(&rt).unwrap();
        std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
        let target = d.join("root-only");
        std::fs::write(&target, "secret\n").unwrap();
        symlink(&target, rt.join(LOCK_FILE)).unwrap();
        let e = MonitorLock::acquire(&rt)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(monitor_running(&rt), None);
        std::fs::remove_file(rt.join(LOCK_FILE)).unwrap();
        symlink(&target, rt.join(LOG_FILE)).unwrap();
        let e = start_background(&rt).expect_err("refused").to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret\n");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
