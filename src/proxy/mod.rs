//! The Pingora `ProxyHttp` implementation: glue only. Each phase hands its work to the module that
//! owns it (admission, reservation signing, compensation) and records per-request facts in
//! [`RequestCtx`]; metrics and the decision log are written once, in `logging`.

pub mod queue;
mod respond;

use crate::admission::{sale_route, Admitted, BadRequest, Decision, SaleFacts};
use crate::config::ConfirmMode;
use crate::decision_log;
use crate::gateway::Gateway;
use crate::live::Generation;
use crate::metrics::{ReleaseReason, UpstreamClass, UNKNOWN_ACTIVITY_LABEL};
use crate::reservation::Reservation;
use crate::stock::ReleaseOutcome;
use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use std::sync::Arc;
use std::time::Instant;

/// Response header telling the buyer which reservation they won.
pub const RESERVATION_ID_HEADER: &str = "x-flashgate-reservation-id";

/// Request header marking a sale request forwarded without a reservation (the store was down
/// and the activity is `on_store_failure: passthrough`): the backend's own stock check decides.
pub const PASSTHROUGH_HEADER: &str = "x-flashgate-passthrough";
/// Its value: why no reservation was made.
pub const PASSTHROUGH_VALUE: &str = "store-unavailable";

/// Per-request facts, from the first phase to `logging`.
pub struct RequestCtx {
    started: Instant,
    /// The configuration this request runs under, from its first phase to its last.
    generation: Arc<Generation>,
    /// Set on sale routes only.
    sale: Option<SaleFacts>,
    /// The final decision on a sale route (the buyer's answer).
    decision: Option<Decision>,
    /// Stock held for this request until it is forwarded or released.
    reservation: Option<Reservation>,
    /// Counts `reservation` in `flashgate_reservations_in_flight` while the request lives.
    in_flight: Option<InFlight>,
    /// Forwarded unreserved because the store is down (`on_store_failure: passthrough`).
    passthrough: bool,
    /// The request's slot at the backend (upstream protection), given back when it ends.
    slot: Option<queue::Slot>,
    /// The signed reservation, made once even if the upstream request is retried.
    token: Option<String>,
    /// Why the reservation was given back, if it was.
    released: Option<ReleaseReason>,
    /// Status of the upstream's response header, once received.
    upstream_status: Option<u16>,
    /// Whether an upstream was chosen (so a failure counts as an upstream error).
    upstream_attempted: bool,
    /// The reservation was put on a request to the backend: from here on the backend may hold
    /// the order, so no buyer-side event (hanging up, a broken body) may give the units back.
    forwarded: bool,
    connect_failures: usize,
}

/// Reads a sale request's whole body into Pingora's retry buffer (from which the proxy sends it
/// upstream), within `deadline` and `limit` bytes. Answers `100 Continue` to a client that
/// waits for it.
async fn read_sale_body(
    session: &mut Session,
    limit: u64,
    deadline: std::time::Duration,
) -> std::result::Result<(), BadRequest> {
    if session.as_mut().is_body_empty() {
        return Ok(());
    }
    session.as_mut().enable_retry_buffering();
    let read = async {
        let expects_continue = session
            .req_header()
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if expects_continue {
            session
                .as_mut()
                .write_continue_response()
                .await
                .map_err(|_| BadRequest::MalformedBody)?;
        }
        let mut read = 0u64;
        while let Some(chunk) = session
            .read_request_body()
            .await
            .map_err(|_| BadRequest::MalformedBody)?
        {
            read += chunk.len() as u64;
            if read > limit {
                return Err(BadRequest::BodyTooLarge);
            }
        }
        Ok(())
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(BadRequest::BodyTooSlow))
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

    /// Gives a request's reservation back under the activity it was admitted with, if this
    /// request made it and it is still pending; `None` if it stays as it is (a replayed or
    /// confirmed reservation, or Redis unreachable: released when its hold expires).
    async fn release(
        &self,
        facts: Option<&SaleFacts>,
        reservation: &Reservation,
        reason: ReleaseReason,
    ) -> Option<ReleaseReason> {
        let activity = facts.and_then(|f| f.activity.as_ref())?;
        match self
            .gw
            .lifecycle
            .release_failed(activity, reservation, reason)
            .await
        {
            Ok(ReleaseOutcome::Released { .. }) => Some(reason),
            Ok(kept) => {
                tracing::debug!(reservation = %reservation.id, ?kept, "reservation not released");
                None
            }
            Err(err) => {
                tracing::error!(reservation = %reservation.id, error = %err,
                    "could not release a reservation; it returns when its hold expires");
                None
            }
        }
    }
}

