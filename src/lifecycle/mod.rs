//! Reservation lifecycle: every reservation ends exactly once as confirmed or released, and
//! every release (a failed request's, an abandoned reserve's, an admin's, the order lookup's, an
//! expiry) goes through here, so counting, the sold-out cache and news are kept in one place.
//!
//! - confirm: by a 2xx from the upstream (activity `confirm: upstream`), the admin API, or the
//!   backend's order lookup;
//! - release: by the request that made the reservation when its upstream failed (never a
//!   reservation it did not make, never a confirmed one), the admin API (an order cancelled,
//!   even after payment), the order lookup (the backend holds no such order), or expiry: every
//!   instance sweeps pending reservations past their hold deadline (Redis's clock), in bounded
//!   batches; the scripts release only what is still pending, so exactly once however many
//!   sweep. With `upstream.order_lookup`, a reservation whose hold ran out is first asked about
//!   (found: confirmed; not found: released; no answer: kept pending, asked again later).
//! - reconciliation: per version and segment,
//!   `initial + moved_in - moved_out == remaining + pending + confirmed + retired`.
//!
//! Approximation: an upstream confirm is sent after the upstream's 2xx, off the buyer's path, and
//! retried for about a minute if Redis is unreachable. If it never lands (or the gateway dies
//! first), the reservation stays pending until its hold deadline: then the order lookup settles
//! it, or, without one, it expires and its units return although the backend took the order.

use crate::coalesce::Batcher;
use crate::config::Activity;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::news::{self, News};
use crate::purchase::StockPort;
use crate::reservation::Reservation;
use crate::sale::{SaleView, SaleWriter};
use crate::stock::{
    segments::{self, Purchase, ReserveAnswer},
    until_answered, ConfirmOutcome, ConfirmedVia, Layout, LedgerRow, Publish, Reads, ReleaseMode,
    ReleaseOutcome, ReleaseReason, ReservationRecord, Segment, Settle, StockStore, StoreError,
    Transfers,
};
use crate::upstream::lookup::OrderLookup;
use crate::upstream::Upstreams;
use std::sync::Arc;

/// Longest reservation id accepted from the admin API (ids are UUIDs: 36 bytes, plus a segment).
const MAX_RESERVATION_ID_LEN: usize = 64;

/// How long the first confirm at an idle segment waits for others before its call leaves (off
/// the buyer's path: the buyer has the backend's answer already). Approximation: a reservation
/// reaches `confirmed` in Redis up to this much later. Measured (BENCHMARKS.md): at 8
/// connections it took confirm calls from 2.6 to 7.9 items and Redis CPU per winner to 0.84x.
pub const CONFIRM_LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Most reservations one confirm script call confirms.
pub const CONFIRM_BATCH: usize = 100;

pub mod halt;
mod recount;
mod restock;
mod state;
mod sweep;

pub use sweep::HandedOut;

/// The store calls the lifecycle and its sweep make: [`StockStore`] in the gateway, an
/// in-process fake in the unit tests (`crate::stock::fake`). (Of [`Transfers`] the sweep uses
/// deposit and acknowledge, not withdraw; a buyer's reserve, made for admission through
/// [`StockPort`], is on the real store only.)
pub trait LifecycleStore: Reads + Settle + Transfers + Publish + 'static {}

impl<S: Reads + Settle + Transfers + Publish + 'static> LifecycleStore for S {}

/// The lifecycle over its store `S` (Redis unless a test says otherwise).
pub struct Lifecycle<S = StockStore> {
    live: Live,
    store: Arc<S>,
    metrics: Arc<Metrics>,
    /// What this gateway knows of each activity's sale: read here and everywhere ...
    state: SaleView,
    /// ... and written only here.
    sale: SaleWriter,
    upstreams: Arc<Upstreams>,
    lookup: OrderLookup,
    /// Confirms after a 2xx, sent together per segment and version (see
    /// [`Lifecycle::confirm_in_background`]).
    confirms: Confirms,
    /// Set by a reload: the prewarm runs at once rather than at its next tick.
    prewarm_due: tokio::sync::Notify,
}

/// Confirms waiting per activity, segment and version, each answered on its own.
type Confirms = Batcher<(Arc<str>, u32, u64), String, Result<ConfirmOutcome, Arc<StoreError>>>;

/// An admin request's answer about one reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminOutcome {
    Done(ReservationRecord),
    /// Confirm of a released reservation.
    Conflict(ReservationRecord),
    NotFound,
}

