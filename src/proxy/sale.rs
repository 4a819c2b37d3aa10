//! A purchase at the edge: whether it may be considered at all (its canonical form, its size, a
//! gateway not shutting down), the purchase pipeline (`crate::purchase`: every gate, one
//! verdict), then the way to the backend. `request_filter` only routes to here.

use super::body::{canonical_uri, oversized, read_body};
use super::{refuse, settle, FlashProxy, RequestCtx};
use crate::config::SaleRoute;
use crate::decision::{BadRequest, Decision};
use crate::edge::target::Target;
use crate::live::Generation;
use crate::purchase::SaleFacts;
use crate::purchase::{self, Attempt, Incoming, Parts, Verdict};
use crate::reservation::Reservation;
use crate::stock::ReleaseReason;
use pingora::http::RequestHeader;
use pingora::prelude::*;
use std::time::Duration;

/// How the request flows on: go on with the value, or it ended (answered) with this result.
type Flow<T> = std::result::Result<T, Result<bool>>;

/// A request on a sale route: the route, the activity segment of its path, its target.
#[derive(Clone, Copy)]
pub(super) struct OnSaleRoute<'a> {
    pub route: &'a SaleRoute,
    pub activity: &'a str,
    pub target: &'a Target,
}

/// The request as the pipeline's gates read it: the session's header and peer, and the whole
/// body, read once within the route's size and deadline.
struct SessionIncoming<'s> {
    session: &'s mut Session,
    limit_bytes: u64,
    deadline: Duration,
    body: Option<bytes::Bytes>,
}

#[async_trait::async_trait]
impl Incoming for SessionIncoming<'_> {
    fn header(&self) -> &RequestHeader {
        self.session.req_header()
    }

    fn peer(&self) -> Option<std::net::IpAddr> {
        super::peer_ip(self.session)
    }

    async fn body(&mut self) -> std::result::Result<bytes::Bytes, BadRequest> {
        if let Some(body) = &self.body {
            return Ok(body.clone());
        }
        let (limit, deadline) = (self.limit_bytes, self.deadline);
        let read = read_body(self.session, limit, deadline, true, None, &mut None).await;
        let body = bytes::Bytes::from(read.map_err(|bad| bad.bad_request())?);
        self.body = Some(body.clone());
        Ok(body)
    }
}

impl FlashProxy {
    /// Runs a purchase through the pipeline; `Ok(true)` when answered here, `Ok(false)` when
    /// Pingora's proxy forwards it (a purchase forwarded unreserved while the store is down).
    pub(super) async fn sale(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        asked: OnSaleRoute<'_>,
    ) -> Result<bool> {
        if let Err(ended) = self.considered(session, ctx, asked).await {
            return ended;
        }
        let verdict = self.decide(session, ctx, asked).await;
        if let Err(ended) = self.hold(session, ctx, verdict).await {
            return ended;
        }
        self.to_backend(session, ctx).await
    }

    /// Whether the request may be considered (see [`FlashProxy::consider`]); a refusal ends it.
    async fn considered(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        asked: OnSaleRoute<'_>,
    ) -> Flow<()> {
        ctx.sale = Some(SaleFacts::default());
        match self.consider(&ctx.generation.clone(), session.req_header(), asked) {
            Ok(canonical) => {
                ctx.canonical = Some(canonical);
                Ok(())
            }
            Err(refused) => Err(refuse(session, ctx, refused).await),
        }
    }

