//! A buyer's reserve over segments against the in-process fake store: the Rust side of
//! rebalancing (which giver, how much, when sold out, what a failure leaves behind). The
//! scripts themselves are proven against Redis by tests/scripts.rs and the model test.

use super::*;
use crate::stock::fake::FakeStore;
use std::sync::Arc;

fn activity(stock: u64, segments: u32) -> Arc<Activity> {
    let settings = crate::config::testing::settings(&format!(
        r#"  - {{ id: a1, stock: {stock}, version: 1, per_user_limit: 50, max_per_request: 50, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900, segments: {segments} }}
"#
    ));
    settings.activities.get("a1").unwrap().clone()
}

fn purchase<'a>(user: &'a str, id: &'a str, qty: u32) -> Purchase<'a> {
    Purchase {
        user,
        qty,
        reservation_id: id,
        idempotency_key: None,
        in_flight: Duration::from_secs(30),
        replay_only: false,
        steps: None,
    }
}

/// A store with `a` on sale, and a buyer at home in segment 0.
fn on_sale(a: &Activity) -> (FakeStore, String) {
    let store = FakeStore::default();
    store.on_sale(&Layout::of(a), 1, a.stock);
    (store, home_of(a, 0))
}

fn home_of(a: &Activity, index: u32) -> String {
    let layout = Layout::of(a);
    (0..)
        .map(|i| format!("u{i}"))
        .find(|u| layout.home(u).index() == index)
        .unwrap()
}

fn left(store: &FakeStore, a: &Activity, index: u32) -> i64 {
    let layout = Layout::of(a);
    store.stock(layout.segment(index).unwrap(), 1).unwrap()
}

async fn open_transfers(store: &FakeStore, a: &Activity, index: u32) -> usize {
    let layout = Layout::of(a);
    let giver = layout.segment(index).unwrap();
    store.transfers(giver).await.unwrap().0.len()
}

#[tokio::test(start_paused = true)]
async fn a_buyer_reserves_at_home() {
    let a = activity(8, 2);
    let (store, user) = on_sale(&a);
    let outcome = reserve(&store, &a, purchase(&user, "r1.0", 2))
        .await
        .unwrap();
    let ReserveAnswer::Reserved {
        segment,
        replayed,
        remaining,
        ..
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!((segment, replayed, remaining), (0, false, None));
    assert_eq!((left(&store, &a, 0), left(&store, &a, 1)), (2, 4));
}

#[tokio::test(start_paused = true)]
async fn a_home_short_of_units_pulls_a_chunk_from_another_segment() {
    // 64 units over 2 segments: 32 each, a chunk is 64 / (2 * 8) = 4.
    let a = activity(64, 2);
    let (store, user) = on_sale(&a);
    let first = reserve(&store, &a, purchase(&user, "r1.0", 31)).await;
    assert!(matches!(first.unwrap(), ReserveAnswer::Reserved { .. }));
    let outcome = reserve(&store, &a, purchase(&user, "r2.0", 2))
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReserveAnswer::Reserved { segment: 0, .. }),
        "{outcome:?}"
    );
    // One unit was there, a chunk of 4 came (more than the one missing): 3 left at home.
    assert_eq!((left(&store, &a, 0), left(&store, &a, 1)), (3, 28));
    assert_eq!(open_transfers(&store, &a, 1).await, 0, "acknowledged");
    store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn sold_out_only_when_the_whole_activity_holds_less_than_asked() {
    let a = activity(4, 2);
    let (store, user) = on_sale(&a);
    let outcome = reserve(&store, &a, purchase(&user, "r1.0", 3))
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReserveAnswer::Reserved { .. }),
        "{outcome:?}"
    );
    let outcome = reserve(&store, &a, purchase(&user, "r2.0", 2))
        .await
        .unwrap();
    assert_eq!(outcome, ReserveAnswer::SoldOut { left: 1 });
    store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn units_in_flight_are_not_sold_out_but_busy() {
    let a = activity(4, 2);
    let (store, user) = on_sale(&a);
    let layout = Layout::of(&a);
    let (home, giver) = (layout.segment(0).unwrap(), layout.segment(1).unwrap());
    // Every unit of both segments is in flight (withdrawn by gateways that died).
    store.withdrawn(home, 1, "t0", 1, 2);
    store.withdrawn(giver, 1, "t1", 0, 2);
    let outcome = reserve(&store, &a, purchase(&user, "r1.0", 1))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReserveAnswer::Busy,
        "units exist: retry, not sold out"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unsegmented_activity_is_sold_out_at_once() {
    let a = activity(2, 1);
    let (store, user) = on_sale(&a);
    let outcome = reserve(&store, &a, purchase(&user, "r1", 3)).await.unwrap();
    assert_eq!(outcome, ReserveAnswer::SoldOut { left: 2 });
    assert_eq!(left(&store, &a, 0), 2);
}

#[tokio::test(start_paused = true)]
async fn a_version_not_on_sale_is_prewarmed_once() {
    let a = activity(4, 2);
    let store = FakeStore::default();
    let user = home_of(&a, 0);
    let outcome = reserve(&store, &a, purchase(&user, "r1.0", 1))
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReserveAnswer::Reserved { .. }),
        "{outcome:?}"
    );
    assert_eq!(store.prewarms(), 1);
    // A replay-only call (a waiting room held the buyer back) never puts anything on sale.
    let fresh = FakeStore::default();
    let replay = Purchase {
        replay_only: true,
        ..purchase(&user, "r2.0", 1)
    };
    let outcome = reserve(&fresh, &a, replay).await.unwrap();
    assert_eq!(outcome, ReserveAnswer::NotReplayed);
    assert_eq!(fresh.prewarms(), 0);
    // Refused by what Redis recorded: not on sale, with the reason.
    let refused = FakeStore::default();
    let refusal = Refusal::OldLayout { id: "a1".into() };
    refused.refuse(refusal.clone());
    let outcome = reserve(&refused, &a, purchase(&user, "r3.0", 1))
        .await
        .unwrap();
    assert_eq!(outcome, ReserveAnswer::NotOnSale(Some(refusal)));
}

