//! `flashgate check --config FILE --live` against a real redis-server a real gateway sold from:
//! it refuses what a reload would refuse (an older version, a stock change under the same
//! version, a changed segment count), naming the activity by its id, without the gateway's
//! secrets; a restock is no stock change; and the reload refuses the same file with the same
//! key (one judgement, two callers).

use crate::support::*;
use std::process::Command;
use std::time::Duration;

/// `flashgate check --live` on `config` with no secret in the environment: (exit code,
/// stdout, stderr).
fn check_live(config: &TestConfig) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config.to_yaml()).unwrap();
    let mut cmd = Command::new(flashgate_bin());
    cmd.args(["check", "--live", "--config", path.to_str().unwrap()])
        .env_remove("FLASHGATE_SIGNING_SECRET")
        .env_remove("FLASHGATE_ADMIN_TOKEN");
    let out = run_bounded("flashgate check --live", &mut cmd, Duration::from_secs(30));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn assert_refused(got: (i32, String, String), key: &str) {
    let (code, out, err) = got;
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(err.contains(key), "{key} not named: {err}");
    assert!(err.contains("refused by Redis's record"), "{err}");
    assert!(!err.contains("activities[1]"), "named by index: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_live_refuses_what_a_reload_refuses_by_activity_id() {
    // `b2` is second in the file: named by its id, not `activities[1]`.
    let acts = vec![
        TestActivity::open("a1", 10),
        TestActivity::open("b2", 10).version(3).segments(2),
    ];
    let (_redis, _up, mut gw) = Stack::start(acts).parts();
    for id in ["a1", "b2"] {
        gw.wait_metric(
            &format!("flashgate_stock_remaining{{activity=\"{id}\"}}"),
            10.0,
        )
        .await;
    }
    let config = gw.config.clone();

    // The file the gateway runs: clean, without the secrets (named as warnings).
    let (code, out, err) = check_live(&config);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("agrees with Redis"), "{out}");
    assert!(err.contains("FLASHGATE_SIGNING_SECRET"), "{err}");

    // A restock adds units; the file's stock is still the version's: clean.
    let restocked = gw.restock("b2", r#"{"add": 5}"#, Some("r-1")).await;
    assert_eq!(restocked.status, 200, "{}", restocked.text());
    let (code, out, err) = check_live(&config);
    assert_eq!(code, 0, "a restock read as a stock change: {out}{err}");

    // A stock change under the same version, an older version than Redis's record, a changed
    // segment count: each refused, and the reload refuses the same file with the same message.
    let mut changed = config.clone();
    changed.activities[1].stock = 500;
    let mut older = config.clone();
    older.activities[1].version = 2;
    let mut resegmented = config.clone();
    resegmented.activities[1].segments = Some(4);
    for (file, key) in [
        (changed, "activities[id=b2].stock"),
        (older, "activities[id=b2].version"),
        (resegmented, "activities[id=b2].segments"),
    ] {
        let got = check_live(&file);
        let said = got.2.clone();
        assert_refused(got, key);
        gw.rewrite_config(file);
        let reload = gw.admin_post("/v1/config/reload").await;
        assert_eq!(reload.status, 422, "{}", reload.text());
        let message = reload.json()["message"].as_str().unwrap().to_owned();
        assert!(message.starts_with(&format!("{key}:")), "{message}");
        assert!(
            said.contains(&message),
            "check said {said}, the reload {message}"
        );
    }
    gw.rewrite_config(config.clone());

    // A new version (with any stock) and a new activity are fine.
    let mut next = config.clone();
    next.activities[1].version = 4;
    next.activities[1].stock = 1;
    next.activities.push(TestActivity::open("c3", 1));
    let (code, out, err) = check_live(&next);
    assert_eq!(code, 0, "{out}{err}");
    let _ = &mut gw;
}

/// Redis unreachable: `check --live` says so and exits 3, not "valid"; a Redis refusing
/// connections is named as such (with its address), not as one slow to answer.
#[test]
fn check_live_without_redis_fails() {
    let (redis, upstream, config) = backends(vec![TestActivity::open("a1", 10)]);
    let port = redis.port;
    drop(redis);
    // gateway.yaml's 50 ms store timeout runs out before redis-rs reports the refusal.
    let mut quick = config.clone();
    quick.redis_timeout_ms = 50;
    for config in [config, quick] {
        let (code, out, err) = check_live(&config);
        assert_eq!(code, 3, "{out}{err}");
        assert!(err.contains("cannot read Redis"), "{err}");
        let refused = format!("cannot connect to Redis at 127.0.0.1:{port}: connection refused");
        assert!(err.contains(&refused), "{err}");
        assert!(!err.contains("did not answer"), "{err}");
    }
    drop(upstream);
}

/// A reload that raises a version has the prewarm run at once: Redis's record moves to the new
/// version without waiting for `redis.prewarm_interval_ms` (here 10 minutes) or a buyer, so
/// `check --live` of the file before the bump is refused right after the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_puts_a_new_version_on_sale_in_redis_at_once() {
    let (redis, _upstream, config) = backends(vec![TestActivity::open("a1", 10)]);
    let config = config.prewarm_interval_ms(600_000);
    let mut gw = GatewayProc::start(config.clone());
    gw.wait_metric("flashgate_stock_remaining{activity=\"a1\"}", 10.0)
        .await;
    let mut bumped = config.clone();
    bumped.activities[0].version = 2;
    bumped.activities[0].stock = 7;
    gw.rewrite_config(bumped);
    let reload = gw.admin_post("/v1/config/reload").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    wait_for("v2's stock key", Duration::from_secs(5), || {
        redis.get_int("fg:{a1}:v2:stock").filter(|n| *n == 7)
    });
    assert_refused(check_live(&config), "activities[id=a1].version");
    let _ = &mut gw;
}

