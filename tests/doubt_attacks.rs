//! Attacks on the "in doubt, hold" rule through Redis failures (issue 45's adversarial review),
//! against real redis-server processes, the demo backend and the gateway binary. Each test
//! asserts the invariant: the backend's orders never exceed the stock. Three of them sold twice
//! before the fixes (an RDB restart taken for a promotion, a persistence setting the restart did
//! not use, a stock made again by a fresh gateway while the one that saw the sale was idle);
//! each is kept as a regression test.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

fn records(redis: &RedisServer) -> std::collections::HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg("fg:{1001}:res")
        .query(&mut redis.conn())
        .unwrap()
}

fn count_state(redis: &RedisServer, state: &str) -> usize {
    records(redis)
        .values()
        .filter(|v| v.starts_with(&format!("{state}|")))
        .count()
}

fn known(redis: &RedisServer) -> std::collections::HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg("fg:{1001}:known")
        .query(&mut redis.conn())
        .unwrap()
}

/// Buyers `prefix-0..` one at a time, each retried while 503 or 410 (units may come back), for
/// `deadline`: how many were answered 200.
async fn buy_until_sold_out(gw: &GatewayProc, prefix: &str, deadline: Duration) -> usize {
    let end = Instant::now() + deadline;
    let mut sold = 0;
    let mut u = 0;
    while Instant::now() < end {
        let r = gw.buy("1001", &format!("{prefix}-{u}"), None).await;
        match r.status {
            200 => {
                sold += 1;
                u += 1;
            }
            410 | 503 => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => panic!("{} {}", r.status, r.text()),
        }
    }
    sold
}

/// ATTACK 1. A master with a replica attached (so `redis.ack_replicas: 1` covers every replica
/// it has) and RDB persistence. A snapshot is taken while the winners are pending (at the
/// backend); the backend takes every order; the gateway confirms each (WAIT acknowledged by the
/// replica). The master then crashes and is restarted from its RDB (the ordinary `save` line of
/// redis.conf, `appendonly no`). Redis 7 restores the old replication id from the RDB as
/// `master_replid2` of the restarted master (for the replicas' partial resync), so the restart
/// looks like "a promoted replica of the recorded master": `replicas_acknowledged` may lift the
/// fence with no operator, although the store went back to a snapshot that lacks the confirms.
/// The reservations are pending there, not held in doubt: their holds expire and the units sell
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdb_restart_with_a_replica_is_taken_for_a_promotion() {
    const STOCK: usize = 5;
    let mut master = RedisServer::start();
    let replica = RedisServer::start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut replica.conn())
        .unwrap();
    wait_for("the replica to sync", Duration::from_secs(20), || {
        (replica.replication("master_link_status") == "up").then_some(())
    });
    let upstream = Upstream::start();
    let activity = TestActivity::open("1001", STOCK as u64).hold_secs(3);
    let mut config = TestConfig::new(&master, &upstream, vec![activity])
        .set("/redis/ack_replicas", serde_json::json!(1));
    config.per_user = None;
    let gw = Arc::new(GatewayProc::start(config));
    wait_for("one replica recorded", Duration::from_secs(20), || {
        known(&master)
            .get("persist")
            .filter(|p| p.ends_with("|1"))
            .cloned()
    });
    let recorded_id = master.replication("master_replid");
    // The backend takes each order after 2 s.
    upstream.mode("status=200&delay_ms=2000").await;
    let buyers: Vec<_> = (0..STOCK)
        .map(|u| {
            let gw = gw.clone();
            tokio::spawn(async move { gw.buy("1001", &format!("w{u}"), None).await })
        })
        .collect();
    wait_for("every winner pending", Duration::from_secs(20), || {
        (count_state(&master, "pending") == STOCK).then_some(())
    });
    // The periodic snapshot, while the winners are at the backend.
    let _: () = redis::cmd("SAVE").query(&mut master.conn()).unwrap();
    for b in buyers {
        let r = b.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_for(
        "the confirms on the master",
        Duration::from_secs(10),
        || (count_state(&master, "confirmed") == STOCK).then_some(()),
    );
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains("flashgate_redis_unacknowledged_writes_total{"),
        "every fate write acknowledged: {metrics}"
    );
    let orders_before = upstream.orders().await.len();
    assert_eq!(orders_before, STOCK);
    upstream.mode("status=200&delay_ms=0").await;

    // The master crashes and comes back from its RDB (the snapshot: winners pending).
    master.kill();
    master.restart();
    let replid2 = master.replication("master_replid2");
    eprintln!(
        "restarted master: replid {} replid2 {replid2} (recorded {recorded_id}); pending {}",
        master.replication("master_replid"),
        count_state(&master, "pending")
    );

    // No buyer meanwhile (a refused buyer's tombstone is a fate write the replica, still
    // resyncing, does not acknowledge: it would veto the rule). The replica re-attaches.
    let lifted_at = Instant::now();
    let lift = wait_for_async("a lift (or not)", Duration::from_secs(30), || async {
        if lifted_at.elapsed() > Duration::from_secs(12) {
            return Some(false);
        }
        gw.metric("flashgate_fence_lifted_total{reason=\"replicas_acknowledged\"}")
            .await
            .filter(|v| *v >= 1.0)
            .map(|_| true)
    })
    .await;
    eprintln!(
        "lifted by replicas_acknowledged: {lift} after {} ms",
        lifted_at.elapsed().as_millis()
    );
    let sold_again = buy_until_sold_out(&gw, "after", Duration::from_secs(40)).await;
    let orders = upstream.orders().await.len();
    let lifted = gw
        .metric("flashgate_fence_lifted_total{reason=\"replicas_acknowledged\"}")
        .await;
    eprintln!(
        "ATTACK 1: sold again after the RDB restart: {sold_again}; backend orders {orders} for \
         stock {STOCK}; replicas_acknowledged lifts: {lifted:?}; view {}",
        gw.activity_view("1001").await
    );
    eprintln!(
        "known after: {:?}; replicas now {}",
        known(&master),
        master.replication("connected_slaves")
    );
    let m = gw.metrics().await;
    for l in m
        .lines()
        .filter(|l| l.contains("unacknowledged") || l.contains("fence_lifted"))
    {
        eprintln!("  {l}");
    }
    for l in gw
        .logs()
        .lines()
        .filter(|l| l.contains("elease") || l.contains("acknowledg"))
        .take(15)
    {
        eprintln!("  LOG {l}");
    }
    assert!(
        orders <= STOCK,
        "SOLD TWICE: {orders} orders for {STOCK} units"
    );
}

