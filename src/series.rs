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

/// Creates the series of a configured activity at zero.
pub fn preset_activity_series(metrics: &Metrics, activity: &str, has_queue: bool) {
    if has_queue {
        for family in [
            &metrics.queue_tickets,
            &metrics.queue_admitted,
            &metrics.queue_lapsed,
            &metrics.queue_too_late,
            &metrics.queue_polls,
        ] {
            family.with_label_values(&[activity]);
        }
        metrics.queue_length.with_label_values(&[activity]);
        metrics.queue_cursor.with_label_values(&[activity]);
        metrics.queue_start_time.with_label_values(&[activity]);
        metrics.queue_wait.with_label_values(&[activity]);
        for why in Standing::ALL {
            metrics
                .queue_paused
                .with_label_values(&[activity, why.as_str()]);
        }
        for outcome in crate::waiting::ChallengeOutcome::ALL {
            metrics
                .queue_challenges
                .with_label_values(&[activity, outcome.as_str()]);
        }
    }
    for code in Code::ALL {
        metrics
            .decisions
            .with_label_values(&[activity, code.as_str()]);
    }
    for reason in ReleaseReason::ALL {
        metrics
            .reservations_released
            .with_label_values(&[activity, reason.as_str()]);
    }
    for via in ConfirmedVia::ALL {
        metrics
            .reservations_confirmed
            .with_label_values(&[activity, via.as_str()]);
    }
    for outcome in crate::stock::LateOutcome::ALL {
        metrics
            .late_accepted
            .with_label_values(&[activity, outcome.as_str()]);
    }
    for answer in Answer::ALL {
        metrics
            .order_lookups
            .with_label_values(&[activity, answer.as_str()]);
    }
    for outcome in PassthroughOutcome::ALL {
        metrics
            .passthrough
            .with_label_values(&[activity, outcome.as_str()]);
    }
    metrics.stock_remaining.with_label_values(&[activity]);
    metrics.stock_keys_created.with_label_values(&[activity]);
    metrics.reservations_retired.with_label_values(&[activity]);
    metrics.reconcile_drift.with_label_values(&[activity]);
    metrics.units_held_in_doubt.with_label_values(&[activity]);
    metrics.activity_refused.with_label_values(&[activity]);
    metrics.activity_fenced.with_label_values(&[activity]);
    metrics.restocked_units.with_label_values(&[activity]);
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

    #[test]
    fn series_exist_before_the_first_request() {
        let metrics = Metrics::new();
        preset_static_series(&metrics);
        preset_activity_series(&metrics, "1001", true);
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
