//! The Pingora `ProxyHttp` implementation: glue only. Each phase hands its work to the module that
//! owns it (the purchase, reservation signing, compensation) and records per-request facts in
//! [`RequestCtx`]; metrics and the decision log are written once, in `logging`.

mod body;
mod cors;
pub mod early;
mod forward;
pub mod headers;
mod lean;
mod line;
mod respond;
mod sale;
pub mod settle;
mod waiting;
mod won;

use crate::decision::{BadRequest, Decision};
use crate::decision_log;
use crate::edge::target::Target;
use crate::edge::{route, EdgeRefusal, Routed};
use crate::lifecycle::Lifecycle;
use crate::live::{Generation, Live};
use crate::metrics::Metrics;
use crate::metrics::UNKNOWN_ACTIVITY_LABEL;
use crate::purchase::Checkout;
use crate::purchase::SaleFacts;
use crate::reservation::Reservation;
use crate::shutdown::Drain;
use crate::stock::{ReleaseOutcome, ReleaseReason};
use crate::upstream::queue::UpstreamQueue;
use crate::upstream::Upstreams;
use crate::upstream::{queue, UpstreamClass};
use crate::waiting::WaitingRoom;
use async_trait::async_trait;
use body::{read_body, BodyError};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use std::sync::Arc;
use std::time::Instant;

/// Per-request facts, from the first phase to `logging`.
pub struct RequestCtx {
    started: Instant,
    /// What the client's `Accept` and `Accept-Language` ask for (read once, first thing).
    client: crate::pages::Client,
    /// The configuration this request runs under, from its first phase to its last.
    generation: Arc<Generation>,
    /// Set on sale routes only.
    sale: Option<SaleFacts>,
    /// A sale request's canonical method and target: what it is forwarded as once admitted.
    canonical: Option<(http::Method, http::Uri)>,
    /// The final decision on a sale route (the buyer's answer).
    decision: Option<Decision>,
    /// Stock held for this request until it is forwarded or released.
    reservation: Option<Reservation>,
    /// Counts `reservation` among the reservations held (the drain waits on them) while the
    /// request lives.
    in_flight: Option<crate::held::Holding>,
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
    /// Where the purchase holding stock stands (held, sent, settled).
    stage: settle::Stage,
    /// A sale request's body, read whole before the reserve took stock.
    body: bytes::Bytes,
    /// Refused at the edge before routing (any route).
    edge: Option<EdgeRefusal>,
    /// Another route's normalised target, when it differs from the one received: what the
    /// backend gets.
    forward_uri: Option<http::Uri>,
    /// Another route's slot at the backend (`upstream.max_passthrough_inflight`), held until
    /// the request ends.
    passthrough_slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The part of the buffered-bodies budget another route's body holds until the request
    /// ends.
    buffered: body::Held,
    connect_failures: usize,
    /// A purchase the front decided before this session began (see [`early`]).
    decided: Option<Box<early::Decided>>,
}

/// Cheap to clone: the front (`crate::front`) and Pingora's proxy share one.
#[derive(Clone)]
pub struct FlashProxy {
    gw: Arc<ProxyParts>,
}

/// What the proxy works with, handed over by the composition root (`crate::gateway`).
pub struct ProxyParts {
    /// The current configuration generation (each request keeps the one it started with).
    pub live: Live,
    pub metrics: Arc<Metrics>,
    pub checkout: Arc<Checkout>,
    pub lifecycle: Arc<Lifecycle>,
    pub waiting: Arc<WaitingRoom>,
    /// Shutdown, and the reservations held that it waits on.
    pub drain: Arc<Drain>,
    /// At most `upstream.max_inflight` sale requests at the backend; the rest wait in line.
    pub upstream_queue: Arc<UpstreamQueue>,
    /// Sends purchases holding stock to the backend on the gateway's own connections.
    pub upstreams: Arc<Upstreams>,
    /// Test-only fault point (feature `fault-injection`, env `FLASHGATE_FAULT`).
    #[cfg(feature = "fault-injection")]
    pub fault: Option<Fault>,
}

/// Faults the test suite can make a gateway commit.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After a successful reserve, never forward (as if the process died right there; the test
    /// then SIGKILLs it).
    HangAfterReserve,
}

#[cfg(feature = "fault-injection")]
impl Fault {
    /// The fault `FLASHGATE_FAULT` names, if any.
    pub fn from_env() -> Option<Fault> {
        match std::env::var("FLASHGATE_FAULT").as_deref() {
            Ok("hang_after_reserve") => Some(Fault::HangAfterReserve),
            _ => None,
        }
    }
}

