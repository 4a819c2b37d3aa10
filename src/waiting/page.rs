//! What a ticket holder is sent, as data: the JSON answer (the page, `crate::pages`, is made
//! from it), and the ticket's cookie (`flashgate_ticket`; the `X-Flashgate-Ticket` header
//! carries it too). The proxy writes them.

use super::view::Status;
use super::Answer;
use crate::catalogue::{Lang, Message};

/// The cookie a browser keeps its ticket in.
pub const TICKET_COOKIE: &str = "flashgate_ticket";
/// Where ticket holders poll: `POLL_PREFIX` + the activity id.
pub const POLL_PREFIX: &str = "/flashgate/queue/";

/// Where the waiting page goes when the buyer's turn comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// The queue's `landing_url` (the shop's own purchase page).
    Url(String),
    /// Submit the purchase itself: the sale route's method and target. On an activity with
    /// variants the target holds [`VARIANT_SLOT`] where the buyer's choice goes (the page
    /// lists the variants available at their turn).
    Purchase { method: String, target: String },
}

/// Where a purchase target takes the variant the buyer chooses on the waiting page.
pub const VARIANT_SLOT: &str = "{variant}";

/// The target the waiting page submits at the buyer's turn: `canonical` (the purchase as
/// asked) on an activity without variants; on one with variants, the route's path with
/// [`VARIANT_SLOT`] for the variant (in its `{variant}` segment, or as its `variant_query`),
/// the choice being the buyer's at their turn. Approximation: the query's other parameters
/// (a quantity) are not kept: the page buys one unit.
pub fn purchase_target(
    route: &crate::config::SaleRoute,
    activity: &crate::config::Activity,
    canonical: &str,
) -> String {
    if !activity.has_variants() {
        return canonical.to_owned();
    }
    let path = route.path_for(&activity.id, Some(VARIANT_SLOT));
    match route.variant_query() {
        Some(name) => format!("{path}?{name}={VARIANT_SLOT}"),
        None => path,
    }
}

/// A buyer held back at a sale route: their answer and where their page goes at their turn
/// (the proxy writes it as JSON or as the waiting page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub answer: Answer,
    pub landing: Landing,
}

/// The `code` and the catalogue's message of an answer in `status`.
pub fn code(status: &Status) -> (&'static str, Message) {
    match *status {
        Status::Waiting {
            likely_too_late: true,
            position,
            ..
        } => ("queued", Message::QueueTooLate { position }),
        Status::Waiting {
            drawn: false,
            position,
            ..
        } => ("queued", Message::QueueBeforeDraw { count: position }),
        Status::Waiting {
            paused: true,
            position,
            ..
        } => ("queued", Message::QueuePaused { position }),
        Status::Waiting { position, .. } => ("queued", Message::QueuePlace { position }),
        Status::YourTurn => ("your_turn", Message::YourTurn),
        Status::SoldOut => ("sold_out", Message::QueueSoldOut),
        Status::Expired => ("ticket_expired", Message::TicketLapsed),
        Status::GivenAway => ("ticket_expired", Message::TicketAbsent),
        Status::Bought => ("bought", Message::Bought),
        Status::Challenge => ("queued", Message::SolveChallenge),
    }
}

/// The JSON answer's fields (the contract's, plus `state`, `place_final`, `paused`), the
/// message in `lang`. While the queue is paused there is no estimate (`null`); a final state
/// (`sold_out`, `expired`, `bought`) asks for no refresh (`refresh_after_ms` absent: an app
/// following it would poll for nothing).
pub fn json(answer: &Answer, lang: Lang) -> serde_json::Value {
    match &answer.challenge {
        // No ticket yet: the proof of work to send back in `X-Flashgate-Solution`.
        Some(challenge) => {
            let (code, message) = code(&answer.status);
            serde_json::json!({
                "code": code,
                "message": message.text(lang),
                "state": answer.status.state(),
                "challenge": challenge,
            })
        }
        None => serde_json::to_value(Body::of(answer, lang)).expect("plain fields"),
    }
}

