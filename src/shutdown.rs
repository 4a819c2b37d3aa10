//! The shutdown drain: once shutdown begins (SIGTERM, or after a SIGQUIT hand-over) the gateway
//! stops taking reservations a trip would no longer fit in the grace period for, and waits for
//! the ones in flight to be forwarded or released.

use crate::gateway::Gateway;
use std::time::Duration;

/// On SIGTERM, or after a SIGQUIT hand-over (Pingora stops accepting connections): stop
/// taking new reservations once a trip no longer fits in the grace period, and report the
/// ones still in flight until they are forwarded or released, within the grace period
/// (after it the process exits; any left then return when their hold expires).
pub async fn drain(gw: &Gateway) {
    gw.start_draining();
    let grace = gw.settings().server.grace_period;
    let held = || gw.metrics.reservations_in_flight.get();
    tracing::info!(
        in_flight = held(),
        grace_secs = grace.as_secs(),
        "shutting down: draining requests in flight"
    );
    let deadline = tokio::time::Instant::now() + grace;
    while held() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match held() {
        0 => tracing::info!("drained: no reservation in flight"),
        n => {
            tracing::warn!(in_flight = n,
            "grace period over with reservations in flight; they return when their hold expires")
        }
    }
}
