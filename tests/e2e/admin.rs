//! The admin listener and the metrics it exports.

use crate::support::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_health_readiness_and_token() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut a2 = TestActivity::open("2002", 50);
    a2.version = 3;
    let gw = GatewayProc::start(TestConfig::new(
        &redis,
        &upstream,
        vec![TestActivity::open("1001", 7), a2],
    ));

    assert_eq!(get(gw.admin, "/healthz", &[]).await.status, 200);
    assert_eq!(get(gw.admin, "/readyz", &[]).await.status, 200);

    // /v1 needs the bearer token.
    assert_eq!(get(gw.admin, "/v1/activities", &[]).await.status, 401);
    assert_eq!(
        get(
            gw.admin,
            "/v1/activities",
            &[("Authorization", "Bearer wrong")]
        )
        .await
        .status,
        401
    );
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    let list = gw.admin_get("/v1/activities").await;
    assert_eq!(list.status, 200);
    let list = list.json();
    let acts = list["activities"].as_array().unwrap();
    assert_eq!(acts.len(), 2);
    assert_eq!(acts[0]["id"], "1001");
    assert_eq!(
        (acts[0]["stock"].as_u64(), acts[0]["remaining"].as_i64()),
        (Some(7), Some(6))
    );
    assert_eq!(acts[1]["version"], 3);

    // 2002 is put on sale by the first prewarm tick (readiness does not wait for it).
    let one = wait_for_async("2002's prewarm", Duration::from_secs(10), || async {
        let view = gw.activity_view("2002").await;
        view["remaining"].is_number().then_some(view)
    })
    .await;
    assert_eq!(one["id"], "2002");
    assert_eq!(one["version"], 3);
    assert_eq!(one["remaining"], 50);
    assert_eq!(one["sold_out"], false);
    assert_eq!(gw.admin_get("/v1/activities/nope").await.status, 404);

    // The versioned key holds the stock.
    let mut conn = redis.conn();
    let v3: i64 = redis::cmd("GET")
        .arg("fg:{2002}:v3:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(v3, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exports_the_contract_series_from_one_registry() {
    let (_redis, _upstream, gw) = Stack::start(vec![TestActivity::open("1001", 1)]).parts();
    // Once the start-up prewarm ran (a buyer before it costs a prewarm and a second reserve).
    gw.metrics_when(|m| m.contains(r#"flashgate_stock_remaining{activity="1001"} 1"#))
        .await;
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    assert_eq!(gw.buy("1001", "bob", None).await.code(), "sold_out");
    assert_eq!(gw.buy("nope", "bob", None).await.code(), "unknown_activity");

    let needles = [
        r#"flashgate_admission_decisions_total{activity="1001",decision="admitted"} 1"#,
        r#"flashgate_admission_decisions_total{activity="1001",decision="sold_out"} 1"#,
        r#"flashgate_admission_decisions_total{activity="_unknown",decision="unknown_activity"} 1"#,
        r#"flashgate_stock_remaining{activity="1001"} 0"#,
        // bob was answered from the sold-out cache: one script call in all.
        r#"flashgate_redis_script_duration_seconds_bucket{script="reserve",le="+Inf"} 1"#,
        r#"flashgate_upstream_responses_total{class="2xx"} 1"#,
        r#"flashgate_reservations_released_total{activity="1001",reason="upstream_5xx"} 0"#,
    ];
    let m = gw
        .metrics_when(|m| needles.iter().all(|n| m.contains(n)))
        .await;
    for needle in needles {
        assert!(m.contains(needle), "missing {needle} in\n{m}");
    }
    assert!(
        !m.contains("alice") && !m.contains("bob"),
        "no user ids in labels"
    );
}
