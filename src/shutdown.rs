//! The shutdown drain: once shutdown begins (SIGTERM, or after a SIGQUIT hand-over) the gateway
//! stops taking reservations a trip would no longer fit in the grace period for, and waits for
//! the ones in flight to be forwarded or released. What it waits on is
//! [`crate::held::Held`], the one count of reservations held by requests.

use crate::config::Settings;
use crate::held::Held;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Whether (and since when) the gateway is shutting down, and the reservations it waits on.
pub struct Drain {
    /// When shutdown began (set once).
    started: OnceLock<Instant>,
    held: Arc<Held>,
}

impl Drain {
    pub fn new(held: Arc<Held>) -> Drain {
        Drain {
            started: OnceLock::new(),
            held,
        }
    }

    /// The reservations requests hold until forwarded or released.
    pub fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// Shutdown began: readiness fails, and soon new sale requests are refused (see
    /// [`Drain::takes_new_reservations`]).
    pub fn start(&self) {
        let _ = self.started.set(Instant::now());
    }

    pub fn is_draining(&self) -> bool {
        self.started.get().is_some()
    }

    /// Whether a sale request may still take a reservation: always before shutdown; after it
    /// only while the rest of the grace period covers the request's longest trip, so that its
    /// reservation is forwarded or released before the process exits. The requests this lets
    /// in are those read from connections accepted just before the listeners closed (or
    /// handed over, on an upgrade): served rather than turned away.
    pub fn takes_new_reservations(&self, settings: &Settings) -> bool {
        self.started.get().is_none_or(|started| {
            window_open(
                started.elapsed(),
                settings.server.grace_period,
                settings.server.longest_sale_trip,
            )
        })
    }

    /// On SIGTERM, or after a SIGQUIT hand-over (Pingora stops accepting connections): stop
    /// taking new reservations once a trip no longer fits in the grace period, and report the
    /// ones still in flight until they are forwarded or released, within the grace period
    /// (after it the process exits; any left then return when their hold expires).
    pub async fn drain(&self, settings: &Settings) {
        self.start();
        let grace = settings.server.grace_period;
        tracing::info!(
            in_flight = self.held.now(),
            grace_secs = grace.as_secs(),
            "shutting down: draining requests in flight"
        );
        let mut count = self.held.watch();
        let _ = tokio::time::timeout(grace, count.wait_for(|n| *n <= 0)).await;
        match self.held.now() {
            0 => tracing::info!("drained: no reservation in flight"),
            n => {
                tracing::warn!(in_flight = n,
                "grace period over with reservations in flight; they return when their hold expires")
            }
        }
    }
}

/// A request `elapsed` into a `grace` period that may take `trip` still ends within it.
fn window_open(elapsed: Duration, grace: Duration, trip: Duration) -> bool {
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
        assert!(window_open(s(0), s(10), ms(8500)));
        assert!(window_open(ms(1500), s(10), ms(8500)));
        assert!(!window_open(ms(1501), s(10), ms(8500)));
        // A grace period shorter than a trip turns every new sale away.
        assert!(!window_open(s(0), s(2), ms(8500)));
    }
}