    /// Whether a purchase may be considered: its canonical form (the route's method and path,
    /// what an admitted request is forwarded as, returned), its size, and a gateway not
    /// shutting down (a reservation taken now could be cut off by the end of the grace period).
    pub(super) fn consider(
        &self,
        generation: &Generation,
        req: &RequestHeader,
        asked: OnSaleRoute<'_>,
    ) -> std::result::Result<(http::Method, http::Uri), Decision> {
        let settings = &generation.settings;
        let OnSaleRoute {
            route,
            activity,
            target,
        } = asked;
        let variant = crate::edge::route::path_variant(route, target);
        let canonical = canonical_uri(route, activity, variant, target.query.as_deref())
            .ok_or(Decision::BadRequest(BadRequest::MalformedTarget))?;
        if let Some(too_large) = oversized(req, &settings.server) {
            return Err(Decision::BadRequest(too_large));
        }
        if !self.gw.drain.takes_new_reservations(settings) {
            return Err(Decision::ShuttingDown);
        }
        Ok((route.method().clone(), canonical))
    }

    /// The pipeline's verdict; what it learned is kept for the answer and the log, and the body
    /// it read for the backend.
    async fn decide(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        asked: OnSaleRoute<'_>,
    ) -> Verdict {
        let generation = ctx.generation.clone();
        let server = &generation.settings.server;
        let mut incoming = SessionIncoming {
            session,
            limit_bytes: server.max_sale_body_bytes,
            deadline: server.sale_body_timeout,
            body: None,
        };
        let (method, uri) = ctx.canonical.as_ref().expect("considered sets it");
        let (verdict, facts) = self
            .judge(&generation, asked, (method, uri), &mut incoming)
            .await;
        ctx.sale = Some(facts);
        ctx.body = incoming.body.unwrap_or_default();
        verdict
    }

    /// The purchase pipeline's verdict on a purchase considered, and what it learned: the one
    /// call the proxy's session and the front (`super::early`) both make.
    pub(super) async fn judge(
        &self,
        generation: &Generation,
        asked: OnSaleRoute<'_>,
        canonical: (&http::Method, &http::Uri),
        incoming: &mut dyn Incoming,
    ) -> (Verdict, SaleFacts) {
        let asked = purchase::Asked {
            route: asked.route,
            activity: asked.activity,
            target: asked.target,
            canonical,
        };
        let parts = Parts {
            rules: generation.rules(),
            checkout: &self.gw.checkout,
            room: &*self.gw.waiting,
        };
        let now = self.gw.checkout.now();
        let mut attempt = Attempt::new(asked, incoming, now);
        let verdict = purchase::run(parts, &mut attempt).await;
        (verdict, attempt.facts)
    }

    /// Holds what the verdict gave (stock for this request, or leave to forward it unreserved),
    /// or ends the request with the buyer's answer.
    pub(super) async fn hold(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        verdict: Verdict,
    ) -> Flow<()> {
        match verdict {
            Verdict::Reserved(reservation) => {
                self.take_hold(ctx, reservation).await;
                Ok(())
            }
            Verdict::Passthrough => {
                ctx.passthrough = true;
                ctx.decision = Some(Decision::Passthrough);
                Ok(())
            }
            Verdict::Queue(reply) => Err(self.answer_queued(session, ctx, *reply).await),
            Verdict::Refuse(Decision::SoldOut) if ctx.client.html => {
                Err(self.size_sold_out(session, ctx).await)
            }
            Verdict::Refuse(decision) => Err(refuse(session, ctx, decision).await),
        }
    }

