//! The lifecycle against the in-process fake store (`crate::stock::fake`): what it counts,
//! announces and refuses from what the store answers, on tokio's paused clock (which is also
//! the fake's Redis clock). The scripts are proven against Redis by tests/scripts.rs and the
//! model test.

use super::*;
use crate::config::Settings;
use crate::live::Generation;
use crate::stock::fake::FakeStore;
use crate::stock::{RecordState, ReserveCall, ReserveOutcome, SaleHours};
use std::time::Duration;

/// The longest trip of a forwarded request, as reserves in these tests give it.
pub(super) const IN_FLIGHT: Duration = Duration::from_secs(30);

/// The hold of activity `a1` (`hold_secs: 900`).
pub(super) const HOLD: Duration = Duration::from_secs(900);

fn settings(segments: u32, lookup: bool, redis: &str) -> Settings {
    let lookup = if lookup {
        ", order_lookup: { path: \"/orders/{jti}\", retry_interval_ms: 5000, give_up_after_secs: 600 }"
    } else {
        ""
    };
    let upstream = format!(r#"upstream: {{ addresses: ["127.0.0.1:3"]{lookup} }}"#);
    let redis = format!(r#"redis: {{ url: "redis://127.0.0.1:4"{redis} }}"#);
    crate::config::testing::settings_with(
        &[&upstream, &redis],
        &format!(
            r#"  - {{ id: a1, stock: 10, version: 1, per_user_limit: 5, max_per_request: 3, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900, segments: {segments} }}
"#
        ),
    )
}

/// A lifecycle over a fake store holding activity `a1` (10 units, version 1) on sale.
pub(super) struct Harness {
    pub store: Arc<FakeStore>,
    pub lifecycle: Arc<Lifecycle<FakeStore>>,
    pub metrics: Arc<Metrics>,
    pub activity: Arc<Activity>,
}

impl Harness {
    /// Made inside the test's runtime (the fake's clock starts there).
    pub fn new(segments: u32, lookup: bool) -> Harness {
        Harness::with(segments, lookup, "")
    }

    /// With more of the `redis` section (`", sweep_batch: 2"`).
    pub fn with(segments: u32, lookup: bool, redis: &str) -> Harness {
        let settings = Arc::new(settings(segments, lookup, redis));
        let activity = settings.activities.get("a1").unwrap().clone();
        let store = Arc::new(FakeStore::default());
        store.on_sale(&Layout::of(&activity), 1, 10);
        let metrics = Arc::new(Metrics::new());
        let (upstreams, _health) = Upstreams::new(&settings.upstream).unwrap();
        let live = Live::new(Generation::build(settings, None));
        let lifecycle = Arc::new(Lifecycle::new(
            live,
            store.clone(),
            metrics.clone(),
            crate::sale::SaleState::new().1,
            Arc::new(upstreams),
        ));
        Harness {
            store,
            lifecycle,
            metrics,
            activity,
        }
    }

    pub fn layout(&self) -> Layout {
        Layout::of(&self.activity)
    }

    /// A purchase of one unit by `user` (with an idempotency key, if any), as admission makes
    /// it: owned if it reserved now, not if the key's earlier reservation was replayed.
    pub fn reserve(&self, user: &str, key: Option<&str>) -> Reservation {
        let a = &self.activity;
        let layout = self.layout();
        let home = layout.home(user);
        let id = Reservation::id_in_segment(a, home.index());
        let call = ReserveCall {
            user,
            qty: 1,
            per_user_limit: a.per_user_limit.get(),
            version: a.version,
            reservation_id: &id,
            hold: a.hold,
            idempotency_key: key,
            deposit: None,
            in_flight: IN_FLIGHT,
            replay_only: false,
            hours: SaleHours::ALWAYS,
            steps: None,
            line: false,
        };
        let (id, owned, created_ms, deadline_ms, fence) = match self.store.reserve_now(home, &call)
        {
            ReserveOutcome::Reserved {
                created_ms,
                deadline_ms,
                fence,
                ..
            } => (id, true, created_ms, deadline_ms, fence),
            ReserveOutcome::Replayed {
                id,
                created_ms,
                deadline_ms,
                fence,
                ..
            } => (id, false, created_ms, deadline_ms, fence),
            other => panic!("reserve answered {other:?}"),
        };
        Reservation {
            id,
            user: user.to_owned(),
            activity: a.id.clone(),
            variant: a.variant.clone(),
            segment: home.index(),
            qty: 1,
            version: a.version,
            owned,
            created_ms,
            deadline_ms,
            fence,
            phase: None,
        }
    }

    /// The record of a reservation, tombstones included.
    pub async fn record(&self, r: &Reservation) -> Option<ReservationRecord> {
        let layout = self.layout();
        let segment = layout.segment(r.segment).unwrap();
        Reads::lookup(&*self.store, segment, &r.id).await.unwrap()
    }

    pub async fn state(&self, r: &Reservation) -> RecordState {
        self.record(r).await.expect("a record").state
    }

    /// Units left of version 1 over every segment.
    pub fn left(&self) -> i64 {
        let layout = self.layout();
        layout
            .segments()
            .map(|p| self.store.stock(p, 1).unwrap_or(0))
            .sum()
    }

    pub fn released(&self, reason: ReleaseReason) -> u64 {
        self.metrics
            .reservations_released
            .with_label_values(&["a1", reason.as_str()])
            .get()
    }

    pub fn confirmed(&self, via: ConfirmedVia) -> u64 {
        self.metrics
            .reservations_confirmed
            .with_label_values(&["a1", via.as_str()])
            .get()
    }

    /// Lets spawned tasks run (and paused time auto-advance) until `done` holds.
    pub async fn until(&self, mut done: impl AsyncFnMut() -> bool) {
        for _ in 0..10_000 {
            if done().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never happened");
    }

    /// `flashgate_stock_remaining` of `a1`, as exported (read from the export: the gauge has
    /// one writer, and tests/layers.rs checks that by its field's name).
    pub fn units_left(&self) -> String {
        let text = String::from_utf8(self.metrics.encode()).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("flashgate_stock_remaining{activity=\"a1\"}"))
            .expect("the gauge is set");
        line.rsplit(' ').next().unwrap().to_owned()
    }

    /// News published so far.
    pub async fn news(&self) -> Vec<String> {
        tokio::task::yield_now().await;
        self.store.published()
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_request_releases_its_own_reservation_once() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    assert_eq!(h.left(), 9);
    // The last unit went: the lifecycle marks the version sold out (and says so).
    h.lifecycle
        .learned_left(&h.activity, 0, Duration::from_secs(60));
    let outcome = h
        .lifecycle
        .release_failed(&h.activity, &r, ReleaseReason::Upstream5xx)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReleaseOutcome::Released {
            remaining: Some(10)
        }
    );
    assert_eq!(h.left(), 10);
    assert_eq!(h.state(&r).await, RecordState::Released);
    assert_eq!(h.released(ReleaseReason::Upstream5xx), 1);
    assert_eq!(
        h.units_left(),
        "10",
        "the units left, as the release answered"
    );
    assert!(
        !h.lifecycle
            .state()
            .is_sold_out(&h.activity, Duration::from_secs(60)),
        "units came back: purchasable here at once"
    );
    assert_eq!(h.news().await, ["sold_out a1 1", "available a1 1"]);

    let again = h
        .lifecycle
        .release_failed(&h.activity, &r, ReleaseReason::Upstream5xx)
        .await
        .unwrap();
    assert_eq!(again, ReleaseOutcome::AlreadyReleased);
    assert_eq!(h.released(ReleaseReason::Upstream5xx), 1, "counted once");
    assert_eq!(h.left(), 10, "units returned once");
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn a_request_never_releases_a_reservation_it_did_not_make() {
    let h = Harness::new(1, false);
    let first = h.reserve("alice", Some("k1"));
    let replay = h.reserve("alice", Some("k1"));
    assert_eq!(replay.id, first.id, "a replay returns the same jti");
    assert!(first.owned && !replay.owned);
    // The replay's request failed: never released by it, nothing asked of the store.
    h.store.fail("release", 1);
    let outcome = h
        .lifecycle
        .release_failed(&h.activity, &replay, ReleaseReason::UpstreamError)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::KeptReplayed);
    // The request that made it fails too: the store refuses, it was handed on.
    h.store.fail("release", 0);
    let outcome = h
        .lifecycle
        .release_failed(&h.activity, &first, ReleaseReason::UpstreamError)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::KeptReplayed);
    assert_eq!(h.state(&first).await, RecordState::Pending);
    assert_eq!(h.left(), 9);
    assert_eq!(h.released(ReleaseReason::UpstreamError), 0);
    assert!(h.news().await.is_empty(), "nothing came back");
}

#[tokio::test(start_paused = true)]
async fn a_failed_request_does_not_release_a_confirmed_reservation() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let ids = [r.id.as_str()];
    let confirmed = h.lifecycle.confirm(p, 1, &ids, ConfirmedVia::Upstream);
    assert_eq!(confirmed.await.unwrap(), [ConfirmOutcome::Confirmed]);
    let outcome = h
        .lifecycle
        .release_failed(&h.activity, &r, ReleaseReason::Upstream5xx)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::KeptConfirmed);
    assert_eq!(h.state(&r).await, RecordState::Confirmed);
    assert_eq!(h.confirmed(ConfirmedVia::Upstream), 1);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn confirming_a_released_reservation_counts_a_late_acceptance() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    let reason = ReleaseReason::Upstream5xx;
    h.lifecycle
        .release_failed(&h.activity, &r, reason)
        .await
        .unwrap();
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let ids = [r.id.as_str()];
    let outcome = h
        .lifecycle
        .confirm(p, 1, &ids, ConfirmedVia::Upstream)
        .await;
    assert_eq!(outcome.unwrap(), [ConfirmOutcome::LateCovered]);
    let late = h
        .metrics
        .late_accepted
        .with_label_values(&["a1", "covered"]);
    assert_eq!(late.get(), 1);
    assert_eq!(h.confirmed(ConfirmedVia::Upstream), 0, "not a confirm");
    assert_eq!(h.left(), 9, "covered by a unit of stock");
    // Told again: counted once.
    let again = h
        .lifecycle
        .confirm(p, 1, &ids, ConfirmedVia::Upstream)
        .await;
    assert_eq!(again.unwrap(), [ConfirmOutcome::Released]);
    assert_eq!(late.get(), 1);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn an_upstream_confirm_is_retried_until_the_store_answers() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    h.store.fail("confirm", 5);
    h.lifecycle
        .confirm_in_background(h.activity.clone(), r.clone(), ());
    h.until(async || h.state(&r).await == RecordState::Confirmed)
        .await;
    assert_eq!(h.confirmed(ConfirmedVia::Upstream), 1);
    assert_eq!(h.left(), 9);
}

