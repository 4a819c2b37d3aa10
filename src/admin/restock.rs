//! `POST /v1/activities/{act}/restock` with `{"add": N}`: N units more for the version on
//! sale, atomically, once per `Idempotency-Key`, for the whole fleet (the units live in Redis;
//! every gateway's sold-out mark is lifted by news). 200 with the activity's view; 400 for an
//! `add` that is not a whole number >= 1; 409 when no version of it is on sale here (ended,
//! refused by Redis's record, never put on sale, or retired).

use super::{error, json_response, AdminApp};
use crate::config::Activity;
use crate::stock::RestockOutcome;
use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

/// The largest body the call reads (`{"add": N}` is a few bytes).
const MAX_BODY_BYTES: usize = 4096;

/// The longest `Idempotency-Key` kept (it becomes a hash field in Redis).
const MAX_KEY_LEN: usize = 200;

impl AdminApp {
    pub(super) async fn restock(
        &self,
        session: &mut ServerSession,
        activity: &Activity,
    ) -> Response<Vec<u8>> {
        let key = session
            .req_header()
            .headers
            .get("idempotency-key")
            .map(|v| v.to_str().map(str::to_owned));
        let key = match key {
            None => None,
            Some(Ok(k)) if !k.is_empty() && k.len() <= MAX_KEY_LEN => Some(k),
            Some(_) => {
                return bad_request("Idempotency-Key must be 1 to 200 visible ASCII characters")
            }
        };
        let (units, variant) =
            match read_body(session).await {
                Ok(body) => match (add_of(&body), super::variants::variant_of(&body)) {
                    (Some(units), Ok(variant)) => (units, variant),
                    (_, Err(message)) => return bad_request(message),
                    (None, _) => return bad_request(
                        "the body must be {\"add\": N} with N a whole number from 1 to 2^53 - 1",
                    ),
                },
                Err(message) => return bad_request(message),
            };
        let settings = self.gw.settings();
        let lane = match super::variants::lane_named(&settings, activity, variant.as_deref()) {
            Ok(lane) => lane.clone(),
            Err(answer) => return *answer,
        };
        self.restock_lane(activity, &lane, units, key).await
    }

    /// The restock of one stock lane (the activity, or the variant named); answered with the
    /// activity's view.
    async fn restock_lane(
        &self,
        parent: &Activity,
        activity: &Activity,
        units: u64,
        key: Option<String>,
    ) -> Response<Vec<u8>> {
        if let Some(refusal) = self.gw.lifecycle.state().refusal(&activity.lane) {
            if refusal.applies_to(activity) {
                return conflict(&format!("not on sale: {refusal}"));
            }
        }
        if self.gw.store.clock().now() >= activity.ends_at {
            return conflict("the sale has ended (by Redis's clock): nothing to restock");
        }
        let expire_at = self.gw.store.expire_at(activity);
        match self
            .gw
            .lifecycle
            .restock(activity, units, key.as_deref(), expire_at)
            .await
        {
            Ok(RestockOutcome::Added { .. } | RestockOutcome::Repeated { .. }) => {
                json_response(StatusCode::OK, &self.activity_view(parent).await)
            }
            Ok(RestockOutcome::NotOnSale) => conflict(&format!(
                "version {} of {} is not on sale in Redis (never put on sale, retired by a newer \
                 version, or its keys expired)",
                activity.version, activity.id
            )),
            Ok(RestockOutcome::TooMany { remaining }) => bad_request(&format!(
                "{remaining} units are on sale: adding {units} would pass 2^53 - 1, the largest \
                 stock kept exact"
            )),
            Ok(RestockOutcome::OtherVariant { variant }) => error(
                StatusCode::CONFLICT,
                "key_used",
                &format!(
                    "this Idempotency-Key restocked variant {variant} of {} already: nothing \
                     added; use a new key for another variant",
                    parent.id
                ),
            ),
            Ok(RestockOutcome::Damaged) => conflict(&format!(
                "the ledger of version {} of {} is gone: the segment is damaged, nothing added",
                activity.version, activity.id
            )),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &format!("nothing added: {e}; retry with the same Idempotency-Key"),
            ),
        }
    }
}

/// The request body, at most [`MAX_BODY_BYTES`].
pub(super) async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, &'static str> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_BODY_BYTES {
                    return Err("the body is too large");
                }
            }
            Ok(None) => return Ok(body),
            Err(_) => return Err("the body could not be read"),
        }
    }
}

/// `N` of `{"add": N}`: a whole number from 1 to 2^53 - 1 (not a string, a fraction, a
/// negative, or past what stays exact in Redis's Lua).
fn add_of(body: &[u8]) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value
        .get("add")?
        .as_u64()
        .filter(|&n| (1..=crate::config::MAX_EXACT_INTEGER).contains(&n))
}

pub(super) fn bad_request(message: &str) -> Response<Vec<u8>> {
    error(StatusCode::BAD_REQUEST, "bad_request", message)
}

fn conflict(message: &str) -> Response<Vec<u8>> {
    error(StatusCode::CONFLICT, "not_on_sale", message)
}

#[cfg(test)]
mod tests {
    #[test]
    fn add_is_a_whole_number_of_at_least_one() {
        use super::add_of;
        assert_eq!(add_of(br#"{"add": 100}"#), Some(100));
        for bad in [
            r#"{"add": 0}"#,
            r#"{"add": -3}"#,
            r#"{"add": 1.5}"#,
            r#"{"add": "5"}"#,
            r#"{"add": 9007199254740992}"#,
            r#"{"units": 5}"#,
            r#"[5]"#,
            "add=5",
            "",
        ] {
            assert_eq!(add_of(bad.as_bytes()), None, "{bad}");
        }
    }
}
