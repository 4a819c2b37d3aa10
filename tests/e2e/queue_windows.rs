//! The waiting room's promises under change, end to end: replays at and after a buyer's turn,
//! a postponed start, places never shared, rates raised and lowered, admission windows across
//! postponements (even one during another), cookies of other queues, reloads, a lost queue, and
//! primaries whose clocks differ. (Four adversarial reviews of the waiting room found these,
//! on 14142fc, b60426a and 1d0de0b: each test failed then.)

use super::queue_support::{
    buy_with as buy, in_secs, number, poll, queued, rfc3339_ms, small_activity_bucket, take_ticket,
    wait_state, TICKET,
};
use crate::support::*;
use std::time::Duration;

/// "A replay (same Idempotency-Key) returns the same jti" and "a buyer told sold_out could not
/// have bought": the gate answers before the reserve script's replay check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_an_admitted_purchase_returns_its_reservation() {
    let stack = Stack::start(vec![queued("1001", 1, Queue::admit(5).window_secs(1))]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    let bob = take_ticket(gw, "1001", "bob").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    // Her place was reached by now: her window ends a window (1 s) after this at the latest.
    let window_ends_ms = stack.redis.time_ms() + 1000;
    let with = [(TICKET, t.as_str()), ("Idempotency-Key", "k-1")];
    let first = buy(gw, "1001", "alice", &with).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let jti = first.reservation_id();
    // The client lost the answer and retries later: the unit is sold (the gateway learned it,
    // everyone waiting is told sold_out; she, who bought, is told so) and her window passed by
    // Redis's clock.
    wait_state(gw, "1001", "bob", &bob, "sold_out").await;
    wait_state(gw, "1001", "alice", &t, "bought").await;
    stack
        .redis
        .wait_time_past("alice's admission window to close", window_ends_ms);
    let replay = buy(gw, "1001", "alice", &with).await;
    assert_eq!(
        replay.status,
        200,
        "the buyer of the last unit is told {} {}",
        replay.status,
        replay.text()
    );
    assert_eq!(replay.reservation_id(), jti);
}

/// "Correctness never depends on a YAML edit": the queue's start is written once (HSETNX), so a
/// sale postponed by a reload admits (and sells) at the old start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postponed_start_is_not_sold_before() {
    let queue = Queue::admit(5).window_secs(30).opens_at(in_secs(-10));
    let act = queued("1001", 5, queue).starts_at(in_secs(3));
    let (redis, _upstream, mut config) = backends(vec![act]);
    let old_start_ms = rfc3339_ms(config.activities[0].starts_at);
    let mut gw = GatewayProc::start(config.clone());
    let t = take_ticket(&gw, "1001", "alice").await.0;
    // The operator postpones the sale by ten minutes.
    config.activities[0].starts_at = in_secs(600);
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_generation(2).await;
    // The wait is the assertion: past the old start by Redis's clock, and her turn there (the
    // only ticket, place 1 at 5 a second), with the gateway's view read since, nothing sells.
    redis.wait_time_past(
        "the old start and alice's turn after it to pass",
        old_start_ms + 1000 / 5,
    );
    gw.wait_queue_read().await;
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_ne!(
        r.status,
        200,
        "sold 10 minutes before starts_at: {}",
        r.text()
    );
}

