//! Periodic work off the request path: stock prewarm (and the stock gauge), expiry of pending
//! reservations, the ledger check, sold-out news, the fleet-wide halts, the Redis masters' check
//! (the failover fence), the fleet's roll, and eviction of idle rate-limit buckets; on
//! shutdown it hands over to [`crate::shutdown`].

use crate::config::{Activity, SaleWindow};
use crate::lifecycle::Lifecycle;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::shutdown::Drain;
use crate::stock::segments::{self, Prewarmed, Refusal};
use crate::stock::StockStore;
use crate::waiting::WaitingRoom;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{interval, Interval, MissedTickBehavior};

pub struct Maintenance {
    gw: MaintenanceParts,
    /// Whether the eviction policy was reported yet.
    checked_policy: std::sync::atomic::AtomicBool,
}

/// What the background loops work with, handed over by the composition root
/// (`crate::gateway`).
pub struct MaintenanceParts {
    pub live: Live,
    pub metrics: Arc<Metrics>,
    pub store: Arc<StockStore>,
    pub lifecycle: Arc<Lifecycle>,
    pub waiting: Arc<WaitingRoom>,
    /// The shutdown drain, run when the loops are told to stop.
    pub drain: Arc<Drain>,
    /// The fleet's roll, written by this process's beat.
    pub roster: Arc<crate::fleet::Roster>,
}

impl MaintenanceParts {
    /// The current settings.
    fn settings(&self) -> Arc<crate::config::Settings> {
        self.live.settings()
    }
}

impl Maintenance {
    pub fn new(parts: MaintenanceParts) -> Self {
        Maintenance {
            gw: parts,
            checked_policy: Default::default(),
        }
    }

