//! What reaches the backend: the request headers every forwarded request gets (both paths), and
//! the gateway's own exchange for a purchase holding stock, which reads the backend's answer
//! and settles the reservation before relaying anything to the buyer (so nothing the buyer's
//! connection does can lose a confirm or release a unit the backend sold).

use super::settle::{settle, Exchange, Settlement, Stage};
use super::{headers, peer_ip, respond, FlashProxy, RequestCtx};
use crate::config::{ConfirmMode, IdentitySource};
use crate::upstream::wire::{self, ForwardError};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;

impl FlashProxy {
    /// The headers of a request to the backend, on any route: no look-alike of the gateway's
    /// own headers, the identity only as a trusted auth layer set it, forwarding headers written
    /// as a proxy should, one Content-Length; on a sale route the canonical target and, when it
    /// holds stock, the signed reservation.
    pub(super) fn prepare_upstream(
        &self,
        peer: Option<std::net::IpAddr>,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let generation = &ctx.generation;
        let settings = &generation.settings;
        let header = &settings.signing.header;
        // Read before anything below touches the headers (they are the client's still).
        let client = generation.policy.client_ip(&upstream_request.headers, peer);
        // The upstream never sees a reservation (or passthrough mark) the gateway did not make,
        // on any route, under any spelling.
        headers::remove_lookalikes(upstream_request, header.as_str());
        headers::remove_lookalikes(upstream_request, headers::PASSTHROUGH);
        if let IdentitySource::Header(identity) = &settings.identity.source {
            // The identity only as the trusted auth layer set it.
            if self.peer_trusted(peer, generation) {
                headers::remove_other_spellings(upstream_request, identity.as_str());
            } else {
                headers::remove_lookalikes(upstream_request, identity.as_str());
            }
        }
        if generation.policy.trusts(peer) {
            // A phase's header as the auth layer set it, in one spelling (a backend reading
            // `x_member_tier` reads what the gateway read).
            for name in &settings.identity.phase_headers {
                headers::remove_other_spellings(upstream_request, name);
            }
        } else {
            // Only a trusted proxy may claim an address, a host, a scheme, a URL or a method.
            let identity = match &settings.identity.source {
                IdentitySource::Header(name) => Some(name.as_str()),
                _ => None,
            };
            let extra = &settings.identity.strip_headers;
            headers::remove_client_claims(upstream_request, identity, extra);
        }
        headers::write_forwarding(
            upstream_request,
            peer,
            generation.policy.trusts(peer),
            client,
        )?;
        headers::normalise_content_length(upstream_request)?;
        if ctx.sale.is_some() {
            // The gateway read the body (and answered any `Expect: 100-continue`) already.
            upstream_request.remove_header(&http::header::EXPECT);
            if let Some((method, uri)) = &ctx.canonical {
                upstream_request.set_method(method.clone());
                upstream_request.set_uri(uri.clone());
            }
        } else if let Some(uri) = &ctx.forward_uri {
            // Another route, in the form the gateway read it: the backend routes what was read.
            upstream_request.set_uri(uri.clone());
        }
        if ctx.passthrough {
            upstream_request.insert_header(headers::PASSTHROUGH, headers::PASSTHROUGH_VALUE)?;
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
            }
        }
        Ok(())
    }

    /// The head of a request whose body the gateway read whole (`body_len` bytes, maybe none):
    /// its hop-by-hop headers gone, the headers every forwarded request gets
    /// ([`FlashProxy::prepare_upstream`]), no `Expect` (answered already) and no transfer
    /// coding, one `Content-Length`. Whether it could be made (why not is logged).
    pub(super) fn buffered_head(
        &self,
        peer: Option<std::net::IpAddr>,
        req: &mut RequestHeader,
        ctx: &mut RequestCtx,
        body_len: usize,
    ) -> bool {
        headers::strip_hop_by_hop(req);
        let prepared = self.prepare_upstream(peer, req, ctx).and_then(|()| {
            req.remove_header(&http::header::EXPECT);
            req.remove_header(&http::header::TRANSFER_ENCODING);
            req.insert_header(http::header::CONTENT_LENGTH, body_len.to_string())
        });
        if let Err(e) = &prepared {
            tracing::error!(error = %e, "could not build the request to the backend");
        }
        prepared.is_ok()
    }

    /// Sends a purchase holding stock to the backend, settles its reservation on the answer
    /// (or its absence), then answers the buyer: the backend's answer relayed, or the gateway's
    /// own decision. Every outcome is recorded in `ctx` for `logging`.
    pub(super) async fn forward_reserved(&self, session: &mut Session, ctx: &mut RequestCtx) {
        let mut req = session.req_header().clone();
        if !self.buffered_head(peer_ip(session), &mut req, ctx, ctx.body.len()) {
            self.settle_without_answer(session, ctx, Exchange::NotSent)
                .await;
            return;
        }
        ctx.upstream_attempted = true;
        ctx.stage.advance(Stage::Sent);
        let upstream = &ctx.generation.settings.upstream;
        let request = wire::request_bytes(&req, &ctx.body);
        let sent = wire::send(&self.gw.upstreams, upstream, &request).await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(e) => {
                let exchange = Exchange::failed(&e);
                self.settle_without_answer(session, ctx, exchange).await;
                return;
            }
        };
        let status = answer.header().status.as_u16();
        ctx.upstream_status = Some(status);
        if let Some(decision) = self.settle(ctx, Exchange::Answered(status)).await {
            ctx.decision = Some(decision);
            if let Err(e) = respond::decision(session, &ctx.answering(), &decision).await {
                tracing::debug!(error = %e, "could not answer the buyer");
            }
            return;
        }
        // Settled: relay the answer (or, for a browser that won from the waiting page, the
        // gateway's own); the buyer's side failing now changes nothing.
        if (200..300).contains(&status) && self.won(session, ctx, answer.header()).await {
            answer.discard().await;
            return;
        }
        let reservation = ctx.reservation.as_ref().map(|r| r.id.as_str());
        self.relay(session, answer, reservation).await;
    }

    /// Sends another route's request, whose whole body the gateway read already, to the backend
    /// and relays the answer (502 when no backend got it, 504 when none answered in time).
    pub(super) async fn forward_buffered(&self, session: &mut Session, ctx: &mut RequestCtx) {
        let mut req = session.req_header().clone();
        if !self.buffered_head(peer_ip(session), &mut req, ctx, ctx.body.len()) {
            let _ = respond::status(session, 500, None).await;
            return;
        }
        ctx.upstream_attempted = true;
        let upstream = &ctx.generation.settings.upstream;
        let request = wire::request_bytes(&req, &ctx.body);
        match wire::send(&self.gw.upstreams, upstream, &request).await {
            Ok(answer) => {
                ctx.upstream_status = Some(answer.header().status.as_u16());
                self.relay(session, answer, None).await;
            }
            Err(e) => {
                let status = match e {
                    ForwardError::NotSent(_) => 502,
                    ForwardError::NoAnswer(_) => 504,
                };
                tracing::debug!(error = %e.error(), status, "a pass-through request got no answer");
                let _ = respond::status(session, status, None).await;
            }
        }
    }

    /// Relays the backend's answer to the client as it comes (with the reservation id, for a
    /// purchase); the connection goes back to the pool once the body was read to its end.
    async fn relay(
        &self,
        session: &mut Session,
        mut answer: wire::Answer,
        reservation: Option<&str>,
    ) {
        let mut resp: ResponseHeader = answer.header().clone();
        headers::strip_response_hop_by_hop(&mut resp);
        if let Some(id) = reservation {
            // A purchase: the gateway alone speaks CORS on its routes.
            super::cors::drop_backends(&mut resp);
            let _ = resp.insert_header(headers::RESERVATION_ID, id);
        }
        if let Err(e) = session.write_response_header(Box::new(resp), false).await {
            tracing::debug!(error = %e, "the client left before the backend's answer was relayed");
            return;
        }
        let mut body_done = false;
        loop {
            match answer.body_chunk().await {
                Ok(Some(chunk)) => {
                    if let Err(e) = session.write_response_body(Some(chunk), false).await {
                        tracing::debug!(error = %e, "the client left while the answer was relayed");
                        break;
                    }
                }
                Ok(None) => {
                    body_done = true;
                    if let Err(e) = session.write_response_body(None, true).await {
                        tracing::debug!(error = %e, "the client left at the end of the answer");
                    }
                    break;
                }
                Err(wire::BodyBroke) => {
                    tracing::info!("the backend's answer broke off after its header");
                    break;
                }
            }
        }
        answer.finish(body_done);
    }

    /// No answer to relay: settle, then answer with the gateway's own decision.
    async fn settle_without_answer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        exchange: Exchange,
    ) {
        if let Some(decision) = self.settle(ctx, exchange).await {
            ctx.decision = Some(decision);
            if let Err(e) = respond::decision(session, &ctx.answering(), &decision).await {
                tracing::debug!(error = %e, "could not answer the buyer");
            }
        }
    }

    /// Acts on the exchange's settlement; returns the gateway's own answer where it replaces
    /// the backend's.
    pub(super) async fn settle(
        &self,
        ctx: &mut RequestCtx,
        exchange: Exchange,
    ) -> Option<crate::decision::Decision> {
        let reservation = ctx.reservation.clone()?;
        let activity = ctx.sale.as_ref().and_then(|f| f.activity.clone())?;
        let settings = &ctx.generation.settings;
        let lookup = settings.upstream.order_lookup.is_some();
        ctx.stage.advance(Stage::Settled);
        match settle(exchange, activity.confirm == ConfirmMode::Upstream, lookup) {
            Settlement::Confirm => {
                // The request's mark on the shutdown drain goes with the confirm.
                self.gw.lifecycle.confirm_in_background(
                    activity,
                    reservation,
                    ctx.in_flight.take(),
                );
                None
            }
            Settlement::Keep => None,
            Settlement::Ask(decision) => {
                let upstream = &settings.upstream;
                self.gw.lifecycle.settle_soon(
                    activity,
                    &reservation,
                    2 * (upstream.connect_timeout + upstream.read_timeout),
                );
                Some(decision)
            }
            Settlement::Release(reason, decision) => {
                ctx.released = self.release(ctx.sale.as_ref(), &reservation, reason).await;
                Some(decision)
            }
        }
    }
}
