//! The Pingora `ProxyHttp` implementation: glue only. Each phase hands its work to the module that
//! owns it (admission, reservation signing, compensation) and records per-request facts in
//! [`RequestCtx`]; metrics and the decision log are written once, in `logging`.

mod respond;
pub mod upstream;

use crate::admission::{BadRequest, Decision, SaleFacts};
use crate::decision_log;
use crate::gateway::Gateway;
use crate::metrics::{ReleaseReason, UpstreamClass, UNKNOWN_ACTIVITY_LABEL};
use crate::reservation::Reservation;
use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use std::sync::Arc;
use std::time::Instant;

/// Response header telling the buyer which reservation they won.
pub const RESERVATION_ID_HEADER: &str = "x-flashgate-reservation-id";

/// Per-request facts, from the first phase to `logging`.
pub struct RequestCtx {
    started: Instant,
    /// Set on sale routes only.
    sale: Option<SaleFacts>,
    /// The final decision on a sale route (the buyer's answer).
    decision: Option<Decision>,
    /// Stock held for this request until it is forwarded or released.
    reservation: Option<Reservation>,
    /// The signed reservation, made once even if the upstream request is retried.
    token: Option<String>,
    /// Why the reservation was given back, if it was.
    released: Option<ReleaseReason>,
    /// Status of the upstream's response header, once received.
    upstream_status: Option<u16>,
    /// Whether an upstream was chosen (so a failure counts as an upstream error).
    upstream_attempted: bool,
    connect_failures: usize,
    /// Request body bytes seen so far (sale routes).
    body_bytes: u64,
    /// The body outgrew `server.max_sale_body_bytes` while streaming.
    body_too_large: bool,
}

/// Whether a sale request is too large to consider: its headers, or its declared body (a
/// malformed Content-Length counts as too large). Chunked bodies are counted as they stream.
fn oversized(req: &RequestHeader, limits: &crate::config::ServerSettings) -> Option<BadRequest> {
    let header_bytes: u64 = req
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().len() + v.len()) as u64)
        .sum();
    if header_bytes > limits.max_sale_header_bytes {
        return Some(BadRequest::HeadersTooLarge);
    }
    let length = req.headers.get(http::header::CONTENT_LENGTH)?;
    let length = length
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    (length > limits.max_sale_body_bytes).then_some(BadRequest::BodyTooLarge)
}

pub struct FlashProxy {
    gw: Arc<Gateway>,
}

impl FlashProxy {
    pub fn new(gw: Arc<Gateway>) -> Self {
        FlashProxy { gw }
    }
}

