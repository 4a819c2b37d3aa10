//! The stock store: Redis, spoken to only through the Lua scripts in `lua/` and a few O(1)
//! reads. It owns the key layout, the scripts, time budgets and the store's metrics; it knows
//! nothing of requests, admission or news.
//!
//! - [`layout`]: an activity's partitions (segments) and a buyer's home partition;
//! - [`keys`]: every key name, and each script's KEYS in the order it declares them;
//! - [`ops`]: one script or command on one partition;
//! - [`segments`]: what spans partitions: prewarming an activity, a buyer's reserve with
//!   rebalancing, whether anything is left anywhere, every ledger;
//! - [`records`]: the scripts' answers and records as Rust types;
//! - [`breaker`]: the circuit breaker in front of the store on the buyer's path;
//! - [`clock`]: Redis's clock as last read, for the checks made before any call;
//! - [`port`]: the calls each caller makes, as traits the store and in-process fakes implement.
//!
//! What happens when Redis is down or slow: every call is bounded by `redis.timeout_ms`, and any
//! error or timeout is reported to the caller, which answers `unavailable` (503). Nothing is
//! retried on the buyer's time, and nothing is ever admitted without a successful reserve, so a
//! sick Redis costs availability, never stock. Connections reconnect in the background; the
//! gateway recovers without a restart.

pub mod breaker;
pub mod clock;
#[cfg(test)]
pub mod fake;
mod keys;
pub mod layout;
mod ops;
mod outcomes;
pub mod port;
mod reads;
mod records;
pub mod scripts;
pub mod segments;

pub use keys::{KeyLayout, PartitionKeys};
pub use layout::{Layout, Partition};
pub use ops::{LookupLease, ReserveCall, SaleHours};
pub use outcomes::*;
pub use port::{Publish, Reads, Settle, Transfers};
pub use reads::{Snapshot, Transfer, TransferBooks};
pub use records::*;

use crate::config::{Activity, RedisSettings};
use crate::label_enum;
use crate::metrics::Metrics;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

label_enum! {
    /// The Lua scripts, as the `script` label.
    pub enum ScriptName {
        Reserve => "reserve",
        Release => "release",
        Confirm => "confirm",
        Sweep => "sweep",
        Prewarm => "prewarm",
        Ledger => "ledger",
        Transfer => "transfer",
        Queue => "queue",
    }
}

label_enum! {
    /// Stock-store operations, as the `op` label of `flashgate_redis_errors_total`.
    pub enum StoreOp {
        Reserve => "reserve",
        Release => "release",
        Confirm => "confirm",
        Sweep => "sweep",
        Prewarm => "prewarm",
        Read => "read",
        Ready => "ready",
        Transfer => "transfer",
        Queue => "queue",
    }
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

    pub fn protocol(script: ScriptName, reply: impl std::fmt::Debug) -> Self {
        StoreError::Protocol {
            script: script.as_str(),
            reply: format!("{reply:?}"),
        }
    }
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
    clock: clock::RedisClock,
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
            clock: clock::RedisClock::default(),
        })
    }

    /// Redis's clock as last read (see [`clock`]).
    pub fn clock(&self) -> &clock::RedisClock {
        &self.clock
    }

    /// Reads Redis's `TIME` and learns its offset from the local clock; says so in the log
    /// when it moved by more than a second (the first read of a clock far off included).
    pub async fn read_clock(&self) -> Result<(), StoreError> {
        let before = self.clock.known().then(|| self.clock.offset_ms());
        let sent = chrono::Utc::now();
        let (secs, micros): (i64, i64) = self.query(StoreOp::Read, &redis::cmd("TIME")).await?;
        self.clock
            .learn(secs * 1000 + micros / 1000, sent, chrono::Utc::now());
        let offset = self.clock.offset_ms();
        if (offset - before.unwrap_or(0)).abs() > 1000 {
            tracing::warn!(
                offset_ms = offset,
                "Redis's clock is {offset} ms off this gateway's: sale hours are judged by Redis's"
            );
        }
        Ok(())
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    /// A client for connections of other kinds (pub/sub).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The per-call time budget (`redis.timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Publishes a message on a pub/sub channel (a cluster delivers it on every node).
    pub async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        self.query::<i64>(
            StoreOp::Read,
            redis::cmd("PUBLISH").arg(channel).arg(message),
        )
        .await
        .map(|_| ())
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
        self.bounded(op, self.timeout, async {
            let mut conn = self.conn().await?;
            Ok(cmd.query_async(&mut conn).await?)
        })
        .await
    }

    /// Runs `fut` within `budget`, counting failures.
    async fn bounded<T>(
        &self,
        op: StoreOp,
        budget: Duration,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(budget, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(budget)),
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
    /// Runs a script (EVALSHA, loading it on NOSCRIPT) within the time budget, timed and counted
    /// under `script` and `op`.
    pub async fn eval<T: FromRedisValue>(
        &self,
        script: ScriptName,
        op: StoreOp,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = self
            .bounded(op, self.timeout, async {
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

    /// Whether the store answers, every script is loaded (loading them if not), and Redis's
    /// clock was read at least once. A connection
    /// that broke while Redis was away fails once before it reconnects; readiness tries again
    /// then, so a probe does not report a Redis that is back as down.
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self.ready_once().await {
            Err(StoreError::Redis(e)) if e.is_connection_dropped() || e.is_io_error() => {
                self.ready_once().await
            }
            other => other,
        }?;
        // Not ready before Redis's clock is known: until then the sale's hours would be judged
        // by this gateway's own clock.
        if !self.clock.known() {
            self.read_clock().await?;
        }
        Ok(())
    }

    async fn ready_once(&self) -> Result<(), StoreError> {
        self.bounded(StoreOp::Ready, self.timeout, async {
            let mut conn = self.conn().await?;
            let scripts = scripts::all();
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
    pub fn expire_at(&self, activity: &Activity) -> u64 {
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
