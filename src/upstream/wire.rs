//! The gateway's own exchange with the backend, for every request it forwards itself: a
//! purchase holding stock (whether the front judged it or the proxy's session did) and
//! another route's request whose body the gateway read whole. Sent on the gateway's own
//! keep-alive connections (one idle list, no task per connection), written in one write; the
//! answer's head parsed with httparse, and read independently of the buyer's connection:
//! whatever the buyer does meanwhile (a half-close, a reset, a pipelined byte), the backend's
//! status is read, so a 2xx confirms the reservation and a 5xx releases it before anything is
//! relayed. The body is then relayed as it came to a buyer on the front's connection
//! ([`Answer::relay`]), or read as data for Pingora's session to frame ([`Answer::body_chunk`]).
//!
//! Every address is tried once for a connect; no answer within the read timeout is
//! [`ForwardError::NoAnswer`] (the backend may hold the order); none reached is
//! [`ForwardError::NotSent`]. The read timeout bounds each read, as Pingora's does.
//!
//! Approximation: a request sent on a pooled connection that turns out to be closed by the
//! backend (the write fails, or it closes before a single byte of answer) is sent once more on
//! a new connection. The backend's keep-alive race makes that the usual meaning; a backend that
//! took the order and then closed without answering gets it twice, with the same reservation
//! token (`jti`), which backends deduplicate on.

use super::Upstreams;
use crate::config::UpstreamSettings;
use bytes::{Buf, BytesMut};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::Stream;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

mod body;
mod chunked;

pub use body::BodyBroke;

/// How long an idle connection is kept for the next purchase (the backend may close it first:
/// see the retry above).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per backend.
const MAX_IDLE: usize = 128;
/// Most bytes of an answer's head.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;

/// The idle connections, per backend: one list for the process, locked only to push or pop.
///
/// Approximation of "no lock per request": lists per worker thread were tried first, and under
/// Pingora's work-stealing runtime a task taking a connection on one thread and giving it back
/// on another made one thread's list grow while the other connected anew (the soak test saw
/// the gateway's open files grow by 20 a minute); one list sized by the peak of purchases in
/// flight stays flat, for two short uncontended locks per winner.
static IDLE: std::sync::LazyLock<Mutex<Idle>> = std::sync::LazyLock::new(Mutex::default);

/// Per backend, its idle connections with since when, oldest first.
type Idle = HashMap<SocketAddr, Vec<(TcpStream, std::time::Instant)>>;

fn take_idle(addr: SocketAddr) -> Option<TcpStream> {
    let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
    let list = idle.get_mut(&addr)?;
    while let Some((conn, since)) = list.pop() {
        // A connection the backend wrote to (a late or stray answer, a 408) or closed while it
        // was idle would answer the next buyer with what is not theirs: only one that has
        // nothing to read is used again.
        let quiet = matches!(conn.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        if quiet && since.elapsed() < IDLE_TIMEOUT {
            return Some(conn);
        }
    }
    None
}

fn put_idle(addr: SocketAddr, conn: TcpStream) {
    let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
    let list = idle.entry(addr).or_default();
    // The oldest are at the front: those idle too long are closed here, not kept for ever
    // under the ones in use.
    let stale = list
        .iter()
        .take_while(|(_, since)| since.elapsed() >= IDLE_TIMEOUT)
        .count();
    list.drain(..stale);
    if list.len() < MAX_IDLE {
        list.push((conn, std::time::Instant::now()));
    }
}

/// How the answer's body is framed (RFC 9112, section 6.3; the request is never `HEAD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// The backend's answer: its head, and the connection its body is read from.
pub struct Answer {
    conn: TcpStream,
    addr: SocketAddr,
    /// Bytes read past the head.
    buf: BytesMut,
    head: ResponseHeader,
    framing: Framing,
    /// The backend lets the connection be used again (HTTP/1.1, no `Connection: close`, not a
    /// switch of protocols, a body whose end is known).
    reusable: bool,
    read_timeout: Duration,
    /// Where reading the body as data stands ([`Answer::body_chunk`]).
    reading: body::Reading,
}

/// Why no answer was read.
#[derive(Debug)]
pub enum ForwardError {
    /// No backend got the request (none healthy, or every connect failed).
    NotSent(Box<Error>),
    /// The request was sent, and no answer came in time (or the connection broke): the
    /// backend may hold the order.
    NoAnswer(Box<Error>),
}

impl ForwardError {
    pub fn error(&self) -> &Error {
        match self {
            ForwardError::NotSent(e) | ForwardError::NoAnswer(e) => e,
        }
    }
}

/// A request as bytes, ready to write: `head` (as the proxy prepared it, its framing headers
/// included) and `body`.
pub fn request_bytes(head: &RequestHeader, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024 + body.len());
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.raw_path());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in head.headers.iter() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Sends `request` (head and body, ready to write) to a healthy backend of `settings` and
/// reads the answer's head.
pub async fn send(
    upstreams: &Upstreams,
    settings: &UpstreamSettings,
    request: &[u8],
) -> Result<Answer, ForwardError> {
    let attempts = settings.addresses.len().max(1);
    let mut last = None;
    for _ in 0..attempts {
        let addr = upstreams.address(settings).map_err(ForwardError::NotSent)?;
        let (conn, reused) = match take_idle(addr) {
            Some(conn) => (conn, true),
            None => match connect(addr, settings.connect_timeout).await {
                Ok(conn) => (conn, false),
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            },
        };
        let read_timeout = settings.read_timeout;
        return match exchange(conn, addr, read_timeout, request).await {
            Ok(answer) => Ok(answer),
            Err((e, nothing_read)) if reused && nothing_read => {
                tracing::debug!(error = %e, "pooled backend connection was closed; sent again");
                let conn = connect(addr, settings.connect_timeout)
                    .await
                    .map_err(ForwardError::NoAnswer)?;
                exchange(conn, addr, read_timeout, request)
                    .await
                    .map_err(|(e, _)| ForwardError::NoAnswer(e))
            }
            Err((e, _)) => Err(ForwardError::NoAnswer(e)),
        };
    }
    Err(ForwardError::NotSent(last.unwrap_or_else(|| {
        Error::explain(ErrorType::ConnectNoRoute, "no backend could be reached")
    })))
}

