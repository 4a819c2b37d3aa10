//! The answer's body read as data, for a caller that frames it itself (Pingora's session
//! relaying to a buyer over any protocol): the backend's framing undone (a length, chunks, or
//! until the connection ends), then the connection given back to the idle list when the body
//! was read whole.

use super::{put_idle, Answer, Framing};
use bytes::{Buf, Bytes};

/// Most bytes of an answer read only to keep its connection.
const DISCARD_LIMIT: usize = 1 << 20;

/// Where the reading of a body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Reading {
    /// Nothing read yet: the framing decides.
    #[default]
    Start,
    /// This many bytes left of a `Content-Length` body.
    Length(u64),
    /// A chunk's size line next.
    Size,
    /// This many bytes left of a chunk.
    Chunk(u64),
    /// The CRLF that ends a chunk's data.
    ChunkEnd,
    /// Trailer lines (dropped) up to the empty line.
    Trailers,
    /// Until the backend closes.
    UntilClose,
    /// Read whole.
    Done,
}

/// The body broke off (the connection ended early, a read timed out, or the chunks were not
/// chunks).
#[derive(Debug)]
pub struct BodyBroke;

impl Answer {
    /// The next piece of the body (`None` at its end), its framing undone.
    pub async fn body_chunk(&mut self) -> Result<Option<Bytes>, BodyBroke> {
        loop {
            match self.reading {
                Reading::Start => {
                    self.reading = match self.framing {
                        Framing::Empty => Reading::Done,
                        Framing::Length(n) => Reading::Length(n),
                        Framing::Chunked => Reading::Size,
                        Framing::UntilClose => Reading::UntilClose,
                    }
                }
                Reading::Done => return Ok(None),
                Reading::Length(0) => self.reading = Reading::Done,
                Reading::Chunk(0) => self.reading = Reading::ChunkEnd,
                Reading::Length(left) | Reading::Chunk(left) => {
                    if self.buf.is_empty() && !self.read_more().await {
                        return Err(BodyBroke);
                    }
                    let now = (self.buf.len() as u64).min(left) as usize;
                    self.reading = match self.reading {
                        Reading::Length(_) => Reading::Length(left - now as u64),
                        _ => Reading::Chunk(left - now as u64),
                    };
                    return Ok(Some(self.buf.split_to(now).freeze()));
                }
                Reading::UntilClose => {
                    if self.buf.is_empty() && !self.read_more().await {
                        self.reading = Reading::Done;
                        return Ok(None);
                    }
                    return Ok(Some(self.buf.split().freeze()));
                }
                Reading::Size => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.buf.advance(used);
                        self.reading = match size {
                            0 => Reading::Trailers,
                            n => Reading::Chunk(n),
                        };
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < 1024 => {
                        if !self.read_more().await {
                            return Err(BodyBroke);
                        }
                    }
                    _ => return Err(BodyBroke),
                },
                Reading::ChunkEnd => {
                    if self.buf.len() < 2 {
                        if !self.read_more().await {
                            return Err(BodyBroke);
                        }
                        continue;
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(BodyBroke);
                    }
                    self.buf.advance(2);
                    self.reading = Reading::Size;
                }
                Reading::Trailers => match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(0) => {
                        self.buf.advance(2);
                        self.reading = Reading::Done;
                    }
                    Some(at) => self.buf.advance(at + 2),
                    None if self.buf.len() < super::MAX_HEAD_BYTES => {
                        if !self.read_more().await {
                            return Err(BodyBroke);
                        }
                    }
                    None => return Err(BodyBroke),
                },
            }
        }
    }

    /// Reads the body to its end without relaying it (at most 1 MiB), then gives the
    /// connection back; a longer or broken body closes it.
    pub async fn discard(mut self) {
        let mut read = 0;
        let done = loop {
            match self.body_chunk().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    if read > DISCARD_LIMIT {
                        break false;
                    }
                }
                Ok(None) => break true,
                Err(BodyBroke) => break false,
            }
        };
        self.finish(done);
    }

    /// Gives the connection back to the idle list if the body was read whole (`body_done`)
    /// and the backend lets it be used again; else closes it.
    pub fn finish(self, body_done: bool) {
        let whole = body_done && self.reading == Reading::Done;
        if whole && self.reusable && self.buf.is_empty() {
            put_idle(self.addr, self.conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// The body `raw` (after a head framed `head`) as a caller of `body_chunk` reads it.
    async fn read_body(head: &str, raw: &'static [u8]) -> Result<Vec<u8>, BodyBroke> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let head = head.to_owned();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut req).await;
            conn.write_all(head.as_bytes()).await.unwrap();
            // In two writes, so a piece may end anywhere.
            let (a, b) = raw.split_at(raw.len() / 2);
            conn.write_all(a).await.unwrap();
            conn.flush().await.unwrap();
            conn.write_all(b).await.unwrap();
        });
        let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut answer = super::super::exchange(
            conn,
            addr,
            std::time::Duration::from_secs(5),
            b"GET / HTTP/1.1\r\n\r\n",
        )
        .await
        .map_err(|_| BodyBroke)?;
        let mut out = Vec::new();
        while let Some(piece) = answer.body_chunk().await? {
            out.extend_from_slice(&piece);
        }
        server.await.unwrap();
        Ok(out)
    }

    #[tokio::test]
    async fn bodies_are_read_as_data_whatever_their_framing() {
        let body = read_body("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"hello")
            .await
            .unwrap();
        assert_eq!(body, b"hello");
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let body = read_body(
            chunked,
            b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-T: 1\r\n\r\n",
        )
        .await
        .unwrap();
        assert_eq!(body, b"hello, world");
        let body = read_body(
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
            b"to the end",
        )
        .await
        .unwrap();
        assert_eq!(body, b"to the end");
        let body = read_body("HTTP/1.1 204 No Content\r\n\r\n", b"")
            .await
            .unwrap();
        assert!(body.is_empty());
    }

    #[tokio::test]
    async fn a_body_cut_short_or_not_chunked_is_broken() {
        let short = read_body("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", b"hello").await;
        assert!(short.is_err());
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(read_body(chunked, b"zz\r\nhello\r\n0\r\n\r\n")
            .await
            .is_err());
        assert!(read_body(chunked, b"5\r\nhelloXX0\r\n\r\n").await.is_err());
    }
}
