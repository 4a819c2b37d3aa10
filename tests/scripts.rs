//! The Lua scripts' return codes, against a real redis-server, through the library's StockStore.

#[path = "support/mod.rs"]
mod support;

use chrono::{TimeZone, Utc};
use flashgate::config::{Activity, RedisSettings};
use flashgate::metrics::{Metrics, ReleaseReason};
use flashgate::stock::{ReleaseOutcome, ReserveOutcome, ReserveRequest, StockStore, StoreError};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

fn activity(id: &str, stock: u64, version: u64, limit: u32) -> Activity {
    Activity {
        id: Arc::from(id),
        stock,
        version,
        per_user_limit: NonZeroU32::new(limit).unwrap(),
        max_per_request: NonZeroU32::new(limit).unwrap(),
        starts_at: Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).unwrap(),
        ends_at: Utc.with_ymd_and_hms(2099, 1, 1, 0, 0, 0).unwrap(),
    }
}

fn store(url: String, timeout_ms: u64) -> StockStore {
    let settings = RedisSettings {
        url,
        timeout: Duration::from_millis(timeout_ms),
        key_prefix: "fg".into(),
        key_ttl_after_end: Duration::from_secs(86_400),
        prewarm_interval: Duration::from_secs(5),
    };
    StockStore::new(&settings, Arc::new(Metrics::new())).unwrap()
}

async fn reserve(s: &StockStore, a: &Activity, user: &str, qty: u32, id: &str) -> ReserveOutcome {
    s.reserve(ReserveRequest {
        activity: a,
        user,
        qty,
        reservation_id: id,
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn reserve_return_codes() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 3, 1, 3);

    assert_eq!(
        reserve(&s, &a, "u1", 1, "r0").await,
        ReserveOutcome::NoStockKey,
        "-1 before prewarm"
    );
    assert!(s.prewarm(&a).await.unwrap(), "prewarm creates the key");
    assert_eq!(
        reserve(&s, &a, "u1", 2, "r1").await,
        ReserveOutcome::Reserved { remaining: 1 }
    );
    assert_eq!(
        reserve(&s, &a, "u2", 2, "r2").await,
        ReserveOutcome::Insufficient { remaining: 1 },
        "-2"
    );
    assert_eq!(
        reserve(&s, &a, "u1", 2, "r3").await,
        ReserveOutcome::LimitExceeded { held: 2 },
        "-3: 2 + 2 > 3"
    );
    assert_eq!(
        reserve(&s, &a, "u2", 1, "r1").await,
        ReserveOutcome::DuplicateId,
        "-4: ids are never reused"
    );
    assert_eq!(
        reserve(&s, &a, "u1", 1, "r4").await,
        ReserveOutcome::Reserved { remaining: 0 }
    );

    // Prewarm again never resets sold stock.
    assert!(!s.prewarm(&a).await.unwrap());
    assert_eq!(s.remaining(&a).await.unwrap(), Some(0));

    // The record of a reservation is in Redis, with the version.
    let mut conn = redis.conn();
    let rec: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg("fg:{1001}:r:r1")
        .query(&mut conn)
        .unwrap();
    assert_eq!(rec["user"], "u1");
    assert_eq!(rec["qty"], "2");
    assert_eq!(rec["ver"], "1");
    assert_eq!(rec["state"], "reserved");
    // Keys expire a day after the sale ends.
    let expected = a.ends_at.timestamp() + 86_400;
    for key in ["fg:{1001}:v1:stock", "fg:{1001}:users", "fg:{1001}:r:r1"] {
        let at: i64 = redis::cmd("EXPIRETIME").arg(key).query(&mut conn).unwrap();
        assert_eq!(at, expected, "{key}");
    }
}

#[tokio::test]
async fn stock_is_compared_as_a_number() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("num", 10, 1, 9);
    s.prewarm(&a).await.unwrap();
    // As strings "10" < "9"; as numbers 10 >= 9.
    assert_eq!(
        reserve(&s, &a, "u", 9, "r").await,
        ReserveOutcome::Reserved { remaining: 1 }
    );
}

