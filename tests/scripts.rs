//! The Lua scripts' return codes, against a real redis-server, through the library's StockStore.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, ConfirmMode};
use flashgate::metrics::ReleaseReason;
use flashgate::stock::{
    ConfirmOutcome, ConfirmedVia, PrewarmOutcome, RecordState, ReleaseOutcome, ReserveOutcome,
    ReserveRequest, StockStore, StoreError,
};
use std::time::{Duration, Instant};
use support::*;

fn activity(id: &str, stock: u64, version: u64, limit: u32) -> Activity {
    store_activity(
        id,
        stock,
        version,
        limit,
        ConfirmMode::Upstream,
        Duration::from_secs(900),
    )
}

fn store(url: String, timeout_ms: u64) -> StockStore {
    stock_store(url, vec![], Duration::from_millis(timeout_ms))
}

async fn reserve(s: &StockStore, a: &Activity, user: &str, qty: u32, id: &str) -> ReserveOutcome {
    s.reserve(ReserveRequest {
        activity: a,
        user,
        qty,
        reservation_id: id,
        idempotency_key: None,
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
    assert_eq!(s.prewarm(&a).await.unwrap(), PrewarmOutcome::Created);
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
    assert_eq!(s.prewarm(&a).await.unwrap(), PrewarmOutcome::Exists);
    assert_eq!(s.remaining(&a).await.unwrap(), Some(0));

    // The record of a reservation is in Redis, pending, with the version.
    let rec = s.lookup(&a, "r1").await.unwrap().expect("record");
    assert_eq!((rec.user.as_str(), rec.qty, rec.ver), ("u1", 2, 1));
    assert_eq!(rec.state, RecordState::Pending);
    assert!(rec.deadline_ms.unwrap() > rec.created_ms.unwrap());
    let mut conn = redis.conn();
    // Keys expire a day after the sale ends.
    let expected = a.ends_at.timestamp() + 86_400;
    for key in [
        "fg:{1001}:v1:stock",
        "fg:{1001}:v1:ledger",
        "fg:{1001}:users",
        "fg:{1001}:res",
        "fg:{1001}:v1:pending",
        "fg:{1001}:events",
    ] {
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
    assert!(
        s.lookup(&a, "nope").await.unwrap().is_none(),
        "a plain release of an unknown id writes nothing"
    );
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
    // The units are recorded as retired in the ledger and on the record.
    let row = s.ledger(&a, 1).await.unwrap();
    assert_eq!((row.pending, row.released, row.retired), (0, 1, 1));
    assert_eq!(s.lookup(&a, "r1").await.unwrap().unwrap().returned, Some(0));
    // And prewarm refuses to re-create a stock key whose ledger lives on.
    assert_eq!(
        s.prewarm(&a).await.unwrap(),
        PrewarmOutcome::StockKeyRemoved
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert!(!exists);
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
            idempotency_key: None,
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

#[tokio::test]
async fn confirm_return_codes_and_the_ledger() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 10, 1, 5);
    s.prewarm(&a).await.unwrap();
    reserve(&s, &a, "u1", 2, "r1").await;
    reserve(&s, &a, "u2", 3, "r2").await;
    let via = ConfirmedVia::Admin;
    assert_eq!(
        s.confirm(&a, 2, "r1", via).await.unwrap(),
        ConfirmOutcome::VersionMismatch
    );
    assert_eq!(
        s.confirm(&a, 1, "r1", via).await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        s.confirm(&a, 1, "r1", via).await.unwrap(),
        ConfirmOutcome::AlreadyConfirmed
    );
    assert_eq!(
        s.confirm(&a, 1, "nope", via).await.unwrap(),
        ConfirmOutcome::Unknown
    );
    s.release(&a, 1, "r2", ReleaseReason::Admin).await.unwrap();
    assert_eq!(
        s.confirm(&a, 1, "r2", via).await.unwrap(),
        ConfirmOutcome::Released
    );

    let row = s.ledger(&a, 1).await.unwrap();
    assert_eq!(
        (
            row.initial,
            row.remaining,
            row.pending,
            row.confirmed,
            row.released,
            row.retired
        ),
        (10, 8, 0, 2, 3, 0)
    );
    assert_eq!(row.drift(), 0);
    assert_eq!(
        row.pending_reservations, 0,
        "confirmed and released leave the pending set"
    );

    // A confirmed reservation can still be released (an order cancelled after payment).
    assert!(matches!(
        s.release(&a, 1, "r1", ReleaseReason::Admin).await.unwrap(),
        ReleaseOutcome::Released {
            remaining: Some(10)
        }
    ));
    let row = s.ledger(&a, 1).await.unwrap();
    assert_eq!(
        (row.remaining, row.confirmed, row.released, row.drift()),
        (10, 0, 5, 0)
    );
}

#[tokio::test]
async fn sweep_releases_only_expired_pending_reservations_in_batches() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let mut a = activity("1001", 100, 1, 1);
    a.hold = Duration::ZERO; // already due when made
    s.prewarm(&a).await.unwrap();
    for i in 0..25 {
        reserve(&s, &a, &format!("u{i}"), 1, &format!("r{i}")).await;
    }
    s.confirm(&a, 1, "r0", ConfirmedVia::Admin).await.unwrap();
    let long = Activity {
        hold: Duration::from_secs(900),
        ..activity("1001", 100, 1, 1)
    };
    reserve(&s, &long, "later", 1, "r-later").await;

    let first = s.sweep(&a, 1, 10).await.unwrap();
    assert_eq!((first.released, first.scanned), (10, 10));
    let second = s.sweep(&a, 1, 10).await.unwrap();
    let third = s.sweep(&a, 1, 10).await.unwrap();
    assert_eq!(
        first.released + second.released + third.released,
        24,
        "all expired but the confirmed one"
    );
    assert_eq!(
        s.sweep(&a, 1, 10).await.unwrap().released,
        0,
        "exactly once"
    );
    let row = s.ledger(&a, 1).await.unwrap();
    assert_eq!(
        (row.remaining, row.pending, row.confirmed, row.released),
        (98, 1, 1, 24)
    );
    assert_eq!(row.drift(), 0);
    assert_eq!(
        s.lookup(&a, "r5").await.unwrap().unwrap().reason.as_deref(),
        Some("expired")
    );
    assert_eq!(
        s.lookup(&a, "r-later").await.unwrap().unwrap().state,
        RecordState::Pending
    );
}

#[tokio::test]
async fn idempotency_key_replays_the_same_reservation() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 10, 1, 1);
    s.prewarm(&a).await.unwrap();
    let req = |id: &'static str, key: &'static str| ReserveRequest {
        activity: &a,
        user: "u1",
        qty: 1,
        reservation_id: id,
        idempotency_key: Some(key),
    };
    assert!(matches!(
        s.reserve(req("r1", "k")).await.unwrap(),
        ReserveOutcome::Reserved { remaining: 9 }
    ));
    // The retry gets r1 back, takes nothing more.
    assert_eq!(
        s.reserve(req("r2", "k")).await.unwrap(),
        ReserveOutcome::Replayed {
            id: "r1".into(),
            qty: 1,
            version: 1,
            remaining: Some(9)
        }
    );
    // Another key of the same user is a new purchase: over the limit.
    assert!(matches!(
        s.reserve(req("r3", "other")).await.unwrap(),
        ReserveOutcome::LimitExceeded { .. }
    ));
    // The same key of another user is theirs alone.
    let bob = ReserveRequest {
        user: "bob",
        ..req("r4", "k")
    };
    assert!(matches!(
        s.reserve(bob).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // Once released, the key buys afresh.
    s.release(&a, 1, "r1", ReleaseReason::Admin).await.unwrap();
    assert!(matches!(
        s.reserve(req("r5", "k")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(s.ledger(&a, 1).await.unwrap().drift(), 0);
}

#[tokio::test]
async fn every_transition_appends_exactly_one_event() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 10, 1, 2);
    s.prewarm(&a).await.unwrap();
    reserve(&s, &a, "u1", 1, "r1").await;
    reserve(&s, &a, "u2", 2, "r2").await;
    s.confirm(&a, 1, "r1", ConfirmedVia::Upstream)
        .await
        .unwrap();
    s.confirm(&a, 1, "r1", ConfirmedVia::Upstream)
        .await
        .unwrap(); // no-op: no event
    s.release(&a, 1, "r2", ReleaseReason::Upstream5xx)
        .await
        .unwrap();
    s.release(&a, 1, "r2", ReleaseReason::Upstream5xx)
        .await
        .unwrap(); // no-op: no event
    reserve(&s, &a, "u3", 5, "refused").await; // refused: no event

    let mut conn = redis.conn();
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("fg:{1001}:events")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let events: Vec<(String, String)> = entries
        .ids
        .iter()
        .map(|e| {
            (
                e.get::<String>("type").unwrap(),
                e.get::<String>("jti").unwrap(),
            )
        })
        .collect();
    let expected = [
        ("reserve", "r1"),
        ("reserve", "r2"),
        ("confirm", "r1"),
        ("release", "r2"),
    ];
    assert_eq!(
        events,
        expected.map(|(t, j)| (t.to_owned(), j.to_owned())).to_vec()
    );
    assert_eq!(
        entries.ids[3].get::<String>("reason").unwrap(),
        "upstream_5xx"
    );
    assert_eq!(entries.ids[1].get::<String>("qty").unwrap(), "2");
}

#[tokio::test]
async fn releases_into_a_retired_version_are_recorded_as_retired() {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let v1 = activity("1001", 5, 1, 1);
    s.prewarm(&v1).await.unwrap();
    reserve(&s, &v1, "u1", 1, "r1").await;
    // Operations bump the version: v2 is on sale now, v1 is retired.
    let v2 = activity("1001", 10, 2, 1);
    s.prewarm(&v2).await.unwrap();
    assert_eq!(
        s.release(&v2, 1, "r1", ReleaseReason::Admin).await.unwrap(),
        ReleaseOutcome::Released { remaining: None }
    );
    let row = s.ledger(&v2, 1).await.unwrap();
    assert_eq!(
        (row.remaining, row.pending, row.released, row.retired),
        (4, 0, 1, 1)
    );
    assert_eq!(row.drift(), 0);
    assert_eq!(
        s.ledger(&v2, 2).await.unwrap().remaining,
        10,
        "v2 untouched"
    );
}
