//! What a ticket holder is sent: the JSON answer for apps, or the waiting page for browsers
//! (`Accept: text/html`), with the ticket in the `X-Flashgate-Ticket` header and the
//! `flashgate_ticket` cookie. Built here as plain data; the proxy writes it.
//!
//! The page has no external assets: its script polls `GET /flashgate/queue/{activity}` (JSON)
//! every `refresh_after_ms`, shows the place and the estimate, and at the buyer's turn goes to
//! the queue's `landing_url`, or submits the purchase itself. Without script, it reloads itself.

use super::view::Status;
use super::Answer;
use http::StatusCode;

/// The cookie a browser keeps its ticket in.
pub const TICKET_COOKIE: &str = "flashgate_ticket";
/// Where ticket holders poll: `POLL_PREFIX` + the activity id.
pub const POLL_PREFIX: &str = "/flashgate/queue/";

/// Where the waiting page goes when the buyer's turn comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// The queue's `landing_url` (the shop's own purchase page).
    Url(String),
    /// Submit the purchase itself: the sale route's method and target.
    Purchase { method: String, target: String },
}

/// An answer ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    /// `X-Flashgate-Ticket`.
    pub ticket: String,
    /// `Set-Cookie`.
    pub cookie: String,
    pub body: Vec<u8>,
}

/// The `code` and `message` of an answer in `status`.
fn code(status: &Status) -> (&'static str, String) {
    match *status {
        Status::Waiting {
            likely_too_late: true,
            position,
            ..
        } => (
            "queued",
            format!(
                "you are number {position} in the queue, but very likely too late: \
                 the buyers ahead of you want more than is left"
            ),
        ),
        Status::Waiting {
            drawn: false,
            position,
            ..
        } => (
            "queued",
            format!(
                "you are in the queue with {position} buyers so far: places are drawn at \
                 random when the sale starts, arriving earlier gives no advantage"
            ),
        ),
        Status::Waiting {
            paused: true,
            position,
            ..
        } => (
            "queued",
            format!(
                "you are number {position} in the queue; the queue is paused for now: \
                 no one moves ahead until it runs again, keep this page open"
            ),
        ),
        Status::Waiting { position, .. } => {
            ("queued", format!("you are number {position} in the queue"))
        }
        Status::YourTurn => ("your_turn", "it is your turn: buy now".to_owned()),
        Status::SoldOut => ("sold_out", "the item is sold out".to_owned()),
        Status::Expired => (
            "ticket_expired",
            "your turn passed: the queue ticket has lapsed".to_owned(),
        ),
        Status::Challenge => (
            "queued",
            "solve the challenge (a short computation your browser does by itself) to get \
             your place in the queue"
                .to_owned(),
        ),
    }
}

/// The JSON answer's fields (the contract's, plus `state`, `place_final`, `paused`). While the
/// queue is paused there is no estimate (`null`); a final state (`sold_out`, `expired`) asks for
/// no refresh (`refresh_after_ms` absent: an app following it would poll for nothing).
pub fn json(answer: &Answer) -> serde_json::Value {
    let (code, message) = code(&answer.status);
    if let Some(challenge) = &answer.challenge {
        // No ticket yet: the proof of work to send back in `X-Flashgate-Solution`.
        return serde_json::json!({
            "code": code,
            "message": message,
            "state": answer.status.state(),
            "challenge": challenge,
        });
    }
    let (position, wait, refresh, too_late, drawn, paused) = match answer.status {
        Status::Waiting {
            position,
            estimated_wait_ms,
            refresh_after_ms,
            likely_too_late,
            drawn,
            paused,
        } => (
            position,
            (!paused).then_some(estimated_wait_ms),
            Some(refresh_after_ms),
            likely_too_late,
            drawn,
            paused,
        ),
        // At the front: nothing left to wait for; come back soon only to learn what changed.
        Status::YourTurn => (0, Some(0), Some(1_000), false, true, false),
        Status::SoldOut | Status::Expired | Status::Challenge => (
            0,
            Some(0),
            None,
            matches!(answer.status, Status::SoldOut),
            true,
            false,
        ),
    };
    let mut json = serde_json::json!({
        "code": code,
        "message": message,
        "state": answer.status.state(),
        "queue_position": position,
        "estimated_wait_ms": wait,
        "ticket": answer.ticket,
        "likely_too_late": too_late,
        "place_final": drawn,
        "paused": paused,
    });
    if let Some(refresh) = refresh {
        json["refresh_after_ms"] = refresh.into();
    }
    if let Some(draw) = &answer.draw {
        if let Some(commitment) = &draw.commitment {
            json["draw_commitment"] = commitment.as_str().into();
        }
        if let Some(seed) = &draw.seed {
            json["draw_seed"] = seed.as_str().into();
        }
    }
    json
}

/// The answer to a ticket holder: `status` (202 on a sale route, 200 on the poll endpoint),
/// JSON, or the waiting page when `html`.
pub fn reply(
    answer: &Answer,
    status: StatusCode,
    html: bool,
    activity: &str,
    landing: &Landing,
) -> Reply {
    let json = json(answer);
    // No ticket yet (a challenge): no header, no cookie.
    let cookie = match answer.ticket.as_str() {
        "" => String::new(),
        ticket => format!(
            "{TICKET_COOKIE}={ticket}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax",
            answer.cookie_max_age_secs.max(1)
        ),
    };
    let (content_type, body) = if html && answer.challenge.is_some() {
        (
            "text/html; charset=utf-8",
            challenge_page(&json, activity).into_bytes(),
        )
    } else if html {
        (
            "text/html; charset=utf-8",
            page(&json, activity, landing).into_bytes(),
        )
    } else {
        ("application/json", json.to_string().into_bytes())
    };
    Reply {
        status,
        content_type,
        ticket: answer.ticket.clone(),
        cookie,
        body,
    }
}

