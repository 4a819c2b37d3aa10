//! The Redis client under every store: one multiplexed connection per worker thread (to a single
//! Redis or a Redis Cluster), every call bounded by the time budget and counted, scripts run by
//! EVALSHA (loaded on NOSCRIPT, and all of them up front for readiness). It knows nothing of
//! stock, queues or news: the domain stores (`StockStore`, the waiting room's store) speak
//! through it. Batches are built above it (`scripts::reserve`): here a batch is one call.

use super::scripts;
use super::{ScriptName, StoreError, StoreOp};
use crate::config::RedisSettings;
use crate::metrics::Metrics;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Distinguishes clients in one process (tests run several) in the per-thread connection cache.
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

/// Connections to one Redis (or cluster), every call bounded and counted.
pub struct RedisClient {
    id: usize,
    /// The single Redis, or a cluster's first seed node (pub/sub).
    client: redis::Client,
    config: ConnectionManagerConfig,
    cluster: Option<redis::cluster::ClusterClient>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl RedisClient {
    /// Whether this is a Redis Cluster (else one Redis).
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Creates the client without connecting: each thread's first call connects, and a Redis
    /// that is down at start-up only makes the gateway unready.
    pub fn new(settings: &RedisSettings, metrics: Arc<Metrics>) -> Result<RedisClient, StoreError> {
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
        Ok(RedisClient {
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            client,
            config,
            cluster,
            timeout: settings.timeout,
            metrics,
        })
    }

    /// The metrics the store's calls are counted in.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
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

    /// One command, bounded like every store call (an idempotent `op` is sent once more on a
    /// connection that broke: see [`RedisClient::once_more`]).
    pub async fn query<T: FromRedisValue>(
        &self,
        op: StoreOp,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.once_more(op.idempotent(), || {
            self.bounded(op, self.timeout, async {
                let mut conn = self.conn().await?;
                Ok(cmd.query_async(&mut conn).await?)
            })
        })
        .await
    }

    /// One command to the master holding `key`'s slot (on a single Redis, that Redis): for
    /// commands without a key that must reach one segment's master (`CONFIG GET`). Idempotent
    /// `op`s are sent once more on a broken connection.
    pub async fn query_at<T: FromRedisValue>(
        &self,
        op: StoreOp,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        self.once_more(op.idempotent(), || {
            self.bounded(op, self.timeout, async {
                match self.conn().await? {
                    StoreConn::Single(mut conn) => Ok(cmd.query_async(&mut conn).await?),
                    StoreConn::Cluster(mut conn) => {
                        let route = Route::with_key(key, SlotAddr::Master);
                        let value = conn
                            .route_command(
                                cmd.clone(),
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                            )
                            .await?;
                        Ok(redis::from_redis_value(value).map_err(redis::RedisError::from)?)
                    }
                }
            })
        })
        .await
    }

    /// Runs `call`, and once more if it failed on a connection that broke (a broken pipe, a
    /// reset, a closed socket: Redis restarted or failed over, and the connection is made again
    /// by the next call) when `retry`: for idempotent calls only (reads, the master check,
    /// halts, resumes, confirms and releases by id, a keyed restock), never a buyer's reserve,
    /// whose second send could take a second unit. A timeout is not retried: Redis may be slow,
    /// not gone.
    pub async fn once_more<T, F, Fut>(&self, retry: bool, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        match call().await {
            Err(e) if retry && e.broke_connection() => {
                tracing::debug!(error = %e, "a broken Redis connection: made again, sent once more");
                call().await
            }
            other => other,
        }
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

    /// Counts the items one call of a batched script carries.
    pub fn observe_batch(&self, script: ScriptName, items: usize) {
        self.metrics
            .script_batch_size
            .with_label_values(&[script.as_str()])
            .observe(items as f64);
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT) within the time budget, timed and counted
    /// under `script` and `op`.
    pub async fn eval<T: FromRedisValue>(
        &self,
        script: ScriptName,
        op: StoreOp,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.once_more(op.idempotent(), || {
            self.timed(script, op, async {
                let mut conn = self.conn().await?;
                Ok(invocation.invoke_async(&mut conn).await?)
            })
        })
        .await
    }

    /// [`RedisClient::eval`], sent once more on a broken connection whatever `op` (the caller
    /// knows this call is idempotent: a restock with its key).
    pub async fn eval_idempotent<T: FromRedisValue>(
        &self,
        script: ScriptName,
        op: StoreOp,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.once_more(true, || {
            self.timed(script, op, async {
                let mut conn = self.conn().await?;
                Ok(invocation.invoke_async(&mut conn).await?)
            })
        })
        .await
    }

    /// A script call within the time budget, timed under `script` and counted under `op`.
    async fn timed<T>(
        &self,
        script: ScriptName,
        op: StoreOp,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = self.bounded(op, self.timeout, call).await;
        self.metrics
            .script_duration
            .with_label_values(&[script.as_str()])
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// `script` called as `cmd`, an EVALSHA made by [`evalsha`] with its keys and arguments
    /// written into the command's one buffer (a `ScriptInvocation` keeps each in an allocation
    /// of its own: a dozen per reservation in a batch). A NOSCRIPT answer (after a restart or
    /// `SCRIPT FLUSH`) loads the script and sends the call again, as `invoke_async` does.
    pub async fn eval_cmd<T: FromRedisValue>(
        &self,
        script: ScriptName,
        source: &redis::Script,
        op: StoreOp,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let no_script = redis::ErrorKind::Server(redis::ServerErrorKind::NoScript);
        self.timed(script, op, async {
            let mut conn = self.conn().await?;
            match cmd.query_async(&mut conn).await {
                Err(e) if e.kind() == no_script => {
                    source.load_async(&mut conn).await?;
                    Ok(cmd.query_async(&mut conn).await?)
                }
                answer => Ok(answer?),
            }
        })
        .await
    }

    /// `script` called as `cmd` (see [`RedisClient::eval_cmd`]), then `WAIT replicas` on the
    /// same connection, in one pipeline: Redis answers the WAIT once `replicas` replicas hold
    /// every write this connection made before it (the script's included), or after
    /// `wait_ms` with how many do. Bounded by the budget plus `wait_ms`. Returns the script's
    /// answer and the replicas that acknowledged it.
    pub async fn eval_cmd_acknowledged<T: FromRedisValue>(
        &self,
        script: ScriptName,
        source: &redis::Script,
        op: StoreOp,
        cmd: &redis::Cmd,
        replicas: u32,
        wait_ms: u64,
    ) -> Result<(T, u32), StoreError> {
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone())
            .cmd("WAIT")
            .arg(replicas)
            .arg(wait_ms);
        let started = Instant::now();
        let budget = self.timeout + Duration::from_millis(wait_ms);
        let result = self.pipeline(op, budget, &pipe, Some(source)).await;
        self.metrics
            .script_duration
            .with_label_values(&[script.as_str()])
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// A pipeline (or a MULTI/EXEC), bounded by `budget` and counted under `op`. With
    /// `script`, a NOSCRIPT answer (after a restart or `SCRIPT FLUSH`) loads it and sends the
    /// pipeline again.
    pub async fn pipeline<T: FromRedisValue>(
        &self,
        op: StoreOp,
        budget: Duration,
        pipe: &redis::Pipeline,
        script: Option<&redis::Script>,
    ) -> Result<T, StoreError> {
        self.once_more(op.idempotent(), || {
            self.pipeline_once(op, budget, pipe, script)
        })
        .await
    }

    async fn pipeline_once<T: FromRedisValue>(
        &self,
        op: StoreOp,
        budget: Duration,
        pipe: &redis::Pipeline,
        script: Option<&redis::Script>,
    ) -> Result<T, StoreError> {
        self.bounded(op, budget, async {
            let mut conn = self.conn().await?;
            match (pipe.query_async(&mut conn).await, script) {
                (Err(e), Some(script))
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(&mut conn).await?;
                    Ok(pipe.query_async(&mut conn).await?)
                }
                (other, _) => Ok(other?),
            }
        })
        .await
    }

    /// Loads every script of the registry that Redis does not have yet.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
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
}

/// The start of an EVALSHA of `script` with `keys` keys: the keys, then the arguments, follow as
/// the command's own arguments (see [`RedisClient::eval_cmd`]).
pub fn evalsha(script: &redis::Script, keys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}
