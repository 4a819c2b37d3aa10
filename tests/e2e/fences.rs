//! Integrity under concurrency, through the real binary (issue 20): a release that is not the
//! owner's lands only if nothing moved since it was decided; what was on sale is remembered
//! after the keys expired; a giver forgets a transfer only once it landed; and a backend that
//! accepts a released reservation is a fact the ledger, the metrics and `reconcile` show.

use crate::support::*;
use std::time::Duration;

/// A purchase gets no answer in time (the backend is slow once): the buyer is told 503 and the
/// gateway has the reservation asked about soon; the sweep hands it out and the lookup starts.
/// The buyer retries with the same key while the lookup is out: replayed, forwarded, taken by
/// the backend. The lookup's "not found", as old as its question, lands while the retry is at
/// the backend: before, it released the unit, bob bought it and the backend held two orders for
/// one unit (with reconcile clean). Now the replay moved the fence, and the answer is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_retry_while_its_order_lookup_is_out_is_never_sold_twice() {
    let (_redis, upstream, gw) = Stack::start_with(vec![TestActivity::open("1001", 1)], |c| {
        c.read_timeout_ms(1000)
            .order_lookup(OrderLookup::new(5000, 60000))
    })
    .parts();
    upstream
        .mode("slow_once_ms=60000&lookup_delay_ms=400")
        .await;
    let first = gw.buy_keyed("1001", "alice", "k-1").await;
    assert_eq!(first.status, 503, "no answer in time");
    // Asked about once the backend's answer is surely in: 2 x (connect + read) = 3 s.
    let asked = wait_for_async(
        "the order lookup to reach the backend",
        Duration::from_secs(20),
        || async { upstream.lookups().await.first().cloned() },
    )
    .await;
    // The retry reaches the backend while the lookup is out, and takes 900 ms there (the
    // lookup answers "not found" 400 ms after it arrived).
    upstream.mode("delay_ms=900").await;
    let retry = gw.buy_keyed("1001", "alice", "k-1").await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(
        retry.reservation_id(),
        asked,
        "a replay returns the same jti"
    );
    upstream.mode("delay_ms=0").await;
    let bob = gw.buy("1001", "bob", None).await;
    bob.assert_answer(410, "sold_out"); // the unit was sold once
    assert_eq!(upstream.orders().await, vec![asked]);
    gw.reconcile_clean();
    let logs = gw.logs();
    assert!(!logs.contains("already released"), "{logs}");
    assert!(logs.contains("'not found' discarded"), "{logs}");
}

/// Once a sale's keys expired with the retention, moving `ends_at` forward under the same
/// version put the whole stock on sale again: alice had bought the only unit, bob bought it
/// again, and alice's keyed replay answered `sold_out` (reconcile clean: the ledger was new).
/// The version floor outlives the keys: the reopen is refused with a message naming the
/// activity and what to do, and a new version sells afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_a_sale_after_its_keys_expired_needs_a_new_version() {
    // Long enough for the start-up: the stock, made after the sale opened on a Redis just
    // started, stands a 1.5 s birth hold before the gateway is ready.
    let sale = TestActivity::open("1001", 1)
        .ends_at(from_now(chrono::Duration::seconds(6)))
        .hold_secs(1);
    let (redis, upstream, config) = backends(vec![sale.clone()]);
    // Just above what the lifecycle needs (a hold or a trip, 4.5 s, plus a sweep).
    let mut config = config.read_timeout_ms(1000).key_ttl_after_end_secs(6);
    let mut gw = GatewayProc::start(config.clone());
    let alice = gw.buy_keyed("1001", "alice", "k-1").await;
    assert_eq!(alice.status, 200);
    // The sale ends; a day (here: six seconds) later every key but the floor is gone.
    wait_for(
        "the activity's keys to expire",
        Duration::from_secs(30),
        || (redis.exists(&["fg:{1001}:meta", "fg:{1001}:res"]) == 0).then_some(()),
    );
    // An SRE reopens the sale by moving ends_at forward, same version.
    let reopened = sale.ends_at(from_now(chrono::Duration::hours(1)));
    config.activities = vec![reopened.clone()];
    gw.rewrite_config(config.clone());
    let bob = wait_for_async(
        "the reload to take the sale's new hours",
        Duration::from_secs(20),
        || async {
            let r = gw.buy("1001", "bob", None).await;
            (r.code() != "ended").then_some(r)
        },
    )
    .await;
    // Version 1 was on sale before its keys expired: never again.
    bob.assert_answer(503, "unavailable");
    let replay = gw.buy_keyed("1001", "alice", "k-1").await;
    assert_eq!(replay.status, 503, "alice's replay is not told sold_out");
    // The refusal's log line comes from the reload's prewarm, which may land after the first
    // answer (the fence's check, each second, can refuse the purchase first: keys lost).
    wait_for(
        "the refusal naming the version and what to do",
        Duration::from_secs(10),
        || {
            let logs = gw.logs();
            (logs.contains("activity 1001: version 1 was on sale before")
                && logs.contains("raise version above 1"))
            .then_some(())
        },
    );
    let floor: String = redis::cmd("GET")
        .arg("fg:{1001}:floor")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(floor, "1");
    // A new version sells afresh.
    config.activities = vec![reopened.version(2)];
    gw.rewrite_config(config);
    let bob = wait_for_async(
        "the reload to put version 2 on sale",
        Duration::from_secs(20),
        || async {
            let r = gw.buy("1001", "bob", None).await;
            (r.status == 200).then_some(r)
        },
    )
    .await;
    assert_eq!(bob.status, 200);
    assert_eq!(upstream.orders().await.len(), 2, "alice's v1, bob's v2");
}

