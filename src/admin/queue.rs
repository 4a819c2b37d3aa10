//! `/v1/activities/{act}/queue`: a waiting room's state, read fresh from Redis, and the
//! operator's controls (pause, resume, the rate), which act for the whole fleet at once.

use super::AdminParts;
use super::{error, json_response};
use crate::config::{Activity, MAX_ADMIT_PER_SECOND};
use crate::waiting::store::Control;
use crate::waiting::view::View;
use http::{Method, Response, StatusCode};
use serde_json::{json, Value};

pub(super) async fn handle(
    gw: &AdminParts,
    activity: &Activity,
    method: &Method,
    rest: &[&str],
    query: Option<&str>,
) -> Response<Vec<u8>> {
    let Some(queue) = &activity.queue else {
        return error(
            StatusCode::NOT_FOUND,
            "no_queue",
            "this activity has no waiting room (activities[].queue)",
        );
    };
    let control = match (method, rest) {
        (&Method::GET, []) => None,
        (&Method::POST, ["pause"]) => Some(Control::Pause),
        (&Method::POST, ["resume"]) => Some(Control::Resume),
        (&Method::POST, ["rate"]) => match per_second(query) {
            Some(rate) => Some(Control::Rate(rate)),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("give the new rate as ?per_second=N, 1 to {MAX_ADMIT_PER_SECOND}"),
                )
            }
        },
        _ => return error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
    };
    let view = match control {
        None => gw.waiting.read_fresh(activity, queue).await,
        // Read first: that sets the queue up if Redis does not have it (lost, or never read).
        Some(control) => match gw.waiting.read_fresh(activity, queue).await {
            Ok(_) => gw.waiting.control(activity, control).await,
            Err(e) => Err(e),
        },
    };
    match view {
        Ok(view) => json_response(StatusCode::OK, &queue_view(&view)),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &e.to_string(),
        ),
    }
}

fn per_second(query: Option<&str>) -> Option<u32> {
    let rate: u32 = query?
        .split('&')
        .find_map(|p| p.strip_prefix("per_second="))?
        .parse()
        .ok()?;
    (1..=MAX_ADMIT_PER_SECOND).contains(&rate).then_some(rate)
}

/// The contract's fields (`length`, `cursor`, `admit_per_second`, `paused`), and what else an
/// operator (or an auditor of the draw) needs.
fn queue_view(view: &View) -> Value {
    let s = &view.state;
    json!({
        "length": view.length(),
        "cursor": view.cursor(),
        "admit_per_second": s.rate,
        "paused": s.paused,
        "held_sold_out": s.held,
        "last_ticket_number": s.seq,
        "units_left": view.left,
        "starts_at_ms": s.start_ms,
        "redis_time_ms": s.now_ms,
        // The draw's commitment (`hex(sha256(seed))`) as soon as the seed is chosen, so the
        // operator can publish it before the start; the seed itself only in `draw`, after it.
        "draw_commitment": s.commitment,
        "draw": s.drawn.map(|(drawn, seed)| json!({
            "tickets": drawn,
            "seed": crate::waiting::draw::seed_hex(&seed),
            "commitment": s.commitment,
        })),
    })
}
