//! Purchases decided before any Pingora session: the front (`crate::front`) reads a request's
//! head itself and asks [`FlashProxy::early`], which takes the same steps as the proxy's
//! session (`sale.rs`: considered, then the purchase pipeline) over that head. A refusal or a
//! waiting room's answer comes back as the whole answer's bytes, written by the front in one write and recorded here; any
//! other verdict (stock held, forwarding unreserved) comes back as a
//! [`Decided`], which the proxy's session for the same request carries on from (`carry_on`),
//! so a purchase is judged once whichever reader took it.
//!
//! Only what can be read plainly is judged here (see [`FlashProxy::early`]): a JSON client, no
//! body, no CORS; everything else is handed to the proxy undecided, where every edge rule
//! applies as before.

use super::sale::OnSaleRoute;
use super::{activity_label, headers, record_sale, respond, FlashProxy, RequestCtx};
use crate::decision::{BadRequest, Decision};
use crate::edge::target::Target;
use crate::edge::{route, Routed};
use crate::live::Generation;
use crate::pages::Client;
use crate::purchase::SaleFacts;
use crate::purchase::{Incoming, Verdict};
use pingora::http::RequestHeader;
use pingora::prelude::*;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

/// A purchase the front judged, for the proxy's session of the same request to carry on from:
/// its reservation is held (and counted among the reservations the drain waits on) from here.
///
/// If that session never carries it on (Pingora refused the head the front judged, or the
/// connection broke before Pingora read it), dropping it gives back the reservation it holds
/// (nothing reached the backend) and counts the request as a bad request, the answer Pingora
/// gave if it gave one; the front judges only heads Pingora takes (`crate::front::head`), so
/// this is the rare way out, not the usual one.
pub struct Decided {
    started: Instant,
    generation: Arc<Generation>,
    client: Client,
    facts: SaleFacts,
    canonical: (http::Method, http::Uri),
    /// Taken when the proxy carries it on.
    verdict: Option<Verdict>,
    in_flight: Option<crate::held::Holding>,
    /// For the release if it is dropped unused.
    proxy: FlashProxy,
}

impl Decided {
    /// Moves what the front learned into the request's context; the verdict to carry on from
    /// (taken: the decision is the context's from here).
    pub(super) fn adopt(&mut self, ctx: &mut RequestCtx) -> Option<Verdict> {
        let verdict = self.verdict.take()?;
        ctx.started = self.started;
        ctx.generation = self.generation.clone();
        ctx.client = self.client;
        ctx.sale = Some(std::mem::take(&mut self.facts));
        ctx.canonical = Some(self.canonical.clone());
        ctx.in_flight = self.in_flight.take();
        Some(verdict)
    }
}

impl Drop for Decided {
    fn drop(&mut self) {
        let Some(verdict) = self.verdict.take() else {
            return;
        };
        let decision = Decision::BadRequest(BadRequest::MalformedTarget);
        record_refusal(&self.proxy, &self.facts, decision, self.started);
        let (Verdict::Reserved(reservation), Some(activity)) =
            (verdict, self.facts.activity.clone())
        else {
            return;
        };
        let (proxy, in_flight) = (self.proxy.clone(), self.in_flight.take());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let reason = crate::stock::ReleaseReason::BadRequest;
            let released = proxy
                .gw
                .lifecycle
                .release_failed(&activity, &reservation, reason)
                .await;
            tracing::warn!(reservation = %reservation.id, ?released,
                "a purchase judged by the front never reached the proxy; its reservation is given back");
            drop(in_flight);
        });
    }
}

/// What the front does with a request it read.
pub enum Early {
    /// Write these bytes (the whole answer); the request is answered and recorded.
    Answer(Vec<u8>),
    /// Hand the request to the proxy, with the front's decision if it took one.
    HandOver(Option<Box<Decided>>),
    /// It holds stock: the front forwards it itself (`FlashProxy::forward_early`).
    Forward(Box<Decided>),
}

/// The head as the pipeline's gates read it: a request without a body (the front judges no
/// other).
struct HeadOnly<'a> {
    header: &'a RequestHeader,
    peer: Option<IpAddr>,
}

#[async_trait::async_trait]
impl Incoming for HeadOnly<'_> {
    fn header(&self) -> &RequestHeader {
        self.header
    }

    fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    async fn body(&mut self) -> std::result::Result<bytes::Bytes, BadRequest> {
        Ok(bytes::Bytes::new())
    }
}

