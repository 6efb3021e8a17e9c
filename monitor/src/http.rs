//! A deliberately tiny HTTP/1.x server for `GET /metrics`: one thread, one request per
//! connection, requests bounded in size and time, so a slow or hostile client can neither
//! exhaust memory nor stall the monitor's reaping (it runs on its own thread).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// The most of a request we read before giving up on it.
const MAX_REQUEST: usize = 8 * 1024;

/// Bind `addr` (`host:port`, e.g. `127.0.0.1:9400` or `[::]:9400`).
pub fn bind(addr: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .map_err(|e| format!("--metrics-listen {addr}: cannot listen there: {e}"))
}

/// Serve forever on `listener`; `body` renders the exposition for each scrape.
pub fn serve(listener: TcpListener, body: impl Fn() -> String) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let _ = handle(stream, &body);
            }
            // Out of descriptors and the like: wait instead of spinning.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Answer one connection.
fn handle(mut stream: TcpStream, body: &impl Fn() -> String) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read until the end of the headers; the request line is all we use.
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        if buf.len() >= MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "request too large\n",
                false,
            );
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => respond(&mut stream, "200 OK", &body(), method == "HEAD"),
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            "200 OK",
            "gpuslice monitor: metrics at /metrics\n",
            method == "HEAD",
        ),
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "not found: try /metrics\n",
            false,
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "only GET /metrics\n",
            false,
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes())?;
    if !head_only {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve(l, || "gpuslice_build_info 1\n".into()));
        let ok = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.ends_with("gpuslice_build_info 1\n"), "{ok}");
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
}