/// Waits (up to 10 s of queue reads) for the queue's start to be `at` (RFC 3339).
async fn start_moves_to(gw: &GatewayProc, at: &str) {
    let want = super::queue_support::rfc3339_ms(at) as i64;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while queue_start_ms(gw).await != want {
        assert!(
            std::time::Instant::now() < deadline,
            "the start never moved to {at}"
        );
        gw.wait_queue_read().await;
    }
}

/// The queue's start as the gateway last read it from Redis (ms), from the admin API.
async fn queue_start_ms(gw: &GatewayProc) -> i64 {
    let r = gw.admin_get("/v1/activities/1001/queue").await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["starts_at_ms"].as_i64().unwrap()
}

/// An SRE moves a drop twelve minutes earlier: before the waiting room opened (no ticket
/// issued), the reload moves the queue's start with it (no warning); a gateway restarted with
/// the older file cannot move it back, and `check --live` says the file is older. Once a ticket
/// was issued, an earlier start is not applied: the reload's answer, its log line and
/// `check --live` name the start that stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_start_moved_earlier_is_applied_before_it_opens_and_named_after() {
    use super::queue_support::{in_secs, queued, rfc3339_ms, take_ticket};
    let queue = Queue::admit(5).window_secs(30).opens_at(in_secs(-10));
    let old = in_secs(46 * 60);
    let (_redis, _upstream, mut config) = backends(vec![queued("1001", 5, queue).starts_at(old)]);
    let older_file = config.clone();
    let mut gw = GatewayProc::start(config.clone());
    gw.wait_queue_read().await;
    assert_eq!(queue_start_ms(&gw).await, rfc3339_ms(old) as i64);
    // Twelve minutes earlier, by a reload: applied (at the next state read), no warning.
    let earlier = in_secs(34 * 60);
    config.activities[0].starts_at = earlier;
    gw.rewrite_config(config.clone());
    let r = gw.admin_post("/v1/config/reload").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["warnings"], serde_json::json!([]), "{}", r.text());
    start_moves_to(&gw, earlier).await;
    // The older file: checked, it is named as older; a gateway started with it leaves the
    // start where the reload put it.
    let (code, _, err) = check_live(&older_file);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("a reload already moved earlier"), "{err}");
    let mut stale = GatewayProc::start(older_file.clone());
    stale.wait_queue_read().await;
    assert_eq!(queue_start_ms(&stale).await, rfc3339_ms(earlier) as i64);
    stale.signal("TERM");
    stale.wait_exit(Duration::from_secs(30));
    // The room opens for alice (her ticket tells her a place and a time) ...
    take_ticket(&gw, "1001", "alice").await;
    // ... then ten minutes earlier still: not applied, and said three ways.
    config.activities[0].starts_at = in_secs(24 * 60);
    gw.rewrite_config(config.clone());
    let r = gw.admin_post("/v1/config/reload").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let warnings = r.json()["warnings"].to_string();
    assert!(warnings.contains("its start stays there"), "{warnings}");
    assert!(
        warnings.contains(earlier),
        "the start that stays not named: {warnings}"
    );
    gw.wait_queue_read().await;
    assert_eq!(queue_start_ms(&gw).await, rfc3339_ms(earlier) as i64);
    assert!(gw.logs().contains("its start stays there"), "{}", gw.logs());
    let (code, _, err) = check_live(&config);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: activity 1001: the waiting room has opened"),
        "{err}"
    );
}

/// A gateway restarted with a file that moves the start earlier does not move it (a restart
/// cannot tell a newer file from an older one), and says a reload does; the reload of that
/// same file then does (no ticket was issued yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_a_restart_did_not_move_earlier_is_moved_by_the_reload_it_advises() {
    use super::queue_support::{in_secs, queued, rfc3339_ms};
    let queue = Queue::admit(5).window_secs(30).opens_at(in_secs(-10));
    let old = in_secs(46 * 60);
    let (_redis, _upstream, mut config) = backends(vec![queued("1001", 5, queue).starts_at(old)]);
    let mut first = GatewayProc::start(config.clone());
    first.wait_queue_read().await;
    first.signal("TERM");
    first.wait_exit(Duration::from_secs(30));
    let earlier = in_secs(34 * 60);
    config.activities[0].starts_at = earlier;
    let gw = GatewayProc::start(config.clone());
    gw.wait_queue_read().await;
    assert_eq!(queue_start_ms(&gw).await, rfc3339_ms(old) as i64);
    // The wait is the assertion: the start-up's log advises the reload.
    wait_for("the start-up's advice", Duration::from_secs(10), || {
        gw.logs().contains("a restart does not").then_some(())
    });
    let r = gw.admin_post("/v1/config/reload").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["warnings"], serde_json::json!([]), "{}", r.text());
    start_moves_to(&gw, earlier).await;
}