/// [`json`] written out, without building the value first for a ticket holder's answer (the
/// door's hot path: the same bytes, keys in the same sorted order).
pub fn json_bytes(answer: &Answer, lang: Lang) -> Vec<u8> {
    if answer.challenge.is_some() {
        return json(answer, lang).to_string().into_bytes();
    }
    let mut out = Vec::with_capacity(384);
    serde_json::to_writer(&mut out, &Body::of(answer, lang)).expect("plain fields");
    out
}

/// A ticket holder's JSON answer, its keys in the sorted order `serde_json::Value` writes them
/// (so [`json`] and [`json_bytes`] write the same bytes).
#[derive(serde::Serialize)]
struct Body<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    draw_commitment: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    draw_seed: Option<&'a str>,
    estimated_wait_ms: Option<u64>,
    likely_too_late: bool,
    message: std::borrow::Cow<'static, str>,
    paused: bool,
    place_final: bool,
    queue_position: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    refresh_after_ms: Option<u64>,
    state: &'static str,
    ticket: &'a str,
    /// Only when true (see [`Answer::ticket_replaced`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ticket_replaced: bool,
    /// At the buyer's turn: the admission window's time left (see [`Answer::turn_left_ms`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_left_ms: Option<u64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    variants: Vec<VariantBody<'a>>,
}

/// One variant in the answer (keys sorted, as above).
#[derive(serde::Serialize)]
struct VariantBody<'a> {
    available: bool,
    id: &'a str,
    title: &'a str,
}

impl<'a> Body<'a> {
    fn of(answer: &'a Answer, lang: Lang) -> Body<'a> {
        let (code, message) = code(&answer.status);
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
            Status::SoldOut
            | Status::Expired
            | Status::GivenAway
            | Status::Bought
            | Status::Challenge => (
                0,
                Some(0),
                None,
                matches!(answer.status, Status::SoldOut),
                true,
                false,
            ),
        };
        let draw = answer.draw.as_ref();
        Body {
            code,
            draw_commitment: draw.and_then(|d| d.commitment.as_deref()),
            draw_seed: draw.and_then(|d| d.seed.as_deref()),
            estimated_wait_ms: wait,
            likely_too_late: too_late,
            message: message.text(lang),
            paused,
            place_final: drawn,
            queue_position: position,
            refresh_after_ms: refresh,
            state: answer.status.state(),
            ticket: &answer.ticket,
            ticket_replaced: answer.ticket_replaced,
            turn_left_ms: answer.turn_left_ms,
            variants: answer
                .variants
                .iter()
                .map(|v| VariantBody {
                    available: v.available,
                    id: &v.id,
                    title: &v.title,
                })
                .collect(),
        }
    }
}

/// The `Set-Cookie` value that keeps the ticket in a browser until the sale's end.
pub fn cookie(answer: &Answer) -> String {
    let mut out = Vec::with_capacity(64 + answer.ticket.len());
    write_cookie(&mut out, answer);
    String::from_utf8(out).expect("written from strings")
}

/// [`cookie`], written into `out`.
pub fn write_cookie(out: &mut Vec<u8>, answer: &Answer) {
    use std::io::Write;
    // Writing to a Vec cannot fail.
    let _ = write!(
        out,
        "{TICKET_COOKIE}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax",
        answer.ticket,
        answer.cookie_max_age_secs.max(1)
    );
}

