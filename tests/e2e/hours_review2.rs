//! Review of 9ca687c (sale hours by Redis's clock everywhere): what still reads the gateway's
//! own clock, and keyed retries after the close of an activity never put on sale.

use crate::queue_support::{buy as queue_buy, take_ticket};
use crate::support::*;

/// `GET /flashgate/queue/{activity}` without a ticket still judges the room's hours by the
/// gateway's own clock (src/waiting/mod.rs `poll`): a gateway two hours slow answers
/// `not_started` an hour after the room opened by Redis's clock, while a purchase at the same
/// gateway (judged by Redis's clock) is given a ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_gateways_poll_refuses_a_room_open_by_redis_clock() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let opens = from_now(chrono::Duration::hours(-1));
    let activity = TestActivity {
        starts_at: from_now(chrono::Duration::hours(1)),
        ends_at: from_now(chrono::Duration::hours(5)),
        queue: Some(format!(
            "{{ admit_per_second: 5, admission_window_secs: 30, opens_at: \"{opens}\" }}"
        )),
        ..TestActivity::open("pollq", 5)
    };
    let config = TestConfig::new(&redis, &upstream, vec![activity]);
    let slow = GatewayProc::start_skewed(&config, "-2h");
    // The purchase route: judged by Redis's clock, a ticket.
    let (_ticket, _) = take_ticket(&slow, "pollq", "alice").await;
    // The poll route, no ticket (a browser landing on the waiting page): judged by the local
    // clock.
    let r = get(slow.addr, "/flashgate/queue/pollq", &[("X-User-Id", "bob")]).await;
    assert_eq!(
        r.status,
        200,
        "the room is open by Redis's clock; the slow gateway's poll answered {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// The ticket cookie's Max-Age is `ends_at - now` by the gateway's own clock
/// (src/waiting/mod.rs `answer`): a gateway two hours fast, a sale that closes in an hour by
/// Redis's clock, and every ticket cookie it sets lives one second. A browser keeps its place
/// only in that cookie: on its next request it presents none, its ticket is not honoured, and
/// it is never let through at its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_gateways_ticket_cookie_lives_until_the_close_by_redis_clock() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        starts_at: from_now(chrono::Duration::minutes(-1)),
        ends_at: from_now(chrono::Duration::hours(1)),
        queue: Some("{ admit_per_second: 1, admission_window_secs: 30 }".into()),
        ..TestActivity::open("cookieq", 50)
    };
    let config = TestConfig::new(&redis, &upstream, vec![activity]);
    let right = GatewayProc::start(config.clone());
    let fast = GatewayProc::start_skewed(&config, "+2h");
    let max_age = |r: &HttpResponse| -> i64 {
        let cookie = r.header("set-cookie").unwrap_or_default().to_owned();
        cookie
            .split(';')
            .find_map(|p| p.trim().strip_prefix("Max-Age=").map(str::to_owned))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    // Others ahead in line, so the buyers below are told to wait (a 202 with a cookie).
    for i in 0..5 {
        queue_buy(&right, "cookieq", &format!("early{i}"), None).await;
    }
    let at_right = queue_buy(&right, "cookieq", "bob", None).await;
    let at_fast = queue_buy(&fast, "cookieq", "carol", None).await;
    assert_eq!(
        at_right.status,
        202,
        "{}",
        String::from_utf8_lossy(&at_right.body)
    );
    assert_eq!(
        at_fast.status,
        202,
        "{}",
        String::from_utf8_lossy(&at_fast.body)
    );
    let (right_age, fast_age) = (max_age(&at_right), max_age(&at_fast));
    assert!(right_age > 3000, "right gateway: Max-Age={right_age}");
    assert!(
        (fast_age - right_age).abs() < 120,
        "the sale closes in an hour by Redis's clock: the fast gateway's cookie Max-Age={fast_age} \
         (the right gateway's {right_age})"
    );
}

