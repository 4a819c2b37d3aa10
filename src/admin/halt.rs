//! `POST /v1/activities/{act}/halt` and `/resume`: the activity's fleet-wide stop (see
//! `crate::lifecycle::halt`). 200 with the activity's view (`"halted"`), 503 when Redis does
//! not answer (nothing changed, or the call may be repeated: both are idempotent).
//!
//! The resume route clears every fleet-wide stop an activity may be under: each is one call in
//! [`AdminApp::resume`], side by side. With `{"remaining": N}` it is a recount: the store forgot
//! what it sold (`stock::failover`), and the operator's count of what is left is set first.

use super::restock::{bad_request, read_body};
use super::{error, json_response, AdminApp};
use crate::config::Activity;
use crate::stock::failover::{Fence, Resumed};
use crate::stock::segments::RecountError;
use crate::stock::StoreError;
use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

impl AdminApp {
    /// `POST /v1/activities/{act}/halt`.
    pub(super) async fn halt(&self, activity: &Activity) -> Response<Vec<u8>> {
        let halted = self.gw.lifecycle.set_halt(activity, true).await.map(drop);
        self.answer_stop(activity, halted).await
    }

    /// `POST /v1/activities/{act}/resume`, with no body (or `{}`), or `{"remaining": N}`.
    pub(super) async fn resume(
        &self,
        session: &mut ServerSession,
        activity: &Activity,
    ) -> Response<Vec<u8>> {
        let body = match read_body(session).await {
            Ok(body) => body,
            Err(message) => return bad_request(message),
        };
        let (remaining, variant) = match (remaining_of(&body), super::variants::variant_of(&body)) {
            (Ok(remaining), Ok(variant)) => (remaining, variant),
            (Err(message), _) | (_, Err(message)) => return bad_request(message),
        };
        match (remaining, variant) {
            (None, None) => self.plain_resume(activity).await,
            (None, Some(_)) => bad_request(
                "a plain resume resumes every variant: name none (a recount names its variant: \
                 {\"remaining\": N, \"variant\": \"<id>\"})",
            ),
            (Some(units), variant) => {
                let settings = self.gw.settings();
                match super::variants::lane_named(&settings, activity, variant.as_deref()) {
                    Ok(lane) => self.recount(activity, lane, units).await,
                    Err(answer) => *answer,
                }
            }
        }
    }

    /// A resume: first the failover fence (`stock::failover`): the Redis masters answering now
    /// are accepted, which an SRE does once `flashgate reconcile --orders` has checked what the
    /// replaced master lost; every gateway sells again within one check. Then the halt. A store
    /// that holds less than was sold is not accepted: 409, naming why (a recount is needed).
    /// Redis not answering: 503, and a fence not accepted lifts no halt.
    ///
    /// An activity with variants resumes every variant's lane; one that lost sales refuses the
    /// resume (409 naming it) and the halt stays, while the others' masters are accepted.
    async fn plain_resume(&self, activity: &Activity) -> Response<Vec<u8>> {
        let settings = self.gw.settings();
        let mut lost = None;
        for lane in settings.activities.lanes_of(&activity.id) {
            match self.gw.store.accept_master(lane).await {
                Ok(Resumed::Accepted) => {}
                Ok(Resumed::Lost(fence)) => {
                    lost.get_or_insert((lane.clone(), fence));
                }
                Ok(Resumed::Unchecked(fence)) => {
                    return unchecked(activity, lane, &fence);
                }
                Err(e) => return self.answer_stop(activity, Err(e)).await,
            }
        }
        let Some((lane, fence)) = lost else {
            let lifted = self.gw.lifecycle.set_halt(activity, false).await.map(drop);
            return self.answer_stop(activity, lifted).await;
        };
        let (of, variant_field) = match &lane.variant {
            Some(v) => (
                format!("variant {v} of {}", activity.id),
                format!(", \"variant\": \"{v}\""),
            ),
            None => (activity.id.to_string(), String::new()),
        };
        error(
            StatusCode::CONFLICT,
            "store_lost_sales",
            &format!(
                "segment {} of {of} holds less than was sold ({}: {} reservation records, {} \
                 seen by this gateway): a plain resume would sell units twice. Count what is \
                 left (the stock less the backend's orders: flashgate reconcile --orders) and \
                 resume with {{\"remaining\": N{variant_field}}}",
                fence.segment,
                fence.lost.as_deref().unwrap_or("lost"),
                fence.held,
                fence.seen
            ),
        )
    }

