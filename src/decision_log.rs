//! One structured line per sale decision (activity, user, quantity, stock before/after,
//! outcome), written through a non-blocking writer so the hot path never waits on stdout.
//!
//! Approximation: when the writer's buffer is full (a burst faster than stdout drains), lines
//! are dropped rather than stalling requests; metrics still count every decision.

use crate::decision::Decision;
use crate::purchase::SaleFacts;
use crate::reservation::Reservation;
use crate::stock::ReleaseReason;
use pingora::Error;
use std::time::Duration;

/// Log target of decision lines, for filtering (`RUST_LOG=flashgate::decision=off`).
pub const TARGET: &str = "flashgate::decision";

pub struct Entry<'a> {
    pub activity: &'a str,
    pub facts: &'a SaleFacts,
    pub decision: Decision,
    pub reservation: Option<&'a Reservation>,
    pub released: Option<ReleaseReason>,
    pub upstream_status: Option<u16>,
    pub error: Option<&'a Error>,
    pub elapsed: Duration,
}

pub fn record(e: &Entry<'_>) {
    let facts = e.facts;
    // Units left before this request's script call: after + what the reserve took.
    let taken = e.reservation.map_or(0, |r| u64::from(r.qty));
    tracing::info!(
        target: TARGET,
        activity = e.activity,
        variant = facts.activity.as_ref().and_then(|a| a.variant.as_deref()),
        user = facts.user.as_deref(),
        qty = facts.qty,
        stock_before = facts.stock_after.map(|after| after + taken),
        stock_after = facts.stock_after,
        outcome = e.decision.code(),
        reservation = e.reservation.map(|r| r.id.as_str()),
        released = e.released.map(ReleaseReason::as_str),
        upstream_status = e.upstream_status,
        error = e.error.map(tracing::field::display),
        elapsed_us = e.elapsed.as_micros() as u64,
    );
}

/// One line for a request the edge refused before routing it. The target is written escaped
/// (Debug), never raw: it may hold anything.
pub fn record_edge(
    refusal: crate::edge::EdgeRefusal,
    req: &pingora::http::RequestHeader,
    elapsed: Duration,
) {
    let raw = req.raw_path();
    let shown = &raw[..raw.len().min(256)];
    tracing::info!(
        target: TARGET,
        outcome = refusal.decision().code(),
        edge = refusal.as_str(),
        method = %req.method,
        target = ?String::from_utf8_lossy(shown),
        elapsed_us = elapsed.as_micros() as u64,
    );
}
