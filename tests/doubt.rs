//! In doubt, hold (issue 45), in the scripts, against a real redis-server, through the library's
//! StockStore (the calls the gateway makes): a unit goes back on sale only with proof that no
//! order holds it. Two `StockStore`s on one Redis are two gateways (each with its own memory of
//! what it saw).

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, ConfirmMode};
use flashgate::stock::prelude::*;
use flashgate::stock::segments;
use flashgate::stock::{Layout, ReserveCall, ReserveOutcome, SaleHours, StockStore};
use std::time::Duration;
use support::*;

fn activity(id: &str, stock: u64) -> Activity {
    store_activity(
        id,
        stock,
        1,
        5,
        ConfirmMode::Upstream,
        Duration::from_secs(900),
    )
}

/// A gateway: a store with a memory of its own.
/// Subscribes `store`'s presence channel, as its news listener does: the gateway is seen alive
/// while the returned subscription lives.
async fn alive(redis: &RedisServer, store: &StockStore) -> redis::aio::PubSub {
    let mut presence = redis::Client::open(redis.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    presence.subscribe(store.presence_channel()).await.unwrap();
    presence
}

fn gateway(redis: &RedisServer) -> StockStore {
    stock_store(redis.url(), vec![], Duration::from_millis(1000))
}

fn call<'a>(a: &Activity, user: &'a str, id: &'a str) -> ReserveCall<'a> {
    ReserveCall {
        user,
        qty: 1,
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

async fn reserve(s: &StockStore, a: &Activity, user: &str, id: &str) -> ReserveOutcome {
    let l = Layout::of(a);
    s.reserve(l.segment(0).unwrap(), &call(a, user, id))
        .await
        .unwrap()
}

fn flushall(redis: &RedisServer) {
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
}

/// Case 1 of issue 45: Redis emptied, and a gateway with nothing in memory starts and makes the
/// stock again from its configuration. The gateway that saw the sale is refused at its next
/// reserve (its fencing token names a life of the records the store no longer has), not at its
/// next periodic check; and that refusal marks the segment lost, so the gateway that made the
/// stock again is refused from its next call too.
#[tokio::test]
async fn a_store_made_again_under_a_gateway_that_saw_the_sale_is_refused_at_its_next_call() {
    let redis = RedisServer::start();
    let a = activity("1001", 10);
    let saw = gateway(&redis);
    segments::prewarm(&saw, &a).await.unwrap().unwrap();
    assert_eq!(saw.check_master(&a).await.unwrap().fence, None);
    for (user, id) in [("u1", "r1"), ("u2", "r2")] {
        assert!(matches!(
            reserve(&saw, &a, user, id).await,
            ReserveOutcome::Reserved { .. }
        ));
    }
    flushall(&redis);
    let fresh = gateway(&redis);
    segments::prewarm(&fresh, &a).await.unwrap().unwrap();
    // Nothing periodic runs in between: the very next reserve of the gateway that saw the sale.
    assert_eq!(
        reserve(&saw, &a, "u3", "r3").await,
        ReserveOutcome::Fenced,
        "the gateway that saw the sale takes nothing from a stock made again"
    );
    let record: String = redis::cmd("GET")
        .arg(saw.keys().of(Layout::of(&a).segment(0).unwrap()).master())
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(record, "lost", "marked for every gateway");
    assert_eq!(
        reserve(&fresh, &a, "u4", "r4").await,
        ReserveOutcome::Fenced,
        "the gateway that made it again is refused at its next call"
    );
    let fence = fresh.check_master(&a).await.unwrap().fence.expect("fenced");
    assert_eq!(fence.lost.as_deref(), Some("keys_lost"));
}

/// The token does not refuse what the master check accepts: a newer version put on sale after
/// the sale's keys are gone (a new sale) sells to the gateway that saw the old one.
#[tokio::test]
async fn a_newer_version_in_a_new_life_sells_to_the_gateway_that_saw_the_old_one() {
    let redis = RedisServer::start();
    let a = activity("1001", 10);
    let saw = gateway(&redis);
    segments::prewarm(&saw, &a).await.unwrap().unwrap();
    assert!(matches!(
        reserve(&saw, &a, "u1", "r1").await,
        ReserveOutcome::Reserved { .. }
    ));
    flushall(&redis);
    let v2 = Activity {
        version: 2,
        ..a.clone()
    };
    let fresh = gateway(&redis);
    segments::prewarm(&fresh, &v2).await.unwrap().unwrap();
    assert!(matches!(
        reserve(&saw, &v2, "u2", "r2").await,
        ReserveOutcome::Reserved { .. }
    ));
}

/// Case 1 of issue 45, the gateway that makes the stock again: a stock made after its sale
/// opened, in a segment that had none, while another gateway is alive, is born on hold
/// (`lua/prewarm.lua`): it sells only once the hold passed and a master check armed it, so that
/// every live gateway that saw it sell looks first. One that did finds it made again and marks it lost: the new gateway never sells
/// from it, even while the old one sends no buyer at all.
#[tokio::test]
async fn a_stock_made_after_its_sale_opened_waits_for_the_gateways_that_saw_it_sell() {
    use flashgate::stock::failover::FENCE_SETTLE;
    let redis = RedisServer::start();
    let a = activity("1001", 10);
    // Alone on this Redis (and it long up: no gateway is about to subscribe again), the first
    // gateway, seeing its own presence and no other, makes the stock with no hold: nobody
    // could object.
    let saw = gateway(&redis)
        .with_birth_hold(FENCE_SETTLE)
        .with_presence_return(Duration::ZERO);
    // Alive (its news listener listens on its presence channel).
    let _presence = alive(&redis, &saw).await;
    segments::prewarm(&saw, &a).await.unwrap().unwrap();
    assert!(!saw.failover().on_birth_hold(&a.lane));
    for u in 1..=6 {
        let (user, id) = (format!("u{u}"), format!("r{u}"));
        assert!(matches!(
            reserve(&saw, &a, &user, &id).await,
            ReserveOutcome::Reserved { .. }
        ));
    }
    flushall(&redis);
    let fresh = gateway(&redis).with_birth_hold(FENCE_SETTLE);
    segments::prewarm(&fresh, &a).await.unwrap().unwrap();
    assert_eq!(
        reserve(&fresh, &a, "v1", "s1").await,
        ReserveOutcome::Fenced,
        "made again while another gateway is alive: on hold"
    );
    assert!(fresh.failover().on_birth_hold(&a.lane));
    // The gateway that saw the sale looks (its periodic check; no buyer at all).
    let fence = saw.check_master(&a).await.unwrap().fence.expect("fenced");
    assert_eq!(fence.lost.as_deref(), Some("keys_lost"));
    // Past the hold, the new gateway still sells nothing: the loss stands until a recount.
    let deadline = std::time::Instant::now() + FENCE_SETTLE * 2;
    while std::time::Instant::now() < deadline {
        let checked = fresh.check_master(&a).await.unwrap();
        assert!(checked.fence.is_some(), "lost, never armed");
        assert_eq!(
            reserve(&fresh, &a, "v2", "s2").await,
            ReserveOutcome::Fenced
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The presence window: Redis restarted empty drops every gateway's subscription, so for a
/// moment the gateway that saw the sale is not seen alive (its listener subscribes again within
/// `RESUBSCRIBE_MAX`). A gateway that makes the stock again then, seeing no other, still holds
/// it at birth: Redis started too recently for its silence to prove anything.
#[tokio::test]
async fn a_stock_made_on_a_redis_just_started_waits_though_no_gateway_is_seen() {
    use flashgate::stock::failover::FENCE_SETTLE;
    let redis = RedisServer::start();
    let a = activity("1001", 10);
    let fresh = gateway(&redis).with_birth_hold(FENCE_SETTLE);
    // It sees itself (its listener subscribed) and nobody else.
    let _presence = alive(&redis, &fresh).await;
    segments::prewarm(&fresh, &a).await.unwrap().unwrap();
    assert!(
        fresh.failover().on_birth_hold(&a.lane),
        "Redis up for less than PRESENCE_RETURN: on hold"
    );
    assert_eq!(
        reserve(&fresh, &a, "v1", "s1").await,
        ReserveOutcome::Fenced
    );
    // The hold is the same as with a gateway seen: it stands, then a check arms it.
    let settled = redis.time_ms() + FENCE_SETTLE.as_millis() as u64;
    redis.wait_time_past("the birth hold", settled + 50);
    assert!(fresh.check_master(&a).await.unwrap().fence.is_none());
    assert!(matches!(
        reserve(&fresh, &a, "v1", "s1").await,
        ReserveOutcome::Reserved { .. }
    ));
}

/// A gateway that cannot see its own presence (its listener not subscribed yet, or refused: a
/// Redis ACL user without channel rights refuses every gateway alike) takes seeing nobody as
/// proof of nothing: the stock is held at birth, however long Redis has been up.
#[tokio::test]
async fn a_gateway_that_cannot_see_itself_holds_the_stock_it_makes() {
    use flashgate::stock::failover::FENCE_SETTLE;
    let redis = RedisServer::start();
    let a = activity("1001", 10);
    let blind = gateway(&redis)
        .with_birth_hold(FENCE_SETTLE)
        .with_presence_return(Duration::ZERO);
    segments::prewarm(&blind, &a).await.unwrap().unwrap();
    assert!(blind.failover().on_birth_hold(&a.lane));
    assert_eq!(
        reserve(&blind, &a, "v1", "s1").await,
        ReserveOutcome::Fenced
    );
}

/// Found by the adversarial review of the prewarm recording the master: a stock made on a
/// master with no replica yet, whose first replica's sync then gives it a new replication id
/// (Redis does so) before any gateway's check ran. The very same process answers: the
/// `same_process` rule lifts the fence by itself once it stood its settle window (the prewarm
/// records the process beside the master), as it did when a check recorded the master first.
#[tokio::test]
async fn a_first_replica_after_the_prewarm_lifts_by_itself() {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let store = gateway(&master);
    let mut act = activity("firstsync", 5);
    act.starts_at = chrono::Utc::now() + chrono::Duration::hours(1);
    segments::prewarm(&store, &act).await.unwrap().unwrap();
    let before = master.replication("master_replid");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query::<()>(&mut master.conn())
        .unwrap();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query::<()>(&mut replica.conn())
        .unwrap();
    wait_for("the replica's first sync", Duration::from_secs(20), || {
        (master.replication("master_replid") != before).then_some(())
    });
    assert!(
        store.check_master(&act).await.unwrap().fence.is_some(),
        "another replication id: fenced"
    );
    let settled = master.time_ms() + flashgate::stock::failover::FENCE_SETTLE.as_millis() as u64;
    master.wait_time_past("the fence to settle", settled + 50);
    let checked = store.check_master(&act).await.unwrap();
    assert!(
        checked.fence.is_none(),
        "lifted by same_process: {checked:?}"
    );
}

/// Found by the adversarial review of the master check's birth: a stock made again on a master
/// whose clock ran ahead of the one the operator's recount then runs on (here: its birth moved
/// a minute ahead). The recount's stamp is never older than the birth it settles, so the
/// gateway that remembers the first birth does not mark the recounted segment lost again.
#[tokio::test]
async fn a_recount_settles_a_birth_stamped_by_a_clock_ahead() {
    let master = RedisServer::start();
    let act = activity("skewed", 5);
    let seen = gateway(&master);
    segments::prewarm(&seen, &act).await.unwrap().unwrap();
    seen.check_master(&act).await.unwrap();
    redis::cmd("FLUSHALL")
        .query::<()>(&mut master.conn())
        .unwrap();
    let fresh = gateway(&master);
    segments::prewarm(&fresh, &act).await.unwrap().unwrap();
    let meta = "fg:{skewed}:meta";
    let born: u64 = redis::cmd("HGET")
        .arg(meta)
        .arg("v:1")
        .query(&mut master.conn())
        .unwrap();
    redis::cmd("HSET")
        .arg(meta)
        .arg("v:1")
        .arg(born + 60_000)
        .query::<()>(&mut master.conn())
        .unwrap();
    assert!(
        seen.check_master(&act).await.unwrap().fence.is_some(),
        "made again under the gateway that saw it on sale: lost"
    );
    let operator = gateway(&master);
    segments::recount(&operator, &act, 5, segments::Settles::Loss)
        .await
        .unwrap();
    let checked = seen.check_master(&act).await.unwrap();
    assert!(
        checked.fence.is_none(),
        "the recount settled it: {checked:?}"
    );
}
