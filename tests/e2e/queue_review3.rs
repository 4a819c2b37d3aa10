//! The third and fourth adversarial reviews of the waiting room, end to end: each test names
//! the promise it broke (on b60426a, or on 1d0de0b for the postponement during a
//! postponement); all hold now.

use super::queue_support::{buy_with as buy, poll, queued, take_ticket, TICKET};
use crate::support::*;
use std::time::Duration;

fn body(r: &HttpResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// queue_reschedule sets t0 to the new start even when that start is already in the past
/// (moved later, but the reload lands after it): the cursor jumps by (now - new start) x rate
/// at once, every place in the jump is "reached" in the past, and a buyer still waiting is
/// told `expired` without ever having had a turn (and the fleet admits far beyond its rate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_moved_later_but_already_past_does_not_jump_the_cursor() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut act = queued(
        "1001",
        50,
        "{ admit_per_second: 1, admission_window_secs: 2 }",
    );
    act.starts_at = super::queue_support::in_secs(-60);
    let mut config = TestConfig::new(&redis, &upstream, vec![act]);
    let mut gw = GatewayProc::start(config.clone());
    // Five buyers queue at once (places 1..5, the cursor at 1/s).
    let mut tickets = Vec::new();
    for u in ["u1", "u2", "u3", "u4", "u5"] {
        tickets.push(take_ticket(&gw, "1001", u).await.0);
    }
    let t5 = tickets[4].clone();
    assert_eq!(poll(&gw, "1001", "u5", &t5).await["state"], "waiting");
    // The operator corrects the start to a later time, also already past.
    config.activities[0].starts_at = super::queue_support::in_secs(-20);
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let v = poll(&gw, "1001", "u5", &t5).await;
    assert_ne!(
        v["state"], "expired",
        "u5 never had a turn and is told expired: {v}"
    );
    let state = gw.admin_get("/v1/activities/1001/queue").await.json();
    let cursor = state["cursor"].as_u64().unwrap();
    assert!(
        cursor <= 8,
        "the cursor jumped ahead of its rate (1/s, a few seconds in): {state}"
    );
}

/// "At its turn, within admission_window_secs: the purchase runs." A postponement that comes
/// while a buyer is admitted holds her back ("not before the configured start") while her
/// window runs on (the purchase gets 403 `not_started`, the poll `waiting`); at the new start she is told 410 `ticket_expired`: the postponement ate her
/// window, she could not buy in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postponement_does_not_eat_an_admitted_buyers_window() {
    let (_redis, _upstream, mut gw, mut config, t) = alice_admitted().await;
    // Admitted; the sale is postponed by a few seconds, longer than her window.
    config.activities[0].starts_at = super::queue_support::in_secs(6);
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Before the new start a purchase is refused (403 not_started) and the poll says waiting.
    assert_eq!(poll(&gw, "1001", "alice", &t).await["state"], "waiting");
    her_turn_comes_and_she_buys(&gw, &t).await;
}

/// "At its turn, within admission_window_secs: the purchase runs" / "an admitted buyer's open
/// window runs on after [a postponement]". Two reloads postpone the sale, the second while the
/// first still stands the cursor (an operator correcting the new start): queue_reschedule sees
/// `now < start` (the first new start) and writes the second mark without a postponement, so
/// alice's window is moved only to the first new start, runs out while nobody can buy, and at
/// the final start she is told expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_postponement_during_the_first_does_not_eat_an_admitted_window() {
    let (_redis, _upstream, mut gw, mut config, t) = alice_admitted().await;
    // Admitted; the sale is postponed by 3 s ...
    config.activities[0].starts_at = super::queue_support::in_secs(3);
    gw.rewrite_config(config.clone());
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // ... and, 1 s later (still before that start), by 12 s.
    config.activities[0].starts_at = super::queue_support::in_secs(12);
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let state = gw.admin_get("/v1/activities/1001/queue").await.json();
    eprintln!("queue after the second postponement: {state}");
    assert_eq!(poll(&gw, "1001", "alice", &t).await["state"], "waiting");
    her_turn_comes_and_she_buys(&gw, &t).await;
}

/// A running sale (started 2 s ago, 5 a second, a 4 s window) with alice admitted: the
/// processes, the gateway's configuration and alice's ticket.
async fn alice_admitted() -> (RedisServer, Upstream, GatewayProc, TestConfig, String) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut act = queued(
        "1001",
        50,
        "{ admit_per_second: 5, admission_window_secs: 4 }",
    );
    act.starts_at = super::queue_support::in_secs(-2);
    let config = TestConfig::new(&redis, &upstream, vec![act]);
    let gw = GatewayProc::start(config.clone());
    let t = take_ticket(&gw, "1001", "alice").await.0;
    super::queue_support::wait_state(&gw, "1001", "alice", &t, "your_turn").await;
    (redis, upstream, gw, config, t)
}

/// Alice, held back by a postponement, is told her turn (not "expired") once the sale starts,
/// and buys.
async fn her_turn_comes_and_she_buys(gw: &GatewayProc, t: &str) {
    let v = wait_for_async(
        "alice's ticket to leave waiting",
        Duration::from_secs(25),
        || async {
            let v = poll(gw, "1001", "alice", t).await;
            (v["state"] != "waiting").then_some(v)
        },
    )
    .await;
    assert_eq!(
        v["state"], "your_turn",
        "an admitted buyer held back through a postponement is told: {v}"
    );
    let r = buy(gw, "1001", "alice", &[(TICKET, t)]).await;
    assert_eq!(r.status, 200, "{}", body(&r));
}
