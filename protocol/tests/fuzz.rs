//! The protocol's decoders against what a hostile peer can send, as a bounded fuzz loop that
//! `cargo test` runs (CI included): every request and reply survives the wire; random bytes,
//! and valid messages cut, spliced and flipped, never panic a decoder, and whatever a decoder
//! accepts encodes back to a message that decodes to the same value; the monitor's side of a
//! connection answers garbage with a typed refusal.
//!
//! Bounded by iterations (`GPUSLICE_FUZZ_ITERATIONS`, default 20 000 per test) or, to fuzz
//! longer, by time (`GPUSLICE_FUZZ_SECONDS`); the seed is printed and can be given back
//! (`GPUSLICE_FUZZ_SEED`) to replay a failure:
//!
//! ```text
//! GPUSLICE_FUZZ_SECONDS=300 cargo test --release -p gpuslice-protocol --test fuzz -- --nocapture
//! ```

use gpuslice_protocol::*;
use gpuslice_quantity::{Cap, Share};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// xorshift64*: small, seedable, good enough to pick bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
    /// A number, often at an edge.
    fn num(&mut self) -> u64 {
        match self.below(6) {
            0 => 0,
            1 => u64::MAX,
            2 => u32::MAX as u64 + self.below(3),
            3 => 1_000_000 + self.below(3),
            _ => self.below(1 << 40),
        }
    }
    fn u32(&mut self) -> u32 {
        self.num() as u32
    }
    fn usize(&mut self) -> usize {
        self.num() as usize
    }
    /// Text without the characters a field cannot hold (newlines; tabs inside a `dev` line).
    fn text(&mut self, max: u64, tabs: bool) -> String {
        const CHARS: &[char] = &[
            'a',
            'Z',
            '0',
            '9',
            '-',
            '_',
            '.',
            '=',
            ' ',
            '/',
            'é',
            '\u{1F600}',
            '\t',
            '%',
        ];
        let n = self.below(max + 1);
        (0..n)
            .map(|_| CHARS[self.below(CHARS.len() as u64) as usize])
            .filter(|&c| tabs || c != '\t')
            .collect()
    }
    fn name(&mut self) -> String {
        let mut s = self.text(24, true);
        if s.is_empty() {
            s.push('n');
        }
        s
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Rng) -> T) -> Option<T> {
        self.bool().then(|| f(self))
    }
}