async fn connect(addr: SocketAddr, within: Duration) -> Result<TcpStream> {
    let conn = match timeout(within, TcpStream::connect(addr)).await {
        Err(_) => return Error::e_explain(ErrorType::ConnectTimedout, "connecting to the backend"),
        Ok(conn) => conn.or_err(ErrorType::ConnectRefused, "connecting to the backend")?,
    };
    // Nagle would hold a small answer back for the backend's delayed ack.
    let _ = conn.set_nodelay(true);
    Ok(conn)
}

/// Writes the request and reads the answer's head (skipping `1xx` heads). On failure, also
/// whether nothing at all was read back (a closed pooled connection looks like that).
async fn exchange(
    mut conn: TcpStream,
    addr: SocketAddr,
    read_timeout: Duration,
    request: &[u8],
) -> std::result::Result<Answer, (Box<Error>, bool)> {
    match timeout(read_timeout, conn.write_all(request)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err((Error::because(ErrorType::WriteError, "sending", e), true)),
        Err(_) => return Err((Error::explain(ErrorType::WriteTimedout, "sending"), false)),
    }
    let mut buf = BytesMut::with_capacity(1024);
    let mut read_any = false;
    loop {
        if !buf.is_empty() {
            match parse_head(&buf) {
                Ok(Some(Parsed {
                    head,
                    len,
                    framing,
                    reusable,
                })) => {
                    buf.advance(len);
                    if head.status.is_informational() && head.status.as_u16() != 101 {
                        continue;
                    }
                    return Ok(Answer {
                        conn,
                        addr,
                        buf,
                        head,
                        framing,
                        reusable,
                        read_timeout,
                        reading: body::Reading::Start,
                    });
                }
                Ok(None) if buf.len() < MAX_HEAD_BYTES => {}
                Ok(None) => return Err((invalid("an answer head too long"), false)),
                Err(e) => return Err((e, false)),
            }
        }
        match timeout(read_timeout, conn.read_buf(&mut buf)).await {
            Err(_) => return Err((Error::explain(ErrorType::ReadTimedout, "the answer"), false)),
            Ok(Err(e)) => {
                return Err((
                    Error::because(ErrorType::ReadError, "the answer", e),
                    !read_any,
                ))
            }
            Ok(Ok(0)) => {
                let e = Error::explain(ErrorType::ConnectionClosed, "before an answer");
                return Err((e, !read_any));
            }
            Ok(Ok(_)) => read_any = true,
        }
    }
}