/// JSON safe inside a `<script>` element.
fn script_json(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The page that solves a challenge (kept apart from the waiting page: its own template, not
/// replaceable from `pages.dir`, English only).
const CHALLENGE_PAGE: &str = include_str!("challenge.html");

/// The challenge page for the answer `json`: solves it in a Web Worker, sends the solution
/// with a poll (which gives the ticket and its cookie), then loads the waiting page.
pub fn challenge_page(json: &serde_json::Value, activity: &str) -> String {
    let config = serde_json::json!({
        "poll": format!("{POLL_PREFIX}{activity}"),
        "answer": json,
    });
    CHALLENGE_PAGE.replace("{{CONFIG}}", &script_json(&config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(position: u64) -> Answer {
        Answer {
            variants: Vec::new(),
            ticket: "t1.a.1.2.x".into(),
            status: Status::Waiting {
                position,
                estimated_wait_ms: 4_000,
                refresh_after_ms: 1_000,
                likely_too_late: false,
                drawn: true,
                paused: false,
            },
            turn_left_ms: None,
            challenge: None,
            draw: None,
            cookie_max_age_secs: 60,
            ticket_replaced: false,
        }
    }

    #[test]
    fn paused_has_no_estimate_and_final_states_ask_for_no_refresh() {
        let mut paused = waiting(3);
        if let Status::Waiting { paused: p, .. } = &mut paused.status {
            *p = true;
        }
        let v = json(&paused, Lang::En);
        assert_eq!(v["paused"], true);
        assert!(v["estimated_wait_ms"].is_null(), "{v}");
        assert!(v["message"].as_str().unwrap().contains("paused"), "{v}");
        assert_eq!(json(&waiting(3), Lang::En)["paused"], false);
        for status in [Status::SoldOut, Status::Expired, Status::Bought] {
            let v = json(
                &Answer {
                    variants: Vec::new(),
                    status,
                    ..waiting(1)
                },
                Lang::En,
            );
            assert!(v.get("refresh_after_ms").is_none(), "{v}");
        }
        let turn = json(
            &Answer {
                variants: Vec::new(),
                status: Status::YourTurn,
                ..waiting(1)
            },
            Lang::En,
        );
        assert_eq!(turn["refresh_after_ms"], 1_000);
    }

    #[test]
    fn the_json_answer_has_every_contract_field() {
        let v = json(&waiting(7), Lang::En);
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
    fn the_written_answer_is_the_json_value_byte_for_byte() {
        let mut drop = waiting(5);
        drop.variants = vec![
            crate::waiting::Availability {
                id: "red".into(),
                title: "Red \"128 GB\"".into(),
                available: true,
            },
            crate::waiting::Availability {
                id: "blue".into(),
                title: "蓝".into(),
                available: false,
            },
        ];
        drop.draw = Some(crate::waiting::Published {
            commitment: Some("ab".repeat(32)),
            seed: Some("cd".repeat(32)),
        });
        let statuses = [
            waiting(1).status,
            Status::YourTurn,
            Status::SoldOut,
            Status::Expired,
            Status::GivenAway,
            Status::Bought,
        ];
        for answer in statuses
            .into_iter()
            .map(|status| Answer {
                status,
                ..waiting(2)
            })
            .chain([drop])
        {
            for lang in [Lang::En, Lang::Zh] {
                let bytes = json_bytes(&answer, lang);
                assert_eq!(
                    String::from_utf8(bytes).unwrap(),
                    json(&answer, lang).to_string(),
                    "{answer:?}"
                );
            }
        }
    }

    #[test]
    fn the_ticket_goes_in_an_http_only_cookie() {
        assert_eq!(
            cookie(&waiting(1)),
            "flashgate_ticket=t1.a.1.2.x; Path=/; Max-Age=60; HttpOnly; SameSite=Lax"
        );
    }

    #[test]
    fn the_message_follows_the_language_and_the_code_does_not() {
        let (en, zh) = (json(&waiting(3), Lang::En), json(&waiting(3), Lang::Zh));
        assert_eq!(en["message"], "You are number 3 in the queue");
        assert_eq!(zh["message"], "您排在第 3 位");
        assert_eq!(en["code"], zh["code"]);
        let bought = Answer {
            variants: Vec::new(),
            status: Status::Bought,
            ..waiting(1)
        };
        assert_eq!(json(&bought, Lang::En)["state"], "bought");
    }
}
