//! Why the monitor said no, as data: a [`Refusal`] carries its reason ([`Why`]) beside the line
//! for the user, so no side matches words of a message.
//!
//! On the wire: `err=<one line>`, `why=<reason>` and `code=<CUresult>` (the status a refused
//! `cuInit` returns; kept for shims that predate `why`). A reply without `why` (an older
//! monitor) is read from its code.

use crate::wire::{BadMessage, Message};
use gpuslice_abi::{CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OPERATING_SYSTEM};
use std::fmt;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// What was asked does not fit or passes a limit (a refused `cuInit` returns
    /// `CUDA_ERROR_INVALID_VALUE`: the process's own settings are at fault).
    Asked,
    /// No slice of that name or index.
    NoSuchSlice,
    /// The asker may not do this: not an operator, not the slice's owner, not admitted.
    Denied,
    /// A request the monitor cannot read: malformed, an unknown operation, a newer version.
    BadRequest,
    /// Anything else: the system, the ledger, a process that is gone.
    Other,
}

impl Why {
    /// Every reason, for the table below and the tests.
    pub const ALL: [Why; 5] = [
        Why::Asked,
        Why::NoSuchSlice,
        Why::Denied,
        Why::BadRequest,
        Why::Other,
    ];

    /// Its word on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Why::Asked => "asked",
            Why::NoSuchSlice => "no-such-slice",
            Why::Denied => "denied",
            Why::BadRequest => "bad-request",
            Why::Other => "other",
        }
    }

    fn from_name(s: &str) -> Option<Why> {
        Why::ALL.into_iter().find(|w| w.name() == s)
    }
}

/// A request refused: why, and one line for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The reason, as data.
    pub why: Why,
    /// One line for the user.
    pub message: String,
}

impl Refusal {
    /// A refusal for reason `why`.
    pub fn new(why: Why, message: impl Into<String>) -> Refusal {
        Refusal {
            why,
            message: message.into(),
        }
    }

    /// A refusal of what was asked ([`Why::Asked`]).
    pub fn asked(message: impl Into<String>) -> Refusal {
        Refusal::new(Why::Asked, message)
    }

    /// A refusal for any other reason ([`Why::Other`]).
    pub fn other(message: impl Into<String>) -> Refusal {
        Refusal::new(Why::Other, message)
    }

    /// A request that could not be read ([`Why::BadRequest`]).
    pub fn bad_request(e: BadMessage) -> Refusal {
        Refusal::new(Why::BadRequest, format!("bad request: {e}"))
    }

    /// The CUDA status a process's `cuInit` returns for it: `CUDA_ERROR_INVALID_VALUE` for
    /// what the process asked, `CUDA_ERROR_OPERATING_SYSTEM` for anything else.
    pub fn code(&self) -> CUresult {
        match self.why {
            Why::Asked => CUDA_ERROR_INVALID_VALUE,
            _ => CUDA_ERROR_OPERATING_SYSTEM,
        }
    }

    /// As a reply.
    pub fn encode(&self) -> Message {
        let mut m = Message::new("err", &self.message);
        m.push("why", self.why.name())
            .push("code", &self.code().to_string());
        m
    }

    /// The refusal a reply carries, if it is one.
    pub fn decode(reply: &Message) -> Option<Refusal> {
        let message = reply.get("err")?.to_string();
        let why = match reply.get("why").and_then(Why::from_name) {
            Some(w) => w,
            None => match reply.get("code").and_then(|c| c.parse::<CUresult>().ok()) {
                Some(CUDA_ERROR_INVALID_VALUE) => Why::Asked,
                _ => Why::Other,
            },
        };
        Some(Refusal { why, message })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_its_reason_on_the_wire() {
        for why in Why::ALL {
            let r = Refusal::new(why, "no");
            let m = Message::decode(&r.encode().encode()).unwrap();
            assert_eq!(Refusal::decode(&m), Some(r));
        }
        // An older monitor's refusal: its code says whether the process asked for too much.
        let mut old = Message::new("err", "does not fit");
        old.push("code", &CUDA_ERROR_INVALID_VALUE.to_string());
        assert_eq!(Refusal::decode(&old).unwrap().why, Why::Asked);
        assert_eq!(
            Refusal::decode(&Message::new("err", "no")).unwrap().code(),
            CUDA_ERROR_OPERATING_SYSTEM
        );
        assert_eq!(Refusal::decode(&Message::new("ok", "1")), None);
    }
}
