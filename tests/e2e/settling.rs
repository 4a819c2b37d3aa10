//! How reservations settle at the edges of their lifecycle: a hold shorter than the backend, a
//! replay near its deadline, a segment that lost its meta and users, a paid order confirmed in
//! the layout Redis recorded, reconcile while versions are bumped. (Found by the second review
//! of stock integrity, 12b: each sold a unit twice or lost a paid order then.)

use super::integrity::{a_hold_then_a_refused_layout, two_segments_on_sale};
use crate::support::*;
use flashgate::stock::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// One unit on sale, held `hold_secs` at the most: the gateway shared, for buyers in tasks.
fn one_unit_held(hold_secs: u64) -> (RedisServer, Upstream, Arc<GatewayProc>) {
    let (redis, upstream, gw) =
        Stack::start(vec![TestActivity::open("1001", 1).hold_secs(hold_secs)]).parts();
    (redis, upstream, Arc::new(gw))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_shorter_than_the_backend_never_sells_twice() {
    // R7: with hold_secs 1 and a backend taking 2.5 s, alice's hold was swept while her request
    // was at the backend; bob bought the unit, and the backend took both orders.
    let (redis, upstream, gw) = one_unit_held(1);
    upstream.mode("status=200&delay_ms=2500").await;
    let alice = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.buy("1001", "alice", None).await })
    };
    wait_for_async(
        "alice's request to reach the backend",
        Duration::from_secs(10),
        || async { (!upstream.requests().await.is_empty()).then_some(()) },
    )
    .await;
    // Her hold ran out while the backend works on it; the sweep (every 100 ms) leaves it.
    let start = redis.time_ms();
    redis.wait_time_past("alice's hold deadline to pass", start + 1200);
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let alice = alice.await.unwrap();
    assert_eq!(alice.status, 200);
    let jti = alice.reservation_id();
    redis.wait_record("1001", &jti, "confirmed");
    assert_eq!(upstream.orders().await, [jti]);
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_near_its_hold_deadline_keeps_the_unit_until_the_backend_answered() {
    // R7b (review 12's F3 sequence): hold 2 s; alice's first attempt is refused by the backend
    // (409, so it stays pending); her keyed retry half a second before the deadline takes the
    // backend 1.5 s; bob buys after the deadline. Two orders for stock 1.
    let (redis, upstream, gw) = one_unit_held(2);
    upstream.mode("status=409").await;
    let first = gw.buy_keyed("1001", "alice", "k1").await;
    assert_eq!(first.status, 409);
    let jti = first.reservation_id();
    let deadline_ms = redis.hold_deadline_ms("1001", &jti);
    upstream.mode("status=200&delay_ms=1500").await;
    redis.wait_time_past("half a second before the deadline", deadline_ms - 500 - 1);
    let replay = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.buy_keyed("1001", "alice", "k1").await })
    };
    redis.wait_time_past("past the deadline", deadline_ms + 300);
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let replay = replay.await.unwrap();
    assert_eq!((replay.status, replay.reservation_id()), (200, jti.clone()));
    redis.wait_record("1001", &jti, "confirmed");
    assert_eq!(upstream.orders().await, [jti]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_meta_and_users_refuse_the_activity_instead_of_resetting_the_limit() {
    // R2: with meta and users lost together, prewarm adopted the stock and the per-user limit
    // started from zero: alice held 2 units with a limit of 1.
    let (redis, _upstream, gw) = Stack::start_with(vec![TestActivity::open("1001", 5)], |config| {
        config.prewarm_interval_ms(200)
    })
    .parts();
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    assert_eq!(gw.buy("1001", "alice", None).await.code(), "limit_exceeded");
    redis.del(&["fg:{1001}:meta", "fg:{1001}:users"]);
    // Refused at once by the reserve itself, before any prewarm tick.
    assert_eq!(gw.buy("1001", "alice", None).await.code(), "unavailable");
    wait_for("the damage to be reported", Duration::from_secs(10), || {
        gw.logs().contains("lost a key it had").then_some(())
    });
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "unavailable");
    let res: Vec<String> = redis::cmd("HVALS")
        .arg("fg:{1001}:res")
        .query(&mut redis.conn())
        .unwrap();
    let alices = res
        .iter()
        .filter(|r| r.ends_with("|alice") && !r.starts_with("released|"))
        .count();
    assert_eq!(alices, 1, "alice never over her limit");
    let refused = r#"flashgate_activity_refused{activity="1001"} 1"#;
    let metrics = gw.metrics_when(|m| m.contains(refused)).await;
    assert!(metrics.contains(refused), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_order_is_confirmed_in_the_layout_redis_recorded() {
    // R8: with the YAML's segment count disagreeing with Redis (a refused configuration), the
    // backend's confirm of a paid order answered 404, the hold ran out, and `reconcile
    // --orders` called the reservation unknown.
    let (redis, _upstream, gw, jti, segment) = a_hold_then_a_refused_layout(3).await;
    let path = format!("/v1/activities/1001/reservations/{jti}");
    assert_eq!(gw.admin_get(&path).await.status, 200);
    assert_eq!(gw.admin_post(&format!("{path}/confirm")).await.status, 200);
    let tag = format!("1001~{segment}/2");
    assert!(redis.record(&tag, &jti).unwrap().starts_with("confirmed|"));
    let dir = tempfile::tempdir().unwrap();
    let orders_file = dir.path().join("orders.txt");
    std::fs::write(&orders_file, format!("{jti}\n")).unwrap();
    let config_path = gw.config_path();
    let (code, out, err) = run_cli(
        &[
            "reconcile",
            "--config",
            config_path.to_str().unwrap(),
            "--activity",
            "1001",
            "--orders",
            orders_file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        out.contains("1 confirmed") && out.contains("0 unknown to Redis"),
        "{code}: {out}{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_is_clean_while_versions_are_bumped_and_units_move() {
    // R10: reconcile read a segment's versions, then its ledgers and transfer books: a version
    // put on sale in between, and a unit of it moved, looked like a transfer mismatch.
    use std::sync::atomic::{AtomicBool, Ordering};
    let redis = RedisServer::start();
    let (settings, store, _) = two_segments_on_sale(&redis, 1000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let bumper = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut v = 1u64;
            while !stop.load(Ordering::Relaxed) && v < 5000 {
                v += 1;
                let mut a = store_activity(
                    "1001",
                    1000,
                    v,
                    1,
                    flashgate::config::ConfirmMode::Upstream,
                    Duration::from_secs(900),
                );
                a.segments = 2;
                flashgate::stock::segments::prewarm(&store, &a)
                    .await
                    .unwrap()
                    .unwrap();
                let layout = flashgate::stock::Layout::of(&a);
                let (home, giver) = (layout.segment(0).unwrap(), layout.segment(1).unwrap());
                let t = format!("t{v}");
                let n = store.withdraw(giver, v, &t, 1, 0).await.unwrap();
                store.deposit(home, v, &t, n).await.unwrap();
                store.acknowledge(giver, &t).await.unwrap();
            }
            v
        })
    };
    let mut unclean = Vec::new();
    for _ in 0..150 {
        let report = flashgate::reconcile::reconcile(&settings, &store, None)
            .await
            .unwrap();
        if !report.clean() {
            unclean.push(report.table());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let bumps = bumper.await.unwrap();
    assert!(bumps > 10, "versions were bumped meanwhile ({bumps})");
    assert!(
        unclean.is_empty(),
        "{} unclean runs, e.g.\n{}",
        unclean.len(),
        unclean[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_orders_leaves_out_other_activities_orders() {
    // Issue 24: given every order the backend kept, `reconcile --activity A --orders` called
    // the other activities' orders "unknown to Redis" (1,003 false alarms in a trial).
    let (_redis, upstream, gw) = Stack::start(vec![
        TestActivity::open("1001", 5),
        TestActivity::open("2002", 5),
    ])
    .parts();
    for (activity, user) in [("1001", "ann"), ("2002", "bob"), ("2002", "cid")] {
        assert_eq!(gw.buy(activity, user, None).await.status, 200);
    }
    let orders = upstream.orders().await;
    assert_eq!(orders.len(), 3);
    // Confirmed after the 2xx, off the buyer's path.
    wait_for_async("ann's order confirmed", Duration::from_secs(10), || async {
        (gw.activity_view("1001").await["confirmed"] == 1).then_some(())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let orders_file = dir.path().join("orders.txt");
    let forgotten = "018f0000-0000-7000-8000-000000000000";
    std::fs::write(
        &orders_file,
        format!("{}\n{forgotten}\n", orders.join("\n")),
    )
    .unwrap();
    let config_path = gw.config_path();
    let (code, out, err) = run_cli(
        &[
            "reconcile",
            "--config",
            config_path.to_str().unwrap(),
            "--activity",
            "1001",
            "--orders",
            orders_file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        out.contains("1 confirmed")
            && out.contains("1 unknown to Redis")
            && out.contains("2 of other activities left out"),
        "{code}: {out}{err}"
    );
    assert!(out.contains(forgotten), "{out}");
    assert_eq!(code, 1, "a forgotten order is not clean");
}
