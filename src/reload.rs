//! Live reload: the configuration file is read again on SIGHUP, when its content changes
//! (polled every `server.reload_watch_interval_ms`), or on `POST /v1/config/reload`.
//!
//! A file that does not validate, or that would change a running sale unsafely (a version
//! lowered, a version's stock or segments changed without raising it), is refused: the running
//! configuration stays, the error names the key, `flashgate_config_reloads_total{result="error"}`
//! counts it. Keys bound at start-up (listeners, threads, Redis connection, intervals) are kept
//! as they are and named in a warning: they need a restart.
//!
//! Approximations: a file caught half-written by the poll is refused and applied once complete
//! (counted as one error); removing an activity stops this instance sweeping its expired
//! reservations (remove an activity once its holds have run out).

use crate::config::transition::{judge, Recorded};
use crate::config::{ConfigError, Settings};
use crate::lifecycle::Lifecycle;
use crate::live::{Generation, Live};
use crate::metrics::Metrics;
use crate::series::{reconfigured_series, ReloadResult};
use crate::upstream::Upstreams;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The file a gateway was started from, with the text it was started with.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub text: String,
}

impl ConfigSource {
    /// Reads and validates a configuration file, keeping its text for change detection.
    pub fn load(path: &Path) -> Result<(Settings, ConfigSource), ConfigError> {
        let text = crate::config::read(path)?;
        let settings = Settings::from_file_text(path, &text)?;
        let source = ConfigSource {
            path: path.to_owned(),
            text,
        };
        Ok((settings, source))
    }
}

/// What a successful reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The generation now running.
    pub generation: u64,
    /// Changed keys that keep their running value until a restart.
    pub needs_restart: Vec<&'static str>,
    /// What the SRE should know about the applied file: a queue start moved earlier after the
    /// queue opened (the start that stays is named), one file older than the applied one.
    pub warnings: Vec<String>,
}

/// What a reload changes, handed over by the composition root (`crate::gateway`).
pub struct ReloadParts {
    pub live: Live,
    pub metrics: Arc<Metrics>,
    pub lifecycle: Arc<Lifecycle>,
    pub upstreams: Arc<Upstreams>,
    /// Read for the warnings of the answer (a queue's start as Redis has it).
    pub store: Arc<crate::stock::StockStore>,
    /// Told of the reload: it writes each queue's configured start.
    pub waiting: Arc<crate::waiting::WaitingRoom>,
}

impl ReloadParts {
    /// Makes `settings` the running configuration (checked by the caller) and returns its
    /// generation number. Requests in flight finish under the generation they started with.
    pub async fn apply(&self, settings: Settings) -> u64 {
        let current = self.live.current();
        let settings = Arc::new(settings);
        self.lifecycle.reloaded();
        if settings.upstream.addresses != current.settings.upstream.addresses {
            // Health-checked: the new addresses, and the old ones for requests still in
            // flight under the previous generation (each request picks from its own list).
            self.upstreams
                .set_addresses(
                    &settings.upstream.addresses,
                    &current.settings.upstream.addresses,
                )
                .await;
        }
        let next = Generation::build(settings, Some(&current));
        let number = next.number;
        // Between passes: a maintenance tick that read the old activities has written its
        // gauges, and the next one reads the new, so a removed activity's series stay gone.
        self.live
            .switch(next, |before, after| {
                reconfigured_series(
                    &self.metrics,
                    &before.settings.activities,
                    &after.settings.activities,
                )
            })
            .await;
        self.metrics.config_generation.set(number as i64);
        self.waiting.reloaded();
        // After the publish, so that the prewarm reads the new configuration.
        self.lifecycle.prewarm_soon();
        number
    }
}

/// Reloads one gateway from its file, one reload at a time.
pub struct Reloader {
    gw: ReloadParts,
    path: PathBuf,
    /// The text last tried (applied or refused), so the watcher reacts to changes only.
    last_text: tokio::sync::Mutex<String>,
}

impl Reloader {
    pub fn new(parts: ReloadParts, source: ConfigSource) -> Reloader {
        Reloader {
            gw: parts,
            path: source.path,
            last_text: tokio::sync::Mutex::new(source.text),
        }
    }

    /// Reads the file and applies it, or refuses it and keeps the running configuration.
    pub async fn reload(&self) -> Result<Applied, ConfigError> {
        let mut last = self.last_text.lock().await;
        let outcome = self.read_and_apply(&mut last).await;
        self.record(&outcome);
        outcome
    }

    /// Reloads only if the file's content differs from the text last tried.
    async fn reload_if_changed(&self) {
        let mut last = self.last_text.lock().await;
        match crate::config::read(&self.path) {
            Ok(text) if text == *last => {}
            // A missing file mid-rename, for example: try again next tick.
            Err(_) => {}
            Ok(_) => {
                let outcome = self.read_and_apply(&mut last).await;
                self.record(&outcome);
            }
        }
    }