fn invalid(what: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InvalidHTTPHeader, what)
}

/// A whole head: the header, its length, how its body is framed, whether the connection may
/// be used again.
struct Parsed {
    head: ResponseHeader,
    len: usize,
    framing: Framing,
    reusable: bool,
}

/// A Content-Length as Pingora reads one: digits only, identical values repeated (also
/// comma-joined) allowed.
fn content_length(value: &[u8], known: Option<u64>) -> Result<u64> {
    let mut found = known;
    for item in value.split(|b| *b == b',') {
        let item = item.trim_ascii();
        if item.is_empty() || !item.iter().all(u8::is_ascii_digit) {
            return Err(invalid("a bad Content-Length"));
        }
        let n: u64 = std::str::from_utf8(item)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| invalid("a bad Content-Length"))?;
        if found.is_some_and(|f| f != n) {
            return Err(invalid("conflicting Content-Lengths"));
        }
        found = Some(n);
    }
    found.ok_or_else(|| invalid("an empty Content-Length"))
}

/// The answer's head, once whole; `Err` when it is not HTTP. As lenient as Pingora's client
/// (spaces before a colon, folded lines), so both exchanges settle the same answer alike.
fn parse_head(buf: &[u8]) -> Result<Option<Parsed>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    let mut config = httparse::ParserConfig::default();
    config
        .allow_spaces_after_header_name_in_responses(true)
        .allow_obsolete_multiline_headers_in_responses(true);
    let len = match config.parse_response(&mut parsed, buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(invalid("an answer that is not HTTP")),
    };
    let status = parsed.code.ok_or_else(|| invalid("no status"))?;
    let mut head = ResponseHeader::build(status, Some(parsed.headers.len()))?;
    let (mut length, mut chunked, mut encoded) = (None::<u64>, false, false);
    let mut reusable = parsed.version == Some(1);
    for header in parsed.headers.iter() {
        let (name, value) = (header.name, header.value);
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(content_length(value, length)?);
        }
        if name.eq_ignore_ascii_case("transfer-encoding") {
            encoded = true;
            chunked = value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        }
        if name.eq_ignore_ascii_case("connection")
            && value
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
        {
            reusable = false;
        }
        if value.iter().any(|b| matches!(b, b'\r' | b'\n')) {
            // A folded line (obs-fold): its line breaks read as spaces (RFC 9112, 5.2).
            let unfolded: Vec<u8> = value
                .iter()
                .map(|b| if matches!(b, b'\r' | b'\n') { b' ' } else { *b })
                .collect();
            head.append_header(name.to_owned(), unfolded.as_slice())?;
        } else {
            head.append_header(name.to_owned(), value)?;
        }
    }
    let framing = match (status, encoded, chunked, length) {
        (101, ..) => Framing::UntilClose,
        (100..=199 | 204 | 304, ..) => Framing::Empty,
        (_, true, true, _) => Framing::Chunked,
        (_, true, false, _) => Framing::UntilClose,
        (_, false, _, Some(n)) => Framing::Length(n),
        (_, false, _, None) => Framing::UntilClose,
    };
    reusable &= framing != Framing::UntilClose;
    Ok(Some(Parsed {
        head,
        len,
        framing,
        reusable,
    }))
}

impl Answer {
    /// The backend's head (not a `1xx`).
    pub fn header(&self) -> &ResponseHeader {
        &self.head
    }

    /// The answer's head, to be made what the gateway relays (in place: not copied).
    pub fn header_mut(&mut self) -> &mut ResponseHeader {
        &mut self.head
    }

    /// Writes the head (as [`Answer::header_mut`] left it) with the body's framing to the
    /// buyer, then the body as it comes; the connection goes back to this thread's idle list
    /// once the body was read whole. `close`: the buyer's connection ends after it. Whether the
    /// buyer's connection may be kept.
    pub async fn relay(mut self, buyer: &mut Stream, close: bool) -> bool {
        let until_close = self.framing == Framing::UntilClose;
        let close = close || until_close;
        let mut out = head_bytes(&self.head, self.framing, close);
        // Whether the body was read whole and written.
        let relayed = match self.framing {
            Framing::Empty => buyer.write_all(&out).await.is_ok(),
            Framing::Length(n) => {
                let now = (self.buf.len() as u64).min(n) as usize;
                out.extend_from_slice(&self.buf.split_to(now));
                self.copy(buyer, out, Some(n - now as u64)).await
            }
            Framing::Chunked => self.copy_chunked(buyer, out).await,
            Framing::UntilClose => {
                out.extend_from_slice(&self.buf.split());
                self.copy(buyer, out, None).await
            }
        };
        let sent = relayed && buyer.flush().await.is_ok();
        // Anything past the body is not an answer to anything: that connection is not reused.
        if relayed && self.reusable && self.buf.is_empty() {
            put_idle(self.addr, self.conn);
        }
        sent && !close
    }