impl<S: LifecycleStore> Lifecycle<S> {
    pub fn new(
        live: Live,
        store: Arc<S>,
        metrics: Arc<Metrics>,
        sale: SaleWriter,
        upstreams: Arc<Upstreams>,
    ) -> Self {
        Lifecycle {
            live,
            store,
            metrics,
            state: sale.view(),
            sale,
            upstreams,
            lookup: OrderLookup::default(),
            confirms: Batcher::new(CONFIRM_BATCH).with_linger(CONFIRM_LINGER),
            prewarm_due: tokio::sync::Notify::new(),
        }
    }

    /// Releases a reservation of `version` in `segment`, exactly once and as far as `mode`
    /// allows; counts it and makes the units purchasable here at once (everywhere by news).
    pub async fn release(
        &self,
        segment: Segment<'_>,
        version: u64,
        id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        let outcome = self
            .store
            .release(segment, version, id, mode, reason)
            .await?;
        if let ReleaseOutcome::Released { remaining } = outcome {
            self.count_release(segment.layout(), version, reason, remaining, 1);
        }
        Ok(outcome)
    }

    fn count_release(
        &self,
        layout: &Layout,
        version: u64,
        reason: ReleaseReason,
        remaining: Option<u64>,
        count: u64,
    ) {
        let label = &**layout.id();
        self.metrics
            .reservations_released
            .with_label_values(&[label, reason.as_str()])
            .inc_by(count);
        match remaining {
            // A segment's own figure is not the activity's: the maintenance loop sums them.
            Some(left) if !layout.is_segmented() => {
                let variant = layout.variant().map(|v| &**v);
                self.units_left(label, variant, left as i64)
            }
            Some(_) => {}
            None => self
                .metrics
                .reservations_retired
                .with_label_values(&[label])
                .inc_by(count),
        }
        self.units_returned(layout.lane(), version);
    }

    /// The units left of an activity's version on sale, as last learned from Redis (a reserve's
    /// answer, a release, a prewarm's sum, an admin read): the one writer of
    /// `flashgate_stock_remaining`.
    pub fn units_left(&self, activity: &str, variant: Option<&str>, left: i64) {
        match variant {
            None => self.metrics.stock_remaining.with_label_values(&[activity]),
            Some(v) => self
                .metrics
                .stock_remaining_variants
                .with_label_values(&[activity, v]),
        }
        .set(left);
    }

    /// Units came back to a version of a stock lane (`Activity::lane`): purchasable again here
    /// at once, and everywhere by news.
    fn units_returned(&self, activity: &Arc<str>, version: u64) {
        self.sale.clear_sold_out(activity, version);
        news::publish(
            &self.store,
            News::Available {
                activity: activity.to_string(),
                version,
            },
        );
    }

    /// Releases the reservation of a request whose upstream failed, if this request made it (an
    /// idempotent retry that was handed an earlier request's reservation never releases it).
    /// `activity` is the one the request was admitted under (a reload since does not matter).
    pub async fn release_failed(
        &self,
        activity: &Activity,
        reservation: &Reservation,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        if !reservation.owned {
            return Ok(ReleaseOutcome::KeptReplayed);
        }
        let layout = Layout::of(activity);
        let Some(segment) = layout.segment(reservation.segment) else {
            return Ok(ReleaseOutcome::Unknown);
        };
        self.release(
            segment,
            reservation.version,
            &reservation.id,
            ReleaseMode::Owner,
            reason,
        )
        .await
    }

    /// A reserve whose outcome is unknown (timed out, connection lost) is released by id until
    /// Redis answers (a tombstone if it never landed, so it never will), so units never stay
    /// stranded behind a buyer who was told `unavailable`. Not if a replay handed it on meanwhile.
    fn abandon_in_background(self: &Arc<Self>, activity: Arc<Activity>, segment: u32, id: String) {
        let this = self.clone();
        tokio::spawn(async move {
            let layout = Layout::of(&activity);
            let Some(segment) = layout.segment(segment) else {
                return;
            };
            let abandon = || {
                this.release(
                    segment,
                    activity.version,
                    &id,
                    ReleaseMode::Abandon,
                    ReleaseReason::StoreTimeout,
                )
            };
            if until_answered(abandon).await.is_none() {
                tracing::error!(activity = %activity.id, reservation = %id,
                    "could not release a reservation whose reserve timed out; it expires at its hold deadline");
            }
        });
    }

