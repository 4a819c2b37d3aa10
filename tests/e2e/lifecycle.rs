//! Reservation lifecycle end to end: confirm, release, expiry across instances, a gateway killed
//! between deduction and forwarding, idempotent retries, version bumps, and reconcile.

use crate::support::*;
use std::collections::HashMap;
use std::time::Duration;

fn stream_events(redis: &RedisServer, activity: &str) -> Vec<HashMap<String, String>> {
    let mut conn = redis.conn();
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("fg:{{{activity}}}:events"))
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    reply
        .ids
        .iter()
        .map(|e| {
            e.map
                .keys()
                .map(|k| (k.clone(), e.get::<String>(k).unwrap()))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_confirm_and_release_are_idempotent_with_409_and_404() {
    let (redis, _upstream, gw) = Stack::start(vec![TestActivity::explicit("1001", 5, 900)]).parts();
    let jti = gw.buy("1001", "alice", None).await.reservation_id();
    let base = format!("/v1/activities/1001/reservations/{jti}");

    let view = gw.activity_view("1001").await;
    assert_eq!(
        (view["remaining"].as_i64(), view["pending"].as_i64()),
        (Some(4), Some(1))
    );

    // Without the token: 401.
    assert_eq!(
        request(gw.admin, "POST", &format!("{base}/confirm"), &[])
            .await
            .status,
        401
    );

    // Confirm, then release after payment (a cancelled order): each idempotent, so units
    // return exactly once.
    for (action, state) in [("confirm", "confirmed"), ("release", "released")] {
        let first = gw.admin_post(&format!("{base}/{action}")).await;
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.json()["state"], state);
        let again = gw.admin_post(&format!("{base}/{action}")).await;
        assert_eq!(again.status, 200, "{action} is idempotent");
        if action == "confirm" {
            let view = gw.activity_view("1001").await;
            assert_eq!(
                (view["pending"].as_i64(), view["confirmed"].as_i64()),
                (Some(0), Some(1))
            );
        }
    }
    let view = gw.activity_view("1001").await;
    assert_eq!(
        (
            view["remaining"].as_i64(),
            view["confirmed"].as_i64(),
            view["released"].as_i64()
        ),
        (Some(5), Some(0), Some(1)),
        "{view}"
    );
    // Confirming a released reservation is a conflict.
    let conflict = gw.admin_post(&format!("{base}/confirm")).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.json()["state"], "released");

    // Unknown ids and activities: 404.
    for path in [
        "/v1/activities/1001/reservations/01234567-89ab-cdef-0123-456789abcdef/confirm",
        "/v1/activities/1001/reservations/01234567-89ab-cdef-0123-456789abcdef/release",
        "/v1/activities/1001/reservations/not%20an%20id/release",
        "/v1/activities/nope/reservations/x/release",
    ] {
        assert_eq!(gw.admin_post(path).await.status, 404, "{path}");
    }
    // The user's unit came back: alice can buy again.
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    gw.reconcile_clean();

    // One event per transition: reserve, confirm, release, reserve.
    let events: Vec<String> = stream_events(&redis, "1001")
        .iter()
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(events, ["reserve", "confirm", "release", "reserve"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_from_the_upstream_confirms_in_upstream_mode() {
    let (_redis, _upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    let jti = gw.buy("1001", "alice", None).await.reservation_id();
    let path = format!("/v1/activities/1001/reservations/{jti}");
    wait_for_async(
        "the upstream's 2xx to confirm",
        Duration::from_secs(10),
        || async { (gw.admin_get(&path).await.json()["state"] == "confirmed").then_some(()) },
    )
    .await;
    let view = gw.activity_view("1001").await;
    assert_eq!(
        (view["pending"].as_i64(), view["confirmed"].as_i64()),
        (Some(0), Some(1))
    );
    assert!(gw
        .metrics()
        .await
        .contains(r#"flashgate_reservations_confirmed_total{activity="1001",via="upstream"} 1"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_sweep_one_redis_and_release_each_expiry_exactly_once() {
    const BUYERS: usize = 40;
    let (redis, _upstream, mut config) = backends(vec![TestActivity::explicit("1001", 100, 1)]);
    config.sweep_interval_ms = 20;
    let instances: Vec<GatewayProc> = (0..3)
        .map(|_| GatewayProc::start(config.clone().on_new_ports()))
        .collect();
    for i in 0..BUYERS {
        let gw = &instances[i % 3];
        assert_eq!(gw.buy("1001", &format!("u{i}"), None).await.status, 200);
    }
    // Nobody confirms: after the 1 s hold every reservation expires.
    wait_for_async(
        "every reservation to expire",
        Duration::from_secs(20),
        || async {
            let view = instances[0].activity_view("1001").await;
            (view["pending"].as_i64() == Some(0)).then_some(())
        },
    )
    .await;
    let view = instances[0].activity_view("1001").await;
    assert_eq!(
        (view["remaining"].as_i64(), view["released"].as_i64()),
        (Some(100), Some(BUYERS as i64))
    );

    // Exactly one release event per reservation, whichever instance swept it.
    let events = stream_events(&redis, "1001");
    let mut releases: HashMap<String, usize> = HashMap::new();
    for e in events.iter().filter(|e| e["type"] == "release") {
        assert_eq!(e["reason"], "expired");
        *releases.entry(e["jti"].clone()).or_default() += 1;
    }
    assert_eq!(releases.len(), BUYERS);
    assert!(releases.values().all(|&n| n == 1), "{releases:?}");
    // The instances' metrics add up to the same count (each counts once its sweep returns).
    let series = r#"flashgate_reservations_released_total{activity="1001",reason="expired"}"#;
    let instances_ref = &instances;
    wait_for_async(
        "the instances' release counters to add up",
        Duration::from_secs(5),
        || async move {
            let mut counted = 0.0;
            for gw in instances_ref {
                counted += metric_value(&gw.metrics().await, series)?;
            }
            (counted as usize == BUYERS).then_some(())
        },
    )
    .await;
    instances[0].reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_between_deduction_and_forwarding_loses_nothing() {
    // Upstream confirmation, and a 2 s hold so the test need not wait the default 900 s.
    let (redis, upstream, config) = backends(vec![TestActivity::open("1001", 3).hold_secs(2)]);
    let mut victim =
        GatewayProc::start_with_env(config.clone(), &[("FLASHGATE_FAULT", "hang_after_reserve")]);
    let addr = victim.addr;
    let hung = tokio::spawn(async move {
        send_raw(
            addr,
            raw_request("POST", "/api/seckill/1001/buy", &[("X-User-Id", "alice")]).as_bytes(),
        )
        .await
    });
    // The unit is deducted and pending...
    let mut conn = redis.conn();
    wait_for("the reserve to land", Duration::from_secs(10), || {
        let left: i64 = redis::cmd("GET")
            .arg("fg:{1001}:v1:stock")
            .query(&mut conn)
            .ok()?;
        (left == 2).then_some(())
    });
    // ...when the gateway dies before forwarding.
    victim.kill();
    assert!(
        hung.await.unwrap().is_err(),
        "the buyer's connection dies with the gateway"
    );
    assert!(
        upstream.requests().await.is_empty(),
        "nothing was forwarded"
    );

    // Another instance's sweeper returns it at the hold deadline.
    let survivor = GatewayProc::start(config.on_new_ports());
    assert_eq!(survivor.activity_view("1001").await["pending"], 1);
    wait_for_async(
        "the pending reservation to expire",
        Duration::from_secs(10),
        || async {
            (survivor.activity_view("1001").await["remaining"].as_i64() == Some(3)).then_some(())
        },
    )
    .await;
    assert_eq!(
        redis.held("1001", "alice"),
        None,
        "alice's unit came back too"
    );
    assert_eq!(survivor.buy("1001", "alice", None).await.status, 200);
    survivor.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_gets_the_same_reservation() {
    let (_redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    let addr = gw.addr;
    let buy = move |key: Option<&'static str>| async move {
        let mut headers = vec![("X-User-Id", "alice")];
        if let Some(k) = key {
            headers.push(("Idempotency-Key", k));
        }
        request(addr, "POST", "/api/seckill/1001/buy", &headers).await
    };
    let first = buy(Some("order-1")).await;
    assert_eq!(first.status, 200);
    let jti = first
        .header("x-flashgate-reservation-id")
        .unwrap()
        .to_owned();
    let retry = buy(Some("order-1")).await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(
        retry.header("x-flashgate-reservation-id"),
        Some(jti.as_str())
    );
    // Without the key it is a second purchase: over the limit.
    assert_eq!(buy(None).await.code(), "limit_exceeded");
    assert_eq!(buy(Some("order-2")).await.code(), "limit_exceeded");
    assert_eq!(buy(Some("")).await.code(), "bad_request");

    // The upstream saw the same reservation twice (it dedupes on jti); one unit is taken.
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 2);
    let jtis: Vec<String> = seen
        .iter()
        .map(|r| {
            let token = r["headers"]["x-flashgate-reservation"].as_str().unwrap();
            let claims = jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token)
                .unwrap()
                .claims;
            claims["jti"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(jtis, [jti.clone(), jti]);
    assert_eq!(gw.activity_view("1001").await["remaining"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_the_stock_key_expired_resurrects_nothing() {
    let (redis, _upstream, gw) = Stack::start(vec![TestActivity::explicit("1001", 5, 900)]).parts();
    let jti = gw.buy("1001", "alice", None).await.reservation_id();
    // The keys of version 1 reach their TTL (ends_at + 24 h) together.
    redis.del(&["fg:{1001}:v1:stock", "fg:{1001}:v1:ledger"]);
    let resp = gw
        .admin_post(&format!("/v1/activities/1001/reservations/{jti}/release"))
        .await;
    assert_eq!(resp.status, 200);
    let exists = redis.exists(&["fg:{1001}:v1:stock"]);
    assert_eq!(exists, 0, "no stock created from nothing");
    assert!(gw
        .metrics()
        .await
        .contains(r#"flashgate_reservations_retired_total{activity="1001"} 1"#));
    // Keys gone long before the sale's keys were due to expire: reconcile says so (issue 33),
    // and the ledger of what is left still balances.
    let (code, out) = gw.reconcile();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1001 segment 0: MISSING") || out.contains("1001 segment 0: LOST"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_bump_mid_sale_settles_old_reservations_against_the_old_version() {
    let (_redis, _upstream, mut config) = backends(vec![TestActivity::explicit("1001", 5, 900)]);
    let mut gw = GatewayProc::start(config.clone());
    let old = gw.buy("1001", "alice", None).await.reservation_id();
    assert_eq!(gw.buy("1001", "bob", None).await.status, 200);
    drop(gw);

    // Operations restock: version 2 with 10 units.
    config.activities[0].version = 2;
    config.activities[0].stock = 10;
    config = config.on_new_ports();
    gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "carol", None).await.status, 200);
    // alice holds a v1 unit: the per-user limit spans versions.
    assert_eq!(gw.buy("1001", "alice", None).await.code(), "limit_exceeded");
    // v2 going on sale retired v1: its 3 units left are counted retired, never sold again.
    // Releasing alice's v1 reservation settles against v1, not v2: its unit is retired too,
    // rather than put back where nobody can buy it (or into v2).
    assert_eq!(
        gw.admin_post(&format!("/v1/activities/1001/reservations/{old}/release"))
            .await
            .status,
        200
    );
    let view = gw.activity_view("1001").await;
    assert_eq!(
        (view["version"].as_u64(), view["remaining"].as_i64()),
        (Some(2), Some(9))
    );
    let versions = view["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{view}");
    assert_eq!(
        (
            versions[0]["version"].as_u64(),
            versions[0]["remaining"].as_i64()
        ),
        (Some(1), None)
    );
    assert_eq!(versions[0]["retired"].as_i64(), Some(4));
    assert!(gw
        .metrics()
        .await
        .contains(r#"flashgate_reservations_retired_total{activity="1001"} 1"#));
    assert_eq!(
        (
            versions[0]["pending"].as_i64(),
            versions[0]["released"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        (
            versions[1]["version"].as_u64(),
            versions[1]["pending"].as_i64()
        ),
        (Some(2), Some(1))
    );
    let table = gw.reconcile_clean();
    assert!(
        table.contains("1001") && table.lines().count() >= 3,
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_filters_by_activity_and_says_why_it_cannot_run() {
    let (redis, _upstream, gw) = Stack::start(vec![
        TestActivity::open("1001", 5),
        TestActivity::open("2002", 5),
    ])
    .parts();
    assert_eq!(gw.buy("2002", "alice", None).await.status, 200);
    let config = gw.config_path();
    let config = config.to_str().unwrap();
    let (code, out, _) = run_cli(
        &["reconcile", "--config", config, "--activity", "2002"],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2002") && !out.contains("1001"), "{out}");
    let (code, _, err) = run_cli(
        &["reconcile", "--config", config, "--activity", "nope"],
        &[],
    );
    assert_eq!(code, 2, "an unknown activity is a usage error: {err}");
    assert!(err.contains("\"nope\" is not configured"), "{err}");
    drop(redis); // Redis gone: exit 3, and it says so.
    let (code, _, err) = run_cli(&["reconcile", "--config", config], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.starts_with("reconcile: "), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reports_drift_and_exits_non_zero() {
    let (redis, _upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    // Someone edits the stock key by hand: a unit from nowhere.
    let mut conn = redis.conn();
    let _: () = redis::cmd("INCR")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    let (code, table) = gw.reconcile();
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("DRIFT"), "{table}");
    // The gateway's own periodic check exports it too.
    wait_for_async("the drift gauge", Duration::from_secs(10), || async {
        gw.metrics()
            .await
            .contains(r#"flashgate_reconcile_drift{activity="1001"} 1"#)
            .then_some(())
    })
    .await;
}