    /// Makes sure every activity that has not ended has its current stock version on sale in
    /// every segment (created once, never reset), keeps every key alive until the sale's end plus
    /// the retention, loads the scripts, refreshes `flashgate_stock_remaining`, and learns which
    /// activities Redis's record refuses.
    ///
    /// A version this process saw on sale is never created again (`stock::failover`): keys of
    /// it gone (a restart without persistence, a flush, an eviction) mark it lost, and it sells
    /// again only after an operator's recount. A process that starts after the loss, with no
    /// other gateway running that saw it, cannot tell.
    pub async fn prewarm_all(&self) {
        let gw = &self.gw;
        if let Err(e) = gw.store.ready().await {
            tracing::warn!(error = %e, "stock store not ready; prewarm postponed");
            return;
        }
        let evicting = self.check_eviction_policy().await;
        if let Err(e) = gw.store.read_clock().await {
            tracing::warn!(error = %e, "Redis's clock not read");
        }
        // Each stock lane: an activity, or each variant of one.
        for activity in gw.settings().activities.lanes() {
            let window = activity.window_at(gw.store.clock().now());
            if window == SaleWindow::Ended {
                continue;
            }
            if let Some(policy) = &evicting {
                let refusal = Refusal::MayEvict {
                    id: activity.id.to_string(),
                    policy: policy.clone(),
                };
                gw.lifecycle.refused(&activity.lane, Some(refusal));
                continue;
            }
            let prewarmed = match segments::prewarm(&gw.store, activity).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(activity = %activity.id, variant = activity.variant.as_deref(), error = %e, "prewarm failed");
                    continue;
                }
            };
            match prewarmed {
                Err(refusal) => gw.lifecycle.refused(&activity.lane, Some(refusal)),
                Ok(report) => {
                    gw.lifecycle.refused(&activity.lane, None);
                    self.report(activity, window, &report);
                }
            }
        }
        // Once a pass ran, whatever each activity's answer: one activity's error must not keep
        // the gateway unready for the others (that activity's buyers get `unavailable`).
        gw.lifecycle.prewarmed_every_lane();
    }

    /// Checks every activity's Redis masters against the ones its stock was accepted under (the
    /// failover fence, `stock::failover`): the gauge, the admin view and the local refusal.
    /// An activity with variants is fenced when any of its lanes is (they share its halt).
    async fn check_masters(&self) {
        let gw = &self.gw;
        let settings = gw.settings();
        for activity in settings.activities.iter() {
            if activity.window_at(gw.store.clock().now()) == SaleWindow::Ended {
                continue;
            }
            match self
                .fenced_lane(settings.activities.lanes_of(&activity.id))
                .await
            {
                Ok(Some(lane)) => self.halt_fenced(lane).await,
                Ok(None) => self.unhalt_unfenced(activity).await,
                Err(e) => {
                    tracing::warn!(activity = %activity.id, error = %e, "Redis master not checked")
                }
            }
        }
    }

    /// The first of `lanes` that is fenced, if any (every lane is checked: each check feeds its
    /// own gauge, view and local refusal).
    async fn fenced_lane<'a>(
        &self,
        lanes: impl Iterator<Item = &'a std::sync::Arc<Activity>>,
    ) -> Result<Option<&'a Activity>, crate::stock::StoreError> {
        let mut fenced = None;
        for lane in lanes {
            if self.gw.store.check_master(lane).await?.fence.is_some() && fenced.is_none() {
                fenced = Some(&**lane);
            }
        }
        Ok(fenced)
    }

    /// A fenced activity is halted (unless it is already): its waiting room's cursor stands
    /// as for an operator's halt, instead of admitting buyers who can only be told
    /// `unavailable` until their windows lapse; the resume (accept, then lift the halt) lifts
    /// both. The fence may have been accepted between the check and this halt (a resume on
    /// another gateway): the master is checked again after the halt, and the halt lifted if
    /// the fence is gone. Approximation: an operator's halt made in that instant (after a
    /// resume, before the check again) is lifted with it.
    async fn halt_fenced(&self, activity: &Activity) {
        let gw = &self.gw;
        if gw.lifecycle.state().halted_since(&activity.id).is_some() {
            return;
        }
        let halted = async {
            gw.lifecycle.set_fence_halt(activity, true).await?;
            if gw.store.check_master(activity).await?.fence.is_none() {
                gw.lifecycle.set_fence_halt(activity, false).await?;
            }
            Ok::<_, crate::stock::StoreError>(())
        };
        if let Err(e) = halted.await {
            tracing::warn!(activity = %activity.id, error = %e, "a fenced activity not halted");
        }
    }

    /// An activity no longer fenced (a rule lifted it, here or on another gateway, or an
    /// operator resumed it) that is still halted: the halt a fence made is lifted (an
    /// operator's halt is not: `lua/halt.lua` keeps it).
    async fn unhalt_unfenced(&self, activity: &Activity) {
        let gw = &self.gw;
        if gw.lifecycle.state().halted_since(&activity.id).is_none() {
            return;
        }
        if let Err(e) = gw.lifecycle.set_fence_halt(activity, false).await {
            tracing::warn!(activity = %activity.id, error = %e, "a fence's halt not lifted");
        }
    }

    /// Says (once per change, and in `flashgate_redis_may_evict`) when Redis may evict keys.
    /// Returns the policy when nothing may be sold on it (it may evict, and
    /// `redis.allow_eviction` does not take the risk). A Redis that hides its policy (CONFIG
    /// refused) is sold on, with a warning: nothing tells.
    async fn check_eviction_policy(&self) -> Option<String> {
        let gw = &self.gw;
        let Ok(policy) = gw.store.eviction_policy().await else {
            return None;
        };
        let may_evict = match policy.as_deref() {
            Some("noeviction") => 0,
            Some(_) => 1,
            None => -1,
        };
        if gw.metrics.redis_may_evict.get() != may_evict
            || !self
                .checked_policy
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            match policy.as_deref() {
                Some("noeviction") => {}
                Some(p) => tracing::error!(policy = p,
                    "Redis's maxmemory-policy may evict flashgate's keys, and a lost key can sell units twice: set maxmemory-policy noeviction"),
                None => tracing::warn!("cannot read Redis's maxmemory-policy (CONFIG GET refused); it must be noeviction"),
            }
        }
        gw.metrics.redis_may_evict.set(may_evict);
        policy.filter(|p| p != "noeviction" && !gw.settings().redis.allow_eviction)
    }

    /// Says what prewarming one activity did.
    fn report(&self, activity: &Activity, window: SaleWindow, report: &Prewarmed) {
        let gw = &self.gw;
        if let Some(left) = report.remaining {
            gw.lifecycle
                .units_left(&activity.id, activity.variant.as_deref(), left);
        }
        if report.created > 0 {
            gw.metrics
                .stock_keys_created
                .with_label_values(&[&activity.id])
                .inc_by(u64::from(report.created));
            // No sold-out mark to clear: any mark on this version was set after a reserve saw
            // the key this call created (clearing it here would race with that reserve).
            tracing::info!(activity = %activity.id, variant = activity.variant.as_deref(),
                version = activity.version, stock = activity.stock,
                open = (window == SaleWindow::Open), "stock prewarmed");
        }
        for segment in &report.stock_key_removed {
            tracing::error!(activity = %activity.id, variant = activity.variant.as_deref(),
                version = activity.version, segment, "stock key is gone but the version is on sale there: not re-created; raise the version to restock");
        }
    }
}

