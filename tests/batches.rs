//! Batched reserves under cancellation, errors and load, against a real redis-server: each case
//! was found breaking the first version of the batcher or the batched script (an adversarial
//! review of 67b9931) and is kept as a regression test.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, ConfirmMode};
use flashgate::stock::prelude::*;
use flashgate::stock::segments;
use flashgate::stock::{Layout, ReserveCall, ReserveOutcome, SaleHours, Segment};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;
use support::*;

fn activity(id: &str, stock: u64, limit: u32) -> Activity {
    store_activity(
        id,
        stock,
        1,
        limit,
        ConfirmMode::Upstream,
        Duration::from_secs(900),
    )
}

fn one(layout: &Layout) -> Segment<'_> {
    layout.segment(0).unwrap()
}

fn call<'a>(a: &Activity, user: &'a str, qty: u32, id: &'a str) -> ReserveCall<'a> {
    ReserveCall {
        user,
        qty,
        per_user_limit: a.per_user_limit.get(),
        version: a.version,
        reservation_id: id,
        hold: a.hold,
        idempotency_key: None,
        deposit: None,
        in_flight: Duration::ZERO,
        replay_only: false,
        hours: SaleHours::of(a),
        steps: None,
        line: false,
    }
}

/// Redis answers nobody for `ms` (CLIENT PAUSE): a call sent now stays out that long.
fn pause(redis: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query(&mut redis.conn())
        .unwrap();
}

/// Polls `f` exactly once.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await
}

/// Found breaking (review of 67b9931), fixed by the waiter's drop guard: a waiter handed the lead (the `Lead` message is in its oneshot) whose future is
/// dropped before it is polled again takes the lane's `busy` flag with it: no `Leading` guard
/// exists yet, so nobody calls `hand_on`. Every later reserve of that segment and version
/// waits forever (the gateway has no outer timeout around the reserve), and the lane leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_waiter_dropped_after_being_handed_the_lead_does_not_wedge_the_lane() {
    let redis = RedisServer::start();
    let s = stock_store(redis.url(), vec![], Duration::from_millis(1000));
    let a = activity("1001", 100, 5);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let l = Layout::of(&a);

    let ca = call(&a, "ua", 1, "ra");
    let cb = call(&a, "ub", 1, "rb");
    let cc = call(&a, "uc", 1, "rc");

    // A leads: its call is out (Redis holds every answer for a moment, so it stays out while
    // the others arrive).
    pause(&redis, 300);
    let mut fa = Box::pin(s.reserve(one(&l), &ca));
    assert!(poll_once(&mut fa).await.is_pending());
    // B arrives meanwhile: it waits in the lane.
    let mut fb = Box::pin(s.reserve(one(&l), &cb));
    assert!(poll_once(&mut fb).await.is_pending());
    assert_eq!(s.reserves_waiting(), 1);
    // A's call lands; its guard hands the lane to B (a Lead message sits in B's channel).
    let ra = fa.await.unwrap();
    assert!(matches!(ra, ReserveOutcome::Reserved { .. }), "{ra:?}");
    // B's buyer goes away before B is polled again (a cancelled task, a select!, a timeout
    // that fires in the same instant on another worker).
    drop(fb);
    // C, any later buyer of the segment, must still go.
    let rc = tokio::time::timeout(Duration::from_secs(5), s.reserve(one(&l), &cc)).await;
    assert!(
        rc.is_ok(),
        "the lane is wedged: a reserve of the segment waits forever after a dropped new leader \
         (waiting: {})",
        s.reserves_waiting()
    );
}

/// Found breaking (review of 67b9931): the same wedge with the test seam (hold/release) and no manual polling: a held
/// batch whose first item's future is gone at release time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_held_batch_whose_leader_was_dropped_does_not_wedge_the_lane() {
    let redis = RedisServer::start();
    let s = stock_store(redis.url(), vec![], Duration::from_millis(1000));
    let a = activity("1001", 100, 5);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let l = Layout::of(&a);
    let ca = call(&a, "ua", 1, "ra");
    let cb = call(&a, "ub", 1, "rb");
    let cc = call(&a, "uc", 1, "rc");
    s.hold_reserves();
    let mut fa = Box::pin(s.reserve(one(&l), &ca));
    assert!(poll_once(&mut fa).await.is_pending());
    let mut fb = Box::pin(s.reserve(one(&l), &cb));
    assert!(poll_once(&mut fb).await.is_pending());
    // A is handed the lead (with B) and dropped before it runs.
    s.release_reserves();
    drop(fa);
    // B is told "lost" (fine: may have landed, abandoned).
    let rb = tokio::time::timeout(Duration::from_secs(5), fb).await;
    println!("B: {rb:?}");
    let rc = tokio::time::timeout(Duration::from_secs(5), s.reserve(one(&l), &cc)).await;
    assert!(rc.is_ok(), "the lane is wedged after a dropped new leader");
}

