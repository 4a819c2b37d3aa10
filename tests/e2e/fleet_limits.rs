//! `scope: fleet` buckets (issue 25): one buyer spraying requests over three gateways gets the
//! configured rate for the fleet together (within 5 %), with a Redis call per token granted per
//! gateway at most, not per request; in shadow mode nothing is refused but everything counted.

use crate::support::*;
use std::time::{Duration, Instant};

/// Requests from `user`, from `workers` tasks per gateway, each sending one after another for
/// `run`: (answers that passed the bucket, all answers, seconds from the first to the last).
async fn spray(gws: &[&GatewayProc], user: &str, workers: usize, run: Duration) -> (u64, u64, f64) {
    let start = Instant::now();
    let tasks = gws.iter().flat_map(|gw| {
        (0..workers).map(move |_| async move {
            let (mut passed, mut all) = (0u64, 0u64);
            let mut last = start;
            while start.elapsed() < run {
                let r = gw.buy("1001", user, None).await;
                last = Instant::now();
                all += 1;
                match r.status {
                    429 => assert!(r.header("retry-after").is_some()),
                    // Past the bucket: the first unit, then the per-user limit.
                    200 | 409 => passed += 1,
                    other => panic!("{other} {}", r.text()),
                }
            }
            (passed, all, last)
        })
    });
    let results = futures_util::future::join_all(tasks).await;
    let passed = results.iter().map(|r| r.0).sum();
    let all = results.iter().map(|r| r.1).sum();
    let last = results.iter().map(|r| r.2).max().unwrap();
    (passed, all, (last - start).as_secs_f64())
}

/// The fleet buckets' script calls a gateway made.
async fn token_calls(gw: &GatewayProc) -> f64 {
    gw.metric("flashgate_redis_script_duration_seconds_count{script=\"tokens\"}")
        .await
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_spraying_three_gateways_gets_the_fleet_rate() {
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 1000)]);
    let (rate, burst) = (20.0, 20.0);
    let config = config.per_user_bucket(Rate::new(20, 20).fleet());
    let a = GatewayProc::start(config.clone());
    let b = GatewayProc::start(config.clone().on_new_ports());
    let c = GatewayProc::start(config.clone().on_new_ports());
    let gws = [&a, &b, &c];
    let (passed, all, secs) = spray(&gws, "sprayer", 3, Duration::from_secs(6)).await;
    // A full bucket at the start, then the rate.
    let expected = burst + rate * secs;
    let error = (passed as f64 - expected) / expected;
    let mut calls = 0.0;
    for gw in gws {
        calls += token_calls(gw).await;
    }
    eprintln!(
        "fleet bucket 20/s burst 20 over 3 gateways: {passed} passed of {all} in {secs:.2} s \
         (expected {expected:.1}, error {:+.2} %); {calls} token calls, {:.3} per request, \
         {:.2} per token granted",
        error * 100.0,
        calls / all as f64,
        calls / passed as f64
    );
    assert!(
        error.abs() <= 0.05,
        "{passed} passed, {expected:.1} expected"
    );
    assert!(
        all as f64 > 4.0 * expected,
        "the buyer did not spray hard enough: {all}"
    );
    // Refusals are answered from memory: calls follow the tokens granted (each gateway asks
    // about once per token, a little more when several of the buyer's requests reach it at
    // once), not the requests.
    assert!(
        calls <= 6.0 * passed as f64,
        "{calls} calls for {passed} tokens"
    );
    assert!(
        calls / (all as f64) < 0.2,
        "{calls} calls for {all} requests"
    );
    for gw in gws {
        assert_eq!(
            gw.metric("flashgate_rate_limit_fleet_fallbacks_total{limit=\"per_user\"}")
                .await
                .unwrap_or(0.0),
            0.0,
            "Redis answered in time: no gateway fell back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_fleet_bucket_refuses_nothing_and_counts() {
    let (redis, _up, config) = backends(vec![TestActivity::open("1001", 1000)]);
    let config = config.per_user_bucket(Rate::new(5, 5).fleet().shadow());
    let a = GatewayProc::start(config.clone());
    let b = GatewayProc::start(config.clone().on_new_ports());
    let (passed, all, _) = spray(&[&a, &b], "shadowed", 2, Duration::from_secs(2)).await;
    assert_eq!(passed, all, "a shadow bucket refused");
    let mut counted = 0.0;
    for gw in [&a, &b] {
        counted += gw
            .metric("flashgate_rate_limit_refusals_total{limit=\"per_user\",mode=\"shadow\"}")
            .await
            .unwrap_or(0.0);
    }
    // 2 s at 5/s from a burst of 5: about 15 pass; the rest was counted.
    assert!(
        counted >= all as f64 - 20.0,
        "{counted} shadow refusals counted of {all}"
    );
    // Every fleet bucket key expires (a full bucket is no key at all).
    let keys = redis.keys("fg:{rl~*");
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut redis.conn())
            .unwrap();
        assert!((0..=2_000).contains(&ttl), "{key} expires in {ttl} ms");
    }
}

/// The same spray against `scope: instance` (the default): each gateway has its own bucket, so
/// three gateways let the buyer through at about three times the rate (what `fleet` fixes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_buckets_let_three_gateways_through_three_times() {
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 1000)]);
    let config = config.per_user_bucket(Rate::new(20, 20));
    let a = GatewayProc::start(config.clone());
    let b = GatewayProc::start(config.clone().on_new_ports());
    let c = GatewayProc::start(config.clone().on_new_ports());
    let (passed, all, secs) = spray(&[&a, &b, &c], "sprayer", 3, Duration::from_secs(3)).await;
    let expected = 20.0 + 20.0 * secs;
    eprintln!(
        "instance buckets 20/s burst 20 over 3 gateways: {passed} passed of {all} in {secs:.2} s \
         ({:.2} times the rate)",
        passed as f64 / expected
    );
    assert!(passed as f64 > 2.5 * expected, "{passed} passed");
    assert_eq!(token_calls(&a).await, 0.0, "an instance bucket asked Redis");
}
