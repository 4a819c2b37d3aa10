//! Every metric series a configuration implies, created at zero before the first request (so
//! dashboards and alerts see a flat line instead of no data): the process-wide ones at start,
//! an activity's when it is configured (at start, or by a reload that adds it).

use crate::client_policy::{LimitKind, LimitMode, PassthroughOutcome};
use crate::decision::Code;
use crate::metrics::Metrics;
use crate::stock::{ConfirmedVia, ReleaseReason, ScriptName, StoreOp};
use crate::upstream::lookup::Answer;
use crate::upstream::UpstreamClass;
use crate::waiting::Standing;

/// Creates the label-free (and fixed-label) series at zero, so dashboards and alerts see them
/// before the first event.
pub fn preset_static_series(metrics: &Metrics) {
    for class in UpstreamClass::ALL {
        metrics
            .upstream_responses
            .with_label_values(&[class.as_str()]);
    }
    for limit in [LimitKind::PerUser, LimitKind::PerIp, LimitKind::PerActivity] {
        for mode in LimitMode::ALL {
            metrics
                .rate_limit_refusals
                .with_label_values(&[limit.as_str(), mode.as_str()]);
        }
    }
    for op in StoreOp::ALL {
        metrics.redis_errors.with_label_values(&[op.as_str()]);
    }
    for script in ScriptName::ALL {
        metrics
            .script_duration
            .with_label_values(&[script.as_str()]);
    }
    for result in ReloadResult::ALL {
        metrics.config_reloads.with_label_values(&[result.as_str()]);
    }
    for refusal in crate::edge::EdgeRefusal::ALL {
        metrics.edge_refusals.with_label_values(&[refusal.as_str()]);
    }
    for reason in crate::stock::failover::LiftReason::ALL {
        metrics.fence_lifted.with_label_values(&[reason.as_str()]);
    }
    metrics.config_generation.set(1);
}

/// One family of series keyed by activity: made at zero, or forgotten.
trait Family {
    fn make(&self, labels: &[&str]);
    fn forget(&self, labels: &[&str]);
}

impl<P: prometheus::core::MetricVecBuilder> Family for prometheus::core::MetricVec<P> {
    fn make(&self, labels: &[&str]) {
        self.with_label_values(labels);
    }

    fn forget(&self, labels: &[&str]) {
        let _ = self.remove_label_values(labels);
    }
}

/// Creates the series of a configured activity at zero. An activity with variants has no
/// activity-wide `flashgate_stock_remaining` (its stock is its variants', each a series of
/// `{activity, variant}` made when first learnt): a lone series at 0 would read "sold out".
pub fn preset_activity_series(metrics: &Metrics, activity: &crate::config::Activity) {
    each_activity_series(metrics, activity, &mut |family, labels| family.make(labels));
}

/// Drops every series of an activity a reload removed (its per-variant stock too), so the
/// dashboards' activity picker and sums forget it without a restart.
pub fn forget_activity_series(metrics: &Metrics, activity: &crate::config::Activity) {
    each_activity_series(metrics, activity, &mut |family, labels| {
        family.forget(labels)
    });
    for variant in activity.variants.iter() {
        let _ = metrics
            .stock_remaining_variants
            .remove_label_values(&[&activity.id, &variant.id]);
    }
}

/// A reload from `before` to `after`: every configured activity's series made (idempotent: an
/// activity that gained a waiting room gets those), a removed activity's dropped, and a variant
/// no longer sold loses its stock series (an activity that became a drop, its activity-wide one).
pub fn reconfigured_series(
    metrics: &Metrics,
    before: &crate::config::Activities,
    after: &crate::config::Activities,
) {
    for activity in after.iter() {
        preset_activity_series(metrics, activity);
    }
    for old in before.iter() {
        let Some(now) = after.get(&old.id) else {
            forget_activity_series(metrics, old);
            continue;
        };
        for v in old.variants.iter() {
            if !now.variants.iter().any(|n| n.id == v.id) {
                let labels = [&*old.id, &*v.id];
                let _ = metrics
                    .stock_remaining_variants
                    .remove_label_values(&labels);
            }
        }
        if now.has_variants() && !old.has_variants() {
            let _ = metrics.stock_remaining.remove_label_values(&[&old.id]);
        }
    }
}

