//! Shared state of one gateway process: what every request and background task reads.

use crate::admission::{Admission, Code, LimitKind, LimitMode, PassthroughOutcome};
use crate::config::Settings;
use crate::lifecycle::Lifecycle;
use crate::live::{Generation, Live};
use crate::metrics::Metrics;
use crate::stock::breaker::Breaker;
use crate::stock::{ConfirmedVia, ReleaseReason, ScriptName, StockStore, StoreOp};
use crate::upstream::forward::Forwarder;
use crate::upstream::lookup::Answer;
use crate::upstream::queue::UpstreamQueue;
use crate::upstream::{UpstreamClass, Upstreams};
use crate::waiting::{Standing, WaitingRoom};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub struct Gateway {
    /// The current configuration generation (replaced by reloads).
    pub live: Live,
    pub metrics: Arc<Metrics>,
    pub store: Arc<StockStore>,
    pub admission: Admission,
    pub lifecycle: Arc<Lifecycle>,
    pub upstreams: Arc<Upstreams>,
    /// The reservations requests hold until forwarded or released (the drain waits on them).
    pub held: Arc<crate::held::Held>,
    /// At most `upstream.max_inflight` sale requests at the backend; the rest wait in line.
    pub upstream_queue: Arc<UpstreamQueue>,
    /// Sends purchases holding stock to the backend on the gateway's own connections.
    pub forwarder: Forwarder,
    /// The activities' waiting rooms.
    pub waiting: WaitingRoom,
    /// When shutdown began (set once).
    drain_started: OnceLock<Instant>,
    /// Test-only fault point (feature `fault-injection`, env `FLASHGATE_FAULT`).
    #[cfg(feature = "fault-injection")]
    pub fault: Option<Fault>,
}

/// Faults the test suite can make a gateway commit.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After a successful reserve, never forward (as if the process died right there; the test
    /// then SIGKILLs it).
    HangAfterReserve,
}

impl Gateway {
    /// Shutdown began: readiness fails, and soon new sale requests are refused (see
    /// [`Gateway::takes_new_reservations`]).
    pub fn start_draining(&self) {
        let _ = self.drain_started.set(Instant::now());
    }

    pub fn is_draining(&self) -> bool {
        self.drain_started.get().is_some()
    }

    /// Whether a sale request may still take a reservation: always before shutdown; after it
    /// only while the rest of the grace period covers the request's longest trip, so that its
    /// reservation is forwarded or released before the process exits. The requests this lets
    /// in are those read from connections accepted just before the listeners closed (or
    /// handed over, on an upgrade): served rather than turned away.
    pub fn takes_new_reservations(&self, settings: &Settings) -> bool {
        self.drain_started.get().is_none_or(|started| {
            drain_window_open(
                started.elapsed(),
                settings.server.grace_period,
                settings.server.longest_sale_trip,
            )
        })
    }

    /// Drops idle rate-limit buckets of the current generation.
    pub fn evict_idle_buckets(&self) {
        let remaining = self.live.current().policy.evict_idle_buckets();
        self.metrics.rate_limiter_keys.set(remaining as i64);
    }

    /// Updates gauges that are cheap to read on demand (at scrape time).
    pub fn refresh_gauges(&self) {
        let buckets = self.live.current().policy.buckets();
        self.metrics.rate_limiter_keys.set(buckets as i64);
    }

    /// Makes `settings` the running configuration (checked by the caller) and returns its
    /// generation number. Requests in flight finish under the generation they started with.
    pub async fn apply(&self, settings: Settings) -> u64 {
        let current = self.live.current();
        let settings = Arc::new(settings);
        for activity in settings.activities.iter() {
            let old = current.settings.activities.get(&activity.id);
            if old.is_none_or(|old| old.queue.is_none()) {
                preset_activity_series(&self.metrics, &activity.id, activity.queue.is_some());
            }
        }
        self.lifecycle.reloaded();
        if settings.upstream.addresses != current.settings.upstream.addresses {
            // Health-checked: the new addresses, and the old ones for requests still in
            // flight under the previous generation (each request picks from its own list).
            self.upstreams
                .set_addresses(
                    &settings.upstream.addresses,
                    &current.settings.upstream.addresses,
                )
                .await;
        }
        let next = Generation::build(settings, Some(&current));
        let number = next.number;
        self.live.publish(next);
        self.metrics.config_generation.set(number as i64);
        number
    }

    /// The current settings (background work; a request keeps its own generation).
    pub fn settings(&self) -> Arc<Settings> {
        self.live.settings()
    }

    pub fn new(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        store: Arc<StockStore>,
        upstreams: Upstreams,
    ) -> Gateway {
        preset_static_series(&metrics);
        for activity in settings.activities.iter() {
            preset_activity_series(&metrics, &activity.id, activity.queue.is_some());
        }
        let upstreams = Arc::new(upstreams);
        let breaker = Arc::new(Breaker::new(metrics.clone()));
        let upstream_queue = UpstreamQueue::new(metrics.clone());
        let live = Live::new(Generation::build(settings, None));
        let lifecycle = Arc::new(Lifecycle::new(
            live.clone(),
            store.clone(),
            metrics.clone(),
            Arc::new(crate::lifecycle::SaleState::default()),
            upstreams.clone(),
        ));
        Gateway {
            admission: Admission::new(Arc::new(lifecycle.clone()), metrics.clone(), breaker),
            held: crate::held::Held::new(metrics.reservations_in_flight.clone()),
            upstream_queue,
            forwarder: Forwarder::default(),
            waiting: WaitingRoom::new(store.clone(), metrics.clone()),
            drain_started: OnceLock::new(),
            lifecycle,
            live,
            metrics,
            store,
            upstreams,
            #[cfg(feature = "fault-injection")]
            fault: match std::env::var("FLASHGATE_FAULT").as_deref() {
                Ok("hang_after_reserve") => Some(Fault::HangAfterReserve),
                _ => None,
            },
        }
    }
}

/// Creates the label-free (and fixed-label) series at zero, so dashboards and alerts see them
/// before the first event.
fn preset_static_series(metrics: &Metrics) {
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
    for refusal in crate::admission::EdgeRefusal::ALL {
        metrics.edge_refusals.with_label_values(&[refusal.as_str()]);
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
    metrics.activity_refused.with_label_values(&[activity]);
}

crate::label_enum! {
    /// How a configuration reload ended, as the `result` label.
    pub enum ReloadResult {
        Applied => "applied",
        Refused => "refused",
    }
}

/// A request `elapsed` into a `grace` period that may take `trip` still ends within it.
fn drain_window_open(elapsed: Duration, grace: Duration, trip: Duration) -> bool {
    elapsed.saturating_add(trip) <= grace
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

    #[test]
    fn after_shutdown_reservations_are_taken_only_while_the_grace_covers_a_trip() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // The default grace: the trip rounded up plus a second.
        assert!(drain_window_open(s(0), s(10), ms(8500)));
        assert!(drain_window_open(ms(1500), s(10), ms(8500)));
        assert!(!drain_window_open(ms(1501), s(10), ms(8500)));
        // A grace period shorter than a trip turns every new sale away.
        assert!(!drain_window_open(s(0), s(2), ms(8500)));
    }
}
