//! The Lua scripts' return codes and guarantees, against a real redis-server, through the
//! library's StockStore (the same calls the gateway makes).

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, ConfirmMode};
use flashgate::stock::prelude::*;
use flashgate::stock::segments::{self, Refusal};
use flashgate::stock::{
    ConfirmOutcome, ConfirmedVia, Layout, RecordState, ReleaseMode, ReleaseOutcome, ReserveCall,
    ReserveOutcome, SaleHours, Segment, StockStore, StoreError,
};
use flashgate::stock::{Deposit, ReleaseReason};
use std::time::{Duration, Instant};
use support::*;

/// Units left after a reserve that took them; `None` for any other outcome.
fn left(outcome: ReserveOutcome) -> Option<u64> {
    match outcome {
        ReserveOutcome::Reserved { remaining, .. } => Some(remaining),
        _ => None,
    }
}

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

/// The one segment of an activity that is not segmented.
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

/// A sale in phases: the step in force by Redis's clock gives the buyer's limit (one units
/// limit over every step), nothing is taken before the first step, and each step's units are
/// counted in the ledger's `sold@<phase>`.
#[tokio::test]
async fn a_buyers_phase_by_redis_clock_sets_their_limit_and_is_counted() {
    let f = Fixture::start();
    let a = activity("1001", 10, 1, 3);
    prewarm(&f.store, &a).await;
    let l = Layout::of(&a);
    let now = redis_time_ms(&f.redis) as i64;
    let hour = 3_600_000;
    let later = flashgate::stock::Steps::new([(now + hour, 3, "public")]);
    let member =
        flashgate::stock::Steps::new([(now - hour, 1, "members"), (now + hour, 3, "public")]);
    let with = |steps: &'static flashgate::stock::Steps, user: &'static str, id: &'static str| {
        ReserveCall {
            steps: Some(steps),
            line: false,
            ..call(&a, user, 1, id)
        }
    };
    let later: &'static _ = Box::leak(Box::new(later));
    let member: &'static _ = Box::leak(Box::new(member));
    assert_eq!(
        f.store
            .reserve(one(&l), &with(later, "plain", "r1"))
            .await
            .unwrap(),
        ReserveOutcome::NotStarted
    );
    assert!(matches!(
        f.store
            .reserve(one(&l), &with(member, "gold", "r2"))
            .await
            .unwrap(),
        ReserveOutcome::Reserved { remaining: 9, .. }
    ));
    // The members step's limit (1), though the call's own is 3.
    assert!(matches!(
        f.store
            .reserve(one(&l), &with(member, "gold", "r3"))
            .await
            .unwrap(),
        ReserveOutcome::LimitExceeded { held: 1 }
    ));
    // In a batch, each buyer judged by their own steps.
    let public = Box::leak(Box::new(flashgate::stock::Steps::new([(
        now - 1,
        3,
        "public",
    )])));
    let (c4, c5) = (with(public, "p1", "r4"), with(public, "p1", "r5"));
    let (x, y) = tokio::join!(f.store.reserve(one(&l), &c4), f.store.reserve(one(&l), &c5),);
    assert!(matches!(x.unwrap(), ReserveOutcome::Reserved { .. }));
    assert!(matches!(y.unwrap(), ReserveOutcome::Reserved { .. }));
    // Buyers of different steps interleaved in one batch: each judged by their own (the
    // script keeps the last steps at hand and the others by string).
    let (c6, c7, c8) = (
        with(member, "g6", "r6"),
        with(later, "l7", "r7"),
        with(member, "g8", "r8"),
    );
    let (x, y, z) = tokio::join!(
        f.store.reserve(one(&l), &c6),
        f.store.reserve(one(&l), &c7),
        f.store.reserve(one(&l), &c8),
    );
    assert!(matches!(x.unwrap(), ReserveOutcome::Reserved { .. }));
    assert_eq!(y.unwrap(), ReserveOutcome::NotStarted);
    assert!(matches!(z.unwrap(), ReserveOutcome::Reserved { .. }));
    let key = "fg:{1001}:v1:ledger";
    let sold: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg(key)
        .arg(&["sold@members", "sold@public", "sold@none"][..])
        .query(&mut f.redis.conn())
        .unwrap();
    assert_eq!(sold, [Some(3), Some(2), None]);
    assert_eq!(remaining(&f.store, &a).await, Some(5));
    assert_eq!(ledger(&f.store, &a, 1).await.drift(), 0);
}