fn seed() -> u64 {
    let s = std::env::var("GPUSLICE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
        | 1;
    eprintln!("GPUSLICE_FUZZ_SEED={s}");
    s
}

/// Run `f` for the configured number of iterations or seconds.
fn fuzz(mut f: impl FnMut(&mut Rng)) {
    let mut rng = Rng(seed());
    let secs = std::env::var("GPUSLICE_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    let iterations = std::env::var("GPUSLICE_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(20_000);
    let t0 = Instant::now();
    let mut i = 0u64;
    loop {
        match secs {
            Some(s) if t0.elapsed() >= Duration::from_secs(s) => break,
            None if i >= iterations => break,
            _ => {}
        }
        f(&mut rng);
        i += 1;
    }
    eprintln!("{i} iterations in {:?}", t0.elapsed());
}

fn admit_request(r: &mut Rng) -> AdmitRequest {
    let n = r.below(5);
    AdmitRequest {
        slice: r.opt(Rng::name),
        secret: r.opt(|r| r.text(64, true)),
        priority: r.opt(Rng::u32),
        devices: (0..n)
            .map(|i| DeviceRequest {
                uuid: format!("GPU-{i}-{}", r.text(8, false)),
                memory: r.opt(|r| r.num().max(1)),
                compute_share: Share::from_ppm(r.below(1_000_001) as u32),
                compute_cap: Cap::from_ppm(r.below(1_000_001) as u32),
                memory_setting: r.text(64, false),
                compute_setting: r.text(64, false),
            })
            .collect(),
    }
}

fn request(r: &mut Rng) -> Request {
    match r.below(12) {
        0 => Ping.into(),
        1 => admit_request(r).into(),
        2 => View { slice: r.usize() }.into(),
        3 => Release {
            device: r.text(40, true),
            bytes: r.num(),
        }
        .into(),
        4 => ShareExport {
            device: r.text(40, true),
            bytes: r.num(),
        }
        .into(),
        5 => ShareImport.into(),
        6 => ShareLeave { record: r.usize() }.into(),
        7 => ShareLetGo { record: r.usize() }.into(),
        8 => SliceCreate {
            name: r.text(24, true),
            device: r.text(40, true),
            memory: r.num(),
            share: Share::from_ppm(r.u32()),
            cap: Cap::from_ppm(r.u32()),
            owner: r.opt(Rng::u32),
            claim: r.opt(Rng::name),
            secret: r.opt(|r| r.text(64, true)),
        }
        .into(),
        9 => SliceRemove {
            name: r.text(24, true),
        }
        .into(),
        10 => SliceSet {
            name: r.text(24, true),
            memory: r.opt(Rng::num),
            share: r.opt(|r| Share::from_ppm(r.u32())),
            cap: r.opt(|r| Cap::from_ppm(r.u32())),
            class: r.opt(Rng::u32),
        }
        .into(),
        _ => SlicePriority {
            name: r.text(24, true),
            priority: r.u32(),
        }
        .into(),
    }
}

/// A reply to `op`, as the monitor could give it.
fn reply(r: &mut Rng, op: Op) -> Reply {
    match op {
        Op::Ping => Pong { pid: r.u32() }.into(),
        Op::Admit => AdmitReply {
            slot: r.usize(),
            devices: (0..r.below(5))
                .map(|i| GrantedDevice {
                    uuid: format!("GPU-{i}"),
                    device: r.usize(),
                    slice: r.usize(),
                    memory_limit: r.opt(Rng::num),
                    allowance: r.opt(Rng::usize),
                })
                .collect(),
            warnings: (0..r.below(3)).map(|_| r.text(80, true)).collect(),
        }
        .into(),
        Op::View => Viewed.into(),
        Op::Release => Released { bytes: r.num() }.into(),
        Op::ShareExport => Exported {
            record: r.opt(Rng::usize),
        }
        .into(),
        Op::ShareImport => match r.below(5) {
            0 => Imported::Held(r.usize()),
            1 => Imported::Adopted {
                rec: r.usize(),
                dev: r.usize(),
                bytes: r.num(),
            },
            2 => Imported::Refused {
                dev: r.usize(),
                bytes: r.num(),
            },
            3 => Imported::Charge {
                dev: r.usize(),
                bytes: r.num(),
            },
            _ => Imported::Unknown,
        }
        .into(),
        Op::ShareLeave => Left.into(),
        Op::ShareLetGo => {
            [LetGo::HandedOver, LetGo::Uncharge, LetGo::Keep][r.below(3) as usize].into()
        }
        Op::SliceCreate | Op::SliceRemove | Op::SliceSet | Op::SlicePriority => {
            Done { records: r.usize() }.into()
        }
    }
}

fn wire(m: &Message) -> Message {
    Message::decode(&m.encode()).expect("an encoded message decodes")
}

#[test]
fn every_request_and_reply_survives_the_wire() {
    fuzz(|r| {
        let req = request(r);
        assert_eq!(Request::decode(&wire(&req.encode())).as_ref(), Ok(&req));
        let rep = reply(r, req.op());
        assert_eq!(
            Reply::decode(req.op(), &wire(&rep.encode())),
            Ok(Ok(rep.clone()))
        );
        let why = Why::ALL[r.below(Why::ALL.len() as u64) as usize];
        let refusal = Refusal::new(why, r.text(80, true));
        assert_eq!(
            Reply::decode(req.op(), &wire(&refusal.encode())),
            Ok(Err(refusal))
        );
    });
}

/// Bytes a hostile peer could send: garbage, or a valid message cut, spliced or flipped.
fn hostile(r: &mut Rng) -> Vec<u8> {
    let mut b = match r.below(4) {
        0 => (0..r.below(200)).map(|_| r.next() as u8).collect(),
        1 => {
            let op = Op::ALL[r.below(12) as usize];
            reply(r, op).encode().encode()
        }
        _ => request(r).encode().encode(),
    };
    for _ in 0..r.below(6) {
        if b.is_empty() {
            break;
        }
        let i = r.below(b.len() as u64) as usize;
        match r.below(5) {
            0 => b.truncate(i),
            1 => b[i] = r.next() as u8,
            2 => b.insert(
                i,
                [b'=', b'\n', b'\t', b'-', b'9', 0xff][r.below(6) as usize],
            ),
            3 => {
                let line = [
                    "op=admit\n",
                    "v=99\n",
                    "dev=\t\t\n",
                    "ok=\n",
                    "err=x\n",
                    "why=?\n",
                ][r.below(6) as usize];
                b.splice(i..i, line.bytes());
            }
            _ => {
                b.remove(i);
            }
        }
    }
    b
}

#[test]
fn hostile_bytes_never_panic_and_what_decodes_is_stable() {
    fuzz(|r| {
        let b = hostile(r);
        let Some(m) = Message::decode(&b) else {
            return;
        };
        if let Ok(req) = Request::decode(&m) {
            assert_eq!(Request::decode(&wire(&req.encode())), Ok(req));
        }
        for op in Op::ALL {
            match Reply::decode(op, &m) {
                Ok(Ok(rep)) => assert_eq!(Reply::decode(op, &wire(&rep.encode())), Ok(Ok(rep))),
                Ok(Err(refusal)) => assert_eq!(
                    Reply::decode(op, &wire(&refusal.encode())),
                    Ok(Err(refusal))
                ),
                Err(_) => {}
            }
        }
    });
}

#[test]
fn unknown_newer_and_malformed_requests_are_refused_by_reason() {
    let refused = |m: &Message| Request::decode(m).unwrap_err();
    assert_eq!(
        refused(&Message::new("op", "format-disk")),
        BadMessage::UnknownOp("format-disk".into())
    );
    let mut newer = Request::from(Ping).encode();
    newer.fields[1].1 = (VERSION + 1).to_string();
    assert_eq!(refused(&newer), BadMessage::Version(VERSION + 1));
    let mut release = Message::new("op", "release");
    release.push("dev", "GPU-1").push("bytes", "lots");
    assert_eq!(refused(&release), BadMessage::Field("bytes"));
    assert_eq!(refused(&Message::new("x", "y")), BadMessage::Field("op"));
    // A request without a version is version 1: what every shim before versions sent.
    let mut old = Message::new("op", "share-leave");
    old.push("rec", "3");
    assert_eq!(Request::decode(&old), Ok(ShareLeave { record: 3 }.into()));
}

/// The monitor's side of a connection, over a real socket: garbage is answered with a
/// refusal of reason `BadRequest`, a valid request read as sent.
#[test]
fn the_monitor_side_answers_garbage_with_a_typed_refusal() {
    let pair = || {
        let mut sv = [0; 2];
        // SAFETY: `sv` is a valid out-parameter for two descriptors.
        let rc =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: just made, ours.
        unsafe {
            use std::os::fd::FromRawFd;
            (
                std::os::fd::OwnedFd::from_raw_fd(sv[0]),
                std::os::fd::OwnedFd::from_raw_fd(sv[1]),
            )
        }
    };
    let (client, monitor) = pair();
    // SAFETY: valid socket and buffer.
    let n = unsafe { libc::send(client.as_raw_fd(), [0xffu8, 0].as_ptr().cast(), 2, 0) };
    assert_eq!(n, 2);
    let (got, _) = receive(monitor.as_raw_fd()).unwrap();
    let refusal = got.unwrap_err();
    assert_eq!(refusal.why, Why::BadRequest);
    answer(monitor.as_raw_fd(), &Err(refusal.clone())).unwrap();
    let (m, _) = recv(client.as_raw_fd()).unwrap().unwrap();
    assert_eq!(Reply::decode(Op::Ping, &m), Ok(Err(refusal)));

    let (client, monitor) = pair();
    let req: Request = ShareLetGo { record: 9 }.into();
    send(client.as_raw_fd(), &req.encode(), &[]).unwrap();
    let (got, _) = receive(monitor.as_raw_fd()).unwrap();
    assert_eq!(got, Ok(req));
}
