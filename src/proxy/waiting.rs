//! The waiting room at the edge: the buyer's place as an answer, and the poll endpoint
//! (`GET /flashgate/queue/{activity}`). Glue only: the waiting room decides, this writes.

use super::{peer_ip, respond, FlashProxy, RequestCtx};
use crate::admission::target::Target;
use crate::admission::{Decision, LimitKind};
use crate::purchase::{presented, solution};
use crate::waiting::page::{self, Landing};
use crate::waiting::Presented;
use http::StatusCode;
use pingora::prelude::*;

fn wants_html(session: &Session) -> bool {
    page::wants_html(
        session
            .req_header()
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    )
}

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
        reply: page::Reply,
    ) -> Result<bool> {
        ctx.decision = Some(Decision::Waiting);
        respond::queue(session, reply).await.map(|()| true)
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
        let policy = &generation.policy;
        let settings = &generation.settings;
        if settings
            .activities
            .get(raw_activity)
            .is_some_and(|a| a.queue.is_none())
        {
            no_queue(session, raw_activity).await?;
            return Ok(true);
        }
        let headers = &session.req_header().headers;
        let peer = peer_ip(session);
        let answer = async {
            if let Some(ip) = policy.client_ip(headers, peer) {
                policy.take_token(LimitKind::PerIp, &ip, &self.gw.metrics)?;
            }
            let user = policy
                .identify(headers, peer)
                .ok_or(Decision::Unauthenticated)?;
            // A poll is a buyer too: it spends from the buyer's own bucket.
            policy.take_token(LimitKind::PerUser, user.as_str(), &self.gw.metrics)?;
            let activity = settings
                .activities
                .get(raw_activity)
                .filter(|a| a.queue.is_some())
                .ok_or(Decision::UnknownActivity)?
                .clone();
            let ticket = presented(&session.req_header().headers).or_else(|| {
                query_ticket(session).map(|ticket| Presented {
                    ticket,
                    from_cookie: false,
                })
            });
            let answer = self
                .gw
                .waiting
                .poll(
                    settings,
                    &activity,
                    &user,
                    ticket.as_ref(),
                    solution(&session.req_header().headers),
                )
                .await?;
            Ok::<_, Decision>((activity, answer))
        }
        .await;
        match answer {
            Ok((activity, answer)) => {
                let landing = poll_landing(settings, &activity);
                let reply = page::reply(
                    &answer,
                    StatusCode::OK,
                    wants_html(session),
                    &activity.id,
                    &landing,
                );
                respond::queue(session, reply).await?;
                Ok(true)
            }
            Err(decision) => {
                respond::decision(session, &decision).await?;
                Ok(true)
            }
        }
    }
}

/// Where the waiting page reached by a poll sends the buyer at their turn: the queue's
/// `landing_url`, else the first sale route's purchase.
fn poll_landing(settings: &crate::config::Settings, activity: &crate::config::Activity) -> Landing {
    match activity.queue.as_ref().and_then(|q| q.landing_url.clone()) {
        Some(url) => Landing::Url(url),
        None => match settings.sale_routes.first() {
            Some(route) => Landing::Purchase {
                method: route.method().to_string(),
                target: route.path_for(&activity.id),
            },
            None => Landing::Url("/".to_owned()),
        },
    }
}

/// A poll of a sale without a waiting room: said so (an app polls the wrong thing), not "no
/// such sale".
async fn no_queue(session: &mut Session, activity: &str) -> Result<()> {
    let body = serde_json::json!({
        "code": "no_queue",
        "message": format!("sale {activity} has no waiting room: buy at its sale route directly"),
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
