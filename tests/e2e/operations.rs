//! Operations: live reloads, the store breaker and its admin switch, passthrough on store
//! failure, the upstream-protection queue, and draining on SIGTERM.

use crate::support::*;
use std::time::{Duration, Instant};

fn stack(activities: Vec<TestActivity>) -> (RedisServer, Upstream, TestConfig) {
    let (redis, upstream, mut config) = backends(activities);
    config.per_user = None;
    (redis, upstream, config)
}

async fn metric(gw: &GatewayProc, series: &str) -> f64 {
    metric_value(&gw.metrics().await, series).unwrap_or_else(|| panic!("no series {series}"))
}

async fn wait_metric(gw: &GatewayProc, series: &str, want: f64) {
    wait_for_async(
        &format!("{series} to reach {want}"),
        Duration::from_secs(10),
        || async { (metric_value(&gw.metrics().await, series) == Some(want)).then_some(()) },
    )
    .await
}

/// Buys once each as `users`, concurrently; the statuses, in user order.
async fn buy_all(gw: &GatewayProc, activity: &str, users: Vec<String>) -> Vec<u16> {
    let requests = users
        .iter()
        .map(|u| {
            raw_request(
                "POST",
                &format!("/api/seckill/{activity}/buy"),
                &[("X-User-Id", u)],
            )
        })
        .collect();
    burst(gw.addr, requests)
        .await
        .iter()
        .map(|r| r.status)
        .collect()
}

