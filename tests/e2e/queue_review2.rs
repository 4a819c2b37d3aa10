//! The second adversarial review of the waiting room (after 14142fc): each test names the
//! promise it broke on 14142fc; all hold now.

use super::queue_support::{
    buy_with as buy, poll, queued, small_activity_bucket, take_ticket, wait_state, TICKET,
};
use crate::support::*;
use std::time::Duration;

fn body(r: &HttpResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// "Lapsed tickets stay lapsed (410)": the window is measured in places at the rate in force
/// *now*, so an operator who raises the rate turns a lapsed ticket back into `your_turn`, and
/// the buyer told 410 `ticket_expired` buys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_rate_does_not_revive_a_lapsed_ticket() {
    let stack = Stack::start(vec![queued(
        "1001",
        50,
        "{ admit_per_second: 5, admission_window_secs: 1 }",
    )]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    wait_state(gw, "1001", "alice", &t, "expired").await;
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 410, "{}", body(&r));
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=1000")
        .await;
    assert_eq!(r.status, 200);
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        410,
        "a ticket told 410 ticket_expired bought after a rate raise: {}",
        body(&r)
    );
}

/// Contract: "At its turn, within admission_window_secs: the purchase runs". Lowering the rate
/// shrinks the window of a buyer already admitted: 2 s into a 20 s window, a cut from 100/s
/// to 1/s makes the window 20 places, 200 of which already passed: 410 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_the_rate_keeps_an_admitted_buyers_window() {
    let stack = Stack::start(vec![queued(
        "1001",
        50,
        "{ admit_per_second: 100, admission_window_secs: 20 }",
    )]);
    let gw = &stack.gw;
    let t = take_ticket(gw, "1001", "alice").await.0;
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=1")
        .await;
    assert_eq!(r.status, 200);
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "admitted 2 s ago with a 20 s window, refused: {}",
        body(&r)
    );
}

/// "A buyer told sold_out could not have bought": a segmented activity's fresh sum counts a
/// version not prewarmed yet as 0 units (an unsegmented one's missing stock key says
/// "unknown"), so a restock (new `version`) holds the cursor and tells every waiting buyer
/// `sold_out` until the next prewarm tick (`redis.prewarm_interval_ms`, 5 s by default; here
/// long, and nothing else prewarms since no purchase reaches the reserve script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restocked_segmented_activity_is_not_sold_out_to_the_queue() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut act = queued(
        "1001",
        10,
        "{ admit_per_second: 5, admission_window_secs: 60 }",
    );
    act.segments = Some(2);
    let mut config = TestConfig::new(&redis, &upstream, vec![act]);
    config.extra_redis_yaml = "  prewarm_interval_ms: 600000\n".into();
    let mut gw = GatewayProc::start(config.clone());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let t = take_ticket(&gw, "1001", "alice").await.0;
    wait_state(&gw, "1001", "alice", &t, "your_turn").await;
    // Restock: a new version with 10 units.
    config.activities[0].version = 2;
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let v = poll(&gw, "1001", "alice", &t).await;
    assert_ne!(v["state"], "sold_out", "restocked, yet: {v}");
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 200, "10 units on sale: {}", body(&r));
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
            assert_eq!(r.status, 202, "{user} asking for their place: {}", body(&r));
        }
    }
    wait_state(&gw, "1001", "alice", &alice, "your_turn").await;
    let r = buy(&gw, "1001", "alice", &[(TICKET, alice.as_str())]).await;
    assert_eq!(r.status, 200, "{}", body(&r));
}

/// Fix 2 compares two Redis clock readings (the ticket's `issued_ms` against the queue's
/// `epoch`): after a failover to a replica whose clock is behind the old primary's (here
/// 60 s, simulated by the epoch the old primary wrote, replicated), every ticket the new
/// primary issues is "from before the queue was set up": each purchase with it is answered
/// 202 with a re-issued ticket, never admitted, for as long as the skew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_is_admitted_whatever_the_clock_of_the_primary_that_set_the_queue_up() {
    let stack = Stack::start(vec![queued(
        "1001",
        50,
        "{ admit_per_second: 5, admission_window_secs: 60 }",
    )]);
    let gw = &stack.gw;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut stack.redis.conn()).unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:q")
        .arg("epoch")
        .arg((secs + 60) * 1000)
        .query(&mut stack.redis.conn())
        .unwrap();
    let t = take_ticket(gw, "1001", "alice").await.0;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = buy(gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(
        r.status,
        200,
        "alice's turn came, her ticket is not honoured: {}",
        body(&r)
    );
}

/// The other direction of the same clock dependence: a queue Redis lost, set up again by a
/// primary whose clock is behind (60 s), honours the lost queue's tickets (issued_ms >= the
/// new epoch), so an old holder shares a place with a new one (the promise fix 2 made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_queues_ticket_holds_no_place_whatever_the_new_primarys_clock() {
    let stack = Stack::start(vec![queued("1001", 50, "{ admit_per_second: 1 }")]);
    let gw = &stack.gw;
    let old = take_ticket(gw, "1001", "u1").await.0;
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:q")
        .arg("fg:{1001}:q:tickets")
        .query(&mut stack.redis.conn())
        .unwrap();
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
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = buy(gw, "1001", "u1", &[(TICKET, old.as_str())]).await;
    assert_eq!(r.status, 202, "{}", body(&r));
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
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let opens = super::queue_support::in_secs(-60);
    let q = format!("{{ admit_per_second: 5, admission_window_secs: 1, opens_at: \"{opens}\" }}");
    let mut act = queued("1001", 5, &q);
    act.starts_at = super::queue_support::in_secs(-1);
    let mut config = TestConfig::new(&redis, &upstream, vec![act]);
    let mut gw = GatewayProc::start(config.clone());
    // The operator postpones the running sale by a few seconds; alice queues meanwhile.
    config.activities[0].starts_at = super::queue_support::in_secs(4);
    let config_start = config.activities[0].starts_at.to_owned();
    gw.rewrite_config(config);
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t = take_ticket(&gw, "1001", "alice").await.0;
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 202, "held before the new start: {}", body(&r));
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
        body(&r)
    );
}