/// An activity that ended (by Redis's clock) before any gateway put it on sale: prewarm skips
/// it, and a keyless purchase is refused `ended` at once. A keyed retry goes on replay-only,
/// finds no stock key, and the reserve path prewarms the ended activity (src/stock/segments.rs
/// `reserve`): its stock goes on sale in Redis after the close. Past the key retention
/// (`key_ttl_after_end_secs`) the keys it creates expire at once, and the buyer is told
/// `unavailable` (retry) for a sale long over, instead of `ended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_retry_past_the_key_retention_is_told_ended() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let long_over = TestActivity {
        starts_at: from_now(chrono::Duration::hours(-3)),
        ends_at: from_now(chrono::Duration::minutes(-10)),
        // The retention must outlast a hold (and a trip): holds of 30 s.
        hold_secs: Some(30),
        ..TestActivity::open("longover", 5)
    };
    let mut config = TestConfig::new(&redis, &upstream, vec![long_over]);
    // The retention is a gateway setting: one minute, so "longover" is past it.
    config.extra_redis_yaml = "  key_ttl_after_end_secs: 60\n".to_owned();
    let gw = GatewayProc::start(config.clone());
    let keyless = gw.buy("longover", "alice", None).await;
    assert_eq!((keyless.status, keyless.code()), (410, "ended".to_owned()));
    let keyed = crate::integrity::buy_keyed(&gw, "longover", "alice", "k-1").await;
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("fg:{longover}*")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        (keyed.status, keyed.code()),
        (410, "ended".to_owned()),
        "a keyed retry of a sale long over: {}; keys: {keys:?}",
        String::from_utf8_lossy(&keyed.body)
    );
}

/// The same with the default retention: the keyed retry is told `ended`, but the ended
/// activity's stock was put on sale in Redis by it (prewarm skips it by design: "Over by
/// Redis's clock: not even put on sale").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_retry_after_the_close_never_puts_an_ended_sale_on_sale() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let over = TestActivity {
        starts_at: from_now(chrono::Duration::hours(-3)),
        ends_at: from_now(chrono::Duration::minutes(-10)),
        ..TestActivity::open("overk", 5)
    };
    let config = TestConfig::new(&redis, &upstream, vec![over]);
    let gw = GatewayProc::start(config);
    let before = gw.admin_get("/v1/activities/overk").await.json();
    let keyed = crate::integrity::buy_keyed(&gw, "overk", "bob", "k-2").await;
    assert_eq!((keyed.status, keyed.code()), (410, "ended".to_owned()));
    let after = gw.admin_get("/v1/activities/overk").await.json();
    assert_eq!(
        after["remaining"], before["remaining"],
        "an ended activity put on sale by a keyed retry: before {before}, after {after}"
    );
}

/// A gateway two hours slow that starts while Redis is down has never read Redis's clock: its
/// own is the only judge of the hours (src/stock/clock.rs: "Before any read succeeded ... it is
/// the local clock"), and with `on_store_failure: passthrough` it forwards purchases to the
/// backend ten minutes after the close. (A load balancer routing on the proxy port, or on
/// `/healthz`, sends it traffic although `/readyz` says 503.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_on_a_slow_gateway_that_never_read_redis_clock_forwards_after_the_close() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let over = TestActivity {
        starts_at: from_now(chrono::Duration::hours(-3)),
        ends_at: from_now(chrono::Duration::minutes(-10)),
        on_store_failure: Some("passthrough"),
        ..TestActivity::open("ptnever", 5)
    };
    let mut config = TestConfig::new(&redis, &upstream, vec![over]);
    config.extra_rate_limits_yaml = "  passthrough: { per_second: 10, burst: 10 }\n".into();
    redis.kill();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config.to_yaml()).unwrap();
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let mut child = std::process::Command::new(flashgate_bin())
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("FLASHGATE_SIGNING_SECRET", SIGNING_SECRET)
        .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "info")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", "-2h")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", config.listen_port).parse().unwrap();
    wait_for_async(
        "the proxy port to listen",
        std::time::Duration::from_secs(20),
        || async { tokio::net::TcpStream::connect(addr).await.ok().map(|_| ()) },
    )
    .await;
    let r = request(
        addr,
        "POST",
        "/api/seckill/ptnever/buy",
        &[("X-User-Id", "late")],
    )
    .await;
    let seen = upstream.requests().await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.is_empty(),
        "forwarded ten minutes after the close ({} {}): {seen:?}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
}
