//! The stock store: Redis, spoken to only through the Lua scripts in `lua/` and a few O(1)
//! commands. It owns the key layout, the scripts, timeouts and the store's metrics.
//!
//! What happens when Redis is down or slow: every call is bounded by `redis.timeout_ms`, and any
//! error or timeout is reported to the caller, which answers `unavailable` (503). Nothing is
//! retried on the buyer's time, and nothing is ever admitted without a successful reserve, so a
//! sick Redis costs availability, never stock. The connection manager reconnects in the
//! background; the gateway recovers without a restart.
//!
//! A reserve that times out may still have run in Redis. Because reservation ids are made by the
//! gateway, [`StockStore::abandon`] releases that id afterwards, writing a tombstone when the
//! reserve has not landed yet so that it can never land later: such units are never stranded.

mod keys;

pub use keys::KeyLayout;

use crate::config::{Activity, RedisSettings};
use crate::metrics::{Metrics, ReleaseReason, ScriptName, StoreOp};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static RESERVE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/reserve.lua")));
static RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/release.lua")));

/// How long a release tombstone for an abandoned reservation id is kept.
const TOMBSTONE_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("stock store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("stock store error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected reply from the {script} script: {reply:?}")]
    Protocol {
        script: &'static str,
        reply: Vec<i64>,
    },
}

/// What the reserve script decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveOutcome {
    Reserved {
        remaining: u64,
    },
    /// The stock key of this version does not exist (not prewarmed, or lost).
    NoStockKey,
    Insufficient {
        remaining: u64,
    },
    LimitExceeded {
        held: u64,
    },
    /// The reservation id exists already (a tombstone of an abandoned attempt).
    DuplicateId,
}

/// What the release script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Units returned; `remaining` is `None` when the version's stock key no longer exists (units
    /// are then not added anywhere: stock is never created from nothing).
    Released {
        remaining: Option<u64>,
    },
    AlreadyReleased,
    Unknown,
    VersionMismatch,
}

/// One reserve call's inputs.
#[derive(Debug, Clone, Copy)]
pub struct ReserveRequest<'a> {
    pub activity: &'a Activity,
    pub user: &'a str,
    pub qty: u32,
    pub reservation_id: &'a str,
}

pub struct StockStore {
    conn: ConnectionManager,
    timeout: Duration,
    keys: KeyLayout,
    key_ttl_after_end: Duration,
    metrics: Arc<Metrics>,
}

impl StockStore {
    /// Creates the store without connecting: the first call connects, and a Redis that is down at
    /// start-up only makes the gateway unready. Must be called inside a Tokio runtime that
    /// outlives the store (the connection's background tasks run there).
    pub fn new(settings: &RedisSettings, metrics: Arc<Metrics>) -> Result<StockStore, StoreError> {
        let client = redis::Client::open(settings.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(StockStore {
            conn,
            timeout: settings.timeout,
            keys: KeyLayout::new(&settings.key_prefix),
            key_ttl_after_end: settings.key_ttl_after_end,
            metrics,
        })
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    /// Runs `fut` within the store's time budget, counting failures.
    async fn bounded<T>(
        &self,
        op: StoreOp,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        if result.is_err() {
            self.metrics
                .redis_errors
                .with_label_values(&[op.as_str()])
                .inc();
        }
        result
    }

    /// Atomically checks the per-user limit and the stock, deducts, and records the reservation.
    pub async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        let act = req.activity;
        let mut conn = self.conn.clone();
        let mut invocation = RESERVE_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.stock(&act.id, act.version))
            .key(self.keys.user_units(&act.id))
            .key(self.keys.reservation(&act.id, req.reservation_id))
            .arg(req.user)
            .arg(req.qty)
            .arg(act.per_user_limit.get())
            .arg(act.version)
            .arg(unix_ms())
            .arg(self.expire_at(act));
        let started = Instant::now();
        let reply = self
            .bounded(StoreOp::Reserve, async {
                Ok(invocation.invoke_async::<Vec<i64>>(&mut conn).await?)
            })
            .await;
        self.observe(ScriptName::Reserve, started);
        let reply = reply?;
        let at = |i: usize| reply.get(i).copied().map(|v| v.max(0) as u64);
        match (reply.first().copied(), at(1), at(2)) {
            (Some(1), Some(remaining), Some(_)) => Ok(ReserveOutcome::Reserved { remaining }),
            (Some(-1), _, _) => Ok(ReserveOutcome::NoStockKey),
            (Some(-2), Some(remaining), _) => Ok(ReserveOutcome::Insufficient { remaining }),
            (Some(-3), _, Some(held)) => Ok(ReserveOutcome::LimitExceeded { held }),
            (Some(-4), _, _) => Ok(ReserveOutcome::DuplicateId),
            _ => Err(StoreError::Protocol {
                script: ScriptName::Reserve.as_str(),
                reply,
            }),
        }
    }

