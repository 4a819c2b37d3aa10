//! Sold-out news: what one instance learns, every instance knows at once.

use crate::support::*;
use std::time::{Duration, Instant};

async fn cached(gw: &GatewayProc) -> bool {
    gw.activity_view("1001").await["sold_out_cached"] == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_and_returned_stock_reach_every_instance() {
    let (_redis, _upstream, mut config) = backends(vec![TestActivity::explicit("1001", 1, 900)]);
    config.sold_out_ttl_ms = 600_000; // without news, a mark would last ten minutes
    let a = GatewayProc::start(config.clone());
    config = config.on_new_ports();
    let b = GatewayProc::start(config);
    assert!(!cached(&b).await);

    // A sells the last unit and learns the activity is sold out...
    let jti = a.buy("1001", "alice", None).await.reservation_id();
    let learned = Instant::now();
    // ...and B knows without asking Redis.
    wait_for_async(
        "B to hear the sold-out news",
        Duration::from_secs(5),
        || async { cached(&b).await.then_some(()) },
    )
    .await;
    let heard_in = learned.elapsed();
    let reserves_before = reserve_calls(&b).await;
    assert_eq!(b.buy("1001", "bob", None).await.code(), "sold_out");
    assert_eq!(
        reserve_calls(&b).await,
        reserves_before,
        "answered from B's cache"
    );

    // The unit comes back on A: B un-marks it and sells it at once.
    assert_eq!(
        a.admin_post(&format!("/v1/activities/1001/reservations/{jti}/release"))
            .await
            .status,
        200
    );
    let returned = Instant::now();
    wait_for_async(
        "B to hear the units came back",
        Duration::from_secs(5),
        || async { (!cached(&b).await).then_some(()) },
    )
    .await;
    let cleared_in = returned.elapsed();
    assert_eq!(b.buy("1001", "bob", None).await.status, 200);
    eprintln!("news latency: sold out {heard_in:?}, available {cleared_in:?}");
    // Generous bounds for a loaded CI machine; on an idle one both are a few milliseconds.
    assert!(heard_in < Duration::from_secs(1) && cleared_in < Duration::from_secs(1));
}

async fn reserve_calls(gw: &GatewayProc) -> u64 {
    gw.metrics()
        .await
        .lines()
        .find(|l| {
            l.starts_with(r#"flashgate_redis_script_duration_seconds_count{script="reserve"}"#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}
