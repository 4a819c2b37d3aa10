//! The restock call's store side against a real redis-server, through the library's StockStore
//! (the calls the admin API makes: `Lifecycle::restock` passes `store.expire_at(activity)` and
//! segment 0). The first two cases broke the first version (an adversarial review of 807e8ba)
//! and are kept as regressions; the others held.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, ConfirmMode};
use flashgate::stock::prelude::*;
use flashgate::stock::segments;
use flashgate::stock::{Layout, RestockOutcome, StockStore};
use std::time::Duration;
use support::*;

fn store_with_ttl(url: String, ttl_after_end: Duration) -> StockStore {
    let timeout = Duration::from_secs(2);
    store_of(&redis_settings(url, vec![], timeout, ttl_after_end))
}

fn activity(id: &str, stock: u64, version: u64) -> Activity {
    store_activity(
        id,
        stock,
        version,
        4,
        ConfirmMode::Upstream,
        Duration::from_secs(900),
    )
}

async fn restock(s: &StockStore, a: &Activity, units: u64, key: Option<&str>) -> RestockOutcome {
    let l = Layout::of(a);
    s.restock(l.segment(0).unwrap(), a.version, units, key, s.expire_at(a))
        .await
        .unwrap()
}

fn expiretime(redis: &RedisServer, key: &str) -> i64 {
    redis::cmd("EXPIRETIME")
        .arg(key)
        .query(&mut redis.conn())
        .unwrap()
}

/// Found breaking (review of 807e8ba): the book of restock keys was not among prewarm's keys, so
/// extending `ends_at` mid-sale (a reload) left it on the old expiry while the stock lived on;
/// once it expired, the same Idempotency-Key added the units a second time. Now prewarm moves
/// its expiry with the others', and the restock sets it no earlier than the stock's.
#[tokio::test]
async fn regression_the_restock_book_lives_as_long_as_the_stock_it_restocked() {
    let redis = RedisServer::start();
    let s = store_with_ttl(redis.url(), Duration::from_secs(1));
    let mut a = activity("1001", 10, 1);
    a.ends_at = chrono::Utc::now() + chrono::Duration::seconds(2);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    assert!(matches!(
        restock(&s, &a, 5, Some("po-1")).await,
        RestockOutcome::Added { .. }
    ));
    // The operator extends the sale by an hour (a reload): prewarm extends the segment's keys.
    a.ends_at += chrono::Duration::hours(1);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let stock_at = expiretime(&redis, "fg:{1001}:v1:stock");
    let book_at = expiretime(&redis, "fg:{1001}:restocks");
    assert!(book_at >= stock_at, "book {book_at}, stock {stock_at}");
    // A gateway still on the old `ends_at` restocks under another key: the book keeps the
    // stock's expiry, not that gateway's earlier one.
    let mut old = activity("1001", 10, 1);
    old.ends_at = a.ends_at - chrono::Duration::hours(1);
    assert!(matches!(
        restock(&s, &old, 1, Some("po-2")).await,
        RestockOutcome::Added { .. }
    ));
    assert!(expiretime(&redis, "fg:{1001}:restocks") >= stock_at);
    // The same key again: nothing added.
    assert!(matches!(
        restock(&s, &a, 5, Some("po-1")).await,
        RestockOutcome::Repeated { .. }
    ));
    let row = s
        .ledger(Layout::of(&a).segment(0).unwrap(), 1)
        .await
        .unwrap();
    assert_eq!((row.restocked, row.drift()), (6, 0), "{row:?}");
}

/// Found breaking (review of 807e8ba): a restock past 2^53 was accepted, and every script reads
/// numbers exactly only below it: the ledger drifted. Now refused, with nothing changed.
#[tokio::test]
async fn regression_a_restock_past_2_pow_53_is_refused_and_changes_nothing() {
    let redis = RedisServer::start();
    let s = store_with_ttl(redis.url(), Duration::from_secs(86_400));
    let a = activity("1001", 10, 1);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    for add in [(1u64 << 53) + 1, (1u64 << 53) - 5] {
        assert_eq!(
            restock(&s, &a, add, Some("typo")).await,
            RestockOutcome::TooMany { remaining: 10 }
        );
    }
    let l = Layout::of(&a);
    let row = s.ledger(l.segment(0).unwrap(), 1).await.unwrap();
    assert_eq!(
        (row.remaining, row.restocked, row.drift()),
        (10, 0, 0),
        "{row:?}"
    );
    // The key was not used up by the refusal.
    assert!(matches!(
        restock(&s, &a, 3, Some("typo")).await,
        RestockOutcome::Added { remaining: 13 }
    ));
}