/// Tickets are not bound to the queue's incarnation: once the queue's keys are gone (eviction,
/// failover, or the same activity id reused for a later sale), new buyers get numbers old
/// holders still have valid signed tickets for, and lapsed tickets come back to life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_never_share_a_place() {
    let stack = Stack::start(vec![queued("1001", 50, Queue::admit(1))]);
    let gw = &stack.gw;
    let mut old = Vec::new();
    for u in ["u1", "u2", "u3"] {
        old.push(take_ticket(gw, "1001", u).await.0);
    }
    stack.redis.del(&["fg:{1001}:q", "fg:{1001}:q:tickets"]);
    let mut new = Vec::new();
    for u in ["v1", "v2", "v3"] {
        new.push(number(&take_ticket(gw, "1001", u).await.0));
    }
    // The numbers start again with the queue, but the old tickets hold no place in it: each
    // old holder presenting theirs is given a new place, behind the new holders.
    for (u, ticket) in ["u1", "u2", "u3"].iter().zip(&old) {
        let r = buy(gw, "1001", u, &[(TICKET, ticket.as_str())]).await;
        assert_eq!(r.status, 202, "{}", r.text());
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
    let stack = Stack::start(vec![queued("1001", 50, Queue::admit(5).window_secs(60))]);
    let gw = &stack.gw;
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=1000")
        .await;
    assert_eq!(r.status, 200);
    let t = take_ticket(gw, "1001", "alice").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    // The wait is the assertion: 1.5 s after her turn by Redis's clock (five times the 0.3 s
    // the defect leaves her), her 60 s window is still open.
    let turn_ms = stack.redis.time_ms();
    stack
        .redis
        .wait_time_past("1.5 s after alice's turn", turn_ms + 1500);
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "lapsed 1.5 s after the turn with a 60 s window: {}",
        r.text()
    );
}

/// One cookie name for every queue: a browser that waited in one sale's queue is refused 403
/// on every other sale's purchase and poll until the first sale ends (no new ticket is issued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_from_another_queue_does_not_lock_the_browser_out() {
    let stack = Stack::start(vec![
        queued("1001", 5, Queue::admit(5)),
        queued("1002", 5, Queue::admit(5)),
    ]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    let cookie = format!("flashgate_ticket={t}");
    let r = buy(gw, "1002", "alice", &[("Cookie", cookie.as_str())]).await;
    assert_eq!(
        r.status,
        202,
        "a browser queued for 1001 cannot queue for 1002: {}",
        r.text()
    );
}

/// A reload's new rate is forgotten after one failed queue read (the entry is removed, so the
/// next refresh sees no previous rate and does not write it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_rate_survives_one_failed_read() {
    let (redis, _upstream, mut config) = backends(vec![queued("1001", 5, Queue::admit(5))]);
    let mut gw = GatewayProc::start(config.clone());
    wait_for(
        "the queue to be set up in Redis",
        Duration::from_secs(10),
        || (redis.exists(&["fg:{1001}:q"]) == 1).then_some(()),
    );
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
    config.activities[0].queue = Some(Queue::admit(50));
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_generation(2).await;
    // A read with the new rate fails: one that started after the reload was applied.
    let errors = r#"flashgate_redis_errors_total{op="queue"}"#;
    let failed = gw.metric(errors).await.unwrap_or(0.0);
    gw.wait_metric_at_least(errors, failed + 2.0).await;
    let _: () = redis::cmd("DEL").arg("fg:{1001}:q").query(&mut c).unwrap();
    let _: () = redis::cmd("RENAME")
        .arg("aside")
        .arg("fg:{1001}:q")
        .query(&mut c)
        .unwrap();
    // The next reads succeed (and would write the rate the reload asked for).
    gw.wait_queue_read().await;
    let v = gw.admin_get("/v1/activities/1001/queue").await.json();
    assert_eq!(v["admit_per_second"], 50, "{v}");
}

/// "Lapsed tickets stay lapsed (410)": the window is measured in places at the rate in force
/// *now*, so an operator who raises the rate turns a lapsed ticket back into `your_turn`, and
/// the buyer told 410 `ticket_expired` buys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_rate_does_not_revive_a_lapsed_ticket() {
    let stack = Stack::start(vec![queued("1001", 50, Queue::admit(5).window_secs(1))]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    wait_state(gw, "1001", "alice", &t, "expired").await;
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 410, "{}", r.text());
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=1000")
        .await;
    assert_eq!(r.status, 200);
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        410,
        "a ticket told 410 ticket_expired bought after a rate raise: {}",
        r.text()
    );
}

