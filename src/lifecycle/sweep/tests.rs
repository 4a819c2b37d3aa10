//! The sweep against the in-process fake store: what expires when, what is handed out for an
//! order lookup and how each answer settles it, transfers left half done, and the ledger check.
//! Time is tokio's paused clock, which is also the fake's Redis clock.

use super::super::tests::{Harness, HOLD};
use super::*;
use crate::stock::fake::FakeStore;
use crate::stock::{Reads, RecordState, ReserveCall, ReserveOutcome, SaleHours};
use std::sync::Arc;
use std::time::Duration;

async fn advance(by: Duration) {
    tokio::time::advance(by).await;
}

/// The retry interval `Harness` configures for the order lookup.
const LEASE: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn pending_reservations_expire_at_their_hold_deadline_not_before() {
    let h = Harness::new(1, false);
    let rs: Vec<_> = (0..3).map(|i| h.reserve(&format!("u{i}"), None)).collect();
    advance(HOLD - Duration::from_secs(1)).await;
    assert_eq!(h.lifecycle.sweep_expired().await, 0);
    assert_eq!(h.left(), 7);
    advance(Duration::from_secs(1)).await;
    assert_eq!(h.lifecycle.sweep_expired().await, 3);
    assert_eq!(h.left(), 10);
    for r in &rs {
        let record = h.record(r).await.unwrap();
        assert_eq!(record.state, RecordState::Released);
        assert_eq!(record.reason.as_deref(), Some("expired"));
    }
    assert_eq!(h.released(ReleaseReason::Expired), 3);
    assert_eq!(h.news().await, ["available a1 1"]);
    assert_eq!(h.lifecycle.sweep_expired().await, 0, "exactly once");
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn one_tick_sweeps_batch_after_batch_while_they_come_back_full() {
    let h = Harness::with(1, false, ", sweep_batch: 2");
    for i in 0..5 {
        h.reserve(&format!("u{i}"), None);
    }
    advance(HOLD).await;
    assert_eq!(h.lifecycle.sweep_expired().await, 5);
    assert_eq!(h.left(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_reservation_never_expires() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let ids = [r.id.as_str()];
    h.lifecycle
        .confirm(p, 1, &ids, ConfirmedVia::Upstream)
        .await
        .unwrap();
    advance(HOLD * 2).await;
    assert_eq!(h.lifecycle.sweep_expired().await, 0);
    assert_eq!(h.state(&r).await, RecordState::Confirmed);
    assert_eq!(h.left(), 9);
}

#[tokio::test(start_paused = true)]
async fn every_segment_is_swept_though_one_cannot_be_read() {
    let h = Harness::new(4, false);
    let layout = h.layout();
    // One buyer at home in each segment.
    for index in 0..4 {
        let user = (0..)
            .map(|i| format!("u{i}"))
            .find(|u| layout.home(u).index() == index)
            .unwrap();
        h.reserve(&user, None);
    }
    advance(HOLD).await;
    h.store.fail("meta", 1);
    assert_eq!(h.lifecycle.sweep_expired().await, 3, "segment 0 skipped");
    assert_eq!(h.lifecycle.sweep_expired().await, 1);
    assert_eq!(h.left(), 10);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn an_activity_dropped_from_the_configuration_still_settles() {
    let h = Harness::new(1, false);
    let gone = Layout::new(Arc::from("gone"), 2);
    h.store.on_sale(&gone, 3, 4);
    let home = gone.home("bob");
    let call = ReserveCall {
        user: "bob",
        qty: 2,
        per_user_limit: 5,
        version: 3,
        reservation_id: "r1.0",
        hold: HOLD,
        idempotency_key: None,
        deposit: None,
        in_flight: Duration::ZERO,
        replay_only: false,
        hours: SaleHours::ALWAYS,
        steps: None,
        line: false,
    };
    let reserved = h.store.reserve_now(home, &call);
    assert!(matches!(reserved, ReserveOutcome::Reserved { .. }));
    advance(HOLD).await;
    assert_eq!(h.lifecycle.sweep_expired().await, 1);
    assert_eq!(h.store.stock(home, 3), Some(2));
    h.store.check_ledgers();
}

/// Reservations past their deadline, handed out once.
async fn handed(h: &Harness, users: usize) -> Vec<HandedOut> {
    for i in 0..users {
        h.reserve(&format!("u{i}"), None);
    }
    advance(HOLD).await;
    h.lifecycle.hand_out().await
}

fn at(store: &FakeStore, handed: &HandedOut) -> Option<u64> {
    let segment = handed.layout.segment(handed.segment).unwrap();
    store.due_at(segment, handed.version, &handed.leased.id)
}

#[tokio::test(start_paused = true)]
async fn with_an_order_lookup_what_is_due_is_handed_out_once_per_lease() {
    let h = Harness::new(1, true);
    let out = handed(&h, 2).await;
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|o| o.leased.fence == 2), "{out:?}");
    assert_eq!(h.left(), 8, "nothing released without an answer");
    assert!(h.lifecycle.hand_out().await.is_empty(), "leased");
    assert_eq!(at(&h.store, &out[0]), Some(h.store.now_ms() + 5_000));
    advance(LEASE).await;
    let again = h.lifecycle.hand_out().await;
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|o| o.leased.fence == 3), "{again:?}");
}