fn gateway_for(redis: &RedisServer, upstream: &Upstream, stock: u64) -> GatewayProc {
    let mut config = TestConfig::new(redis, upstream, vec![TestActivity::open("1001", stock)]);
    config.per_user = None;
    GatewayProc::start(config)
}

/// Buyers on `a` and `b` at once, a round of `per_round` each every 30 ms for `for_how_long`:
/// (200s on a, 200s on b).
async fn rounds(
    a: &GatewayProc,
    b: &GatewayProc,
    per_round: usize,
    for_how_long: Duration,
    tag: &str,
) -> (usize, usize) {
    let end = Instant::now() + for_how_long;
    let (mut on_a, mut on_b) = (0, 0);
    let mut round = 0;
    while Instant::now() < end {
        let ra = futures_util::future::join_all(
            (0..per_round)
                .map(|i| async move { a.buy("1001", &format!("{tag}-a{round}-{i}"), None).await }),
        );
        let rb = futures_util::future::join_all(
            (0..per_round)
                .map(|i| async move { b.buy("1001", &format!("{tag}-b{round}-{i}"), None).await }),
        );
        let (ra, rb) = tokio::join!(ra, rb);
        on_a += ra.iter().filter(|r| r.status == 200).count();
        on_b += rb.iter().filter(|r| r.status == 200).count();
        round += 1;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    (on_a, on_b)
}

/// ATTACK 2. The store is flushed mid-sale; a second gateway (nothing in memory) starts on it at
/// once and makes the stock again from its YAML, while the first gateway, which saw the sale,
/// is running. Both take buyers. How many does the new one sell before it is refused?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_then_a_fresh_gateway_both_selling() {
    const STOCK: u64 = 10;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let old = gateway_for(&redis, &upstream, STOCK);
    let (a, b) = rounds(&old, &old, 3, Duration::from_millis(1), "pre").await;
    assert_eq!(a + b, 6);
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let flushed = Instant::now();
    let fresh = gateway_for(&redis, &upstream, STOCK);
    eprintln!(
        "fresh gateway ready {} ms after the flush",
        flushed.elapsed().as_millis()
    );
    let (on_old, on_fresh) = rounds(&old, &fresh, 4, Duration::from_secs(3), "post").await;
    let orders = upstream.orders().await.len();
    eprintln!(
        "ATTACK 2 (flush, fresh gateway, both selling): after the flush old sold {on_old}, \
         fresh sold {on_fresh}; backend orders {orders} for stock {STOCK}; view {}",
        fresh.activity_view("1001").await["fenced"]
    );
    assert!(
        orders as u64 <= STOCK,
        "SOLD TWICE: {orders} orders for {STOCK}"
    );
}

