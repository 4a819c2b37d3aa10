//! The purchase pipeline, in order, for a request on a sale route: what it is forwarded as (and
//! whether it may be considered at all), admission and the waiting room, its whole body, the
//! reserve, and the way to the backend. Each step either lets the purchase go on or ends it with
//! the buyer's answer; `request_filter` only routes to here.

use super::body::{canonical_uri, oversized, read_body};
use super::{refuse, settle, FlashProxy, RequestCtx};
use crate::admission::target::Target;
use crate::admission::{
    body_quantity, Admitted, BadRequest, Checked, Decision, SaleFacts, SaleRequest,
};
use crate::config::SaleRoute;
use crate::stock::ReleaseReason;
use pingora::prelude::*;

/// A step's verdict: go on with the value, or the request ended (answered) with this result.
type Step<T> = std::result::Result<T, Result<bool>>;

/// Where a purchase was asked: its sale route, the activity segment of its path, its target.
#[derive(Clone, Copy)]
pub(super) struct Asked<'a> {
    pub route: &'a SaleRoute,
    pub activity: &'a str,
    pub target: &'a Target,
}

impl FlashProxy {
    /// Runs a purchase through the pipeline; `Ok(true)` when answered here, `Ok(false)` when
    /// Pingora's proxy forwards it (a purchase forwarded unreserved while the store is down).
    pub(super) async fn sale(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        asked: Asked<'_>,
    ) -> Result<bool> {
        if let Err(ended) = self.considered(session, ctx, asked).await {
            return ended;
        }
        let checked = match self.admit(session, ctx, asked).await {
            Ok(checked) => checked,
            Err(ended) => return ended,
        };
        if let Err(ended) = self.whole_body(session, ctx, asked.route).await {
            return ended;
        }
        if let Err(ended) = self.take(session, ctx, checked).await {
            return ended;
        }
        self.to_backend(session, ctx).await
    }

    /// Whether the request may be considered: its canonical form (the route's method and path,
    /// what an admitted request is forwarded as), its size, and a gateway not shutting down (a
    /// reservation taken now could be cut off by the end of the grace period).
    async fn considered(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        asked: Asked<'_>,
    ) -> Step<()> {
        ctx.sale = Some(SaleFacts::default());
        let settings = ctx.generation.settings.clone();
        let Asked {
            route,
            activity,
            target,
        } = asked;
        let Some(canonical) = canonical_uri(route, activity, target.query.as_deref()) else {
            let bad = Decision::BadRequest(BadRequest::MalformedTarget);
            return Err(refuse(session, ctx, bad).await);
        };
        ctx.canonical = Some((route.method().clone(), canonical));
        if let Some(too_large) = oversized(session.req_header(), &settings.server) {
            return Err(refuse(session, ctx, Decision::BadRequest(too_large)).await);
        }
        if !self.gw.takes_new_reservations(&settings) {
            return Err(refuse(session, ctx, Decision::ShuttingDown).await);
        }
        Ok(())
    }

    /// Admission's checks, then the waiting room: a buyer without their turn gets a ticket and
    /// a place instead (or, keyed, goes on replay only).
    async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        asked: Asked<'_>,
    ) -> Step<Checked> {
        let generation = ctx.generation.clone();
        let sale = SaleRequest {
            req: session.req_header(),
            target: asked.target,
            route: asked.route,
            activity: asked.activity,
            peer: super::peer_ip(session),
        };
        let facts = ctx.sale.get_or_insert_with(SaleFacts::default);
        let mut checked = match self.gw.admission.check(generation.rules(), &sale, facts) {
            Ok(checked) => checked,
            Err(decision) => return Err(refuse(session, ctx, decision).await),
        };
        if let Some(answered) = self.queue_gate(session, ctx, &mut checked).await {
            return Err(answered);
        }
        if let Err(decision) = self
            .gw
            .admission
            .after_queue(generation.rules(), &mut checked)
        {
            return Err(refuse(session, ctx, decision).await);
        }
        Ok(checked)
    }

    /// The whole body, within its deadline, before any stock or slot is taken (a slow or broken
    /// body then holds nothing, and nothing the buyer does later can cut a forwarded
    /// reservation's body short); a quantity it names must be the admitted one.
    async fn whole_body(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        route: &SaleRoute,
    ) -> Step<()> {
        let server = &ctx.generation.settings.server;
        let (limit, deadline) = (server.max_sale_body_bytes, server.sale_body_timeout);
        let body = match read_body(session, limit, deadline, true, None, &mut None).await {
            Ok(body) => body,
            Err(bad) => {
                let bad = Decision::BadRequest(bad.bad_request());
                return Err(refuse(session, ctx, bad).await);
            }
        };
        let admitted = ctx.sale.as_ref().and_then(|f| f.qty);
        match body_quantity(&session.req_header().headers, &body, route.quantity_query()) {
            Ok(None) => {}
            Ok(Some(q)) if Some(q) == admitted => {}
            Ok(Some(_)) => {
                let bad = Decision::BadRequest(BadRequest::QuantityAmbiguous);
                return Err(refuse(session, ctx, bad).await);
            }
            Err(bad) => return Err(refuse(session, ctx, Decision::BadRequest(bad)).await),
        }
        ctx.body = bytes::Bytes::from(body);
        Ok(())
    }

    /// The reserve: stock held for this request (or forwarded unreserved while the store is
    /// down), or the buyer's answer.
    async fn take(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        checked: Checked,
    ) -> Step<()> {
        let generation = ctx.generation.clone();
        let facts = ctx.sale.get_or_insert_with(SaleFacts::default);
        match self
            .gw
            .admission
            .take(generation.rules(), checked, facts)
            .await
        {
            Ok(Admitted::Reserved(reservation)) => {
                ctx.reservation = Some(reservation);
                ctx.stage.advance(settle::Stage::Held);
                ctx.in_flight = Some(self.gw.held.hold());
                ctx.decision = Some(Decision::Admitted);
                #[cfg(feature = "fault-injection")]
                if self.gw.fault == Some(crate::gateway::Fault::HangAfterReserve) {
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
            Ok(Admitted::Passthrough) => {
                ctx.passthrough = true;
                ctx.decision = Some(Decision::Passthrough);
                Ok(())
            }
            Err(Decision::Waiting) if ctx.queued.is_some() => {
                let reply = ctx.queued.take().expect("checked");
                Err(self.answer_queued(session, ctx, reply).await)
            }
            Err(decision) => Err(refuse(session, ctx, decision).await),
        }
    }

    /// Winners (and passthroughs) take a slot at the backend, waiting in line if need be; the
    /// gateway sends a purchase holding stock itself, and reads the backend's answer whatever
    /// the buyer's connection does meanwhile.
    async fn to_backend(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let upstream = &ctx.generation.settings.upstream;
        let limit = upstream.max_inflight.map(|n| n.get());
        match self
            .gw
            .upstream_queue
            .enter(limit, upstream.max_queue_wait)
            .await
        {
            Ok(slot) => {
                ctx.slot = Some(slot);
                if ctx.reservation.is_some() {
                    self.forward_reserved(session, ctx).await;
                    return Ok(true);
                }
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
}
