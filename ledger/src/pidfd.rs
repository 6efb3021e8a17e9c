//! Who connected, bound to the process rather than to its pid number (node mode's admission):
//! a pid read with `SO_PEERCRED` at connect time names whatever process holds that number when
//! the request is read, which a tenant can arrange to be someone else's (issue #27: a child
//! connects and exits, the pid space is cycled until another user's new job holds it). A pidfd
//! refers to one process for its whole life: the kernel gives the connecting process's own
//! (`SO_PEERPIDFD`, Linux 6.5) or, on older kernels, [`PeerProcess::at_accept`] opens one with
//! `pidfd_open` when the connection is accepted and keeps the start time read then. When the
//! request arrives, [`PeerProcess::check`] refuses a process that has exited (zombie included)
//! or whose pid now has another start time.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `SO_PEERPIDFD` (Linux 6.5; not yet in every libc crate).
const SO_PEERPIDFD: libc::c_int = 77;

/// The process on the other end of an accepted unix socket.
#[derive(Debug)]
pub struct PeerProcess {
    /// Its pid in the monitor's namespace (`SO_PEERCRED`).
    pub pid: u32,
    /// Its start time, read at accept (0: it had exited already).
    pub start_time: u64,
    /// A pidfd of the connecting process (`None`: the kernel gave none and it had exited).
    pidfd: Option<OwnedFd>,
    /// Where the pidfd came from, for messages and tests.
    pub source: &'static str,
}

impl PeerProcess {
    /// Bind connection `sock`, whose peer's pid (`SO_PEERCRED`) is `pid`, to that process:
    /// its pidfd from the kernel, or one opened now, and its start time now.
    pub fn at_accept(sock: RawFd, pid: u32) -> PeerProcess {
        match peer_pidfd(sock) {
            Some(fd) => PeerProcess::bound(pid, Some(fd), "SO_PEERPIDFD"),
            None => PeerProcess::opened(pid),
        }
    }

    /// Bind `pid` with a pidfd opened now (`pidfd_open`): the fallback of kernels without
    /// `SO_PEERPIDFD`.
    pub fn opened(pid: u32) -> PeerProcess {
        PeerProcess::bound(pid, pidfd_open(pid), "pidfd_open")
    }

    fn bound(pid: u32, pidfd: Option<OwnedFd>, source: &'static str) -> PeerProcess {
        PeerProcess {
            pid,
            start_time: crate::file::live_start_time_of(&pid.to_string()),
            pidfd,
            source,
        }
    }

    /// Whether the process that connected still runs: its pidfd is not readable (a pidfd
    /// polls readable once its process has exited, zombie or reaped) and its pid still has
    /// the start time it had at accept. `Err` says why not, for the refusal.
    pub fn check(&self) -> Result<(), PeerGone> {
        let gone = || PeerGone { pid: self.pid };
        let Some(fd) = &self.pidfd else {
            return Err(gone());
        };
        if exited(fd.as_raw_fd()) || self.start_time == 0 {
            return Err(gone());
        }
        if crate::file::live_start_time_of(&self.pid.to_string()) != self.start_time {
            return Err(gone());
        }
        Ok(())
    }
}

/// The process that made a connection has exited (whoever holds its pid now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerGone {
    /// The pid it had.
    pub pid: u32,
}

impl std::fmt::Display for PeerGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the process that connected (pid {}) has exited: a request counts only from the \
             process that made the connection",
            self.pid
        )
    }
}

impl std::error::Error for PeerGone {}

/// The peer's pidfd from the kernel (`SO_PEERPIDFD`), where it has it.
fn peer_pidfd(sock: RawFd) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid socket and out-parameters of the option's size.
    let r = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel installed a new descriptor that is ours.
    (r == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_open(pid, 0)` (Linux 5.3), close-on-exec.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: a plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: on success the kernel installed a new descriptor (O_CLOEXEC) that is ours.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the pidfd's process has exited (the pidfd polls readable).
fn exited(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r != 0 // readable, or an error: not a process to trust
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_exits_after_connecting_is_refused() {
        let mut fds = [0; 2];
        // SAFETY: a socketpair into a local array.
        let r =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
        assert_eq!(r, 0);
        // The kernel's pidfd of the peer (this process, on a socketpair), where it has one.
        let me = PeerProcess::at_accept(fds[0], std::process::id());
        assert!(me.check().is_ok(), "{me:?}");
        // The fallback: a child bound by pidfd_open, refused once it has exited (zombie or
        // reaped), even before its pid is reused.
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let p = PeerProcess::opened(child.id());
        assert!(p.check().is_ok(), "{p:?}");
        while !exited(p.pidfd.as_ref().unwrap().as_raw_fd()) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let e = p.check().unwrap_err().to_string();
        assert!(e.contains("has exited"), "a zombie: {e}");
        child.wait().unwrap();
        assert!(p.check().is_err(), "reaped");
        // SAFETY: our descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