/// ATTACK 2b. Redis restarted empty (no persistence) while down a moment; a second gateway is
/// started during the outage (a deploy, an autoscaler). When Redis answers, the new gateway's
/// prewarm races the old gateway's checks. Both take buyers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_restart_with_a_gateway_started_during_the_outage() {
    const STOCK: u64 = 10;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let old = gateway_for(&redis, &upstream, STOCK);
    let (a, b) = rounds(&old, &old, 3, Duration::from_millis(1), "pre").await;
    assert_eq!(a + b, 6);
    redis.kill();
    let mut config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", STOCK)]);
    config.per_user = None;
    let fresh = GatewayProc::start_unready(config, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    redis.restart();
    let back = Instant::now();
    let (on_old, on_fresh) = rounds(&old, &fresh, 4, Duration::from_secs(4), "post").await;
    let orders = upstream.orders().await.len();
    eprintln!(
        "ATTACK 2b (empty restart, gateway started in the outage): old sold {on_old}, fresh \
         sold {on_fresh} within {} ms; backend orders {orders} for stock {STOCK}; view {}",
        back.elapsed().as_millis(),
        fresh.activity_view("1001").await["fenced"]
    );
    assert!(
        orders as u64 <= STOCK,
        "SOLD TWICE: {orders} orders for {STOCK}"
    );
}

/// ATTACK 2c. As attack 2, but the old gateway takes no buyer after the flush (traffic moved
/// to the new one): only its master check (each second) can find the store made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_then_a_fresh_gateway_old_one_idle() {
    const STOCK: u64 = 10;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let old = gateway_for(&redis, &upstream, STOCK);
    let (a, b) = rounds(&old, &old, 3, Duration::from_millis(1), "pre").await;
    assert_eq!(a + b, 6);
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let flushed = Instant::now();
    let fresh = gateway_for(&redis, &upstream, STOCK);
    let ready = flushed.elapsed().as_millis();
    let (x, y) = rounds(&fresh, &fresh, 4, Duration::from_secs(3), "post").await;
    let orders = upstream.orders().await.len();
    eprintln!(
        "ATTACK 2c (flush, fresh gateway ready {ready} ms after, old idle): fresh sold {}; \
         backend orders {orders} for stock {STOCK}; old view {}",
        x + y,
        old.activity_view("1001").await["fenced"]
    );
    assert!(
        orders as u64 <= STOCK,
        "SOLD TWICE: {orders} orders for {STOCK}"
    );
}

