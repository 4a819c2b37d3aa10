//! Settling what nobody settled: every pending reservation whose hold ran out (asked about by
//! the order lookup first, where configured), transfers a gateway left half done, and the
//! periodic ledger check. Every instance runs it; the scripts settle each reservation once.

use super::{Lifecycle, LifecycleStore};
use crate::config::{Activity, OrderLookupSettings, Settings, UpstreamSettings};
use crate::stock::{
    ConfirmedVia, Deposit, Layout, Leased, LedgerRow, LookupLease, ReleaseMode, ReleaseOutcome,
    ReleaseReason, Segment, StoreError, SweepOutcome,
};
use crate::upstream::lookup::Answer;
use futures_util::StreamExt;
use std::collections::BTreeMap;

/// A transfer still unacknowledged this long after its withdraw was cut short.
const STRANDED_TRANSFER_AFTER_MS: u64 = 5_000;

/// Sweep calls per version per tick at most, so one tick stays short under a flood of expiries.
const MAX_SWEEP_CALLS_PER_TICK: usize = 50;

/// Order lookups in flight at once per sweep call.
const LOOKUP_CONCURRENCY: usize = 16;

/// A reservation a sweep handed out for an order lookup, and where it lives.
#[derive(Debug, Clone)]
pub struct HandedOut {
    pub layout: Layout,
    pub segment: u32,
    pub version: u64,
    pub leased: Leased,
}

impl<S: LifecycleStore> Lifecycle<S> {
    /// Every activity whose reservations this instance settles: the configured ones, and those
    /// Redis remembers although the configuration dropped them (their holds still run out), each
    /// with the segment count Redis recorded (a configuration that disagrees is refused, but what
    /// is in Redis still settles).
    /// Each configured stock lane (an activity, or each variant of one) is swept, and every
    /// lane the registry names (a removed activity or variant, an activity that gained or lost
    /// its variants under a new version: their holds still run out).
    async fn layouts(&self) -> Vec<Layout> {
        let settings = self.live.settings();
        let mut ids: BTreeMap<String, Option<u32>> = settings
            .activities
            .lanes()
            .map(|a| (a.lane.to_string(), None))
            .collect();
        match self.store.registered().await {
            Ok(registered) => {
                for (lane, segments) in registered {
                    ids.insert(lane, Some(segments));
                }
            }
            Err(e) => tracing::warn!(error = %e, "activity registry not read"),
        }
        let mut layouts = Vec::with_capacity(ids.len());
        for (id, registered) in ids {
            match self.store.base_meta(&id).await {
                Ok(meta) => {
                    // Never prewarmed: nothing to settle.
                    if let Some(segments) = meta.segments.or(registered) {
                        layouts.push(Layout::of_lane(&id, segments));
                    }
                }
                Err(e) => tracing::warn!(activity = %id, error = %e, "sweep skipped"),
            }
        }
        layouts
    }

    /// Settles every pending reservation whose time has come, over all activities, segments
    /// and versions. Returns how many this instance released.
    pub async fn sweep_expired(&self) -> u64 {
        self.sweep(true).await.0
    }

    /// The sweep's first half alone: what is due expires or is handed out for an order lookup,
    /// but nobody is asked; the hand-outs are returned, for [`Lifecycle::settle_answer`] to act
    /// on the answers whenever they come (the model test puts other operations in between).
    pub async fn hand_out(&self) -> Vec<HandedOut> {
        self.sweep(false).await.1
    }

