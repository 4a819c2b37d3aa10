//! How reservations settle at the edges of their lifecycle: a hold shorter than the backend, a
//! replay near its deadline, a partition that lost its meta and users, a paid order confirmed in
//! the layout Redis recorded, reconcile while versions are bumped. (Found by the second review
//! of stock integrity, 12b: each sold a unit twice or lost a paid order then.)

use super::integrity::{buy_keyed, orders, record, redis_ms, upstream_mode};
use crate::support::*;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_shorter_than_the_backend_never_sells_twice() {
    // R7: with hold_secs 1 and a backend taking 2.5 s, alice's hold was swept while her request
    // was at the backend; bob bought the unit, and the backend took both orders.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        hold_secs: Some(1),
        ..TestActivity::open("1001", 1)
    };
    let gw = Arc::new(GatewayProc::start(TestConfig::new(
        &redis,
        &upstream,
        vec![activity],
    )));
    upstream_mode(&upstream, "status=200&delay_ms=2500").await;
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
    let start = redis_ms(&redis);
    wait_for(
        "alice's hold deadline to pass",
        Duration::from_secs(10),
        || (redis_ms(&redis) > start + 1200).then_some(()),
    );
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let alice = alice.await.unwrap();
    assert_eq!(alice.status, 200);
    let jti = alice.reservation_id();
    wait_for(
        "alice's order to be confirmed",
        Duration::from_secs(10),
        || record(&redis, "1001", &jti).filter(|r| r.starts_with("confirmed|")),
    );
    assert_eq!(orders(&upstream).await, [jti]);
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_near_its_hold_deadline_keeps_the_unit_until_the_backend_answered() {
    // R7b (review 12's F3 sequence): hold 2 s; alice's first attempt is refused by the backend
    // (409, so it stays pending); her keyed retry half a second before the deadline takes the
    // backend 1.5 s; bob buys after the deadline. Two orders for stock 1.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        hold_secs: Some(2),
        ..TestActivity::open("1001", 1)
    };
    let gw = Arc::new(GatewayProc::start(TestConfig::new(
        &redis,
        &upstream,
        vec![activity],
    )));
    upstream_mode(&upstream, "status=409").await;
    let first = buy_keyed(&gw, "1001", "alice", "k1").await;
    assert_eq!(first.status, 409);
    let jti = first.reservation_id();
    let deadline_ms: u64 = record(&redis, "1001", &jti)
        .unwrap()
        .split('|')
        .nth(4)
        .unwrap()
        .parse()
        .unwrap();
    upstream_mode(&upstream, "status=200&delay_ms=1500").await;
    wait_for(
        "half a second before the deadline",
        Duration::from_secs(10),
        || (redis_ms(&redis) + 500 >= deadline_ms).then_some(()),
    );
    let replay = {
        let gw = gw.clone();
        tokio::spawn(async move { buy_keyed(&gw, "1001", "alice", "k1").await })
    };
    wait_for("past the deadline", Duration::from_secs(10), || {
        (redis_ms(&redis) > deadline_ms + 300).then_some(())
    });
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let replay = replay.await.unwrap();
    assert_eq!((replay.status, replay.reservation_id()), (200, jti.clone()));
    wait_for(
        "the replay's order to be confirmed",
        Duration::from_secs(10),
        || record(&redis, "1001", &jti).filter(|r| r.starts_with("confirmed|")),
    );
    assert_eq!(orders(&upstream).await, [jti]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_meta_and_users_refuse_the_activity_instead_of_resetting_the_limit() {
    // R2: with meta and users lost together, prewarm adopted the stock and the per-user limit
    // started from zero: alice held 2 units with a limit of 1.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", 5)]);
    config.extra_redis_yaml = "  prewarm_interval_ms: 200\n".to_owned();
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    assert_eq!(gw.buy("1001", "alice", None).await.code(), "limit_exceeded");
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:meta")
        .arg("fg:{1001}:users")
        .query(&mut redis.conn())
        .unwrap();
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
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let two = TestActivity {
        segments: Some(2),
        ..TestActivity::explicit("1001", 10, 3)
    };
    let mut gw = GatewayProc::start(TestConfig::new(&redis, &upstream, vec![two.clone()]));
    let jti = gw.buy("1001", "alice", None).await.reservation_id();
    let segment = jti.rsplit_once('.').unwrap().1.to_owned();
    gw.kill();
    let mut config = gw.config.clone();
    config.activities = vec![TestActivity {
        segments: Some(4),
        ..two
    }];
    gw.config = config;
    gw.restart();
    let path = format!("/v1/activities/1001/reservations/{jti}");
    assert_eq!(gw.admin_get(&path).await.status, 200);
    assert_eq!(gw.admin_post(&format!("{path}/confirm")).await.status, 200);
    let tag = format!("1001~{segment}/2");
    assert!(record(&redis, &tag, &jti)
        .unwrap()
        .starts_with("confirmed|"));
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
    let upstream = Upstream::start();
    let activity = TestActivity {
        segments: Some(2),
        ..TestActivity::open("1001", 1000)
    };
    let config = TestConfig::new(&redis, &upstream, vec![activity]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config.to_yaml()).unwrap();
    let settings = flashgate::config::Settings::load_without_secrets(&path).unwrap();
    let store = Arc::new(stock_store(redis.url(), vec![], Duration::from_secs(2)));
    let base = settings.activities.get("1001").unwrap().clone();
    flashgate::stock::segments::prewarm(&store, &base)
        .await
        .unwrap()
        .unwrap();
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
                let (home, giver) = (layout.partition(0).unwrap(), layout.partition(1).unwrap());
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