fn users(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

const APPLIED: &str = r#"flashgate_config_reloads_total{result="applied"}"#;
const REFUSED: &str = r#"flashgate_config_reloads_total{result="refused"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_a_limit_mid_burst_and_adds_an_activity() {
    let (_redis, _upstream, mut config) = stack(vec![TestActivity::open("1001", 1000)]);
    config = config.per_activity_rate(Rate::new(1, 5));
    // Reload on SIGHUP only here; the file watcher has its own test below.
    config = config.reload_watch_interval_ms(0);
    let mut gw = GatewayProc::start(config.clone());

    let first = buy_all(&gw, "1001", users("a", 20)).await;
    assert_eq!(count(&first, 200), 5, "{first:?}");
    assert_eq!(count(&first, 429), 15, "{first:?}");

    // Mid-sale: a bigger bucket, and a new activity.
    config = config.per_activity_rate(Rate::new(1, 100));
    config.activities.push(TestActivity::open("2002", 10));
    gw.rewrite_config(config.clone());
    gw.signal("HUP");
    wait_metric(&gw, "flashgate_config_generation", 2.0).await;
    // Counted just after the generation is published (a scrape between them sees 0).
    wait_metric(&gw, APPLIED, 1.0).await;

    let second = buy_all(&gw, "1001", users("b", 20)).await;
    assert_eq!(
        count(&second, 200),
        20,
        "the new limit admits the burst: {second:?}"
    );
    // Made after its sale opened on a Redis just started: born on hold for 1.5 s (a gateway
    // whose subscription a restart dropped may have seen it sell), `unavailable` meanwhile.
    let bought = wait_for_async(
        "the new activity on sale",
        Duration::from_secs(10),
        || async {
            let r = gw.buy("2002", "c", None).await;
            (r.status != 503).then_some(r.status)
        },
    )
    .await;
    assert_eq!(bought, 200);
    let view = gw.admin_get("/v1/activities/2002").await;
    assert_eq!(view.json()["remaining"], 9);

    // Changing only `shadow` keeps the buckets: the 100 burst is mostly spent already.
    config = config.per_activity_rate(Rate::new(1, 100).shadow());
    gw.rewrite_config(config);
    let reload = gw.admin_post("/v1/config/reload").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    assert_eq!(reload.json()["generation"], 3);
    let third = buy_all(&gw, "1001", users("d", 100)).await;
    assert_eq!(count(&third, 200), 100, "shadow admits: {third:?}");
    let shadow = metric(
        &gw,
        r#"flashgate_rate_limit_refusals_total{limit="per_activity",mode="shadow"}"#,
    )
    .await;
    assert!(shadow >= 10.0, "kept buckets were nearly empty: {shadow}");
    assert_eq!(gw.reconcile().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_or_unsafe_reload_is_refused_and_the_running_config_stays() {
    let (_redis, _upstream, mut config) = stack(vec![TestActivity::open("1001", 10)]);
    config = config.reload_watch_interval_ms(100);
    let mut gw = GatewayProc::start(config.clone());
    assert_eq!(gw.buy("1001", "a", None).await.status, 200);

    // A typo: the file watcher tries it, refuses it, the sale goes on.
    std::fs::write(
        gw.config_path(),
        config.to_yaml().replace("per_user_limit", "per_user_limt"),
    )
    .unwrap();
    wait_metric(&gw, REFUSED, 1.0).await;
    assert!(gw.logs().contains("per_user_limt"), "{}", gw.logs());
    assert_eq!(gw.buy("1001", "b", None).await.status, 200);
    assert_eq!(metric(&gw, "flashgate_config_generation").await, 1.0);

    // Valid YAML, unsafe change: the stock of a running version.
    let mut unsafe_change = config.clone();
    unsafe_change.activities[0].stock = 500;
    gw.rewrite_config(unsafe_change);
    wait_metric(&gw, REFUSED, 2.0).await;
    let refused = gw.admin_post("/v1/config/reload").await;
    assert_eq!(refused.status, 422);
    let message = refused.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("activities[id=1001].stock:"),
        "{message}"
    );
    assert!(message.contains("raise version"), "{message}");

    // A lowered version is refused too.
    let mut lowered = config.clone();
    lowered.activities[0].version = 0;
    gw.rewrite_config(lowered);
    let refused = gw.admin_post("/v1/config/reload").await;
    assert_eq!(refused.status, 422);
    assert!(refused.json()["message"]
        .as_str()
        .unwrap()
        .starts_with("activities[id=1001].version:"));

    // The same stock under a new version is a restock, applied by the watcher.
    let mut restock = config.clone();
    restock.activities[0].stock = 500;
    restock.activities[0].version = 2;
    gw.rewrite_config(restock);
    wait_metric(&gw, "flashgate_config_generation", 2.0).await;
    assert_eq!(gw.buy("1001", "c", None).await.status, 200);
    let view = gw.activity_view("1001").await;
    assert_eq!(
        (view["version"].as_u64(), view["remaining"].as_u64()),
        (Some(2), Some(499))
    );

    // A restart-only key is kept, and said so.
    let mut moved = gw.config.clone();
    moved.admin_port = free_port();
    gw.rewrite_config(moved);
    let applied = gw.admin_post("/v1/config/reload").await;
    assert_eq!(applied.status, 200);
    assert_eq!(
        applied.json()["needs_restart"],
        serde_json::json!(["admin.listen"])
    );
    assert_eq!(gw.reconcile().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_on_timeouts_answers_at_once_then_probes_and_closes() {
    let (redis, _upstream, mut config) = stack(vec![TestActivity::open("1001", 100)]);
    config.redis_timeout_ms = 600;
    config = config.breaker(3, 1500);
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "warm", None).await.status, 200);

    // Redis stops answering (every client paused) for longer than the breaker stays open.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2500)
        .arg("ALL")
        .query(&mut redis.conn())
        .unwrap();
    let paused_at = Instant::now();
    for i in 0..3 {
        let started = Instant::now();
        let resp = gw.buy("1001", &format!("slow-{i}"), None).await;
        assert_eq!(resp.status, 503);
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "a timeout, not a quick error"
        );
    }
    assert_eq!(
        metric(&gw, r#"flashgate_redis_breaker_state{state="open"}"#).await,
        1.0
    );
    assert_eq!(
        metric(&gw, "flashgate_redis_breaker_opened_total").await,
        1.0
    );
    for i in 0..20 {
        let started = Instant::now();
        let resp = gw.buy("1001", &format!("fast-{i}"), None).await;
        resp.assert_answer(503, "unavailable");
        assert!(resp.header("retry-after").is_some());
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "open breaker answers without waiting on Redis: {:?}",
            started.elapsed()
        );
    }
    let breaker = gw.admin_get("/v1/breaker").await.json();
    assert_eq!(breaker["state"], "open");
    assert!(
        paused_at.elapsed() < Duration::from_millis(2500),
        "still paused"
    );

    // After the pause and the open period: one probe succeeds and the breaker closes.
    let resp = wait_for_async("the breaker to close", Duration::from_secs(15), || async {
        let resp = gw.buy("1001", "after", None).await;
        (resp.status != 503).then_some(resp)
    })
    .await;
    assert_eq!(resp.status, 200);
    assert_eq!(gw.admin_get("/v1/breaker").await.json()["state"], "closed");
    assert_eq!(
        metric(&gw, r#"flashgate_redis_breaker_state{state="closed"}"#).await,
        1.0
    );
    assert_eq!(gw.reconcile().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_forwards_marked_and_capped_while_the_switch_holds_the_breaker_open() {
    let mut passthrough = TestActivity::open("3003", 100);
    passthrough.on_store_failure = Some("passthrough");
    let (redis, upstream, mut config) = stack(vec![TestActivity::open("1001", 100), passthrough]);
    config = config.passthrough_rate(Rate::new(1, 3));
    let gw = GatewayProc::start(config);

    // A buyer cannot forge the mark.
    let forged = request(
        gw.addr,
        "POST",
        "/api/seckill/3003/buy",
        &[
            ("X-User-Id", "forger"),
            ("X-Flashgate-Passthrough", "store-unavailable"),
        ],
    )
    .await;
    assert_eq!(forged.status, 200);
    let seen = upstream.requests().await;
    assert!(seen[0]["headers"].get("x-flashgate-passthrough").is_none());
    assert!(seen[0]["headers"].get("x-flashgate-reservation").is_some());
    upstream.reset().await;

    // The SRE holds the breaker open: Redis is not asked at all.
    let switched = gw.admin_post("/v1/breaker/open").await;
    assert_eq!(switched.json()["mode"], "forced_open");
    let stock_before = redis.get_int("fg:{3003}:v1:stock");
    let statuses = buy_all(&gw, "3003", users("p", 10)).await;
    assert_eq!(count(&statuses, 200), 3, "the cap's burst: {statuses:?}");
    assert_eq!(count(&statuses, 503), 7, "{statuses:?}");
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 3);
    for r in &seen {
        assert_eq!(r["headers"]["x-flashgate-passthrough"], "store-unavailable");
        assert!(r["headers"].get("x-flashgate-reservation").is_none());
    }
    assert_eq!(redis.get_int("fg:{3003}:v1:stock"), stock_before);
    // A `reject` activity answers unavailable at once.
    assert_eq!(gw.buy("1001", "r", None).await.status, 503);
    let forwarded =
        r#"flashgate_store_failure_passthrough_total{activity="3003",outcome="forwarded"}"#;
    let capped = r#"flashgate_store_failure_passthrough_total{activity="3003",outcome="capped"}"#;
    let m = gw
        .metrics_when(|m| {
            metric_value(m, forwarded) == Some(3.0) && metric_value(m, capped) == Some(7.0)
        })
        .await;
    assert_eq!(metric_value(&m, forwarded), Some(3.0));
    assert_eq!(metric_value(&m, capped), Some(7.0));
    assert_eq!(
        metric_value(&m, r#"flashgate_redis_breaker_mode{mode="forced_open"}"#),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            r#"flashgate_admission_decisions_total{activity="3003",decision="passthrough"}"#
        ),
        Some(3.0)
    );

    // Back to auto: reservations again.
    gw.admin_post("/v1/breaker/auto").await;
    let resp = gw.buy("3003", "back", None).await;
    assert_eq!(resp.status, 200);
    resp.reservation_id();
    assert_eq!(gw.reconcile().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winners_beyond_max_inflight_queue_and_are_released_on_timeout() {
    let (_redis, upstream, mut config) = stack(vec![TestActivity::explicit("1001", 10, 600)]);
    config = config.max_inflight(1).max_queue_wait_ms(300);
    let gw = GatewayProc::start(config);
    let slow = request(
        upstream.addr,
        "POST",
        "/__upstream/mode?status=200&delay_ms=1500",
        &[],
    )
    .await;
    assert_eq!(slow.status, 200);

    let requests = users("q", 3)
        .iter()
        .map(|u| raw_request("POST", "/api/seckill/1001/buy", &[("X-User-Id", u)]))
        .collect();
    let responses = burst(gw.addr, requests).await;
    let winners: Vec<_> = responses.iter().filter(|r| r.status == 200).collect();
    let queued: Vec<_> = responses.iter().filter(|r| r.status == 503).collect();
    assert_eq!((winners.len(), queued.len()), (1, 2));
    let mut positions = Vec::new();
    for r in &queued {
        let body = r.json();
        assert_eq!(body["code"], "unavailable");
        positions.push(body["queue_position"].as_u64().unwrap());
        let wait_ms = body["estimated_wait_ms"].as_u64().unwrap();
        assert!(wait_ms > 0);
        let retry_after: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(retry_after, wait_ms.div_ceil(1000).max(1));
        assert!(r.header("x-flashgate-reservation-id").is_none());
    }
    positions.sort();
    assert_eq!(positions, [1, 2]);
    // Only the winner reached the backend; the others' units are back.
    assert_eq!(upstream.requests().await.len(), 1);
    let view = gw.activity_view("1001").await;
    assert_eq!(
        (view["remaining"].as_u64(), view["pending"].as_u64()),
        (Some(9), Some(1))
    );
    let released =
        r#"flashgate_reservations_released_total{activity="1001",reason="queue_timeout"}"#;
    let m = gw
        .metrics_when(|m| metric_value(m, released) == Some(2.0))
        .await;
    assert_eq!(metric_value(&m, released), Some(2.0));
    assert_eq!(
        metric_value(&m, "flashgate_upstream_queue_depth"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&m, "flashgate_upstream_queue_wait_seconds_count"),
        Some(3.0)
    );
    assert_eq!(gw.reconcile().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_drains_every_reservation_in_flight() {
    let (redis, upstream, mut config) = stack(vec![TestActivity::explicit("1001", 10, 600)]);
    config = config.grace_period_secs(4);
    let mut gw = GatewayProc::start(config);
    request(
        upstream.addr,
        "POST",
        "/__upstream/mode?status=200&delay_ms=1500",
        &[],
    )
    .await;

    let addr = gw.addr;
    let buyers: Vec<_> = (0..5)
        .map(|i| {
            tokio::spawn(async move {
                request(
                    addr,
                    "POST",
                    "/api/seckill/1001/buy",
                    &[("X-User-Id", &format!("t-{i}"))],
                )
                .await
            })
        })
        .collect();
    wait_metric(&gw, "flashgate_reservations_in_flight", 5.0).await;
    gw.signal("TERM");

    // The listener closes at once...
    wait_for("the listener to close", Duration::from_secs(3), || {
        std::net::TcpStream::connect(addr).is_err().then_some(())
    });
    // ...while every request in flight is forwarded and answered.
    for b in buyers {
        let resp = b.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.reservation_id();
    }
    let status = gw.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status}");
    assert!(
        gw.logs().contains("drained: no reservation in flight"),
        "{}",
        gw.logs()
    );
    // Every reservation was forwarded: pending at the backend, none released, none lost.
    assert_eq!(upstream.requests().await.len(), 5);
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(5));
    gw.reconcile_clean();
}

/// A place for the upgrade socket: its directory (removed on drop) and path.
fn upgrade_sock() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("upgrade.sock");
    (dir, sock)
}

/// What one load worker saw.
#[derive(Default)]
struct Tally {
    statuses: std::collections::BTreeMap<u16, usize>,
    errors: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_hands_the_listeners_to_a_new_binary_under_load() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (redis, upstream, mut config) = stack(vec![TestActivity::open("1001", 1_000_000)]);
    let (_sock_dir, sock) = upgrade_sock();
    config = config.upgrade_sock(sock.clone());
    // The default grace period follows the longest trip: keep it short.
    config.read_timeout_ms = 1000;
    let mut old = GatewayProc::start(config);

    // Buyers on fresh connections, back to back, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let addr = old.addr;
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let user = format!("w{w}-{i}");
                    let raw = raw_request("POST", "/api/seckill/1001/buy", &[("X-User-Id", &user)]);
                    match send_raw(addr, raw.as_bytes()).await {
                        Ok(resp) => *tally.statuses.entry(resp.status).or_default() += 1,
                        Err(e) => tally.errors.push(format!("{user}: {e}")),
                    }
                    i += 1;
                }
                tally
            })
        })
        .collect();
    let sold = || async { upstream.requests().await.len() };
    let wait_sold = |n: usize, what: &'static str| {
        wait_for_async(what, Duration::from_secs(20), move || async move {
            (sold().await >= n).then_some(())
        })
    };
    wait_sold(50, "the old binary to sell under load").await;

    let mut new = old.start_upgrade(&sock);
    old.signal("QUIT");
    // The old process hands its sockets over, keeps accepting a few seconds beside the new one,
    // then drains its requests in flight and exits.
    let status = old.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", old.logs());
    assert!(
        old.logs().contains("listener sockets sent"),
        "{}",
        old.logs()
    );
    let at_exit = sold().await;
    wait_sold(at_exit + 50, "the new binary to sell alone").await;
    stop.store(true, Ordering::Relaxed);

    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut errors = Vec::new();
    for w in workers {
        let tally = w.await.unwrap();
        for (s, n) in tally.statuses {
            *statuses.entry(s).or_default() += n;
        }
        errors.extend(tally.errors);
    }
    eprintln!("across the upgrade: {statuses:?}, {} errors", errors.len());
    // No connection refused or dropped, and every buyer got a sale.
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        statuses.keys().collect::<Vec<_>>(),
        vec![&200],
        "{statuses:?}"
    );
    // Both binaries sold, every sale reached the backend once, and the ledger adds up.
    for gw in [&old, &new] {
        assert!(gw.logs().contains("outcome=\"admitted\""), "{}", gw.logs());
    }
    assert_eq!(sold().await, statuses[&200]);
    assert_eq!(
        redis.get_int("fg:{1001}:v1:stock"),
        Some(1_000_000 - statuses[&200] as i64)
    );
    new.reconcile_clean();
    new.signal("TERM");
    assert!(new.wait_exit(Duration::from_secs(30)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_with_no_gateway_to_take_over_from_gives_up_and_says_so() {
    let (_redis, _upstream, mut config) = stack(vec![TestActivity::open("1001", 10)]);
    let (dir, sock) = upgrade_sock();
    config = config.upgrade_sock(sock.clone());
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config.to_yaml()).unwrap();
    let started = Instant::now();
    let (code, out, err) = run_cli(
        &["serve", "--config", path.to_str().unwrap(), "--upgrade"],
        &[
            ("FLASHGATE_SIGNING_SECRET", SIGNING_SECRET),
            ("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    );
    let logs = format!("{out}{err}");
    assert_ne!(code, 0, "{logs}");
    assert!(started.elapsed() < Duration::from_secs(15), "{logs}");
    assert!(logs.contains("send it SIGQUIT"), "{logs}");
    assert!(logs.contains("Giving up reading socket"), "{logs}");
    // It never took the ports.
    assert!(std::net::TcpListener::bind(("127.0.0.1", config.listen_port)).is_ok());
}

/// A reload that removes an activity drops its series from `/metrics` at once (no restart):
/// the dashboard's activity picker and sums forget it; the one kept keeps its own. Removed and
/// added back five times, so that a maintenance pass in flight at a reload (which once wrote
/// the removed activity's gauges back after it) gets its chances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_activitys_series_leave_at_the_reload() {
    let (_redis, _upstream, config) = backends(vec![
        TestActivity::open("1001", 5),
        TestActivity::open("2002", 5),
    ]);
    let mut gw = GatewayProc::start(config.clone());
    let before = gw.metrics().await;
    assert!(before.contains(r#"activity="2002""#));
    let mut kept = config.clone();
    kept.activities.retain(|a| a.id == "1001");
    for round in 0..5 {
        gw.rewrite_config(kept.clone());
        let reload = gw.admin_post("/v1/config/reload").await;
        assert_eq!(reload.status, 200, "{}", reload.text());
        let after = gw.metrics().await;
        let stray: Vec<&str> = after
            .lines()
            .filter(|l| l.contains(r#"activity="2002""#))
            .collect();
        assert!(stray.is_empty(), "round {round}: {stray:?}");
        assert!(after.contains(r#"flashgate_stock_remaining{activity="1001"}"#));
        gw.rewrite_config(config.clone());
        let reload = gw.admin_post("/v1/config/reload").await;
        assert_eq!(reload.status, 200, "{}", reload.text());
        assert!(gw.metrics().await.contains(r#"activity="2002""#));
    }
}
