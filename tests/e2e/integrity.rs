//! Stock integrity through the real binary: each test is a sequence an adversarial review found
//! to sell a unit twice, lose one, or take back a sale, and shows it no longer does.

use crate::support::*;
use flashgate::stock::prelude::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

fn claims(token: &str) -> serde_json::Value {
    jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token)
        .unwrap()
        .claims
}

/// The order lookup these tests give the gateway.
pub(super) fn lookup() -> OrderLookup {
    OrderLookup::new(500, 300)
}

/// Alice's reservation in an explicit activity of two segments (holds of `hold_secs`), then the
/// gateway restarted with a YAML saying four (a layout Redis refuses): the gateway, her jti, and
/// the segment it is in.
pub(super) async fn a_hold_then_a_refused_layout(
    hold_secs: u64,
) -> (RedisServer, Upstream, GatewayProc, String, String) {
    let two = TestActivity::explicit("1001", 10, hold_secs).segments(2);
    let (redis, upstream, mut gw) = Stack::start(vec![two.clone()]).parts();
    let jti = gw.buy("1001", "alice", None).await.reservation_id();
    let segment = jti.rsplit_once('.').unwrap().1.to_owned();
    gw.kill();
    gw.config.activities = vec![two.segments(4)];
    gw.restart();
    (redis, upstream, gw, jti, segment)
}