/// Contract: "At its turn, within admission_window_secs: the purchase runs". Lowering the rate
/// shrinks the window of a buyer already admitted: 2 s into a 20 s window, a cut from 100/s
/// to 1/s makes the window 20 places, 200 of which already passed: 410 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_the_rate_keeps_an_admitted_buyers_window() {
    let stack = Stack::start(vec![queued("1001", 50, Queue::admit(100).window_secs(20))]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    // The scenario's time: 2 s into her window by Redis's clock (200 places at 100/s).
    let turn_ms = stack.redis.time_ms();
    stack
        .redis
        .wait_time_past("2 s into alice's window", turn_ms + 2000);
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=1")
        .await;
    assert_eq!(r.status, 200);
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "admitted 2 s ago with a 20 s window, refused: {}",
        r.text()
    );
}

/// "A buyer told sold_out could not have bought": a segmented activity's fresh sum counts a
/// version not prewarmed yet as 0 units (an unsegmented one's missing stock key says
/// "unknown"), so a restock (new `version`) holds the cursor and tells every waiting buyer
/// `sold_out` until the next prewarm tick (`redis.prewarm_interval_ms`, 5 s by default; here
/// long, and nothing else prewarms since no purchase reaches the reserve script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restocked_segmented_activity_is_not_sold_out_to_the_queue() {
    let act = queued("1001", 10, Queue::admit(5).window_secs(60)).segments(2);
    let (_redis, _upstream, config) = backends(vec![act]);
    let mut config = config.prewarm_interval_ms(600000);
    let mut gw = GatewayProc::start(config.clone());
    // The first (and, for ten minutes, last) prewarm put version 1 on sale.
    gw.wait_metric(r#"flashgate_stock_remaining{activity="1001"}"#, 10.0)
        .await;
    let t = take_ticket(&gw, "1001", "alice").await.0;
    wait_state(&gw, "1001", "alice", &t, "your_turn").await;
    // Restock: a new version with 10 units.
    config.activities[0].version = 2;
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_generation(2).await;
    // The gateway read its waiting room under version 2 (a held cursor would say sold_out).
    gw.wait_queue_read().await;
    let v = poll(&gw, "1001", "alice", &t).await;
    assert_ne!(v["state"], "sold_out", "restocked, yet: {v}");
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 200, "10 units on sale: {}", r.text());
}

/// Fix 7 ("buyers asking for their place do not use up the activity bucket") does not hold
/// for a buyer who sends an `Idempotency-Key` (fix 3): each re-ask is a replay-only reserve,
/// which takes an activity token first. Waiting keyed buyers drain the bucket, get 429
/// instead of their place, and the buyer at their turn is refused 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_buyers_asking_for_their_place_do_not_use_up_the_activity_bucket() {
    let (_redis, _upstream, gw, alice, waiting) = small_activity_bucket().await;
    for _ in 0..3 {
        for (i, t) in waiting.iter().enumerate() {
            let user = format!("w{i}");
            let key = format!("key-{user}");
            let r = buy(
                &gw,
                "1001",
                &user,
                &[(TICKET, t.as_str()), ("Idempotency-Key", key.as_str())],
            )
            .await;
            assert_eq!(r.status, 202, "{user} asking for their place: {}", r.text());
        }
    }
    wait_state(&gw, "1001", "alice", &alice, "your_turn").await;
    let r = buy(&gw, "1001", "alice", &[(TICKET, alice.as_str())]).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Fix 2 compares two Redis clock readings (the ticket's `issued_ms` against the queue's
/// `epoch`): after a failover to a replica whose clock is behind the old primary's (here
/// 60 s, simulated by the epoch the old primary wrote, replicated), every ticket the new
/// primary issues is "from before the queue was set up": each purchase with it is answered
/// 202 with a re-issued ticket, never admitted, for as long as the skew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_is_admitted_whatever_the_clock_of_the_primary_that_set_the_queue_up() {
    let stack = Stack::start(vec![queued("1001", 50, Queue::admit(5).window_secs(60))]);
    let gw = &stack.gw;
    wait_for(
        "the queue to be set up in Redis",
        Duration::from_secs(10),
        || (stack.redis.exists(&["fg:{1001}:q"]) == 1).then_some(()),
    );
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut stack.redis.conn()).unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:q")
        .arg("epoch")
        .arg((secs + 60) * 1000)
        .query(&mut stack.redis.conn())
        .unwrap();
    let t = take_ticket(gw, "1001", "alice").await.0;
    // Her turn comes: the cursor, as the gateway read it, reaches her place (her number: she
    // queued after the start).
    gw.wait_metric_at_least(
        r#"flashgate_queue_cursor{activity="1001"}"#,
        number(&t) as f64,
    )
    .await;
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "alice's turn came, her ticket is not honoured: {}",
        r.text()
    );
}