    /// A size of a drop sold out under a page client's click: the page names it by its title
    /// and offers the drop's other sizes, each to buy with the same ticket (a turn in the
    /// waiting room is kept: its admission window runs on); those this gateway knows sold out
    /// are shown but cannot be pressed.
    async fn size_sold_out(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let activity = ctx.sale.as_ref().and_then(|f| f.activity.clone());
        let (Some(activity), Some((method, uri))) = (activity, ctx.canonical.clone()) else {
            return refuse(session, ctx, Decision::SoldOut).await;
        };
        let Some(sold) = activity.variant.clone() else {
            return refuse(session, ctx, Decision::SoldOut).await;
        };
        let settings = &ctx.generation.settings;
        let canonical = uri.path_and_query().map_or("/", |p| p.as_str());
        let target = Target::of(&method, canonical.as_bytes());
        let Some((route, _)) = crate::edge::sale_route(settings, &target) else {
            return refuse(session, ctx, Decision::SoldOut).await;
        };
        let slot = crate::waiting::page::purchase_target(route, &activity, canonical);
        let title =
            |v: &crate::config::Variant| v.title.clone().unwrap_or_else(|| v.id.to_string());
        let choices: Vec<crate::pages::Choice> = (activity.variants.iter())
            .filter(|v| v.id != sold)
            .map(|v| crate::pages::Choice {
                title: title(v),
                action: slot.replace(crate::waiting::page::VARIANT_SLOT, &v.id),
                available: !self.variant_sold_out(settings, &activity.id, &v.id),
            })
            .collect();
        let sold_title = activity.variants.iter().find(|v| v.id == sold).map(title);
        ctx.decision = Some(Decision::SoldOut);
        let mut how = ctx.answering();
        if let Some(again) = how.again.as_mut() {
            again.sold_out = sold_title.as_deref();
            again.choices = &choices;
        }
        super::respond::decision(session, &how, &Decision::SoldOut).await?;
        Ok(true)
    }

    /// Winners (and passthroughs) take a slot at the backend, waiting in line if need be; the
    /// gateway sends a purchase holding stock itself, and reads the backend's answer whatever
    /// the buyer's connection does meanwhile.
    pub(super) async fn to_backend(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        if let Err(turned_away) = self.take_slot(ctx).await {
            return refuse(session, ctx, turned_away).await;
        }
        if ctx.reservation.is_some() {
            self.forward_reserved(session, ctx).await;
            return Ok(true);
        }
        Ok(false)
    }

    /// The request holds `reservation` from here: counted among those the drain waits on.
    pub(super) async fn take_hold(&self, ctx: &mut RequestCtx, reservation: Reservation) {
        ctx.reservation = Some(reservation);
        ctx.stage.advance(settle::Stage::Held);
        if ctx.in_flight.is_none() {
            ctx.in_flight = Some(self.gw.drain.held().hold());
        }
        ctx.decision = Some(Decision::Admitted);
        #[cfg(feature = "fault-injection")]
        if self.gw.fault == Some(super::Fault::HangAfterReserve) {
            std::future::pending::<()>().await;
        }
    }

    /// A slot at the backend, waiting in line if need be; when none came in time, the
    /// reservation is given back and the answer is the line's (`queued`).
    pub(super) async fn take_slot(
        &self,
        ctx: &mut RequestCtx,
    ) -> std::result::Result<(), Decision> {
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
                Ok(())
            }
            Err(turned_away) => {
                if let Some(reservation) = &ctx.reservation {
                    ctx.released = self
                        .release(ctx.sale.as_ref(), reservation, ReleaseReason::QueueTimeout)
                        .await;
                }
                Err(Decision::UpstreamBusy {
                    position: turned_away.position,
                    estimated_wait: turned_away.estimated_wait,
                })
            }
        }
    }
}

impl FlashProxy {
    /// Whether this gateway knows variant `variant` of activity `activity` sold out: the
    /// gateway that sold its last unit knows at once, the others by news (a mark kept for the
    /// sold-out cache's ttl), and a drop with a waiting room from its last reading of the units
    /// left (every refresh: a mark that expired is not taken for stock come back). An unknown
    /// variant reads as sold out (nothing to buy there). For what pages offer, never to refuse.
    pub(super) fn variant_sold_out(
        &self,
        settings: &crate::config::Settings,
        activity: &str,
        variant: &str,
    ) -> bool {
        let ttl = settings.sold_out_cache.ttl;
        settings
            .activities
            .lane(activity, Some(variant))
            .is_none_or(|lane| self.gw.checkout.sale.is_sold_out(lane, ttl))
            || !self.gw.waiting.variant_left(activity, variant)
    }
}
