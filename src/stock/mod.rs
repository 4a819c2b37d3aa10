//! The stock store: Redis, spoken to only through the Lua scripts in `lua/` and a few O(1)
//! reads. It owns the key layout, the scripts, timeouts and the store's metrics.
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

pub mod breaker;
mod keys;
mod records;

pub use keys::KeyLayout;
pub use records::*;

use crate::config::{Activity, RedisSettings};
use crate::metrics::{Metrics, ReleaseReason, ScriptName, StoreOp};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Script, ScriptInvocation, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const LIB: &str = include_str!("../../lua/lib.lua");

static RESERVE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/reserve.lua")));
static RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{LIB}\n{}", include_str!("../../lua/release.lua"))));
static CONFIRM_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/confirm.lua")));
static SWEEP_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{LIB}\n{}", include_str!("../../lua/sweep.lua"))));
static PREWARM_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/prewarm.lua")));
static LEDGER_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/ledger.lua")));
static WITHDRAW_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/withdraw.lua")));
static DEPOSIT_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/deposit.lua")));

fn all_scripts() -> [&'static Script; 8] {
    [
        &RESERVE_SCRIPT,
        &RELEASE_SCRIPT,
        &CONFIRM_SCRIPT,
        &SWEEP_SCRIPT,
        &PREWARM_SCRIPT,
        &LEDGER_SCRIPT,
        &WITHDRAW_SCRIPT,
        &DEPOSIT_SCRIPT,
    ]
}

/// An outgoing transfer not yet acknowledged by its giving segment.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Transfer {
    #[serde(skip)]
    pub id: String,
    /// The receiving segment's id.
    pub to: String,
    pub qty: u64,
    /// When it was withdrawn (unix ms).
    pub ts: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("stock store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("stock store error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected reply from the {script} script: {reply}")]
    Protocol { script: &'static str, reply: String },
}

impl StoreError {
    /// Whether the call may have run in Redis although it failed here: our time budget or
    /// redis-rs's own response timeout ran out, the connection dropped after sending, or a
    /// reply came that we could not read. Only a refused connection surely ran nothing.
    pub fn may_have_landed(&self) -> bool {
        match self {
            StoreError::Timeout(_) | StoreError::Protocol { .. } => true,
            StoreError::Redis(e) => !e.is_connection_refusal(),
        }
    }

    fn protocol(script: ScriptName, reply: impl std::fmt::Debug) -> Self {
        StoreError::Protocol {
            script: script.as_str(),
            reply: format!("{reply:?}"),
        }
    }
}

/// One reserve call's inputs.
#[derive(Debug, Clone, Copy)]
pub struct ReserveRequest<'a> {
    pub activity: &'a Activity,
    pub user: &'a str,
    pub qty: u32,
    pub reservation_id: &'a str,
    /// The buyer's `Idempotency-Key`, if any.
    pub idempotency_key: Option<&'a str>,
}

/// Distinguishes stores in one process (tests run several) in the per-thread connection cache.
static NEXT_STORE_ID: AtomicUsize = AtomicUsize::new(0);

/// A thread's connection to one store: made once, by the first caller, while later callers on the
/// same thread wait for it (a burst's first thousand requests must not each open a connection).
type ThreadConn = Arc<tokio::sync::OnceCell<StoreConn>>;

thread_local! {
    /// This thread's connection to each store, made on first use.
    static THREAD_CONNECTIONS: RefCell<HashMap<usize, ThreadConn>> = RefCell::new(HashMap::new());
}

/// A connection to a single Redis or to a Redis Cluster; scripts and commands run unchanged on
/// either (every key of a call shares one hash tag, so a cluster routes it to one node).
#[derive(Clone)]
enum StoreConn {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for StoreConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            StoreConn::Single(c) => c.req_packed_command(cmd),
            StoreConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            StoreConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            StoreConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            StoreConn::Single(c) => c.get_db(),
            StoreConn::Cluster(c) => c.get_db(),
        }
    }
}

pub struct StockStore {
    id: usize,
    /// The single Redis, or a cluster's first seed node (pub/sub).
    client: redis::Client,
    config: ConnectionManagerConfig,
    cluster: Option<redis::cluster::ClusterClient>,
    timeout: Duration,
    keys: KeyLayout,
    key_ttl_after_end: Duration,
    events_maxlen: u64,
    metrics: Arc<Metrics>,
}

