//! The kubelet's plugin watcher dials the registration socket by its bare path, so grpc-go sends
//! that path (`/var/lib/kubelet/plugins_registry/gpuslice.dev-reg.sock`) as the HTTP/2
//! `:authority`. A `/` is not valid in an authority, and h2 (under tonic) resets every such
//! stream with `PROTOCOL_ERROR`: the kubelet logs "RegisterPlugin error -- failed to get plugin
//! info using RPC GetInfo ... PROTOCOL_ERROR" and never registers the plugin
//! (kubernetes/kubernetes#109081; h2 has no option to accept it, hyperium/h2#487). Found on the
//! real 1.37 kubelet; the DRA socket itself is dialed as `unix:PATH`, which sends `localhost`.
//!
//! [`Authority`] wraps an accepted unix connection and, on the way in, replaces an `:authority`
//! value that is not a valid authority with `localhost`, changing nothing else: it follows the
//! HTTP/2 frames, and in each HEADERS frame walks the HPACK representations far enough to find
//! the `:authority` literal. Nothing else is decoded, so the HPACK dynamic table is never
//! modelled; this is safe because the replacement is never longer than the value it replaces:
//! the decoder's table then holds entries no larger than the encoder believes, so it evicts no
//! entry the encoder may still refer to (RFC 7541 §4.4: indices count from the newest entry).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The static table's index of `:authority` (RFC 7541 Appendix A).
const AUTHORITY_INDEX: u64 = 1;
const REPLACEMENT: &[u8] = b"localhost";
/// The shortest Huffman-coded value that surely decodes to `REPLACEMENT.len()` bytes or more
/// (the longest code is 30 bits).
const HUFFMAN_SURE: usize = (REPLACEMENT.len() * 30).div_ceil(8);
/// Frames are read whole only when they are HEADERS; a bigger one than this is passed on as it
/// is (the default SETTINGS_MAX_FRAME_SIZE; the kubelet's headers are a few hundred bytes).
const MAX_HEADERS_FRAME: usize = 16_384;

/// An accepted connection whose incoming `:authority` is made valid (see the module's docs).
pub struct Authority<S> {
    inner: S,
    /// Bytes read from `inner` not yet looked at.
    pending: Vec<u8>,
    /// Bytes ready for the reader, from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    /// Preface bytes still expected, then frames.
    preface_left: usize,
    /// Bytes of the current frame's payload still to pass on unchanged.
    passthrough: usize,
    eof: bool,
}