#[tokio::test(start_paused = true)]
async fn upstream_confirms_arriving_within_the_linger_go_together() {
    let h = Harness::new(1, false);
    let buyers = ["u0", "u1", "u2", "u3", "u4", "u5", "u6"];
    let rs: Vec<_> = buyers.iter().map(|u| h.reserve(u, None)).collect();
    for r in &rs {
        h.lifecycle
            .confirm_in_background(h.activity.clone(), r.clone(), ());
    }
    h.until(async || h.confirmed(ConfirmedVia::Upstream) == rs.len() as u64)
        .await;
    for r in &rs {
        assert_eq!(h.state(r).await, RecordState::Confirmed);
    }
    // The first waits CONFIRM_LINGER for company: all seven in one call.
    assert_eq!(h.store.confirm_calls(), [rs.len()]);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn an_upstream_confirm_gives_up_after_about_a_minute() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    h.store.fail("confirm", u32::MAX);
    let started = tokio::time::Instant::now();
    h.lifecycle
        .confirm_in_background(h.activity.clone(), r.clone(), ());
    tokio::time::sleep(Duration::from_secs(600)).await;
    h.store.fail("confirm", 0);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(started.elapsed() >= Duration::from_secs(1200));
    assert_eq!(
        h.state(&r).await,
        RecordState::Pending,
        "left to its deadline"
    );
    assert_eq!(h.confirmed(ConfirmedVia::Upstream), 0);
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_reserve_is_abandoned_by_id_and_tombstoned() {
    let h = Harness::new(1, false);
    let id = Reservation::new_id();
    h.store.fail("release", 3);
    h.lifecycle
        .abandon_in_background(h.activity.clone(), 0, id.clone());
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    h.until(async || Reads::lookup(&*h.store, p, &id).await.unwrap().is_some())
        .await;
    let tomb = Reads::lookup(&*h.store, p, &id).await.unwrap().unwrap();
    assert!(tomb.tombstone && tomb.state == RecordState::Released);
    // The reserve can never land later.
    let call = ReserveCall {
        user: "alice",
        qty: 1,
        per_user_limit: 5,
        version: 1,
        reservation_id: &id,
        hold: HOLD,
        idempotency_key: None,
        deposit: None,
        in_flight: IN_FLIGHT,
        replay_only: false,
        hours: SaleHours::ALWAYS,
        steps: None,
        line: false,
    };
    assert_eq!(h.store.reserve_now(p, &call), ReserveOutcome::DuplicateId);
    // The admin API does not know it.
    let found = h.lifecycle.lookup(&h.activity, &id).await.unwrap();
    assert_eq!(found, None, "a tombstone is not a reservation");
    assert_eq!(
        h.released(ReleaseReason::StoreTimeout),
        0,
        "nothing was held"
    );
}

#[tokio::test(start_paused = true)]
async fn an_abandon_leaves_a_reservation_a_replay_handed_on() {
    let h = Harness::new(1, false);
    let first = h.reserve("alice", Some("k"));
    let _replay = h.reserve("alice", Some("k"));
    h.lifecycle
        .abandon_in_background(h.activity.clone(), 0, first.id.clone());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.state(&first).await, RecordState::Pending);
    assert_eq!(h.left(), 9);
}

