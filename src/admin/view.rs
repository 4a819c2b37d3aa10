//! What the admin API shows of an activity (`GET /v1/activities[/{id}]`, and every call that
//! answers with the activity's view) and of one reservation.

use super::{variants, AdminApp};
use crate::config::{Activity, ConfirmMode};
use crate::stock::{LedgerRow, RecordState, ReservationRecord};
use serde_json::{json, Value};

impl AdminApp {
    /// An activity as the admin API shows it: the current version's ledger at the top level and
    /// every version's in `versions`. Ledger fields are null when the store cannot say. An
    /// activity with variants shows each variant's in `variants`, and their sums at the top
    /// level (its `versions`, fence and refusal: the first variant's that has one).
    pub(super) async fn activity_view(&self, activity: &Activity) -> Value {
        let mut view = if !activity.has_variants() {
            self.lane_view(activity).await
        } else {
            let settings = self.gw.settings();
            let mut lanes = Vec::new();
            for lane in settings.activities.lanes_of(&activity.id) {
                lanes.push(self.lane_view(lane).await);
            }
            variants::variants_view(activity, lanes)
        };
        if activity.has_phases() {
            let mut phases = self.phases_view(activity).await;
            // The public sale's row, after the configured phases', under its own key.
            view["public"] = phases.pop().unwrap_or_default();
            view["phases"] = Value::Array(phases);
        }
        if activity.second_chance.is_some() {
            view["second_chance"] = self.line_view(activity).await;
        }
        // The last `reconcile --orders` (null when none is recorded or Redis did not answer).
        view["orders_check"] = match self.gw.store.orders_check(activity).await {
            Ok(Some(check)) => serde_json::to_value(check).unwrap_or_default(),
            _ => Value::Null,
        };
        view
    }

    /// One stock lane (an activity without variants, or one variant of one) as the admin API
    /// shows it.
    async fn lane_view(&self, activity: &Activity) -> Value {
        // Segments' rows summed per version.
        let rows = self.gw.lifecycle.ledgers(activity).await.ok().map(|rows| {
            let mut versions: Vec<u64> = rows.iter().map(|r| r.version).collect();
            versions.sort_unstable();
            versions.dedup();
            versions
                .into_iter()
                .filter_map(|v| {
                    let of_version: Vec<&LedgerRow> =
                        rows.iter().filter(|r| r.version == v).collect();
                    LedgerRow::total(&of_version)
                })
                .collect::<Vec<_>>()
        });
        let current = rows
            .as_ref()
            .and_then(|rows| rows.iter().find(|r| r.version == activity.version))
            .filter(|r| r.stock_key);
        if let Some(row) = current {
            self.gw
                .lifecycle
                .units_left(&activity.id, activity.variant.as_deref(), row.remaining);
        }
        let field = |f: fn(&LedgerRow) -> i64| current.map(f);
        let remaining = field(|r| r.remaining);
        json!({
            "id": &*activity.id,
            "version": activity.version,
            "stock": activity.stock,
            "remaining": remaining,
            "pending": field(|r| r.pending),
            // The part of `pending` held in doubt (see `LedgerRow::held_in_doubt`).
            "held_in_doubt": field(|r| r.held_in_doubt),
            "confirmed": field(|r| r.confirmed),
            "released": field(|r| r.released),
            "retired": field(|r| r.retired),
            "restocked": field(|r| r.restocked),
            "sold_out": remaining.map(|r| r <= 0),
            // Whether this instance answers sold_out locally (its cache, or news from another).
            "sold_out_cached": self.gw.lifecycle.state().is_sold_out(
                activity,
                self.gw.settings().sold_out_cache.ttl,
            ),
            "confirm": match activity.confirm {
                ConfirmMode::Upstream => "upstream",
                ConfirmMode::Explicit => "explicit",
            },
            "hold_secs": activity.hold.as_secs(),
            "segments": activity.segments,
            "refused": self.gw.lifecycle.state().refusal(&activity.lane).map(|r| r.to_string()),
            "halted": self.gw.lifecycle.state().halted_since(&activity.id).is_some(),
            // The failover fence: the Redis master was replaced under it, or the store holds
            // less than was sold (see stock::failover): null, or the segment, the master
            // recorded and the one answering now, why it is lost (null when it is not: a plain
            // resume, or a rule, lifts it), the records it holds and the most this gateway saw.
            "fenced": self.gw.store.failover().fence(&activity.lane),
            // The last fence lifted (since this gateway started): the rule or call, and when.
            "fence_lifted": self.gw.store.failover().lifted(&activity.lane),
            "versions": rows.map(|rows| rows.iter().map(|r| json!({
                "version": r.version,
                "initial": r.initial,
                "remaining": r.stock_key.then_some(r.remaining),
                "pending": r.pending,
                "held_in_doubt": r.held_in_doubt,
                "confirmed": r.confirmed,
                "released": r.released,
                "retired": r.retired,
                "restocked": r.restocked,
                "drift": r.drift(),
            })).collect::<Vec<_>>()),
            "per_user_limit": activity.per_user_limit.get(),
            "max_per_request": activity.max_per_request.get(),
            "starts_at": activity.starts_at.to_rfc3339(),
            "ends_at": activity.ends_at.to_rfc3339(),
            // When its waiting room takes arrivals (`queue.opens_at`, else `starts_at`); null
            // without one.
            "queue_opens_at": activity.queue.as_ref().map(|q| q.opens_at.to_rfc3339()),
        })
    }
}

pub(super) fn reservation_view(activity: &Activity, id: &str, r: &ReservationRecord) -> Value {
    let mut view = json!({
        "id": id,
        "activity": &*activity.id,
        "state": r.state,
        "user": r.user,
        "qty": r.qty,
        "version": r.ver,
        "created_ms": r.created_ms,
        "deadline_ms": r.deadline_ms,
        "confirmed_ms": r.done_ms.filter(|_| r.state == RecordState::Confirmed),
        "released_ms": r.done_ms.filter(|_| r.state == RecordState::Released),
        "reason": r.reason,
    });
    if let Some(v) = &activity.variant {
        view["variant"] = json!(&**v);
    }
    view
}