impl StockStore {
    /// Creates the store without connecting: each thread's first call connects, and a Redis
    /// that is down at start-up only makes the gateway unready.
    pub fn new(settings: &RedisSettings, metrics: Arc<Metrics>) -> Result<StockStore, StoreError> {
        let client = redis::Client::open(settings.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let cluster = if settings.cluster_nodes.is_empty() {
            None
        } else {
            Some(
                redis::cluster::ClusterClient::builder(settings.cluster_nodes.clone())
                    .connection_timeout(settings.timeout)
                    .response_timeout(settings.timeout)
                    .build()?,
            )
        };
        Ok(StockStore {
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            client,
            config,
            cluster,
            timeout: settings.timeout,
            keys: KeyLayout::new(&settings.key_prefix),
            key_ttl_after_end: settings.key_ttl_after_end,
            events_maxlen: settings.events_maxlen,
            metrics,
        })
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    /// A client for connections of other kinds (pub/sub).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Tells every instance, off the caller's path; a lost message costs only cache freshness
    /// (see `news`).
    pub fn announce(self: &Arc<Self>, news: crate::news::News) {
        let store = self.clone();
        tokio::spawn(async move {
            let channel = store.keys.news_channel();
            let published: Result<i64, StoreError> = store
                .query(
                    StoreOp::Read,
                    redis::cmd("PUBLISH").arg(&channel).arg(news.encode()),
                )
                .await;
            if let Err(e) = published {
                tracing::debug!(error = %e, "sold-out news not published");
            }
        });
    }

    /// This thread's multiplexed connection, made on first use on the runtime the thread runs.
    ///
    /// One connection per worker thread, not one per process: a connection's I/O task then runs
    /// on the worker that issues most of its commands, so a script call costs no cross-thread
    /// wake-ups (measured: see BENCHMARKS.md). Commands stay pipelined within each connection.
    async fn conn(&self) -> Result<StoreConn, StoreError> {
        let cell = THREAD_CONNECTIONS.with(|c| c.borrow_mut().entry(self.id).or_default().clone());
        let conn = cell
            .get_or_try_init(|| async {
                Ok::<_, StoreError>(match &self.cluster {
                    None => StoreConn::Single(ConnectionManager::new_lazy_with_config(
                        self.client.clone(),
                        self.config.clone(),
                    )?),
                    Some(cluster) => StoreConn::Cluster(cluster.get_async_connection().await?),
                })
            })
            .await?;
        Ok(conn.clone())
    }

    /// One command, bounded like every store call.
    async fn query<T: FromRedisValue>(
        &self,
        op: StoreOp,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.bounded(op, async {
            let mut conn = self.conn().await?;
            Ok(cmd.query_async(&mut conn).await?)
        })
        .await
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

    /// One script call (EVALSHA, loading the script on NOSCRIPT), timed and bounded.
    async fn eval<T: FromRedisValue>(
        &self,
        script: ScriptName,
        op: StoreOp,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = self
            .bounded(op, async {
                let mut conn = self.conn().await?;
                Ok(invocation.invoke_async(&mut conn).await?)
            })
            .await;
        self.metrics
            .script_duration
            .with_label_values(&[script.as_str()])
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// Atomically checks the per-user limit and the stock, deducts, and records the reservation
    /// (ledger, hold deadline, event). With an idempotency key that already won, returns that
    /// reservation instead.
    pub async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        let act = req.activity;
        let now = unix_ms();
        let deadline = now + act.hold.as_millis() as u64;
        let idempotency_field = req
            .idempotency_key
            .map(|key| format!("{}\n{key}", req.user))
            .unwrap_or_default();
        let mut invocation = RESERVE_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.stock(&act.id, act.version))
            .key(self.keys.user_units(&act.id))
            .key(self.keys.reservations(&act.id))
            .key(self.keys.ledger(&act.id, act.version))
            .key(self.keys.pending(&act.id, act.version))
            .key(self.keys.idempotency(&act.id))
            .key(self.keys.events(&act.id))
            .arg(req.user)
            .arg(req.qty)
            .arg(act.per_user_limit.get())
            .arg(act.version)
            .arg(now)
            .arg(self.expire_at(act))
            .arg(req.reservation_id)
            .arg(deadline)
            .arg(idempotency_field)
            .arg(self.events_maxlen);
        let reply: Vec<Value> = self
            .eval(ScriptName::Reserve, StoreOp::Reserve, &invocation)
            .await?;
        ReserveOutcome::parse(&reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Reserve, reply))
    }

    /// Gives a reservation's units back to its version's stock and its user, exactly once, from
    /// pending or confirmed.
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
        let id = &activity.id;
        let mut invocation = RELEASE_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.reservations(id))
            .key(self.keys.user_units(id))
            .key(self.keys.stock(id, version))
            .key(self.keys.ledger(id, version))
            .key(self.keys.pending(id, version))
            .key(self.keys.events(id))
            .arg(reservation_id)
            .arg(version)
            .arg(unix_ms())
            .arg(reason.as_str())
            .arg(u8::from(tombstone))
            .arg(self.events_maxlen)
            .arg(u8::from(version == activity.version));
        let reply: Vec<i64> = self
            .eval(ScriptName::Release, StoreOp::Release, &invocation)
            .await?;
        ReleaseOutcome::parse(&reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Release, reply))
    }

    /// Moves a pending reservation to confirmed (the order exists), exactly once.
    pub async fn confirm(
        &self,
        activity: &Activity,
        version: u64,
        reservation_id: &str,
        via: ConfirmedVia,
    ) -> Result<ConfirmOutcome, StoreError> {
        let id = &activity.id;
        let mut invocation = CONFIRM_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.reservations(id))
            .key(self.keys.ledger(id, version))
            .key(self.keys.pending(id, version))
            .key(self.keys.events(id))
            .arg(reservation_id)
            .arg(version)
            .arg(unix_ms())
            .arg(self.events_maxlen)
            .arg(via.as_str());
        let reply: i64 = self
            .eval(ScriptName::Confirm, StoreOp::Confirm, &invocation)
            .await?;
        ConfirmOutcome::parse(reply).ok_or_else(|| StoreError::protocol(ScriptName::Confirm, reply))
    }

    /// Releases up to `batch` pending reservations of one version whose hold has passed.
    pub async fn sweep(
        &self,
        activity: &Activity,
        version: u64,
        batch: u32,
    ) -> Result<SweepOutcome, StoreError> {
        let id = &activity.id;
        let mut invocation = SWEEP_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.pending(id, version))
            .key(self.keys.reservations(id))
            .key(self.keys.user_units(id))
            .key(self.keys.stock(id, version))
            .key(self.keys.ledger(id, version))
            .key(self.keys.events(id))
            .arg(unix_ms())
            .arg(batch)
            .arg(self.events_maxlen)
            .arg(u8::from(version == activity.version));
        let reply: Vec<u64> = self
            .eval(ScriptName::Sweep, StoreOp::Sweep, &invocation)
            .await?;
        match reply.as_slice() {
            [released, units, scanned, retired] => Ok(SweepOutcome {
                released: *released,
                units: *units,
                scanned: *scanned,
                retired: *retired,
            }),
            _ => Err(StoreError::protocol(ScriptName::Sweep, reply)),
        }
    }

    /// Creates the activity's current stock version from the configured stock, with its ledger,
    /// if it does not exist, expiring `key_ttl_after_end` after the sale ends. Never overwrites:
    /// a restart or a second instance cannot reset stock already sold.
    pub async fn prewarm(&self, activity: &Activity) -> Result<PrewarmOutcome, StoreError> {
        let id = &activity.id;
        let mut invocation = PREWARM_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.stock(id, activity.version))
            .key(self.keys.ledger(id, activity.version))
            .key(self.keys.versions(id))
            .arg(activity.stock)
            .arg(activity.version)
            .arg(self.expire_at(activity));
        let reply: i64 = self
            .eval(ScriptName::Prewarm, StoreOp::Prewarm, &invocation)
            .await?;
        let outcome = match reply {
            1 => PrewarmOutcome::Created,
            0 => PrewarmOutcome::Exists,
            -1 => PrewarmOutcome::StockKeyRemoved,
            _ => return Err(StoreError::protocol(ScriptName::Prewarm, reply)),
        };
        if outcome == PrewarmOutcome::Created {
            self.metrics
                .stock_keys_created
                .with_label_values(&[id])
                .inc();
        }
        Ok(outcome)
    }

    /// Records the segment count an activity's current version is sold with, the first time; later
    /// calls answer `Err(first)` if the count differs. Changing `segments` without a new
    /// `version` would create the new segments' keys from the configured stock and sell units
    /// twice, so such a layout is refused.
    pub async fn claim_layout(&self, activity: &Activity) -> Result<Result<(), u32>, StoreError> {
        let key = self.keys.layout(&activity.id, activity.version);
        let count = activity.segment_count();
        let claimed: Option<String> = self
            .query(
                StoreOp::Prewarm,
                redis::cmd("SET")
                    .arg(&key)
                    .arg(count)
                    .arg("NX")
                    .arg("EXAT")
                    .arg(self.expire_at(activity)),
            )
            .await?;
        if claimed.is_some() {
            return Ok(Ok(()));
        }
        let first: Option<u32> = self
            .query(StoreOp::Prewarm, redis::cmd("GET").arg(&key))
            .await?;
        Ok(match first {
            Some(first) if first != count => Err(first),
            _ => Ok(()),
        })
    }

    /// One version's stock and ledger, read atomically.
    pub async fn ledger(&self, activity: &Activity, version: u64) -> Result<LedgerRow, StoreError> {
        let id = &activity.id;
        let mut invocation = LEDGER_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.stock(id, version))
            .key(self.keys.ledger(id, version))
            .key(self.keys.pending(id, version));
        let reply: Vec<i64> = self
            .eval(ScriptName::Ledger, StoreOp::Read, &invocation)
            .await?;
        LedgerRow::parse(version, &reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Ledger, reply))
    }

    /// First half of moving units between segments: takes up to `want` units out of `from`'s
    /// current version. Returns the units taken (0: that segment has none).
    pub async fn withdraw(
        &self,
        from: &Activity,
        transfer_id: &str,
        want: u64,
        to: &Activity,
    ) -> Result<u64, StoreError> {
        let mut invocation = WITHDRAW_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.stock(&from.id, from.version))
            .key(self.keys.ledger(&from.id, from.version))
            .key(self.keys.transfers(&from.id))
            .arg(transfer_id)
            .arg(want)
            .arg(&*to.id)
            .arg(unix_ms());
        self.eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await
    }

    /// Second half: the units arrive in `to`'s current version, once per transfer id.
    pub async fn deposit(
        &self,
        to: &Activity,
        transfer_id: &str,
        qty: u64,
    ) -> Result<bool, StoreError> {
        let mut invocation = DEPOSIT_SCRIPT.prepare_invoke();
        invocation
            .key(self.keys.stock(&to.id, to.version))
            .key(self.keys.ledger(&to.id, to.version))
            .key(self.keys.received(&to.id))
            .arg(transfer_id)
            .arg(qty);
        let deposited: i64 = self
            .eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await?;
        Ok(deposited == 1)
    }

    /// The giving segment forgets a delivered transfer.
    pub async fn acknowledge(&self, from: &Activity, transfer_id: &str) -> Result<(), StoreError> {
        self.query::<i64>(
            StoreOp::Transfer,
            redis::cmd("HDEL")
                .arg(self.keys.transfers(&from.id))
                .arg(transfer_id),
        )
        .await
        .map(|_| ())
    }

    /// Transfers a segment gave but has not seen acknowledged (a gateway died between halves).
    pub async fn unacknowledged_transfers(
        &self,
        from: &Activity,
    ) -> Result<Vec<Transfer>, StoreError> {
        let raw: Vec<(String, String)> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGETALL").arg(self.keys.transfers(&from.id)),
            )
            .await?;
        Ok(raw
            .into_iter()
            .filter_map(|(id, json)| {
                let mut t: Transfer = serde_json::from_str(&json).ok()?;
                t.id = id;
                Some(t)
            })
            .collect())
    }

    /// Whether a segment has received a transfer.
    pub async fn received(&self, to: &Activity, transfer_id: &str) -> Result<bool, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HEXISTS")
                .arg(self.keys.received(&to.id))
                .arg(transfer_id),
        )
        .await
    }

    /// The stock versions of an activity ever prewarmed, ascending, with the configured one.
    pub async fn versions(&self, activity: &Activity) -> Result<Vec<u64>, StoreError> {
        let mut versions: Vec<u64> = self
            .query(
                StoreOp::Read,
                redis::cmd("SMEMBERS").arg(self.keys.versions(&activity.id)),
            )
            .await?;
        versions.push(activity.version);
        versions.sort_unstable();
        versions.dedup();
        Ok(versions)
    }

    /// A reservation's record, if the activity has one with that id.
    pub async fn lookup(
        &self,
        activity: &Activity,
        reservation_id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let raw: Option<String> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGET")
                    .arg(self.keys.reservations(&activity.id))
                    .arg(reservation_id),
            )
            .await?;
        raw.map(|raw| {
            serde_json::from_str(&raw).map_err(|e| StoreError::Protocol {
                script: "reservation record",
                reply: e.to_string(),
            })
        })
        .transpose()
    }

    /// Every reservation record of an activity and the ledgers of the given versions, read in one
    /// MULTI/EXEC snapshot (for `flashgate reconcile`; O(reservations), not for the hot path).
    pub async fn snapshot(
        &self,
        activity: &Activity,
        versions: &[u64],
    ) -> Result<(Vec<LedgerRow>, Vec<ReservationRecord>), StoreError> {
        let id = &activity.id;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for &v in versions {
            pipe.cmd("EXISTS").arg(self.keys.stock(id, v));
            pipe.cmd("GET").arg(self.keys.stock(id, v));
            pipe.cmd("HMGET").arg(self.keys.ledger(id, v)).arg(&[
                "initial",
                "pending",
                "confirmed",
                "released",
                "retired",
                "moved_in",
                "moved_out",
            ]);
            pipe.cmd("EXISTS").arg(self.keys.ledger(id, v));
            pipe.cmd("ZCARD").arg(self.keys.pending(id, v));
        }
        pipe.cmd("HVALS").arg(self.keys.reservations(id));
        // An operator command: allowed more time than a buyer's request.
        let values: Vec<Value> =
            tokio::time::timeout(self.timeout.max(Duration::from_secs(10)), async {
                let mut conn = self.conn().await?;
                Ok::<_, StoreError>(pipe.query_async(&mut conn).await?)
            })
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        records::parse_snapshot(versions, &values)
            .ok_or_else(|| StoreError::protocol(ScriptName::Ledger, "snapshot"))
    }

    /// Units remaining in the activity's current version; `None` if its key does not exist.
    pub async fn remaining(&self, activity: &Activity) -> Result<Option<i64>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("GET").arg(self.keys.stock(&activity.id, activity.version)),
        )
        .await
    }

    /// Whether the store answers and every script is loaded (loading them if not). A connection
    /// that broke while Redis was away fails once before it reconnects; readiness tries again
    /// then, so a probe does not report a Redis that is back as down.
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self.ready_once().await {
            Err(StoreError::Redis(e)) if e.is_connection_dropped() || e.is_io_error() => {
                self.ready_once().await
            }
            other => other,
        }
    }

    async fn ready_once(&self) -> Result<(), StoreError> {
        self.bounded(StoreOp::Ready, async {
            let mut conn = self.conn().await?;
            let scripts = all_scripts();
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

    /// When an activity's keys expire: `ends_at` plus the configured retention.
    fn expire_at(&self, activity: &Activity) -> u64 {
        let end = u64::try_from(activity.ends_at.timestamp()).unwrap_or(0);
        end + self.key_ttl_after_end.as_secs()
    }
}

/// Calls `op` until the store answers (success or a definite refusal, not an error), backing
/// off from 50 ms to 5 s: about a minute in all. `None` if it never answered. For work that must
/// land eventually but not on a buyer's time (confirming, releasing an ambiguous reserve).
pub async fn until_answered<T, F, Fut>(mut op: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Duration::from_millis(50);
    for _ in 0..20 {
        match op().await {
            Ok(answer) => return Some(answer),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    None
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> StoreError {
        StoreError::Redis(redis::RedisError::from(std::io::Error::from(kind)))
    }

    #[test]
    fn only_a_refused_connection_surely_ran_nothing() {
        // redis-rs's own response timeout reports an I/O error, not our Timeout: a reserve
        // that timed out either way must be abandoned (found by the reliability suite).
        assert!(io(std::io::ErrorKind::TimedOut).may_have_landed());
        assert!(io(std::io::ErrorKind::ConnectionReset).may_have_landed());
        assert!(io(std::io::ErrorKind::BrokenPipe).may_have_landed());
        assert!(StoreError::Timeout(Duration::from_millis(5)).may_have_landed());
        assert!(!io(std::io::ErrorKind::ConnectionRefused).may_have_landed());
    }
}