/// A segmented purchase pulls a unit from another segment; in the instant between the withdraw
/// and the deposit its home segment loses a key (an operator's `HDEL`, injected). The
/// deposit-and-reserve answers before depositing: before, the giver acknowledged the transfer
/// anyway, the unit was counted out of one segment and into none, and reconcile was clean. Now
/// the transfer stays in flight and the sweep delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_into_a_segment_damaged_meanwhile_loses_no_unit() {
    let (redis, _upstream, config) = backends(vec![TestActivity::open("1001", 2).segments(2)]);
    let layout = flashgate::stock::Layout::new(std::sync::Arc::from("1001"), 2);
    let homed: Vec<String> = (0..100)
        .map(|i| format!("user-{i}"))
        .filter(|u| layout.home(u).index() == 0)
        .take(2)
        .collect();
    let gw =
        GatewayProc::start_with_env(config, &[("FLASHGATE_FAULT", "damage_home_before_deposit")]);
    let first = gw.buy("1001", &homed[0], None).await;
    assert_eq!(first.status, 200, "segment 0's own unit");
    let second = gw.buy("1001", &homed[1], None).await;
    assert_eq!(second.status, 503, "segment 0 was damaged under the pull");
    let moved_in = |tag: &str| -> i64 {
        let v: Option<i64> = redis::cmd("HGET")
            .arg(format!("fg:{{{tag}}}:v1:ledger"))
            .arg("moved_in")
            .query(&mut redis.conn())
            .unwrap();
        v.unwrap_or(0)
    };
    // The sweep delivers a transfer left in flight once it is 5 s old.
    wait_for(
        "the transfer to land in segment 0",
        Duration::from_secs(30),
        || (moved_in("1001~0/2") == 1).then_some(()),
    );
    let acked: i64 = redis::cmd("HLEN")
        .arg("fg:{1001~1/2}:acked")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(
        acked, 2,
        "acknowledged (and the placeholder) once it landed"
    );
}

/// The backend says it holds an order whose reservation the gateway had already released. Two
/// gateways whose configurations differ: one asks the backend about reservations whose hold ran
/// out (its lookups answer 6 s late), the other has no order lookup and expires them once a
/// lookup's lease passed. The lookup's "found" lands after the expiry: the unit is covered from
/// stock (a confirmed cover record), counted as accepted late in the ledger and the metric,
/// logged, and `flashgate reconcile` exits 1 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_accepting_a_released_reservation_makes_reconcile_fail() {
    let (_redis, upstream, plain) = backends(vec![TestActivity::explicit("1001", 2, 1)]);
    let asking = plain
        .clone()
        .on_new_ports()
        .order_lookup(OrderLookup::new(9000, 1000));
    let gw = GatewayProc::start(asking);
    // The backend answers lookups 6 s after they arrive (with what it held then).
    upstream.mode("lookup_delay_ms=6000").await;
    let bought = gw.buy("1001", "alice", None).await;
    assert_eq!(bought.status, 200, "the backend took the order");
    // Once the lookup is out, the other gateway starts: it expires the reservation when the
    // lookup's 1 s lease passed, well before the answer.
    wait_for_async(
        "the order lookup to reach the backend",
        Duration::from_secs(20),
        || async { upstream.lookups().await.first().cloned() },
    )
    .await;
    let _expiring = GatewayProc::start(plain);
    let metrics = wait_for_async(
        "the late 'found' to be counted",
        Duration::from_secs(30),
        || async {
            let m = gw.metrics().await;
            (metric_value(
                &m,
                "flashgate_late_accepted_units_total{activity=\"1001\",outcome=\"covered\"}",
            ) == Some(1.0))
            .then_some(m)
        },
    )
    .await;
    assert_eq!(
        metric_value(
            &metrics,
            "flashgate_order_lookups_total{activity=\"1001\",result=\"found\"}"
        ),
        Some(1.0)
    );
    let view = gw.activity_view("1001").await;
    assert_eq!(view["remaining"], 1, "the cover took the unit back: {view}");
    let (code, table) = gw.reconcile();
    assert_eq!(code, 1, "{table}");
    assert!(
        table.contains("LATE ACCEPTED") && table.contains("1 covered from stock, 0 oversold"),
        "{table}"
    );
    assert!(gw
        .logs()
        .contains("accepted a reservation that was already released"));
}