#[async_trait]
impl ProxyHttp for FlashProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            started: Instant::now(),
            sale: None,
            decision: None,
            reservation: None,
            token: None,
            released: None,
            upstream_status: None,
            upstream_attempted: false,
            connect_failures: 0,
            body_bytes: 0,
            body_too_large: false,
        }
    }

    /// No downstream modules: flashgate does not compress, and each module costs every request.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let req = session.req_header();
        let Some((route, raw_activity)) = self.gw.admission.sale_route(req) else {
            return Ok(false);
        };
        let facts = ctx.sale.insert(SaleFacts::default());
        if let Some(too_large) = oversized(req, &self.gw.settings.server) {
            let decision = Decision::BadRequest(too_large);
            ctx.decision = Some(decision);
            respond::decision(session, &decision).await?;
            return Ok(true);
        }
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        match self
            .gw
            .admission
            .admit(req, route, raw_activity, peer, facts)
            .await
        {
            Ok(reservation) => {
                ctx.reservation = Some(reservation);
                ctx.decision = Some(Decision::Admitted);
                #[cfg(feature = "fault-injection")]
                if self.gw.fault == Some(crate::gateway::Fault::HangAfterReserve) {
                    std::future::pending::<()>().await;
                }
                Ok(false)
            }
            Err(decision) => {
                ctx.decision = Some(decision);
                respond::decision(session, &decision).await?;
                Ok(true)
            }
        }
    }

    /// A sale route's body without a Content-Length (chunked) is counted as it streams.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if ctx.sale.is_none() {
            return Ok(());
        }
        ctx.body_bytes += body.as_ref().map_or(0, |b| b.len() as u64);
        if ctx.body_bytes > self.gw.settings.server.max_sale_body_bytes {
            ctx.body_too_large = true;
            return Error::e_explain(ErrorType::InvalidHTTPHeader, "sale request body too large");
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        ctx.upstream_attempted = true;
        self.gw.upstreams.peer()
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Nothing reached that backend: trying another one is safe even for a purchase.
        ctx.connect_failures += 1;
        e.set_retry(ctx.connect_failures < self.gw.upstreams.len());
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let header = &self.gw.settings.signing.header;
        // The upstream never sees a reservation the gateway did not make, on any route.
        upstream_request.remove_header(header);
        if let Some(reservation) = &ctx.reservation {
            if ctx.token.is_none() {
                let token = self.gw.signer.sign(reservation).map_err(|e| {
                    Error::because(ErrorType::InternalError, "signing the reservation", e)
                })?;
                ctx.token = Some(token);
            }
            if let Some(token) = &ctx.token {
                upstream_request.insert_header(header.clone(), token.as_str())?;
            }
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream_response.status.as_u16();
        if upstream_response.status.is_informational() {
            return Ok(());
        }
        ctx.upstream_status = Some(status);
        let Some(reservation) = &ctx.reservation else {
            return Ok(());
        };
        if status >= 500 {
            // Fail the request so `fail_to_proxy` releases the stock and answers `unavailable`.
            return Error::e_explain(
                ErrorType::HTTPStatus(status),
                "upstream answered 5xx to a reservation",
            );
        }
        if upstream_response.status.is_success() && self.gw.confirms_on_upstream(reservation) {
            self.gw.lifecycle.confirm_in_background(reservation.clone());
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(reservation) = &ctx.reservation {
            upstream_response.insert_header(RESERVATION_ID_HEADER, reservation.id.as_str())?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let upstream_accepted = ctx.upstream_status.is_some_and(|s| s < 500);
        let Some(reservation) = ctx.reservation.as_ref().filter(|_| !upstream_accepted) else {
            return respond::proxy_error(session, e).await;
        };
        let (reason, decision) = if ctx.body_too_large {
            (
                ReleaseReason::BadRequest,
                Decision::BadRequest(BadRequest::BodyTooLarge),
            )
        } else if *e.esource() == ErrorSource::Downstream {
            // The buyer's own request broke (a malformed or cut-off body).
            (
                ReleaseReason::BadRequest,
                Decision::BadRequest(BadRequest::MalformedBody),
            )
        } else if ctx.upstream_status.is_some() {
            (ReleaseReason::Upstream5xx, Decision::Unavailable)
        } else {
            (ReleaseReason::UpstreamError, Decision::Unavailable)
        };
        match self.gw.lifecycle.release_failed(reservation, reason).await {
            Ok(_) => ctx.released = Some(reason),
            // Still pending in Redis: it will be released when its hold expires.
            Err(err) => tracing::error!(reservation = %reservation.id, error = %err,
                "could not release the reservation of a failed upstream request"),
        }
        ctx.decision = Some(decision);
        let code = respond::decision(session, &decision)
            .await
            .map_or(0, |_| decision.reply().status.as_u16());
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, _session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let metrics = &self.gw.metrics;
        if ctx.upstream_attempted {
            let class = match ctx.upstream_status {
                Some(status) => UpstreamClass::from_status(status),
                None => UpstreamClass::Error,
            };
            metrics
                .upstream_responses
                .with_label_values(&[class.as_str()])
                .inc();
        }
        let (Some(facts), Some(decision)) = (&ctx.sale, ctx.decision) else {
            return;
        };
        let activity = facts
            .activity
            .as_ref()
            .map_or(UNKNOWN_ACTIVITY_LABEL, |a| &a.id);
        metrics
            .decisions
            .with_label_values(&[activity, decision.code()])
            .inc();
        decision_log::record(&decision_log::Entry {
            activity,
            facts,
            decision,
            reservation: ctx.reservation.as_ref(),
            released: ctx.released,
            upstream_status: ctx.upstream_status,
            error: e,
            elapsed: ctx.started.elapsed(),
        });
    }
}