#[tokio::test(start_paused = true)]
async fn a_not_found_releases_under_the_hand_outs_fence_only() {
    let h = Harness::new(1, true);
    let first = handed(&h, 1).await.remove(0);
    advance(LEASE).await;
    let second = h.lifecycle.hand_out().await.remove(0);
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let stale = h
        .lifecycle
        .settle_answer(p, 1, &first.leased, Answer::NotFound)
        .await;
    assert!(!stale, "an answer to an earlier hand-out is discarded");
    assert_eq!(h.left(), 9);
    let current = h
        .lifecycle
        .settle_answer(p, 1, &second.leased, Answer::NotFound)
        .await;
    assert!(current);
    assert_eq!(h.left(), 10);
    assert_eq!(h.released(ReleaseReason::OrderNotFound), 1);
    let asked = h
        .metrics
        .order_lookups
        .with_label_values(&["a1", "not_found"]);
    assert_eq!(asked.get(), 2);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn found_confirms_and_unanswered_keeps_it_pending() {
    let h = Harness::new(1, true);
    let out = handed(&h, 2).await;
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let found = &out[0].leased;
    let silent = &out[1].leased;
    assert!(!h.lifecycle.settle_answer(p, 1, found, Answer::Found).await);
    assert!(
        !h.lifecycle
            .settle_answer(p, 1, silent, Answer::Unanswered)
            .await
    );
    let state = |id: &str| {
        let store = h.store.clone();
        let id = id.to_owned();
        async move {
            let layout = Layout::new(Arc::from("a1"), 1);
            let p = layout.segment(0).unwrap();
            Reads::lookup(&*store, p, &id).await.unwrap().unwrap().state
        }
    };
    assert_eq!(state(&found.id).await, RecordState::Confirmed);
    assert_eq!(state(&silent.id).await, RecordState::Pending);
    assert_eq!(h.confirmed(ConfirmedVia::Lookup), 1);
    assert_eq!(h.left(), 8);
    // Asked again after the lease.
    advance(LEASE).await;
    let again = h.lifecycle.hand_out().await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].leased.id, silent.id);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn unanswered_for_too_long_it_expires() {
    let h = Harness::new(1, true);
    let out = handed(&h, 1).await;
    assert_eq!(out.len(), 1);
    // give_up_after_secs: 600 past the deadline.
    advance(Duration::from_secs(600)).await;
    assert!(h.lifecycle.hand_out().await.is_empty());
    assert_eq!(h.left(), 10);
    assert_eq!(h.released(ReleaseReason::Expired), 1);
}

#[tokio::test(start_paused = true)]
async fn a_transfer_left_half_done_is_delivered_once_it_cannot_be_in_flight() {
    let h = Harness::new(2, false);
    let layout = h.layout();
    let (home, giver) = (layout.segment(0).unwrap(), layout.segment(1).unwrap());
    h.store.withdrawn(giver, 1, "t1", 0, 2);
    assert_eq!(h.left(), 8, "two units in flight");
    advance(Duration::from_millis(STRANDED_TRANSFER_AFTER_MS)).await;
    h.lifecycle.sweep_expired().await;
    assert_eq!(h.left(), 8, "a rebalance may still be delivering it");
    assert!(h.news().await.is_empty());
    advance(Duration::from_millis(1)).await;
    h.lifecycle.sweep_expired().await;
    assert_eq!(h.store.stock(home, 1), Some(5 + 2));
    assert_eq!(h.left(), 10);
    let (open, _) = Reads::transfers(&*h.store, giver).await.unwrap();
    assert!(open.is_empty(), "acknowledged: {open:?}");
    assert_eq!(h.news().await, ["available a1 1"]);
    h.lifecycle.sweep_expired().await;
    assert_eq!(h.left(), 10, "delivered once");
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn the_ledger_check_exports_the_drift() {
    let h = Harness::new(2, false);
    h.reserve("alice", None);
    let drift = h.metrics.reconcile_drift.with_label_values(&["a1"]);
    drift.set(-1);
    h.lifecycle.check_drift().await;
    assert_eq!(drift.get(), 0);
    let layout = h.layout();
    h.store.lose(layout.segment(1).unwrap(), 1, 3);
    h.lifecycle.check_drift().await;
    assert_eq!(drift.get(), 3);
}
