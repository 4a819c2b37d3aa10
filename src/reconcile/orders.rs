//! `flashgate reconcile --orders`: the backend's orders against Redis's records.

use super::{with_store, ReconcileError};
use crate::config::{Activity, Settings};
use crate::reservation::Reservation;
use crate::stock::prelude::*;
use crate::stock::{segments, ConfirmOutcome, ConfirmedVia, RecordState, StockStore, StoreError};
use std::fmt::Write;
use std::sync::Arc;

/// `flashgate reconcile --orders FILE`: the backend's orders against Redis's records. The one
/// check that catches what Redis itself cannot see: sales it forgot (a crash under
/// `appendfsync everysec` loses up to about a second of them) and sales whose hold lapsed
/// after the backend took them (a gateway killed before confirming, under `confirm: upstream`).
/// Either way Redis's stock is too high by those units and would sell them again.
#[derive(Debug, Default)]
pub struct OrdersReport {
    pub activity: String,
    pub confirmed: Vec<String>,
    /// Pending ones this run confirmed (`--confirm-pending`); also in `confirmed`.
    pub confirmed_now: Vec<String>,
    /// Still held: confirm them (`--confirm-pending`, or the admin API) or they return to
    /// stock at their deadline and are sold again.
    pub pending: Vec<String>,
    /// Pending in a store that went through an event that may have lost sales (held in doubt,
    /// or its segment fenced or lost now): the backend has the order, so its unit must not
    /// return to stock; `--confirm-pending` confirms them.
    pub in_doubt: Vec<String>,
    /// Given back to stock after the backend took them.
    pub released: Vec<String>,
    /// No record: Redis forgot the sale.
    pub unknown: Vec<String>,
    /// Orders of another configured activity (the backend's list holds every sale's): left
    /// out, with the activity they belong to.
    pub elsewhere: Vec<(String, String)>,
}

impl OrdersReport {
    /// Nothing the backend sold is back in stock, unknown, or pending in doubt.
    pub fn clean(&self) -> bool {
        self.released.is_empty() && self.unknown.is_empty() && self.in_doubt.is_empty()
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "orders of {}: {} confirmed ({} just now), {} pending, {} in doubt, {} released after the sale, {} unknown to Redis; {} of other activities left out",
            self.activity,
            self.confirmed.len(),
            self.confirmed_now.len(),
            self.pending.len(),
            self.in_doubt.len(),
            self.released.len(),
            self.unknown.len(),
            self.elsewhere.len()
        );
        for (what, ids) in [
            ("confirmed just now (it was pending)", &self.confirmed_now),
            (
                "pending (confirm it, or it returns to stock at its deadline)",
                &self.pending,
            ),
            (
                "in doubt (pending through a Redis failover, restart or loss: confirm it with \
                 --confirm-pending)",
                &self.in_doubt,
            ),
            (
                "released after the sale (its unit is back in stock)",
                &self.released,
            ),
            (
                "unknown to Redis (forgotten; its unit is back in stock)",
                &self.unknown,
            ),
        ] {
            for id in ids {
                let _ = writeln!(out, "  {id}: {what}");
            }
        }
        out
    }
}

