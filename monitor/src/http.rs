//! A deliberately tiny HTTP/1.x server for `GET /metrics`: one thread running a `poll(2)` loop
//! over non-blocking sockets, one request per connection.
//!
//! Why a poll loop: a thread blocked reading one client is a thread every other client waits
//! for. Here no socket operation ever blocks, so a client that sends a byte every second (a
//! "slow loris") holds one entry of a bounded table and nothing else. The bounds:
//!
//! - [`DEADLINE`] for the whole connection, from accept to the last byte of the answer (not a
//!   timeout per read, which a trickle of bytes renews forever);
//! - [`MAX_REQUEST`] bytes of request buffered per connection;
//! - [`MAX_CONNECTIONS`] open at once: a new one beyond that closes the connection that has
//!   been open longest (the likeliest to be stuck), so a flood of idle connections cannot lock
//!   out a scraper that connects later.
//!
//! Memory is therefore at most about `MAX_CONNECTIONS × (MAX_REQUEST + one exposition)`. The
//! server runs on its own thread, so nothing here can stall the monitor's reaping.

use crate::error::Error;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The most of a request we read before giving up on it.
const MAX_REQUEST: usize = 8 * 1024;
/// How long one connection may take, request and answer together.
const DEADLINE: Duration = Duration::from_secs(5);
/// Connections open at once; the oldest is closed to make room for a new one.
const MAX_CONNECTIONS: usize = 64;

/// Bind `addr` (`host:port`, e.g. `127.0.0.1:9400` or `[::1]:9400`).
pub fn bind(addr: &str) -> Result<TcpListener, Error> {
    TcpListener::bind(addr).map_err(|source| Error::Listen {
        addr: addr.to_string(),
        source,
    })
}

/// The warning to log when `addr` is reachable from other machines (anything but loopback):
/// the exposition names every slice and process on the node and is served without
/// authentication. `None` for a loopback address.
pub fn exposure_warning(addr: &SocketAddr) -> Option<String> {
    let ip = addr.ip();
    if ip.is_loopback() {
        return None;
    }
    let which = if ip.is_unspecified() {
        "every interface of this machine"
    } else {
        "a non-loopback interface"
    };
    Some(format!(
        "warning: metrics at {addr} are served on {which}, without authentication or TLS: \
         anyone who can reach it reads every slice's name, quota and processes; prefer a \
         loopback address behind an authenticating proxy (docs/operations.md, \"Exposing \
         metrics\")"
    ))
}

/// One open connection.
struct Conn {
    stream: TcpStream,
    opened: Instant,
    /// The request so far (at most [`MAX_REQUEST`] bytes).
    request: Vec<u8>,
    /// The answer, once the request is complete; `sent` bytes of it are written.
    answer: Option<Vec<u8>>,
    sent: usize,
}

/// What to do with a connection after serving its events.
enum Next {
    Keep,
    Close,
}

/// Serve forever on `listener`; `body` renders the exposition for each scrape.
pub fn serve(listener: TcpListener, body: impl Fn() -> String) {
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("gpuslice monitor: metrics server stopped: {e}");
        return;
    }
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CONNECTIONS + 1);
    loop {
        let now = Instant::now();
        conns.retain(|c| now.duration_since(c.opened) < DEADLINE);
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for c in &conns {
            fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: if c.answer.is_some() {
                    libc::POLLOUT
                } else {
                    libc::POLLIN
                },
                revents: 0,
            });
        }
        // Wake for the earliest deadline (at least every second).
        let wait = conns
            .iter()
            .map(|c| DEADLINE.saturating_sub(now.duration_since(c.opened)))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let wait_ms = wait.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures that lives across
        // the call; the descriptors belong to `listener` and `conns`, which outlive it.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            // EINTR (a signal for the monitor's main thread) or ENOMEM: try again shortly.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        // Serve the existing connections first (their indices match `fds[1..]`), then accept.
        let mut i = 0;
        let mut k = 1;
        while i < conns.len() {
            let revents = fds[k].revents;
            k += 1;
            if revents == 0 {
                i += 1;
                continue;
            }
            match step(&mut conns[i], &body) {
                Next::Keep => i += 1,
                Next::Close => {
                    conns.remove(i);
                }
            }
        }
        if fds[0].revents != 0 {
            accept_all(&listener, &mut conns);
        }
    }
}

/// Accept every pending connection, making room by closing the oldest when the table is full.
fn accept_all(listener: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CONNECTIONS {
                    // Connections are appended in order of arrival: the first is the oldest.
                    conns.remove(0);
                }
                conns.push(Conn {
                    stream,
                    opened: Instant::now(),
                    request: Vec::new(),
                    answer: None,
                    sent: 0,
                });
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // WouldBlock: none left. Out of descriptors and the like: the next poll retries
            // (after closing expired connections, which frees descriptors).
            Err(_) => return,
        }
    }
}