/// Found breaking (review of 67b9931): with the ledger's pending added after the loop, a Redis
/// error raised by a later step of the script (here: the events key is not a stream, XADD fails
/// with WRONGTYPE) left the items already judged with their stock taken, records and pending
/// entries written, and no `pending` in the ledger. Now every key the batch writes is checked
/// for its type before anything is written: a key of another type is a damaged segment, refused
/// with nothing changed.
#[tokio::test]
async fn regression_an_error_after_an_item_reserved_leaves_its_ledger_balanced() {
    let redis = RedisServer::start();
    let s = stock_store(redis.url(), vec![], Duration::from_millis(1000));
    let a = activity("1001", 10, 5);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let l = Layout::of(&a);
    let mut conn = redis.conn();
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:events")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("fg:{1001}:events")
        .arg("not a stream")
        .query(&mut conn)
        .unwrap();
    let r = s.reserve(one(&l), &call(&a, "u1", 2, "r1")).await;
    assert_eq!(r.unwrap(), ReserveOutcome::Damaged);
    let row = s.ledger(one(&l), 1).await.unwrap();
    assert_eq!(row.drift(), 0, "{row:?}");
    assert_eq!(
        (row.remaining, row.pending),
        (10, 0),
        "nothing taken: {row:?}"
    );
    assert!(s.lookup(one(&l), "r1").await.unwrap().is_none());
}

/// Found breaking (review of 67b9931; fixed as the case above): a batch was not judged as separate calls
/// when the version's ledger hash is missing: separately, the first reserve's HINCRBY makes the
/// ledger and the second item's deposit lands; batched, the deposit sees no ledger (-7) because
/// the HINCRBY is deferred to the end of the script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_deposit_after_a_reserve_in_one_batch_sees_its_ledger() {
    let redis = RedisServer::start();
    let s = stock_store(redis.url(), vec![], Duration::from_millis(1000));
    let mut outcomes = Vec::new();
    for (id, batched) in [("1001", false), ("1002", true)] {
        let a = activity(id, 10, 5);
        segments::prewarm(&s, &a).await.unwrap().unwrap();
        let l = Layout::of(&a);
        let mut conn = redis.conn();
        let _: () = redis::cmd("DEL")
            .arg(format!("fg:{{{id}}}:v1:ledger"))
            .query(&mut conn)
            .unwrap();
        let c1 = call(&a, "u1", 1, "r1");
        let c2 = ReserveCall {
            deposit: Some(("t1", 3)),
            ..call(&a, "u2", 1, "r2")
        };
        let got = if !batched {
            vec![
                s.reserve(one(&l), &c1).await.unwrap(),
                s.reserve(one(&l), &c2).await.unwrap(),
            ]
        } else {
            s.hold_reserves();
            let both = futures_util::future::join(s.reserve(one(&l), &c1), s.reserve(one(&l), &c2));
            let release = async {
                wait_for_async("queue", Duration::from_secs(5), || async {
                    (s.reserves_waiting() == 2).then_some(())
                })
                .await;
                s.release_reserves();
            };
            let ((o1, o2), ()) = tokio::join!(both, release);
            vec![o1.unwrap(), o2.unwrap()]
        };
        let got: Vec<_> = got
            .into_iter()
            .map(|o| std::mem::discriminant(&o))
            .collect();
        outcomes.push(got);
    }
    assert_eq!(outcomes[0], outcomes[1], "batched differs from one by one");
}

/// A timed-out batch: every item's error may have landed (so each is abandoned). Held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_item_of_a_timed_out_batch_may_have_landed() {
    let redis = RedisServer::start();
    let s = stock_store(redis.url(), vec![], Duration::from_millis(100));
    let a = activity("1001", 100, 5);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let l = Layout::of(&a);
    let ids: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    let users: Vec<String> = (0..5).map(|i| format!("u{i}")).collect();
    let calls: Vec<_> = (0..5).map(|i| call(&a, &users[i], 1, &ids[i])).collect();
    s.hold_reserves();
    let all = futures_util::future::join_all(calls.iter().map(|c| s.reserve(one(&l), c)));
    let release = async {
        wait_for_async("queue", Duration::from_secs(5), || async {
            (s.reserves_waiting() == 5).then_some(())
        })
        .await;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(400)
            .arg("ALL")
            .query(&mut redis.conn())
            .unwrap();
        s.release_reserves();
    };
    let (outs, ()) = tokio::join!(all, release);
    for o in &outs {
        let e = o.as_ref().expect_err("timed out");
        assert!(e.may_have_landed(), "{e:?}");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    // It landed after all (the command was sent): each must be abandoned by its owner.
    let row = s.ledger(one(&l), 1).await.unwrap();
    println!("{row:?}");
    assert_eq!(row.drift(), 0);
}