    /// Reads more of the body into `buf`; `false` at its end, on an error or after the read
    /// timeout.
    async fn read_more(&mut self) -> bool {
        self.buf.reserve(8 * 1024);
        matches!(timeout(self.read_timeout, self.conn.read_buf(&mut self.buf)).await, Ok(Ok(n)) if n > 0)
    }

    /// Writes `out`, then `left` more bytes of body (`None`: until the backend closes).
    /// Whether the body was read whole and written.
    async fn copy(&mut self, buyer: &mut Stream, out: Vec<u8>, left: Option<u64>) -> bool {
        if buyer.write_all(&out).await.is_err() {
            return false;
        }
        let mut left = left;
        loop {
            if left == Some(0) {
                return true;
            }
            if !self.read_more().await {
                return left.is_none();
            }
            let now = left.map_or(self.buf.len(), |l| (self.buf.len() as u64).min(l) as usize);
            let chunk = self.buf.split_to(now);
            left = left.map(|l| l - now as u64);
            if buyer.write_all(&chunk).await.is_err() {
                return false;
            }
        }
    }

    /// Relays a chunked body as it was sent (its end found by [`chunked::Scan`]).
    async fn copy_chunked<W: tokio::io::AsyncWrite + Unpin>(
        &mut self,
        buyer: &mut W,
        mut out: Vec<u8>,
    ) -> bool {
        let mut scan = chunked::Scan::default();
        loop {
            let (used, end) = match scan.feed(&self.buf) {
                Ok(at) => at,
                Err(()) => {
                    // Not chunked after all: the buyer gets what came before it (the head at
                    // least), then the end of the connection.
                    let _ = buyer.write_all(&out).await;
                    return false;
                }
            };
            out.extend_from_slice(&self.buf.split_to(used));
            if buyer.write_all(&out).await.is_err() {
                return false;
            }
            out.clear();
            if end {
                return true;
            }
            if !self.read_more().await {
                return false;
            }
        }
    }
}

/// The head the buyer gets: `resp`'s status and headers, with the body's framing (its own
/// Content-Length, or chunked as the backend sent it) and `Connection: close` when it ends
/// the connection.
fn head_bytes(resp: &ResponseHeader, framing: Framing, close: bool) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(512);
    let status = resp.status;
    let reason = status.canonical_reason().unwrap_or("");
    let _ = write!(out, "HTTP/1.1 {} {reason}\r\n", status.as_u16());
    for (name, value) in resp.headers.iter() {
        // The length is written below (once); a transfer coding stays as the backend sent it
        // (the bytes are relayed as they came).
        if name == http::header::CONTENT_LENGTH {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) => {
            let _ = write!(out, "Content-Length: {n}\r\n");
        }
        Framing::Chunked | Framing::Empty | Framing::UntilClose => {}
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_framed_as_the_backend_framed_them() {
        let framing = |raw: &str| parse_head(raw.as_bytes()).unwrap().unwrap().framing;
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n"
            ),
            Framing::Chunked
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Framing::UntilClose
        );
        assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n"), Framing::UntilClose);
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(framing("HTTP/1.1 100 Continue\r\n\r\n"), Framing::Empty);
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
                .is_err()
        );
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n").is_err());
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nX-A: 1\r\n  2\r\nContent-Length: 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            framing("HTTP/1.1 101 Switching Protocols\r\n\r\n"),
            Framing::UntilClose
        );
        let reusable = |raw: &str| parse_head(raw.as_bytes()).unwrap().unwrap().reusable;
        assert!(reusable("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"));
        assert!(!reusable(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\n"
        ));
        assert!(!reusable("HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n"));
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_buyers_head_carries_its_own_framing() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("content-length", "99").unwrap();
        resp.append_header("x-a", "1").unwrap();
        let head = String::from_utf8(head_bytes(&resp, Framing::Length(2), true)).unwrap();
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\nx-a: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
    }
}
