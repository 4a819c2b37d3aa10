//! The fourth review of the waiting room, end to end: a postponement during a postponement
//! (failed on 1d0de0b).

use super::queue_support::{buy_with as buy, poll, queued, take_ticket, TICKET};
use crate::support::*;
use std::time::Duration;

/// "At its turn, within admission_window_secs: the purchase runs" / "an admitted buyer's open
/// window runs on after [a postponement]". Two reloads postpone the sale, the second while the
/// first still stands the cursor (an operator correcting the new start): queue_reschedule sees
/// `now < start` (the first new start) and writes the second mark without a postponement, so
/// alice's window is moved only to the first new start, runs out while nobody can buy, and at
/// the final start she is told expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_postponement_during_the_first_does_not_eat_an_admitted_window() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut act = queued(
        "1001",
        50,
        "{ admit_per_second: 5, admission_window_secs: 4 }",
    );
    act.starts_at = super::queue_support::in_secs(-2);
    let mut config = TestConfig::new(&redis, &upstream, vec![act]);
    let mut gw = GatewayProc::start(config.clone());
    let t = take_ticket(&gw, "1001", "alice").await.0;
    super::queue_support::wait_state(&gw, "1001", "alice", &t, "your_turn").await;
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
    let v = wait_for_async(
        "alice's ticket to leave waiting",
        Duration::from_secs(25),
        || async {
            let v = poll(&gw, "1001", "alice", &t).await;
            (v["state"] != "waiting").then_some(v)
        },
    )
    .await;
    assert_eq!(
        v["state"], "your_turn",
        "an admitted buyer held back through two postponements is told: {v}"
    );
    let r = buy(&gw, "1001", "alice", &[(TICKET, t.as_str())]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}
