//! The framing under every message: UTF-8 text, one `key=value` per line, keys in a fixed
//! order per message, a key repeated for a list (`dev`). Only this crate builds or reads it:
//! callers speak `Request` and `Reply`.

use std::fmt;
use std::str::FromStr;

/// The socket's name in the runtime directory.
pub const SOCKET_FILE: &str = "monitor.sock";
/// Largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most descriptors one reply carries (one region per device, plus room).
pub const MAX_FDS: usize = 32;
/// Most devices one admission request may name (the monitor holds it to its own, smaller,
/// table).
pub const MAX_REQUEST_DEVICES: usize = 64;

/// The protocol version this build speaks (a request's `v=`; absent: 1). A request newer than
/// the monitor's is refused with `Why::BadRequest`, never half-understood.
pub const VERSION: u32 = 1;

/// A parsed message: its lines as `(key, value)` in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// The fields, in order (keys may repeat, e.g. `dev`).
    pub fields: Vec<(String, String)>,
}

impl Message {
    /// A message with the one field `key=value`.
    pub fn new(key: &str, value: &str) -> Message {
        let mut m = Message::default();
        m.push(key, value);
        m
    }

    /// Append a field; a newline in the value is replaced by a space (one line per field).
    pub fn push(&mut self, key: &str, value: &str) -> &mut Message {
        self.fields
            .push((key.into(), value.replace(['\n', '\r'], " ")));
        self
    }

    /// Append `key=value` when there is a value.
    pub fn push_some(&mut self, key: &str, value: Option<impl ToString>) -> &mut Message {
        if let Some(v) = value {
            self.push(key, &v.to_string());
        }
        self
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.fields
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of the required field `key`, parsed.
    pub fn field<T: FromStr>(&self, key: &'static str) -> Result<T, BadMessage> {
        self.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or(BadMessage::Field(key))
    }

    /// The value of the optional field `key`, parsed: absent is `None`, present must parse.
    pub fn optional<T: FromStr>(&self, key: &'static str) -> Result<Option<T>, BadMessage> {
        self.get(key)
            .map(|v| v.parse().map_err(|_| BadMessage::Field(key)))
            .transpose()
    }

    /// The text of the required field `key`.
    pub fn text(&self, key: &'static str) -> Result<String, BadMessage> {
        self.get(key)
            .map(String::from)
            .ok_or(BadMessage::Field(key))
    }

    /// The text form.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::new();
        for (k, v) in &self.fields {
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            s.push('\n');
        }
        s.into_bytes()
    }

    /// Parse the text form; `None` for anything that is not one (a carriage return included:
    /// [`Message::push`] never writes one, so a value reads back as it was sent).
    pub fn decode(b: &[u8]) -> Option<Message> {
        let s = std::str::from_utf8(b).ok()?;
        let s = s.strip_suffix('\n').unwrap_or(s);
        let mut m = Message::default();
        if s.is_empty() {
            return Some(m);
        }
        for line in s.split('\n') {
            let (k, v) = line.split_once('=')?;
            if line.contains('\r') {
                return None;
            }
            m.fields.push((k.into(), v.into()));
        }
        Some(m)
    }
}

/// `-` for none, else the number: the form of an optional number inside a field.
pub(crate) fn opt_num(v: Option<impl ToString>) -> String {
    v.map_or("-".into(), |n| n.to_string())
}

/// What is wrong with a message on the wire; each side words it (the monitor's refusal says
/// `bad request: …`, a client's error `the node's monitor answered something unexpected (…)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadMessage {
    /// Not `key=value` lines of UTF-8.
    NotKeyValue,
    /// An `op` nobody serves (a newer client, or garbage).
    UnknownOp(String),
    /// A request of a protocol version newer than this side speaks.
    Version(u32),
    /// A field is missing or not what it must be (a number, a known word).
    Field(&'static str),
    /// A `dev` line without its tab-separated fields (how many it needs).
    DevLine(usize),
    /// A share or cap past `PPM`, or a quota of 0.
    OutOfRange,
    /// A device named twice.
    Twice(String),
    /// More devices than a request may name ([`MAX_REQUEST_DEVICES`]).
    TooManyDevices,
}

impl fmt::Display for BadMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadMessage::NotKeyValue => f.write_str("not key=value lines"),
            BadMessage::UnknownOp(op) => write!(f, "unknown op {op:?}"),
            BadMessage::Version(v) => write!(
                f,
                "protocol version {v}, and this side speaks up to {}: upgrade the node's \
                 gpuslice monitor",
                VERSION
            ),
            BadMessage::Field(name) => write!(f, "field {name:?} missing or malformed"),
            BadMessage::DevLine(n) => write!(f, "a dev line needs {n} fields"),
            BadMessage::OutOfRange => write!(f, "share, cap or memory out of range"),
            BadMessage::Twice(uuid) => write!(f, "device {uuid:?} named twice"),
            BadMessage::TooManyDevices => write!(
                f,
                "more than {} devices in one request",
                MAX_REQUEST_DEVICES
            ),
        }
    }
}

impl std::error::Error for BadMessage {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_does_not_parse() {
        let mut m = Message::new("op", "admit");
        m.push("dev", "GPU-1\t1024")
            .push("dev", "GPU-2\t-")
            .push("x", "a\nb");
        let d = Message::decode(&m.encode()).unwrap();
        assert_eq!(d.get("op"), Some("admit"));
        assert_eq!(
            d.all("dev").collect::<Vec<_>>(),
            ["GPU-1\t1024", "GPU-2\t-"]
        );
        assert_eq!(d.get("x"), Some("a b"));
        assert!(Message::decode(b"no equals sign").is_none());
        assert!(Message::decode(&[0xff, 0xfe]).is_none());
        assert!(Message::decode(b"a=b\r\n").is_none());
        assert!(Message::decode(b"a=b\n\nc=d\n").is_none());
        assert_eq!(Message::decode(b""), Some(Message::default()));
    }

    #[test]
    fn fields_are_typed_on_the_way_in() {
        let mut m = Message::new("n", "12");
        m.push("x", "twelve");
        assert_eq!(m.field::<u64>("n"), Ok(12));
        assert_eq!(m.field::<u64>("x"), Err(BadMessage::Field("x")));
        assert_eq!(m.field::<u64>("absent"), Err(BadMessage::Field("absent")));
        assert_eq!(m.optional::<u64>("absent"), Ok(None));
        assert_eq!(m.optional::<u64>("n"), Ok(Some(12)));
        assert_eq!(m.optional::<u64>("x"), Err(BadMessage::Field("x")));
    }
}