/// The other direction of the same clock dependence: a queue Redis lost, set up again by a
/// primary whose clock is behind (60 s), honours the lost queue's tickets (issued_ms >= the
/// new epoch), so an old holder shares a place with a new one (the promise fix 2 made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_queues_ticket_holds_no_place_whatever_the_new_primarys_clock() {
    let stack = Stack::start(vec![queued("1001", 50, Queue::admit(1))]);
    let gw = &stack.gw;
    let old = take_ticket(gw, "1001", "u1").await.0;
    stack.redis.del(&["fg:{1001}:q", "fg:{1001}:q:tickets"]);
    let new = take_ticket(gw, "1001", "v1").await.0;
    // The new primary's clock is 60 s behind the old one's: its epoch is that much earlier.
    let epoch: u64 = redis::cmd("HGET")
        .arg("fg:{1001}:q")
        .arg("epoch")
        .query(&mut stack.redis.conn())
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:q")
        .arg("epoch")
        .arg(epoch - 60_000)
        .query(&mut stack.redis.conn())
        .unwrap();
    // The gateway read the queue since.
    gw.wait_queue_read().await;
    let r = buy(gw, "1001", "u1", &[(TICKET, old.as_str())]).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let given = r.json()["ticket"].as_str().unwrap().to_owned();
    assert_ne!(
        given,
        old,
        "u1's ticket of the lost queue is honoured in the new one (place {}, v1 holds {})",
        super::queue_support::number(&old),
        super::queue_support::number(&new)
    );
}

/// Fix 1 holds a postponed sale at every gateway ("no gateway lets a purchase through before
/// its own configured start") but leaves Redis's cursor running when the postponement comes
/// after Redis's start: every buyer waiting through the postponement reaches the new start
/// with the cursor a whole postponement past their place, and is told 410 `ticket_expired`
/// without ever having been let buy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_postponed_after_its_start_does_not_lapse_the_waiting() {
    let queue = Queue::admit(5).window_secs(1).opens_at(in_secs(-60));
    let act = queued("1001", 5, queue).starts_at(in_secs(-1));
    let (_redis, _upstream, mut config) = backends(vec![act]);
    let mut gw = GatewayProc::start(config.clone());
    // The operator postpones the running sale by a few seconds; alice queues meanwhile.
    config.activities[0].starts_at = in_secs(4);
    let config_start = config.activities[0].starts_at.to_owned();
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_queue_start("1001", &config_start).await;
    let t = take_ticket(&gw, "1001", "alice").await.0;
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 202, "held before the new start: {}", r.text());
    // Her turn comes after the new start (not before it, and not lapsed through it).
    let turn = wait_state(&gw, "1001", "alice", &t, "your_turn").await;
    assert_eq!(turn["state"], "your_turn");
    assert!(
        chrono::Utc::now()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            .as_str()
            >= config_start.as_str(),
        "her turn came before the postponed start"
    );
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "alice never had her turn and is told: {}",
        r.text()
    );
}

