//! The socket calls under the protocol: one `SOCK_SEQPACKET` message per `sendmsg`, delivered
//! whole or not at all, with descriptors attached (`SCM_RIGHTS`); connecting through the
//! runtime directory's descriptor; who is on the other end (`SO_PEERCRED`).

use crate::wire::{BadMessage, Message, MAX_FDS, MAX_MESSAGE, SOCKET_FILE};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Why a message did not go out or come in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// A socket call failed: what was being done, and the OS error number.
    Socket {
        /// `create`, `connect to`, `write to`, `read from`.
        what: &'static str,
        /// The `errno` of the call.
        errno: i32,
    },
    /// A message or its descriptors over [`MAX_MESSAGE`] / [`MAX_FDS`].
    TooLarge,
    /// A message the kernel had to cut ([`MAX_MESSAGE`], [`MAX_FDS`]).
    Truncated,
    /// A message that is not `key=value` lines of UTF-8.
    NotKeyValue,
    /// A socket path too long for `sockaddr_un`.
    PathTooLong(String),
    /// The monitor closed the connection without a reply.
    NoAnswer,
    /// The monitor's reply is not one to the request asked.
    Unexpected(BadMessage),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Socket { what, errno } => write!(
                f,
                "cannot {what} the node's monitor socket: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            ProtocolError::TooLarge => f.write_str("message too large"),
            ProtocolError::Truncated => f.write_str("a truncated message"),
            ProtocolError::NotKeyValue => f.write_str("a message that is not key=value lines"),
            ProtocolError::PathTooLong(p) => write!(f, "socket path {p:?} is too long"),
            ProtocolError::NoAnswer => {
                f.write_str("the node's monitor closed the connection without answering")
            }
            ProtocolError::Unexpected(e) => {
                write!(f, "the node's monitor answered something unexpected ({e})")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

fn os(what: &'static str) -> ProtocolError {
    ProtocolError::Socket {
        what,
        errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    }
}

/// Send one message with descriptors.
pub fn send(sock: RawFd, m: &Message, fds: &[RawFd]) -> Result<(), ProtocolError> {
    let data = m.encode();
    if data.len() > MAX_MESSAGE || fds.len() > MAX_FDS {
        return Err(ProtocolError::TooLarge);
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of_val(fds) as u32) } as usize;
    let mut cbuf = vec![0u8; space.max(1)];
    // SAFETY: plain data.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` bytes, enough for one header and the fds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size_of_val(fds) as u32) as _;
            core::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: msg and its buffers are valid for the call.
    if unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(os("write to"));
    }
    Ok(())
}

/// Receive one message and the descriptors that came with it (`None` at end of stream).
/// A truncated message or truncated descriptor list is an error, never half-used.
pub fn recv(sock: RawFd) -> Result<Option<(Message, Vec<OwnedFd>)>, ProtocolError> {
    let mut data = vec![0u8; MAX_MESSAGE];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: plain data.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: buffers valid for the call; MSG_CMSG_CLOEXEC so received fds never leak to exec.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(os("read from"));
    }
    let mut fds = vec![];
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(ProtocolError::Truncated);
    }
    let m = Message::decode(&data[..n as usize]).ok_or(ProtocolError::NotKeyValue)?;
    Ok(Some((m, fds)))
}

/// Set both timeouts of a socket.
pub fn set_timeouts(sock: RawFd, t: Duration) {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: valid socket and option value.
        unsafe {
            libc::setsockopt(
                sock,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as u32,
            )
        };
    }
}

/// Connect to the monitor socket of the runtime directory held open as `dirfd` (through
/// `/proc/self/fd`, so the checked directory is the one used, whatever its path does since).
pub fn connect(dirfd: RawFd, timeout: Duration) -> Result<OwnedFd, ProtocolError> {
    // SAFETY: constants.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(os("create"));
    }
    // SAFETY: just created, ours.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    set_timeouts(s.as_raw_fd(), timeout);
    let path = format!("/proc/self/fd/{dirfd}/{SOCKET_FILE}");
    let addr = unix_addr(&path)?;
    // SAFETY: valid socket and address.
    if unsafe {
        libc::connect(
            s.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            size_of::<libc::sockaddr_un>() as u32,
        )
    } != 0
    {
        return Err(os("connect to"));
    }
    Ok(s)
}

/// A `sockaddr_un` for `path`.
pub fn unix_addr(path: &str) -> Result<libc::sockaddr_un, ProtocolError> {
    // SAFETY: plain data.
    let mut a: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= a.sun_path.len() {
        return Err(ProtocolError::PathTooLong(path.into()));
    }
    for (d, b) in a.sun_path.iter_mut().zip(path.bytes()) {
        *d = b as libc::c_char;
    }
    Ok(a)
}

/// Who is on the other end of a connected unix socket (`SO_PEERCRED`): pid (in our PID
/// namespace), uid, gid.
pub fn peer(sock: RawFd) -> Option<(u32, u32, u32)> {
    // SAFETY: plain data.
    let mut c: libc::ucred = unsafe { core::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket and out-parameters.
    let r = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some((c.pid as u32, c.uid, c.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_travel_with_a_message() {
        let mut sv = [0; 2];
        // SAFETY: `sv` is a valid out-parameter for two fds.
        let rc =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // A pipe's write end goes; what is written through the received copy comes out of the
        // read end kept here, so the descriptor is the same open file.
        let mut pipe = [0; 2];
        // SAFETY: `pipe` is a valid out-parameter for two fds.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        send(sv[0], &Message::new("op", "x"), &[pipe[1]]).unwrap();
        let (m, fds) = recv(sv[1]).unwrap().unwrap();
        assert_eq!(m.get("op"), Some("x"));
        assert_eq!(fds.len(), 1);
        let mut sent = std::fs::File::from(fds.into_iter().next().unwrap());
        std::io::Write::write_all(&mut sent, b"same file").unwrap();
        drop(sent);
        // SAFETY: our fds; the read end becomes a File that closes it.
        let mut read = unsafe {
            libc::close(pipe[1]);
            std::fs::File::from_raw_fd(pipe[0])
        };
        let mut got = String::new();
        std::io::Read::read_to_string(&mut read, &mut got).unwrap();
        assert_eq!(got, "same file");
        let (pid, uid, _) = peer(sv[1]).unwrap();
        assert_eq!(pid, std::process::id());
        // SAFETY: geteuid cannot fail.
        assert_eq!(uid, unsafe { libc::geteuid() });
        // SAFETY: our fds.
        unsafe {
            libc::close(sv[0]);
            libc::close(sv[1]);
        }
    }
}
