//! Every way a sale request can end, and the one place each maps to what the buyer sees.

use crate::catalogue::{Lang, Message};
use http::StatusCode;
use std::time::Duration;

pub use crate::catalogue::BadRequest;

crate::label_enum! {
    /// The contract's codes (the JSON `code`, and the `decision` metric label), one per kind of
    /// answer; [`Decision::reply`] maps every decision to one.
    pub enum Code {
        Passthrough => "passthrough",
        Admitted => "admitted",
        Unauthenticated => "unauthenticated",
        BadRequest => "bad_request",
        UnknownActivity => "unknown_activity",
        UnknownVariant => "unknown_variant",
        NotStarted => "not_started",
        Ended => "ended",
        RateLimited => "rate_limited",
        SoldOut => "sold_out",
        LimitExceeded => "limit_exceeded",
        Unavailable => "unavailable",
        Queued => "queued",
        InvalidTicket => "invalid_ticket",
        TicketExpired => "ticket_expired",
        MethodNotAllowed => "method_not_allowed",
        NotEligible => "not_eligible",
    }
}

/// The outcome of admission for one sale request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Stock was reserved; the request goes upstream.
    Admitted,
    Unauthenticated,
    BadRequest(BadRequest),
    /// Another method on a sale route's path than the route sells on or forwards (405, with
    /// `Allow`).
    MethodNotAllowed,
    UnknownActivity,
    /// The activity has variants, and none of them is the one named.
    UnknownVariant,
    NotStarted,
    /// Before the sale (or its waiting room) opens, with when it opens (unix ms) and the seconds
    /// until then (`Retry-After`); answered as `NotStarted`, with `opens_at` in the JSON.
    NotOpenYet {
        opens_at_ms: i64,
        in_secs: u64,
    },
    /// A sale in phases: the buyer's phase (or the public sale, for a buyer in none) has not
    /// started, though an earlier one has; answered 403 `not_eligible` with when theirs opens
    /// (unix ms) as `opens_at`, and the seconds until then (`Retry-After`).
    NotEligible {
        opens_at_ms: i64,
        in_secs: u64,
    },
    Ended,
    RateLimited {
        retry_after: Duration,
    },
    SoldOut,
    LimitExceeded,
    /// The stock store or the upstream failed; nothing is held for the buyer.
    Unavailable,
    /// The stock store could not be asked (failed, timed out, or the breaker is open).
    StoreUnavailable,
    /// The store is down and the activity forwards unreserved (`on_store_failure:
    /// passthrough`); the backend answers.
    Passthrough,
    /// Turned away by the upstream-protection queue (the backend is busy); the reservation was
    /// released. Answered 503 `unavailable`, unlike the waiting room's [`Decision::Waiting`].
    UpstreamBusy {
        position: u64,
        estimated_wait: Duration,
    },
    /// The gateway is shutting down: no new reservations.
    ShuttingDown,
    /// The activity is halted for the whole fleet (admin API) until resumed.
    Halted,
    /// The activity's waiting room: not this buyer's turn yet (or just given a ticket); the
    /// answer carries the place, the estimate and the ticket.
    Waiting,
    /// A waiting-room ticket that is forged, another buyer's or another activity's.
    InvalidTicket,
    /// A waiting-room ticket whose admission window passed.
    TicketExpired,
    /// A waiting-room ticket whose turn came while it was absent (not polled for the queue's
    /// `skip_absent_after_secs`): given to the next buyer. Answered as `ticket_expired`.
    TurnGivenAway,
}

/// What the gateway answers for a decision it makes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    pub code: &'static str,
    /// The catalogue's message, in the client's language when written.
    pub message: Message,
    /// Seconds for the `Retry-After` header, where one is sent.
    pub retry_after_secs: Option<u64>,
    /// The upstream-protection queue's answer: (position, estimated wait in ms).
    pub queue: Option<(u64, u64)>,
    /// When the sale or its waiting room opens (unix ms), before it does.
    pub opens_at_ms: Option<i64>,
}

