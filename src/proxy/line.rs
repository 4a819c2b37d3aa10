//! The second-chance line at the edge: `POST /flashgate/line/{activity}[/{variant}]` joins it,
//! `GET` on the same address says where the buyer stands. Glue only: the line is in Redis
//! (`crate::stock`'s `line`), its tickets and address in `crate::waiting::line`.

use super::{peer_ip, respond, FlashProxy, RequestCtx};
use crate::client_policy::LimitKind;
use crate::config::Activity;
use crate::decision::{BadRequest, Decision};
use crate::edge::target::Target;
use crate::stock::{LineAnswer as Asked, LineAsk, LineView};
use crate::waiting::line::{self, LineAnswer};
use pingora::prelude::*;
use std::sync::Arc;

/// The lane a line's address names (`POST` joins, `GET` polls), if the request is one.
pub(super) fn line_address(target: &Target) -> Option<(LineAsk, String, Option<String>)> {
    let ask = match target.method {
        http::Method::POST => LineAsk::Join,
        http::Method::GET => LineAsk::Poll,
        _ => return None,
    };
    let segments = target.segments.as_deref().ok()?;
    let (activity, variant) = line::addressed(segments)?;
    Some((ask, activity.to_owned(), variant.map(str::to_owned)))
}

impl FlashProxy {
    /// Joins the line or says where the buyer stands in it.
    pub(super) async fn line(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        (ask, activity, variant): (LineAsk, String, Option<String>),
    ) -> Result<bool> {
        let answered = self
            .line_answer(session, ctx, ask, &activity, variant.as_deref())
            .await;
        let (status, answer) = match answered {
            Ok(answered) => answered,
            Err(decision) => {
                respond::decision(session, &ctx.answering(), &decision).await?;
                return Ok(true);
            }
        };
        let cookie = format!(
            "{}={}; Path=/; HttpOnly; SameSite=Lax",
            crate::waiting::page::TICKET_COOKIE,
            answer.ticket
        );
        if !ctx.client.html {
            let body = serde_json::to_value(&answer).expect("a line answer serialises");
            respond::json_with_cookie(session, status, &body, &cookie).await?;
        } else if ask == LineAsk::Join {
            // Post, then redirect, then get: the page refreshes itself without joining again.
            let here = session.req_header().uri.path().to_owned();
            respond::joined_line(session, &here, &cookie).await?;
        } else {
            let page = crate::pages::LinePage {
                sale: Some(ctx.generation.sale_page(&activity)),
                message: &answer.message,
                place: answer.place,
                waiting: answer.waiting,
                hold_left_ms: answer.hold_left_ms,
                buy: answer.buy.as_deref(),
            };
            let html = ctx.generation.pages.line(ctx.client.lang, &page);
            respond::line_page(session, &ctx.generation.pages, 200, html, &cookie).await?;
        }
        Ok(true)
    }

    async fn line_answer(
        &self,
        session: &Session,
        ctx: &RequestCtx,
        ask: LineAsk,
        activity: &str,
        variant: Option<&str>,
    ) -> std::result::Result<(u16, LineAnswer), Decision> {
        let generation = ctx.generation.clone();
        let (policy, settings) = (&generation.policy, &generation.settings);
        let headers = &session.req_header().headers;
        let peer = peer_ip(session);
        let buckets = &self.gw.checkout.buckets;
        if let Some(ip) = policy.client_ip(headers, peer) {
            (buckets.take(generation.rules(), LimitKind::PerIp, &ip.to_string())).await?;
        }
        let user = policy
            .identify(headers, peer)
            .map_err(|why| why.decision())?
            .user;
        buckets
            .take(generation.rules(), LimitKind::PerUser, &user)
            .await?;
        let lane: Arc<Activity> = settings
            .activities
            .lane(activity, variant)
            .filter(|l| l.second_chance.is_some())
            .ok_or(Decision::UnknownActivity)?
            .clone();
        let now = self.gw.checkout.now();
        if ask == LineAsk::Join && lane.has_phases() && now < lane.starts_at {
            // Before the public start a buyer's limit and whether they may buy at all are
            // their phase's: the line opens to everyone at the public start.
            let (at, now) = (lane.starts_at.timestamp_millis(), now.timestamp_millis());
            return Err(Decision::not_eligible(at, now));
        }
        let view = self.gw.waiting.line(&lane, ask, &user).await.map_err(|e| {
            tracing::warn!(activity = %lane.id, error = %e, "second-chance line failed");
            Decision::Unavailable
        })?;
        let status = match view.answer {
            Asked::NotSoldOut => {
                return Err(Decision::BadRequest(BadRequest::LineWhileOnSale));
            }
            Asked::AtLimit => return Err(Decision::LimitExceeded),
            Asked::NotInLine => return Err(Decision::TicketExpired),
            Asked::Joined => 202,
            Asked::Polled | Asked::Advanced => 200,
        };
        let key = &settings.signing.ticket_key;
        let buy = buy_target(settings, &lane);
        Ok((
            status,
            answer(ctx, &view, line::ticket(key, &lane.lane, &user), buy),
        ))
    }
}

/// Where a buyer in the line buys: the first sale route (the first that names a variant, for a
/// variant's lane), with the variant in its path or query as the route names it.
fn buy_target(settings: &crate::config::Settings, lane: &Activity) -> Option<String> {
    let routes = &settings.sale_routes;
    let route = match lane.has_variants() {
        true => routes.iter().find(|r| r.names_variants()),
        false => routes.first(),
    }?;
    let path = route.path_for(&lane.id, lane.variant.as_deref());
    Some(match (&lane.variant, route.variant_query()) {
        (Some(variant), Some(name)) => format!("{path}?{name}={variant}"),
        _ => path,
    })
}

/// The answer to a buyer in the line, in their language.
fn answer(ctx: &RequestCtx, view: &LineView, ticket: String, buy: Option<String>) -> LineAnswer {
    use crate::catalogue::Message;
    let turn = view.hold_left_ms > 0;
    let message = match turn {
        true => Message::LineYourTurn,
        false => Message::LinePlace {
            position: view.place,
        },
    };
    LineAnswer {
        code: if turn { "your_turn" } else { "queued" },
        message: message.text(ctx.client.lang).into_owned(),
        ticket,
        place: view.place,
        waiting: view.waiting,
        held: view.held,
        hold_left_ms: turn.then_some(view.hold_left_ms),
        buy: buy.filter(|_| turn),
    }
}