#[tokio::test(start_paused = true)]
async fn admin_confirm_and_release_by_id() {
    let h = Harness::new(1, false);
    let a = &h.activity;
    let r = h.reserve("alice", None);
    let confirmed = h.lifecycle.confirm_by_id(a, &r.id).await.unwrap();
    let AdminOutcome::Done(record) = confirmed else {
        panic!("{confirmed:?}")
    };
    assert_eq!(record.state, RecordState::Confirmed);
    assert_eq!(h.confirmed(ConfirmedVia::Admin), 1);
    // Idempotent.
    let again = h.lifecycle.confirm_by_id(a, &r.id).await.unwrap();
    assert!(matches!(again, AdminOutcome::Done(ref r) if r.state == RecordState::Confirmed));
    assert_eq!(h.confirmed(ConfirmedVia::Admin), 1);
    // An order cancelled after payment: released from confirmed, units back once.
    let released = h.lifecycle.release_by_id(a, &r.id).await.unwrap();
    assert!(matches!(released, AdminOutcome::Done(ref r) if r.state == RecordState::Released));
    assert_eq!(h.left(), 10);
    let again = h.lifecycle.release_by_id(a, &r.id).await.unwrap();
    assert_eq!(again, released, "a second release answers the same");
    assert_eq!(h.left(), 10);
    assert_eq!(h.released(ReleaseReason::Admin), 1);
    // Confirming what an admin released: a conflict, and not a late acceptance.
    let conflict = h.lifecycle.confirm_by_id(a, &r.id).await.unwrap();
    assert!(
        matches!(conflict, AdminOutcome::Conflict(_)),
        "{conflict:?}"
    );
    assert_eq!(h.left(), 10);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn admin_calls_do_not_find_what_is_not_there() {
    let h = Harness::new(4, false);
    let a = &h.activity;
    let r = h.reserve("alice", None);
    assert!(r.id.ends_with(&format!(".{}", r.segment)));
    let found = h.lifecycle.lookup(a, &r.id).await.unwrap().unwrap();
    assert_eq!(found.user, "alice");
    let unknown = format!("{}.{}", Reservation::new_id(), r.segment);
    let beyond = format!("{}.4", r.id.split('.').next().unwrap());
    let wrong_segment = format!(
        "{}.{}",
        r.id.split('.').next().unwrap(),
        (r.segment + 1) % 4
    );
    for id in [
        "",
        "a b",
        "x".repeat(65).as_str(),
        unknown.as_str(),
        beyond.as_str(),
        wrong_segment.as_str(),
    ] {
        assert_eq!(h.lifecycle.lookup(a, id).await.unwrap(), None, "{id}");
        let confirm = h.lifecycle.confirm_by_id(a, id).await.unwrap();
        assert_eq!(confirm, AdminOutcome::NotFound, "{id}");
        let release = h.lifecycle.release_by_id(a, id).await.unwrap();
        assert_eq!(release, AdminOutcome::NotFound, "{id}");
    }
    assert_eq!(h.state(&r).await, RecordState::Pending);
    assert_eq!(h.left(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_release_of_a_retired_version_counts_its_units_retired() {
    let h = Harness::new(1, false);
    let r = h.reserve("alice", None);
    let layout = h.layout();
    h.store.retire(layout.segment(0).unwrap(), 1);
    let outcome = h
        .lifecycle
        .release_failed(&h.activity, &r, ReleaseReason::Upstream5xx)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::Released { remaining: None });
    let retired = h.metrics.reservations_retired.with_label_values(&["a1"]);
    assert_eq!(retired.get(), 1);
    h.store.check_ledgers();
}

#[tokio::test(start_paused = true)]
async fn an_early_lookup_is_due_only_under_its_own_fence() {
    let h = Harness::new(1, true);
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let r = h.reserve("alice", Some("k"));
    let due = h.store.due_at(p, 1, &r.id).unwrap();
    assert_eq!(due, r.deadline_ms, "due at its hold deadline");
    // A replay was forwarded since: the first forward's fence is stale.
    let replay = h.reserve("alice", Some("k"));
    assert_eq!(replay.fence, r.fence + 1);
    let after = Duration::from_secs(5);
    h.lifecycle.due_soon(&h.activity, &r, after).await.unwrap();
    assert_eq!(h.store.due_at(p, 1, &r.id), Some(due), "fenced: unchanged");
    // The replay's own forward may: not before the first forward's trip ends (prior).
    h.lifecycle
        .due_soon(&h.activity, &replay, after)
        .await
        .unwrap();
    let moved = h.store.due_at(p, 1, &r.id).unwrap();
    assert_eq!(moved, r.created_ms + IN_FLIGHT.as_millis() as u64);
    assert!(moved < due);
}

#[tokio::test(start_paused = true)]
async fn settle_soon_does_nothing_without_an_order_lookup() {
    let h = Harness::new(1, false);
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let r = h.reserve("alice", None);
    h.lifecycle
        .settle_soon(h.activity.clone(), &r, Duration::from_secs(1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.store.due_at(p, 1, &r.id), Some(r.deadline_ms));

    let h = Harness::new(1, true);
    let layout = h.layout();
    let p = layout.segment(0).unwrap();
    let r = h.reserve("alice", None);
    h.lifecycle
        .settle_soon(h.activity.clone(), &r, Duration::from_secs(40));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let expected = r.created_ms + 40_000;
    assert_eq!(h.store.due_at(p, 1, &r.id), Some(expected));
}