#[tokio::test]
async fn release_return_codes_and_exactly_once() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 5, 2, 2);
    s.prewarm(&a).await.unwrap();
    assert!(matches!(
        reserve(&s, &a, "u1", 2, "r1").await,
        ReserveOutcome::Reserved { remaining: 3 }
    ));

    let r = ReleaseReason::Upstream5xx;
    assert_eq!(
        s.release(&a, 1, "r1", r).await.unwrap(),
        ReleaseOutcome::VersionMismatch,
        "-2"
    );
    assert_eq!(
        s.release(&a, 2, "r1", r).await.unwrap(),
        ReleaseOutcome::Released { remaining: Some(5) }
    );
    assert_eq!(
        s.release(&a, 2, "r1", r).await.unwrap(),
        ReleaseOutcome::AlreadyReleased,
        "0: exactly once"
    );
    assert_eq!(s.remaining(&a).await.unwrap(), Some(5));
    assert_eq!(
        s.release(&a, 2, "nope", r).await.unwrap(),
        ReleaseOutcome::Unknown,
        "-1"
    );
    let mut conn = redis.conn();
    let exists: bool = redis::cmd("EXISTS")
        .arg("fg:{1001}:r:nope")
        .query(&mut conn)
        .unwrap();
    assert!(!exists, "a plain release of an unknown id writes nothing");
    // The user's units came back too: they can take their full limit again.
    assert!(matches!(
        reserve(&s, &a, "u1", 2, "r2").await,
        ReserveOutcome::Reserved { .. }
    ));
}

#[tokio::test]
async fn release_never_resurrects_an_expired_stock_key() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 5, 1, 1);
    s.prewarm(&a).await.unwrap();
    reserve(&s, &a, "u1", 1, "r1").await;
    let mut conn = redis.conn();
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        s.release(&a, 1, "r1", ReleaseReason::UpstreamError)
            .await
            .unwrap(),
        ReleaseOutcome::Released { remaining: None }
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert!(
        !exists,
        "INCRBY on a missing key would create stock from nothing"
    );
}

#[tokio::test]
async fn abandoning_an_id_first_makes_a_late_reserve_impossible() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 5, 1, 1);
    s.prewarm(&a).await.unwrap();
    // The reserve "timed out" before reaching Redis: the abandon lands first.
    assert_eq!(
        s.abandon(&a, "late").await.unwrap(),
        ReleaseOutcome::Unknown
    );
    assert_eq!(
        reserve(&s, &a, "u1", 1, "late").await,
        ReserveOutcome::DuplicateId
    );
    assert_eq!(s.remaining(&a).await.unwrap(), Some(5));
    // The reserve landed first: the abandon gives it back.
    reserve(&s, &a, "u2", 1, "landed").await;
    assert_eq!(
        s.abandon(&a, "landed").await.unwrap(),
        ReleaseOutcome::Released { remaining: Some(5) }
    );
}

#[tokio::test]
async fn scripts_survive_script_flush() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 5, 1, 1);
    s.ready().await.unwrap();
    s.prewarm(&a).await.unwrap();
    let mut conn = redis.conn();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    // EVALSHA fails with NOSCRIPT; the store loads the script and retries.
    assert!(matches!(
        reserve(&s, &a, "u1", 1, "r1").await,
        ReserveOutcome::Reserved { .. }
    ));
}

#[tokio::test]
async fn an_unreachable_store_fails_fast() {
    let s = store(format!("redis://127.0.0.1:{}/0", free_port()), 50);
    let a = activity("1001", 5, 1, 1);
    let started = Instant::now();
    let err = s
        .reserve(ReserveRequest {
            activity: &a,
            user: "u",
            qty: 1,
            reservation_id: "r",
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Timeout(_) | StoreError::Redis(_)),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert!(s.ready().await.is_err());
}
