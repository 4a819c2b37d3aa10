//! Asks the backend whether it holds an order (`upstream.order_lookup`): `GET <path>` with the
//! reservation id; 200 means it does, 404 that it does not, anything else (or nothing within
//! `timeout_ms`) that it cannot say now. Uses Pingora's HTTP/1.1 client and connection pool, on
//! the same healthy backends as the proxy.

use crate::config::OrderLookupSettings;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;
use std::net::SocketAddr;
use std::time::Duration;

crate::label_enum! {
    /// The backend's answer about one order (the `result` label of
    /// `flashgate_order_lookups_total`).
    pub enum Answer {
        /// 200: the backend holds the order; the reservation is confirmed.
        Found => "found",
        /// 404: it does not; the reservation is released.
        NotFound => "not_found",
        /// Any other status, an error, or no answer in time: kept pending, asked again.
        Unanswered => "unanswered",
    }
}

/// How long an idle lookup connection is kept for the next lookup.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

pub struct OrderLookup {
    connector: Connector,
}

impl Default for OrderLookup {
    fn default() -> Self {
        OrderLookup {
            connector: Connector::new(None),
        }
    }
}

impl OrderLookup {
    /// Asks `backend` about reservation `jti`.
    pub async fn ask(
        &self,
        backend: SocketAddr,
        settings: &OrderLookupSettings,
        jti: &str,
    ) -> Answer {
        match tokio::time::timeout(settings.timeout, self.request(backend, settings, jti)).await {
            Ok(Ok(200)) => Answer::Found,
            Ok(Ok(404)) => Answer::NotFound,
            Ok(Ok(status)) => {
                tracing::debug!(jti, status, "order lookup answered neither 200 nor 404");
                Answer::Unanswered
            }
            Ok(Err(e)) => {
                tracing::debug!(jti, error = %e, "order lookup failed");
                Answer::Unanswered
            }
            Err(_) => Answer::Unanswered,
        }
    }

    async fn request(
        &self,
        backend: SocketAddr,
        settings: &OrderLookupSettings,
        jti: &str,
    ) -> pingora::Result<u16> {
        let mut peer = HttpPeer::new(backend, false, String::new());
        peer.options.connection_timeout = Some(settings.timeout);
        peer.options.read_timeout = Some(settings.timeout);
        let (mut session, _reused) = self.connector.get_http_session(&peer).await?;
        let mut req = RequestHeader::build("GET", settings.path_for(jti).as_bytes(), None)?;
        req.insert_header(http::header::HOST, backend.to_string())?;
        req.insert_header(http::header::ACCEPT, "application/json")?;
        session.write_request_header(Box::new(req)).await?;
        session.finish_request_body().await?;
        session.read_response_header().await?;
        let status = session.response_header().map_or(0, |h| h.status.as_u16());
        // Read the body to the end so the connection can serve the next lookup.
        while session.read_response_body().await?.is_some() {}
        self.connector
            .release_http_session(session, &peer, Some(IDLE_TIMEOUT))
            .await;
        Ok(status)
    }
}