/// Whether the client asked for a page (a browser's navigation) rather than JSON.
pub fn wants_html(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',')
            .any(|m| m.trim().split(';').next() == Some("text/html"))
    })
}

/// JSON safe inside a `<script>` element.
fn script_json(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const PAGE: &str = include_str!("waiting.html");
/// The page that solves a challenge (kept apart from the waiting page: its own template).
const CHALLENGE_PAGE: &str = include_str!("challenge.html");

/// The challenge page for the answer `json`: solves it in a Web Worker, sends the solution
/// with a poll (which gives the ticket and its cookie), then loads the waiting page.
fn challenge_page(json: &serde_json::Value, activity: &str) -> String {
    let config = serde_json::json!({
        "poll": format!("{POLL_PREFIX}{activity}"),
        "answer": json,
    });
    CHALLENGE_PAGE.replace("{{CONFIG}}", &script_json(&config))
}

/// The waiting page for the answer `json`.
fn page(json: &serde_json::Value, activity: &str, landing: &Landing) -> String {
    let landing = match landing {
        Landing::Url(url) => serde_json::json!({ "url": url }),
        Landing::Purchase { method, target } => {
            serde_json::json!({ "method": method, "target": target })
        }
    };
    let config = serde_json::json!({
        "poll": format!("{POLL_PREFIX}{activity}"),
        "answer": json,
        "landing": landing,
    });
    let refresh_secs = (json["refresh_after_ms"].as_u64().unwrap_or(5_000) / 1000).max(1);
    PAGE.replace(
        "{{MESSAGE}}",
        &escape(json["message"].as_str().unwrap_or("")),
    )
    .replace("{{REFRESH_SECS}}", &refresh_secs.to_string())
    .replace("{{CONFIG}}", &script_json(&config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(position: u64) -> Answer {
        Answer {
            ticket: "t1.a.1.2.x".into(),
            status: Status::Waiting {
                position,
                estimated_wait_ms: 4_000,
                refresh_after_ms: 1_000,
                likely_too_late: false,
                drawn: true,
                paused: false,
            },
            challenge: None,
            draw: None,
            cookie_max_age_secs: 60,
        }
    }

    #[test]
    fn paused_has_no_estimate_and_final_states_ask_for_no_refresh() {
        let mut paused = waiting(3);
        if let Status::Waiting { paused: p, .. } = &mut paused.status {
            *p = true;
        }
        let v = json(&paused);
        assert_eq!(v["paused"], true);
        assert!(v["estimated_wait_ms"].is_null(), "{v}");
        assert!(v["message"].as_str().unwrap().contains("paused"), "{v}");
        assert_eq!(json(&waiting(3))["paused"], false);
        for status in [Status::SoldOut, Status::Expired] {
            let v = json(&Answer {
                status,
                ..waiting(1)
            });
            assert!(v.get("refresh_after_ms").is_none(), "{v}");
        }
        let turn = json(&Answer {
            status: Status::YourTurn,
            ..waiting(1)
        });
        assert_eq!(turn["refresh_after_ms"], 1_000);
    }

    #[test]
    fn the_json_answer_has_every_contract_field() {
        let v = json(&waiting(7));
        for field in [
            "code",
            "message",
            "queue_position",
            "estimated_wait_ms",
            "refresh_after_ms",
            "ticket",
            "likely_too_late",
            "state",
        ] {
            assert!(v.get(field).is_some(), "{field} missing in {v}");
        }
        assert_eq!(v["code"], "queued");
        assert_eq!(v["queue_position"], 7);
        assert_eq!(v["state"], "waiting");
    }

    #[test]
    fn the_ticket_goes_in_a_header_and_an_http_only_cookie() {
        let r = reply(
            &waiting(1),
            StatusCode::ACCEPTED,
            false,
            "a",
            &Landing::Url("/buy".into()),
        );
        assert_eq!(r.ticket, "t1.a.1.2.x");
        assert_eq!(
            r.cookie,
            "flashgate_ticket=t1.a.1.2.x; Path=/; Max-Age=60; HttpOnly; SameSite=Lax"
        );
        assert_eq!(r.content_type, "application/json");
    }

    #[test]
    fn the_page_cannot_be_broken_out_of() {
        let landing = Landing::Purchase {
            method: "POST".into(),
            target: "/seckill/a?x=</script><script>alert(1)</script>".into(),
        };
        let r = reply(&waiting(3), StatusCode::ACCEPTED, true, "a", &landing);
        let html = String::from_utf8(r.body).unwrap();
        assert_eq!(
            html.matches("</script>").count(),
            html.matches("<script").count()
        );
        assert!(!html.contains("alert(1)</script>"));
        assert!(html.contains("you are number 3 in the queue"));
    }

    #[test]
    fn browsers_get_the_page_and_apps_json() {
        assert!(wants_html(Some(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        )));
        assert!(!wants_html(Some("application/json")));
        assert!(!wants_html(Some("*/*")));
        assert!(!wants_html(None));
    }
}