/// The second-chance line on the real scripts: joined in order once sold out (never while
/// units are on sale and nobody waits, never by a buyer at the limit); while anyone waits, only
/// a holder buys (one unit) and leaves the line, everyone else is told the units are the
/// line's; a hold that ran out passes the unit on; an empty line sells to anyone again.
#[tokio::test]
async fn the_line_holds_returned_units_for_its_buyers_in_order() {
    use flashgate::stock::{LineAnswer, LineAsk};
    let f = Fixture::start();
    let a = Activity {
        second_chance: Some(Duration::from_secs(60)),
        ..activity("1001", 1, 1, 1)
    };
    prewarm(&f.store, &a).await;
    let l = Layout::of(&a);
    let buy = |user: &'static str, qty: u32, id: &'static str| ReserveCall {
        line: true,
        ..call(&a, user, qty, id)
    };
    let line = |ask, user: &'static str| f.store.line(&a, ask, user);
    // On sale, nobody waiting: no line to join.
    assert_eq!(
        line(LineAsk::Join, "a").await.unwrap().answer,
        LineAnswer::NotSoldOut
    );
    assert!(matches!(
        f.store.reserve(one(&l), &buy("w", 1, "r1")).await.unwrap(),
        ReserveOutcome::Reserved { remaining: 0, .. }
    ));
    // Sold out: a, then b; joining again keeps the place; the winner is at the limit.
    assert_eq!(line(LineAsk::Join, "a").await.unwrap().place, 1);
    assert_eq!(line(LineAsk::Join, "b").await.unwrap().place, 2);
    assert_eq!(line(LineAsk::Join, "a").await.unwrap().place, 1);
    assert_eq!(
        line(LineAsk::Join, "w").await.unwrap().answer,
        LineAnswer::AtLimit
    );
    // A unit comes back: a's, held; b and a stranger are told it is the line's.
    assert!(matches!(
        release(&f.store, &a, 1, "r1", ReleaseMode::Admin).await,
        ReleaseOutcome::Released { .. }
    ));
    let held = line(LineAsk::Poll, "a").await.unwrap();
    assert_eq!((held.place, held.held), (1, 1));
    assert!(
        held.hold_left_ms > 0 && held.hold_left_ms <= 60_000,
        "{held:?}"
    );
    assert_eq!(line(LineAsk::Poll, "b").await.unwrap().hold_left_ms, 0);
    for (user, qty, id) in [("b", 1, "r2"), ("x", 1, "r3"), ("a", 2, "r4")] {
        assert_eq!(
            f.store.reserve(one(&l), &buy(user, qty, id)).await.unwrap(),
            ReserveOutcome::HeldForLine { remaining: 1 },
            "{user}"
        );
    }
    assert!(matches!(
        f.store.reserve(one(&l), &buy("a", 1, "r5")).await.unwrap(),
        ReserveOutcome::Reserved { remaining: 0, .. }
    ));
    assert_eq!(
        line(LineAsk::Poll, "a").await.unwrap().answer,
        LineAnswer::NotInLine
    );
    assert_eq!(line(LineAsk::Poll, "b").await.unwrap().place, 1);
    // Another comes back (a release of the holder's own); b holds it but lets it run out:
    // b leaves the line, which is empty, and the unit is anyone's.
    assert!(matches!(
        release(&f.store, &a, 1, "r5", ReleaseMode::Admin).await,
        ReleaseOutcome::Released { .. }
    ));
    assert!(line(LineAsk::Advance, "").await.unwrap().held == 1);
    let holds = "fg:{1001}:line:holds";
    let _: () = redis::cmd("HSET")
        .arg(holds)
        .arg("b")
        .arg(1)
        .query(&mut f.redis.conn())
        .unwrap();
    let moved = line(LineAsk::Advance, "").await.unwrap();
    assert_eq!((moved.waiting, moved.held), (0, 0));
    assert!(matches!(
        f.store.reserve(one(&l), &buy("x", 1, "r6")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let counts: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg("fg:{1001}:v1:ledger")
        .arg(&["line_sold", "line_lapsed"][..])
        .query(&mut f.redis.conn())
        .unwrap();
    assert_eq!(counts, [Some(1), Some(1)]);
    assert_eq!(ledger(&f.store, &a, 1).await.drift(), 0);
}

/// While the activity is halted nobody can buy: its line stands, a hold whose window passed
/// meanwhile is kept (whole again), and after the resume it is still the holder's.
#[tokio::test]
async fn a_halted_line_stands_still() {
    use flashgate::stock::LineAsk;
    let f = Fixture::start();
    let a = Activity {
        second_chance: Some(Duration::from_secs(60)),
        ..activity("1001", 1, 1, 1)
    };
    prewarm(&f.store, &a).await;
    let l = Layout::of(&a);
    let taken = ReserveCall {
        line: true,
        ..call(&a, "w", 1, "r1")
    };
    assert!(matches!(
        f.store.reserve(one(&l), &taken).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    for user in ["a", "b"] {
        f.store.line(&a, LineAsk::Join, user).await.unwrap();
    }
    release(&f.store, &a, 1, "r1", ReleaseMode::Admin).await;
    assert!(
        f.store
            .line(&a, LineAsk::Poll, "a")
            .await
            .unwrap()
            .hold_left_ms
            > 0
    );
    let mut conn = f.redis.conn();
    let _: () = redis::cmd("SET")
        .arg("fg:{1001}:halt")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:line:holds")
        .arg("a")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let held = f.store.line(&a, LineAsk::Advance, "").await.unwrap();
    assert_eq!((held.waiting, held.held), (2, 1), "{held:?}");
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:halt")
        .query(&mut conn)
        .unwrap();
    let a_now = f.store.line(&a, LineAsk::Poll, "a").await.unwrap();
    assert_eq!(a_now.place, 1);
    assert!(a_now.hold_left_ms > 50_000, "{a_now:?}");
}

/// A test's own redis-server and a stock store on it (read through it as a `StockStore`).
struct Fixture {
    redis: RedisServer,
    store: StockStore,
}

impl Fixture {
    /// A fresh redis-server and a store on it (a 1 s timeout), nothing on sale.
    fn start() -> Fixture {
        let redis = RedisServer::start();
        let store = store(redis.url(), 1000);
        Fixture { redis, store }
    }

    /// As [`Fixture::start`], with `a` put on sale.
    async fn on_sale(a: &Activity) -> Fixture {
        let f = Fixture::start();
        prewarm(&f.store, a).await;
        f
    }
}

impl std::ops::Deref for Fixture {
    type Target = StockStore;

    fn deref(&self) -> &StockStore {
        &self.store
    }
}

async fn prewarm(s: &StockStore, a: &Activity) -> segments::Prewarmed {
    segments::prewarm(s, a).await.unwrap().unwrap()
}

async fn reserve(s: &StockStore, a: &Activity, user: &str, qty: u32, id: &str) -> ReserveOutcome {
    let l = Layout::of(a);
    s.reserve(one(&l), &call(a, user, qty, id)).await.unwrap()
}

async fn release(
    s: &StockStore,
    a: &Activity,
    v: u64,
    id: &str,
    mode: ReleaseMode,
) -> ReleaseOutcome {
    let l = Layout::of(a);
    // The reason each caller gives in production.
    let reason = match mode {
        ReleaseMode::Owner => ReleaseReason::Upstream5xx,
        ReleaseMode::Abandon => ReleaseReason::StoreTimeout,
        ReleaseMode::Lookup { .. } => ReleaseReason::OrderNotFound,
        ReleaseMode::Admin => ReleaseReason::Admin,
    };
    s.release(one(&l), v, id, mode, reason).await.unwrap()
}

async fn confirm(s: &StockStore, a: &Activity, v: u64, id: &str) -> ConfirmOutcome {
    let l = Layout::of(a);
    s.confirm(one(&l), v, &[id], ConfirmedVia::Admin)
        .await
        .unwrap()[0]
}

/// One confirm call via upstream for version 1 of `a`, carrying `ids` as one batch.
async fn confirm_batch(
    s: &StockStore,
    a: &Activity,
    ids: &[&str],
) -> Result<Vec<ConfirmOutcome>, StoreError> {
    let l = Layout::of(a);
    s.confirm(one(&l), 1, ids, ConfirmedVia::Upstream).await
}

async fn remaining(s: &StockStore, a: &Activity) -> Option<i64> {
    let l = Layout::of(a);
    s.remaining(one(&l), a.version).await.unwrap()
}

async fn record(s: &StockStore, a: &Activity, id: &str) -> flashgate::stock::ReservationRecord {
    let l = Layout::of(a);
    s.lookup(one(&l), id).await.unwrap().expect("record")
}

async fn ledger(s: &StockStore, a: &Activity, v: u64) -> flashgate::stock::LedgerRow {
    let l = Layout::of(a);
    s.ledger(one(&l), v).await.unwrap()
}

/// Moves a reservation's hold deadline (in its record, activity 1001) into the past.
fn deadline_passed(redis: &RedisServer, id: &str) {
    set_deadline(redis, id, 1);
}

/// Sets a reservation's hold deadline (in its record, activity 1001), unix ms.
fn set_deadline(redis: &RedisServer, id: &str, ms: u64) {
    let mut conn = redis.conn();
    let raw: String = redis::cmd("HGET")
        .arg("fg:{1001}:res")
        .arg(id)
        .query(&mut conn)
        .unwrap();
    let mut fields: Vec<&str> = raw.splitn(12, '|').collect();
    let ms = ms.to_string();
    fields[4] = &ms;
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:res")
        .arg(id)
        .arg(fields.join("|"))
        .query(&mut conn)
        .unwrap();
}

fn redis_time_ms(redis: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
    secs * 1000 + micros / 1000
}

#[tokio::test]
async fn reserve_return_codes() {
    let s = Fixture::start();
    let a = activity("1001", 3, 1, 3);

    assert_eq!(
        reserve(&s, &a, "u1", 1, "r0").await,
        ReserveOutcome::NoStockKey,
        "-1 before prewarm"
    );
    assert_eq!(prewarm(&s, &a).await.created, 1);
    assert_eq!(left(reserve(&s, &a, "u1", 2, "r1").await), Some(1));
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
    assert_eq!(left(reserve(&s, &a, "u1", 1, "r4").await), Some(0));

    // Prewarm again never resets sold stock.
    assert_eq!(prewarm(&s, &a).await.created, 0);
    assert_eq!(remaining(&s, &a).await, Some(0));

    // The record of a reservation is in Redis, pending, with the version, and its times come
    // from Redis's clock.
    let rec = record(&s, &a, "r1").await;
    assert_eq!((rec.user.as_str(), rec.qty, rec.ver), ("u1", 2, 1));
    assert_eq!(rec.state, RecordState::Pending);
    assert_eq!(
        rec.deadline_ms.unwrap() - rec.created_ms.unwrap(),
        900_000,
        "hold from the configuration"
    );
    assert!(rec.created_ms.unwrap().abs_diff(redis_time_ms(&s.redis)) < 5_000);
    // Every key expires a day after the sale ends, from the first reserve on, but the floor
    // (the newest version ever claimed: a few bytes per activity, for ever).
    let mut conn = s.redis.conn();
    let expected = a.ends_at.timestamp() + 86_400;
    let keys: Vec<String> = redis::cmd("KEYS").arg("fg:*").query(&mut conn).unwrap();
    assert!(keys.len() >= 10, "{keys:?}");
    for key in keys {
        let at: i64 = redis::cmd("EXPIRETIME").arg(&key).query(&mut conn).unwrap();
        if key == "fg:{1001}:floor" {
            assert_eq!(at, -1, "{key} never expires");
            let floor: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
            assert_eq!(floor, "1");
        } else {
            assert_eq!(at, expected, "{key}");
        }
    }
}

#[tokio::test]
async fn stock_is_compared_as_a_number() {
    let a = activity("num", 10, 1, 9);
    let s = Fixture::on_sale(&a).await;
    // As strings "10" < "9"; as numbers 10 >= 9.
    assert_eq!(left(reserve(&s, &a, "u", 9, "r").await), Some(1));
}

#[tokio::test]
async fn release_return_codes_and_exactly_once() {
    let a = activity("1001", 5, 2, 2);
    let s = Fixture::on_sale(&a).await;
    assert!(matches!(
        reserve(&s, &a, "u1", 2, "r1").await,
        ReserveOutcome::Reserved { remaining: 3, .. }
    ));

    let owner = ReleaseMode::Owner;
    assert_eq!(
        release(&s, &a, 1, "r1", owner).await,
        ReleaseOutcome::VersionMismatch,
        "-2"
    );
    assert_eq!(
        release(&s, &a, 2, "r1", owner).await,
        ReleaseOutcome::Released { remaining: Some(5) }
    );
    assert_eq!(
        release(&s, &a, 2, "r1", owner).await,
        ReleaseOutcome::AlreadyReleased,
        "0: exactly once"
    );
    assert_eq!(remaining(&s, &a).await, Some(5));
    assert_eq!(
        release(&s, &a, 2, "nope", owner).await,
        ReleaseOutcome::Unknown,
        "-1"
    );
    let l = Layout::of(&a);
    assert!(
        s.lookup(one(&l), "nope").await.unwrap().is_none(),
        "a plain release of an unknown id writes nothing"
    );
    // The user's units came back too: they can take their full limit again.
    assert!(matches!(
        reserve(&s, &a, "u1", 2, "r2").await,
        ReserveOutcome::Reserved { .. }
    ));
}

#[tokio::test]
async fn only_an_admin_release_gives_back_a_confirmed_sale() {
    let a = activity("1001", 5, 1, 1);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    assert_eq!(confirm(&s, &a, 1, "r1").await, ConfirmOutcome::Confirmed);
    for mode in [
        ReleaseMode::Owner,
        ReleaseMode::Abandon,
        ReleaseMode::Lookup { fence: 1 },
    ] {
        assert_eq!(
            release(&s, &a, 1, "r1", mode).await,
            ReleaseOutcome::KeptConfirmed,
            "{mode:?}"
        );
    }
    assert_eq!(remaining(&s, &a).await, Some(4));
    assert_eq!(
        release(&s, &a, 1, "r1", ReleaseMode::Admin).await,
        ReleaseOutcome::Released { remaining: Some(5) }
    );
    assert_eq!(ledger(&s, &a, 1).await.drift(), 0);
}

#[tokio::test]
async fn release_never_resurrects_a_removed_stock_key() {
    let a = activity("1001", 5, 1, 1);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    let mut conn = s.redis.conn();
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        release(&s, &a, 1, "r1", ReleaseMode::Owner).await,
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
    let row = ledger(&s, &a, 1).await;
    assert_eq!((row.pending, row.released, row.retired), (0, 1, 1));
    assert_eq!(record(&s, &a, "r1").await.returned, Some(false));
    // And prewarm refuses to re-create a stock key the segment knows it had.
    assert_eq!(prewarm(&s, &a).await.stock_key_removed, vec![0]);
    let exists: bool = redis::cmd("EXISTS")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn abandoning_an_id_first_makes_a_late_reserve_impossible() {
    let a = activity("1001", 5, 1, 1);
    let s = Fixture::on_sale(&a).await;
    // The reserve "timed out" before reaching Redis: the abandon lands first.
    assert_eq!(
        release(&s, &a, 1, "late", ReleaseMode::Abandon).await,
        ReleaseOutcome::Unknown
    );
    assert_eq!(
        reserve(&s, &a, "u1", 1, "late").await,
        ReserveOutcome::DuplicateId
    );
    assert_eq!(remaining(&s, &a).await, Some(5));
    // The reserve landed first: the abandon gives it back.
    reserve(&s, &a, "u2", 1, "landed").await;
    assert_eq!(
        release(&s, &a, 1, "landed", ReleaseMode::Abandon).await,
        ReleaseOutcome::Released { remaining: Some(5) }
    );
}

#[tokio::test]
async fn a_replayed_reservation_is_never_released_by_its_maker_nor_by_an_abandon() {
    // #12 defects 1 and 6: the request that made a reservation (or the background release of a
    // reserve whose reply was lost) must not give it back once a replay handed it on.
    let a = activity("1001", 5, 1, 1);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    let keyed = |id: &'static str| ReserveCall {
        idempotency_key: Some("k"),
        ..call(&a, "u1", 1, id)
    };
    assert!(matches!(
        s.reserve(one(&l), &keyed("r1")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // The buyer retries with the same key: r1 comes back, now claimed by the replay.
    assert!(matches!(
        s.reserve(one(&l), &keyed("r2")).await.unwrap(),
        ReserveOutcome::Replayed { ref id, .. } if id == "r1"
    ));
    assert!(record(&s, &a, "r1").await.replayed);
    for mode in [ReleaseMode::Owner, ReleaseMode::Abandon] {
        assert_eq!(
            release(&s, &a, 1, "r1", mode).await,
            ReleaseOutcome::KeptReplayed,
            "{mode:?}"
        );
    }
    // The replay's 2xx confirms; a late abandon still changes nothing.
    assert_eq!(confirm(&s, &a, 1, "r1").await, ConfirmOutcome::Confirmed);
    assert_eq!(
        release(&s, &a, 1, "r1", ReleaseMode::Abandon).await,
        ReleaseOutcome::KeptConfirmed
    );
    assert_eq!(remaining(&s, &a).await, Some(4));
    assert_eq!(
        reserve(&s, &a, "u1", 1, "r3").await,
        ReserveOutcome::LimitExceeded { held: 1 },
        "the user still holds their unit"
    );
    // The backend's "no such order" may release a pending replayed one (not a confirmed one).
    let b = ReserveCall {
        idempotency_key: Some("k"),
        ..call(&a, "u2", 1, "r4")
    };
    s.reserve(one(&l), &b).await.unwrap();
    s.reserve(
        one(&l),
        &ReserveCall {
            reservation_id: "r5",
            ..b
        },
    )
    .await
    .unwrap();
    // Only under the fence the lookup's hand-out saw: the replay moved it from 1 to 2, so an
    // answer asked before the replay is discarded.
    assert_eq!(
        release(&s, &a, 1, "r4", ReleaseMode::Lookup { fence: 1 }).await,
        ReleaseOutcome::Fenced
    );
    // Nor before its hold deadline: its token is still valid, a slow backend may still take it.
    assert_eq!(
        release(&s, &a, 1, "r4", ReleaseMode::Lookup { fence: 2 }).await,
        ReleaseOutcome::TooEarly
    );
    deadline_passed(&s.redis, "r4");
    assert!(matches!(
        release(&s, &a, 1, "r4", ReleaseMode::Lookup { fence: 2 }).await,
        ReleaseOutcome::Released { .. }
    ));
    assert_eq!(ledger(&s, &a, 1).await.drift(), 0);
}

#[tokio::test]
async fn a_reserve_landing_after_a_newer_attempt_with_the_same_key_replays_it() {
    // The first attempt's reply was lost and it reached Redis late: by then the retry with the
    // same key had reserved. The late reserve must not make a second reservation for the key.
    let a = activity("1001", 5, 1, 2);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    let keyed = |id: &'static str| ReserveCall {
        idempotency_key: Some("k"),
        ..call(&a, "u1", 1, id)
    };
    s.reserve(one(&l), &keyed("retry")).await.unwrap();
    assert!(matches!(
        s.reserve(one(&l), &keyed("late")).await.unwrap(),
        ReserveOutcome::Replayed { ref id, .. } if id == "retry"
    ));
    assert_eq!(
        release(&s, &a, 1, "late", ReleaseMode::Abandon).await,
        ReleaseOutcome::Unknown,
        "the late id never reserved; its abandon tombstones it"
    );
    assert_eq!(remaining(&s, &a).await, Some(4));
}

#[tokio::test]
async fn scripts_survive_script_flush() {
    let s = Fixture::start();
    let a = activity("1001", 5, 1, 1);
    s.ready().await.unwrap();
    prewarm(&s, &a).await;
    let mut conn = s.redis.conn();
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
    let l = Layout::of(&a);
    let started = Instant::now();
    let err = s
        .reserve(one(&l), &call(&a, "u", 1, "r"))
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
    let a = activity("1001", 10, 1, 5);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 2, "r1").await;
    reserve(&s, &a, "u2", 3, "r2").await;
    assert_eq!(
        confirm(&s, &a, 2, "r1").await,
        ConfirmOutcome::VersionMismatch
    );
    assert_eq!(confirm(&s, &a, 1, "r1").await, ConfirmOutcome::Confirmed);
    assert_eq!(
        confirm(&s, &a, 1, "r1").await,
        ConfirmOutcome::AlreadyConfirmed
    );
    assert_eq!(confirm(&s, &a, 1, "nope").await, ConfirmOutcome::Unknown);
    release(&s, &a, 1, "r2", ReleaseMode::Admin).await;
    assert_eq!(confirm(&s, &a, 1, "r2").await, ConfirmOutcome::Released);

    let row = ledger(&s, &a, 1).await;
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

    // A confirmed reservation can still be released by an admin (an order cancelled after
    // payment).
    assert!(matches!(
        release(&s, &a, 1, "r1", ReleaseMode::Admin).await,
        ReleaseOutcome::Released {
            remaining: Some(10)
        }
    ));
    let row = ledger(&s, &a, 1).await;
    assert_eq!(
        (row.remaining, row.confirmed, row.released, row.drift()),
        (10, 0, 5, 0)
    );
}

/// A private Redis, its store, and activity 1001 (10 units, one each) prewarmed, with `n`
/// reservations: r0, r1... for u0, u1...
async fn with_reservations(n: usize) -> (RedisServer, StockStore, Activity) {
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 10, 1, 1);
    prewarm(&s, &a).await;
    for i in 0..n {
        reserve(&s, &a, &format!("u{i}"), 1, &format!("r{i}")).await;
    }
    (redis, s, a)
}

#[tokio::test]
async fn one_confirm_call_settles_a_batch() {
    let (_redis, s, a) = with_reservations(5).await;
    release(&s, &a, 1, "r3", ReleaseMode::Owner).await;
    let outcomes = confirm_batch(&s, &a, &["r0", "r1", "r0", "r3", "nope"])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            ConfirmOutcome::Confirmed,
            ConfirmOutcome::Confirmed,
            ConfirmOutcome::AlreadyConfirmed,
            // The backend took r3 after its release: accepted late, covered from stock.
            ConfirmOutcome::LateCovered,
            ConfirmOutcome::Unknown
        ]
    );
    let row = ledger(&s, &a, 1).await;
    assert_eq!(
        (row.pending, row.confirmed, row.late_accepted, row.drift()),
        (2, 3, 1, 0)
    );
}

/// The batch reads its records in one HMGET and writes them in one HSET at the end: what each id
/// became must still be exactly what one call per id would leave (the pending set, the records,
/// one event per confirm), and an events key of the wrong type fails the call before any write.
#[tokio::test]
async fn a_confirm_batch_leaves_what_one_call_per_id_would() {
    let (redis, s, a) = with_reservations(4).await;
    let mut conn = redis.conn();
    // The pending ids (without the set's marker, which prewarm keeps in it).
    let pending = |conn: &mut redis::Connection| -> Vec<String> {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg("fg:{1001}:v1:pending")
            .arg(0)
            .arg(-1)
            .query(conn)
            .unwrap();
        ids.into_iter().filter(|id| !id.is_empty()).collect()
    };

    // Events of the wrong type: refused before anything is written.
    let _: () = redis::cmd("RENAME")
        .arg("fg:{1001}:events")
        .arg("fg:{1001}:events-kept")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("fg:{1001}:events")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let err = confirm_batch(&s, &a, &["r0", "r1"]).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    assert_eq!(pending(&mut conn).len(), 4, "nothing confirmed");
    assert_eq!(ledger(&s, &a, 1).await.confirmed, 0);
    let _: () = redis::cmd("RENAME")
        .arg("fg:{1001}:events-kept")
        .arg("fg:{1001}:events")
        .query(&mut conn)
        .unwrap();

    let outcomes = confirm_batch(&s, &a, &["r2", "r0", "r2", "r0", "gone"])
        .await
        .unwrap();
    use ConfirmOutcome::*;
    assert_eq!(
        outcomes,
        [
            Confirmed,
            Confirmed,
            AlreadyConfirmed,
            AlreadyConfirmed,
            Unknown
        ]
    );
    assert_eq!(pending(&mut conn), ["r1", "r3"]);
    for (id, state) in [("r0", "confirmed"), ("r1", "pending"), ("r2", "confirmed")] {
        let raw: String = redis::cmd("HGET")
            .arg("fg:{1001}:res")
            .arg(id)
            .query(&mut conn)
            .unwrap();
        assert!(raw.starts_with(&format!("{state}|1|1|")), "{id}: {raw}");
    }
    let row = ledger(&s, &a, 1).await;
    assert_eq!((row.pending, row.confirmed, row.drift()), (2, 2, 0));
    let jtis: Vec<String> = reservation_events(&mut conn, "fg:{1001}:events")
        .into_iter()
        .filter(|(_, kind)| kind == "confirm")
        .map(|(jti, _)| jti)
        .collect();
    assert_eq!(jtis, ["r2", "r0"], "one event per confirm, in order");
    // A second call finds them confirmed and changes nothing.
    let again = confirm_batch(&s, &a, &["r0", "r2"]).await.unwrap();
    assert_eq!(again, [AlreadyConfirmed, AlreadyConfirmed]);
    assert_eq!(ledger(&s, &a, 1).await.confirmed, 2);
}

/// Review findings on the batched confirm: a key damaged by hand that fails the call midway
/// left a reservation out of the pending set yet still pending (the sweep would never end it),
/// with its event emitted: a ledger count that was no integer, or a late acceptance failing
/// after an earlier confirm in the batch. And a cover made earlier in a batch is what a later
/// mention of its id sees.
#[tokio::test]
async fn regression_a_confirm_batch_failing_midway_strands_no_reservation() {
    let (redis, s, a) = with_reservations(3).await;
    release(&s, &a, 1, "r2", ReleaseMode::Owner).await;
    let mut conn = redis.conn();
    let record = |conn: &mut redis::Connection, id: &str| -> String {
        redis::cmd("HGET")
            .arg("fg:{1001}:res")
            .arg(id)
            .query(conn)
            .unwrap()
    };
    let in_pending = |conn: &mut redis::Connection, id: &str| -> bool {
        redis::cmd("ZSCORE")
            .arg("fg:{1001}:v1:pending")
            .arg(id)
            .query::<Option<f64>>(conn)
            .unwrap()
            .is_some()
    };
    let events = |conn: &mut redis::Connection| -> usize {
        redis::cmd("XLEN")
            .arg("fg:{1001}:events")
            .query(conn)
            .unwrap()
    };
    let events_before = events(&mut conn);
    // A late acceptance failing on a damaged stock after a confirm in the same batch: the
    // confirm is not half done.
    let stock: String = redis::cmd("GET")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("fg:{1001}:v1:stock")
        .arg("abc")
        .query(&mut conn)
        .unwrap();
    assert!(confirm_batch(&s, &a, &["r0", "r2"]).await.is_err());
    assert!(record(&mut conn, "r0").starts_with("pending|"));
    assert!(in_pending(&mut conn, "r0"));
    assert_eq!(
        events(&mut conn),
        events_before,
        "no event for what was not written"
    );
    let _: () = redis::cmd("SET")
        .arg("fg:{1001}:v1:stock")
        .arg(&stock)
        .query(&mut conn)
        .unwrap();

    // Healthy again: the cover made for r2 is what the batch's later mention of it sees.
    use ConfirmOutcome::*;
    let outcomes = confirm_batch(&s, &a, &["r2-late", "r0", "r2", "r2-late"])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [Unknown, Confirmed, LateCovered, AlreadyConfirmed]
    );
    assert!(!in_pending(&mut conn, "r0"));
    assert_eq!(ledger(&s, &a, 1).await.drift(), 0);
    // A ledger count that is no integer, by hand: HINCRBY fails after the record is written.
    // The reservation is confirmed, or still pending in the pending set; never pending out of
    // it, where the sweep would never end it.
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:v1:ledger")
        .arg("pending")
        .arg("zz")
        .query(&mut conn)
        .unwrap();
    assert!(confirm_batch(&s, &a, &["r1"]).await.is_err());
    let r1 = record(&mut conn, "r1");
    assert!(
        r1.starts_with("confirmed|") || (r1.starts_with("pending|") && in_pending(&mut conn, "r1")),
        "{r1}"
    );
}

#[tokio::test]
async fn sweep_releases_only_expired_pending_reservations_in_batches() {
    let s = Fixture::start();
    let mut a = activity("1001", 100, 1, 1);
    a.hold = Duration::ZERO; // already due when made (by Redis's clock)
    prewarm(&s, &a).await;
    for i in 0..25 {
        reserve(&s, &a, &format!("u{i}"), 1, &format!("r{i}")).await;
    }
    confirm(&s, &a, 1, "r0").await;
    let long = Activity {
        hold: Duration::from_secs(900),
        ..activity("1001", 100, 1, 1)
    };
    reserve(&s, &long, "later", 1, "r-later").await;

    let l = Layout::of(&a);
    let sweep = || s.sweep(one(&l), 1, 10, None);
    let first = sweep().await.unwrap();
    assert_eq!((first.released, first.scanned), (10, 10));
    let second = sweep().await.unwrap();
    let third = sweep().await.unwrap();
    assert_eq!(
        first.released + second.released + third.released,
        24,
        "all expired but the confirmed one"
    );
    assert_eq!(sweep().await.unwrap().released, 0, "exactly once");
    let row = ledger(&s, &a, 1).await;
    assert_eq!(
        (row.remaining, row.pending, row.confirmed, row.released),
        (98, 1, 1, 24)
    );
    assert_eq!(row.drift(), 0);
    assert_eq!(
        record(&s, &a, "r5").await.reason.as_deref(),
        Some("expired")
    );
    assert_eq!(record(&s, &a, "r-later").await.state, RecordState::Pending);
}

#[tokio::test]
async fn a_sweep_with_an_order_lookup_hands_out_what_is_due_instead_of_releasing_it() {
    let s = Fixture::start();
    let mut a = activity("1001", 10, 1, 1);
    a.hold = Duration::ZERO;
    prewarm(&s, &a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    let l = Layout::of(&a);
    let lease = flashgate::stock::LookupLease {
        lease: Duration::from_secs(60),
        give_up_after: None,
    };
    let first = s.sweep(one(&l), 1, 10, Some(lease)).await.unwrap();
    assert_eq!(
        (first.released, first.for_lookup.clone()),
        (
            0,
            vec![flashgate::stock::Leased {
                id: "r1".to_owned(),
                fence: 2
            }]
        )
    );
    // Leased: another instance's sweep does not ask again until the lease runs out.
    let second = s.sweep(one(&l), 1, 10, Some(lease)).await.unwrap();
    assert!(second.for_lookup.is_empty());
    assert_eq!(record(&s, &a, "r1").await.state, RecordState::Pending);
    // Past its give-up time an unanswered reservation is released as expired.
    let mut conn = s.redis.conn();
    let _: () = redis::cmd("ZADD")
        .arg("fg:{1001}:v1:pending")
        .arg(0)
        .arg("r1")
        .query(&mut conn)
        .unwrap();
    let give_up = flashgate::stock::LookupLease {
        give_up_after: Some(Duration::ZERO),
        ..lease
    };
    let third = s.sweep(one(&l), 1, 10, Some(give_up)).await.unwrap();
    assert_eq!((third.released, third.for_lookup.len()), (1, 0));
}

#[tokio::test]
async fn idempotency_key_replays_the_same_reservation() {
    let a = activity("1001", 10, 1, 1);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    let req = |id: &'static str, key: &'static str| ReserveCall {
        idempotency_key: Some(key),
        ..call(&a, "u1", 1, id)
    };
    assert!(matches!(
        s.reserve(one(&l), &req("r1", "k")).await.unwrap(),
        ReserveOutcome::Reserved { remaining: 9, .. }
    ));
    // The retry gets r1 back, takes nothing more.
    assert!(matches!(
        s.reserve(one(&l), &req("r2", "k")).await.unwrap(),
        ReserveOutcome::Replayed {
            ref id,
            qty: 1,
            version: 1,
            remaining: Some(9),
            ..
        } if id == "r1"
    ));
    // Another key of the same user is a new purchase: over the limit.
    assert!(matches!(
        s.reserve(one(&l), &req("r3", "other")).await.unwrap(),
        ReserveOutcome::LimitExceeded { .. }
    ));
    // The same key of another user is theirs alone.
    let bob = ReserveCall {
        user: "bob",
        ..req("r4", "k")
    };
    assert!(matches!(
        s.reserve(one(&l), &bob).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // Once released, the key buys afresh.
    release(&s, &a, 1, "r1", ReleaseMode::Admin).await;
    assert!(matches!(
        s.reserve(one(&l), &req("r5", "k")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(ledger(&s, &a, 1).await.drift(), 0);
}

#[tokio::test]
async fn every_transition_appends_exactly_one_event() {
    let a = activity("1001", 10, 1, 2);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    reserve(&s, &a, "u2", 2, "r2").await;
    confirm(&s, &a, 1, "r1").await;
    confirm(&s, &a, 1, "r1").await; // no-op: no event
    release(&s, &a, 1, "r2", ReleaseMode::Owner).await;
    release(&s, &a, 1, "r2", ReleaseMode::Owner).await; // no-op: no event
    reserve(&s, &a, "u3", 5, "refused").await; // refused: no event

    let mut conn = s.redis.conn();
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
async fn a_new_version_retires_the_old_one_and_late_releases_are_retired() {
    let s = Fixture::start();
    let v1 = activity("1001", 5, 1, 1);
    prewarm(&s, &v1).await;
    reserve(&s, &v1, "u1", 1, "r1").await;
    // Operations bump the version: v2 goes on sale, v1 retires: its 4 units left are counted
    // retired and can never sell again, in v1 or v2.
    let v2 = activity("1001", 10, 2, 1);
    assert_eq!(prewarm(&s, &v2).await.created, 1);
    assert_eq!(remaining(&s, &v1).await, None);
    assert_eq!(
        reserve(&s, &v1, "u2", 1, "r-old").await,
        ReserveOutcome::NoStockKey,
        "an instance still on v1 sells nothing"
    );
    assert_eq!(
        release(&s, &v2, 1, "r1", ReleaseMode::Admin).await,
        ReleaseOutcome::Released { remaining: None }
    );
    let row = ledger(&s, &v2, 1).await;
    assert_eq!(
        (row.stock_key, row.pending, row.released, row.retired),
        (false, 0, 1, 5)
    );
    assert_eq!(row.drift(), 0);
    assert_eq!(ledger(&s, &v2, 2).await.remaining, 10, "v2 untouched");
    // The per-user limit spans versions: u1 got their unit back, u9 never had one.
    assert!(matches!(
        reserve(&s, &v2, "u1", 1, "r2").await,
        ReserveOutcome::Reserved { .. }
    ));
}

#[tokio::test]
async fn an_older_configuration_never_puts_a_retired_version_back_on_sale() {
    let s = Fixture::start();
    prewarm(&s, &activity("1001", 5, 2, 1)).await;
    let old = activity("1001", 5, 1, 1);
    assert_eq!(
        segments::prewarm(&s, &old).await.unwrap(),
        Err(Refusal::OlderVersion {
            id: "1001".into(),
            configured: 1,
            newest: 2
        })
    );
    assert_eq!(remaining(&s, &old).await, None);
    let message = Refusal::OlderVersion {
        id: "1001".into(),
        configured: 1,
        newest: 2,
    }
    .to_string();
    assert!(message.contains("1001") && message.contains("version 1") && message.contains("2"));
}

#[tokio::test]
async fn the_segment_count_is_fixed_for_the_life_of_the_keys() {
    let a = activity("1001", 10, 1, 1);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    // Re-split into 4, even with a version bump: the users' units live in the one segment.
    for version in [1, 2] {
        let four = Activity {
            segments: 4,
            ..activity("1001", 10, version, 1)
        };
        assert_eq!(
            segments::prewarm(&s, &four).await.unwrap(),
            Err(Refusal::SegmentsFixed {
                id: "1001".into(),
                first: 1,
                configured: 4
            })
        );
        let l = Layout::of(&four);
        for p in l.segments() {
            assert_eq!(s.remaining(p, version).await.unwrap(), None);
        }
    }
    assert_eq!(remaining(&s, &a).await, Some(9));
}

#[tokio::test]
async fn versions_beyond_fifteen_digits_stay_exact() {
    // #12 defect 3: cjson wrote 123456789012345 as 1.2345678901234e+14, so nothing confirmed.
    let s = Fixture::start();
    let version = flashgate::config::MAX_EXACT_INTEGER;
    let a = activity("1001", 10, version, 2);
    prewarm(&s, &a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    reserve(&s, &a, "u2", 1, "r2").await;
    assert_eq!(record(&s, &a, "r1").await.ver, version);
    assert_eq!(
        confirm(&s, &a, version, "r1").await,
        ConfirmOutcome::Confirmed
    );
    assert!(matches!(
        release(&s, &a, version, "r2", ReleaseMode::Owner).await,
        ReleaseOutcome::Released { .. }
    ));
    let row = ledger(&s, &a, version).await;
    assert_eq!((row.confirmed, row.released, row.drift()), (1, 1, 0));
    let mut conn = s.redis.conn();
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("fg:{1001}:events")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    for e in &entries.ids {
        assert_eq!(e.get::<String>("ver").unwrap(), version.to_string());
    }
}

#[tokio::test]
async fn extending_ends_at_extends_every_key_and_never_recreates_the_stock() {
    // #12 defect 2: the stock key and ledger kept the expiry set at prewarm and vanished
    // mid-sale after ends_at moved later; prewarm then created the whole stock again.
    let mut a = activity("1001", 10, 1, 1);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    let before = a.ends_at.timestamp() + 86_400;
    a.ends_at += chrono::Duration::days(30);
    prewarm(&s, &a).await;
    let after = a.ends_at.timestamp() + 86_400;
    let mut conn = s.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("fg:{1001}*")
        .query(&mut conn)
        .unwrap();
    for key in &keys {
        let at: i64 = redis::cmd("EXPIRETIME").arg(key).query(&mut conn).unwrap();
        // The floor (the newest version ever claimed) is the one key that never expires.
        let want = if key.ends_with(":floor") { -1 } else { after };
        assert_eq!(at, want, "{key} (was {before})");
    }
    // Moving ends_at back never shortens anything.
    a.ends_at -= chrono::Duration::days(60);
    prewarm(&s, &a).await;
    for key in keys.iter().filter(|k| !k.ends_with(":floor")) {
        let at: i64 = redis::cmd("EXPIRETIME").arg(key).query(&mut conn).unwrap();
        assert_eq!(at, after, "{key}");
    }
    // Even if the stock key went (lost), its segment remembers the version: not re-created.
    let _: () = redis::cmd("DEL")
        .arg("fg:{1001}:v1:stock")
        .arg("fg:{1001}:v1:ledger")
        .query(&mut conn)
        .unwrap();
    assert_eq!(prewarm(&s, &a).await.stock_key_removed, vec![0]);
    assert_eq!(remaining(&s, &a).await, None);
}

#[tokio::test]
async fn a_stranded_transfer_lands_in_the_version_it_left() {
    // #12 defect 5: delivered into the receiver's current version, version 1 units went on sale
    // in version 2 (or made a ledger with no initial and no expiry).
    let s = Fixture::start();
    let v1 = Activity {
        segments: 2,
        ..activity("1001", 100, 1, 1)
    };
    prewarm(&s, &v1).await;
    let l = Layout::of(&v1);
    let (giver, receiver) = (l.segment(1).unwrap(), l.segment(0).unwrap());
    assert_eq!(s.withdraw(giver, 1, "t1", 10, 0).await.unwrap(), 10);
    // The gateway dies; operations bump the version before the sweep delivers the transfer.
    let v2 = Activity {
        segments: 2,
        ..activity("1001", 100, 2, 1)
    };
    prewarm(&s, &v2).await;
    assert_eq!(
        s.deposit(receiver, 1, "t1", 10).await.unwrap(),
        Deposit::Landed
    );
    assert_eq!(
        s.remaining(receiver, 2).await.unwrap(),
        Some(50),
        "v2 untouched"
    );
    let row = s.ledger(receiver, 1).await.unwrap();
    assert_eq!((row.moved_in, row.retired, row.stock_key), (10, 60, false));
    assert_eq!(row.drift(), 0);
    assert_eq!(s.ledger(giver, 1).await.unwrap().drift(), 0);
}

#[tokio::test]
async fn the_reconcile_snapshot_survives_script_flush() {
    let a = activity("1001", 5, 1, 1);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut s.redis.conn())
        .unwrap();
    let l = Layout::of(&a);
    let snapshot = s.snapshot(one(&l), &[1]).await.unwrap();
    assert_eq!(
        (snapshot.ledgers[0].pending, snapshot.records.len()),
        (1, 1)
    );
}

#[tokio::test]
async fn a_lost_meta_never_puts_a_version_on_sale_twice() {
    // Review 12 F1: with its segment meta gone (DEL, or evicted), prewarm re-created the
    // stock and overwrote the ledger: the sold units sold again. Review 12b R2/R4: adopting
    // what outlived the meta forgot the segment's older versions (their reservations never
    // swept, the old version never retired) and hid every other lost key. A segment that lost
    // its meta is refused, whatever else it lost with it; the stock is never created again.
    let damaged = Err(Refusal::Damaged {
        id: "1001".into(),
        segment: 0,
    });
    for lost in [
        &["meta"][..],
        &["meta", "users"],
        &["meta", "res"],
        &["meta", "v1:pending"],
        &["meta", "v1:stock", "v1:ledger"],
        &["meta", "v1:stock", "v1:ledger", "users", "res", "idem"],
    ] {
        let redis = RedisServer::start();
        let s = store(redis.url(), 1000);
        let a = activity("1001", 4, 1, 2);
        prewarm(&s, &a).await;
        reserve(&s, &a, "u1", 1, "r1").await;
        reserve(&s, &a, "u2", 2, "r2").await;
        for key in lost {
            let _: () = redis::cmd("DEL")
                .arg(format!("fg:{{1001}}:{key}"))
                .query(&mut redis.conn())
                .unwrap();
        }
        // With the meta and the buyers' units and records all gone, the floor (which never
        // expires) tells the version was on sale: refused as sold before; else as damaged.
        let refused = if lost.contains(&"users") && lost.contains(&"res") {
            Err(Refusal::SoldBefore {
                id: "1001".into(),
                version: 1,
            })
        } else {
            damaged.clone()
        };
        assert_eq!(
            segments::prewarm(&s, &a).await.unwrap(),
            refused,
            "{lost:?}"
        );
        // Nor does a version bump create a new version over what remains.
        let bumped = activity("1001", 4, 2, 2);
        assert_eq!(
            segments::prewarm(&s, &bumped).await.unwrap(),
            damaged,
            "{lost:?}"
        );
        assert_eq!(remaining(&s, &bumped).await, None, "{lost:?}");
        assert!(
            remaining(&s, &a).await.is_none_or(|left| left <= 1),
            "{lost:?}: nothing went back on sale"
        );
    }
    // With only the stock key gone, nothing is created over the ledger.
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 2, 1, 1);
    prewarm(&s, &a).await;
    redis.del(&["fg:{1001}:v1:stock"]);
    assert_eq!(prewarm(&s, &a).await.stock_key_removed, vec![0]);
    assert_eq!(remaining(&s, &a).await, None);
}

#[tokio::test]
async fn an_unsegmented_activity_that_lost_its_meta_keeps_its_segment_count() {
    // Review 12b R1: the registry's record was judged stale because the only meta it checked
    // was the lost one; claiming two segments put the whole stock on sale again.
    let one = activity("1001", 2, 1, 1);
    let s = Fixture::on_sale(&one).await;
    reserve(&s, &one, "u1", 1, "r1").await;
    reserve(&s, &one, "u2", 1, "r2").await;
    s.redis.del(&["fg:{1001}:meta"]);
    let two = Activity {
        segments: 2,
        ..activity("1001", 2, 1, 1)
    };
    assert_eq!(
        segments::prewarm(&s, &two).await.unwrap(),
        Err(Refusal::SegmentsFixed {
            id: "1001".into(),
            first: 1,
            configured: 2
        })
    );
    // Also without the registry's record: the base tag holds the segment itself.
    s.redis.del(&["fg:activities"]);
    assert!(matches!(
        segments::prewarm(&s, &two).await.unwrap(),
        Err(Refusal::SegmentsFixed { first: 1, .. })
    ));
    assert_eq!(remaining(&s, &two).await, None, "no segment went on sale");
}

#[tokio::test]
async fn a_damaged_segment_refuses_buyers_at_once_and_writes_no_key_without_an_expiry() {
    // Review 12b R2: a lost `users` or `res` still sold until the next prewarm tick, and the
    // hashes reserve re-created had no expiry.
    for key in ["users", "res"] {
        let redis = RedisServer::start();
        let s = store(redis.url(), 1000);
        let a = activity("1001", 5, 1, 2);
        prewarm(&s, &a).await;
        reserve(&s, &a, "u1", 2, "r1").await;
        let _: () = redis::cmd("DEL")
            .arg(format!("fg:{{1001}}:{key}"))
            .query(&mut redis.conn())
            .unwrap();
        assert_eq!(
            reserve(&s, &a, "u1", 1, "r2").await,
            ReserveOutcome::Damaged,
            "{key}"
        );
        assert_eq!(remaining(&s, &a).await, Some(3), "{key}: nothing taken");
        let ttl: i64 = redis::cmd("TTL")
            .arg(format!("fg:{{1001}}:{key}"))
            .query(&mut redis.conn())
            .unwrap();
        assert_eq!(ttl, -2, "{key}: not re-created");
    }
}

#[tokio::test]
async fn a_lost_received_book_never_lets_a_transfer_land_twice() {
    // Review 12b R3: prewarm re-created a lost `received` empty, and the sweep then deposited a
    // transfer that had landed already: units from nothing.
    let s = Fixture::start();
    let a = Activity {
        segments: 2,
        ..activity("1001", 4, 1, 4)
    };
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let (receiver, giver) = (l.segment(0).unwrap(), l.segment(1).unwrap());
    assert_eq!(s.withdraw(giver, 1, "t1", 2, 0).await.unwrap(), 2);
    assert_eq!(
        s.deposit(receiver, 1, "t1", 2).await.unwrap(),
        Deposit::Landed
    );
    s.redis.del(&["fg:{1001~0/2}:received"]);
    assert_eq!(
        s.deposit(receiver, 1, "t1", 2).await.unwrap(),
        Deposit::Refused
    );
    assert_eq!(
        s.remaining(receiver, 1).await.unwrap(),
        Some(4),
        "landed once"
    );
    assert!(matches!(
        segments::prewarm(&s, &a).await.unwrap(),
        Err(Refusal::Damaged { segment: 0, .. })
    ));
    // Every other book and the event stream are checked the same way.
    for key in ["transfers", "acked", "events"] {
        let redis = RedisServer::start();
        let s = store(redis.url(), 1000);
        prewarm(&s, &a).await;
        let _: () = redis::cmd("DEL")
            .arg(format!("fg:{{1001~1/2}}:{key}"))
            .query(&mut redis.conn())
            .unwrap();
        assert!(
            matches!(
                segments::prewarm(&s, &a).await.unwrap(),
                Err(Refusal::Damaged { segment: 1, .. })
            ),
            "{key}"
        );
    }
}

#[tokio::test]
async fn a_lost_ledger_beside_its_stock_refuses_the_segment() {
    // Review 12b R2: a lost ledger was reported but sales went on, and reserve re-created it.
    let a = activity("1001", 5, 1, 2);
    let s = Fixture::on_sale(&a).await;
    s.redis.del(&["fg:{1001}:v1:ledger"]);
    assert!(matches!(
        segments::prewarm(&s, &a).await.unwrap(),
        Err(Refusal::Damaged { .. })
    ));
}

#[tokio::test]
async fn an_abandon_into_a_segment_never_prewarmed_leaves_a_key_that_expires() {
    // Review 12b R9: the tombstone's hash had no expiry.
    let s = Fixture::start();
    let a = Activity {
        segments: 4,
        ..activity("1001", 8, 1, 1)
    };
    let l = Layout::of(&a);
    let outcome = s
        .release(
            l.segment(3).unwrap(),
            1,
            "r1.3",
            ReleaseMode::Abandon,
            ReleaseReason::StoreTimeout,
        )
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::Unknown);
    let ttl: i64 = redis::cmd("TTL")
        .arg("fg:{1001~3/4}:res")
        .query(&mut s.redis.conn())
        .unwrap();
    assert!(ttl > 0, "{ttl}");
    // The tombstone is not taken for a lost key: the segment goes on sale as new.
    assert_eq!(prewarm(&s, &a).await.created, 4);
}

#[tokio::test]
async fn a_reservation_is_never_due_while_its_request_may_be_at_the_backend() {
    // Review 12b R7: a hold shorter than a forwarded request may take was swept (or asked
    // about) while the backend still worked on it; a replay with little hold left likewise.
    let s = Fixture::start();
    let a = Activity {
        hold: Duration::from_millis(1),
        ..activity("1001", 5, 1, 2)
    };
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let in_flight = Duration::from_secs(30);
    let first = ReserveCall {
        in_flight,
        idempotency_key: Some("k"),
        ..call(&a, "u1", 1, "r1")
    };
    let ReserveOutcome::Reserved { deadline_ms, .. } = s.reserve(one(&l), &first).await.unwrap()
    else {
        panic!("reserved");
    };
    let score = |id: &str| -> f64 {
        redis::cmd("ZSCORE")
            .arg("fg:{1001}:v1:pending")
            .arg(id)
            .query(&mut s.redis.conn())
            .unwrap()
    };
    assert!(
        score("r1") >= (deadline_ms + 29_000) as f64,
        "due after the trip, not the hold"
    );
    // Its hold ran out, but its request may still be at the backend: not released.
    let swept = s.sweep(one(&l), 1, 100, None).await.unwrap();
    assert_eq!(swept.released, 0);
    assert_eq!(ledger(&s, &a, 1).await.pending, 1);
}
#[tokio::test]
async fn the_registry_keeps_the_segment_count_when_the_base_meta_is_lost() {
    // Review 12 F1b: losing the base meta let another segment count be claimed.
    let s = Fixture::start();
    let four = Activity {
        segments: 4,
        ..activity("1001", 8, 1, 1)
    };
    prewarm(&s, &four).await;
    s.redis.del(&["fg:{1001}:meta"]);
    assert_eq!(
        segments::prewarm(&s, &activity("1001", 8, 1, 1))
            .await
            .unwrap(),
        Err(Refusal::SegmentsFixed {
            id: "1001".into(),
            first: 4,
            configured: 1
        })
    );
    assert_eq!(remaining(&s, &activity("1001", 8, 1, 1)).await, None);
}

#[tokio::test]
async fn a_lost_key_refuses_the_activity_instead_of_trusting_it() {
    // Review 12 F8: losing `users` broke the per-user limit, losing `res` or `pending` stranded
    // units. Prewarm finds the placeholder gone and refuses the activity.
    for key in ["users", "res", "idem", "v1:pending"] {
        let redis = RedisServer::start();
        let s = store(redis.url(), 1000);
        let a = activity("1001", 5, 1, 1);
        prewarm(&s, &a).await;
        reserve(&s, &a, "u1", 1, "r1").await;
        let _: () = redis::cmd("DEL")
            .arg(format!("fg:{{1001}}:{key}"))
            .query(&mut redis.conn())
            .unwrap();
        assert_eq!(
            segments::prewarm(&s, &a).await.unwrap(),
            Err(Refusal::Damaged {
                id: "1001".into(),
                segment: 0
            }),
            "{key}"
        );
    }
}

#[tokio::test]
async fn a_replay_past_its_hold_deadline_is_refused_and_a_replay_signs_the_same_claims() {
    // Review 12 F3: a pending reservation was replayed whatever was left of its hold, and
    // re-signed with exp = now + ttl, long after the sweep could release it.
    let s = Fixture::start();
    let a = Activity {
        hold: Duration::from_millis(300),
        ..activity("1001", 5, 1, 1)
    };
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let keyed = |id: &'static str| ReserveCall {
        idempotency_key: Some("k"),
        ..call(&a, "u1", 1, id)
    };
    let ReserveOutcome::Reserved {
        created_ms,
        deadline_ms,
        ..
    } = s.reserve(one(&l), &keyed("r1")).await.unwrap()
    else {
        panic!("reserved")
    };
    assert_eq!(deadline_ms - created_ms, 300);
    match s.reserve(one(&l), &keyed("r2")).await.unwrap() {
        ReserveOutcome::Replayed {
            created_ms: c,
            deadline_ms: d,
            ..
        } => assert_eq!((c, d), (created_ms, deadline_ms), "the same claims to sign"),
        other => panic!("{other:?}"),
    }
    wait_for(
        "Redis's clock to pass the hold deadline",
        Duration::from_secs(5),
        || (redis_time_ms(&s.redis) > deadline_ms).then_some(()),
    );
    assert_eq!(
        s.reserve(one(&l), &keyed("r3")).await.unwrap(),
        ReserveOutcome::HoldRanOut
    );
}

#[tokio::test]
async fn transfer_halves_are_each_once_and_never_lose_units() {
    // Review 12 F7: a withdraw sent twice took units twice; a deposit into a version with no
    // ledger marked the transfer received and the units vanished.
    let s = Fixture::start();
    let a = Activity {
        segments: 2,
        ..activity("1001", 20, 1, 1)
    };
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let (giver, receiver) = (l.segment(1).unwrap(), l.segment(0).unwrap());
    assert_eq!(s.withdraw(giver, 1, "t1", 3, 0).await.unwrap(), 3);
    assert_eq!(
        s.withdraw(giver, 1, "t1", 3, 0).await.unwrap(),
        3,
        "a retry"
    );
    assert_eq!(s.remaining(giver, 1).await.unwrap(), Some(7));
    s.acknowledge(giver, "t1").await.unwrap();
    assert_eq!(
        s.withdraw(giver, 1, "t1", 3, 0).await.unwrap(),
        3,
        "even once acknowledged"
    );
    assert_eq!(s.remaining(giver, 1).await.unwrap(), Some(7));
    s.redis.del(&["fg:{1001~0/2}:v1:ledger"]);
    assert_eq!(
        s.deposit(receiver, 1, "t1", 3).await.unwrap(),
        Deposit::Refused
    );
    assert!(
        !s.received(receiver, "t1").await.unwrap(),
        "still in flight, for reconcile to show"
    );
}

#[tokio::test]
async fn an_early_lookup_is_timed_by_redis_clock_and_only_ever_moves_earlier() {
    // Review 12b R6: the due time was the gateway's clock plus a delay; a gateway an hour slow
    // asked the backend at once, while it was still working on the order.
    let a = activity("1001", 5, 1, 2);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "u1", 1, "r1").await;
    let l = Layout::of(&a);
    let score = || -> u64 {
        let score: f64 = redis::cmd("ZSCORE")
            .arg("fg:{1001}:v1:pending")
            .arg("r1")
            .query(&mut s.redis.conn())
            .unwrap();
        score as u64
    };
    let before = redis_time_ms(&s.redis);
    s.due_in(one(&l), 1, "r1", 1, Duration::from_secs(10))
        .await
        .unwrap();
    let due = score();
    assert!(
        (before + 10_000..before + 11_000).contains(&due),
        "{due} vs {before}"
    );
    s.due_in(one(&l), 1, "r1", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(score(), due, "never later");
    s.due_in(one(&l), 1, "nobody", 1, Duration::from_secs(1))
        .await
        .unwrap();
    let members: u64 = redis::cmd("ZCARD")
        .arg("fg:{1001}:v1:pending")
        .query(&mut s.redis.conn())
        .unwrap();
    assert_eq!(members, 2, "r1 and the placeholder: nothing added");
}

#[tokio::test]
async fn a_replay_only_reserve_answers_the_keys_reservation_and_takes_nothing_else() {
    // Review of #15, finding 3: a buyer the waiting room holds back (lapsed, or sold out for
    // everyone waiting) who retries a purchase made at their turn gets its reservation back;
    // any other key, or none, takes no stock.
    let a = activity("1001", 5, 1, 1);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    let keyed = |id: &'static str, key: &'static str, replay_only: bool| ReserveCall {
        idempotency_key: Some(key),
        replay_only,
        ..call(&a, "u1", 1, id)
    };
    assert!(matches!(
        s.reserve(one(&l), &keyed("r1", "k", false)).await.unwrap(),
        ReserveOutcome::Reserved { remaining: 4, .. }
    ));
    assert!(matches!(
        s.reserve(one(&l), &keyed("r2", "k", true)).await.unwrap(),
        ReserveOutcome::Replayed { ref id, .. } if id == "r1"
    ));
    assert_eq!(
        s.reserve(one(&l), &keyed("r3", "other", true))
            .await
            .unwrap(),
        ReserveOutcome::NotReplayed
    );
    let unkeyed = ReserveCall {
        replay_only: true,
        ..call(&a, "u2", 1, "r4")
    };
    assert_eq!(
        s.reserve(one(&l), &unkeyed).await.unwrap(),
        ReserveOutcome::NotReplayed
    );
    assert_eq!(s.remaining(one(&l), 1).await.unwrap(), Some(4));
    assert!(s.lookup(one(&l), "r3").await.unwrap().is_none());
    assert!(s.lookup(one(&l), "r4").await.unwrap().is_none());
}

#[tokio::test]
async fn no_reservation_is_made_outside_the_sales_hours_by_redis_clock_but_a_replay_still_answers()
{
    // A gateway whose clock runs ahead (or behind) thinks the sale open when, by Redis's clock,
    // it is not: the script is the judge. Nothing is taken before the opening or from the
    // closing on; the hours are [opens, closes) exactly; a key's won reservation still answers.
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 5, 1, 5);
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let now = redis_time_ms(&redis) as i64;
    let at = |opens_ms: i64, closes_ms: i64, id: &'static str| ReserveCall {
        hours: SaleHours {
            opens_ms,
            closes_ms,
        },
        idempotency_key: Some("k"),
        ..call(&a, "u1", 1, id)
    };
    let hour = 3_600_000;
    assert_eq!(
        s.reserve(one(&l), &at(now + hour, now + 2 * hour, "r1"))
            .await
            .unwrap(),
        ReserveOutcome::NotStarted
    );
    // Closed from its closing millisecond on (Redis's clock has moved on since `now`).
    assert_eq!(
        s.reserve(one(&l), &at(now - hour, now, "r2"))
            .await
            .unwrap(),
        ReserveOutcome::Ended
    );
    assert_eq!(remaining(&s, &a).await, Some(5));
    assert!(s.lookup(one(&l), "r1").await.unwrap().is_none());
    assert!(s.lookup(one(&l), "r2").await.unwrap().is_none());
    assert_eq!(ledger(&s, &a, 1).await.pending, 0);
    // Open from its opening millisecond.
    assert!(matches!(
        s.reserve(one(&l), &at(now, now + hour, "r3"))
            .await
            .unwrap(),
        ReserveOutcome::Reserved { remaining: 4, .. }
    ));
    // The sale has closed since: the key's reservation is still its own, and nothing more goes.
    assert!(matches!(
        s.reserve(one(&l), &at(now - hour, now, "r4")).await.unwrap(),
        ReserveOutcome::Replayed { ref id, .. } if id == "r3"
    ));
    let unkeyed = ReserveCall {
        idempotency_key: None,
        ..at(now - hour, now, "r5")
    };
    assert_eq!(
        s.reserve(one(&l), &unkeyed).await.unwrap(),
        ReserveOutcome::Ended
    );
    assert_eq!(remaining(&s, &a).await, Some(4));
    assert_eq!(ledger(&s, &a, 1).await.pending, 1);
}

#[tokio::test]
async fn a_segmented_reserve_outside_the_hours_pulls_units_home_and_loses_none() {
    // Review of the sale hours: a home segment short of a 2-unit purchase pulls units from
    // the others (withdraw, then deposit with the reserve); the reserve is refused by Redis's
    // clock, the deposit stays, nothing is left in flight, every unit is still for sale.
    let s = Fixture::start();
    let open = Activity {
        segments: 4,
        ..activity("1001", 4, 1, 2)
    };
    prewarm(&s, &open).await;
    for (label, shifted) in [
        ("not started", chrono::Duration::hours(1)),
        ("ended", chrono::Duration::hours(-5)),
    ] {
        let a = Activity {
            starts_at: chrono::Utc::now() + shifted,
            ends_at: chrono::Utc::now() + shifted + chrono::Duration::hours(4),
            segments: 4,
            ..activity("1001", 4, 1, 2)
        };
        for i in 0..8 {
            let user = format!("u{i}");
            let id = format!("r-{label}-{i}");
            let outcome = segments::reserve(
                &*s,
                &a,
                segments::Purchase {
                    user: &user,
                    qty: 2,
                    reservation_id: &id,
                    idempotency_key: None,
                    in_flight: Duration::ZERO,
                    replay_only: false,
                    steps: None,
                },
            )
            .await
            .unwrap();
            let expected = if label == "ended" {
                segments::ReserveAnswer::Ended
            } else {
                segments::ReserveAnswer::NotStarted
            };
            assert_eq!(outcome, expected, "{label} {i}");
        }
        assert_eq!(segments::available(&*s, &open).await.unwrap(), 4, "{label}");
        let rows = segments::ledgers(&*s, &Layout::of(&open)).await.unwrap();
        let (moved_in, moved_out): (i64, i64) = rows
            .iter()
            .fold((0, 0), |(i, o), (_, r)| (i + r.moved_in, o + r.moved_out));
        assert_eq!(moved_in, moved_out, "nothing in flight ({label}): {rows:?}");
        assert!(
            moved_in > 0,
            "the short homes pulled units ({label}): {rows:?}"
        );
        assert!(rows.iter().all(|(_, r)| r.pending == 0), "{rows:?}");
    }
}

/// Issue 20: a forward that ended without an answer asks for an early lookup, but never while
/// another forward of the reservation may still be at the backend.
#[tokio::test]
async fn an_early_lookup_never_overtakes_another_forward_in_flight() {
    let a = activity("1001", 5, 1, 2);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    let keyed = ReserveCall {
        idempotency_key: Some("k"),
        in_flight: Duration::from_secs(30),
        ..call(&a, "u1", 1, "r1")
    };
    let ReserveOutcome::Reserved { fence: first, .. } = s.reserve(one(&l), &keyed).await.unwrap()
    else {
        panic!("reserved")
    };
    let score = || -> u64 {
        let score: f64 = redis::cmd("ZSCORE")
            .arg("fg:{1001}:v1:pending")
            .arg("r1")
            .query(&mut s.redis.conn())
            .unwrap();
        score as u64
    };
    // The retry is forwarded again (a replay): the fence moves.
    let retry = ReserveCall {
        reservation_id: "r-retry",
        ..keyed
    };
    let ReserveOutcome::Replayed { fence: second, .. } = s.reserve(one(&l), &retry).await.unwrap()
    else {
        panic!("replayed")
    };
    assert_eq!(second, first + 1);
    let due = score();
    // The first forward ends without an answer: its early lookup is stale (fenced).
    s.due_in(one(&l), 1, "r1", first, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(score(), due, "a stale forward moves nothing");
    // The retry ends without an answer: due, but not before the first forward's trip ends.
    let now = redis_time_ms(&s.redis);
    s.due_in(one(&l), 1, "r1", second, Duration::ZERO)
        .await
        .unwrap();
    let early = score();
    assert!(early < due, "earlier than the retry's own trip");
    assert!(
        early >= now + 29_000,
        "never before the first forward's trip ends: {early} vs {now}"
    );
}

/// Issue 20: the sweep's hand-out records the fence; a replay forwarded while the lookup is out
/// moves it, and the lookup's "not found" (asked before the replay reached the backend) is then
/// discarded. A second hand-out discards the first one's answer too.
#[tokio::test]
async fn a_lookup_answer_lands_only_under_the_fence_its_hand_out_set() {
    let s = Fixture::start();
    let mut a = activity("1001", 1, 1, 1);
    a.hold = Duration::ZERO;
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let keyed = ReserveCall {
        idempotency_key: Some("k"),
        ..call(&a, "u1", 1, "r1")
    };
    s.reserve(one(&l), &keyed).await.unwrap();
    let lease = flashgate::stock::LookupLease {
        lease: Duration::from_millis(1),
        give_up_after: None,
    };
    let handed = s.sweep(one(&l), 1, 10, Some(lease)).await.unwrap();
    let first = handed.for_lookup[0].fence;
    // Another instance's sweep hands it out again once the lease ran out.
    let _: () = redis::cmd("ZADD")
        .arg("fg:{1001}:v1:pending")
        .arg(0)
        .arg("r1")
        .query(&mut s.redis.conn())
        .unwrap();
    let again = s.sweep(one(&l), 1, 10, Some(lease)).await.unwrap();
    let second = again.for_lookup[0].fence;
    assert_eq!(second, first + 1);
    assert_eq!(
        release(&s, &a, 1, "r1", ReleaseMode::Lookup { fence: first }).await,
        ReleaseOutcome::Fenced,
        "the first hand-out's answer is stale"
    );
    // The buyer retries with the key while the second lookup is out (hold 0: the record's
    // deadline passed, so make it a fresh hold for the replay to be accepted).
    set_deadline(&s.redis, "r1", redis_time_ms(&s.redis) + 600_000);
    let retry = ReserveCall {
        reservation_id: "r2",
        ..keyed
    };
    assert!(matches!(
        s.reserve(one(&l), &retry).await.unwrap(),
        ReserveOutcome::Replayed { .. }
    ));
    assert_eq!(
        release(&s, &a, 1, "r1", ReleaseMode::Lookup { fence: second }).await,
        ReleaseOutcome::Fenced,
        "not found, asked before the retry reached the backend"
    );
    assert_eq!(record(&s, &a, "r1").await.state, RecordState::Pending);
    assert_eq!(
        reserve(&s, &a, "u2", 1, "r3").await,
        ReserveOutcome::Insufficient { remaining: 0 },
        "the unit was not sold a second time"
    );
}

/// Issue 20: once a version's keys expired with the retention, the floor (the one key that
/// never expires) still says it was on sale: it never sells again; a new version sells afresh.
#[tokio::test]
async fn a_version_whose_keys_expired_never_sells_again_but_a_new_one_does() {
    let a = activity("1001", 1, 1, 1);
    let s = Fixture::on_sale(&a).await;
    reserve(&s, &a, "alice", 1, "r1").await;
    // The retention passes: every key with an expiry goes.
    let mut conn = s.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("fg:*").query(&mut conn).unwrap();
    for key in keys {
        let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut conn).unwrap();
        if ttl != -1 {
            let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        }
    }
    let refused = segments::prewarm(&s, &a).await.unwrap().unwrap_err();
    assert_eq!(
        refused,
        Refusal::SoldBefore {
            id: "1001".into(),
            version: 1
        }
    );
    let message = refused.to_string();
    assert!(
        message.contains("activity 1001") && message.contains("raise version above 1"),
        "{message}"
    );
    assert_eq!(
        reserve(&s, &a, "bob", 1, "r2").await,
        ReserveOutcome::NoStockKey,
        "nothing on sale"
    );
    // An older version is refused as older; a newer one sells afresh.
    let older = activity("1001", 1, 0, 1);
    assert!(matches!(
        segments::prewarm(&s, &older).await.unwrap(),
        Err(Refusal::OlderVersion { newest: 1, .. })
    ));
    let v2 = activity("1001", 1, 2, 1);
    prewarm(&s, &v2).await;
    assert!(matches!(
        reserve(&s, &v2, "bob", 1, "r3").await,
        ReserveOutcome::Reserved { .. }
    ));
    let floor: String = redis::cmd("GET")
        .arg("fg:{1001}:floor")
        .query(&mut conn)
        .unwrap();
    assert_eq!(floor, "2");
}

/// Issue 20: a backend 2xx (or an order lookup finding the order) for a reservation already
/// released is a ledger fact: covered by a unit of stock while the version has one (a confirmed
/// cover record for the same user), else counted oversold; once per reservation; never clean.
#[tokio::test]
async fn a_late_acceptance_is_covered_from_stock_or_counted_oversold() {
    let a = activity("1001", 2, 1, 2);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    // Cancelled by the backend (admin): a 2xx reported after that is no late acceptance.
    reserve(&s, &a, "carol", 1, "r0").await;
    release(&s, &a, 1, "r0", ReleaseMode::Admin).await;
    assert_eq!(
        confirm_batch(&s, &a, &["r0"]).await.unwrap(),
        [ConfirmOutcome::Released]
    );
    // Released by the gateway (the forward failed): the backend taking it is accepted late.
    reserve(&s, &a, "alice", 1, "r1").await;
    release(&s, &a, 1, "r1", ReleaseMode::Owner).await;
    let late = |ids: &'static [&'static str], via| {
        let s = &s;
        let l = &l;
        async move { s.confirm(one(l), 1, ids, via).await.unwrap() }
    };
    assert_eq!(
        late(&["r1"], ConfirmedVia::Admin).await,
        [ConfirmOutcome::Released],
        "an admin confirm of a released one is refused, not counted"
    );
    assert_eq!(
        late(&["r1"], ConfirmedVia::Upstream).await,
        [ConfirmOutcome::LateCovered]
    );
    assert_eq!(
        late(&["r1"], ConfirmedVia::Lookup).await,
        [ConfirmOutcome::Released],
        "counted once"
    );
    let cover = record(&s, &a, "r1-late").await;
    assert_eq!(
        (cover.state, cover.user.as_str(), cover.qty),
        (RecordState::Confirmed, "alice", 1)
    );
    assert!(record(&s, &a, "r1").await.accepted_late);
    let row = ledger(&s, &a, 1).await;
    assert_eq!(
        (
            row.remaining,
            row.confirmed,
            row.late_accepted,
            row.oversold,
            row.drift()
        ),
        (1, 1, 1, 0, 0)
    );
    // With no unit left to cover it: oversold.
    reserve(&s, &a, "bob", 1, "r2").await;
    release(&s, &a, 1, "r2", ReleaseMode::Owner).await;
    reserve(&s, &a, "dan", 1, "r4").await;
    assert_eq!(
        late(&["r2"], ConfirmedVia::Upstream).await,
        [ConfirmOutcome::LateOversold]
    );
    let row = ledger(&s, &a, 1).await;
    assert_eq!(
        (row.remaining, row.late_accepted, row.oversold, row.drift()),
        (0, 2, 1, 0)
    );
    let settings = store_settings_for(&s.redis, &a);
    let report = flashgate::reconcile::reconcile(&settings, &s, Some("1001"))
        .await
        .unwrap();
    assert!(!report.clean(), "{}", report.table());
    assert!(
        report.table().contains("1 covered from stock, 1 oversold"),
        "{}",
        report.table()
    );
}

/// Issue 20: a pull whose deposit-and-reserve answers before depositing (the home segment
/// was damaged in between) leaves the transfer unacknowledged on the giver: the sweep delivers
/// it later; before, it was acknowledged and its units lost (and reconcile, which now checks
/// that every acknowledged transfer arrived, saw nothing).
#[tokio::test]
async fn a_transfer_is_acknowledged_only_once_it_landed() {
    let s = Fixture::start();
    let a = Activity {
        segments: 2,
        ..activity("1001", 4, 1, 2)
    };
    prewarm(&s, &a).await;
    let l = Layout::of(&a);
    let (home, giver) = (l.segment(0).unwrap(), l.segment(1).unwrap());
    assert_eq!(s.withdraw(giver, 1, "t1", 1, 0).await.unwrap(), 1);
    // The home loses a placeholder between the withdraw and the deposit.
    let _: () = redis::cmd("HDEL")
        .arg(s.keys().of(home).users())
        .arg("")
        .query(&mut s.redis.conn())
        .unwrap();
    let outcome =
        segments::deposit_and_reserve(&*s, giver, home, &call(&a, "u1", 1, "r1"), "t1", 1)
            .await
            .unwrap();
    assert_eq!(outcome, ReserveOutcome::Damaged);
    let (open, acked) = s.transfers_given(giver).await.unwrap();
    assert_eq!(
        (open.len(), acked.len()),
        (1, 0),
        "still in flight, not forgotten"
    );
    // A giver that forgot a transfer that never arrived is a lost unit: reconcile says so.
    let _: () = redis::cmd("EVAL")
        .arg("local t = redis.call('HGET', KEYS[1], 't1') redis.call('HDEL', KEYS[1], 't1') redis.call('HSET', KEYS[2], 't1', t) return 1")
        .arg(2)
        .arg(s.keys().of(giver).transfers())
        .arg(s.keys().of(giver).acknowledged())
        .query(&mut s.redis.conn())
        .unwrap();
    let settings = store_settings_for(&s.redis, &a);
    let report = flashgate::reconcile::reconcile(&settings, &s, Some("1001"))
        .await
        .unwrap();
    assert!(
        report
            .transfer_mismatches
            .iter()
            .any(|m| m.what.contains("acknowledged transfer t1")),
        "{}",
        report.table()
    );
}

/// Settings for `flashgate reconcile` over one activity on this Redis.
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

/// Review of issue 20, F2: a segment that lost every key (a Redis Cluster master that restarted
/// empty, the base tag surviving elsewhere) looked new to prewarm and was put on sale again with
/// its share. Once the base meta recorded the segment as made, it is refused as damaged.
#[tokio::test]
async fn a_segment_that_lost_every_key_is_refused_not_put_on_sale_again() {
    let s = Fixture::start();
    let a = Activity {
        segments: 2,
        ..activity("1001", 4, 1, 2)
    };
    prewarm(&s, &a).await;
    let mut conn = s.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("fg:{1001~1/2}*")
        .query(&mut conn)
        .unwrap();
    assert!(!keys.is_empty());
    let _: () = redis::cmd("DEL").arg(keys).query(&mut conn).unwrap();
    assert_eq!(
        segments::prewarm(&s, &a).await.unwrap(),
        Err(Refusal::Damaged {
            id: "1001".into(),
            segment: 1
        })
    );
    let left: Option<i64> = redis::cmd("GET")
        .arg("fg:{1001~1/2}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, None, "its share is not on sale again");
}

/// An outcome without its times and fence (which differ between two runs).
fn shape(outcome: ReserveOutcome) -> ReserveOutcome {
    match outcome {
        ReserveOutcome::Reserved { remaining, .. } => ReserveOutcome::Reserved {
            remaining,
            created_ms: 0,
            deadline_ms: 0,
            fence: 0,
        },
        ReserveOutcome::Replayed {
            id,
            qty,
            version,
            remaining,
            ..
        } => ReserveOutcome::Replayed {
            id,
            qty,
            version,
            remaining,
            created_ms: 0,
            deadline_ms: 0,
            fence: 0,
            phase: None,
        },
        other => other,
    }
}

#[tokio::test]
async fn one_reserve_call_judges_a_batch_in_order_as_separate_calls_would() {
    let s = Fixture::start();
    // (user, qty, id, idempotency key, replay only): every outcome a batch item can have but
    // a deposit's, each depending on the items before it.
    let items: &[(&str, u32, &str, Option<&str>, bool)] = &[
        ("u1", 2, "r1", None, false),      // reserved
        ("u2", 2, "r2", None, false),      // 3 left: reserved, 1 left
        ("u2", 1, "r3", None, false),      // u2 at its limit of 2: limit
        ("u3", 1, "r1", None, false),      // id r1 taken: duplicate id
        ("u3", 1, "r4", Some("k"), false), // the last unit, under key k
        ("u3", 1, "r5", Some("k"), false), // the key's retry: r4 replayed
        ("u3", 2, "r6", Some("k"), false), // same key, another quantity
        ("u4", 1, "r7", Some("k"), true),  // replay only, u4's key k won nothing
        ("u4", 1, "r8", None, false),      // nothing left: insufficient
    ];
    let calls = |a: &Activity| -> Vec<ReserveCall<'static>> {
        items
            .iter()
            .map(|&(user, qty, id, key, replay_only)| ReserveCall {
                idempotency_key: key,
                replay_only,
                ..call(a, user, qty, id)
            })
            .collect()
    };
    // One at a time, on activity 1001.
    let alone = activity("1001", 5, 1, 2);
    prewarm(&s, &alone).await;
    let l = Layout::of(&alone);
    let mut one_by_one = Vec::new();
    for c in calls(&alone) {
        one_by_one.push(shape(s.reserve(one(&l), &c).await.unwrap()));
    }
    // All in one call, on activity 1002 (the same ids: records are per activity).
    let together = activity("1002", 5, 1, 2);
    prewarm(&s, &together).await;
    let l2 = Layout::of(&together);
    let evalsha = || -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut s.redis.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let calls_before = evalsha();
    s.hold_reserves();
    let calls2 = calls(&together);
    let pending = futures_util::future::join_all(calls2.iter().map(|c| s.reserve(one(&l2), c)));
    let release = async {
        wait_for_async("every item to queue", Duration::from_secs(5), || async {
            (s.reserves_waiting() == items.len()).then_some(())
        })
        .await;
        s.release_reserves();
    };
    let (batched, ()) = tokio::join!(pending, release);
    let batched: Vec<ReserveOutcome> = batched.into_iter().map(|o| shape(o.unwrap())).collect();
    assert_eq!(batched, one_by_one);
    assert_eq!(evalsha() - calls_before, 1, "one script call for the batch");
    assert!(matches!(
        one_by_one[1],
        ReserveOutcome::Reserved { remaining: 1, .. }
    ));
    assert!(matches!(one_by_one[5], ReserveOutcome::Replayed { ref id, .. } if id == "r4"));
    assert_eq!(one_by_one[8], ReserveOutcome::Insufficient { remaining: 0 });
    // One call, and the same state: ledger, stock, records, events.
    let a_row = ledger(&s, &alone, 1).await;
    let b_row = ledger(&s, &together, 1).await;
    assert_eq!(format!("{a_row:?}"), format!("{b_row:?}"));
    assert_eq!(remaining(&s, &together).await, Some(0));
    let mut conn = s.redis.conn();
    let events = |conn: &mut redis::Connection, act: &str| {
        reservation_events(conn, &format!("fg:{{{act}}}:events"))
    };
    let (a_events, b_events) = (events(&mut conn, "1001"), events(&mut conn, "1002"));
    assert_eq!(a_events.len(), b_events.len(), "events");
    let records = |conn: &mut redis::Connection, act: &str| -> usize {
        redis::cmd("HLEN")
            .arg(format!("fg:{{{act}}}:res"))
            .query(conn)
            .unwrap()
    };
    assert_eq!(
        records(&mut conn, "1001"),
        records(&mut conn, "1002"),
        "records"
    );
    assert_eq!(b_row.drift(), 0, "{b_row:?}");
    assert_eq!((b_row.pending, b_row.pending_reservations), (5, 3));
}

/// Script calls Redis has run so far (INFO commandstats; every store call on the buyer's path
/// is a script: reserve, withdraw, the ledger read).
fn script_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_sell_out_of_segmented_stock_costs_one_determination_not_one_per_buyer() {
    // Issue 23's herd: 20 buyers arriving at once at a gateway that has not yet learned that
    // a 6-segment activity is sold out made 240 calls (each: its reserve, 5 withdraws, 6
    // ledger reads). Now their reserves go in batches per home segment and one read of the
    // whole activity answers them all.
    let s = Fixture::start();
    let a = Activity {
        segments: 6,
        ..activity("1001", 6, 1, 1)
    };
    prewarm(&s, &a).await;
    for i in 0..6 {
        let user = format!("early{i}");
        let id = format!("e{i}");
        let outcome = segments::reserve(
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
        assert!(
            matches!(outcome, segments::ReserveAnswer::Reserved { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(segments::available(&*s, &a).await.unwrap(), 0);
    let moved = |rows: Vec<(u32, flashgate::stock::LedgerRow)>| -> i64 {
        rows.iter().map(|(_, r)| r.moved_out).sum()
    };
    let moved_before = moved(segments::ledgers(&*s, &Layout::of(&a)).await.unwrap());
    let before = script_calls(&s.redis);
    let users: Vec<String> = (0..20).map(|i| format!("late{i}")).collect();
    let ids: Vec<String> = (0..20).map(|i| format!("l{i}")).collect();
    let outcomes = futures_util::future::join_all(users.iter().zip(&ids).map(|(user, id)| {
        segments::reserve(
            &*s,
            &a,
            segments::Purchase {
                user,
                qty: 1,
                reservation_id: id,
                idempotency_key: None,
                in_flight: Duration::ZERO,
                replay_only: false,
                steps: None,
            },
        )
    }))
    .await;
    let calls = script_calls(&s.redis) - before;
    for outcome in outcomes {
        assert_eq!(
            outcome.unwrap(),
            segments::ReserveAnswer::SoldOut { left: 0 }
        );
    }
    // At most two reserve calls per home segment (the first alone, the rest together), and
    // a determination or two (6 ledger reads each): nothing withdrawn.
    assert!(calls <= 12 + 2 * 6, "{calls} script calls for 20 buyers");
    let rows = segments::ledgers(&*s, &Layout::of(&a)).await.unwrap();
    assert_eq!(moved(rows), moved_before, "nothing withdrawn");
}

/// The failover fence in the scripts (`stock::failover`): the check records each segment's
/// master; a segment whose record names another master (what a promoted replica holds) takes
/// nothing, whichever call asks: the reserve answers `Fenced` for the batch, a withdraw from it
/// takes nothing, the check names it; accepting the master answering now sells again.
#[tokio::test]
async fn a_segment_recorded_under_another_master_takes_nothing() {
    let s = Fixture::start();
    let a = Activity {
        segments: 2,
        ..activity("1001", 10, 1, 5)
    };
    prewarm(&s, &a).await;
    assert_eq!(s.check_master(&a).await.unwrap().fence, None, "armed");
    let layout = Layout::of(&a);
    let record = |i: u32| s.keys().of(layout.segment(i).unwrap()).master();
    let replid = replication_field(&s.redis, "master_replid");
    for i in 0..2 {
        let recorded: String = redis::cmd("GET")
            .arg(record(i))
            .query(&mut s.redis.conn())
            .unwrap();
        assert_eq!(recorded, replid);
    }
    let other = "0".repeat(40);
    for i in 0..2 {
        let _: () = redis::cmd("SET")
            .arg(record(i))
            .arg(&other)
            .query(&mut s.redis.conn())
            .unwrap();
    }
    let stock_key = s.keys().of(layout.segment(0).unwrap()).stock(1);
    let stock = |redis: &RedisServer| -> i64 {
        redis::cmd("GET")
            .arg(&stock_key)
            .query(&mut redis.conn())
            .unwrap()
    };
    let before = stock(&s.redis);
    let seg0 = layout.segment(0).unwrap();
    let fenced = s.reserve(seg0, &call(&a, "u1", 1, "r1")).await.unwrap();
    assert_eq!(fenced, ReserveOutcome::Fenced);
    assert_eq!(stock(&s.redis), before, "nothing taken");
    assert!(s.is_fenced(&a), "a fenced reserve is remembered at once");
    let giver = layout.segment(1).unwrap();
    let withdrawn = s.withdraw(giver, 1, "t1", 1, 0).await;
    assert!(
        matches!(withdrawn, Err(StoreError::Fenced)),
        "{withdrawn:?}"
    );
    let fence = s.check_master(&a).await.unwrap().fence.expect("fenced");
    assert_eq!(
        (fence.segment, &*fence.recorded, &*fence.current),
        (0, &*other, &*replid)
    );
    // An operator's plain accept is refused until the backend's orders were found whole since
    // the fence began (in doubt, hold: issue 45); then it sells again.
    assert!(matches!(
        s.accept_master(&a).await.unwrap(),
        flashgate::stock::failover::Resumed::Unchecked(_)
    ));
    assert!(s.is_fenced(&a));
    s.orders_checked(&a).await.unwrap();
    assert!(matches!(
        s.accept_master(&a).await.unwrap(),
        flashgate::stock::failover::Resumed::Accepted
    ));
    assert!(!s.is_fenced(&a));
    assert!(matches!(
        s.reserve(seg0, &call(&a, "u1", 1, "r1")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(s.check_master(&a).await.unwrap().fence, None);
}

/// A field of the server's `INFO replication`.
fn replication_field(redis: &RedisServer, name: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{name} in {info}"))
        .trim()
        .to_owned()
}

/// The fence's fast path finds the recorded master's line in INFO's text; a record that only
/// contains this master's identity (a prefix of it, or it with more lines after) is another
/// master's, as when the record was compared whole (review of the plain search).
#[tokio::test]
async fn a_record_that_only_contains_this_masters_identity_is_fenced() {
    let a = activity("1001", 10, 1, 5);
    let s = Fixture::on_sale(&a).await;
    assert_eq!(s.check_master(&a).await.unwrap().fence, None, "armed");
    let layout = Layout::of(&a);
    let record = s.keys().of(layout.segment(0).unwrap()).master();
    let replid: String = redis::cmd("GET")
        .arg(&record)
        .query(&mut s.redis.conn())
        .unwrap();
    let replid2 = replication_field(&s.redis, "master_replid2");
    for lookalike in [
        replid[..20].to_owned(),
        format!("{replid}\r\nmaster_replid2:{replid2}"),
        format!("{replid} "),
        replid.to_uppercase(),
    ] {
        let _: () = redis::cmd("SET")
            .arg(&record)
            .arg(&lookalike)
            .query(&mut s.redis.conn())
            .unwrap();
        let fence = s.check_master(&a).await.unwrap().fence;
        assert!(fence.is_some(), "{lookalike:?} is not this master");
    }
    let _: () = redis::cmd("SET")
        .arg(&record)
        .arg(&replid)
        .query(&mut s.redis.conn())
        .unwrap();
    assert_eq!(s.check_master(&a).await.unwrap().fence, None, "{replid}");
}

/// A proof-of-work solution is spent in the ticket script, and checked again there against
/// Redis as it is: one that expired by Redis's clock, or bound to another queue epoch, is
/// refused even when the gateway's last read said otherwise. (Before: a `SET NX PXAT` in the
/// past writes nothing, so an expired solution passed again and again, and the epoch was only
/// the gateway's cached one.)
#[tokio::test]
async fn a_solution_expired_by_redis_or_of_another_epoch_is_spent_already() {
    use flashgate::config::QueueSettings;
    use flashgate::waiting::store::{self, Fresh, Issued, Rewrite, Spend};
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let mut a = activity("1001", 3, 1, 3);
    let queue = QueueSettings {
        admit_per_second: 7,
        opens_at: a.starts_at,
        admission_window: Duration::from_secs(60),
        too_late_factor: 1.5,
        landing_url: None,
        stepped: None,
        challenge: None,
        draw: false,
    };
    a.queue = Some(queue.clone());
    let fresh = Fresh::random();
    let (state, _) = store::state(&s, &a, &queue, &fresh, Rewrite::NONE, None)
        .await
        .unwrap();
    let now = redis_time_ms(&redis);
    let spend = |challenge: &str, expires_ms: u64, epoch: u64| Spend {
        challenge: challenge.to_owned(),
        expires_ms,
        epoch,
        enforce: true,
    };
    let ticket = async |user: &str, spend: &Spend| {
        store::ticket(&s, &a, &queue, user, &fresh, Some(spend))
            .await
            .unwrap()
            .1
    };
    // Expired by Redis's clock: refused, and refused again (nothing was written to stop it).
    let expired = spend("aa", now - 1, state.epoch);
    assert_eq!(ticket("u1", &expired).await, Issued::Spent);
    assert_eq!(ticket("u1", &expired).await, Issued::Spent);
    // Bound to another epoch (a queue set up again since the gateway read it): refused.
    let other = spend("bb", now + 60_000, state.epoch ^ 1);
    assert_eq!(ticket("u2", &other).await, Issued::Spent);
    // A good one: a ticket, once.
    let good = spend("cc", now + 60_000, state.epoch);
    assert!(matches!(
        ticket("u3", &good).await,
        Issued::Ticket {
            fresh: true,
            spent: false,
            ..
        }
    ));
    assert_eq!(ticket("u3", &good).await, Issued::Spent);
}

/// Found by review of the read-ahead reserve: a hold of `nan` (the gateway sends integers)
/// made the script stop on a NaN table key after an earlier item's event was written, leaving
/// an event with no record. The script answers every item, each reservation with its record
/// and one event, as the script before the read-ahead did.
#[tokio::test]
async fn regression_a_nan_hold_does_not_stop_a_batch_midway() {
    let a = activity("1001", 10, 1, 3);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    let keys = s.keys().of(one(&l)).for_reserve(1);
    let source = format!(
        "{}\n{}",
        include_str!("../lua/lib.lua"),
        include_str!("../lua/reserve.lua")
    );
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(&source).arg(keys.len());
    for key in &keys {
        cmd.arg(key);
    }
    cmd.arg(1).arg(100_000).arg("").arg(0).arg("").arg(0);
    for (user, id, hold) in [("u1", "j1", "900000"), ("u2", "j2", "nan")] {
        cmd.arg(user)
            .arg(1)
            .arg(3)
            .arg(id)
            .arg(hold)
            .arg("")
            .arg("")
            .arg(0);
        cmd.arg(30_000)
            .arg(0)
            .arg(0)
            .arg(4_070_908_800_000u64)
            .arg("");
    }
    let mut reply: Vec<redis::Value> = cmd.query(&mut s.redis.conn()).unwrap();
    // Last: the records the segment holds (two reservations and the placeholder), and their
    // life.
    assert!(matches!(reply.pop(), Some(redis::Value::BulkString(_))));
    assert_eq!(reply.pop(), Some(redis::Value::Int(3)));
    let reply: Vec<Vec<redis::Value>> = reply
        .into_iter()
        .map(|item| redis::from_redis_value(item).unwrap())
        .collect();
    assert_eq!(reply.len(), 2);
    for (item, id) in reply.iter().zip(["j1", "j2"]) {
        assert_eq!(item[0], redis::Value::Int(1), "{id} reserved: {item:?}");
        let rec: Option<String> = redis::cmd("HGET")
            .arg(&keys[2])
            .arg(id)
            .query(&mut s.redis.conn())
            .unwrap();
        assert!(
            rec.is_some_and(|r| r.starts_with("pending|")),
            "{id}'s record"
        );
    }
    let reserves = reservation_events(&mut s.redis.conn(), &keys[6])
        .iter()
        .filter(|(_, kind)| kind == "reserve")
        .count();
    assert_eq!(reserves, 2, "one event per reservation");
    assert_eq!(remaining(&s, &a).await, Some(8));
}

/// docs/backends.md's event-stream consumer (the block after `<!-- event-consumer -->`), run as
/// written by python3 against this Redis: a batch of four reservations is one `reserve` entry,
/// two confirmations one `confirm` entry, and the consumer still makes each order once, pays
/// two and cancels the one released, in order.
#[tokio::test]
async fn the_documented_event_consumer_makes_each_order_once() {
    let a = activity("1001", 10, 1, 1);
    let s = Fixture::on_sale(&a).await;
    let l = Layout::of(&a);
    s.hold_reserves();
    let calls: Vec<ReserveCall<'static>> = (0..4)
        .map(|i| {
            call(
                &a,
                ["u0", "u1", "u 2", "u3"][i],
                1,
                ["r0", "r1", "r2", "r3"][i],
            )
        })
        .collect();
    let pending = futures_util::future::join_all(calls.iter().map(|c| s.reserve(one(&l), c)));
    let release_all = async {
        wait_for_async("every item to queue", Duration::from_secs(5), || async {
            (s.reserves_waiting() == 4).then_some(())
        })
        .await;
        s.release_reserves();
    };
    let (made, ()) = tokio::join!(pending, release_all);
    assert!(made
        .iter()
        .all(|o| matches!(o, Ok(ReserveOutcome::Reserved { .. }))));
    confirm_batch(&s, &a, &["r1", "r0"]).await.unwrap();
    release(&s, &a, 1, "r2", ReleaseMode::Owner).await;
    let mut conn = s.redis.conn();
    let entries: usize = redis::cmd("XLEN")
        .arg("fg:{1001}:events")
        .query(&mut conn)
        .unwrap();
    // One reserve entry, one confirm entry, one release entry (prewarm's stream starts empty).
    assert_eq!(entries, 3);

    let doc = std::fs::read_to_string(repo_path("docs/backends.md")).unwrap();
    let block = doc
        .split("<!-- event-consumer -->\n```python\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("docs/backends.md's event-consumer block");
    let url = s.redis.url();
    let port = url.rsplit(':').next().unwrap().trim_end_matches("/0");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("consumer.py");
    std::fs::write(
        &script,
        format!(
            "import json, sys, redis\n\
             _Redis = redis.Redis\n\
             redis.Redis = lambda *a, **k: _Redis(host='127.0.0.1', port={port})\n\
             class Db:\n    calls = []\n\
             \x20   def add(self, *call):\n\
             \x20       self.calls.append([x.decode() if isinstance(x, bytes) else x for x in call])\n\
             \x20       if len(self.calls) == 7:\n\
             \x20           print(json.dumps(self.calls)); sys.exit(0)\n\
             \x20   def create_order_once(self, jti, user, qty, ver): self.add('create', jti, user, qty, ver)\n\
             \x20   def mark_paid(self, jti): self.add('paid', jti)\n\
             \x20   def cancel(self, jti): self.add('cancel', jti)\n\
             db = Db()\n{block}\n"
        ),
    )
    .unwrap();
    let out = run_bounded(
        "the documented event consumer",
        // Debian's python3, with python3-redis (scripts/ensure-deps).
        std::process::Command::new("/usr/bin/python3").arg(&script),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls: Vec<Vec<String>> = serde_json::from_str(stdout.trim()).unwrap();
    let want: Vec<Vec<&str>> = vec![
        vec!["create", "r0", "u0", "1", "1"],
        vec!["create", "r1", "u1", "1", "1"],
        vec!["create", "r2", "u 2", "1", "1"],
        vec!["create", "r3", "u3", "1", "1"],
        vec!["paid", "r1"],
        vec!["paid", "r0"],
        vec!["cancel", "r2"],
    ];
    assert_eq!(calls, want);
}

/// Issue 45: `replicas_acknowledged` (lua/master.lua's `lift_rule`) lifts no fence while a
/// gateway reported a fate write (confirm, release, sweep) its `redis.ack_replicas` replicas
/// did not acknowledge (ARGV[11], recorded as `unacked`) since the fence began or within the
/// settle period before it: the promoted replica may lack that write (a confirmed sale still
/// pending there, to expire and sell again). An older report says nothing of this fence.
#[tokio::test]
async fn an_unacknowledged_fate_write_vetoes_the_replicas_acknowledged_lift() {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let port = master
        .url()
        .trim_end_matches("/0")
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&port)
        .query(&mut replica.conn())
        .unwrap();
    wait_for("the replica to sync", Duration::from_secs(20), || {
        (replication_field(&replica, "master_link_status") == "up").then_some(())
    });
    let old_id = replication_field(&master, "master_replid");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica.conn())
        .unwrap();
    assert_eq!(replication_field(&replica, "master_replid2"), old_id);
    // The promoted replica holds the old master's record, its persistence with one replica,
    // one reservation record, and a fence first seen 10 s ago.
    let (record, known, res, meta) = ("fg:{9}:master", "fg:{9}:known", "fg:{9}:res", "fg:{9}:meta");
    let now = redis_time_ms(&replica);
    let fenced_at = now - 10_000;
    let settle = 1_500u64;
    let mut c = replica.conn();
    let _: () = redis::cmd("SET")
        .arg(record)
        .arg(&old_id)
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(res)
        .arg("")
        .arg("1700000000000000")
        .arg("r1")
        .arg("pending")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(known)
        .arg("persist")
        .arg(format!("{old_id}|no|everysec|1"))
        .arg("fenced_at")
        .arg(fenced_at)
        .query(&mut c)
        .unwrap();
    let source = format!(
        "{}\n{}",
        include_str!("../lua/lib.lua"),
        include_str!("../lua/master.lua")
    );
    let check = |unacked: &str| {
        let reply: Vec<String> = redis::cmd("EVAL")
            .arg(&source)
            .arg(4)
            .arg(record)
            .arg(known)
            .arg(res)
            .arg(meta)
            .arg("")
            .arg(now / 1000 + 3600)
            .arg("")
            .arg(0)
            .arg("")
            .arg("no|everysec")
            .arg(1)
            .arg(settle)
            .arg(1)
            .arg(0)
            .arg(unacked)
            .query(&mut replica.conn())
            .unwrap();
        (reply[0].clone(), reply[5].clone())
    };
    let unacked_field = || {
        redis::cmd("HGET")
            .arg(known)
            .arg("unacked")
            .query::<Option<u64>>(&mut replica.conn())
            .unwrap()
    };
    let set_unacked = |at: u64| {
        let _: () = redis::cmd("HSET")
            .arg(known)
            .arg("unacked")
            .arg(at)
            .query(&mut replica.conn())
            .unwrap();
    };
    // A gateway holding an unacknowledged write says so: recorded, and the fence stands.
    assert_eq!(check("1").0, "fenced");
    let reported = unacked_field().expect("the report recorded");
    assert!(reported >= now, "{reported} {now}");
    // Its report stands for this fence after it stopped holding any.
    assert_eq!(check("").0, "fenced");
    // A report within the settle period before the fence vetoes too (the write may have been
    // the last the old master took).
    set_unacked(fenced_at - settle);
    assert_eq!(check("").0, "fenced");
    // An older report is of the time before: the rule lifts the fence.
    set_unacked(fenced_at - settle - 1);
    assert_eq!(
        check(""),
        ("lifted".to_owned(), "replicas_acknowledged".to_owned())
    );
    assert_eq!(
        redis::cmd("GET")
            .arg(record)
            .query::<String>(&mut replica.conn())
            .unwrap(),
        replication_field(&replica, "master_replid")
    );
}

/// What a recount may change in segment 0 of activity 1001, read by hand: the stock, the
/// ledger, the events, the known hash and the records.
fn recount_view(redis: &RedisServer) -> Vec<String> {
    let mut conn = redis.conn();
    let stock: Option<String> = redis::cmd("GET")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    let mut view = vec![format!("stock {stock:?}")];
    for (kind, key) in [
        ("ledger", "fg:{1001}:v1:ledger"),
        ("known", "fg:{1001}:known"),
        ("res", "fg:{1001}:res"),
    ] {
        let mut all: Vec<(String, String)> =
            redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
        all.sort();
        view.push(format!("{kind} {all:?}"));
    }
    let events: u64 = redis::cmd("XLEN")
        .arg("fg:{1001}:events")
        .query(&mut conn)
        .unwrap();
    view.push(format!("events {events}"));
    view
}

/// Issue 45 item 4: a recount is set once. Two recounts of the same loss at once: one sets
/// it, the other is refused before it changes anything; once it sells, a recount of the same
/// loss (the same count or another) is refused and changes nothing.
#[tokio::test]
async fn a_recount_is_set_once() {
    use flashgate::stock::segments::RecountError;
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 10, 1, 3);
    prewarm(&s, &a).await;
    assert!(left(reserve(&s, &a, "u1", 2, "r1").await).is_some());
    let l = Layout::of(&a);
    s.mark_lost(&a, one(&l), "keys_lost", None).await.unwrap();
    let stamp_before: (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg("fg:{1001}:known")
        .arg("lost")
        .arg("recount")
        .query(&mut redis.conn())
        .unwrap();
    assert!(stamp_before.0.is_some(), "marked lost");

    let (first, second) = tokio::join!(
        segments::recount(&s, &a, 8, segments::Settles::Loss),
        segments::recount(&s, &a, 5, segments::Settles::Loss)
    );
    let (done, refused) = match (first, second) {
        (Ok(done), Err(e)) | (Err(e), Ok(done)) => (done, e),
        other => panic!("exactly one recount sets the count: {other:?}"),
    };
    assert!(
        matches!(
            refused,
            RecountError::AlreadyRecounted { .. } | RecountError::NothingLost { .. }
        ),
        "{refused:?}"
    );
    let set = done.remaining;
    assert!(set == 8 || set == 5, "{done:?}");
    assert_eq!(remaining(&s, &a).await, Some(set as i64));
    let row = ledger(&s, &a, 1).await;
    assert_eq!(row.drift(), 0, "{row:?}");

    // It sells again; a recount of the same loss, later, with the same count or another.
    assert!(left(reserve(&s, &a, "u2", 1, "r2").await).is_some());
    let before = recount_view(&redis);
    for count in [set, 3, 0] {
        let refused = segments::recount(&s, &a, count, segments::Settles::Loss)
            .await
            .unwrap_err();
        assert!(
            matches!(refused, RecountError::NothingLost { .. }),
            "{count}: {refused:?}"
        );
        assert_eq!(recount_view(&redis), before, "{count}: nothing changed");
    }

    // The script's own check: a recount carrying the loss stamp read before the first one
    // (its claim lost, say) is refused there, atomically, and changes nothing.
    let keys = s.keys().of(one(&l)).for_recount(1);
    let source = format!(
        "{}\n{}",
        include_str!("../lua/lib.lua"),
        include_str!("../lua/recount.lua")
    );
    let stale = format!(
        "{}//{}",
        stamp_before.0.unwrap_or_default(),
        stamp_before.1.unwrap_or_default()
    );
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(&source).arg(keys.len());
    for key in &keys {
        cmd.arg(key);
    }
    cmd.arg(1)
        .arg(10)
        .arg(10)
        .arg(4_070_908_800u64)
        .arg(1000)
        .arg(10)
        .arg("")
        .arg(&stale);
    let reply: Vec<redis::Value> = cmd.query(&mut redis.conn()).unwrap();
    assert_eq!(reply.first(), Some(&redis::Value::Int(-5)), "{reply:?}");
    assert_eq!(
        recount_view(&redis),
        before,
        "the stale recount changed nothing"
    );
    let row = ledger(&s, &a, 1).await;
    assert_eq!(row.drift(), 0, "{row:?}");
    assert_eq!(row.remaining, set as i64 - 1);
}

/// Issue 45: a deleted ledger is detected (the reserve refuses the segment as damaged and
/// never makes the ledger again half; the prewarm marks the segment lost, keys_lost, and a
/// plain resume is refused) and repaired by a recount: the ledger made again balances, its
/// pending matches the records, and sales after it keep it balanced.
#[tokio::test]
async fn a_deleted_ledger_is_refused_and_repaired_by_a_recount() {
    use flashgate::stock::failover::Resumed;
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let a = activity("1001", 10, 1, 3);
    prewarm(&s, &a).await;
    assert!(left(reserve(&s, &a, "u1", 2, "r1").await).is_some());
    assert!(left(reserve(&s, &a, "u2", 1, "r2").await).is_some());
    assert!(matches!(
        confirm(&s, &a, 1, "r2").await,
        ConfirmOutcome::Confirmed
    ));
    redis.del(&["fg:{1001}:v1:ledger"]);

    assert_eq!(
        reserve(&s, &a, "u3", 1, "r3").await,
        ReserveOutcome::Damaged
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg("fg:{1001}:v1:ledger")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(exists, 0, "the reserve never makes the ledger again half");
    assert_eq!(remaining(&s, &a).await, Some(7), "nothing taken");

    assert!(matches!(
        segments::prewarm(&s, &a).await.unwrap(),
        Err(Refusal::Damaged { .. })
    ));
    let l = Layout::of(&a);
    let known = s.known(one(&l)).await.unwrap();
    assert_eq!(
        known.lost.as_ref().map(|(reason, _)| reason.as_str()),
        Some("keys_lost"),
        "{known:?}"
    );
    assert!(matches!(
        s.accept_master(&a).await.unwrap(),
        Resumed::Lost(_)
    ));

    // The count: 10 less the 3 the records hold.
    let done = segments::recount(&s, &a, 7, segments::Settles::Loss)
        .await
        .unwrap();
    assert_eq!(done.remaining, 7);
    let row = ledger(&s, &a, 1).await;
    assert!(row.ledger, "made again");
    assert_eq!(row.initial, 10, "{row:?}");
    assert_eq!(
        (row.pending, row.confirmed),
        (2, 1),
        "counted from the records"
    );
    assert_eq!(row.pending_reservations, 1, "r1, of 2 units: {row:?}");
    assert_eq!(row.drift(), 0, "{row:?}");
    assert_eq!(row.recounted, 0, "{row:?}");

    // Sales go on, balanced.
    assert!(left(reserve(&s, &a, "u3", 1, "r3").await).is_some());
    assert!(matches!(
        confirm(&s, &a, 1, "r1").await,
        ConfirmOutcome::Confirmed
    ));
    assert!(matches!(
        release(&s, &a, 1, "r3", ReleaseMode::Owner).await,
        ReleaseOutcome::Released { .. }
    ));
    let row = ledger(&s, &a, 1).await;
    assert_eq!(row.drift(), 0, "{row:?}");
    assert_eq!((row.remaining, row.pending, row.confirmed), (7, 0, 3));
    assert_eq!(s.known(one(&l)).await.unwrap().lost, None);
}

/// A queue's start moved earlier: only by a reload (`Rewrite::START`), only before the queue
/// opened; a gateway on the older file (not reloading) then cannot move it back, though a
/// later postponement still applies. Once drawn, an earlier start is not applied: the one that
/// stays is what `check --live` and the reload name.
#[tokio::test]
async fn a_queue_start_moves_earlier_only_by_a_reload_before_it_opened() {
    use flashgate::config::QueueSettings;
    use flashgate::waiting::store::{self, Fresh, Rewrite};
    let redis = RedisServer::start();
    let s = store(redis.url(), 1000);
    let now = redis_time_ms(&redis) as i64;
    let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap();
    let mut a = activity("1001", 3, 1, 3);
    let queue = QueueSettings {
        admit_per_second: 7,
        opens_at: at(now - 1_000),
        admission_window: Duration::from_secs(60),
        too_late_factor: 1.5,
        landing_url: None,
        stepped: None,
        challenge: None,
        draw: false,
    };
    a.queue = Some(queue.clone());
    let fresh = Fresh::random();
    let old_start = now + 46 * 60_000;
    let state_at = async |start: i64, rewrite: Rewrite| {
        let mut b = a.clone();
        b.starts_at = at(start);
        store::state(&s, &b, &queue, &fresh, rewrite, None)
            .await
            .unwrap()
            .0
            .start_ms as i64
    };
    assert_eq!(state_at(old_start, Rewrite::NONE).await, old_start);
    // Earlier without a reload (a gateway restarted with some file): the start stays.
    let earlier = now + 34 * 60_000;
    assert_eq!(state_at(earlier, Rewrite::NONE).await, old_start);
    // A reload moved it: applied.
    assert_eq!(state_at(earlier, Rewrite::START).await, earlier);
    // A gateway still on the older file cannot move it back, nor can its reload that leaves
    // the file as it was (ADVANCE moves a start earlier only).
    assert_eq!(state_at(old_start, Rewrite::NONE).await, earlier);
    assert_eq!(state_at(old_start, Rewrite::ADVANCE).await, earlier);
    // A postponement past the superseded start still applies.
    let later = now + 50 * 60_000;
    assert_eq!(state_at(later, Rewrite::NONE).await, later);
    // A reload that applies an earlier start it did not change (after a restart with it).
    let restarted = now + 48 * 60_000;
    assert_eq!(state_at(restarted, Rewrite::NONE).await, later);
    assert_eq!(state_at(restarted, Rewrite::ADVANCE).await, restarted);
    assert_eq!(state_at(later, Rewrite::NONE).await, restarted);
    // Once a ticket was issued (someone was told a place and a time), an earlier start is
    // not applied, even by a reload.
    let mut b = a.clone();
    b.starts_at = at(restarted);
    store::ticket(&s, &b, &queue, "u1", &fresh, None)
        .await
        .unwrap();
    assert_eq!(state_at(earlier, Rewrite::START).await, restarted);
}

/// The fleet's roll (`lua/fleet.lua`): every gateway that beat within the window, by Redis's
/// clock; one that stopped beating is dropped once the window passed; both keys expire.
#[tokio::test]
async fn the_fleet_roll_lists_who_beat_within_the_window() {
    let f = Fixture::start();
    let other = store(f.redis.url(), 1000);
    let window = Duration::from_secs(60);
    f.fleet_beat("{\"admin\":\"a\"}", window).await.unwrap();
    let roll = other.fleet_beat("{\"admin\":\"b\"}", window).await.unwrap();
    let about = |roll: &flashgate::stock::scripts::fleet::Roll, id: &str| {
        roll.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.about.clone())
    };
    assert_eq!(roll.members.len(), 2);
    assert_eq!(about(&roll, f.presence_id()).unwrap(), "{\"admin\":\"a\"}");
    assert_eq!(
        about(&roll, other.presence_id()).unwrap(),
        "{\"admin\":\"b\"}"
    );
    assert!(roll.members.iter().all(|m| m.seen_ms <= roll.now_ms));
    // A beat again moves only its own time; the other stays listed.
    let again = f.fleet_beat("{\"admin\":\"a2\"}", window).await.unwrap();
    assert_eq!(again.members.len(), 2);
    assert_eq!(
        about(&again, f.presence_id()).unwrap(),
        "{\"admin\":\"a2\"}"
    );
    assert_eq!(
        about(&again, other.presence_id()).unwrap(),
        "{\"admin\":\"b\"}"
    );
    // With a window of 20 ms, the other gateway (no longer beating) drops out.
    let alone = wait_for_async(
        "the silent gateway dropped",
        Duration::from_secs(5),
        || async {
            let roll = f.fleet_beat("{}", Duration::from_millis(20)).await.unwrap();
            (roll.members.len() == 1).then_some(roll)
        },
    )
    .await;
    assert_eq!(alone.members[0].id, f.presence_id());
    let mut conn = f.redis.conn();
    // Keys written by hand: 10,000 stale members, 10,000 ahead of now, 100 live. The beat still
    // answers, lists at most 64 (its own included), and drops the stale and the future ones.
    let [seen, about] = f.keys().fleet();
    let now: u64 = {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
        s * 1000 + us / 1000
    };
    let mut add = redis::cmd("ZADD");
    add.arg(&seen);
    for i in 0..10_000u64 {
        add.arg(now - 60_000 - i).arg(format!("stale-{i}"));
        add.arg(now + 60_000 + i).arg(format!("ahead-{i}"));
    }
    for i in 0..100u64 {
        add.arg(now).arg(format!("live-{i}"));
    }
    let _: () = add.query(&mut conn).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&about)
        .arg("live-1")
        .arg("<b>not json</b>")
        .query(&mut conn)
        .unwrap();
    let mut roll = f.fleet_beat("{}", window).await.unwrap();
    assert_eq!(roll.members.len(), 64, "bounded");
    assert!(
        roll.members.iter().any(|m| m.id == f.presence_id()),
        "its own line, the newest"
    );
    assert!(roll
        .members
        .iter()
        .all(|m| m.id.starts_with("live-") || m.id == f.presence_id()));
    for _ in 0..100 {
        let left: u64 = redis::cmd("ZCARD").arg(&seen).query(&mut conn).unwrap();
        if left <= 102 {
            break;
        }
        roll = f.fleet_beat("{}", window).await.unwrap();
    }
    let left: u64 = redis::cmd("ZCARD").arg(&seen).query(&mut conn).unwrap();
    assert!(
        left <= 102,
        "the stale and future ones dropped, a bounded number a beat: {left}"
    );
    assert_eq!(roll.members.len(), 64);
    let _: () = redis::cmd("DEL")
        .arg(&seen)
        .arg(&about)
        .query(&mut conn)
        .unwrap();
    let _ = f.fleet_beat("{}", Duration::from_millis(20)).await.unwrap();
    for key in f.keys().fleet() {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl > 0 && ttl <= 40, "{key}: {ttl}");
        let about: u64 = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
        assert_eq!(about, 1);
    }
}