    /// One sweep over every layout, segment and version: returns how many it released, and
    /// (unless `ask`, when the backend is asked at once) what it handed out for lookups.
    async fn sweep(&self, ask: bool) -> (u64, Vec<HandedOut>) {
        let settings = self.live.settings();
        let batch = settings.redis.sweep_batch;
        let lookup = settings.upstream.order_lookup.as_ref();
        let lease = lookup.map(|l| LookupLease {
            lease: l.retry_interval,
            give_up_after: l.give_up_after,
        });
        let mut total = 0;
        let mut handed = Vec::new();
        for layout in self.layouts().await {
            for segment in layout.segments() {
                self.deliver_stranded_transfers(segment).await;
                let versions = match self.store.meta(segment).await {
                    Ok(meta) => meta.versions,
                    Err(e) => {
                        tracing::warn!(activity = %layout.id(), error = %e, "sweep skipped");
                        continue;
                    }
                };
                for version in versions {
                    for _ in 0..MAX_SWEEP_CALLS_PER_TICK {
                        let outcome = match self.store.sweep(segment, version, batch, lease).await {
                            Ok(outcome) => outcome,
                            Err(e) => {
                                tracing::warn!(activity = %layout.id(), version, error = %e, "sweep failed");
                                break;
                            }
                        };
                        total += self.count_expired(&layout, version, &outcome);
                        match lookup.filter(|_| ask && !outcome.for_lookup.is_empty()) {
                            Some(lookup) => {
                                total += self
                                    .settle_by_lookup(
                                        segment,
                                        version,
                                        &settings.upstream,
                                        lookup,
                                        &outcome.for_lookup,
                                    )
                                    .await
                            }
                            None => {
                                handed.extend(outcome.for_lookup.iter().map(|leased| HandedOut {
                                    layout: layout.clone(),
                                    segment: segment.index(),
                                    version,
                                    leased: leased.clone(),
                                }))
                            }
                        }
                        if outcome.scanned < u64::from(batch) {
                            break;
                        }
                    }
                }
            }
        }
        (total, handed)
    }

    /// Counts what one sweep call expired; returns how many.
    fn count_expired(&self, layout: &Layout, version: u64, outcome: &SweepOutcome) -> u64 {
        if outcome.released > 0 {
            self.metrics
                .reservations_released
                .with_label_values(&[layout.id(), ReleaseReason::Expired.as_str()])
                .inc_by(outcome.released);
            self.metrics
                .reservations_retired
                .with_label_values(&[layout.id()])
                .inc_by(outcome.retired);
            self.units_returned(layout.lane(), version);
            tracing::info!(activity = %layout.id(), version,
                released = outcome.released, units = outcome.units,
                "expired reservations released");
        }
        outcome.released
    }

    /// Asks the backend about reservations a sweep handed out (their hold ran out, or a forward
    /// ended without an answer): found ones are confirmed, ones it does not hold released
    /// (unless a replay was forwarded since: the fence), unanswered ones stay pending (the sweep
    /// hands them out again after `retry_interval_ms`). Returns how many were released.
    async fn settle_by_lookup(
        &self,
        segment: Segment<'_>,
        version: u64,
        upstream: &UpstreamSettings,
        settings: &OrderLookupSettings,
        leased: &[Leased],
    ) -> u64 {
        let asks: Vec<_> = leased
            .iter()
            .map(|l| self.ask(upstream, settings, l))
            .collect();
        let answers: Vec<(&Leased, Answer)> = futures_util::stream::iter(asks)
            .buffer_unordered(LOOKUP_CONCURRENCY)
            .collect()
            .await;
        let mut released = 0;
        for (leased, answer) in answers {
            if self.settle_answer(segment, version, leased, answer).await {
                released += 1;
            }
        }
        released
    }

    /// Acts on the backend's answer about one reservation handed out for a lookup: found,
    /// confirmed (or, if it was released meanwhile, counted as accepted late); not found,
    /// released under the hand-out's fence; unanswered, nothing. Returns whether it released.
    pub async fn settle_answer(
        &self,
        segment: Segment<'_>,
        version: u64,
        leased: &Leased,
        answer: Answer,
    ) -> bool {
        let label = &**segment.layout().id();
        self.metrics
            .order_lookups
            .with_label_values(&[label, answer.as_str()])
            .inc();
        let id = leased.id.as_str();
        match answer {
            Answer::Found => {
                if let Err(e) = self
                    .confirm(segment, version, &[id], ConfirmedVia::Lookup)
                    .await
                {
                    tracing::warn!(reservation = %id, error = %e,
                        "could not confirm after the order lookup; asked again later");
                }
                false
            }
            Answer::NotFound => {
                let mode = ReleaseMode::Lookup {
                    fence: leased.fence,
                };
                match self
                    .release(segment, version, id, mode, ReleaseReason::OrderNotFound)
                    .await
                {
                    Ok(ReleaseOutcome::Released { .. }) => true,
                    Ok(ReleaseOutcome::Fenced) => {
                        tracing::info!(reservation = %id,
                            "order lookup's 'not found' discarded: the reservation was forwarded again since it was asked");
                        false
                    }
                    Ok(_) => false,
                    Err(e) => {
                        tracing::warn!(reservation = %id, error = %e,
                            "could not release after the order lookup; asked again later");
                        false
                    }
                }
            }
            Answer::Unanswered => false,
        }
    }