    /// A resume with the operator's count: set once, while the activity is fenced, lost, or
    /// refused for lost keys, as Redis says (never this gateway's memory: another gateway's
    /// recount may have settled the loss); then the halt is lifted. A second recount of the
    /// same loss, from any gateway, at any moment, answers 409 and changes nothing:
    /// `already_recounted` (it read the loss before the first settled it) or `selling` (read
    /// after); `loss_changed` when a segment's loss changed between its read and its recount.
    /// `lane` is the stock lane recounted: the activity, or the variant named.
    async fn recount(&self, activity: &Activity, lane: &Activity, units: u64) -> Response<Vec<u8>> {
        // This gateway's check first: a fence it sees is written (fenced_at) or marked lost.
        if let Err(e) = self.gw.store.check_master(lane).await {
            return self.answer_stop(activity, Err(e)).await;
        }
        let done = match self.gw.lifecycle.recount_once(lane, units).await {
            Ok(_) => self.lift_if_whole(activity).await,
            Err(RecountError::Store(e)) => Err(e),
            Err(e @ (RecountError::TooMany { .. } | RecountError::HeldStill { .. })) => {
                return bad_request(&e.to_string())
            }
            Err(e @ RecountError::NothingLost { .. }) => {
                return error(StatusCode::CONFLICT, "selling", &e.to_string())
            }
            Err(e @ RecountError::AlreadyRecounted { .. }) => {
                return error(StatusCode::CONFLICT, "already_recounted", &e.to_string())
            }
            Err(e @ RecountError::LossChanged { .. }) => {
                return error(StatusCode::CONFLICT, "loss_changed", &e.to_string())
            }
            Err(e) => return error(StatusCode::CONFLICT, "not_on_sale", &e.to_string()),
        };
        self.answer_stop(activity, done).await
    }

    /// After a variant's recount: the activity's halt is lifted once no lane of it is fenced
    /// any more (another variant may still wait for its own count).
    async fn lift_if_whole(&self, activity: &Activity) -> Result<(), StoreError> {
        let settings = self.gw.settings();
        for lane in settings.activities.lanes_of(&activity.id) {
            if self.gw.store.check_master(lane).await?.fence.is_some() {
                return Ok(());
            }
        }
        self.gw.lifecycle.set_halt(activity, false).await.map(drop)
    }

    async fn answer_stop(
        &self,
        activity: &Activity,
        done: Result<(), StoreError>,
    ) -> Response<Vec<u8>> {
        match done {
            Ok(()) => json_response(StatusCode::OK, &self.activity_view(activity).await),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &e.to_string(),
            ),
        }
    }
}

/// 409 `orders_unchecked`: a plain resume of a fence that may hide acknowledged sales (a promoted
/// replica, a restart that was not durable) before `flashgate reconcile --orders` found the
/// backend's orders whole since it began. Says what to run.
fn unchecked(activity: &Activity, lane: &Activity, fence: &Fence) -> Response<Vec<u8>> {
    let variant_field = lane
        .variant
        .as_ref()
        .map(|v| format!(", \"variant\": \"{v}\""))
        .unwrap_or_default();
    error(
        StatusCode::CONFLICT,
        "orders_unchecked",
        &format!(
            "segment {} of {} is fenced (its Redis master changed: {} recorded, {} answering) \
             and may have lost sales the old master acknowledged; in doubt it stays fenced. \
             Check the backend's orders first: flashgate reconcile --config <gateway.yaml> \
             --activity {} --orders <file of the orders' jti, one per line> (exit 0: nothing \
             missing; then resume again), or resume with the counted remaining stock: \
             {{\"remaining\": N{variant_field}}}",
            fence.segment, lane.lane, fence.recorded, fence.current, activity.id
        ),
    )
}

/// `N` of `{"remaining": N}` (a whole number from 0 to 2^53 - 1), `None` for no body or `{}`.
/// Anything else is refused: a resume never guesses what an operator meant.
fn remaining_of(body: &[u8]) -> Result<Option<u64>, &'static str> {
    const SHAPE: &str = "the body must be empty, {}, or {\"remaining\": N} with N a whole \
                         number from 0 to 2^53 - 1";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| SHAPE)?;
    let object = value.as_object().ok_or(SHAPE)?;
    if object.keys().any(|k| k != "remaining" && k != "variant") {
        return Err(SHAPE);
    }
    match object.get("remaining") {
        None => Ok(None),
        Some(n) => n
            .as_u64()
            .filter(|&n| n <= crate::config::MAX_EXACT_INTEGER)
            .map(Some)
            .ok_or(SHAPE),
    }
}

#[cfg(test)]
mod tests {
    use super::remaining_of;

    #[test]
    fn remaining_is_a_whole_number_or_nothing() {
        assert_eq!(remaining_of(b""), Ok(None));
        assert_eq!(remaining_of(b" \n"), Ok(None));
        assert_eq!(remaining_of(b"{}"), Ok(None));
        assert_eq!(remaining_of(br#"{"remaining": 0}"#), Ok(Some(0)));
        assert_eq!(remaining_of(br#"{"remaining": 37}"#), Ok(Some(37)));
        for bad in [
            r#"{"remaining": -1}"#,
            r#"{"remaining": 1.5}"#,
            r#"{"remaining": "5"}"#,
            r#"{"remaining": null}"#,
            r#"{"remaining": 9007199254740992}"#,
            r#"{"remaining": 5, "add": 1}"#,
            r#"{"remainder": 5}"#,
            r#"[5]"#,
            "remaining=5",
        ] {
            assert!(remaining_of(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
