//! What this gateway knows of each activity's sale, as learned from Redis: whether Redis's
//! record refuses its configuration, whether its current version is sold out (the moka mark that
//! answers `sold_out` without a call), and the units left (`flashgate_stock_remaining`). One
//! owner: the lifecycle changes it on events (a reserve's answer, a release, a prewarm, news from
//! another gateway, a reload), and everyone else reads it. Its writers are private to the
//! lifecycle; the gauges `flashgate_stock_remaining` and `flashgate_activity_refused` are derived
//! here, where the facts change.
//!
//! The sale's hours are not kept here: they are judged by Redis's clock ([`crate::stock::clock`])
//! against the configuration, by the gate before any call and by the scripts again.

use super::{Lifecycle, LifecycleStore};
use crate::config::{Activity, Settings};
use crate::news::{self, News, NewsSink};
use crate::refusals::Refusals;
use crate::sold_out::SoldOutCache;
use crate::stock::segments::{self, Refusal};
use std::sync::Arc;
use std::time::Duration;

/// The sale state of every activity this gateway serves (see the module's doc).
#[derive(Default)]
pub struct SaleState {
    sold_out: Arc<SoldOutCache>,
    refused: Refusals,
    /// Activities halted for the whole fleet (see [`super::halt`]).
    pub(super) halts: super::halt::Halts,
    /// Whether a prewarm pass ran once over every configured stock lane (readiness waits for
    /// it: a stock it makes may be born on hold, and a gateway taking buyers before it knows
    /// would answer them `unavailable`).
    stock_made: std::sync::atomic::AtomicBool,
}

impl SaleState {
    /// Another instance's state in the same process whose sold-out marks are these, as if news
    /// reached it at once; its refusals are its own (the model test runs several instances).
    pub fn sharing_marks(&self) -> SaleState {
        SaleState {
            sold_out: self.sold_out.clone(),
            refused: Refusals::default(),
            halts: Default::default(),
            stock_made: Default::default(),
        }
    }

    /// Whether this gateway knows `activity`'s current version sold out (marks live for `ttl`,
    /// the reader's generation's `sold_out_cache.ttl_ms`).
    pub fn is_sold_out(&self, activity: &Activity, ttl: Duration) -> bool {
        self.sold_out
            .is_sold_out(&activity.lane, activity.version, ttl)
    }

    /// Why Redis's record refuses the activity, if it does.
    pub fn refusal(&self, activity: &str) -> Option<Refusal> {
        self.refused.get(activity)
    }

    /// Since when the activity is halted (unix ms, Redis's clock), if this gateway knows it is.
    pub fn halted_since(&self, activity: &str) -> Option<u64> {
        self.halts.since(activity)
    }

    /// Whether every configured activity's halt was read once (readiness waits for it).
    pub fn halts_read(&self) -> bool {
        self.halts.read_once()
    }

    /// Whether a prewarm pass ran once over every configured stock lane (see the field).
    pub fn stock_made(&self) -> bool {
        self.stock_made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the activity, as configured now, is refused (a refusal of another version or
    /// segment count does not apply).
    pub fn is_refused(&self, activity: &Activity) -> bool {
        self.refused.is_refused(activity)
    }

    pub(super) fn clear_sold_out(&self, activity: &Arc<str>, version: u64) {
        self.sold_out.clear(activity, version);
    }
}

impl<S: LifecycleStore> Lifecycle<S> {
    /// What this gateway knows of each activity's sale.
    pub fn state(&self) -> &SaleState {
        &self.state
    }

    /// What the store said is left of `activity`'s version (a reserve's answer): the gauge,
    /// where the answer covered the whole activity, and, when nothing is left anywhere, the
    /// sold-out mark, told to the other gateways once.
    pub fn learned_left(&self, activity: &Activity, left: i64, ttl: Duration) {
        if !activity.is_segmented() {
            self.units_left(&activity.id, activity.variant.as_deref(), left);
        }
        if left <= 0 && !self.state.is_sold_out(activity, ttl) {
            self.state
                .sold_out
                .mark_sold_out(&activity.lane, activity.version, ttl);
            news::publish(
                &self.store,
                News::SoldOut {
                    activity: activity.lane.to_string(),
                    version: activity.version,
                },
            );
        }
    }

    /// Redis's record refuses the stock lane's configuration (`Some`), or no longer does:
    /// told once per change, and kept in `flashgate_activity_refused` (of the activity: 1 while
    /// any lane of it is refused). `activity` is the lane's name (`Activity::lane`).
    /// A prewarm pass ran over every configured stock lane (each on sale, refused, or failed
    /// and tried again at the next pass).
    pub fn prewarmed_every_lane(&self) {
        self.state
            .stock_made
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn refused(&self, activity: &Arc<str>, refusal: Option<Refusal>) {
        let before = self.state.refused.get(activity);
        match (&before, &refusal) {
            (b, Some(r)) if b.as_ref() != Some(r) => {
                tracing::error!(activity = %activity, refusal = %r, "not on sale");
            }
            (Some(_), None) => {
                tracing::info!(activity = %activity, "configuration accepted again: on sale");
            }
            _ => {}
        }
        self.state.refused.set(activity, refusal);
        let id = activity.split('~').next().unwrap_or(activity);
        self.metrics
            .activity_refused
            .with_label_values(&[id])
            .set(i64::from(self.state.refused.any_lane_of(id)));
    }

    /// A new configuration: refusals were Redis's verdict on the old one; the next prewarm (or
    /// buyer) asks again about the new one.
    pub fn reloaded(&self) {
        self.state.refused.clear();
    }

    /// A reload published a new configuration: the prewarm runs at once, so Redis learns a
    /// new version (and its record, which `check --live` reads, moves on) now rather than at
    /// the next `redis.prewarm_interval_ms` tick. One request is kept while a prewarm runs.
    pub fn prewarm_soon(&self) {
        self.prewarm_due.notify_one();
    }

    /// Resolves when a reload asked for a prewarm ([`Lifecycle::prewarm_soon`]).
    pub async fn prewarm_requested(&self) {
        self.prewarm_due.notified().await;
    }

    /// News from another gateway, of a stock lane (`Activity::lane`: an activity, or one
    /// variant of it). Only lanes configured here (and, for sold out, their
    /// current version) are touched, so a stray publisher cannot grow the marks; sold out is
    /// believed only when nothing is left in any segment, nor in flight between two.
    async fn apply_news(&self, settings: &Settings, news: &News) {
        match news {
            News::Available { activity, version } => {
                if let Some(activity) = settings.activities.lane_named(activity) {
                    self.state.clear_sold_out(&activity.lane, *version);
                }
            }
            News::SoldOut { activity, version } => {
                let Some(activity) = settings.activities.lane_named(activity) else {
                    return;
                };
                let ttl = settings.sold_out_cache.ttl;
                if activity.version != *version || self.state.is_sold_out(activity, ttl) {
                    return;
                }
                let left = segments::available_on_sale(&*self.store, activity).await;
                if matches!(left, Ok(Some(left)) if left <= 0) {
                    self.state
                        .sold_out
                        .mark_sold_out(&activity.lane, *version, ttl);
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl<S: LifecycleStore> NewsSink for Lifecycle<S> {
    async fn news(&self, news: News) {
        let settings = self.live.settings();
        self.apply_news(&settings, &news).await;
    }
}
