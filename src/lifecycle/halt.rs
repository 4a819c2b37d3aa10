//! Halt and resume: an activity's fleet-wide stop (`POST /v1/activities/{act}/halt` and
//! `/resume`). The halt lives in Redis (`<p>:{<act>}:halt`, see `lua/halt.lua`); every gateway
//! reads it every [`POLL_INTERVAL`] and, while it holds, answers the activity's sale requests
//! `unavailable` (503, `Retry-After`) before any bucket or reserve: nothing is taken. The
//! gateway that takes the admin call learns it at once; the waiting room's cursor stands from
//! the halt's instant, in Redis, so waiting buyers read `paused`.
//!
//! The bound: a gateway obeys a halt at most [`POLL_INTERVAL`] plus one read (bounded by
//! `redis.timeout_ms`) after the halt's 200, so 100 ms + 50 ms by default, well inside the
//! contract's 500 ms (measured in `tests/e2e/halt.rs`). The poll is its own task, so the
//! maintenance loop's slower work (a sweep waiting on order lookups) never delays it. A gateway
//! reads every halt once before its proxy serves (`crate::server`), and until every one was
//! read it is not ready (`/readyz`) and sells nothing (the gate answers `unavailable`: traffic
//! may reach a process before readiness, after an upgrade's hand-over say).
//!
//! Approximations: the halt is the gateways' gate, not the reserve script's: a reserve that
//! left a gateway before the gateway learned the halt (within the bound above) may still land.
//! A gateway that cannot read the halt key keeps what it last read (it can hardly reserve
//! either then). A halt lasts until resumed, or until the sale's keys expire (its end plus the
//! retention, moved later with the end, never sooner than the retention from the halt).

use super::{Lifecycle, LifecycleStore};
use crate::config::{Activity, Settings};
use crate::stock::{Halt, StockStore, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How often every gateway reads each activity's halt.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

impl<S: LifecycleStore> Lifecycle<S> {
    /// What Redis said of an activity's halt: kept (the gate reads it), told once per change,
    /// and shown in `flashgate_activity_halted`.
    pub fn learned_halt(&self, activity: &Arc<str>, halt: Halt) {
        if self.sale.set_halt(activity, halt) {
            match halt {
                Halt::Since(since) => {
                    tracing::warn!(activity = %activity, since_ms = since, "halted: not selling until resumed")
                }
                Halt::Running => tracing::info!(activity = %activity, "resumed: on sale again"),
            }
        }
        self.metrics
            .activity_halted
            .with_label_values(&[activity])
            .set(i64::from(halt.is_halted()));
    }
}

impl Lifecycle<StockStore> {
    /// Halts (`halt`) or resumes the activity for the whole fleet, and learns it here at once.
    pub async fn set_halt(&self, activity: &Activity, halt: bool) -> Result<Halt, StoreError> {
        let now = self.store.set_halt(activity, halt).await?;
        self.learned_halt(&activity.id, now);
        Ok(now)
    }

    /// Halts the activity for a fence found on it (only if it is not halted: an operator's
    /// halt stays the operator's), or lifts the halt a fence made (`!halt`; never an
    /// operator's). See `lua/halt.lua`.
    pub async fn set_fence_halt(
        &self,
        activity: &Activity,
        halt: bool,
    ) -> Result<Halt, StoreError> {
        let now = self.store.set_fence_halt(activity, halt).await?;
        self.learned_halt(&activity.id, now);
        Ok(now)
    }

    /// Reads every configured activity's halt (one script call each, at once).
    pub async fn refresh_halts(&self, settings: &Settings) {
        let reads = settings
            .activities
            .iter()
            .map(|activity| async move { (activity, self.store.halted(activity).await) });
        let mut all = true;
        for (activity, read) in futures_util::future::join_all(reads).await {
            match read {
                Ok(halt) => self.learned_halt(&activity.id, halt),
                Err(e) => {
                    all = false;
                    tracing::debug!(activity = %activity.id, error = %e, "halt not read");
                }
            }
        }
        if all {
            self.sale.halts_were_read();
        }
    }

    /// Reads the halts every [`POLL_INTERVAL`] until `shutdown` says stop.
    pub async fn watch_halts(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                // A pass: a reload's switch waits for it, so the gauge of an activity it
                // removed is not written back after the switch.
                _ = tick.tick() => {
                    let _pass = self.live.pass().await;
                    self.refresh_halts(&self.live.settings()).await
                }
            }
        }
    }
}