/// Answers a sale request with the gateway's own decision; the request ends here.
async fn refuse(session: &mut Session, ctx: &mut RequestCtx, decision: Decision) -> Result<bool> {
    ctx.decision = Some(decision);
    respond::decision(session, &decision).await?;
    Ok(true)
}

/// Counts a reservation held by a request until the request is done with it.
struct InFlight(prometheus::IntGauge);

impl InFlight {
    fn new(metrics: &crate::metrics::Metrics) -> InFlight {
        metrics.reservations_in_flight.inc();
        InFlight(metrics.reservations_in_flight.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[async_trait]
impl ProxyHttp for FlashProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            started: Instant::now(),
            generation: self.gw.live.current(),
            sale: None,
            decision: None,
            reservation: None,
            in_flight: None,
            passthrough: false,
            slot: None,
            token: None,
            released: None,
            upstream_status: None,
            upstream_attempted: false,
            forwarded: false,
            connect_failures: 0,
        }
    }

    /// No downstream modules: flashgate does not compress, and each module costs every request.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let req = session.req_header();
        let generation = ctx.generation.clone();
        let Some((route, raw_activity)) = sale_route(&generation.settings, req) else {
            return Ok(false);
        };
        let facts = ctx.sale.insert(SaleFacts::default());
        if let Some(too_large) = oversized(req, &generation.settings.server) {
            return refuse(session, ctx, Decision::BadRequest(too_large)).await;
        }
        if !self.gw.takes_new_reservations(&generation.settings) {
            // A reservation taken now could be cut off by the end of the grace period.
            return refuse(session, ctx, Decision::ShuttingDown).await;
        }
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let checked =
            match self
                .gw
                .admission
                .check(&generation, req, route, raw_activity, peer, facts)
            {
                Ok(checked) => checked,
                Err(decision) => return refuse(session, ctx, decision).await,
            };
        // The whole body, within its deadline, before any stock or slot is taken: a slow or
        // broken body then holds nothing, and nothing the buyer does later can cut a forwarded
        // reservation's body short.
        let server = &generation.settings.server;
        if let Err(bad) = read_sale_body(
            session,
            server.max_sale_body_bytes,
            server.sale_body_timeout,
        )
        .await
        {
            return refuse(session, ctx, Decision::BadRequest(bad)).await;
        }
        let facts = ctx.sale.get_or_insert_with(SaleFacts::default);
        match self.gw.admission.take(&generation, checked, facts).await {
            Ok(Admitted::Reserved(reservation)) => {
                // A buyer closing its half of the connection must not stop the proxy reading the
                // backend's answer for the reservation it forwards (which confirms it).
                session.as_downstream_mut().set_abort_on_close(false);
                ctx.reservation = Some(reservation);
                ctx.in_flight = Some(InFlight::new(&self.gw.metrics));
                ctx.decision = Some(Decision::Admitted);
                #[cfg(feature = "fault-injection")]
                if self.gw.fault == Some(crate::gateway::Fault::HangAfterReserve) {
                    std::future::pending::<()>().await;
                }
            }
            Ok(Admitted::Passthrough) => {
                ctx.passthrough = true;
                ctx.decision = Some(Decision::Passthrough);
            }
            Err(decision) => return refuse(session, ctx, decision).await,
        }
        // Winners (and passthroughs) take a slot at the backend, waiting in line if need be.
        let max_wait = generation.settings.upstream.max_queue_wait;
        match self.gw.upstream_queue.enter(max_wait).await {
            Ok(slot) => {
                ctx.slot = Some(slot);
                Ok(false)
            }
            Err(turned_away) => {
                if let Some(reservation) = &ctx.reservation {
                    ctx.released = self
                        .release(ctx.sale.as_ref(), reservation, ReleaseReason::QueueTimeout)
                        .await;
                }
                let decision = Decision::Queued {
                    position: turned_away.position,
                    estimated_wait: turned_away.estimated_wait,
                };
                refuse(session, ctx, decision).await
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        ctx.upstream_attempted = true;
        self.gw.upstreams.peer(&ctx.generation.settings.upstream)
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
        e.set_retry(ctx.connect_failures < ctx.generation.settings.upstream.addresses.len());
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let generation = &ctx.generation;
        let header = &generation.settings.signing.header;
        // The upstream never sees a reservation (or passthrough mark) the gateway did not make,
        // on any route.
        upstream_request.remove_header(header);
        upstream_request.remove_header(PASSTHROUGH_HEADER);
        if ctx.sale.is_some() {
            // The gateway read the body (and answered any `Expect: 100-continue`) already.
            upstream_request.remove_header(&http::header::EXPECT);
        }
        if ctx.passthrough {
            upstream_request.insert_header(PASSTHROUGH_HEADER, PASSTHROUGH_VALUE)?;
        }
        if let Some(reservation) = &ctx.reservation {
            if ctx.token.is_none() {
                let token = generation.signer.sign(reservation).map_err(|e| {
                    Error::because(ErrorType::InternalError, "signing the reservation", e)
                })?;
                ctx.token = Some(token);
            }
            if let Some(token) = &ctx.token {
                upstream_request.insert_header(header.clone(), token.as_str())?;
                ctx.forwarded = true;
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
        let activity = ctx.sale.as_ref().and_then(|f| f.activity.as_ref());
        if let Some(activity) = activity.filter(|a| a.confirm == ConfirmMode::Upstream) {
            if upstream_response.status.is_success() {
                self.gw
                    .lifecycle
                    .confirm_in_background(activity.clone(), reservation.clone());
            }
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
        let upstream_failed =
            *e.esource() == ErrorSource::Upstream || ctx.upstream_status.is_some();
        if ctx.forwarded && !upstream_failed {
            // The backend has the reservation and may take the order whatever the buyer does
            // now: it stays pending, settled by the order lookup once the backend's answer is
            // surely in (or at its hold deadline without one).
            tracing::info!(reservation = %reservation.id, error = %e,
                "the buyer's side failed after the reservation was forwarded; it stays pending");
            if let Some(activity) = ctx.sale.as_ref().and_then(|f| f.activity.clone()) {
                let upstream = &ctx.generation.settings.upstream;
                self.gw.lifecycle.settle_soon(
                    activity,
                    reservation,
                    2 * (upstream.connect_timeout + upstream.read_timeout),
                );
            }
            return respond::proxy_error(session, e).await;
        }
        let (reason, decision) = if *e.esource() == ErrorSource::Downstream {
            // The buyer's side broke before anything reached the backend.
            (
                ReleaseReason::BadRequest,
                Decision::BadRequest(BadRequest::MalformedBody),
            )
        } else if ctx.upstream_status.is_some() {
            (ReleaseReason::Upstream5xx, Decision::Unavailable)
        } else {
            (ReleaseReason::UpstreamError, Decision::Unavailable)
        };
        ctx.released = self.release(ctx.sale.as_ref(), reservation, reason).await;
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