impl<S> Authority<S> {
    pub fn new(inner: S) -> Self {
        Authority {
            inner,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            preface_left: PREFACE.len(),
            passthrough: 0,
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Move what can be decided from `pending` to `out`.
    fn process(&mut self) {
        loop {
            if self.preface_left > 0 {
                let n = self.preface_left.min(self.pending.len());
                self.out.extend(self.pending.drain(..n));
                self.preface_left -= n;
                if self.preface_left > 0 {
                    return;
                }
            }
            if self.passthrough > 0 {
                let n = self.passthrough.min(self.pending.len());
                self.out.extend(self.pending.drain(..n));
                self.passthrough -= n;
                if self.passthrough > 0 {
                    return;
                }
            }
            if self.pending.len() < FRAME_HEADER {
                return;
            }
            let len =
                u32::from_be_bytes([0, self.pending[0], self.pending[1], self.pending[2]]) as usize;
            let kind = self.pending[3];
            if kind != HEADERS || len > MAX_HEADERS_FRAME {
                self.out.extend(self.pending.drain(..FRAME_HEADER));
                self.passthrough = len;
                continue;
            }
            if self.pending.len() < FRAME_HEADER + len {
                return;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
            match rewrite_headers_frame(&frame) {
                Some(f) => self.out.extend_from_slice(&f),
                None => self.out.extend_from_slice(&frame),
            }
        }
    }
}

/// The HEADERS frame `frame` (header and payload) with its `:authority` made valid, or `None`
/// to pass it on unchanged (valid already, split over CONTINUATION frames, or not parseable).
fn rewrite_headers_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let flags = frame[4];
    if flags & END_HEADERS == 0 {
        return None;
    }
    let payload = &frame[FRAME_HEADER..];
    let mut start = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = *payload.first()? as usize;
        start = 1;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    if start > end {
        return None;
    }
    let block = &payload[start..end];
    let new_block = rewrite_block(block)?;
    let mut out = Vec::with_capacity(frame.len());
    let new_len = payload.len() - block.len() + new_block.len();
    out.extend_from_slice(&(new_len as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&frame[3..FRAME_HEADER]);
    out.extend_from_slice(&payload[..start]);
    out.extend_from_slice(&new_block);
    out.extend_from_slice(&payload[end..]);
    Some(out)
}

/// An HPACK integer with an `n`-bit prefix at `b[*pos]` (RFC 7541 §5.1).
fn integer(b: &[u8], pos: &mut usize, n: u32) -> Option<u64> {
    let max = (1u64 << n) - 1;
    let mut v = (*b.get(*pos)? as u64) & max;
    *pos += 1;
    if v < max {
        return Some(v);
    }
    let mut shift = 0;
    loop {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v = v.checked_add(((byte & 0x7f) as u64).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// A string literal at `b[*pos]`: (Huffman-coded, its bytes) (RFC 7541 §5.2).
fn string<'a>(b: &'a [u8], pos: &mut usize) -> Option<(bool, &'a [u8])> {
    let huffman = *b.get(*pos)? & 0x80 != 0;
    let len = integer(b, pos, 7)? as usize;
    let s = b.get(*pos..pos.checked_add(len)?)?;
    *pos += len;
    Some((huffman, s))
}

/// Whether `:authority`'s value must be replaced: a plain value that is not a valid authority
/// (RFC 3986 §3.2: no `/`, `?`, `#`, space or control), or a Huffman-coded one long enough to be
/// a socket path (it is not decoded; see `HUFFMAN_SURE`).
fn must_replace(huffman: bool, value: &[u8]) -> bool {
    if huffman {
        value.len() >= HUFFMAN_SURE
    } else {
        value.len() >= REPLACEMENT.len()
            && value
                .iter()
                .any(|&c| matches!(c, b'/' | b'?' | b'#' | b' ') || !(0x20..0x7f).contains(&c))
    }
}

/// The header block `b` with `:authority` replaced, or `None` when nothing is replaced.
fn rewrite_block(b: &[u8]) -> Option<Vec<u8>> {
    let mut pos = 0;
    while pos < b.len() {
        let first = b[pos];
        let prefix = if first & 0x80 != 0 {
            integer(b, &mut pos, 7)?; // indexed field
            continue;
        } else if first & 0xc0 == 0x40 {
            6 // literal with incremental indexing
        } else if first & 0xe0 == 0x20 {
            integer(b, &mut pos, 5)?; // dynamic table size update
            continue;
        } else {
            4 // literal without indexing, or never indexed
        };
        let index = integer(b, &mut pos, prefix)?;
        let is_authority = if index == 0 {
            let (huffman, name) = string(b, &mut pos)?;
            !huffman && name == b":authority"
        } else {
            index == AUTHORITY_INDEX
        };
        let value_at = pos;
        let (huffman, value) = string(b, &mut pos)?;
        if is_authority && must_replace(huffman, value) {
            let mut out = Vec::with_capacity(b.len());
            out.extend_from_slice(&b[..value_at]);
            out.push(REPLACEMENT.len() as u8); // H = 0, a length below 127
            out.extend_from_slice(REPLACEMENT);
            out.extend_from_slice(&b[pos..]);
            return Some(out);
        }
    }
    None
}

impl<S: AsyncRead + Unpin> AsyncRead for Authority<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_pos < this.out.len() {
                let n = (this.out.len() - this.out_pos).min(buf.remaining());
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // What was left undecided (a cut-off frame) goes on as it came.
                if !this.pending.is_empty() {
                    this.out.append(&mut this.pending);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut tmp = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                this.eof = true;
            } else {
                this.pending.extend_from_slice(rb.filled());
                this.process();
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Authority<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Authority<tokio::net::UnixStream> {
    type ConnectInfo = <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// `:method POST` (indexed 3), `:authority` as a literal with incremental indexing of the
    /// static name (index 1), then `:path` as a literal without indexing (index 4).
    fn block(authority: &[u8], huffman: bool) -> Vec<u8> {
        let mut b = vec![0x83, 0x41];
        b.push(if huffman { 0x80 } else { 0 } | authority.len() as u8);
        b.extend_from_slice(authority);
        b.push(0x04);
        let path = b"/pluginregistration.Registration/GetInfo";
        b.push(path.len() as u8);
        b.extend_from_slice(path);
        b
    }

    async fn through(input: Vec<u8>) -> Vec<u8> {
        let mut a = Authority::new(io::Cursor::new(input));
        let mut out = Vec::new();
        a.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_path_authority_becomes_localhost_and_nothing_else_changes() {
        let path = b"/var/lib/kubelet/plugins_registry/gpuslice.dev-reg.sock";
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let headers = frame(HEADERS, END_HEADERS, 1, &block(path, false));
        let data = frame(0x0, 0x1, 1, b"\0\0\0\0\0");
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(&headers);
        input.extend(&data);
        let out = through(input).await;
        let mut want = PREFACE.to_vec();
        want.extend(&settings);
        want.extend(frame(HEADERS, END_HEADERS, 1, &block(b"localhost", false)));
        want.extend(&data);
        assert_eq!(out, want);
    }

    #[tokio::test]
    async fn a_valid_authority_and_a_short_huffman_one_pass_unchanged() {
        for (value, huffman) in [
            (&b"localhost"[..], false),
            (&b"\xa0\xe4\x1d\x13\x9d\x09"[..], true),
        ] {
            let mut input = PREFACE.to_vec();
            input.extend(frame(HEADERS, END_HEADERS, 1, &block(value, huffman)));
            assert_eq!(through(input.clone()).await, input);
        }
    }

    #[tokio::test]
    async fn a_long_huffman_authority_is_replaced_with_padding_and_priority_kept() {
        let coded = [0x63u8; 40]; // Huffman bytes, not decoded: long enough to be a path
        let mut payload = vec![2u8]; // pad length
        payload.extend([0x80, 0, 0, 1, 16]); // priority
        payload.extend(block(&coded, true));
        payload.extend([0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 3, &payload));
        let out = through(input).await;
        let mut want_payload = vec![2u8];
        want_payload.extend([0x80, 0, 0, 1, 16]);
        want_payload.extend(block(b"localhost", false));
        want_payload.extend([0, 0]);
        let mut want = PREFACE.to_vec();
        want.extend(frame(
            HEADERS,
            END_HEADERS | PADDED | PRIORITY,
            3,
            &want_payload,
        ));
        assert_eq!(out, want);
    }

    #[tokio::test]
    async fn frames_cut_anywhere_by_the_socket_come_out_the_same() {
        let path = b"/var/lib/kubelet/plugins_registry/gpuslice.dev-reg.sock";
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block(path, false)));
        input.extend(frame(0x0, 0x1, 1, &[7u8; 300]));
        let whole = through(input.clone()).await;
        for cut in [1, 5, 24, 30, 33, 60, 100, 200] {
            // A reader that returns at most `cut` bytes at a time.
            let (mut w, r) = tokio::io::duplex(cut);
            let inp = input.clone();
            let writer = tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                w.write_all(&inp).await.unwrap();
            });
            let mut a = Authority::new(r);
            let mut out = Vec::new();
            a.read_to_end(&mut out).await.unwrap();
            writer.await.unwrap();
            assert_eq!(out, whole, "cut at {cut}");
        }
    }

    #[test]
    fn malformed_blocks_are_left_alone() {
        assert_eq!(rewrite_block(&[0x41, 0x7f]), None); // a length past the end
        assert_eq!(
            rewrite_block(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(
            rewrite_headers_frame(&frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 1])),
            None
        );
        assert_eq!(
            rewrite_headers_frame(&frame(HEADERS, 0, 1, &block(b"/a/b/c/d/e/f", false))),
            None
        );
    }
}
