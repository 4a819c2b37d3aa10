//! The front: the first reader of every buyer's connection, ahead of Pingora's HTTP session.
//!
//! A refusal the gateway decides alone (sold out from the cache, a bucket, the hours, an
//! unknown activity, a refusal the reserve script decided, a halt) needs nothing of an HTTP
//! session but the request's head and one write. The front reads each request's head itself
//! ([`head`]); a plain purchase is judged by the proxy's one call for it
//! (`FlashProxy::early`), and a refusal is written from its bytes in one write. A plain
//! purchase that holds stock is forwarded by the front too (`FlashProxy::forward_early`, on
//! the gateway's own backend connections) and its answer relayed on the buyer's connection.
//! Every other request, and every purchase that waits in the queue or is forwarded
//! unreserved, goes to Pingora's proxy unchanged: the bytes the front read become the session's pipelined
//! prefix (Pingora parses them as if it had read them), with the front's decision, if it took
//! one, as the connection's user context, which the proxy carries on from. When the proxy is
//! done and the connection may be reused, the front reads the next request.
//!
//! Every edge rule stays where it was: the front judges only heads it can read plainly and
//! leaves anything else (a body, odd framing, an old protocol, a head it cannot parse) to
//! Pingora's parser and the proxy's `request_filter`, which refuse it.

pub mod head;

use crate::proxy::early::Early;
use crate::proxy::FlashProxy;
use async_trait::async_trait;
use bytes::{Buf, BytesMut};
use head::Read;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// Bytes a connection's read buffer starts with (a purchase's head is a few hundred).
const BUFFER_BYTES: usize = 2048;

pub struct Front {
    /// Judges plain purchases (the same proxy the sessions run).
    judge: FlashProxy,
    /// Everything else.
    proxy: Arc<HttpProxy<FlashProxy>>,
    /// Turned true when the service stops: idle connections waiting for a request end.
    closing: watch::Sender<bool>,
}

impl Front {
    pub fn new(judge: FlashProxy, proxy: HttpProxy<FlashProxy>) -> Front {
        Front {
            judge,
            proxy: Arc::new(proxy),
            closing: watch::Sender::new(false),
        }
    }

    /// Hands one request to the proxy (the bytes read so far first), with the front's decision;
    /// the connection back when the proxy is done and it may be reused.
    async fn hand_over(
        &self,
        stream: Stream,
        buf: BytesMut,
        decided: Option<Box<crate::proxy::early::Decided>>,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let mut session = ServerSession::new_http1(stream);
        // As Pingora's own connection loop: no reuse once the service is stopping.
        session.set_keepalive((!*shutdown.borrow()).then_some(head::IDLE.as_secs()));
        if let ServerSession::H1(h1) = &mut session {
            if !buf.is_empty() {
                h1.set_pipelined_prefix(buf);
            }
        }
        if let Some(decided) = decided {
            session.set_connection_user_context(Some(decided));
        }
        let reused = self.proxy.process_new_http(session, shutdown).await?;
        // The proxy never turns pipelining on, so nothing it read past the request is left.
        Some(reused.consume().0)
    }
}

#[async_trait]
impl ServerApp for Front {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let mut waits = head::Waits::new(self.closing.subscribe());
        let mut buf = BytesMut::with_capacity(BUFFER_BYTES);
        loop {
            let (req, len, close) = match head::read(&mut stream, &mut buf, &mut waits).await {
                Read::Closed => return None,
                Read::Other => {
                    stream = self.hand_over(stream, buf.split(), None, shutdown).await?;
                    continue;
                }
                Read::Plain { req, len, close } => (req, len, close),
            };
            let close_after = close || *shutdown.borrow();
            match self.judge.early(&req, peer, close_after).await {
                Early::Answer(bytes) => {
                    let written = stream.write_all(&bytes).await;
                    if written.is_err() || stream.flush().await.is_err() || close_after {
                        return None;
                    }
                    buf.advance(len);
                }
                Early::Forward(decided) => {
                    let judge = &self.judge;
                    if !judge
                        .forward_early(&mut stream, req, peer, decided, close_after)
                        .await
                    {
                        return None;
                    }
                    buf.advance(len);
                }
                Early::HandOver(decided) => {
                    // This request's bytes only (it has no body): what a client sent after it
                    // stays here, for the next turn of the loop.
                    let this = buf.split_to(len);
                    stream = self.hand_over(stream, this, decided, shutdown).await?;
                }
            }
        }
    }

    async fn cleanup(&self) {
        self.closing.send_replace(true);
        self.proxy.http_cleanup().await;
    }
}
