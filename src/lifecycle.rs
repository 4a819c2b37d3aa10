//! Reservation lifecycle: every reservation ends exactly once as confirmed or released.
//!
//! - confirm: by a 2xx from the upstream (activity `confirm: upstream`) or the admin API;
//! - release: by an upstream failure, the admin API (an order cancelled, even after payment), or
//!   expiry: every instance sweeps pending reservations past their hold deadline, in bounded
//!   batches; the scripts release only what is still pending, so exactly once however many sweep;
//! - reconciliation: per version, `initial == remaining + pending + confirmed + retired`.
//!
//! Approximation: an upstream confirm is sent after the upstream's 2xx, off the buyer's path, and
//! retried for about a minute if Redis is unreachable. If it never lands, the reservation expires
//! at its hold deadline and its units return although the backend took the order; backends that
//! cannot tolerate that use `confirm: explicit` and confirm themselves.

use crate::admission::sold_out::SoldOutCache;
use crate::config::Activity;
use crate::live::Live;
use crate::metrics::{Metrics, ReleaseReason};
use crate::news::News;
use crate::reservation::Reservation;
use crate::stock::{
    until_answered, ConfirmOutcome, ConfirmedVia, LedgerRow, ReleaseOutcome, ReservationRecord,
    StockStore, StoreError,
};
use std::sync::Arc;

/// Longest reservation id accepted from the admin API (ids are UUIDs: 36 bytes).
const MAX_RESERVATION_ID_LEN: usize = 64;

/// A transfer still unacknowledged this long after its withdraw was cut short.
const STRANDED_TRANSFER_AFTER_MS: u64 = 5_000;

/// Sweep calls per version per tick at most, so one tick stays short under a flood of expiries.
const MAX_SWEEP_CALLS_PER_TICK: usize = 50;

pub struct Lifecycle {
    live: Live,
    store: Arc<StockStore>,
    metrics: Arc<Metrics>,
    sold_out: Arc<SoldOutCache>,
}

/// An admin request's answer about one reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminOutcome {
    Done(ReservationRecord),
    /// Confirm of a released reservation.
    Conflict(ReservationRecord),
    NotFound,
}

impl Lifecycle {
    pub fn new(
        live: Live,
        store: Arc<StockStore>,
        metrics: Arc<Metrics>,
        sold_out: Arc<SoldOutCache>,
    ) -> Self {
        Lifecycle {
            live,
            store,
            metrics,
            sold_out,
        }
    }

    /// Releases a reservation of `activity`'s version `version`, exactly once; counts it and
    /// makes the units purchasable here at once.
    pub async fn release(
        &self,
        activity: &Activity,
        version: u64,
        id: &str,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        let outcome = self.store.release(activity, version, id, reason).await?;
        if let ReleaseOutcome::Released { remaining } = outcome {
            self.count_release(activity, version, reason, remaining, 1);
        }
        Ok(outcome)
    }

    fn count_release(
        &self,
        activity: &Activity,
        version: u64,
        reason: ReleaseReason,
        remaining: Option<u64>,
        count: u64,
    ) {
        let label = activity.label();
        self.metrics
            .reservations_released
            .with_label_values(&[label, reason.as_str()])
            .inc_by(count);
        self.units_returned(activity, version);
        match remaining {
            // A segment's own figure is not the activity's: the maintenance loop sums them.
            Some(left) if version == activity.version && activity.parent.is_none() => self
                .metrics
                .stock_remaining
                .with_label_values(&[label])
                .set(left as i64),
            Some(_) => {}
            None => self
                .metrics
                .reservations_retired
                .with_label_values(&[label])
                .inc_by(count),
        }
    }

    /// Units came back to a version: purchasable again here at once, and everywhere by news.
    fn units_returned(&self, activity: &Activity, version: u64) {
        self.sold_out.clear(activity.label(), version);
        self.store.announce(News::Available {
            activity: activity.label().to_string(),
            version,
        });
    }