impl Maintenance {
    /// Runs one tick's work as a pass of the current generation: a reload waits for it, so
    /// what it writes of the activities it read (gauges) lands before the switch.
    async fn pass(&self, work: impl std::future::Future<Output = ()>) {
        let _pass = self.gw.live.pass().await;
        work.await
    }
}

fn ticker(period: Duration) -> Interval {
    let mut t = interval(period);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

#[async_trait]
impl BackgroundService for Maintenance {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let settings = self.gw.settings();
        let mut prewarm = ticker(settings.redis.prewarm_interval);
        let mut sweep = ticker(settings.redis.sweep_interval);
        let mut reconcile = ticker(settings.redis.reconcile_interval);
        let mut evict = ticker(settings.rate_limits.evict_interval);
        let mut queues = ticker(crate::waiting::REFRESH_INTERVAL);
        let mut masters = ticker(crate::stock::failover::CHECK_INTERVAL);
        let mut lines = ticker(crate::waiting::line::ADVANCE_INTERVAL);
        tokio::spawn(crate::news::listen(
            self.gw.store.clone(),
            self.gw.lifecycle.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(self.gw.lifecycle.clone().watch_halts(shutdown.clone()));
        let live = self.gw.live.clone();
        tokio::spawn(crate::fleet::beat_forever(
            self.gw.roster.clone(),
            self.gw.store.clone(),
            move || {
                let generation = live.current();
                let s = &generation.settings;
                (s.admin.listen, s.server.listen, generation.number)
            },
            shutdown.clone(),
        ));
        {
            let (store, settings) = (self.gw.store.clone(), self.gw.settings());
            tokio::spawn(
                async move { crate::waiting::start::tell_at_start(&store, &settings).await },
            );
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    self.gw.drain.drain(&self.gw.settings()).await;
                    return;
                }
                _ = prewarm.tick() => self.pass(self.prewarm_all()).await,
                _ = self.gw.lifecycle.prewarm_requested() => self.pass(self.prewarm_all()).await,
                _ = sweep.tick() => self.pass(async { self.gw.lifecycle.sweep_expired().await; }).await,
                _ = reconcile.tick() => self.pass(self.gw.lifecycle.check_drift()).await,
                _ = queues.tick() => self.pass(async { self.gw.waiting.refresh(&self.gw.settings()).await }).await,
                _ = masters.tick() => self.pass(self.check_masters()).await,
                _ = lines.tick() => {
                    let settings = self.gw.settings();
                    self.pass(self.gw.waiting.advance_lines(&settings)).await
                }
                _ = evict.tick() => {
                    let remaining = self.gw.live.current().policy.evict_idle_buckets();
                    self.gw.metrics.rate_limiter_keys.set(remaining as i64);
                }
            }
        }
    }
}