    /// Asks a healthy backend about one reservation.
    async fn ask<'l>(
        &self,
        upstream: &UpstreamSettings,
        settings: &OrderLookupSettings,
        leased: &'l Leased,
    ) -> (&'l Leased, Answer) {
        let answer = match self.upstreams.select(upstream) {
            Some(backend) => self.lookup.ask(backend, settings, &leased.id).await,
            None => Answer::Unanswered,
        };
        (leased, answer)
    }

    /// Transfers a segment gave that never arrived (a gateway died between withdraw and
    /// deposit): delivered once they are older than a rebalance could still be in flight.
    async fn deliver_stranded_transfers(&self, giver: Segment<'_>) {
        if !giver.layout().is_segmented() {
            return;
        }
        let Ok((transfers, now_ms)) = self.store.transfers(giver).await else {
            return;
        };
        for t in transfers
            .iter()
            .filter(|t| t.at_ms + STRANDED_TRANSFER_AFTER_MS < now_ms)
        {
            let Some(receiver) = giver.layout().segment(t.to) else {
                continue;
            };
            if let Ok(deposit) = self.store.deposit(receiver, t.version, &t.id, t.qty).await {
                if !deposit.arrived() {
                    tracing::error!(activity = %giver.layout().id(), transfer = %t.id,
                        "a transfer cannot land (its version has no ledger there, or the receiver lost its book): left in flight");
                    continue;
                }
                let _ = self.store.acknowledge(giver, &t.id).await;
                if deposit == Deposit::Landed {
                    self.units_returned(giver.layout().lane(), t.version);
                    tracing::warn!(activity = %giver.layout().id(), transfer = %t.id, units = t.qty,
                        "delivered a transfer a gateway left half done");
                }
            }
        }
    }

    /// Checks every activity's ledgers (its own lane's, and each of its variants') and exports
    /// `flashgate_reconcile_drift` and, from the same reads, `flashgate_units_held_in_doubt`
    /// (the ledgers' `held_in_doubt`, a counter: no record is read). The one writer of both; a
    /// read that failed leaves both as they were.
    pub async fn check_drift(&self) {
        let settings = self.live.settings();
        for activity in settings.activities.iter() {
            let rows = match self.activity_ledgers(&settings, activity).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(activity = %activity.id, error = %e, "ledger check failed");
                    continue;
                }
            };
            let drift: i64 = rows.iter().map(|r| r.drift().abs()).sum();
            self.metrics
                .reconcile_drift
                .with_label_values(&[&activity.id])
                .set(drift);
            if drift != 0 {
                tracing::error!(activity = %activity.id, drift, ?rows, "stock ledger drift");
            }
            self.metrics
                .units_held_in_doubt
                .with_label_values(&[&activity.id])
                .set(rows.iter().map(|r| r.held_in_doubt).sum());
        }
    }

    /// Every ledger of `activity`: its own lane's (with variants: what it sold before it had
    /// them), then each variant's.
    async fn activity_ledgers(
        &self,
        settings: &Settings,
        activity: &Activity,
    ) -> Result<Vec<LedgerRow>, StoreError> {
        let mut rows = self.ledgers(activity).await?;
        for lane in settings.activities.lanes_of(&activity.id) {
            if lane.variant.is_some() {
                rows.extend(self.ledgers(lane).await?);
            }
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests;