impl FlashProxy {
    pub fn new(parts: ProxyParts) -> Self {
        FlashProxy {
            gw: Arc::new(parts),
        }
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

/// The TCP peer's address.
fn peer_ip(session: &Session) -> Option<std::net::IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

impl FlashProxy {
    /// Another route's request: with a body, the whole body read first (within its deadline and
    /// size, and the gateway's budget for buffered bodies) and sent by the gateway itself, so a
    /// slow body never holds a backend worker; without one, Pingora's proxy. Either way a slot at
    /// the backend if they are limited, taken once the request is ready to go (an upgraded
    /// connection, a websocket, takes none: it would hold it for its whole life).
    async fn pass_through(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let generation = ctx.generation.clone();
        if session.as_mut().is_body_empty() {
            let upgrade = session
                .req_header()
                .headers
                .contains_key(http::header::UPGRADE);
            if !upgrade && !self.take_passthrough_slot(session, ctx).await? {
                return Ok(true);
            }
            return Ok(false);
        }
        let server = &generation.settings.server;
        let read = read_body(
            session,
            server.max_passthrough_body_bytes,
            server.passthrough_body_timeout,
            false,
            Some(&generation.passthrough_buffer),
            &mut ctx.buffered,
        )
        .await;
        match read {
            Ok(body) => {
                ctx.body = bytes::Bytes::from(body);
                if self.take_passthrough_slot(session, ctx).await? {
                    self.forward_buffered(session, ctx).await;
                }
            }
            Err(BodyError::TooLarge) => respond::status(session, 413, None).await?,
            Err(BodyError::TooSlow) => respond::status(session, 408, None).await?,
            Err(BodyError::Busy) => respond::status(session, 503, Some(1)).await?,
            Err(BodyError::Malformed) => respond::status(session, 400, None).await?,
        }
        Ok(true)
    }

    /// A slot at the backend for another route's request, if they are limited; `false` when
    /// none is free (the client was told 503).
    async fn take_passthrough_slot(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        let Some(slots) = &ctx.generation.passthrough_slots else {
            return Ok(true);
        };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                ctx.passthrough_slot = Some(permit);
                Ok(true)
            }
            Err(_) => {
                respond::status(session, 503, Some(1)).await?;
                Ok(false)
            }
        }
    }

    /// Whether the identity header may pass: from everyone when no `trusted_proxies` are set
    /// (the auth layer in front is the only way in), else only from those peers.
    fn peer_trusted(&self, peer: Option<std::net::IpAddr>, generation: &Generation) -> bool {
        generation.settings.identity.trusted_proxies.is_empty() || generation.policy.trusts(peer)
    }
}

/// The URI another route is forwarded with: its normalised path and the query as sent, `None`
/// when that is what arrived. `Err` when the query cannot be part of a URI.
fn forward_uri(target: &Target, raw: &[u8]) -> std::result::Result<Option<http::Uri>, ()> {
    let path = target.forwarded_path().ok_or(())?;
    let uri = match &target.query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    if uri.as_bytes() == raw {
        return Ok(None);
    }
    uri.parse().map(Some).map_err(|_| ())
}

/// Answers a sale request with the gateway's own decision; the request ends here.
async fn refuse(session: &mut Session, ctx: &mut RequestCtx, decision: Decision) -> Result<bool> {
    ctx.decision = Some(decision);
    respond::decision(session, &ctx.answering(), &decision).await?;
    Ok(true)
}

impl RequestCtx {
    /// How this request's own answers are written (JSON or page, language, its sale).
    fn answering(&self) -> respond::Answering<'_> {
        let sale = self.sale.as_ref().and_then(|f| f.activity.as_deref());
        respond::Answering {
            client: self.client,
            pages: &self.generation.pages,
            sale: sale.map(|a| self.generation.sale_page(&a.id)),
            variant: sale.and_then(|a| a.variant.as_deref()),
            line: sale.and_then(crate::waiting::line::join_url),
            allow: None,
            again: self
                .canonical
                .as_ref()
                .map(|(method, uri)| crate::pages::Again {
                    method: method.as_str(),
                    target: uri.path_and_query().map_or("/", |p| p.as_str()),
                    sold_out: None,
                    choices: &[],
                }),
        }
    }
}