/// Looks up each of the backend's reservation ids (one HGET each: an operator command). With
/// `confirm_pending`, confirms those still pending: the backend has them, so they are sold
/// (the remedy after a gateway died between the backend's answer and its confirm).
///
/// `lanes` are the activity's stock lanes (itself, or each of its variants): an id is looked
/// up in the lane it names (`Reservation::variant_of`).
pub async fn compare_orders(
    store: &StockStore,
    lanes: &[Arc<Activity>],
    reservation_ids: &[String],
    confirm_pending: bool,
) -> Result<OrdersReport, StoreError> {
    let mut report = OrdersReport {
        activity: lanes.first().map(|a| a.id.to_string()).unwrap_or_default(),
        ..OrdersReport::default()
    };
    let mut layouts = Vec::with_capacity(lanes.len());
    for lane in lanes {
        layouts.push((
            lane.variant.clone(),
            segments::recorded_layout(store, lane).await?,
        ));
    }
    for id in reservation_ids {
        let variant = Reservation::variant_of(id);
        let layout = layouts
            .iter()
            .find(|(v, _)| v.as_deref() == variant)
            .map(|(_, l)| l);
        let segment =
            layout.and_then(|layout| Reservation::segment_of(id).and_then(|n| layout.segment(n)));
        let record = match segment {
            Some(segment) => store.lookup(segment, id).await?,
            None => None,
        };
        let mut state = record.as_ref().map(|r| r.state);
        if let (Some(RecordState::Pending), Some(record), Some(segment), true) =
            (state, record.as_ref(), segment, confirm_pending)
        {
            state = match store
                .confirm(segment, record.ver, &[id.as_str()], ConfirmedVia::Admin)
                .await?
                .as_slice()
            {
                [ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed] => {
                    report.confirmed_now.push(id.clone());
                    Some(RecordState::Confirmed)
                }
                [ConfirmOutcome::Released] => Some(RecordState::Released),
                _ => state,
            };
        }
        let doubtful = match (state, record.as_ref(), segment) {
            (Some(RecordState::Pending), Some(record), Some(segment)) => {
                record.in_doubt || store.known(segment).await?.in_doubt()
            }
            _ => false,
        };
        let list = match state {
            Some(RecordState::Confirmed) => &mut report.confirmed,
            Some(RecordState::Pending) if doubtful => &mut report.in_doubt,
            Some(RecordState::Pending) => &mut report.pending,
            Some(RecordState::Released) => &mut report.released,
            None => &mut report.unknown,
        };
        list.push(id.clone());
    }
    Ok(report)
}

/// Runs `flashgate reconcile --activity ID --orders FILE`: `FILE` holds the reservation ids
/// (`jti`) of the orders the backend kept, one per line (blank lines and `#` comments skipped).
pub fn run_orders_cli(
    settings: Settings,
    activity: &str,
    orders: &str,
    confirm_pending: bool,
) -> Result<OrdersReport, ReconcileError> {
    let activity = settings
        .activities
        .get(activity)
        .ok_or_else(|| ReconcileError::UnknownActivity(activity.to_owned()))?
        .clone();
    let lanes: Vec<Arc<Activity>> = settings
        .activities
        .lanes_of(&activity.id)
        .cloned()
        .collect();
    let ids: Vec<String> = orders
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    with_store(&settings, async |store| {
        let mut report = compare_orders(store, &lanes, &ids, confirm_pending).await?;
        // A reservation id names no activity: one unknown here may be another sale's order
        // (the backend's list holds them all). Those are left out, not reported forgotten.
        let mut forgotten = Vec::new();
        for id in std::mem::take(&mut report.unknown) {
            match owner_elsewhere(store, &settings, &activity, &id).await? {
                Some(other) => report.elsewhere.push((id, other)),
                None => forgotten.push(id),
            }
        }
        report.unknown = forgotten;
        // For the operator who counts next (the admin view, the console's fence panel).
        store
            .record_orders_check(
                &activity,
                crate::stock::orders_check::OrdersCheck {
                    at_ms: 0,
                    read: ids.len() as u64,
                    elsewhere: report.elsewhere.len() as u64,
                    confirmed: report.confirmed.len() as u64,
                    pending: report.pending.len() as u64,
                    in_doubt: report.in_doubt.len() as u64,
                    released: report.released.len() as u64,
                    unknown: report.unknown.len() as u64,
                },
            )
            .await?;
        if report.clean() {
            // Nothing missing or in doubt: recorded in Redis, so that a plain resume of a
            // fence (on any gateway, restarted or not) may accept the master answering now.
            for lane in &lanes {
                store.orders_checked(lane).await?;
            }
        }
        Ok(report)
    })
}

/// The other configured activity whose records hold reservation `id`, if one does.
async fn owner_elsewhere(
    store: &StockStore,
    settings: &Settings,
    activity: &Activity,
    id: &str,
) -> Result<Option<String>, StoreError> {
    for other in settings.activities.lanes().filter(|a| a.id != activity.id) {
        let layout = segments::recorded_layout(store, other).await?;
        let Some(segment) = Reservation::segment_of(id).and_then(|n| layout.segment(n)) else {
            continue;
        };
        if store.lookup(segment, id).await?.is_some() {
            return Ok(Some(other.id.to_string()));
        }
    }
    Ok(None)
}