/// A store on `redis` with activity 1001 of `stock` units in two segments put on sale, and the
/// settings `flashgate reconcile` reads it with.
pub(super) async fn two_segments_on_sale(
    redis: &RedisServer,
    stock: u64,
) -> (
    flashgate::config::Settings,
    std::sync::Arc<flashgate::stock::StockStore>,
    std::sync::Arc<flashgate::config::Activity>,
) {
    let upstream: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let activity = TestActivity::open("1001", stock).segments(2);
    let settings = TestConfig::at(redis.url(), upstream, vec![activity]).settings();
    let activity = settings.activities.get("1001").unwrap().clone();
    let store = std::sync::Arc::new(stock_store(redis.url(), vec![], Duration::from_secs(2)));
    flashgate::stock::segments::prewarm(&store, &activity)
        .await
        .unwrap()
        .unwrap();
    (settings, store, activity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_idempotent_retry_never_gives_back_a_confirmed_sale() {
    // #12 defect 1: the retry replayed the confirmed reservation; when its forward failed, the
    // gateway released it: a confirmed order's unit went back on sale.
    let (redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 1)]).parts();
    let first = gw.buy_keyed("1001", "alice", "order-1").await;
    assert_eq!(first.status, 200);
    let jti = first.reservation_id();
    redis.wait_record("1001", &jti, "confirmed");
    upstream.set_status(500).await;
    let retry = gw.buy_keyed("1001", "alice", "order-1").await;
    retry.assert_answer(503, "unavailable");
    assert!(redis
        .record("1001", &jti)
        .unwrap()
        .starts_with("confirmed|"));
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(0));
    assert_eq!(redis.held("1001", "alice"), Some(1));
    upstream.set_status(200).await;
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_the_last_unit_gets_the_same_reservation() {
    // Review 12 F4: the sold-out cache answered the buyer who took the last unit, retrying with
    // the same key, `sold_out`.
    let (_redis, _upstream, gw) = Stack::start(vec![TestActivity::open("1001", 1)]).parts();
    let first = gw.buy_keyed("1001", "alice", "order-1").await;
    assert_eq!(first.status, 200);
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    let retry = gw.buy_keyed("1001", "alice", "order-1").await;
    assert_eq!(retry.status, 200, "{}", retry.text());
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
    let (redis, upstream, gw) = Stack::start_with(
        vec![TestActivity::open("1001", 3).per_user_limit(2)],
        TestConfig::no_per_user_rate,
    )
    .parts();
    upstream.mode("delay_ms=300").await;
    for _ in 0..10 {
        buy_and_hang_up(&gw, &upstream, "mallory", false).await;
    }
    upstream.mode("delay_ms=0").await;
    for buyer in ["ann", "bob", "cy"] {
        gw.buy("1001", buyer, None).await;
    }
    let taken = wait_for_async(
        "the backend's orders to settle",
        Duration::from_secs(10),
        || async {
            let o = upstream.orders().await;
            (o.len() >= 3).then_some(o)
        },
    )
    .await;
    assert_eq!(taken.len(), 3, "the backend holds exactly the stock");
    for jti in &taken {
        redis.wait_record("1001", jti, "confirmed");
    }
    assert_eq!(
        redis.held("1001", "mallory"),
        Some(2),
        "never over the limit"
    );
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_after_the_forward_never_loses_the_backends_confirm() {
    // Review 12 F2: a buyer whose connection reset after the forward left the reservation
    // pending while the backend took the order; it expired and the unit sold again. Review 12b
    // R5: tolerating a half-close covered FIN only; without an order lookup an RST still sold
    // twice. The gateway now reads the backend's answer on its own connection whatever the
    // buyer does, so its 2xx confirms the sale, with or without a lookup.
    for lookup in [true, false] {
        let (redis, upstream, gw) =
            Stack::start_with(vec![TestActivity::open("1001", 1)], |config| {
                let config = config.read_timeout_ms(3000);
                match lookup {
                    true => config.order_lookup(self::lookup()),
                    false => config,
                }
            })
            .parts();
        upstream.mode("delay_ms=800").await;
        buy_and_hang_up(&gw, &upstream, "alice", true).await;
        let jti = wait_for_async(
            "the backend to take alice's order",
            Duration::from_secs(10),
            || async { upstream.orders().await.pop() },
        )
        .await;
        redis.wait_record("1001", &jti, "confirmed");
        upstream.mode("delay_ms=0").await;
        // Confirmed: no sweep or lookup can put it back on sale.
        assert_eq!(
            gw.buy("1001", "bob", None).await.code(),
            "sold_out",
            "lookup: {lookup}"
        );
        assert_eq!(upstream.orders().await.len(), 1, "lookup: {lookup}");
        gw.reconcile_clean();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_lookup_settles_every_hold_that_runs_out() {
    // #12 defect 8: before a forwarded reservation expires unconfirmed, the backend is asked:
    // 200 confirms, 404 releases, no answer keeps it pending and asks again.
    let (redis, upstream, gw) =
        Stack::start_with(vec![TestActivity::explicit("1001", 5, 1)], |config| {
            config.order_lookup(lookup())
        })
        .parts();
    // The backend cannot answer lookups for now.
    upstream.mode("lookup_status=503").await;
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
        assert!(redis.record("1001", jti).unwrap().starts_with("pending|"));
    }
    upstream.mode("lookup_status=0").await;
    redis.wait_record("1001", &kept, "confirmed");
    let bob = redis.wait_record("1001", &refused, "released");
    assert!(bob.contains("|order_not_found|"), "{bob}");
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(4));
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_past_its_hold_deadline_is_not_handed_out_again() {
    // Review 12 F3: a replay near the deadline was signed afresh with exp = now + ttl, long
    // after the sweep could release the unit to someone else.
    let (redis, upstream, gw) = Stack::start(vec![TestActivity::explicit("1001", 1, 1)]).parts();
    let first = gw.buy_keyed("1001", "alice", "k1").await;
    assert_eq!(first.status, 200);
    let jti = first.reservation_id();
    let deadline_ms = redis.hold_deadline_ms("1001", &jti);
    let token = upstream.requests().await[0]["headers"]["x-flashgate-reservation"]
        .as_str()
        .unwrap()
        .to_owned();
    let c = claims(&token);
    assert!(
        c["exp"].as_u64().unwrap() <= deadline_ms / 1000,
        "the token never outlives the hold: {c}"
    );
    redis.wait_time_past("Redis's clock to pass the deadline", deadline_ms);
    let replay = gw.buy_keyed("1001", "alice", "k1").await;
    assert_eq!(replay.code(), "unavailable", "{}", replay.text());
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
    let (redis, upstream, config) = backends(vec![
        TestActivity::explicit("long", 5, 600),
        TestActivity::explicit("short", 5, 1),
    ]);
    let right = GatewayProc::start(config.clone());
    let fast = GatewayProc::start_skewed(&config, "+2h");
    let long = right.buy("long", "alice", None).await.reservation_id();
    let long_fast = fast.buy("long", "bob", None).await.reservation_id();
    let short = right.buy("short", "carol", None).await.reservation_id();
    // The one-second hold runs out and is swept (both gateways sweep every 100 ms)...
    redis.wait_record("short", &short, "released");
    // ...while the ten-minute holds, whichever gateway made them, stay.
    for jti in [&long, &long_fast] {
        let rec = redis.record("long", jti).unwrap();
        assert!(rec.starts_with("pending|"), "{rec}");
        let created: u64 = rec.split('|').nth(3).unwrap().parse().unwrap();
        assert!(
            created.abs_diff(redis.time_ms()) < 60_000,
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
    assert!((claims(&token)["iat"].as_u64().unwrap() * 1000).abs_diff(redis.time_ms()) < 60_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sales_hours_keep_to_redis_time_whatever_the_gateways_clocks_say() {
    // A gateway two hours fast thinks a sale that opens in an hour is open; one two hours slow
    // thinks a sale that closed ten minutes ago still is. Each checks its own clock first, but
    // the reserve script judges the hours by Redis's: neither sells a unit outside them.
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let later = TestActivity::open("later", 5).opening_in_an_hour();
    let over = TestActivity::open("over", 5).ended();
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
                answer.text()
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
    let view = right.activity_view("later").await;
    assert_eq!(view["remaining"], 5, "{view}");
    assert_eq!(view["pending"], 0, "{view}");
    // Over by Redis's clock: not even put on sale.
    let view = right.activity_view("over").await;
    assert!(view["pending"].is_null(), "{view}");
    assert!(upstream.requests().await.is_empty(), "nothing forwarded");
    right.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_an_older_yaml_never_sells_the_retired_version() {
    let (redis, _upstream, mut config) = backends(vec![TestActivity::open("1001", 5)]);
    let mut gw = GatewayProc::start(config.clone());
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    drop(gw);
    config.activities[0].version = 2;
    config = config.on_new_ports();
    gw = GatewayProc::start(config.clone());
    assert_eq!(gw.buy("1001", "bob", None).await.status, 200);
    drop(gw);
    // Back to the YAML of version 1: its 4 units left were retired when version 2 went on sale.
    config.activities[0].version = 1;
    let gw = GatewayProc::start(config.on_new_ports());
    assert_eq!(gw.buy("1001", "carol", None).await.code(), "unavailable");
    wait_for("the refusal in the log", Duration::from_secs(10), || {
        gw.logs()
            .contains("version 1 is older than version 2")
            .then_some(())
    });
    let view = gw.activity_view("1001").await;
    assert!(view["refused"].as_str().unwrap().contains("1001"), "{view}");
    // Not ready while it refuses a configured activity: the load balancer sends buyers to
    // another gateway, and the SRE sees which activity.
    let ready = get(gw.admin, "/readyz", &[]).await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["refused"], serde_json::json!(["1001"]));
    let metrics = gw.metrics().await;
    assert!(metrics.contains(r#"flashgate_activity_refused{activity="1001"} 1"#));
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), None);
    assert_eq!(redis.get_int("fg:{1001}:v2:stock"), Some(4));
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_meta_does_not_put_the_stock_on_sale_again() {
    // Review 12 F1: with the segment meta deleted (or evicted), the next prewarm re-created
    // the stock: stock 2, four orders. Review 12b R2/R4: adopting what outlived the meta hid
    // other losses and forgot older versions; the activity is refused (buyers may retry).
    let (redis, upstream, gw) = Stack::start_with(vec![TestActivity::open("1001", 2)], |config| {
        config.prewarm_interval_ms(200).sold_out_ttl_ms(1)
    })
    .parts();
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    assert_eq!(gw.buy("1001", "bob", None).await.status, 200);
    redis.del(&["fg:{1001}:meta"]);
    wait_for(
        "the lost meta to be noticed",
        Duration::from_secs(10),
        || gw.logs().contains("lost a key it had").then_some(()),
    );
    assert_eq!(gw.buy("1001", "carol", None).await.code(), "unavailable");
    assert_eq!(upstream.orders().await.len(), 2);
    // Issue 33: reconcile names the loss the gateway marked, until the SRE's count puts it
    // right.
    let (code, table) = gw.reconcile();
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("segment 0: LOST"), "{table}");
    let r = gw
        .admin_post_json("/v1/activities/1001/resume", r#"{"remaining": 0}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    gw.reconcile_clean();
    let r = wait_for_async(
        "an answer other than 503",
        Duration::from_secs(10),
        || async {
            let r = gw.buy("1001", "carol", None).await;
            (r.status != 503).then_some(r)
        },
    )
    .await;
    assert_eq!(r.code(), "sold_out", "{}", r.text());
    assert_eq!(upstream.orders().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_layout_is_still_swept_and_reconciled_as_redis_has_it() {
    // Review 12 F5: with the YAML's segment count disagreeing with Redis, the real segments were
    // never swept, and reconcile read the wrong layout and said clean.
    let (redis, _upstream, gw, jti, segment) = a_hold_then_a_refused_layout(1).await;
    // Alice's hold expires in the real segment.
    redis.wait_record(&format!("1001~{segment}/2"), &jti, "released");
    let table = gw.reconcile_clean();
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
    let (settings, store, activity) = two_segments_on_sale(&redis, 1_000_000).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // What a buyer's rebalance does, over and over: withdraw from segment 1, deposit with a
    // reserve in segment 0, acknowledge.
    let mover = {
        let (store, activity, stop) = (store.clone(), activity.clone(), stop.clone());
        tokio::spawn(async move {
            let layout = Layout::of(&activity);
            let (home, giver) = (layout.segment(0).unwrap(), layout.segment(1).unwrap());
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
                    steps: None,
                    line: false,
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
