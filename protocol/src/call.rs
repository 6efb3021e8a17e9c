//! A request and its reply, paired by type ([`Call`]), and the calls that carry one over the
//! socket: [`exchange`] and [`ask`] for a client, [`receive`] and [`answer`] for the monitor.

use crate::admit::{AdmitReply, AdmitRequest};
use crate::refusal::{Refusal, Why};
use crate::reply::{Done, Exported, Imported, Left, LetGo, Pong, Released, Reply, Viewed};
use crate::request::{
    Ping, Release, Request, ShareExport, ShareImport, ShareLeave, ShareLetGo, SliceCreate,
    SlicePriority, SliceRemove, SliceSet, View,
};
use crate::socket::{connect, recv, send, ProtocolError};
use crate::wire::BadMessage;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

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