/// A restock racing the prewarm that retires its version, many times over,
/// with keys reused across the bump and a segmented activity whose segments pull the restock
/// and whose reservations are swept afterwards: every ledger stays clean, each key adds at
/// most once (across versions, since the book is per activity), and no key is left without an
/// expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restocks_racing_version_bumps_stay_once_per_key_and_clean() {
    let redis = RedisServer::start();
    for segs in [1u32, 3] {
        let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
        // A gateway of its own per round: one that saw version 1 on sale would (rightly) refuse
        // it in the emptied Redis.
        let s = std::sync::Arc::new(store_with_ttl(redis.url(), Duration::from_secs(86_400)));
        let mk = |v: u64| Activity {
            segments: segs,
            hold: Duration::from_millis(300),
            ..activity("1001", 6, v)
        };
        segments::prewarm(&s, &mk(1)).await.unwrap().unwrap();
        let mut added_keys = std::collections::BTreeMap::new();
        for round in 1..=8u64 {
            // Ten restocks (five keys, each twice, concurrently) race the bump to round + 1.
            let mut tasks = Vec::new();
            for i in 0..10u64 {
                let s = s.clone();
                let a = mk(round);
                tasks.push(tokio::spawn(async move {
                    // Fresh keys of this round, and keys of the round before (reused after a bump).
                    let key = if i % 2 == 0 {
                        format!("k{round}-{}", i % 3)
                    } else {
                        format!("k{}-{}", round - 1, i % 3)
                    };
                    let l = Layout::of(&a);
                    let out = s
                        .restock(
                            l.segment(0).unwrap(),
                            a.version,
                            1 + i % 5,
                            Some(&key),
                            s.expire_at(&a),
                        )
                        .await
                        .unwrap();
                    (key, out)
                }));
            }
            let bump = {
                let s = s.clone();
                let next = mk(round + 1);
                tokio::spawn(async move { segments::prewarm(&s, &next).await.unwrap().unwrap() })
            };
            for t in tasks {
                let (key, out) = t.await.unwrap();
                if matches!(out, RestockOutcome::Added { .. }) {
                    *added_keys.entry(key).or_insert(0) += 1;
                }
            }
            bump.await.unwrap();
            // Buyers of the new version (pulling across segments), then their holds run out.
            let a = mk(round + 1);
            for u in 0..8 {
                let user = format!("u{round}-{u}");
                let id = format!("r{round}-{u}");
                let _ = segments::reserve(
                    &*s,
                    &a,
                    segments::Purchase {
                        user: &user,
                        qty: 1,
                        reservation_id: &id,
                        idempotency_key: None,
                        in_flight: Duration::ZERO,
                        replay_only: false,
                        steps: None,
                    },
                )
                .await
                .unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        let layout = Layout::of(&mk(9));
        for n in 0..segs {
            for v in 1..=9 {
                let _ = s
                    .sweep(layout.segment(n).unwrap(), v, 100, None)
                    .await
                    .unwrap();
            }
        }
        for (key, n) in &added_keys {
            assert_eq!(*n, 1, "{segs} segment(s): key {key} added {n} times");
        }
        for n in 0..segs {
            for v in 1..=9 {
                let row = s.ledger(layout.segment(n).unwrap(), v).await.unwrap();
                assert_eq!(
                    row.drift(),
                    0,
                    "{segs} segment(s), segment {n} v{v}: {row:?}"
                );
            }
        }
        let keys = redis.keys("fg:*");
        for k in keys
            .iter()
            .filter(|k| !k.ends_with(":floor") && !k.ends_with(":activities"))
        {
            assert!(expiretime(&redis, k) > 0, "{k} has no expiry");
        }
        let settings = store_settings_for(&redis, &mk(9));
        let report = flashgate::reconcile::reconcile(&settings, &s, Some("1001"))
            .await
            .unwrap();
        assert!(report.clean(), "{segs} segment(s):\n{}", report.table());
        eprintln!(
            "{segs} segment(s): keys added once each: {added_keys:?}\n{}",
            report.table()
        );
    }
}

/// Semantic (passes; documents behaviour): the book is per activity, not per version, and
/// records `version:units` without ever comparing them. A key reused after a version bump, or
/// with another `add`, is answered `Repeated` (the admin API: 200 and the activity's view, with
/// nothing telling the operator that nothing was added to the version now on sale).
#[tokio::test]
async fn semantic_a_key_reused_after_a_bump_or_with_another_add_is_silently_repeated() {
    let redis = RedisServer::start();
    let s = store_with_ttl(redis.url(), Duration::from_secs(86_400));
    let v1 = activity("1001", 10, 1);
    segments::prewarm(&s, &v1).await.unwrap().unwrap();
    assert!(matches!(
        restock(&s, &v1, 5, Some("po-9")).await,
        RestockOutcome::Added { .. }
    ));
    assert_eq!(
        restock(&s, &v1, 50, Some("po-9")).await,
        RestockOutcome::Repeated { remaining: 15 },
        "another add under the same key: nothing added, no error"
    );
    let v2 = activity("1001", 10, 2);
    segments::prewarm(&s, &v2).await.unwrap().unwrap();
    assert_eq!(
        restock(&s, &v2, 5, Some("po-9")).await,
        RestockOutcome::Repeated { remaining: 10 },
        "the key of v1's restock, on v2: nothing added to v2"
    );
    let book: String = redis::cmd("HGET")
        .arg("fg:{1001}:restocks")
        .arg("po-9")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(book, "1:5");
}

fn store_settings_for(redis: &RedisServer, a: &Activity) -> flashgate::config::Settings {
    let yaml = format!(
        r#"server: {{ listen: "127.0.0.1:1" }}
admin: {{ listen: "127.0.0.1:2" }}
upstream: {{ addresses: ["127.0.0.1:3"] }}
redis: {{ url: "{}" }}
identity: {{ header: X-User-Id }}
signing: {{ header: X-Flashgate-Reservation, algorithm: HS256, key_id: k, secret_env: SECRET, ttl_secs: 900 }}
sold_out_cache: {{ ttl_ms: 1000 }}
sale_routes:
  - {{ method: POST, path: "/buy/{{activity}}" }}
activities:
  - {{ id: "{}", stock: {}, version: {}, per_user_limit: {}, max_per_request: 1, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", segments: {} }}
"#,
        redis.url(),
        a.id,
        a.stock,
        a.version,
        a.per_user_limit,
        a.segments
    );
    let secrets = |name: &str| (name == "SECRET").then(|| "s".to_owned());
    flashgate::config::Settings::from_yaml(&yaml, std::path::Path::new("."), &secrets).unwrap()
}