/// Seconds a buyer is asked to wait after `unavailable`.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 1;

/// Seconds a buyer is asked to wait while the sale is halted (a halt is an operator's, and
/// lasts longer than a busy store).
pub const HALTED_RETRY_AFTER_SECS: u64 = 5;

impl Decision {
    /// Before the sale (or its waiting room) opens at `opens_at_ms` (unix ms, `None`: not
    /// known), judged at `now_ms` by the store's clock: `NotOpenYet` with the seconds until
    /// then, rounded up (a buyer coming back after them finds it open), else `NotStarted`.
    pub fn before_opening(opens_at_ms: Option<i64>, now_ms: i64) -> Decision {
        match opens_at_ms {
            Some(opens_at_ms) => Decision::NotOpenYet {
                opens_at_ms,
                in_secs: ((opens_at_ms - now_ms).max(0) as u64).div_ceil(1000),
            },
            None => Decision::NotStarted,
        }
    }

    /// A buyer whose phase opens at `opens_at_ms` (unix ms), judged at `now_ms` by the store's
    /// clock: `NotEligible` with the seconds until then, rounded up.
    pub fn not_eligible(opens_at_ms: i64, now_ms: i64) -> Decision {
        Decision::NotEligible {
            opens_at_ms,
            in_secs: ((opens_at_ms - now_ms).max(0) as u64).div_ceil(1000),
        }
    }

    /// The buyer-facing answer: status, contract code, message, Retry-After. The only mapping.
    pub fn reply(&self) -> Reply {
        use crate::catalogue::Message as M;
        use Code as C;
        use StatusCode as S;
        let (status, code, message, retry_after_secs) = match *self {
            Decision::Admitted => (S::OK, C::Admitted, M::Reserved, None),
            Decision::Unauthenticated => (S::UNAUTHORIZED, C::Unauthenticated, M::SignIn, None),
            Decision::BadRequest(why) => (S::BAD_REQUEST, C::BadRequest, M::BadRequest(why), None),
            Decision::MethodNotAllowed => (
                S::METHOD_NOT_ALLOWED,
                C::MethodNotAllowed,
                M::MethodNotAllowed,
                None,
            ),
            Decision::UnknownActivity => (S::NOT_FOUND, C::UnknownActivity, M::NoSuchSale, None),
            Decision::UnknownVariant => (S::NOT_FOUND, C::UnknownVariant, M::NoSuchVariant, None),
            Decision::NotStarted => (S::FORBIDDEN, C::NotStarted, M::NotStarted, None),
            Decision::NotOpenYet { in_secs, .. } => (
                S::FORBIDDEN,
                C::NotStarted,
                M::NotStarted,
                Some(in_secs.max(1)),
            ),
            Decision::NotEligible { in_secs, .. } => (
                S::FORBIDDEN,
                C::NotEligible,
                M::NotEligible,
                Some(in_secs.max(1)),
            ),
            Decision::Ended => (S::GONE, C::Ended, M::Ended, None),
            Decision::RateLimited { retry_after } => (
                S::TOO_MANY_REQUESTS,
                C::RateLimited,
                M::SlowDown,
                Some(ceil_secs(retry_after)),
            ),
            Decision::SoldOut => (S::GONE, C::SoldOut, M::SoldOut, None),
            Decision::LimitExceeded => (S::CONFLICT, C::LimitExceeded, M::OverLimit, None),
            Decision::Unavailable | Decision::StoreUnavailable | Decision::ShuttingDown => (
                S::SERVICE_UNAVAILABLE,
                C::Unavailable,
                M::Busy,
                Some(UNAVAILABLE_RETRY_AFTER_SECS),
            ),
            Decision::Halted => (
                S::SERVICE_UNAVAILABLE,
                C::Unavailable,
                M::Halted,
                Some(HALTED_RETRY_AFTER_SECS),
            ),
            Decision::UpstreamBusy { estimated_wait, .. } => (
                S::SERVICE_UNAVAILABLE,
                C::Unavailable,
                M::BusyQueue,
                Some(ceil_secs(estimated_wait)),
            ),
            Decision::Waiting => (S::ACCEPTED, C::Queued, M::InQueue, None),
            Decision::InvalidTicket => (S::FORBIDDEN, C::InvalidTicket, M::InvalidTicket, None),
            Decision::TicketExpired => (S::GONE, C::TicketExpired, M::TicketLapsed, None),
            Decision::TurnGivenAway => (S::GONE, C::TicketExpired, M::TicketAbsent, None),
            // Never sent by the gateway: the backend answers.
            Decision::Passthrough => (S::OK, C::Passthrough, M::Forwarded, None),
        };
        Reply {
            status,
            code: code.as_str(),
            message,
            retry_after_secs,
            queue: self.queue_place(),
            opens_at_ms: match *self {
                Decision::NotOpenYet { opens_at_ms, .. }
                | Decision::NotEligible { opens_at_ms, .. } => Some(opens_at_ms),
                _ => None,
            },
        }
    }

