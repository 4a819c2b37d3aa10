//! Stock integrity through the real binary: each test is a sequence an adversarial review found
//! to sell a unit twice, lose one, or take back a sale, and shows it no longer does.

use crate::support::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

pub(super) async fn buy_keyed(
    gw: &GatewayProc,
    activity: &str,
    user: &str,
    key: &str,
) -> HttpResponse {
    request(
        gw.addr,
        "POST",
        &format!("/api/seckill/{activity}/buy"),
        &[("X-User-Id", user), ("Idempotency-Key", key)],
    )
    .await
}

pub(super) async fn upstream_mode(upstream: &Upstream, query: &str) {
    let resp = request(
        upstream.addr,
        "POST",
        &format!("/__upstream/mode?{query}"),
        &[],
    )
    .await;
    assert_eq!(resp.status, 200);
}

/// The reservation ids of the orders the demo backend took (answered 2xx).
pub(super) async fn orders(upstream: &Upstream) -> Vec<String> {
    get(upstream.addr, "/__upstream/orders", &[]).await.json()["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

pub(super) fn record(redis: &RedisServer, tag: &str, jti: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(format!("fg:{{{tag}}}:res"))
        .arg(jti)
        .query(&mut redis.conn())
        .unwrap()
}

pub(super) fn redis_ms(redis: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
    s * 1000 + us / 1000
}

fn claims(token: &str) -> serde_json::Value {
    jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token)
        .unwrap()
        .claims
}

const LOOKUP: &str =
    "  order_lookup: { path: \"/orders/{jti}\", timeout_ms: 500, retry_interval_ms: 300 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_idempotent_retry_never_gives_back_a_confirmed_sale() {
    // #12 defect 1: the retry replayed the confirmed reservation; when its forward failed, the
    // gateway released it: a confirmed order's unit went back on sale.
    let Stack {
        redis,
        upstream,
        gw,
    } = Stack::start(vec![TestActivity::open("1001", 1)]);
    let first = buy_keyed(&gw, "1001", "alice", "order-1").await;
    assert_eq!(first.status, 200);
    let jti = first.reservation_id();
    wait_for(
        "alice's sale to be confirmed",
        Duration::from_secs(10),
        || record(&redis, "1001", &jti).filter(|r| r.starts_with("confirmed|")),
    );
    upstream.set_status(500).await;
    let retry = buy_keyed(&gw, "1001", "alice", "order-1").await;
    assert_eq!((retry.status, retry.code().as_str()), (503, "unavailable"));
    assert!(record(&redis, "1001", &jti)
        .unwrap()
        .starts_with("confirmed|"));
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(0));
    assert_eq!(redis.held("1001", "alice"), Some(1));
    upstream.set_status(200).await;
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_the_last_unit_gets_the_same_reservation() {
    // Review 12 F4: the sold-out cache answered the buyer who took the last unit, retrying with
    // the same key, `sold_out`.
    let Stack {
        redis: _redis,
        upstream: _upstream,
        gw,
    } = Stack::start(vec![TestActivity::open("1001", 1)]);
    let first = buy_keyed(&gw, "1001", "alice", "order-1").await;
    assert_eq!(first.status, 200);
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let retry = buy_keyed(&gw, "1001", "alice", "order-1").await;
    assert_eq!(
        retry.status,
        200,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.reservation_id(), first.reservation_id());
}

