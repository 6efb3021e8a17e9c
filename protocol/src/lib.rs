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
//! docs/architecture/dependencies.md), and change the wire format running shims speak. The
//! types are the contract; the codec is two `match`es, fuzzed.

#![deny(missing_docs)]

mod admit;
mod call;
mod refusal;
mod reply;
mod request;
mod socket;
mod wire;

pub use admit::{AdmitReply, AdmitRequest, DeviceRequest, GrantedDevice};
pub use call::{answer, ask, exchange, receive, Answer, Call};
pub use refusal::{Refusal, Why};
pub use reply::{Done, Exported, Imported, Left, LetGo, Pong, Released, Reply, Viewed};
pub use request::{
    Op, Ping, Release, Request, ShareExport, ShareImport, ShareLeave, ShareLetGo, SliceCreate,
    SlicePriority, SliceRemove, SliceSet, View,
};
pub use socket::{connect, peer, recv, send, set_timeouts, unix_addr, ProtocolError};
pub use wire::{
    BadMessage, Message, MAX_FDS, MAX_MESSAGE, MAX_REQUEST_DEVICES, SOCKET_FILE, VERSION,
};
