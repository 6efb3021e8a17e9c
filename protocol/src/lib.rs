//! gpuslice's node mode on the wire: every message on `monitor.sock`, typed, and the socket
//! calls that carry them. The shim, the operator CLI, the DRA plugin and the monitor all speak
//! it through these types; none builds or reads a message by hand.
//!
//! - [`Request`]: every request, one type each ([`AdmitRequest`] at `cuInit`, [`Release`] and
//!   the `Share*` requests of an admitted process, the `Slice*` operator requests, [`View`],
//!   [`Ping`]); [`Request::decode`] refuses an unknown op, a newer [`VERSION`] or a malformed
//!   field ([`BadMessage`]), which the monitor answers as a [`Refusal`] of
//!   [`Why::BadRequest`].
//! - [`Reply`]: every answer, read as the answer to the request's [`Op`]; [`Refusal`] is the
//!   answer "no", its reason ([`Why`]) as data.
//! - [`Call`] pairs each request type with its reply type, so a client gets the reply it
//!   asked for ([`ask`], [`exchange`]) or an error, never another request's reply.
//!
//! The socket is `SOCK_SEQPACKET`: one `sendmsg` is one message of at most [`MAX_MESSAGE`]
//! bytes, delivered whole or not at all, with at most [`MAX_FDS`] descriptors attached. A
//! message is UTF-8 text, one `key=value` per line ([`Message`]; values never hold a newline),
//! so a hostile message can only fail to parse, and `tests/fuzz.rs` checks that it does.
//!
//! Why a hand-written codec and not serde: the shim links this crate into every CUDA process
//! and needs nothing from crates.io but `libc`; `serde_json` would add about 150 KB of code to
//! `libgpuslice.so` for a dozen flat messages (the typed codec adds 14 KB; measured in
//! docs/architecture.md, "Dependencies"), and change the wire format running shims speak. The
//! types are the contract; the codec is two `match`es, fuzzed.

#![deny(missing_docs)]

mod admit;
mod refusal;
mod reply;
mod request;
mod socket;
mod wire;

pub use admit::{AdmitReply, AdmitRequest, DeviceRequest, GrantedDevice};
pub use refusal::{Refusal, Why};
pub use reply::{Done, Exported, Imported, Left, LetGo, Pong, Released, Reply, Viewed};
pub use request::{
    Op, Ping, Release, Request, ShareExport, ShareImport, ShareLeave, ShareLetGo, SliceCreate,
    SlicePriority, SliceRemove, SliceSet, View, VERSION,
};
pub use socket::{connect, peer, recv, send, set_timeouts, unix_addr};
pub use wire::{BadMessage, Message};

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
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

/// The socket's name in the runtime directory.
pub const SOCKET_FILE: &str = "monitor.sock";
/// Largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most descriptors one reply carries (one region per device, plus room).
pub const MAX_FDS: usize = 32;
/// Most devices one admission request may name (the monitor holds it to its own, smaller,
/// table).
pub const MAX_REQUEST_DEVICES: usize = 64;

/// A request type and the type of its reply.
pub trait Call: Into<Request> {
    /// What the monitor answers it with.
    type Reply;
    /// `r` as this request's reply (`None`: another's; [`Reply::decode`] never gives one).
    fn reply(r: Reply) -> Option<Self::Reply>;
}

macro_rules! calls {
    ($($request:ty => $req_variant:ident, $reply:ty => $reply_variant:ident;)*) => {$(
        impl From<$request> for Request {
            fn from(r: $request) -> Request {
                Request::$req_variant(r)
            }
        }
        impl Call for $request {
            type Reply = $reply;
            fn reply(r: Reply) -> Option<$reply> {
                match r {
                    Reply::$reply_variant(x) => Some(x),
                    _ => None,
                }
            }
        }
    )*};
}

calls! {
    Ping => Ping, Pong => Pong;
    AdmitRequest => Admit, AdmitReply => Admitted;
    View => View, Viewed => Viewed;
    Release => Release, Released => Released;
    ShareExport => ShareExport, Exported => Exported;
    ShareImport => ShareImport, Imported => Imported;
    ShareLeave => ShareLeave, Left => Left;
    ShareLetGo => ShareLetGo, LetGo => LetGo;
    SliceCreate => SliceCreate, Done => Done;
    SliceRemove => SliceRemove, Done => Done;
    SliceSet => SliceSet, Done => Done;
    SlicePriority => SlicePriority, Done => Done;
}

macro_rules! replies {
    ($($reply:ty => $variant:ident,)*) => {$(
        impl From<$reply> for Reply {
            fn from(r: $reply) -> Reply {
                Reply::$variant(r)
            }
        }
    )*};
}

replies! {
    Pong => Pong,
    AdmitReply => Admitted,
    Viewed => Viewed,
    Released => Released,
    Exported => Exported,
    Imported => Imported,
    Left => Left,
    LetGo => LetGo,
    Done => Done,
}

/// What the monitor said to one request: its reply, or its refusal.
pub type Answer<T> = Result<T, Refusal>;

/// One request `req` with descriptors `fds` (`SCM_RIGHTS`) to the monitor of the runtime
/// directory held open as `dirfd`, over a new connection: its answer, and the descriptors that
/// came with it; `Err` when the monitor could not be asked or answered something else.
pub fn exchange<C: Call>(
    dirfd: RawFd,
    req: C,
    fds: &[RawFd],
    timeout: Duration,
) -> Result<(Answer<C::Reply>, Vec<OwnedFd>), ProtocolError> {
    let req: Request = req.into();
    let op = req.op();
    let s = connect(dirfd, timeout)?;
    send(s.as_raw_fd(), &req.encode(), fds)?;
    let (m, got) = recv(s.as_raw_fd())?.ok_or(ProtocolError::NoAnswer)?;
    let answer = match Reply::decode(op, &m).map_err(ProtocolError::Unexpected)? {
        Ok(r) => Ok(C::reply(r).ok_or(ProtocolError::Unexpected(BadMessage::Field("ok")))?),
        Err(refusal) => Err(refusal),
    };
    Ok((answer, got))
}

/// One request without descriptors either way: [`exchange`]'s answer.
pub fn ask<C: Call>(
    dirfd: RawFd,
    req: C,
    timeout: Duration,
) -> Result<Answer<C::Reply>, ProtocolError> {
    exchange(dirfd, req, &[], timeout).map(|(a, _)| a)
}

/// The monitor's side of one connection: the request read from `sock` with its descriptors
/// (`Err`: a refusal to send back, the request unreadable), `None` at end of stream.
#[allow(clippy::type_complexity)]
pub fn receive(sock: RawFd) -> Option<(Result<Request, Refusal>, Vec<OwnedFd>)> {
    match recv(sock) {
        Ok(Some((m, fds))) => Some((Request::decode(&m).map_err(Refusal::bad_request), fds)),
        Ok(None) => None,
        Err(e @ (ProtocolError::NotKeyValue | ProtocolError::Truncated)) => Some((
            Err(Refusal::new(Why::BadRequest, format!("bad request: {e}"))),
            vec![],
        )),
        Err(_) => None,
    }
}

/// The monitor's answer on `sock`: the reply with its descriptors, or the refusal.
pub fn answer(sock: RawFd, a: &Answer<(Reply, Vec<OwnedFd>)>) -> Result<(), ProtocolError> {
    match a {
        Ok((r, fds)) => {
            let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
            send(sock, &r.encode(), &raw)
        }
        Err(refusal) => send(sock, &refusal.encode(), &[]),
    }
}