    /// The upstream-protection queue's place: (position, estimated wait in ms).
    fn queue_place(&self) -> Option<(u64, u64)> {
        match *self {
            Decision::UpstreamBusy {
                position,
                estimated_wait,
            } => Some((position, estimated_wait.as_millis() as u64)),
            _ => None,
        }
    }

    /// The contract code, also the `decision` metric label.
    pub fn code(&self) -> &'static str {
        self.reply().code
    }
}

/// Retry-After is whole seconds; round up so a buyer who obeys it is not refused again.
fn ceil_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

impl Reply {
    /// The JSON body `{"code": ..., "message": ...}`, the message in `lang`; for a purchase of
    /// a variant, `"variant"` too, and a sold-out message that names it.
    /// [`Reply::opens_at_ms`] as RFC 3339 (UTC, seconds), as the JSON and the page give it.
    pub fn opens_at_rfc3339(&self) -> Option<String> {
        let at = chrono::DateTime::from_timestamp_millis(self.opens_at_ms?)?;
        Some(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    }

    /// The JSON answer: `code`, `message` (naming the variant, if any), and what the decision
    /// adds. `line`: the address of the lane's second-chance line, offered with `sold_out`.
    pub fn body(&self, lang: Lang, variant: Option<&str>, line: Option<&str>) -> Vec<u8> {
        let message = match variant {
            Some(v) if self.message == Message::SoldOut => {
                std::borrow::Cow::Owned(crate::catalogue::variant_sold_out(lang, v))
            }
            _ => self.message.text(lang),
        };
        let mut body = serde_json::json!({ "code": self.code, "message": message });
        if let Some(v) = variant {
            body["variant"] = v.into();
        }
        if let Some((position, estimated_wait_ms)) = self.queue {
            body["queue_position"] = position.into();
            body["estimated_wait_ms"] = estimated_wait_ms.into();
        }
        if let Some(at) = self.opens_at_rfc3339() {
            body["opens_at"] = at.into();
        }
        if let Some(url) = line.filter(|_| self.code == Code::SoldOut.as_str()) {
            body["second_chance"] = serde_json::json!({ "join": url });
        }
        serde_json::to_vec(&body).expect("serializing a JSON value cannot fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_table() {
        let cases = [
            (Decision::Unauthenticated, 401, "unauthenticated"),
            (
                Decision::BadRequest(BadRequest::QuantityTooLarge),
                400,
                "bad_request",
            ),
            (Decision::UnknownActivity, 404, "unknown_activity"),
            (Decision::NotStarted, 403, "not_started"),
            (Decision::not_eligible(2_000, 500), 403, "not_eligible"),
            (Decision::Ended, 410, "ended"),
            (
                Decision::RateLimited {
                    retry_after: Duration::from_millis(1),
                },
                429,
                "rate_limited",
            ),
            (Decision::SoldOut, 410, "sold_out"),
            (Decision::LimitExceeded, 409, "limit_exceeded"),
            (Decision::Unavailable, 503, "unavailable"),
            (Decision::StoreUnavailable, 503, "unavailable"),
            (Decision::ShuttingDown, 503, "unavailable"),
            (Decision::Halted, 503, "unavailable"),
            (
                Decision::UpstreamBusy {
                    position: 7,
                    estimated_wait: Duration::from_millis(1500),
                },
                503,
                "unavailable",
            ),
            (Decision::Waiting, 202, "queued"),
            (Decision::InvalidTicket, 403, "invalid_ticket"),
            (Decision::TicketExpired, 410, "ticket_expired"),
            (Decision::TurnGivenAway, 410, "ticket_expired"),
        ];
        for (decision, status, code) in cases {
            assert!(Code::ALL.iter().any(|c| c.as_str() == code));
            let reply = decision.reply();
            assert_eq!(reply.status.as_u16(), status, "{decision:?}");
            assert_eq!(reply.code, code);
        }
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let r = |ms| {
            Decision::RateLimited {
                retry_after: Duration::from_millis(ms),
            }
            .reply()
            .retry_after_secs
        };
        assert_eq!(r(1), Some(1));
        assert_eq!(r(1000), Some(1));
        assert_eq!(r(1001), Some(2));
        assert_eq!(Decision::Unavailable.reply().retry_after_secs, Some(1));
        assert_eq!(Decision::SoldOut.reply().retry_after_secs, None);
    }

    #[test]
    fn body_is_the_contract_json() {
        let body = Decision::SoldOut.reply().body(Lang::En, None, None);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "sold_out");
        assert!(v["message"].is_string());
        assert!(v.get("queue_position").is_none());
        let queued = Decision::UpstreamBusy {
            position: 1234,
            estimated_wait: Duration::from_millis(15_200),
        }
        .reply();
        assert_eq!(queued.retry_after_secs, Some(16));
        let v: serde_json::Value =
            serde_json::from_slice(&queued.body(Lang::En, None, None)).unwrap();
        assert_eq!(v["code"], "unavailable");
        assert_eq!(v["queue_position"], 1234);
        assert_eq!(v["estimated_wait_ms"], 15_200);
    }

    #[test]
    fn every_answer_speaks_english_and_chinese_with_the_same_code() {
        let decisions = [
            Decision::Unauthenticated,
            Decision::BadRequest(BadRequest::QuantityTooLarge),
            Decision::UnknownActivity,
            Decision::NotStarted,
            Decision::Ended,
            Decision::RateLimited {
                retry_after: Duration::from_secs(1),
            },
            Decision::SoldOut,
            Decision::LimitExceeded,
            Decision::Unavailable,
            Decision::UpstreamBusy {
                position: 3,
                estimated_wait: Duration::from_secs(2),
            },
            Decision::Waiting,
            Decision::InvalidTicket,
            Decision::TicketExpired,
            Decision::TurnGivenAway,
        ];
        for d in decisions {
            let reply = d.reply();
            let en: serde_json::Value =
                serde_json::from_slice(&reply.body(Lang::En, None, None)).unwrap();
            let zh: serde_json::Value =
                serde_json::from_slice(&reply.body(Lang::Zh, None, None)).unwrap();
            assert_eq!(en["code"], zh["code"], "{d:?}");
            let en = en["message"].as_str().unwrap();
            assert!(
                en.starts_with(|c: char| c.is_ascii_uppercase()),
                "{d:?}: a sentence starts with a capital: {en}"
            );
            let zh = zh["message"].as_str().unwrap();
            assert!(
                zh.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)),
                "{d:?}: {zh}"
            );
        }
        let sold_out = Decision::SoldOut.reply();
        let en: serde_json::Value =
            serde_json::from_slice(&sold_out.body(Lang::En, None, None)).unwrap();
        assert_eq!(
            en,
            serde_json::json!({"code": "sold_out", "message": "Sold out"})
        );
    }
}
