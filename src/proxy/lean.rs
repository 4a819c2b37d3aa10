//! A purchase the front judged that holds stock, forwarded by the front itself: the same steps
//! as the proxy's session takes for one (`forward.rs`: held, a slot at the backend, the
//! request's headers as every forwarded request gets them, settled on the backend's answer
//! before anything is relayed), on the lean exchange (`crate::upstream::wire`), with the
//! request written from bytes in one write and the answer relayed on the buyer's connection
//! as it comes. Only JSON clients come here (the front judges no other), so a win is always the
//! backend's answer relayed, never a page.

use super::early::Decided;
use super::settle::{Exchange, Stage};
use super::{headers, respond, FlashProxy, RequestCtx};
use crate::purchase::Verdict;
use crate::upstream::wire;
use pingora::http::RequestHeader;
use pingora::protocols::Stream;
use pingora::proxy::ProxyHttp;
use std::net::IpAddr;
use tokio::io::AsyncWriteExt;

impl FlashProxy {
    /// Forwards a purchase holding stock that the front judged from `req`, then answers the
    /// buyer on `buyer` (the backend's answer, or the gateway's own decision); recorded once,
    /// as `logging` records the proxy's. `close`: the buyer's connection ends after the
    /// answer. Whether it may be kept.
    pub async fn forward_early(
        &self,
        buyer: &mut Stream,
        req: Box<RequestHeader>,
        peer: Option<IpAddr>,
        mut decided: Box<Decided>,
        close: bool,
    ) -> bool {
        let mut ctx = self.new_ctx();
        let Some(Verdict::Reserved(reservation)) = decided.adopt(&mut ctx) else {
            // Only stock held comes here (`Early::Forward`).
            return false;
        };
        drop(decided);
        self.take_hold(&mut ctx, reservation).await;
        let keep = match self.take_slot(&mut ctx).await {
            Ok(()) => self.exchange_early(buyer, req, peer, &mut ctx, close).await,
            Err(turned_away) => {
                ctx.decision = Some(turned_away);
                answer(buyer, &ctx, close).await
            }
        };
        self.record_request(&ctx, None);
        keep
    }

    /// The exchange with the backend and the buyer's answer.
    async fn exchange_early(
        &self,
        buyer: &mut Stream,
        req: Box<RequestHeader>,
        peer: Option<IpAddr>,
        ctx: &mut RequestCtx,
        close: bool,
    ) -> bool {
        let Some(request) = self.request_bytes(req, peer, ctx) else {
            if let Some(decision) = self.settle(ctx, Exchange::NotSent).await {
                ctx.decision = Some(decision);
            }
            return answer(buyer, ctx, close).await;
        };
        ctx.upstream_attempted = true;
        ctx.stage.advance(Stage::Sent);
        let upstream = &ctx.generation.settings.upstream;
        let sent = wire::send(&self.gw.upstreams, upstream, &request).await;
        let mut backend = match sent {
            Ok(backend) => backend,
            Err(e) => {
                let exchange = Exchange::failed(&e);
                if let Some(decision) = self.settle(ctx, exchange).await {
                    ctx.decision = Some(decision);
                }
                return answer(buyer, ctx, close).await;
            }
        };
        let status = backend.header().status.as_u16();
        ctx.upstream_status = Some(status);
        if let Some(decision) = self.settle(ctx, Exchange::Answered(status)).await {
            ctx.decision = Some(decision);
            // The buyer is answered at once; that connection is not used again (its body is
            // not read).
            drop(backend);
            return answer(buyer, ctx, close).await;
        }
        if (200..300).contains(&status) {
            self.tell_room_bought(ctx).await;
        }
        // Settled: relay the answer; the buyer's side failing now changes nothing.
        let resp = backend.header_mut();
        headers::strip_response_hop_by_hop(resp);
        super::cors::drop_backends(resp);
        if !ctx
            .generation
            .settings
            .server
            .cors
            .allowed_origins
            .is_empty()
        {
            // As the CORS module decorates the proxy's answers on sale routes.
            let _ = resp.append_header(http::header::VARY, "Origin");
        }
        if let Some(reservation) = &ctx.reservation {
            let _ = resp.insert_header(headers::RESERVATION_ID, reservation.id.as_str());
        }
        backend.relay(buyer, close).await
    }

    /// The request the backend gets, as bytes: the buyer's head (taken, not copied: the front
    /// read it for this request only) with the headers every forwarded purchase gets
    /// (`prepare_upstream`: the canonical target, the signed reservation, forwarding headers),
    /// and an empty body. `None` if it cannot be made.
    fn request_bytes(
        &self,
        mut up: Box<RequestHeader>,
        peer: Option<IpAddr>,
        ctx: &mut RequestCtx,
    ) -> Option<Vec<u8>> {
        if !self.buffered_head(peer, &mut up, ctx, 0) {
            return None;
        }
        Some(wire::request_bytes(&up, b""))
    }
}

/// Writes the gateway's own answer (the decision in `ctx`) to the buyer; whether the
/// connection may be kept.
async fn answer(buyer: &mut Stream, ctx: &RequestCtx, close: bool) -> bool {
    let Some(decision) = ctx.decision else {
        return false;
    };
    let cors_on = !ctx
        .generation
        .settings
        .server
        .cors
        .allowed_origins
        .is_empty();
    let lane = ctx.sale.as_ref().and_then(|f| f.activity.as_deref());
    let bytes = respond::decision_bytes(ctx.client.lang, &decision, lane, cors_on, close);
    let written = buyer.write_all(&bytes).await.is_ok() && buyer.flush().await.is_ok();
    written && !close
}
