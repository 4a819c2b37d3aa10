//! Segmented stock: one activity's stock split over hash-tagged segments, every buyer with a
//! home segment that holds their units, and rebalancing so the whole stock sells.

use crate::support::*;
use flashgate::stock::prelude::*;
use flashgate::stock::Layout;
use std::collections::HashMap;
use std::sync::Arc;

/// A user's home segment among `count`, as the gateway computes it.
fn home_segment(user: &str, count: u32) -> u32 {
    Layout::new(Arc::from("any"), count).home(user).index()
}

fn segmented(id: &'static str, stock: u64, segments: u32, limit: u32) -> TestActivity {
    TestActivity {
        segments: Some(segments),
        per_user_limit: limit,
        max_per_request: limit,
        ..TestActivity::open(id, stock)
    }
}

/// Units per user the upstream saw (from the verified-by-shape reservations).
async fn units_by_user(upstream: &Upstream) -> HashMap<String, u64> {
    let mut units = HashMap::new();
    for r in upstream.requests().await {
        let token = r["headers"]["x-flashgate-reservation"].as_str().unwrap();
        let claims = jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token)
            .unwrap()
            .claims;
        assert_eq!(
            claims["act"], "1001",
            "the JWT names the activity, not a segment"
        );
        *units
            .entry(claims["sub"].as_str().unwrap().to_owned())
            .or_default() += claims["qty"].as_u64().unwrap();
    }
    units
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segmented_sale_sells_its_stock_with_exact_per_user_limits() {
    const STOCK: u64 = 1000;
    let (_redis, upstream, mut config) = backends(vec![segmented("1001", STOCK, 4, 2)]);
    config.per_user = None;
    // A budget for 3,000 requests at once on two cores shared with the rest of the suite: this
    // test is about exact limits across segments, not latency.
    config.redis_timeout_ms = 5000;
    let gw = GatewayProc::start(config);

    // 1,500 buyers at once, each asking for 2 then 1: demand well over the stock.
    let requests: Vec<String> = (0..1500)
        .flat_map(|i| {
            let user = format!("buyer-{i}");
            ["2", "1"].map(|q| {
                raw_request(
                    "POST",
                    &format!("/api/seckill/1001/buy?qty={q}"),
                    &[("X-User-Id", &user)],
                )
            })
        })
        .collect();
    for resp in burst(gw.addr, requests).await {
        assert!(
            matches!(resp.status, 200 | 409 | 410),
            "{} {}",
            resp.status,
            resp.text()
        );
    }
    let units = units_by_user(&upstream).await;
    let sold: u64 = units.values().sum();
    assert!(sold * 1000 >= STOCK * 999, "sold {sold} of {STOCK}");
    assert!(sold <= STOCK, "oversold: {sold}");
    assert!(units.values().all(|&u| u <= 2), "a buyer over the limit");
    let view = gw.activity_view("1001").await;
    assert_eq!(view["segments"], 4);
    assert_eq!(view["remaining"].as_u64(), Some(STOCK - sold));
    let table = gw.reconcile_clean();
    assert!(table.contains("1001~3/4"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_home_segment_pulls_stock_from_the_others() {
    let (redis, upstream, mut config) = backends(vec![segmented("1001", 400, 4, 2)]);
    config.per_user = None;
    config.redis_timeout_ms = 2000;
    let gw = GatewayProc::start(config);

    // 150 buyers who all live in segment 0 (100 units of its own) want 2 units each.
    let homed: Vec<String> = (0..)
        .map(|i| format!("home0-{i}"))
        .filter(|u| home_segment(u, 4) == 0)
        .take(150)
        .collect();
    let requests = homed
        .iter()
        .map(|u| raw_request("POST", "/api/seckill/1001/buy?qty=2", &[("X-User-Id", u)]))
        .collect();
    let statuses: Vec<u16> = burst(gw.addr, requests)
        .await
        .iter()
        .map(|r| r.status)
        .collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    // Their limit still holds across segments: a third unit is refused.
    assert_eq!(
        gw.buy("1001", &homed[0], Some(1)).await.code(),
        "limit_exceeded"
    );
    let units = units_by_user(&upstream).await;
    assert_eq!(units.values().sum::<u64>(), 300);
    let mut conn = redis.conn();
    let moved_in: i64 = redis::cmd("HGET")
        .arg("fg:{1001~0/4}:v1:ledger")
        .arg("moved_in")
        .query(&mut conn)
        .unwrap();
    assert!(moved_in >= 200, "segment 0 received {moved_in}");
    let left: i64 = (0..4)
        .map(|s| {
            redis
                .get_int(&format!("fg:{{1001~{s}/4}}:v1:stock"))
                .unwrap()
        })
        .sum();
    assert_eq!(left, 100, "no unit created or lost by transfers");
    gw.reconcile_clean();

    // Reservations live in the buyer's segment; the admin API finds them by id.
    let jti = {
        let r = &upstream.requests().await[0];
        let token = r["headers"]["x-flashgate-reservation"].as_str().unwrap();
        jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token)
            .unwrap()
            .claims["jti"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(jti.ends_with(".0"), "{jti}");
    let released = gw
        .admin_post(&format!("/v1/activities/1001/reservations/{jti}/release"))
        .await;
    assert_eq!(released.status, 200);
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_cut_in_half_is_accounted_for_and_delivered_by_the_sweep() {
    let (redis, _upstream, config) = backends(vec![segmented("1001", 400, 4, 2)]);
    let gw = GatewayProc::start(config);
    // A gateway dies between the two halves of a transfer: 30 units leave segment 1 and are
    // recorded as in flight, nothing arrives in segment 0 yet.
    let settings = flashgate::Settings::load_without_secrets(&gw.config_path()).unwrap();
    let activity = settings.activities.get("1001").unwrap();
    let store = stock_store(redis.url(), vec![], std::time::Duration::from_secs(2));
    // (The gateway prewarms at start-up; make sure, without racing it: create-once.)
    flashgate::stock::segments::prewarm(&store, activity)
        .await
        .unwrap()
        .unwrap();
    let layout = Layout::of(activity);
    let (giver, receiver) = (layout.segment(1).unwrap(), layout.segment(0).unwrap());
    assert_eq!(
        store.withdraw(giver, 1, "t-crash", 30, 0).await.unwrap(),
        30
    );
    assert_eq!(redis.get_int("fg:{1001~1/4}:v1:stock"), Some(70));
    assert_eq!(redis.get_int("fg:{1001~0/4}:v1:stock"), Some(100));
    let (code, table) = gw.reconcile();
    assert_eq!(code, 0, "units in flight are accounted for: {table}");

    // The sweep delivers it once it is clearly abandoned; exactly once.
    wait_for_async(
        "the stranded transfer to be delivered",
        std::time::Duration::from_secs(20),
        || async { (redis.get_int("fg:{1001~0/4}:v1:stock") == Some(130)).then_some(()) },
    )
    .await;
    wait_for_async(
        "the giver to forget the delivered transfer",
        std::time::Duration::from_secs(10),
        || async {
            store
                .transfers(giver)
                .await
                .unwrap()
                .0
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        store.deposit(receiver, 1, "t-crash", 30).await.unwrap(),
        flashgate::stock::Deposit::AlreadyLanded,
        "a second deposit changes nothing"
    );
    assert_eq!(redis.get_int("fg:{1001~0/4}:v1:stock"), Some(130));
    gw.reconcile_clean();

    // A transfer that created units from nothing would be caught.
    let mut conn = redis.conn();
    let _: () = redis::cmd("HINCRBY")
        .arg("fg:{1001~0/4}:v1:ledger")
        .arg("moved_in")
        .arg(5)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("INCRBY")
        .arg("fg:{1001~0/4}:v1:stock")
        .arg(5)
        .query(&mut conn)
        .unwrap();
    let (code, table) = gw.reconcile();
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("TRANSFER MISMATCH"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_segments_is_refused_with_or_without_a_new_version() {
    let (redis, _upstream, mut config) = backends(vec![TestActivity::open("1001", 10)]);
    let gw = GatewayProc::start(config.clone());
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    drop(gw);

    // Someone re-splits the activity into 4 segments: under the same version that would put 10
    // fresh units on sale next to the 9 left; with a new version alice's unit would no longer
    // count against her limit. Either way: refused, buyers get 503, nothing is created.
    for version in [1, 2] {
        config.activities[0].segments = Some(4);
        config.activities[0].version = version;
        config = config.on_new_ports();
        let gw = GatewayProc::start(config.clone());
        assert_eq!(gw.buy("1001", "bob", None).await.code(), "unavailable");
        for s in 0..4 {
            assert_eq!(
                redis.get_int(&format!("fg:{{1001~{s}/4}}:v{version}:stock")),
                None
            );
        }
        assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(9));
        wait_for(
            "the refusal to be logged",
            std::time::Duration::from_secs(10),
            || gw.logs().contains("it was first sold with 1").then_some(()),
        );
        let view = gw.activity_view("1001").await;
        assert!(
            view["refused"].as_str().unwrap().contains("segments is 4"),
            "{view}"
        );
        assert!(gw
            .metrics()
            .await
            .contains(r#"flashgate_activity_refused{activity="1001"} 1"#));
    }
    // Back to the configuration Redis knows: on sale again, alice's unit still counted.
    config.activities[0].segments = None;
    config.activities[0].version = 1;
    config = config.on_new_ports();
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "carol", None).await.status, 200);
    assert_eq!(gw.buy("1001", "alice", None).await.code(), "limit_exceeded");
}
