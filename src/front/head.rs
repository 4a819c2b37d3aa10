//! Reading a request's head off the connection, for the front: bytes gathered until the head is
//! whole, then parsed (httparse) into the `RequestHeader` the gateway's rules read. Only what
//! can be read plainly is parsed; anything else is left, unread, to Pingora's parser and the
//! proxy's rules.

use bytes::BytesMut;
use pingora::http::RequestHeader;
use pingora::protocols::Stream;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::time::Instant;

/// Most headers the front parses; a request with more is left to Pingora (which allows 256).
const MAX_HEADERS: usize = 64;
/// Most bytes of head the front gathers; a longer head is left to Pingora's own limit.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a connection may wait for its next request, and a request take to send its head:
/// Pingora's keep-alive default.
pub const IDLE: Duration = Duration::from_secs(60);

/// What the front read.
pub enum Read {
    /// The client closed, sent nothing in time, or the gateway is closing an idle connection.
    Closed,
    /// A whole head, `len` bytes, parsed plainly; `close`: the client asked to close the
    /// connection after its answer (`Connection: close`).
    Plain {
        req: Box<RequestHeader>,
        len: usize,
        close: bool,
    },
    /// Bytes the front does not judge (see [`plain`]): for the proxy, as they are.
    Other,
}

/// What a connection waits with, made once per connection rather than once per request: the
/// deadline's timer (re-armed only when it fires early) and the service's closing.
pub struct Waits {
    timer: Pin<Box<tokio::time::Sleep>>,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Waits {
    pub fn new(mut closing: watch::Receiver<bool>) -> Waits {
        Waits {
            timer: Box::pin(tokio::time::sleep(IDLE)),
            closed: Box::pin(async move {
                // The sender lives as long as the service: an error is the service gone.
                let _ = closing.wait_for(|c| *c).await;
            }),
        }
    }
}

/// Reads until `buf` holds a whole head (bytes after it, if any, stay in `buf`). An idle
/// connection (nothing read yet) ends when the service closes; a head must be whole within
/// [`IDLE`] of the front starting to wait for it.
pub async fn read(stream: &mut Stream, buf: &mut BytesMut, waits: &mut Waits) -> Read {
    let deadline = Instant::now() + IDLE;
    loop {
        if !buf.is_empty() {
            match parse(buf) {
                Parsed::Partial if buf.len() < MAX_HEAD_BYTES => {}
                Parsed::Partial | Parsed::Other => return Read::Other,
                Parsed::Plain(req, len, close) => return Read::Plain { req, len, close },
            }
        }
        let idle = buf.is_empty();
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(2048);
        }
        let got = tokio::select! {
            got = stream.read_buf(buf) => got,
            () = waits.timer.as_mut() => {
                // The timer runs from an earlier wait: re-armed for this one, or it is due.
                if Instant::now() >= deadline {
                    return Read::Closed;
                }
                waits.timer.as_mut().reset(deadline);
                continue;
            }
            () = waits.closed.as_mut(), if idle => return Read::Closed,
        };
        match got {
            Ok(0) if idle => return Read::Closed,
            // Half a head, then the end: the proxy answers what it makes of it.
            Ok(0) => return Read::Other,
            Ok(_) => {}
            Err(_) => return Read::Closed,
        }
    }
}

enum Parsed {
    Partial,
    Other,
    Plain(Box<RequestHeader>, usize, bool),
}

fn parse(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => match plain(&parsed) {
            Some((req, close)) => Parsed::Plain(Box::new(req), len, close),
            None => Parsed::Other,
        },
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(_) => Parsed::Other,
    }
}

