//! The adversarial review of the waiting room (issue 15): each test failed on the reviewed
//! commit and names the promise it broke; all hold now.

use super::queue_support::{
    buy_with as buy, in_secs, number, queued, take_ticket, wait_state, TICKET,
};
use crate::support::*;
use std::time::Duration;

/// "A replay (same Idempotency-Key) returns the same jti" and "a buyer told sold_out could not
/// have bought": the gate answers before the reserve script's replay check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_an_admitted_purchase_returns_its_reservation() {
    let stack = Stack::start(vec![queued(
        "1001",
        1,
        "{ admit_per_second: 5, admission_window_secs: 1 }",
    )]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    let with = [(TICKET, t.as_str()), ("Idempotency-Key", "k-1")];
    let first = buy(gw, "1001", "alice", &with).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let jti = first.reservation_id();
    // The client lost the answer and retries later (the unit is sold, the window passed).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let replay = buy(gw, "1001", "alice", &with).await;
    assert_eq!(
        replay.status,
        200,
        "the buyer of the last unit is told {} {}",
        replay.status,
        String::from_utf8_lossy(&replay.body)
    );
    assert_eq!(replay.reservation_id(), jti);
}

/// "Correctness never depends on a YAML edit": the queue's start is written once (HSETNX), so a
/// sale postponed by a reload admits (and sells) at the old start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postponed_start_is_not_sold_before() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let opens = in_secs(-10);
    let q = format!("{{ admit_per_second: 5, admission_window_secs: 30, opens_at: \"{opens}\" }}");
    let mut act = queued("1001", 5, &q);
    act.starts_at = in_secs(3);
    let mut config = TestConfig::new(&redis, &upstream, vec![act]);
    let mut gw = GatewayProc::start(config.clone());
    let t = take_ticket(&gw, "1001", "alice").await.0;
    // The operator postpones the sale by ten minutes.
    config.activities[0].starts_at = in_secs(600);
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_ne!(
        r.status,
        200,
        "sold 10 minutes before starts_at: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// Tickets are not bound to the queue's incarnation: once the queue's keys are gone (eviction,
/// failover, or the same activity id reused for a later sale), new buyers get numbers old
/// holders still have valid signed tickets for, and lapsed tickets come back to life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_never_share_a_place() {
    let stack = Stack::start(vec![queued("1001", 50, "{ admit_per_second: 1 }")]);
    let gw = &stack.gw;
    let mut old = Vec::new();
    for u in ["u1", "u2", "u3"] {
        old.push(take_ticket(gw, "1001", u).await.0);
    }
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:q")
        .arg("fg:{1001}:q:tickets")
        .query(&mut stack.redis.conn())
        .unwrap();
    let mut new = Vec::new();
    for u in ["v1", "v2", "v3"] {
        new.push(number(&take_ticket(gw, "1001", u).await.0));
    }
    // The numbers start again with the queue, but the old tickets hold no place in it: each
    // old holder presenting theirs is given a new place, behind the new holders.
    for (u, ticket) in ["u1", "u2", "u3"].iter().zip(&old) {
        let r = buy(gw, "1001", u, &[(TICKET, ticket.as_str())]).await;
        assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
        let renewed = number(r.json()["ticket"].as_str().unwrap());
        assert!(
            !new.contains(&renewed),
            "{u} shares place {renewed} with {new:?}"
        );
        new.push(renewed);
    }
}

/// The lapse is measured in places at the *configured* rate: an operator who raises the rate
/// with the admin API shrinks everyone's window (here 60 s becomes 0.3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_change_keeps_the_admission_window() {
    let stack = Stack::start(vec![queued(
        "1001",
        50,
        "{ admit_per_second: 5, admission_window_secs: 60 }",
    )]);
    let gw = &stack.gw;
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=1000")
        .await;
    assert_eq!(r.status, 200);
    let t = take_ticket(gw, "1001", "alice").await.0;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "lapsed 1.5 s after the turn with a 60 s window: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// One cookie name for every queue: a browser that waited in one sale's queue is refused 403
/// on every other sale's purchase and poll until the first sale ends (no new ticket is issued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_from_another_queue_does_not_lock_the_browser_out() {
    let stack = Stack::start(vec![
        queued("1001", 5, "{ admit_per_second: 5 }"),
        queued("1002", 5, "{ admit_per_second: 5 }"),
    ]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    let cookie = format!("flashgate_ticket={t}");
    let r = buy(gw, "1002", "alice", &[("Cookie", cookie.as_str())]).await;
    assert_eq!(
        r.status,
        202,
        "a browser queued for 1001 cannot queue for 1002: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// A reload's new rate is forgotten after one failed queue read (the entry is removed, so the
/// next refresh sees no previous rate and does not write it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_rate_survives_one_failed_read() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(
        &redis,
        &upstream,
        vec![queued("1001", 5, "{ admit_per_second: 5 }")],
    );
    let mut gw = GatewayProc::start(config.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut c = redis.conn();
    // Make the next queue reads fail (WRONGTYPE), keeping the real state aside.
    let _: () = redis::cmd("RENAME")
        .arg("fg:{1001}:q")
        .arg("aside")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("fg:{1001}:q")
        .arg("x")
        .query(&mut c)
        .unwrap();
    config.activities[0].queue = Some("{ admit_per_second: 50 }".into());
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _: () = redis::cmd("DEL").arg("fg:{1001}:q").query(&mut c).unwrap();
    let _: () = redis::cmd("RENAME")
        .arg("aside")
        .arg("fg:{1001}:q")
        .query(&mut c)
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let v = gw.admin_get("/v1/activities/1001/queue").await.json();
    assert_eq!(v["admit_per_second"], 50, "{v}");
}
