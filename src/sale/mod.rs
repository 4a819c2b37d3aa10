//! What this gateway knows of each activity's sale, as learned from Redis: whether Redis's
//! record refuses its configuration, whether its current version is sold out (the moka mark that
//! answers `sold_out` without a call), whether it is halted for the fleet, and whether the stock
//! was made once. Handed out in two halves made together by [`SaleState::new`]: any number of
//! [`SaleView`]s (read: the purchase's gates, the admin API, readiness) and one [`SaleWriter`],
//! which only the lifecycle is given (it changes the state on events: a reserve's answer, a
//! release, a prewarm, news from another gateway, a reload, a halt read). One writer, by type.
//!
//! The sale's hours are not kept here: they are judged by Redis's clock (`crate::stock::clock`)
//! against the configuration, by the gate before any call and by the scripts again.

mod halts;
mod refusals;
mod sold_out;

use crate::config::Activity;
use crate::stock::segments::Refusal;
use crate::stock::Halt;
use halts::Halts;
use refusals::Refusals;
use sold_out::SoldOutCache;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The sale state's parts, shared by its view and its writer.
#[derive(Default)]
struct Inner {
    sold_out: Arc<SoldOutCache>,
    refused: Refusals,
    halts: Halts,
    /// Whether a prewarm pass ran once over every configured stock lane (readiness waits for
    /// it: a stock it makes may be born on hold, and a gateway taking buyers before it knows
    /// would answer them `unavailable`).
    stock_made: AtomicBool,
}

/// Makes the sale state's two halves.
pub struct SaleState;

impl SaleState {
    /// A fresh sale state: its read half (clone it freely) and its one write half.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> (SaleView, SaleWriter) {
        Self::with(Inner::default())
    }

    fn with(inner: Inner) -> (SaleView, SaleWriter) {
        let inner = Arc::new(inner);
        (SaleView(inner.clone()), SaleWriter(inner))
    }
}

/// The read half of the sale state (see the module's doc).
#[derive(Clone)]
pub struct SaleView(Arc<Inner>);

impl SaleView {
    /// Another gateway's sale state in the same process whose sold-out marks are these, as if
    /// news reached it at once; the rest is its own (the model test runs several gateways).
    pub fn sharing_marks(&self) -> (SaleView, SaleWriter) {
        SaleState::with(Inner {
            sold_out: self.0.sold_out.clone(),
            ..Inner::default()
        })
    }

    /// Whether this gateway knows `activity`'s current version sold out (marks live for `ttl`,
    /// the reader's generation's `sold_out_cache.ttl_ms`).
    pub fn is_sold_out(&self, activity: &Activity, ttl: Duration) -> bool {
        self.0
            .sold_out
            .is_sold_out(&activity.lane, activity.version, ttl)
    }

    /// Why Redis's record refuses the stock lane (`Activity::lane`), if it does.
    pub fn refusal(&self, lane: &str) -> Option<Refusal> {
        self.0.refused.get(lane)
    }

    /// Whether the activity, as configured now, is refused (a refusal of another version or
    /// segment count does not apply).
    pub fn is_refused(&self, activity: &Activity) -> bool {
        self.0.refused.is_refused(activity)
    }

    /// Whether any stock lane of activity `id` (itself, or `<id>~<variant>`) is refused.
    pub fn any_lane_refused(&self, id: &str) -> bool {
        self.0.refused.any_lane_of(id)
    }

    /// Since when the activity is halted (unix ms, Redis's clock), if this gateway knows it is.
    pub fn halted_since(&self, activity: &str) -> Option<u64> {
        self.0.halts.since(activity)
    }

    /// Whether every configured activity's halt was read once (readiness waits for it).
    pub fn halts_read(&self) -> bool {
        self.0.halts.read_once()
    }

    /// Halted, or not known yet: before every halt was read once (a process takes requests as
    /// soon as its listener is up, readiness or not), nothing is sold.
    pub fn is_halted(&self, activity: &Activity) -> bool {
        !self.halts_read() || self.halted_since(&activity.id).is_some()
    }

    /// Whether a prewarm pass ran once over every configured stock lane.
    pub fn stock_made(&self) -> bool {
        self.0.stock_made.load(Ordering::Relaxed)
    }
}

/// The write half of the sale state: one per state, given to its owner (the lifecycle).
pub struct SaleWriter(Arc<Inner>);

impl SaleWriter {
    /// A read half of this state.
    pub fn view(&self) -> SaleView {
        SaleView(self.0.clone())
    }

    /// Marks the lane's `version` sold out for `ttl`.
    pub fn mark_sold_out(&self, lane: &Arc<str>, version: u64, ttl: Duration) {
        self.0.sold_out.mark_sold_out(lane, version, ttl);
    }

    /// Units of the lane's `version` came back: its mark goes.
    pub fn clear_sold_out(&self, lane: &Arc<str>, version: u64) {
        self.0.sold_out.clear(lane, version);
    }

    /// Records (or clears, with `None`) Redis's refusal of one stock lane.
    pub fn set_refusal(&self, lane: &Arc<str>, refusal: Option<Refusal>) {
        self.0.refused.set(lane, refusal);
    }

    /// Forgets every refusal (a reload: the next prewarm decides again).
    pub fn forget_refusals(&self) {
        self.0.refused.clear();
    }

    /// Records what Redis said of an activity's halt; whether that changed what was known.
    pub fn set_halt(&self, activity: &Arc<str>, halt: Halt) -> bool {
        self.0.halts.set(activity, halt)
    }

    /// Every configured activity's halt was read once.
    pub fn halts_were_read(&self) {
        self.0.halts.mark_read();
    }

    /// A prewarm pass ran over every configured stock lane.
    pub fn stock_was_made(&self) {
        self.0.stock_made.store(true, Ordering::Relaxed);
    }
}
