//! The shutdown drain: once shutdown begins (SIGTERM, or after a SIGQUIT hand-over) the gateway
//! stops taking reservations a trip would no longer fit in the grace period for, and waits for
//! the ones in flight to be forwarded or released. What it waits on is
//! [`crate::held::Held`], the one count of reservations held by requests.

use crate::gateway::Gateway;

/// On SIGTERM, or after a SIGQUIT hand-over (Pingora stops accepting connections): stop
/// taking new reservations once a trip no longer fits in the grace period, and report the
/// ones still in flight until they are forwarded or released, within the grace period
/// (after it the process exits; any left then return when their hold expires).
pub async fn drain(gw: &Gateway) {
    gw.start_draining();
    let grace = gw.settings().server.grace_period;
    tracing::info!(
        in_flight = gw.held.now(),
        grace_secs = grace.as_secs(),
        "shutting down: draining requests in flight"
    );
    let mut count = gw.held.watch();
    let _ = tokio::time::timeout(grace, count.wait_for(|n| *n <= 0)).await;
    match gw.held.now() {
        0 => tracing::info!("drained: no reservation in flight"),
        n => {
            tracing::warn!(in_flight = n,
            "grace period over with reservations in flight; they return when their hold expires")
        }
    }
}
