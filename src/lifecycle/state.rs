//! The lifecycle's hand on the sale state (`crate::sale`): what it learns from a reserve's
//! answer, a prewarm, news from another gateway or a reload is written here, and the gauges
//! `flashgate_stock_remaining` and `flashgate_activity_refused` are derived where the facts
//! change.

use super::{Lifecycle, LifecycleStore};
use crate::config::{Activity, Settings};
use crate::news::{self, News, NewsSink};
use crate::sale::SaleView;
use crate::stock::segments::{self, Refusal};
use std::sync::Arc;
use std::time::Duration;

impl<S: LifecycleStore> Lifecycle<S> {
    /// What this gateway knows of each activity's sale.
    pub fn state(&self) -> &SaleView {
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
            self.sale
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
        self.sale.stock_was_made();
    }

    pub fn refused(&self, activity: &Arc<str>, refusal: Option<Refusal>) {
        let before = self.state.refusal(activity);
        match (&before, &refusal) {
            (b, Some(r)) if b.as_ref() != Some(r) => {
                tracing::error!(activity = %activity, refusal = %r, "not on sale");
            }
            (Some(_), None) => {
                tracing::info!(activity = %activity, "configuration accepted again: on sale");
            }
            _ => {}
        }
        self.sale.set_refusal(activity, refusal);
        let id = activity.split('~').next().unwrap_or(activity);
        self.metrics
            .activity_refused
            .with_label_values(&[id])
            .set(i64::from(self.state.any_lane_refused(id)));
    }

    /// A new configuration: refusals were Redis's verdict on the old one; the next prewarm (or
    /// buyer) asks again about the new one.
    pub fn reloaded(&self) {
        self.sale.forget_refusals();
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
                    self.sale.clear_sold_out(&activity.lane, *version);
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
                    self.sale.mark_sold_out(&activity.lane, *version, ttl);
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
