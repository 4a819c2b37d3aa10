//! Sends an admitted purchase (one that holds a reservation) to the backend and reads the
//! backend's answer, on the gateway's own connection pool, independently of the buyer's
//! connection: whatever the buyer does meanwhile (a half-close, a reset, a pipelined byte), the
//! backend's status is read, so a 2xx confirms the reservation and a 5xx releases it. Only
//! after that does the caller relay the answer to the buyer.
//!
//! A backend that cannot be reached (every connect failed) got nothing; one that took the
//! request and then failed to answer in time may or may not hold the order ([`ForwardError`]).
//!
//! Approximation: a request sent on a pooled connection that turns out to be closed by the
//! backend (the write fails, or it closes before a single byte of answer) is sent once more on
//! a new connection. The backend's keep-alive race makes that the usual meaning; a backend that
//! took the order and then closed without answering gets it twice, with the same reservation
//! token (`jti`), which backends deduplicate on.

use super::Upstreams;
use crate::config::UpstreamSettings;
use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::http::client::HttpSession;
use std::time::Duration;

/// How long an idle forwarding connection is kept for the next purchase.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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

/// The backend's answer: the connection its response header was read from (and its body is
/// read from).
pub struct Answer {
    session: HttpSession,
    peer: Box<HttpPeer>,
}

/// Most bytes of an answer read only to keep its connection.
const DISCARD_LIMIT: usize = 1 << 20;

pub struct Forwarder {
    connector: Connector,
}

impl Default for Forwarder {
    fn default() -> Self {
        Forwarder {
            connector: Connector::new(None),
        }
    }
}

impl Forwarder {
    /// Sends `req` with `body` to a healthy backend of `settings` (another one if a connect
    /// fails, up to one try per address) and reads the response header.
    pub async fn send(
        &self,
        upstreams: &Upstreams,
        settings: &UpstreamSettings,
        req: &RequestHeader,
        body: &Bytes,
    ) -> Result<Answer, ForwardError> {
        let attempts = settings.addresses.len().max(1);
        let mut last = None;
        for _ in 0..attempts {
            let mut peer = upstreams.peer(settings).map_err(ForwardError::NotSent)?;
            peer.options.write_timeout = Some(settings.read_timeout);
            let (session, reused) = match self.connector.get_http_session(&*peer).await {
                Ok(s) => s,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match exchange(session, &peer, req, body).await {
                Ok(session) => return Ok(Answer { session, peer }),
                Err((e, nothing_read)) if reused && nothing_read => {
                    // A pooled connection the backend had closed: once more on a new one.
                    let (session, _) = self
                        .connector
                        .get_http_session(&*peer)
                        .await
                        .map_err(ForwardError::NoAnswer)?;
                    tracing::debug!(error = %e, "pooled backend connection was closed; sent again");
                    return match exchange(session, &peer, req, body).await {
                        Ok(session) => Ok(Answer { session, peer }),
                        Err((e, _)) => Err(ForwardError::NoAnswer(e)),
                    };
                }
                Err((e, _)) => return Err(ForwardError::NoAnswer(e)),
            }
        }
        Err(ForwardError::NotSent(last.unwrap_or_else(|| {
            Error::explain(ErrorType::ConnectNoRoute, "no backend could be reached")
        })))
    }
}

impl Answer {
    /// The backend's response header (not `100 Continue`).
    pub fn header(&self) -> &ResponseHeader {
        self.session
            .response_header()
            .expect("an answer is made only once its header was read")
    }

    /// The next chunk of the response body (`None` at its end).
    pub async fn body_chunk(&mut self) -> Result<Option<Bytes>> {
        self.session.read_response_body().await
    }

    /// Reads the body to its end without relaying it (at most [`DISCARD_LIMIT`] bytes), then
    /// gives the connection back to the pool; a longer or broken body closes it.
    pub async fn discard(mut self, forwarder: &Forwarder) {
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
                Err(_) => break false,
            }
        };
        self.finish(forwarder, done).await;
    }

    /// Gives the connection back to the pool (the body was read to its end), or closes it.
    pub async fn finish(self, forwarder: &Forwarder, body_done: bool) {
        if body_done {
            forwarder
                .connector
                .release_http_session(self.session, &*self.peer, Some(IDLE_TIMEOUT))
                .await;
        }
    }
}

/// Writes the request and reads the response header (skipping `100 Continue`). On failure,
/// also whether nothing at all was read back (a closed pooled connection looks like that).
async fn exchange(
    mut session: HttpSession,
    peer: &HttpPeer,
    req: &RequestHeader,
    body: &Bytes,
) -> std::result::Result<HttpSession, (Box<Error>, bool)> {
    session.set_read_timeout(peer.options.read_timeout);
    session.set_write_timeout(peer.options.write_timeout);
    let sent = async {
        session.write_request_header(Box::new(req.clone())).await?;
        if !body.is_empty() {
            session.write_request_body(body.clone(), true).await?;
        }
        session.finish_request_body().await
    };
    if let Err(e) = sent.await {
        return Err((e, true));
    }
    loop {
        if let Err(e) = session.read_response_header().await {
            let nothing_read = session.response_header().is_none()
                && matches!(
                    e.etype(),
                    ErrorType::ConnectionClosed | ErrorType::ReadError
                );
            return Err((e, nothing_read));
        }
        match session.response_header() {
            Some(h) if h.status.is_informational() && h.status.as_u16() != 101 => continue,
            Some(_) => return Ok(session),
            None => {
                return Err((
                    Error::explain(ErrorType::InvalidHTTPHeader, "no response header"),
                    true,
                ))
            }
        }
    }
}
