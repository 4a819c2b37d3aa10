//! Shared state of one gateway process: what every request and background task reads.

use crate::admission::Admission;
use crate::config::Settings;
use crate::lifecycle::Lifecycle;
use crate::live::{Generation, Live};
use crate::metrics::Metrics;
use crate::proxy::queue::UpstreamQueue;
use crate::refusals::Refusals;
use crate::sold_out::SoldOutCache;
use crate::stock::breaker::Breaker;
use crate::stock::StockStore;
use crate::upstreams::Upstreams;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub struct Gateway {
    /// The current configuration generation (replaced by reloads).
    pub live: Live,
    pub metrics: Arc<Metrics>,
    pub store: Arc<StockStore>,
    /// This instance's sold-out marks, shared by admission, the lifecycle and the news listener.
    pub sold_out: Arc<SoldOutCache>,
    pub admission: Admission,
    pub lifecycle: Arc<Lifecycle>,
    pub upstreams: Arc<Upstreams>,
    /// At most `upstream.max_inflight` sale requests at the backend; the rest wait in line.
    pub upstream_queue: Arc<UpstreamQueue>,
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
            if current.settings.activities.get(&activity.id).is_none() {
                self.metrics.init_activity(&activity.id);
            }
        }
        self.sold_out.set_ttl(settings.sold_out_cache.ttl);
        // Refusals are Redis's verdict on the old configuration: the next prewarm (or buyer)
        // asks again about the new one.
        self.admission.refused.clear();
        self.admission.breaker.configure(settings.breaker);
        if settings.upstream.max_inflight != current.settings.upstream.max_inflight {
            self.upstream_queue
                .set_max_inflight(settings.upstream.max_inflight.map(|n| n.get()));
        }
        if settings.upstream.addresses != current.settings.upstream.addresses {
            self.upstreams
                .set_addresses(&settings.upstream.addresses)
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
        for activity in settings.activities.iter() {
            metrics.init_activity(&activity.id);
        }
        let upstreams = Arc::new(upstreams);
        let sold_out = Arc::new(SoldOutCache::new(settings.sold_out_cache.ttl));
        let breaker = Arc::new(Breaker::new(settings.breaker, metrics.clone()));
        let upstream_queue = UpstreamQueue::new(
            settings.upstream.max_inflight.map(|n| n.get()),
            metrics.clone(),
        );
        let live = Live::new(Generation::build(settings, None));
        let lifecycle = Arc::new(Lifecycle::new(
            live.clone(),
            store.clone(),
            metrics.clone(),
            sold_out.clone(),
            upstreams.clone(),
        ));
        Gateway {
            admission: Admission::new(
                store.clone(),
                metrics.clone(),
                sold_out.clone(),
                breaker,
                Arc::new(Refusals::default()),
                lifecycle.clone(),
            ),
            upstream_queue,
            drain_started: OnceLock::new(),
            lifecycle,
            sold_out,
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

/// A request `elapsed` into a `grace` period that may take `trip` still ends within it.
fn drain_window_open(elapsed: Duration, grace: Duration, trip: Duration) -> bool {
    elapsed.saturating_add(trip) <= grace
}

#[cfg(test)]
mod tests {
    use super::*;

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