/// ATTACK 3. `durable_restart` trusts the persistence recorded before the restart, not what the
/// restarted process loaded. A Redis switched to `appendonly yes` / `appendfsync always` at run
/// time (CONFIG SET, the config file not rewritten: a common way to turn AOF on), so the
/// gateways record `|yes|always|`. A snapshot (SAVE, or a `save` line) is taken while the winners
/// are at the backend; the backend takes them; the gateway confirms. Redis crashes and restarts
/// with its config file (`appendonly no`): it loads the RDB, winners pending. The recorded
/// persistence says always: the rule lifts the fence, and the pending holds expire and sell again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_restart_trusts_a_config_the_restart_did_not_use() {
    const STOCK: usize = 5;
    let mut redis = RedisServer::start();
    for (k, v) in [("appendonly", "yes"), ("appendfsync", "always")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query(&mut redis.conn())
            .unwrap();
    }
    let upstream = Upstream::start();
    let activity = TestActivity::open("1001", STOCK as u64).hold_secs(3);
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config.per_user = None;
    let gw = Arc::new(GatewayProc::start(config));
    wait_for("the persistence recorded", Duration::from_secs(10), || {
        known(&redis)
            .get("persist")
            .filter(|p| p.contains("|yes|always|"))
            .cloned()
    });
    upstream.mode("status=200&delay_ms=2000").await;
    let buyers: Vec<_> = (0..STOCK)
        .map(|u| {
            let gw = gw.clone();
            tokio::spawn(async move { gw.buy("1001", &format!("w{u}"), None).await })
        })
        .collect();
    wait_for("every winner pending", Duration::from_secs(20), || {
        (count_state(&redis, "pending") == STOCK).then_some(())
    });
    let _: () = redis::cmd("SAVE").query(&mut redis.conn()).unwrap();
    for b in buyers {
        let r = b.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_for("the confirms", Duration::from_secs(10), || {
        (count_state(&redis, "confirmed") == STOCK).then_some(())
    });
    upstream.mode("status=200&delay_ms=0").await;
    assert_eq!(upstream.orders().await.len(), STOCK);
    // Crash; restarted with its command line / config file: appendonly no, the RDB loaded.
    redis.kill();
    redis.restart();
    eprintln!(
        "restarted: pending {} confirmed {}",
        count_state(&redis, "pending"),
        count_state(&redis, "confirmed")
    );
    let t = Instant::now();
    let lifted = wait_for_async("a lift (or not)", Duration::from_secs(30), || async {
        if t.elapsed() > Duration::from_secs(10) {
            return Some(false);
        }
        gw.metric("flashgate_fence_lifted_total{reason=\"durable_restart\"}")
            .await
            .filter(|v| *v >= 1.0)
            .map(|_| true)
    })
    .await;
    let sold_again = buy_until_sold_out(&gw, "after", Duration::from_secs(30)).await;
    let orders = upstream.orders().await.len();
    eprintln!(
        "ATTACK 3: durable_restart lifted: {lifted} ({} ms); sold again {sold_again}; backend \
         orders {orders} for stock {STOCK}",
        t.elapsed().as_millis()
    );
    assert!(
        orders <= STOCK,
        "SOLD TWICE: {orders} orders for {STOCK} units"
    );
}

/// Redis's uptime (s).
fn uptime(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("uptime_in_seconds")
}

/// A Redis 7 ACL user for the gateways, made the ordinary way (`ACL SETUSER gw on >pw ~* +@all`):
/// Redis 7's default `acl-pubsub-default resetchannels` gives it no channel, so every gateway's
/// news listener is refused its SUBSCRIBE (NOPERM) and no presence is ever seen.
fn acl_user_without_channels(redis: &RedisServer) -> String {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("gw")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+@all")
        .query(&mut redis.conn())
        .unwrap();
    format!("redis://gw:pw@127.0.0.1:{}/0", redis.port)
}

/// ATTACK 4 (the review of the presence window). The gateways' Redis user has no pub/sub
/// channel, so no gateway is ever seen alive; on a Redis up for longer than the uptime window,
/// the store flushed mid-sale, a gateway started then made the stock again and sold at once
/// (16 orders for 10). A gateway that cannot see its own presence takes the silence as proof of
/// nothing: it holds the stock at birth, and the old gateway's check marks it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_without_channels_then_flush_and_a_fresh_gateway() {
    const STOCK: u64 = 10;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let url = acl_user_without_channels(&redis);
    let gateway_at = |url: String| {
        let mut config =
            TestConfig::at(url, upstream.addr, vec![TestActivity::open("1001", STOCK)]);
        config.per_user = None;
        GatewayProc::start(config)
    };
    let old = gateway_at(url.clone());
    let (a, b) = rounds(&old, &old, 3, Duration::from_millis(1), "pre").await;
    assert_eq!(a + b, 6);
    let seen: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*presence*")
        .query(&mut redis.conn())
        .unwrap();
    assert!(seen.is_empty(), "the listener cannot subscribe: {seen:?}");
    // Redis long up: the uptime window (PRESENCE_RETURN) does not apply.
    let up = uptime(&redis).min(5);
    redis.wait_time_past("Redis up 5 s", redis.time_ms() + (5 - up) * 1000);
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let flushed = Instant::now();
    let fresh = gateway_at(url);
    let ready = flushed.elapsed().as_millis();
    let (x, y) = rounds(&fresh, &fresh, 2, Duration::from_secs(3), "post").await;
    let orders = upstream.orders().await.len();
    eprintln!(
        "ATTACK 4 (ACL without channels, flush, fresh ready {ready} ms after): fresh sold {}; \
         backend orders {orders} for stock {STOCK}; view {}",
        x + y,
        fresh.activity_view("1001").await["fenced"]
    );
    assert!(
        orders as u64 <= STOCK,
        "SOLD TWICE: {orders} orders for {STOCK}"
    );
}