impl FlashProxy {
    /// Judges a purchase from its head alone, when it can be read plainly: a sale route, a
    /// client asking for JSON, no `Origin` while CORS is on (the allow headers and preflights
    /// are the proxy's CORS module's; a refusal here gets its `Vary: Origin`), a
    /// Content-Length that agrees with itself. The front sends only requests without a body,
    /// on HTTP/1.1, without `Expect` or `Upgrade`, and a `Connection` of `close` or
    /// `keep-alive` at most (`crate::front::head`). `closing`: the answer closes the connection.
    pub async fn early(&self, req: &RequestHeader, peer: Option<IpAddr>, closing: bool) -> Early {
        let started = Instant::now();
        let generation = self.gw.live.current();
        let settings = &generation.settings;
        let client = Client::of(&req.headers);
        let cors_on = !settings.server.cors.allowed_origins.is_empty();
        let origin = req.headers.contains_key(http::header::ORIGIN);
        if client.html || (cors_on && origin) || headers::content_length(req).is_err() {
            return Early::HandOver(None);
        }
        let target = Target::of(&req.method, req.raw_path());
        let Routed::Sale(route, activity) = route(settings, &target) else {
            return Early::HandOver(None);
        };
        let asked = OnSaleRoute {
            route,
            activity,
            target: &target,
        };
        let refused = |decision: Decision, facts: SaleFacts| {
            let lane = facts.activity.as_deref();
            let answer = respond::decision_bytes(client.lang, &decision, lane, cors_on, closing);
            record_refusal(self, &facts, decision, started);
            Early::Answer(answer)
        };
        let canonical = match self.consider(&generation, req, asked) {
            Ok(canonical) => canonical,
            Err(decision) => return refused(decision, SaleFacts::default()),
        };
        let mut incoming = HeadOnly { header: req, peer };
        let (verdict, facts) = self
            .judge(
                &generation,
                asked,
                (&canonical.0, &canonical.1),
                &mut incoming,
            )
            .await;
        match verdict {
            Verdict::Refuse(decision) => refused(decision, facts),
            // The buyer's place (a JSON client's: 202 `queued`, the ticket in its header and
            // cookie), in one write as a refusal is: the door's answer to every arrival.
            Verdict::Queue(queued) => {
                let answer = respond::queued_bytes(client.lang, &queued, cors_on, closing);
                record_refusal(self, &facts, Decision::Waiting, started);
                Early::Answer(answer)
            }
            verdict => {
                let reserved = matches!(verdict, Verdict::Reserved(_));
                let in_flight = reserved.then(|| self.gw.drain.held().hold());
                let decided = Box::new(Decided {
                    started,
                    generation: generation.clone(),
                    client,
                    facts,
                    canonical,
                    verdict: Some(verdict),
                    in_flight,
                    proxy: self.clone(),
                });
                if reserved {
                    Early::Forward(decided)
                } else {
                    Early::HandOver(Some(decided))
                }
            }
        }
    }

    /// A purchase the front decided: the proxy's session carries on from the verdict (holds
    /// the stock and forwards it, answers the queue's place, or forwards it unreserved).
    pub(super) async fn carry_on(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        mut decided: Decided,
    ) -> Result<bool> {
        let Some(verdict) = decided.adopt(ctx) else {
            return Ok(false);
        };
        // Its answer, whoever writes it, gets the CORS headers the proxy's own sale requests
        // get (the front judges none with an `Origin` while CORS is on: `Vary: Origin` only).
        super::cors::mark(session, &ctx.generation.settings);
        if let Err(ended) = self.hold(session, ctx, verdict).await {
            return ended;
        }
        self.to_backend(session, ctx).await
    }
}

/// Counts and logs a refusal (or a queue's answer) the front wrote, as `logging` does for the
/// proxy's.
fn record_refusal(proxy: &FlashProxy, facts: &SaleFacts, decision: Decision, started: Instant) {
    record_sale(
        &proxy.gw.metrics,
        &crate::decision_log::Entry {
            activity: activity_label(facts),
            facts,
            decision,
            reservation: None,
            released: None,
            upstream_status: None,
            error: None,
            elapsed: started.elapsed(),
        },
    );
}