/// The head as a `RequestHeader`, if it is plain: HTTP/1.1, no body (no `Transfer-Encoding`,
/// no Content-Length but 0), no `Expect` or `Upgrade`, a `Connection` of `close` or
/// `keep-alive` only (the proxy's session keeps every other rule), and a method and target
/// Pingora's own parser takes. With it, whether the client asked to close.
fn plain(parsed: &httparse::Request<'_, '_>) -> Option<(RequestHeader, bool)> {
    if parsed.version != Some(1) {
        return None;
    }
    let (method, path) = (parsed.method?, parsed.path?);
    // Origin-form only: an absolute-form target's authority is Pingora's to judge.
    if !path.starts_with('/') {
        return None;
    }
    let mut req =
        RequestHeader::build_no_case(method, path.as_bytes(), Some(parsed.headers.len())).ok()?;
    let mut close = false;
    for header in parsed.headers.iter() {
        let (name, value) = (header.name, header.value);
        let refused = ["transfer-encoding", "expect", "upgrade"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n));
        let with_body = name.eq_ignore_ascii_case("content-length") && value != b"0";
        if refused || with_body {
            return None;
        }
        if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if !value.eq_ignore_ascii_case(b"keep-alive") {
                return None;
            }
        }
        let name = http::header::HeaderName::from_bytes(name.as_bytes()).ok()?;
        req.append_header(name, value).ok()?;
    }
    // Pingora refuses an ambiguous authority (two `Host`s, userinfo) when it reads the head:
    // such a head must reach it undecided, or a purchase judged here would never be carried on.
    pingora::protocols::http::authority::validate_request_authority(&req).ok()?;
    Some((req, close))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Option<RequestHeader> {
        match parse(raw.as_bytes()) {
            Parsed::Plain(req, len, _) => {
                assert_eq!(len, raw.len());
                Some(*req)
            }
            _ => None,
        }
    }

    #[test]
    fn a_plain_head_is_parsed_with_its_headers() {
        let req = parsed("POST /api/seckill/a/buy?qty=2 HTTP/1.1\r\nHost: x\r\nX-User-Id: u1\r\nContent-Length: 0\r\n\r\n")
            .expect("plain");
        assert_eq!(req.method, http::Method::POST);
        assert_eq!(req.raw_path(), b"/api/seckill/a/buy?qty=2");
        assert_eq!(req.headers.get("x-user-id").unwrap(), "u1");
    }

    /// Everything the front does not judge is left to the proxy's session, whose rules refuse
    /// or forward it: a body, chunked framing, a smuggling shape, an old protocol, `Expect`,
    /// `Upgrade`, `Connection`, an unparseable head.
    #[test]
    fn anything_not_plain_is_left_to_the_proxy() {
        for raw in [
            "POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST /b HTTP/1.1\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /b HTTP/1.1\r\nContent-Length: 0, 0\r\n\r\n",
            "POST /b HTTP/1.0\r\n\r\n",
            "POST /b HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET /b HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            "POST /b HTTP/1.1\r\nConnection: upgrade\r\n\r\n",
            "POST /b HTTP/1.1\r\nConnection: close, x-secret\r\n\r\n",
            "POST /b HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "POST /b HTTP/1.1\r\nX: \x01\r\n\r\n",
            "POST /b HTTP/1.1\r\n folded: x\r\n\r\n",
            "POST /b HTTP/1.1\r\nHost: x\r\nHost: x\r\n\r\n",
            "POST /b HTTP/1.1\r\nHost: u@x\r\n\r\n",
            "POST http://x/b HTTP/1.1\r\nHost: x\r\n\r\n",
            "POST http://a@x/b HTTP/1.1\r\nHost: x\r\n\r\n",
            "POST HTTP://X/b HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            assert!(parsed(raw).is_none(), "{raw:?} was judged by the front");
        }
    }

    #[test]
    fn connection_close_is_read_and_kept() {
        let raw = b"POST /b HTTP/1.1\r\nConnection: Close\r\n\r\n";
        assert!(matches!(parse(raw), Parsed::Plain(_, _, true)));
        let raw = b"POST /b HTTP/1.1\r\nConnection: keep-alive\r\n\r\n";
        assert!(matches!(parse(raw), Parsed::Plain(_, _, false)));
    }

    #[test]
    fn a_partial_head_waits_for_more() {
        assert!(matches!(
            parse(b"POST /b HTTP/1.1\r\nHost: x\r\n"),
            Parsed::Partial
        ));
    }
}