/// Every series of `activity`, handed to `f` with its labels.
fn each_activity_series(
    metrics: &Metrics,
    activity: &crate::config::Activity,
    f: &mut dyn FnMut(&dyn Family, &[&str]),
) {
    let has_queue = activity.queue.is_some();
    let has_variants = activity.has_variants();
    let phases = activity.phases.clone();
    let has_line = activity.second_chance.is_some();
    let activity: &str = &activity.id;
    if has_queue {
        for family in [
            &metrics.queue_tickets,
            &metrics.queue_admitted,
            &metrics.queue_lapsed,
            &metrics.queue_too_late,
            &metrics.queue_polls,
        ] {
            f(family, &[activity]);
        }
        f(&metrics.queue_length, &[activity]);
        f(&metrics.queue_cursor, &[activity]);
        f(&metrics.queue_start_time, &[activity]);
        f(&metrics.queue_wait, &[activity]);
        for why in Standing::ALL {
            f(&metrics.queue_paused, &[activity, why.as_str()]);
        }
        for outcome in crate::waiting::ChallengeOutcome::ALL {
            f(&metrics.queue_challenges, &[activity, outcome.as_str()]);
        }
    }
    for code in Code::ALL {
        f(&metrics.decisions, &[activity, code.as_str()]);
    }
    for phase in phases.iter().map(|p| &*p.id) {
        f(&metrics.phase_units, &[activity, phase]);
    }
    if !phases.is_empty() {
        f(
            &metrics.phase_units,
            &[activity, crate::config::phases::PUBLIC],
        );
    }
    if has_line {
        f(&metrics.line_waiting, &[activity]);
        f(&metrics.line_held, &[activity]);
    }
    for reason in ReleaseReason::ALL {
        f(&metrics.reservations_released, &[activity, reason.as_str()]);
    }
    for via in ConfirmedVia::ALL {
        f(&metrics.reservations_confirmed, &[activity, via.as_str()]);
    }
    for outcome in crate::stock::LateOutcome::ALL {
        f(&metrics.late_accepted, &[activity, outcome.as_str()]);
    }
    for answer in Answer::ALL {
        f(&metrics.order_lookups, &[activity, answer.as_str()]);
    }
    for outcome in PassthroughOutcome::ALL {
        f(&metrics.passthrough, &[activity, outcome.as_str()]);
    }
    if !has_variants {
        f(&metrics.stock_remaining, &[activity]);
    }
    f(&metrics.stock_keys_created, &[activity]);
    f(&metrics.reservations_retired, &[activity]);
    f(&metrics.reconcile_drift, &[activity]);
    f(&metrics.units_held_in_doubt, &[activity]);
    f(&metrics.activity_refused, &[activity]);
    f(&metrics.activity_fenced, &[activity]);
    f(&metrics.activity_halted, &[activity]);
    f(&metrics.restocked_units, &[activity]);
}

crate::label_enum! {
    /// How a configuration reload ended, as the `result` label.
    pub enum ReloadResult {
        Applied => "applied",
        Refused => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    /// 1001 with a waiting room, 2002 a drop of two variants.
    fn settings() -> Settings {
        crate::config::testing::settings_with(
            &[
                r#"sale_routes: [{ method: POST, path: "/buy/{activity}", variant_query: variant }]"#,
            ],
            r#"  - { id: "1001", stock: 10, version: 1, per_user_limit: 1, max_per_request: 1, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", queue: { admit_per_second: 1 } }
  - { id: "2002", variants: [{ id: "40", stock: 1 }, { id: "40.5", stock: 1 }], version: 1, per_user_limit: 1, max_per_request: 1, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z" }
"#,
        )
    }

    #[test]
    fn a_drop_has_no_activity_wide_stock_series_and_a_removed_activity_none_at_all() {
        let metrics = Metrics::new();
        let settings = settings();
        for activity in settings.activities.iter() {
            preset_activity_series(&metrics, activity);
        }
        let drop = settings.activities.get("2002").unwrap();
        metrics
            .stock_remaining_variants
            .with_label_values(&["2002", "40"])
            .set(1);
        let text = String::from_utf8(metrics.encode()).unwrap();
        assert!(
            !text.contains(r#"flashgate_stock_remaining{activity="2002"}"#),
            "{text}"
        );
        assert!(text.contains(r#"flashgate_stock_remaining{activity="2002",variant="40"} 1"#));
        forget_activity_series(&metrics, drop);
        let text = String::from_utf8(metrics.encode()).unwrap();
        assert!(
            !text.contains(r#"activity="2002""#),
            "every series of 2002 is gone: {text}"
        );
        assert!(text.contains(r#"activity="1001""#));
    }

    #[test]
    fn series_exist_before_the_first_request() {
        let metrics = Metrics::new();
        preset_static_series(&metrics);
        let settings = settings();
        preset_activity_series(&metrics, settings.activities.get("1001").unwrap());
        let text = String::from_utf8(metrics.encode()).unwrap();
        for needle in [
            r#"flashgate_admission_decisions_total{activity="1001",decision="sold_out"} 0"#,
            r#"flashgate_reservations_released_total{activity="1001",reason="upstream_5xx"} 0"#,
            r#"flashgate_reservations_confirmed_total{activity="1001",via="lookup"} 0"#,
            r#"flashgate_order_lookups_total{activity="1001",result="unanswered"} 0"#,
            r#"flashgate_upstream_responses_total{class="error"} 0"#,
            r#"flashgate_stock_remaining{activity="1001"} 0"#,
            r#"flashgate_units_held_in_doubt{activity="1001"} 0"#,
            r#"flashgate_redis_errors_total{op="transfer"} 0"#,
            "flashgate_config_generation 1",
            r#"flashgate_queue_tickets_total{activity="1001"} 0"#,
            r#"flashgate_queue_length{activity="1001"} 0"#,
            r#"flashgate_queue_admitted_total{activity="1001"} 0"#,
            r#"flashgate_queue_wait_seconds_count{activity="1001"} 0"#,
        ] {
            assert!(text.contains(needle), "{needle}");
        }
    }
}