    /// A forwarded request ended without the backend's answer (the buyer's side broke, so the
    /// proxy stopped reading it): with an order lookup the reservation is asked about once the
    /// backend's answer is surely in (`after`), instead of at its hold deadline. Without one it
    /// waits for its deadline. The due time is counted on Redis's clock: a gateway whose clock is
    /// off never asks while the backend may still be working on the order.
    pub fn settle_soon(
        self: &Arc<Self>,
        activity: Arc<Activity>,
        reservation: &Reservation,
        after: std::time::Duration,
    ) {
        if self.live.settings().upstream.order_lookup.is_none() {
            return;
        }
        let this = self.clone();
        let reservation = reservation.clone();
        tokio::spawn(async move {
            if let Err(e) = this.due_soon(&activity, &reservation, after).await {
                tracing::debug!(reservation = %reservation.id, error = %e, "could not move the lookup earlier");
            }
        });
    }

    /// The step [`Lifecycle::settle_soon`] takes: due `after` from now, under the fence this
    /// request's forward got, so never while another forward of it may be at the backend (a
    /// replay since, or one before it still on its trip) nor once a lookup was handed out.
    pub async fn due_soon(
        &self,
        activity: &Activity,
        reservation: &Reservation,
        after: std::time::Duration,
    ) -> Result<(), StoreError> {
        let layout = Layout::of(activity);
        let Some(segment) = layout.segment(reservation.segment) else {
            return Ok(());
        };
        self.store
            .due_in(
                segment,
                reservation.version,
                &reservation.id,
                reservation.fence,
                after,
            )
            .await
    }

    /// Confirms reservations of one version in one segment (at most [`CONFIRM_BATCH`]).
    pub async fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<ConfirmOutcome>, StoreError> {
        let outcomes = self.store.confirm(segment, version, ids, via).await?;
        let label = &**segment.layout().id();
        let confirmed = outcomes
            .iter()
            .filter(|o| **o == ConfirmOutcome::Confirmed)
            .count();
        if confirmed > 0 {
            self.metrics
                .reservations_confirmed
                .with_label_values(&[label, via.as_str()])
                .inc_by(confirmed as u64);
        }
        for (id, late) in ids
            .iter()
            .zip(&outcomes)
            .filter_map(|(id, o)| Some((id, o.late()?)))
        {
            // A ledger fact (the version's late_accepted, and oversold if uncovered), and an
            // alert: the backend holds an order whose reservation had been released.
            self.metrics
                .late_accepted
                .with_label_values(&[label, late.as_str()])
                .inc();
            tracing::error!(activity = %label, version, reservation = %id, via = via.as_str(),
                outcome = late.as_str(),
                "the backend accepted a reservation that was already released: its units were \
                 covered from stock, or (oversold) none were left; run `flashgate reconcile`");
        }
        Ok(outcomes)
    }