/// Sends a purchase, waits until the backend has it (or the gateway answered), then hangs up:
/// with `reset`, abortively (RST), else with a FIN.
async fn buy_and_hang_up(gw: &GatewayProc, upstream: &Upstream, user: &str, reset: bool) {
    let before = upstream.requests().await.len();
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    stream
        .write_all(raw_request("POST", "/api/seckill/1001/buy", &[("X-User-Id", user)]).as_bytes())
        .await
        .unwrap();
    wait_for_async(
        "the request to reach the backend, or an answer",
        Duration::from_secs(10),
        || async {
            let mut probe = [0u8; 1];
            let answered = matches!(
                tokio::time::timeout(Duration::from_millis(5), stream.peek(&mut probe)).await,
                Ok(Ok(n)) if n > 0
            );
            (answered || upstream.requests().await.len() > before).then_some(())
        },
    )
    .await;
    if reset {
        stream.set_zero_linger().unwrap();
    }
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_hanging_up_after_forwarding_never_gives_back_a_unit_the_backend_sold() {
    // #12 defect 10: the gateway saw the client gone before the backend's status line and
    // released the reservation: 10 hang-ups by one buyer against stock 3 left the backend with
    // 13 valid reservations, the ledger with 3. Now the proxy keeps reading the backend's
    // answer, which confirms the sale.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        per_user_limit: 2,
        max_per_request: 1,
        ..TestActivity::open("1001", 3)
    };
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config.per_user = None;
    let gw = GatewayProc::start(config);
    upstream_mode(&upstream, "delay_ms=300").await;
    for _ in 0..10 {
        buy_and_hang_up(&gw, &upstream, "mallory", false).await;
    }
    upstream_mode(&upstream, "delay_ms=0").await;
    for buyer in ["ann", "bob", "cy"] {
        gw.buy("1001", buyer, None).await;
    }
    let taken = wait_for_async(
        "the backend's orders to settle",
        Duration::from_secs(10),
        || async {
            let o = orders(&upstream).await;
            (o.len() >= 3).then_some(o)
        },
    )
    .await;
    assert_eq!(taken.len(), 3, "the backend holds exactly the stock");
    for jti in &taken {
        wait_for(
            "each order to be confirmed",
            Duration::from_secs(10),
            || record(&redis, "1001", jti).filter(|r| r.starts_with("confirmed|")),
        );
    }
    assert_eq!(
        redis.held("1001", "mallory"),
        Some(2),
        "never over the limit"
    );
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_after_the_forward_never_loses_the_backends_confirm() {
    // Review 12 F2: a buyer whose connection reset after the forward left the reservation
    // pending while the backend took the order; it expired and the unit sold again. Review 12b
    // R5: tolerating a half-close covered FIN only; without an order lookup an RST still sold
    // twice. The gateway now reads the backend's answer on its own connection whatever the
    // buyer does, so its 2xx confirms the sale, with or without a lookup.
    for lookup in [true, false] {
        let redis = RedisServer::start();
        let upstream = Upstream::start();
        let mut config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", 1)]);
        if lookup {
            config.extra_upstream_yaml = LOOKUP.to_owned();
        }
        config.read_timeout_ms = 3000;
        let gw = GatewayProc::start(config);
        upstream_mode(&upstream, "delay_ms=800").await;
        buy_and_hang_up(&gw, &upstream, "alice", true).await;
        let jti = wait_for_async(
            "the backend to take alice's order",
            Duration::from_secs(10),
            || async { orders(&upstream).await.pop() },
        )
        .await;
        wait_for(
            "the backend's 2xx to confirm it",
            Duration::from_secs(10),
            || record(&redis, "1001", &jti).filter(|r| r.starts_with("confirmed|")),
        );
        upstream_mode(&upstream, "delay_ms=0").await;
        // Confirmed: no sweep or lookup can put it back on sale.
        assert_eq!(
            gw.buy("1001", "bob", None).await.code(),
            "sold_out",
            "lookup: {lookup}"
        );
        assert_eq!(orders(&upstream).await.len(), 1, "lookup: {lookup}");
        let (code, table) = gw.reconcile();
        assert_eq!(code, 0, "{table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_lookup_settles_every_hold_that_runs_out() {
    // #12 defect 8: before a forwarded reservation expires unconfirmed, the backend is asked:
    // 200 confirms, 404 releases, no answer keeps it pending and asks again.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(
        &redis,
        &upstream,
        vec![TestActivity::explicit("1001", 5, 1)],
    );
    config.extra_upstream_yaml = LOOKUP.to_owned();
    let gw = GatewayProc::start(config);
    // The backend cannot answer lookups for now.
    upstream_mode(&upstream, "lookup_status=503").await;
    let kept = gw.buy("1001", "alice", None).await.reservation_id(); // an order (2xx)
    upstream.set_status(409).await;
    let refused = gw.buy("1001", "bob", None).await.reservation_id(); // no order (4xx)
    upstream.set_status(200).await;
    gw.metrics_when(|m| {
        metric_value(
            m,
            r#"flashgate_order_lookups_total{activity="1001",result="unanswered"}"#,
        )
        .is_some_and(|n| n >= 2.0)
    })
    .await;
    for jti in [&kept, &refused] {
        assert!(record(&redis, "1001", jti).unwrap().starts_with("pending|"));
    }
    upstream_mode(&upstream, "lookup_status=0").await;
    wait_for(
        "alice's order to be confirmed by the lookup",
        Duration::from_secs(10),
        || record(&redis, "1001", &kept).filter(|r| r.starts_with("confirmed|")),
    );
    let bob = wait_for("bob's hold to be released", Duration::from_secs(10), || {
        record(&redis, "1001", &refused).filter(|r| r.starts_with("released|"))
    });
    assert!(bob.contains("|order_not_found|"), "{bob}");
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(4));
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_past_its_hold_deadline_is_not_handed_out_again() {
    // Review 12 F3: a replay near the deadline was signed afresh with exp = now + ttl, long
    // after the sweep could release the unit to someone else.
    let Stack {
        redis,
        upstream,
        gw,
    } = Stack::start(vec![TestActivity::explicit("1001", 1, 1)]);
    let first = buy_keyed(&gw, "1001", "alice", "k1").await;
    assert_eq!(first.status, 200);
    let jti = first.reservation_id();
    let deadline_ms: u64 = record(&redis, "1001", &jti)
        .unwrap()
        .split('|')
        .nth(4)
        .unwrap()
        .parse()
        .unwrap();
    let token = upstream.requests().await[0]["headers"]["x-flashgate-reservation"]
        .as_str()
        .unwrap()
        .to_owned();
    let c = claims(&token);
    assert!(
        c["exp"].as_u64().unwrap() <= deadline_ms / 1000,
        "the token never outlives the hold: {c}"
    );
    wait_for(
        "Redis's clock to pass the deadline",
        Duration::from_secs(5),
        || (redis_ms(&redis) > deadline_ms).then_some(()),
    );
    let replay = buy_keyed(&gw, "1001", "alice", "k1").await;
    assert_eq!(
        replay.code(),
        "unavailable",
        "{}",
        String::from_utf8_lossy(&replay.body)
    );
    assert_eq!(
        upstream.requests().await.len(),
        1,
        "nothing forwarded again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_and_sweeps_keep_to_redis_time_whatever_the_gateways_clocks_say() {
    // #12 defect 7: the deadline came from the reserving gateway's clock and the expiry from
    // the sweeping one's: an instance two hours fast cut every hold short.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = TestConfig::new(
        &redis,
        &upstream,
        vec![
            TestActivity::explicit("long", 5, 600),
            TestActivity::explicit("short", 5, 1),
        ],
    );
    let right = GatewayProc::start(config.clone());
    let fast = GatewayProc::start_skewed(&config, "+2h");
    let long = right.buy("long", "alice", None).await.reservation_id();
    let long_fast = fast.buy("long", "bob", None).await.reservation_id();
    let short = right.buy("short", "carol", None).await.reservation_id();
    // The one-second hold runs out and is swept (both gateways sweep every 100 ms)...
    wait_for("the short hold to expire", Duration::from_secs(15), || {
        record(&redis, "short", &short).filter(|r| r.starts_with("released|"))
    });
    // ...while the ten-minute holds, whichever gateway made them, stay.
    for jti in [&long, &long_fast] {
        let rec = record(&redis, "long", jti).unwrap();
        assert!(rec.starts_with("pending|"), "{rec}");
        let created: u64 = rec.split('|').nth(3).unwrap().parse().unwrap();
        assert!(
            created.abs_diff(redis_ms(&redis)) < 60_000,
            "times come from Redis, not the gateway: {rec}"
        );
    }
    // The fast gateway's tokens are dated by Redis too.
    let token = upstream
        .requests()
        .await
        .iter()
        .find(|r| r["headers"]["x-user-id"] == "bob")
        .unwrap()["headers"]["x-flashgate-reservation"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!((claims(&token)["iat"].as_u64().unwrap() * 1000).abs_diff(redis_ms(&redis)) < 60_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sales_hours_keep_to_redis_time_whatever_the_gateways_clocks_say() {
    // A gateway two hours fast thinks a sale that opens in an hour is open; one two hours slow
    // thinks a sale that closed ten minutes ago still is. Each checks its own clock first, but
    // the reserve script judges the hours by Redis's: neither sells a unit outside them.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let later = TestActivity {
        starts_at: from_now(chrono::Duration::hours(1)),
        ends_at: from_now(chrono::Duration::hours(5)),
        ..TestActivity::open("later", 5)
    };
    let over = TestActivity {
        starts_at: from_now(chrono::Duration::hours(-3)),
        ends_at: from_now(chrono::Duration::minutes(-10)),
        ..TestActivity::open("over", 5)
    };
    let config = TestConfig::new(&redis, &upstream, vec![later, over]);
    let fast = GatewayProc::start_skewed(&config, "+2h");
    let slow = GatewayProc::start_skewed(&config, "-2h");
    let right = GatewayProc::start(config.clone());
    for (gw, activity, code, status) in [
        (&fast, "later", "not_started", 403),
        (&right, "later", "not_started", 403),
        (&slow, "over", "ended", 410),
        (&right, "over", "ended", 410),
    ] {
        for user in ["alice", "bob"] {
            let answer = gw.buy(activity, user, None).await;
            assert_eq!(
                (answer.status, answer.code()),
                (status, code.to_owned()),
                "{activity}: {}",
                String::from_utf8_lossy(&answer.body)
            );
        }
    }
    // The skewed gateways learned Redis's clock (and said so): they answered as Redis would
    // without a script call. Were they to ask, the script judges again (tests/scripts.rs).
    for gw in [&fast, &slow] {
        wait_for(
            "the clock offset in the log",
            Duration::from_secs(10),
            || gw.logs().contains("Redis's clock is").then_some(()),
        );
    }
    let view = right.admin_get("/v1/activities/later").await.json();
    assert_eq!(view["remaining"], 5, "{view}");
    assert_eq!(view["pending"], 0, "{view}");
    // Over by Redis's clock: not even put on sale.
    let view = right.admin_get("/v1/activities/over").await.json();
    assert!(view["pending"].is_null(), "{view}");
    assert!(upstream.requests().await.is_empty(), "nothing forwarded");
    let (code, out) = right.reconcile();
    assert_eq!(code, 0, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_an_older_yaml_never_sells_the_retired_version() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", 5)]);
    let mut gw = GatewayProc::start(config.clone());
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    drop(gw);
    config.activities[0].version = 2;
    config.listen_port = free_port();
    config.admin_port = free_port();
    gw = GatewayProc::start(config.clone());
    assert_eq!(gw.buy("1001", "bob", None).await.status, 200);
    drop(gw);
    // Back to the YAML of version 1: its 4 units left were retired when version 2 went on sale.
    config.activities[0].version = 1;
    config.listen_port = free_port();
    config.admin_port = free_port();
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "carol", None).await.code(), "unavailable");
    wait_for("the refusal in the log", Duration::from_secs(10), || {
        gw.logs()
            .contains("version 1 is older than version 2")
            .then_some(())
    });
    let view = gw.admin_get("/v1/activities/1001").await.json();
    assert!(view["refused"].as_str().unwrap().contains("1001"), "{view}");
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), None);
    assert_eq!(redis.get_int("fg:{1001}:v2:stock"), Some(4));
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_meta_does_not_put_the_stock_on_sale_again() {
    // Review 12 F1: with the partition meta deleted (or evicted), the next prewarm re-created
    // the stock: stock 2, four orders. Review 12b R2/R4: adopting what outlived the meta hid
    // other losses and forgot older versions; the activity is refused (buyers may retry).
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", 2)]);
    config.extra_redis_yaml = "  prewarm_interval_ms: 200\n".to_owned();
    config.sold_out_ttl_ms = 1;
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    assert_eq!(gw.buy("1001", "bob", None).await.status, 200);
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:meta")
        .query(&mut redis.conn())
        .unwrap();
    wait_for(
        "the lost meta to be noticed",
        Duration::from_secs(10),
        || gw.logs().contains("lost a key it had").then_some(()),
    );
    assert_eq!(gw.buy("1001", "carol", None).await.code(), "unavailable");
    assert_eq!(orders(&upstream).await.len(), 2);
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_layout_is_still_swept_and_reconciled_as_redis_has_it() {
    // Review 12 F5: with the YAML's segment count disagreeing with Redis, the real segments were
    // never swept, and reconcile read the wrong layout and said clean.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let two = TestActivity {
        segments: Some(2),
        ..TestActivity::explicit("1001", 10, 1)
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
    wait_for(
        "alice's hold to expire in the real segment",
        Duration::from_secs(15),
        || {
            record(&redis, &format!("1001~{segment}/2"), &jti)
                .filter(|r| r.starts_with("released|"))
        },
    );
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "{table}");
    assert!(
        table.contains("1001~0/2") && table.contains("recorded 2"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_stays_clean_while_segments_rebalance() {
    // Review 12 F6: reconcile read each segment and the transfers at different moments, and
    // reported ordinary rebalancing as a TRANSFER MISMATCH in 99 of 100 runs.
    use flashgate::stock::{Layout, ReserveCall, SaleHours};
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        segments: Some(2),
        ..TestActivity::open("1001", 1_000_000)
    };
    let config = TestConfig::new(&redis, &upstream, vec![activity]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config.to_yaml()).unwrap();
    let settings = flashgate::config::Settings::load_without_secrets(&path).unwrap();
    let activity = settings.activities.get("1001").unwrap().clone();
    let store = std::sync::Arc::new(stock_store(redis.url(), vec![], Duration::from_secs(2)));
    flashgate::stock::segments::prewarm(&store, &activity)
        .await
        .unwrap()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // What a buyer's rebalance does, over and over: withdraw from segment 1, deposit with a
    // reserve in segment 0, acknowledge.
    let mover = {
        let (store, activity, stop) = (store.clone(), activity.clone(), stop.clone());
        tokio::spawn(async move {
            let layout = Layout::of(&activity);
            let (home, giver) = (layout.partition(0).unwrap(), layout.partition(1).unwrap());
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let t = format!("t{n}");
                let taken = store.withdraw(giver, 1, &t, 1, 0).await.unwrap();
                let id = format!("r{n}.0");
                let call = ReserveCall {
                    user: "mover",
                    qty: 1,
                    per_user_limit: 1_000_000,
                    version: 1,
                    reservation_id: &id,
                    hold: Duration::from_secs(900),
                    idempotency_key: None,
                    deposit: Some((&t, taken)),
                    in_flight: Duration::ZERO,
                    replay_only: false,
                    hours: SaleHours::ALWAYS,
                };
                store.reserve(home, &call).await.unwrap();
                store.acknowledge(giver, &t).await.unwrap();
            }
            n
        })
    };
    for _ in 0..50 {
        let report = flashgate::reconcile::reconcile(&settings, &store, None)
            .await
            .unwrap();
        assert!(report.clean(), "{}", report.table());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let moved = mover.await.unwrap();
    assert!(moved > 50, "the transfers ran alongside: {moved}");
    assert!(flashgate::reconcile::reconcile(&settings, &store, None)
        .await
        .unwrap()
        .clean());
}
