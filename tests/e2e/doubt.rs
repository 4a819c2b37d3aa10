//! In doubt, hold (issue 45), end to end: a store that goes back never sells a unit twice, and
//! the runbook (reconcile --orders, --confirm-pending, resume) settles it. A real redis-server,
//! the demo backend and the gateway binary.

use crate::support::*;
use std::time::{Duration, Instant};

const STOCK: u64 = 10;

fn ledger_pending(redis: &RedisServer) -> i64 {
    redis::cmd("HGET")
        .arg("fg:{1001}:v1:ledger")
        .arg("pending")
        .query::<Option<i64>>(&mut redis.conn())
        .unwrap()
        .unwrap_or(0)
}

/// Case 2 of issue 45: the winners' backend calls are in flight when the snapshot is taken; the
/// backend then takes every one (confirmed in Redis); Redis restarts from that snapshot, where
/// they are pending again, with a hold shorter than the fence lasts. Before, the restored
/// pending reservations expired (the sweep released them even while the activity was fenced)
/// and their units sold again: 40 orders for 20. Now nothing is released while the segment is
/// fenced, `reconcile --orders` names them in doubt (exit 1), `--confirm-pending` settles them,
/// and the sale sells exactly what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_with_pending_winners_sells_nothing_twice() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(
        &redis,
        &upstream,
        vec![TestActivity::open("1001", STOCK).hold_secs(2)],
    );
    config.per_user = None;
    let gw = GatewayProc::start(config);
    // The backend is slow: the winners stay pending while the snapshot is taken.
    upstream.mode("delay_ms=1500").await;
    let buys = futures_util::future::join_all((0..5).map(|u| {
        let gw = &gw;
        async move { gw.buy("1001", &format!("winner-{u}"), None).await }
    }));
    let snapshot = async {
        wait_for_async("five winners pending", Duration::from_secs(10), || async {
            (ledger_pending(&redis) == 5).then_some(())
        })
        .await;
        let _: () = redis::cmd("SAVE").query(&mut redis.conn()).unwrap();
    };
    let (answers, ()) = tokio::join!(buys, snapshot);
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    upstream.mode("delay_ms=0").await;
    let orders = upstream.orders().await;
    assert_eq!(orders.len(), 5, "the backend took every winner");
    wait_for("the winners confirmed", Duration::from_secs(10), || {
        (ledger_pending(&redis) == 0).then_some(())
    });
    // Back to the snapshot: the five are pending again there.
    redis.kill();
    redis.restart();
    assert_eq!(ledger_pending(&redis), 5);
    // Well past their hold (2 s) and the sweep's interval: still pending, nothing sold.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let r = gw.buy("1001", "early", None).await;
        assert_eq!(r.status, 503, "fenced: {}", r.text());
        assert_eq!(ledger_pending(&redis), 5, "no restored winner released");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The runbook: a plain resume wants the orders checked first.
    let r = gw.admin_post("/v1/activities/1001/resume").await;
    assert_eq!(
        (r.status, r.code()),
        (409, "orders_unchecked".into()),
        "{}",
        r.text()
    );
    let (code, report) = gw.reconcile_orders("1001", &orders, false);
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("5 in doubt"), "{report}");
    let (code, report) = gw.reconcile_orders("1001", &orders, true);
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("5 just now"), "{report}");
    let r = gw.admin_post("/v1/activities/1001/resume").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // What is left sells, and no more: every order the backend holds fits in the stock.
    let mut sold = 0;
    for u in 0.. {
        let r = wait_for_async("an answer other than 503", Duration::from_secs(10), || {
            let user = format!("buyer-{u}");
            let gw = &gw;
            async move {
                let r = gw.buy("1001", &user, None).await;
                (r.status != 503).then_some(r)
            }
        })
        .await;
        match r.status {
            200 => sold += 1,
            410 => break,
            _ => panic!("{} {}", r.status, r.text()),
        }
        assert!(u < 20, "never sold out");
    }
    assert_eq!(sold, STOCK as usize - 5);
    let orders = upstream.orders().await;
    assert_eq!(
        orders.len() as u64,
        STOCK,
        "backend orders <= stock: {orders:?}"
    );
    gw.reconcile_clean();
}
