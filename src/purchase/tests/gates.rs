//! The gates one by one, and their order: where the quantity comes from, the waiting room's
//! answers, purchases held back (replay only), the hours, and that refusals which need no body
//! never wait for one.

use super::*;

fn waiting_answer() -> waiting::Turn {
    waiting::Turn::Wait(Answer {
        variants: Vec::new(),
        ticket: "t-1".into(),
        status: Status::Waiting {
            position: 5,
            estimated_wait_ms: 5_000,
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
    })
}

fn queued_settings() -> Settings {
    settings(", queue: { admit_per_second: 1 }", "")
}

#[test]
fn a_quantity_the_body_names_must_be_the_one_the_query_admitted() {
    let h = Harness::new(
        settings("", ""),
        vec![reserved(Some(8), false), reserved(Some(8), false)],
    );
    let json = [("content-type", "application/json")];
    // The body agrees with the query: one purchase of two.
    assert!(h
        .buy_with_body(Some("u"), "/buy/a1?qty=2", &json, br#"{"qty":2}"#)
        .is_ok());
    // A body naming the quantity the query left at 1.
    assert_eq!(
        h.buy_with_body(Some("u"), "/buy/a1", &json, br#"{"qty":3}"#)
            .unwrap_err(),
        Decision::BadRequest(BadRequest::QuantityAmbiguous)
    );
    // A body no backend reads the same way.
    assert_eq!(
        h.buy_with_body(Some("u"), "/buy/a1", &json, br#"{"qty":NaN}"#)
            .unwrap_err(),
        Decision::BadRequest(BadRequest::MalformedBody)
    );
    assert!(h.buy_with_body(Some("u"), "/buy/a1", &[], b"qty=1").is_ok());
    assert_eq!(h.stock.asked.lock().len(), 2, "refused before the store");
}

#[test]
fn a_buyer_without_their_turn_gets_their_place_and_takes_nothing() {
    let h = Harness::new(queued_settings(), vec![]);
    *h.room.answer.lock() = Some(waiting_answer());
    let placed = h.buy(Some("u"), "/buy/a1", &[("x-flashgate-ticket", "t-0")]);
    let Ok(Verdict::Queue(reply)) = placed else {
        panic!("queued: {placed:?}");
    };
    assert_eq!(reply.answer.ticket, "t-1");
    assert!(
        matches!(
            reply.landing,
            crate::waiting::page::Landing::Purchase { .. }
        ),
        "{reply:?}"
    );
    assert_eq!(
        *h.room.asked.lock(),
        [("u".to_owned(), Some("t-0".to_owned()))]
    );
    assert!(h.stock.asked.lock().is_empty());
    // Refused by the room: its decision, still no store call.
    *h.room.answer.lock() = Some(waiting::Turn::Refuse(Decision::TicketExpired));
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
        Decision::TicketExpired
    );
    assert!(h.stock.asked.lock().is_empty());
}

#[test]
fn a_keyed_buyer_held_back_gets_their_reservation_or_the_hold_backs_answer() {
    let top = "rate_limits: { per_activity: { per_second: 1, burst: 1 } }\n";
    let h = Harness::new(
        settings(", queue: { admit_per_second: 1 }", top),
        vec![
            Ok(ReserveAnswer::NotReplayed),
            reserved(Some(8), true),
            Ok(ReserveAnswer::NotReplayed),
            reserved(Some(8), false),
        ],
    );
    let keyed = [("idempotency-key", "k")];
    *h.room.answer.lock() = Some(waiting_answer());
    // The key won nothing: the buyer's place.
    assert!(matches!(
        h.buy(Some("u"), "/buy/a1", &keyed),
        Ok(Verdict::Queue(_))
    ));
    // The key won a reservation at the buyer's turn: handed back, not owned.
    let Ok(Verdict::Reserved(r)) = h.buy(Some("u"), "/buy/a1", &keyed) else {
        panic!("replayed");
    };
    assert!(!r.owned);
    // Refused by the room (not `unavailable`): that refusal when the key won nothing.
    *h.room.answer.lock() = Some(waiting::Turn::Refuse(Decision::TicketExpired));
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &keyed).unwrap_err(),
        Decision::TicketExpired
    );
    let asked = h.stock.asked.lock().clone();
    assert!(asked.iter().all(|(_, _, _, replay_only)| *replay_only));
    // Replays held back took no activity token: the admitted buyer still finds one.
    *h.room.answer.lock() = Some(waiting::Turn::Pass);
    assert!(matches!(
        h.buy(Some("v"), "/buy/a1", &[]),
        Ok(Verdict::Reserved(_))
    ));
    assert!(!h.stock.asked.lock()[3].3, "a new purchase");
}

#[test]
fn a_keyed_retry_outside_the_hours_is_replay_only() {
    let h = Harness::new(
        settings("", ""),
        vec![Ok(ReserveAnswer::NotReplayed), reserved(None, true)],
    );
    let keyed = [("idempotency-key", "k")];
    assert!(matches!(
        h.buy(Some("u"), "/buy/later", &keyed).unwrap_err(),
        Decision::NotOpenYet { .. }
    ));
    assert!(matches!(
        h.buy(Some("u"), "/buy/later", &keyed),
        Ok(Verdict::Reserved(_))
    ));
    let asked = h.stock.asked.lock().clone();
    assert_eq!(asked.len(), 2);
    assert!(asked.iter().all(|a| a.3), "replay only");
    // Unkeyed: refused by the hours, no store call.
    assert!(matches!(
        h.buy(Some("u"), "/buy/later", &[]).unwrap_err(),
        Decision::NotOpenYet { .. }
    ));
    assert_eq!(h.stock.asked.lock().len(), 2);
}

#[test]
fn the_gates_run_in_the_documented_order() {
    let names = crate::purchase::gates::names();
    assert_eq!(
        names,
        [
            "IpBucket",
            "Identity",
            "Variant",
            "Quantity",
            "Phase",
            "Hours",
            "Halt",
            "UserBucket",
            "SoldOut",
            "WaitingTurn",
            "ActivityBucket",
            "Body",
            "Reserve",
        ]
    );
}

#[test]
fn refusals_that_need_no_body_never_wait_for_it() {
    let top = "rate_limits: { per_user: { per_second: 1, burst: 1 } }\n";
    let h = Harness::new(
        settings(", queue: { admit_per_second: 1 }", top),
        vec![Ok(ReserveAnswer::SoldOut { left: 0 })],
    );
    let no_body = |user: &str, path: &str| h.buy_as(Some(user), path, &[], None);
    // Not started, the user's bucket, the waiting room, the sold-out mark: none reads the body.
    assert!(matches!(
        no_body("u1", "/buy/later").unwrap_err(),
        Decision::NotOpenYet { .. }
    ));
    *h.room.answer.lock() = Some(waiting_answer());
    assert!(matches!(no_body("u2", "/buy/a1"), Ok(Verdict::Queue(_))));
    assert!(matches!(
        no_body("u2", "/buy/a1").unwrap_err(),
        Decision::RateLimited { .. }
    ));
    *h.room.answer.lock() = Some(waiting::Turn::Pass);
    assert_eq!(
        h.buy_with_body(Some("u3"), "/buy/a1", &[], b"")
            .unwrap_err(),
        Decision::SoldOut
    );
    let asked_before = h.body_asked.load(Ordering::Relaxed);
    assert_eq!(no_body("u4", "/buy/a1").unwrap_err(), Decision::SoldOut);
    assert_eq!(h.body_asked.load(Ordering::Relaxed), asked_before);
    assert_eq!(asked_before, 1, "only the purchase that reached the store");
    // A purchase that would take stock waits for its body, and a body that never comes is
    // refused before anything is taken.
    let open = Harness::new(settings("", ""), vec![]);
    assert_eq!(
        open.buy_as(Some("u5"), "/buy/a1", &[], None).unwrap_err(),
        Decision::BadRequest(BadRequest::BodyTooSlow)
    );
    assert!(open.stock.asked.lock().is_empty());
}
