//! The waiting room at the edge: the buyer's place as an answer, and the poll endpoint
//! (`GET /flashgate/queue/{activity}`). Glue only: the waiting room decides, this writes.

use super::{peer_ip, respond, FlashProxy, RequestCtx};
use crate::client_policy::LimitKind;
use crate::config::{Activity, Settings};
use crate::decision::Decision;
use crate::edge::target::Target;
use crate::purchase::{presented, solution};
use crate::waiting::page::{self, Landing};
use crate::waiting::Presented;
use http::StatusCode;
use pingora::prelude::*;

/// The activity of a poll (`GET /flashgate/queue/{activity}`, read as sale routes are), if
/// the request is one.
pub(super) fn poll_activity(target: &Target) -> Option<&str> {
    if target.method != http::Method::GET {
        return None;
    }
    match target.segments.as_deref().ok()? {
        [a, b, id] if a == "flashgate" && b == "queue" => Some(id),
        _ => None,
    }
}

impl FlashProxy {
    /// Answers with the buyer's place (202 `queued`).
    pub(super) async fn answer_queued(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        queued: page::Queued,
    ) -> Result<bool> {
        ctx.decision = Some(Decision::Waiting);
        let how = ctx.answering();
        respond::queue(session, &how, StatusCode::ACCEPTED, &queued, None)
            .await
            .map(|()| true)
    }

    /// `GET /flashgate/queue/{activity}`: where the buyer stands (from memory; a buyer without
    /// a ticket is given one).
    pub(super) async fn queue_poll(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        raw_activity: &str,
    ) -> Result<bool> {
        let generation = ctx.generation.clone();
        let settings = &generation.settings;
        if settings
            .activities
            .get(raw_activity)
            .is_some_and(|a| a.queue.is_none())
        {
            no_queue(session, ctx.client.lang).await?;
            return Ok(true);
        }
        let answer = self.poll_answer(session, &generation, raw_activity).await;
        match answer {
            Ok((activity, answer)) => {
                let landing = landing(settings, &activity);
                let how = respond::Answering {
                    sale: Some(generation.sale_page(&activity.id)),
                    ..ctx.answering()
                };
                let queued = page::Queued { answer, landing };
                respond::queue(session, &how, StatusCode::OK, &queued, None).await?;
                Ok(true)
            }
            Err(decision) => {
                let how = respond::Answering {
                    sale: settings
                        .activities
                        .get(raw_activity)
                        .map(|a| generation.sale_page(&a.id)),
                    ..ctx.answering()
                };
                respond::decision(session, &how, &decision).await?;
                Ok(true)
            }
        }
    }

    /// The poll's answer: the buyer identified and their buckets spent, then where their
    /// ticket stands, sizes sold out here since the last queue read left unoffered.
    async fn poll_answer(
        &self,
        session: &Session,
        generation: &crate::live::Generation,
        raw_activity: &str,
    ) -> std::result::Result<
        (
            std::sync::Arc<crate::config::Activity>,
            crate::waiting::Answer,
        ),
        Decision,
    > {
        let (policy, settings) = (&generation.policy, &generation.settings);
        let headers = &session.req_header().headers;
        let peer = peer_ip(session);
        if let Some(ip) = policy.client_ip(headers, peer) {
            self.spend(generation, LimitKind::PerIp, &ip.to_string())
                .await?;
        }
        let user = policy
            .identify(headers, peer)
            .map_err(|why| why.decision())?
            .user;
        // A poll is a buyer too: it spends from the buyer's own bucket.
        self.spend(generation, LimitKind::PerUser, &user).await?;
        let activity = settings
            .activities
            .get(raw_activity)
            .filter(|a| a.queue.is_some())
            .ok_or(Decision::UnknownActivity)?
            .clone();
        let ticket = presented(headers).or_else(|| {
            query_ticket(session).map(|ticket| Presented {
                ticket,
                from_cookie: false,
            })
        });
        let mut answer = self
            .gw
            .waiting
            .poll(
                settings,
                &activity,
                &user,
                ticket.as_ref(),
                solution(headers),
            )
            .await?;
        // A size whose last unit sold here (or that news said sold out) is no longer
        // offered, without waiting for the next queue read (250 ms).
        for v in answer.variants.iter_mut() {
            v.available &= !self.variant_sold_out(settings, &activity.id, &v.id);
        }
        Ok((activity, answer))
    }

    /// A poll is a buyer too: it spends from the client IP's and the buyer's buckets (the
    /// fleet's where `scope: fleet`), as a purchase does.
    async fn spend(
        &self,
        generation: &crate::live::Generation,
        kind: LimitKind,
        key: &str,
    ) -> std::result::Result<(), Decision> {
        self.gw
            .checkout
            .buckets
            .take(generation.rules(), kind, key)
            .await
    }
}

/// Where a poller's page goes at their turn: the queue's `landing_url`, else the purchase at
/// the first sale route (the first that names a variant, for an activity with variants).
fn landing(settings: &Settings, activity: &Activity) -> Landing {
    let routes = &settings.sale_routes;
    let route = match activity.has_variants() {
        true => routes.iter().find(|r| r.names_variants()),
        false => routes.first(),
    };
    match activity.queue.as_ref().and_then(|q| q.landing_url.clone()) {
        Some(url) => Landing::Url(url),
        None => match route {
            Some(route) => Landing::Purchase {
                method: route.method().to_string(),
                target: crate::waiting::page::purchase_target(
                    route,
                    activity,
                    &route.path_for(&activity.id, None),
                ),
            },
            None => Landing::Url("/".to_owned()),
        },
    }
}

/// A poll of a sale without a waiting room: said so (an app polls the wrong thing), not "no
/// such sale", in the buyer's language.
async fn no_queue(session: &mut Session, lang: crate::catalogue::Lang) -> Result<()> {
    let body = serde_json::json!({
        "code": "no_queue",
        "message": crate::catalogue::Message::NoQueue.text(lang),
    });
    respond::json(session, 404, &body).await
}

/// `?ticket=` on a poll (a link the shop's page built). A ticket is URL-safe as it is.
fn query_ticket(session: &Session) -> Option<String> {
    let query = session.req_header().uri.query()?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("ticket="))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_paths_name_one_activity() {
        let poll = |m: &str, p: &str| {
            let t = Target::of(
                &http::Method::from_bytes(m.as_bytes()).unwrap(),
                p.as_bytes(),
            );
            poll_activity(&t).map(str::to_owned)
        };
        assert_eq!(
            poll("GET", "/flashgate/queue/1001").as_deref(),
            Some("1001")
        );
        assert_eq!(
            poll("GET", "/flashgate/queue/1001?ticket=x").as_deref(),
            Some("1001")
        );
        assert_eq!(
            poll("get", "/flashgate//queue/%31001").as_deref(),
            Some("1001")
        );
        assert_eq!(poll("GET", "/flashgate/queue/"), None);
        assert_eq!(poll("GET", "/flashgate/queue/1001/x"), None);
        assert_eq!(poll("POST", "/flashgate/queue/1001"), None);
    }
}