    /// After a 2xx from the upstream on a `confirm: upstream` activity: confirms off the
    /// buyer's path, retrying while Redis is unreachable. Confirms of one segment and version
    /// arriving while one is out go together in the next call (at most [`CONFIRM_BATCH`]).
    ///
    /// `hold` is dropped once the confirm is answered (or given up): the caller's mark on the
    /// shutdown drain, which then waits for the confirm as for the request.
    pub fn confirm_in_background(
        self: &Arc<Self>,
        activity: Arc<Activity>,
        reservation: Reservation,
        hold: impl Send + 'static,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let _hold = hold;
            let layout = Layout::of(&activity);
            let Some(segment) = layout.segment(reservation.segment) else {
                return;
            };
            let version = reservation.version;
            let lifecycle = &*this;
            let confirm = || async {
                let batch = move |ids: Vec<String>| async move {
                    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                    match lifecycle
                        .confirm(segment, version, &refs, ConfirmedVia::Upstream)
                        .await
                    {
                        Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
                        Err(e) => {
                            let e = Arc::new(e);
                            ids.iter().map(|_| Err(e.clone())).collect::<Vec<_>>()
                        }
                    }
                };
                lifecycle
                    .confirms
                    .submit(
                        (activity.lane.clone(), segment.index(), version),
                        reservation.id.clone(),
                        batch,
                    )
                    .await?
                    .map_err(StoreError::shared)
            };
            match until_answered(confirm).await {
                Some(ConfirmOutcome::Released) => tracing::warn!(reservation = %reservation.id,
                    "upstream accepted a reservation that was already released (counted before)"),
                Some(_) => {}
                None => tracing::error!(reservation = %reservation.id,
                    "could not confirm a reservation the upstream accepted; it stays pending until its hold deadline"),
            }
        });
    }

    /// The segment a reservation id names, and its record; tombstones of abandoned ids and
    /// malformed ids are "not found".
    async fn find<'l>(
        &self,
        layout: &'l Layout,
        id: &str,
    ) -> Result<Option<(Segment<'l>, ReservationRecord)>, StoreError> {
        if id.is_empty()
            || id.len() > MAX_RESERVATION_ID_LEN
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'~' | b'_'))
        {
            return Ok(None);
        }
        let Some(segment) = Reservation::segment_of(id).and_then(|n| layout.segment(n)) else {
            return Ok(None);
        };
        Ok(self
            .store
            .lookup(segment, id)
            .await?
            .filter(|r| !r.tombstone)
            .map(|r| (segment, r)))
    }

    /// A reservation's record (admin API).
    pub async fn lookup(
        &self,
        activity: &Activity,
        id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let layout = segments::recorded_layout(&*self.store, activity).await?;
        Ok(self.find(&layout, id).await?.map(|(_, r)| r))
    }

    /// Admin confirm: 200 (idempotent), 409 if released, 404 unknown.
    pub async fn confirm_by_id(
        &self,
        activity: &Activity,
        id: &str,
    ) -> Result<AdminOutcome, StoreError> {
        let layout = segments::recorded_layout(&*self.store, activity).await?;
        let Some((segment, record)) = self.find(&layout, id).await? else {
            return Ok(AdminOutcome::NotFound);
        };
        match self
            .confirm(segment, record.ver, &[id], ConfirmedVia::Admin)
            .await?
            .as_slice()
        {
            [ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed] => {
                self.done(&layout, id).await
            }
            [o] if o.released() => Ok(AdminOutcome::Conflict(record)),
            _ => Ok(AdminOutcome::NotFound),
        }
    }

    /// Admin release: from pending or confirmed, units return exactly once; a second release
    /// changes nothing and answers the same.
    pub async fn release_by_id(
        &self,
        activity: &Activity,
        id: &str,
    ) -> Result<AdminOutcome, StoreError> {
        let layout = segments::recorded_layout(&*self.store, activity).await?;
        let Some((segment, record)) = self.find(&layout, id).await? else {
            return Ok(AdminOutcome::NotFound);
        };
        match self
            .release(
                segment,
                record.ver,
                id,
                ReleaseMode::Admin,
                ReleaseReason::Admin,
            )
            .await?
        {
            ReleaseOutcome::Released { .. } | ReleaseOutcome::AlreadyReleased => {
                self.done(&layout, id).await
            }
            _ => Ok(AdminOutcome::NotFound),
        }
    }

    async fn done(&self, layout: &Layout, id: &str) -> Result<AdminOutcome, StoreError> {
        Ok(match self.find(layout, id).await? {
            Some((_, record)) => AdminOutcome::Done(record),
            None => AdminOutcome::NotFound,
        })
    }

    /// Every version's ledger of every segment of one activity (atomically per version and
    /// segment), in segment then version order.
    pub async fn ledgers(&self, activity: &Activity) -> Result<Vec<LedgerRow>, StoreError> {
        let layout = segments::recorded_layout(&*self.store, activity).await?;
        Ok(segments::ledgers(&*self.store, &layout)
            .await?
            .into_iter()
            .map(|(_, row)| row)
            .collect())
    }
}

/// The lifecycle is the purchase's way to the stock: a reserve whose reply was lost is abandoned
/// here, and a sold-out version is announced to the other instances.
#[async_trait::async_trait]
impl StockPort for Arc<Lifecycle> {
    async fn reserve(
        &self,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
    ) -> Result<ReserveAnswer, StoreError> {
        match segments::reserve(&*self.store, activity, purchase).await {
            Ok(outcome) => Ok(outcome),
            Err(failed) => {
                if let Some(segment) = failed.landed_maybe {
                    self.abandon_in_background(
                        activity.clone(),
                        segment,
                        purchase.reservation_id.to_owned(),
                    );
                }
                Err(failed.error)
            }
        }
    }

    fn learned_left(&self, activity: &Activity, left: i64, ttl: std::time::Duration) {
        Lifecycle::<StockStore>::learned_left(self, activity, left, ttl);
    }

    fn refused(&self, activity: &Arc<str>, refusal: crate::stock::segments::Refusal) {
        Lifecycle::refused(self, activity, Some(refusal));
    }
}

#[cfg(test)]
mod tests;