    async fn read_and_apply(&self, last: &mut String) -> Result<Applied, ConfigError> {
        let text = crate::config::read(&self.path)?;
        *last = text.clone();
        let next = Settings::from_file_text(&self.path, &text)?;
        let current = self.gw.live.settings();
        check_transition(&current, &next)?;
        let needs_restart = restart_only_changes(&current, &next);
        let warnings = self.start_warnings(&next).await;
        let generation = self.gw.apply(next).await;
        Ok(Applied {
            generation,
            needs_restart,
            warnings,
        })
    }

    /// The queues whose start the file moves and Redis will not follow (read before the apply:
    /// a start moved earlier is written by the next state read if the queue has not opened).
    /// Redis not answering: nothing said here (the next reload or `check --live` says it).
    async fn start_warnings(&self, next: &Settings) -> Vec<String> {
        // Every queue: a reload writes each one's start (see `WaitingRoom::reloaded`).
        let moved = next.activities.iter().filter(|a| a.queue.is_some());
        let asker = crate::waiting::start::Asker::Reload;
        match crate::waiting::start::notes(&self.gw.store, moved.map(|a| &**a), asker).await {
            Ok(notes) => notes.iter().map(ToString::to_string).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "queue starts not read for the reload's warnings");
                Vec::new()
            }
        }
    }

    fn record(&self, outcome: &Result<Applied, ConfigError>) {
        let result = match outcome {
            Ok(applied) => {
                for warning in &applied.warnings {
                    tracing::warn!(generation = applied.generation, "{warning}");
                }
                if applied.needs_restart.is_empty() {
                    tracing::info!(generation = applied.generation, path = %self.path.display(),
                        "configuration reloaded");
                } else {
                    tracing::warn!(generation = applied.generation, path = %self.path.display(),
                        needs_restart = ?applied.needs_restart,
                        "configuration reloaded; these keys keep their running value until a restart");
                }
                ReloadResult::Applied
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e,
                    "configuration reload refused; the running configuration stays");
                ReloadResult::Refused
            }
        };
        self.gw
            .metrics
            .config_reloads
            .with_label_values(&[result.as_str()])
            .inc();
    }
}

/// Refuses changes that would break a running sale, judged against the running configuration
/// by [`judge`] (which `flashgate check --live` uses against Redis's record). Redis enforces
/// the same on every instance, whatever YAML it runs: see `claim.lua`.
pub fn check_transition(current: &Settings, next: &Settings) -> Result<(), ConfigError> {
    for new in next.activities.iter() {
        match current.activities.get(&new.id) {
            Some(old) if new.has_variants() || old.has_variants() => {
                crate::config::transition::judge_variants(new, old)?
            }
            Some(old) => judge(new, &Recorded::of(old))?,
            None => {}
        }
    }
    Ok(())
}

/// Keys whose new value is not applied by a reload (bound at start-up).
pub fn restart_only_changes(current: &Settings, next: &Settings) -> Vec<&'static str> {
    let (a, b) = (current, next);
    [
        ("server.listen", a.server.listen != b.server.listen),
        ("server.threads", a.server.threads != b.server.threads),
        (
            "server.grace_period_secs",
            a.server.grace_period != b.server.grace_period,
        ),
        (
            "server.shutdown_timeout_secs",
            a.server.shutdown_timeout != b.server.shutdown_timeout,
        ),
        (
            "server.reload_watch_interval_ms",
            a.server.reload_watch_interval != b.server.reload_watch_interval,
        ),
        (
            "server.upgrade_sock",
            a.server.upgrade_sock != b.server.upgrade_sock,
        ),
        ("admin.listen", a.admin.listen != b.admin.listen),
        (
            // The answers' CORS headers are added by a module installed at start-up.
            "server.cors.allowed_origins",
            a.server.cors.allowed_origins.is_empty() && !b.server.cors.allowed_origins.is_empty(),
        ),
        ("redis", a.redis != b.redis),
        (
            "upstream.health_check_interval_ms",
            a.upstream.health_check_interval != b.upstream.health_check_interval,
        ),
        (
            "rate_limits.evict_interval_ms",
            a.rate_limits.evict_interval != b.rate_limits.evict_interval,
        ),
    ]
    .into_iter()
    .filter_map(|(key, changed)| changed.then_some(key))
    .collect()
}

/// Reloads on SIGHUP and when the file changes, until shutdown.
pub struct ReloadWatcher {
    reloader: Arc<Reloader>,
    poll_every: Option<Duration>,
}

impl ReloadWatcher {
    pub fn new(reloader: Arc<Reloader>, poll_every: Option<Duration>) -> Self {
        ReloadWatcher {
            reloader,
            poll_every,
        }
    }
}

#[async_trait]
impl BackgroundService for ReloadWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; reload by file change or admin API");
                return;
            }
        };
        let mut poll = self.poll_every.map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            let polled = async {
                match poll.as_mut() {
                    Some(t) => t.tick().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = hangup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let _ = self.reloader.reload().await;
                }
                _ = polled => self.reloader.reload_if_changed().await,
            }
        }
    }
}
