//! Periodic work off the request path: stock prewarm (and the stock gauge), and eviction of idle
//! rate-limit buckets.

use crate::config::SaleWindow;
use crate::gateway::Gateway;
use async_trait::async_trait;
use chrono::Utc;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use tokio::time::{interval, MissedTickBehavior};

pub struct Maintenance {
    gw: Arc<Gateway>,
}

impl Maintenance {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Maintenance { gw }
    }

    /// Makes sure every activity that has not ended has its current stock key (SET NX: creating,
    /// never resetting), loads the scripts, and refreshes `flashgate_stock_remaining`.
    ///
    /// A key created after the sale started means Redis lost it (a restart without persistence,
    /// a flush): the stock starts again from the YAML, which can sell units twice. That is logged
    /// as an error; run Redis with `appendonly yes` and `appendfsync always` for exact stock.
    pub async fn prewarm_all(&self) {
        let gw = &self.gw;
        if let Err(e) = gw.store.ready().await {
            tracing::warn!(error = %e, "stock store not ready; prewarm postponed");
            return;
        }
        for activity in gw.settings.activities.iter() {
            let window = activity.window_at(Utc::now());
            if window == SaleWindow::Ended {
                continue;
            }
            match gw.store.prewarm(activity).await {
                Ok(true) => {
                    gw.admission.forget_sold_out(activity);
                    if window == SaleWindow::Open {
                        tracing::error!(activity = %activity.id, version = activity.version,
                            "stock key created after the sale started: Redis lost it, stock restarts from the configuration");
                    } else {
                        tracing::info!(activity = %activity.id, version = activity.version,
                            stock = activity.stock, "stock prewarmed");
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(activity = %activity.id, error = %e, "prewarm failed");
                    continue;
                }
            }
            if let Ok(Some(left)) = gw.store.remaining(activity).await {
                gw.metrics
                    .stock_remaining
                    .with_label_values(&[&activity.id])
                    .set(left);
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Maintenance {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let settings = &self.gw.settings;
        let mut prewarm = interval(settings.redis.prewarm_interval);
        prewarm.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut evict = interval(settings.rate_limits.evict_interval);
        evict.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = prewarm.tick() => self.prewarm_all().await,
                _ = evict.tick() => {
                    self.gw.admission.evict_idle_buckets();
                }
            }
        }
    }
}