    /// The segment (the activity itself when not segmented) a reservation id belongs to.
    fn segment_for<'a>(&self, activity: &'a Activity, id: &str) -> Option<&'a Activity> {
        Reservation::segment_of(id).and_then(|n| activity.segment(n))
    }

    /// Releases the reservation of a request whose upstream failed. `activity` is the one the
    /// request was admitted under (a reload since then does not matter).
    pub async fn release_failed(
        &self,
        activity: &Activity,
        reservation: &Reservation,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        match activity.segment(reservation.segment) {
            Some(segment) => {
                self.release(segment, reservation.version, &reservation.id, reason)
                    .await
            }
            None => Ok(ReleaseOutcome::Unknown),
        }
    }

    pub async fn confirm(
        &self,
        activity: &Activity,
        version: u64,
        id: &str,
        via: ConfirmedVia,
    ) -> Result<ConfirmOutcome, StoreError> {
        let outcome = self.store.confirm(activity, version, id, via).await?;
        if outcome == ConfirmOutcome::Confirmed {
            self.metrics
                .reservations_confirmed
                .with_label_values(&[activity.label(), via.as_str()])
                .inc();
        }
        Ok(outcome)
    }

    /// After a 2xx from the upstream on a `confirm: upstream` activity: confirms off the
    /// buyer's path, retrying while Redis is unreachable.
    pub fn confirm_in_background(
        self: &Arc<Self>,
        activity: Arc<Activity>,
        reservation: Reservation,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let Some(segment) = activity.segment(reservation.segment) else {
                return;
            };
            let confirm = || {
                this.confirm(
                    segment,
                    reservation.version,
                    &reservation.id,
                    ConfirmedVia::Upstream,
                )
            };
            match until_answered(confirm).await {
                Some(ConfirmOutcome::Released) => tracing::warn!(reservation = %reservation.id,
                    "upstream accepted a reservation that was already released"),
                Some(_) => {}
                None => tracing::error!(reservation = %reservation.id,
                    "could not confirm a reservation the upstream accepted; it will expire at its hold deadline"),
            }
        });
    }

    /// Admin confirm: 200 (idempotent), 409 if released, 404 unknown.
    pub async fn confirm_by_id(
        &self,
        activity: &Activity,
        id: &str,
    ) -> Result<AdminOutcome, StoreError> {
        let Some(record) = self.lookup(activity, id).await? else {
            return Ok(AdminOutcome::NotFound);
        };
        let Some(segment) = self.segment_for(activity, id) else {
            return Ok(AdminOutcome::NotFound);
        };
        match self
            .confirm(segment, record.ver, id, ConfirmedVia::Admin)
            .await?
        {
            ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed => {
                self.done(activity, id).await
            }
            ConfirmOutcome::Released => Ok(AdminOutcome::Conflict(record)),
            ConfirmOutcome::Unknown | ConfirmOutcome::VersionMismatch => Ok(AdminOutcome::NotFound),
        }
    }

    /// Admin release: from pending or confirmed, units return exactly once; a second release
    /// changes nothing and answers the same.
    pub async fn release_by_id(
        &self,
        activity: &Activity,
        id: &str,
    ) -> Result<AdminOutcome, StoreError> {
        let Some(record) = self.lookup(activity, id).await? else {
            return Ok(AdminOutcome::NotFound);
        };
        let Some(segment) = self.segment_for(activity, id) else {
            return Ok(AdminOutcome::NotFound);
        };
        match self
            .release(segment, record.ver, id, ReleaseReason::Admin)
            .await?
        {
            ReleaseOutcome::Released { .. } | ReleaseOutcome::AlreadyReleased => {
                self.done(activity, id).await
            }
            ReleaseOutcome::Unknown | ReleaseOutcome::VersionMismatch => Ok(AdminOutcome::NotFound),
        }
    }

    async fn done(&self, activity: &Activity, id: &str) -> Result<AdminOutcome, StoreError> {
        Ok(match self.lookup(activity, id).await? {
            Some(record) => AdminOutcome::Done(record),
            None => AdminOutcome::NotFound,
        })
    }

    /// A reservation's record; tombstones of abandoned ids and malformed ids are "not found".
    pub async fn lookup(
        &self,
        activity: &Activity,
        id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        if id.is_empty()
            || id.len() > MAX_RESERVATION_ID_LEN
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Ok(None);
        }
        let Some(segment) = self.segment_for(activity, id) else {
            return Ok(None);
        };
        Ok(self
            .store
            .lookup(segment, id)
            .await?
            .filter(|r| r.tombstone.is_none()))
    }

    /// Releases every pending reservation past its deadline, over all activities and versions.
    /// Returns how many were released by this instance.
    pub async fn sweep_expired(&self) -> u64 {
        let settings = self.live.settings();
        let batch = settings.redis.sweep_batch;
        let mut total = 0;
        for activity in settings.activities.iter().flat_map(|a| a.segments()) {
            self.deliver_stranded_transfers(activity).await;
            let versions = match self.store.versions(activity).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(activity = %activity.id, error = %e, "sweep skipped");
                    continue;
                }
            };
            for version in versions {
                for _ in 0..MAX_SWEEP_CALLS_PER_TICK {
                    match self.store.sweep(activity, version, batch).await {
                        Ok(outcome) => {
                            if outcome.released > 0 {
                                total += outcome.released;
                                self.metrics
                                    .reservations_released
                                    .with_label_values(&[
                                        activity.label(),
                                        ReleaseReason::Expired.as_str(),
                                    ])
                                    .inc_by(outcome.released);
                                self.units_returned(activity, version);
                                self.metrics
                                    .reservations_retired
                                    .with_label_values(&[activity.label()])
                                    .inc_by(outcome.retired);
                                tracing::info!(activity = %activity.id, version,
                                    released = outcome.released, units = outcome.units,
                                    "expired reservations released");
                            }
                            if outcome.scanned < u64::from(batch) {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(activity = %activity.id, version, error = %e, "sweep failed");
                            break;
                        }
                    }
                }
            }
        }
        total
    }

    /// Reads every version's ledger of every segment of one activity (atomically per version
    /// and segment), in segment then version order.
    pub async fn ledgers(&self, activity: &Activity) -> Result<Vec<LedgerRow>, StoreError> {
        let mut rows = Vec::new();
        for segment in activity.segments() {
            for version in self.store.versions(segment).await? {
                rows.push(self.store.ledger(segment, version).await?);
            }
        }
        Ok(rows)
    }

    /// Transfers a segment gave that never arrived (a gateway died between withdraw and
    /// deposit): delivered once they are older than a rebalance could still be in flight.
    async fn deliver_stranded_transfers(&self, giver: &Activity) {
        let settings = self.live.settings();
        let Some(parent) = giver
            .parent
            .as_ref()
            .and_then(|p| settings.activities.get(p))
        else {
            return;
        };
        let Ok(transfers) = self.store.unacknowledged_transfers(giver).await else {
            return;
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for t in transfers
            .iter()
            .filter(|t| t.ts + STRANDED_TRANSFER_AFTER_MS < now_ms)
        {
            let Some(receiver) = parent.segments().into_iter().find(|s| *s.id == *t.to) else {
                continue;
            };
            if self.store.deposit(receiver, &t.id, t.qty).await.is_ok() {
                let _ = self.store.acknowledge(giver, &t.id).await;
                tracing::warn!(activity = %parent.id, transfer = %t.id, units = t.qty,
                    "delivered a transfer a gateway left half done");
            }
        }
    }

    /// Checks every activity's ledgers and exports `flashgate_reconcile_drift`.
    pub async fn check_drift(&self) {
        for activity in self.live.settings().activities.iter() {
            match self.ledgers(activity).await {
                Ok(rows) => {
                    let drift: i64 = rows.iter().map(|r| r.drift().abs()).sum();
                    self.metrics
                        .reconcile_drift
                        .with_label_values(&[&activity.id])
                        .set(drift);
                    if drift != 0 {
                        tracing::error!(activity = %activity.id, drift, ?rows, "stock ledger drift");
                    }
                }
                Err(e) => {
                    tracing::warn!(activity = %activity.id, error = %e, "ledger check failed")
                }
            }
        }
    }
}