    /// Gives a reservation's units back to its version's stock and its user, exactly once.
    pub async fn release(
        &self,
        activity: &Activity,
        version: u64,
        reservation_id: &str,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.release_inner(activity, version, reservation_id, reason, false)
            .await
    }

    /// Releases a reservation id whose reserve call had an unknown outcome (timed out). If the
    /// reserve has not landed, a tombstone makes sure it never will.
    pub async fn abandon(
        &self,
        activity: &Activity,
        reservation_id: &str,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.release_inner(
            activity,
            activity.version,
            reservation_id,
            ReleaseReason::StoreTimeout,
            true,
        )
        .await
    }

    async fn release_inner(
        &self,
        activity: &Activity,
        version: u64,
        reservation_id: &str,
        reason: ReleaseReason,
        tombstone: bool,
    ) -> Result<ReleaseOutcome, StoreError> {
        let mut conn = self.conn.clone();
        let tombstone_until = if tombstone {
            unix_secs(SystemTime::now() + TOMBSTONE_TTL)
        } else {
            0
        };
        let mut invocation = RELEASE_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.reservation(&activity.id, reservation_id))
            .key(self.keys.user_units(&activity.id))
            .key(self.keys.stock(&activity.id, version))
            .arg(version)
            .arg(unix_ms())
            .arg(reason.as_str())
            .arg(tombstone_until);
        let started = Instant::now();
        let reply = self
            .bounded(StoreOp::Release, async {
                Ok(invocation.invoke_async::<Vec<i64>>(&mut conn).await?)
            })
            .await;
        self.observe(ScriptName::Release, started);
        let reply = reply?;
        match (reply.first().copied(), reply.get(1).copied()) {
            (Some(1), Some(remaining)) => Ok(ReleaseOutcome::Released {
                remaining: u64::try_from(remaining).ok(),
            }),
            (Some(0), _) => Ok(ReleaseOutcome::AlreadyReleased),
            (Some(-1), _) => Ok(ReleaseOutcome::Unknown),
            (Some(-2), _) => Ok(ReleaseOutcome::VersionMismatch),
            _ => Err(StoreError::Protocol {
                script: ScriptName::Release.as_str(),
                reply,
            }),
        }
    }

    /// Creates the activity's current stock key from the configured stock if it does not exist
    /// (SET NX), expiring `key_ttl_after_end` after the sale ends. Returns whether it created it.
    /// Never overwrites: a restart or a second instance cannot reset stock already sold.
    pub async fn prewarm(&self, activity: &Activity) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.keys.stock(&activity.id, activity.version);
        let created: Option<String> = self
            .bounded(StoreOp::Prewarm, async {
                Ok(redis::cmd("SET")
                    .arg(&key)
                    .arg(activity.stock)
                    .arg("NX")
                    .arg("EXAT")
                    .arg(self.expire_at(activity))
                    .query_async(&mut conn)
                    .await?)
            })
            .await?;
        let created = created.is_some();
        if created {
            self.metrics
                .stock_keys_created
                .with_label_values(&[&activity.id])
                .inc();
        }
        Ok(created)
    }

    /// Units remaining in the activity's current version; `None` if its key does not exist.
    pub async fn remaining(&self, activity: &Activity) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.keys.stock(&activity.id, activity.version);
        self.bounded(StoreOp::Read, async {
            Ok(redis::cmd("GET").arg(&key).query_async(&mut conn).await?)
        })
        .await
    }

    /// Whether the store answers and both scripts are loaded (loading them if not).
    pub async fn ready(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        self.bounded(StoreOp::Ready, async {
            let scripts = [&*RESERVE_SCRIPT, &*RELEASE_SCRIPT];
            let loaded: Vec<bool> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(scripts.map(|s| s.get_hash()).as_slice())
                .query_async(&mut conn)
                .await?;
            for (script, loaded) in scripts.iter().zip(loaded) {
                if !loaded {
                    script.load_async(&mut conn).await?;
                }
            }
            Ok(())
        })
        .await
    }

    fn observe(&self, script: ScriptName, started: Instant) {
        self.metrics
            .script_duration
            .with_label_values(&[script.as_str()])
            .observe(started.elapsed().as_secs_f64());
    }

    /// When an activity's keys expire: `ends_at` plus the configured retention.
    fn expire_at(&self, activity: &Activity) -> u64 {
        let end = u64::try_from(activity.ends_at.timestamp()).unwrap_or(0);
        end + self.key_ttl_after_end.as_secs()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