/// queue_reschedule sets t0 to the new start even when that start is already in the past
/// (moved later, but the reload lands after it): the cursor jumps by (now - new start) x rate
/// at once, every place in the jump is "reached" in the past, and a buyer still waiting is
/// told `expired` without ever having had a turn (and the fleet admits far beyond its rate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_moved_later_but_already_past_does_not_jump_the_cursor() {
    let act = queued("1001", 50, Queue::admit(1).window_secs(2)).starts_at(in_secs(-60));
    let (_redis, _upstream, mut config) = backends(vec![act]);
    let mut gw = GatewayProc::start(config.clone());
    // Five buyers queue at once (places 1..5, the cursor at 1/s).
    let mut tickets = Vec::new();
    for u in ["u1", "u2", "u3", "u4", "u5"] {
        tickets.push(take_ticket(&gw, "1001", u).await.0);
    }
    let t5 = tickets[4].clone();
    assert_eq!(poll(&gw, "1001", "u5", &t5).await["state"], "waiting");
    // The operator corrects the start to a later time, also already past.
    config.activities[0].starts_at = in_secs(-20);
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_generation(2).await;
    // The gateway read its waiting room under the corrected start.
    gw.wait_queue_read().await;
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
    config.activities[0].starts_at = in_secs(6);
    let new_start = config.activities[0].starts_at;
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_queue_start("1001", new_start).await;
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
    config.activities[0].starts_at = in_secs(3);
    let first = config.activities[0].starts_at;
    gw.rewrite_config(config.clone());
    gw.signal("HUP");
    gw.wait_queue_start("1001", first).await;
    // ... and, once Redis stands the cursor for it (still before that start), by 12 s.
    config.activities[0].starts_at = in_secs(12);
    let second = config.activities[0].starts_at;
    gw.rewrite_config(config);
    gw.signal("HUP");
    gw.wait_queue_start("1001", second).await;
    let state = gw.admin_get("/v1/activities/1001/queue").await.json();
    eprintln!("queue after the second postponement: {state}");
    assert_eq!(poll(&gw, "1001", "alice", &t).await["state"], "waiting");
    her_turn_comes_and_she_buys(&gw, &t).await;
}

/// A running sale (started 2 s ago, 5 a second, a 4 s window) with alice admitted: the
/// processes, the gateway's configuration and alice's ticket.
async fn alice_admitted() -> (RedisServer, Upstream, GatewayProc, TestConfig, String) {
    let act = queued("1001", 50, Queue::admit(5).window_secs(4)).starts_at(in_secs(-2));
    let (redis, upstream, config) = backends(vec![act]);
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
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Review finding: "a buyer told sold_out could not have bought", and "after a purchase the
/// queue's state is bought", over a fleet. Which buyers bought was known only to the gateway
/// that relayed the win (in memory): the buyer of the last unit polling another gateway (or
/// the same one after a restart) was told `sold_out`. Now a poll that would say `sold_out`
/// asks Redis whether the buyer holds units of the sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_buyer_of_the_last_unit_reads_bought_on_every_gateway() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = queued("1001", 1, Queue::admit(5).window_secs(30));
    // Each its own ports (a cloned configuration would share them, one listener in effect).
    let gateway = || GatewayProc::start(TestConfig::new(&redis, &upstream, vec![activity.clone()]));
    let (a, b) = (gateway(), gateway());
    assert_ne!(a.addr, b.addr);
    let alice = take_ticket(&a, "1001", "alice").await.0;
    let bob = take_ticket(&b, "1001", "bob").await.0;
    wait_state(&a, "1001", "alice", &alice, "your_turn").await;
    let won = buy(&a, "1001", "alice", &[(TICKET, alice.as_str())]).await;
    assert_eq!(won.status, 200, "{}", won.text());
    // Gateway b learned the stock is gone: bob, who did not buy, reads sold_out there.
    wait_state(&b, "1001", "bob", &bob, "sold_out").await;
    let there = poll(&b, "1001", "alice", &alice).await;
    assert_eq!(
        there["state"], "bought",
        "alice bought, on gateway a: {there}"
    );
    assert_eq!(poll(&a, "1001", "alice", &alice).await["state"], "bought");
}