/// Make what progress the socket allows without blocking.
fn step(c: &mut Conn, body: &impl Fn() -> String) -> Next {
    if c.answer.is_none() {
        let mut chunk = [0u8; 1024];
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => {
                    // The client finished sending: answer what it sent (HTTP/1.0 style).
                    c.answer = Some(answer(&c.request, body));
                    break;
                }
                Ok(n) => {
                    let room = MAX_REQUEST - c.request.len();
                    c.request.extend_from_slice(&chunk[..n.min(room)]);
                    if head_complete(&c.request) || c.request.len() >= MAX_REQUEST {
                        c.answer = Some(answer(&c.request, body));
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                Err(_) => return Next::Close,
            }
        }
    }
    let Some(out) = &c.answer else {
        return Next::Keep;
    };
    while c.sent < out.len() {
        match c.stream.write(&out[c.sent..]) {
            Ok(0) => return Next::Close,
            Ok(n) => c.sent += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
            Err(_) => return Next::Close,
        }
    }
    let _ = c.stream.flush();
    Next::Close
}

/// Whether `buf` holds a whole request head (the blank line after the headers).
fn head_complete(buf: &[u8]) -> bool {
    buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n")
}

/// The whole answer to a request (status line, headers and body).
fn answer(request: &[u8], body: &impl Fn() -> String) -> Vec<u8> {
    if !head_complete(request) && request.len() >= MAX_REQUEST {
        return response(
            "431 Request Header Fields Too Large",
            "request too large\n",
            false,
        );
    }
    let head = String::from_utf8_lossy(request);
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => response("200 OK", &body(), head_only),
        ("GET" | "HEAD", "/") => response(
            "200 OK",
            "gpuslice monitor: metrics at /metrics\n",
            head_only,
        ),
        ("GET" | "HEAD", _) => response("404 Not Found", "not found: try /metrics\n", false),
        _ => response("405 Method Not Allowed", "only GET /metrics\n", false),
    }
}

fn response(status: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn server() -> SocketAddr {
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve(l, || "gpuslice_build_info 1\n".into()));
        addr
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let addr = server();
        let ok = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.ends_with("gpuslice_build_info 1\n"), "{ok}");
        let head = get(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(get(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        // Exactly the bound, so the server has read everything when it answers (no reset).
        let big = vec![b'a'; MAX_REQUEST];
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(&big);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    }

    /// One client sending a byte every 1.5 s (each read would renew a per-read timeout) holds
    /// nothing up: 9 scrapes made meanwhile, at once, are all answered promptly, and the slow
    /// client is cut off at the connection's deadline.
    #[test]
    fn a_slow_client_blocks_no_scrape() {
        let addr = server();
        let slow = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let start = Instant::now();
            for b in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n" {
                if s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1500));
                if start.elapsed() > DEADLINE + Duration::from_secs(5) {
                    break;
                }
            }
            start.elapsed()
        });
        // Let the slow client get in first and start trickling.
        std::thread::sleep(Duration::from_millis(300));
        let scrapes: Vec<_> = (0..9)
            .map(|_| {
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
                    (t.elapsed(), out)
                })
            })
            .collect();
        for s in scrapes {
            let (took, out) = s.join().unwrap();
            assert!(out.ends_with("gpuslice_build_info 1\n"), "{out}");
            // Promptly: far below the 1.5 s between the slow client's bytes (generous for a
            // loaded machine).
            assert!(took < Duration::from_millis(1000), "a scrape took {took:?}");
        }
        // The slow client's writes start failing once the server closed it at the deadline.
        let lasted = slow.join().unwrap();
        assert!(
            lasted < DEADLINE + Duration::from_secs(5),
            "the slow client was kept for {lasted:?}"
        );
    }

    /// More idle connections than the table holds cannot lock out a scraper that comes later.
    #[test]
    fn idle_connections_cannot_fill_the_server() {
        let addr = server();
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS + 10)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(out.ends_with("gpuslice_build_info 1\n"), "{out}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
        drop(idle);
    }

    #[test]
    fn only_loopback_goes_without_a_warning() {
        for quiet in ["127.0.0.1:9400", "[::1]:9400"] {
            assert_eq!(exposure_warning(&quiet.parse().unwrap()), None, "{quiet}");
        }
        for loud in ["0.0.0.0:9400", "[::]:9400", "10.1.2.3:9400"] {
            let w = exposure_warning(&loud.parse().unwrap()).expect(loud);
            assert!(w.contains("without authentication"), "{w}");
        }
    }
}