#[async_trait]
impl ProxyHttp for FlashProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            started: Instant::now(),
            client: crate::pages::Client::default(),
            generation: self.gw.live.current(),
            sale: None,
            canonical: None,
            decision: None,
            reservation: None,
            in_flight: None,
            passthrough: false,
            slot: None,
            token: None,
            released: None,
            upstream_status: None,
            upstream_attempted: false,
            stage: settle::Stage::Unreserved,
            body: bytes::Bytes::new(),
            edge: None,
            forward_uri: None,
            passthrough_slot: None,
            buffered: None,
            connect_failures: 0,
            decided: None,
        }
    }

    /// No compression: each module costs every request (two allocations). One module, CORS on
    /// the gateway's routes (it sees every answer, whichever phase writes it), only when
    /// origins are listed at start-up.
    fn init_downstream_modules(&self, modules: &mut pingora::modules::http::HttpModules) {
        if !self
            .gw
            .live
            .settings()
            .server
            .cors
            .allowed_origins
            .is_empty()
        {
            cors::install(modules);
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        if let Some(decided) = ctx.decided.take() {
            return self.carry_on(session, ctx, *decided).await;
        }
        let req = session.req_header();
        let generation = ctx.generation.clone();
        ctx.client = crate::pages::Client::of(&req.headers);
        // Framing first, on every route: differing lengths are a smuggling attempt.
        if headers::content_length(req).is_err() {
            if let Err(e) = session.respond_error(400).await {
                tracing::debug!(error = %e, "could not refuse a conflicting Content-Length");
            }
            return Ok(true);
        }
        let target = Target::of(&req.method, req.raw_path());
        if let Some(preflight) = cors::preflight(&generation.settings, req, &target) {
            cors::answer(session, &generation.settings, preflight).await?;
            return Ok(true);
        }
        let (route, raw_activity) = match route(&generation.settings, &target) {
            Routed::Sale(route, activity) => {
                cors::mark(session, &generation.settings);
                (route, activity)
            }
            Routed::Refused(refusal) => {
                ctx.edge = Some(refusal);
                respond::decision(session, &ctx.answering(), &refusal.decision()).await?;
                return Ok(true);
            }
            Routed::WrongMethod(allow) => {
                let refusal = EdgeRefusal::WrongMethod;
                ctx.edge = Some(refusal);
                let how = respond::Answering {
                    allow: Some(&allow),
                    ..ctx.answering()
                };
                respond::decision(session, &how, &refusal.decision()).await?;
                return Ok(true);
            }
            Routed::Other => {
                if let Some(asked) = line::line_address(&target) {
                    cors::mark(session, &generation.settings);
                    return self.line(session, ctx, asked).await;
                }
                if let Some(activity) = waiting::poll_activity(&target) {
                    let activity = activity.to_owned();
                    cors::mark(session, &generation.settings);
                    return self.queue_poll(session, ctx, &activity).await;
                }
                return match forward_uri(&target, req.raw_path()) {
                    Ok(uri) => {
                        ctx.forward_uri = uri;
                        self.pass_through(session, ctx).await
                    }
                    Err(()) => {
                        ctx.edge = Some(EdgeRefusal::NotUtf8);
                        let bad = Decision::BadRequest(BadRequest::UnreadableTarget);
                        respond::decision(session, &ctx.answering(), &bad).await?;
                        Ok(true)
                    }
                };
            }
        };
        let asked = sale::OnSaleRoute {
            route,
            activity: raw_activity,
            target: &target,
        };
        self.sale(session, ctx, asked).await
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
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        self.prepare_upstream(peer_ip(session), upstream_request, ctx)
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if !upstream_response.status.is_informational() {
            ctx.upstream_status = Some(upstream_response.status.as_u16());
        }
        if ctx.sale.is_some() {
            // A purchase forwarded unreserved: the gateway alone speaks CORS on its routes.
            cors::drop_backends(upstream_response);
        }
        Ok(())
    }

    /// Only requests that hold no stock take Pingora's path (pass-through routes, and
    /// purchases forwarded unreserved while the store is down): their failures are Pingora's
    /// usual answers. A purchase holding stock is settled by `forward_reserved`.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        respond::proxy_error(session, e).await
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let metrics = &self.gw.metrics;
        if let Some(refusal) = ctx.edge {
            metrics
                .edge_refusals
                .with_label_values(&[refusal.as_str()])
                .inc();
            decision_log::record_edge(refusal, session.req_header(), ctx.started.elapsed());
            return;
        }
        self.record_request(ctx, e);
    }

    /// A purchase the front (`crate::front`) decided before this session: its decision,
    /// carried on in `request_filter`.
    fn on_connection_reuse(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
        prev: Box<dyn std::any::Any + Send + Sync>,
    ) {
        if let Ok(decided) = prev.downcast::<early::Decided>() {
            ctx.decided = Some(decided);
        }
    }
}

impl FlashProxy {
    /// The metrics and decision log of a request past the edge, once, when it ends: from
    /// `logging`, or from the front for a purchase it forwarded itself.
    fn record_request(&self, ctx: &RequestCtx, e: Option<&Error>) {
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
        record_sale(
            metrics,
            &decision_log::Entry {
                activity: activity_label(facts),
                facts,
                decision,
                reservation: ctx.reservation.as_ref(),
                released: ctx.released,
                upstream_status: ctx.upstream_status,
                error: e,
                elapsed: ctx.started.elapsed(),
            },
        );
    }
}

/// The activity's metric label: its id, or the one label for ids no activity has.
fn activity_label(facts: &SaleFacts) -> &str {
    facts
        .activity
        .as_ref()
        .map_or(UNKNOWN_ACTIVITY_LABEL, |a| &a.id)
}

/// Counts a sale request's decision and writes its log line: once per request, from `logging`,
/// or from the front for a purchase it answered itself.
fn record_sale(metrics: &Metrics, entry: &decision_log::Entry<'_>) {
    metrics
        .decisions
        .with_label_values(&[entry.activity, entry.decision.code()])
        .inc();
    // A sale in phases: the units this request reserved, by the phase they were bought in.
    if let Some(r) = entry.reservation.filter(|r| r.owned) {
        if let Some(phase) = &r.phase {
            metrics
                .phase_units
                .with_label_values(&[entry.activity, phase])
                .inc_by(u64::from(r.qty));
        }
    }
    decision_log::record(entry);
}