/// Stress: many buyers on a 3-segment activity with pulls, through `segments::reserve`, some
/// cut off by tiny timeouts (dropped futures), errors abandoned as admission does; then every
/// segment's ledger must balance, no user over the limit, units sold <= stock, and no lane
/// stuck (a final reserve per segment must answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn segmented_reserves_with_dropped_buyers_keep_every_ledger_and_no_lane_stuck() {
    use flashgate::stock::{ReleaseMode, ReleaseReason};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let redis = RedisServer::start();
    let s = Arc::new(stock_store(redis.url(), vec![], Duration::from_millis(200)));
    let mut a = activity("1001", 600, 3);
    a.segments = 3;
    let lay = Layout::of(&a);
    // Mostly buyers of segment 0, so it runs short and pulls from the others.
    let pool: Arc<Vec<String>> = Arc::new(
        (0..5000)
            .map(|i| format!("user{i}"))
            .filter(|u| lay.home(u).index() == 0 || u.ends_with('7'))
            .take(300)
            .collect(),
    );
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let a = Arc::new(a);
    let stuck = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let s = s.clone();
        let a = a.clone();
        let stuck = stuck.clone();
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..30u64 {
                let user = pool[((t * 7 + i * 13) % pool.len() as u64) as usize].clone();
                let id = format!("{t}-{i}");
                let key = format!("k{}", i % 3);
                let qty = 1 + (i % 2) as u32;
                let purchase = segments::Purchase {
                    user: &user,
                    qty,
                    reservation_id: &id,
                    idempotency_key: (i % 4 == 0).then_some(key.as_str()),
                    in_flight: Duration::from_secs(1),
                    replay_only: false,
                    steps: None,
                };
                let budget = if (t + i) % 5 == 0 {
                    Duration::from_micros(50 + (i * 37 % 400))
                } else {
                    Duration::from_secs(3)
                };
                match tokio::time::timeout(budget, segments::reserve(&*s, &a, purchase)).await {
                    Err(_) if budget >= Duration::from_secs(3) => {
                        stuck.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {}
                    Ok(Ok(_)) => {}
                    Ok(Err(f)) => {
                        if let Some(seg) = f.landed_maybe {
                            let l = Layout::of(&a);
                            let _ = s
                                .release(
                                    l.segment(seg).unwrap(),
                                    a.version,
                                    &id,
                                    ReleaseMode::Abandon,
                                    ReleaseReason::StoreTimeout,
                                )
                                .await;
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    println!("stuck (3 s) reserves: {}", stuck.load(Ordering::Relaxed));
    let l = Layout::of(&a);
    let mut total_remaining = 0;
    let mut total_pending = 0;
    for seg in l.segments() {
        let row = s.ledger(seg, 1).await.unwrap();
        println!("{row:?}");
        assert_eq!(row.drift(), 0, "{row:?}");
        total_remaining += row.remaining;
        total_pending += row.pending;
        let users: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("fg:{{{}}}:users", seg.tag()))
            .query(&mut redis.conn())
            .unwrap();
        for (u, v) in users {
            if u.is_empty() {
                continue;
            }
            assert!(v.parse::<i64>().unwrap() <= 3, "{u} holds {v}");
        }
    }
    println!("remaining {total_remaining} pending {total_pending}");
    for seg in l.segments() {
        let c = ReserveCall {
            version: 1,
            ..call(&a, "final", 1, "final")
        };
        let r = tokio::time::timeout(Duration::from_secs(3), s.reserve(seg, &c)).await;
        assert!(r.is_ok(), "segment {} wedged", seg.index());
    }
    assert_eq!(
        stuck.load(Ordering::Relaxed),
        0,
        "reserves that never answered"
    );
}

/// The wedge of the first case reached with nothing but `tokio::time::timeout` on a multi-thread
/// runtime: a follower whose budget runs out just as its leader's call lands. Tries up to
/// 2,000 times (the first case is the deterministic one); fails (with the attempt number) when a later reserve of the segment hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_timeout_racing_the_hand_over_does_not_wedge_the_lane() {
    use std::sync::Arc;
    let redis = RedisServer::start();
    let s = Arc::new(stock_store(
        redis.url(),
        vec![],
        Duration::from_millis(1000),
    ));
    let a = Arc::new(activity("1001", 1_000_000, 1_000_000));
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    for n in 0..2_000u64 {
        let (s1, a1) = (s.clone(), a.clone());
        let leader = tokio::spawn(async move {
            let l = Layout::of(&a1);
            let id = format!("a{n}");
            let _ = s1.reserve(one(&l), &call(&a1, "u", 1, &id)).await;
        });
        let (s2, a2) = (s.clone(), a.clone());
        let budget = Duration::from_micros(20 + (n * 7919) % 600);
        let follower = tokio::spawn(async move {
            let l = Layout::of(&a2);
            let id = format!("b{n}");
            let c = call(&a2, "u", 1, &id);
            let _ = tokio::time::timeout(budget, s2.reserve(one(&l), &c)).await;
        });
        let _ = leader.await;
        let _ = follower.await;
        let l = Layout::of(&a);
        let id = format!("c{n}");
        let c = call(&a, "u", 1, &id);
        let r = tokio::time::timeout(Duration::from_secs(2), s.reserve(one(&l), &c)).await;
        assert!(r.is_ok(), "lane wedged after attempt {n}");
    }
}

/// Found breaking (review of 67b9931; fixed: the leader leaves out askers gone before its call;
/// the doc claim "an asker whose future was dropped before its call left is left out of
/// it"): a follower drained into the next leader's batch, then dropped before that leader's
/// call leaves (the leader's task not yet scheduled), still reserves: a pending reservation
/// nobody answers or abandons, holding its units until the hold deadline (900 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_follower_dropped_before_its_call_left_reserves_nothing() {
    let redis = RedisServer::start();
    let s = stock_store(redis.url(), vec![], Duration::from_millis(1000));
    let a = activity("1001", 100, 5);
    segments::prewarm(&s, &a).await.unwrap().unwrap();
    let l = Layout::of(&a);
    let ca = call(&a, "ua", 1, "ra");
    let cb = call(&a, "ub", 1, "rb");
    let cc = call(&a, "uc", 1, "rc");
    // A leads, B and C wait (Redis holds A's answer for a moment).
    pause(&redis, 300);
    let mut fa = Box::pin(s.reserve(one(&l), &ca));
    assert!(poll_once(&mut fa).await.is_pending());
    let mut fb = Box::pin(s.reserve(one(&l), &cb));
    assert!(poll_once(&mut fb).await.is_pending());
    let mut fc = Box::pin(s.reserve(one(&l), &cc));
    assert!(poll_once(&mut fc).await.is_pending());
    // A lands: B is handed the lead with C.
    fa.await.unwrap();
    // C's buyer goes away before B's task runs: C's call has not left.
    drop(fc);
    let rb = fb.await.unwrap();
    assert!(matches!(rb, ReserveOutcome::Reserved { .. }), "{rb:?}");
    let rec = s.lookup(one(&l), "rc").await.unwrap();
    assert!(
        rec.is_none(),
        "C was dropped before its call left, yet it reserved: {rec:?}"
    );
}

/// Fleet-bucket asks (issue 25) against a real redis-server: asks that arrive together share
/// calls, a bucket grants its burst and not one token more, each answer says when the next
/// token will be there, and a bucket's key expires once it would be full again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_token_asks_are_batched_and_exact() {
    use flashgate::stock::scripts::tokens::TokenAsk;
    let redis = RedisServer::start();
    let s = std::sync::Arc::new(stock_store(
        redis.url(),
        vec![],
        Duration::from_millis(1000),
    ));
    let calls = || redis.script_calls();
    let ask = |hash: u64| TokenAsk {
        kind: "per_user",
        hash,
        // One token an hour: nothing refills during the test.
        interval_us: 3_600_000_000,
        burst: 5,
    };
    s.ready().await.unwrap();
    let before = calls();
    // 200 asks at once: 100 buyers' first tokens, and 100 asks of one buyer with a burst of 5.
    let asks: Vec<_> = (0..200u64)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.take_token(ask(if i % 2 == 0 { 1000 + i } else { 1 }))
                    .await
            })
        })
        .collect();
    let mut granted_one = 0;
    for (i, a) in asks.into_iter().enumerate() {
        let answer = a.await.unwrap().unwrap();
        if i % 2 == 0 {
            assert!(answer.granted, "buyer {i}'s first token");
            assert_eq!(answer.next_in_us, 0, "four more in buyer {i}'s burst");
        } else if answer.granted {
            granted_one += 1;
        } else {
            assert!(answer.next_in_us > 3_000_000_000, "{answer:?}");
        }
    }
    assert_eq!(granted_one, 5, "buyer 1 got exactly its burst");
    let made = calls() - before;
    assert!(made < 100, "200 asks made {made} calls");
    // Keys: hashed ids on one tag, expiring when full again (5 tokens an hour: within 5 h).
    let keys = redis.keys("fg:{rl~0}:per_user:*");
    assert_eq!(keys.len(), 101);
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut redis.conn())
            .unwrap();
        assert!(ttl > 0 && ttl <= 5 * 3_600_000, "{key}: {ttl}");
    }
}