#[tokio::test(start_paused = true)]
async fn a_failed_reserve_says_whether_it_may_have_landed() {
    let a = activity(4, 2);
    let (store, user) = on_sale(&a);
    store.fail("reserve", 1);
    let failed = reserve(&store, &a, purchase(&user, "r1.0", 1))
        .await
        .unwrap_err();
    assert_eq!(
        failed.landed_maybe,
        Some(0),
        "a timeout may have landed at home"
    );
    // A failed prewarm ran nothing that a retry must abandon.
    let fresh = FakeStore::default();
    fresh.fail("prewarm", 1);
    let failed = reserve(&fresh, &a, purchase(&user, "r2.0", 1))
        .await
        .unwrap_err();
    assert_eq!(failed.landed_maybe, None);
}

#[tokio::test(start_paused = true)]
async fn a_deposit_cut_short_stays_recorded_on_the_giver() {
    let a = activity(4, 2);
    let (store, user) = on_sale(&a);
    let first = reserve(&store, &a, purchase(&user, "r1.0", 2)).await;
    assert!(matches!(first.unwrap(), ReserveAnswer::Reserved { .. }));
    // The home is empty; its reserve does not answer: abandoned by id at home, nothing pulled.
    store.fail("reserve", 1);
    let failed = reserve(&store, &a, purchase(&user, "r2.0", 1)).await;
    assert_eq!(failed.unwrap_err().landed_maybe, Some(0));
    assert_eq!(open_transfers(&store, &a, 1).await, 0, "nothing withdrawn");
    // Now the home answers short, the giver gives, and the deposit's answer is lost.
    let layout = Layout::of(&a);
    let (home, giver) = (layout.segment(0).unwrap(), layout.segment(1).unwrap());
    let call = ReserveCall {
        user: &user,
        qty: 1,
        per_user_limit: 50,
        version: 1,
        reservation_id: "r4.0",
        hold: a.hold,
        idempotency_key: None,
        deposit: None,
        in_flight: Duration::ZERO,
        replay_only: false,
        hours: SaleHours::ALWAYS,
        steps: None,
        line: false,
    };
    assert_eq!(store.withdraw_now(giver, 1, "t1", 1, 0), 1);
    store.fail("reserve", 1);
    let lost = deposit_and_reserve(&store, giver, home, &call, "t1", 1).await;
    assert!(lost.is_err());
    assert_eq!(open_transfers(&store, &a, 1).await, 1, "never forgotten");
    // Landed: acknowledged.
    let landed = deposit_and_reserve(&store, giver, home, &call, "t1", 1).await;
    assert!(matches!(landed.unwrap(), ReserveOutcome::Reserved { .. }));
    assert_eq!(open_transfers(&store, &a, 1).await, 0);
    store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn a_pull_whose_deposit_does_not_answer_is_abandoned_at_home() {
    let a = activity(4, 2);
    let (store, user) = on_sale(&a);
    let first = reserve(&store, &a, purchase(&user, "r1.0", 2)).await;
    assert!(matches!(first.unwrap(), ReserveAnswer::Reserved { .. }));
    // The home answers short; the giver gives; the deposit-and-reserve does not answer.
    store.fail_later("reserve", 1, 1);
    let failed = reserve(&store, &a, purchase(&user, "r2.0", 1)).await;
    assert_eq!(failed.unwrap_err().landed_maybe, Some(0));
    assert_eq!(open_transfers(&store, &a, 1).await, 1, "left for the sweep");
    store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn nothing_left_of_an_older_version_is_not_sold_out() {
    let a = activity(4, 2);
    let (store, user) = on_sale(&a);
    let first = reserve(&store, &a, purchase(&user, "r1.0", 2)).await;
    assert!(matches!(first.unwrap(), ReserveAnswer::Reserved { .. }));
    let user2 = home_of(&a, 1);
    let second = reserve(&store, &a, purchase(&user2, "r2.1", 2)).await;
    assert!(matches!(second.unwrap(), ReserveAnswer::Reserved { .. }));
    // Another instance claimed version 2 (it retires version 1 segment by segment).
    store.claimed("a1", 2);
    let outcome = reserve(&store, &a, purchase(&user, "r3.0", 1))
        .await
        .unwrap();
    let ReserveAnswer::NotOnSale(Some(Refusal::OlderVersion { newest, .. })) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(newest, 2);
}
