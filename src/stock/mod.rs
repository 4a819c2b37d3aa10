//! The stock store: Redis, spoken to only through the Lua scripts in `lua/` and a few O(1)
//! reads. It owns the key layout, the scripts, time budgets and the store's metrics; it knows
//! nothing of requests, admission or news.
//!
//! - [`layout`]: an activity's segments (segments) and a buyer's home segment;
//! - [`keys`]: every key name, and each script's KEYS in the order it declares them;
//! - [`ops`]: one script or command on one segment;
//! - [`segments`]: what spans segments: prewarming an activity, a buyer's reserve with
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
pub mod client;
pub mod clock;
pub mod failover;
#[cfg(test)]
pub mod fake;
#[cfg(feature = "fault-injection")]
mod fault;
mod keys;
pub mod layout;
pub mod orders_check;
pub mod port;
/// The store's call traits, for callers that make them on [`StockStore`] itself.
pub mod prelude {
    pub use super::port::{
        AcknowledgeScript, ConfirmScript, DepositScript, DueScript, LedgerScript, Publish, Reads,
        ReleaseScript, ReserveScript, RestockScript, SweepScript, WithdrawScript,
    };
}
mod reads;
mod records;
pub mod scripts;
pub mod segments;
mod steps;

pub use keys::{KeyLayout, SegmentKeys};
pub use layout::{stable_hash, Layout, Segment};
pub use port::{
    AcknowledgeScript, ConfirmScript, DepositScript, DueScript, LedgerScript, Publish, Reads,
    ReleaseScript, ReserveScript, RestockScript, Settle, SweepScript, Transfers, WithdrawScript,
};
pub use reads::{Snapshot, Transfer, TransferBooks};
pub use records::*;
pub use scripts::claim::ClaimOutcome;
pub use scripts::confirm::ConfirmOutcome;
pub use scripts::deposit::Deposit;
pub use scripts::halt::Halt;
pub use scripts::line::{LineAnswer, LineAsk, LineView};
pub use scripts::prewarm::{PrewarmOutcome, SharedKeys};
pub use scripts::release::{ReleaseMode, ReleaseOutcome};
pub use scripts::reserve::{ReserveCall, ReserveOutcome, SaleHours};
pub use scripts::restock::RestockOutcome;
pub use scripts::sweep::{Leased, LookupLease, SweepOutcome};
pub use steps::Steps;

use crate::config::{Activity, RedisSettings};
use crate::label_enum;
use crate::metrics::Metrics;
use redis::{FromRedisValue, ScriptInvocation};
use std::sync::Arc;
use std::time::Duration;

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
        Restock => "restock",
        Halt => "halt",
        Tokens => "tokens",
        Master => "master",
        Recount => "recount",
        Line => "line",
        Fleet => "fleet",
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
        Restock => "restock",
        Halt => "halt",
        Tokens => "tokens",
        Master => "master",
        Recount => "recount",
        Line => "line",
        Fleet => "fleet",
    }
}

impl StoreOp {
    /// Whether sending the call twice does what sending it once does (so a call that failed on
    /// a broken connection is sent once more, see [`client::RedisClient::once_more`]): reads,
    /// readiness, prewarm (creates once), the master check and accept, halts and resumes,
    /// confirms and releases by id (a second changes nothing). Never a reserve, a transfer, a
    /// queue's ticket or a token: their second send would take again. A restock is idempotent
    /// only with its key (its call site says so).
    pub fn idempotent(self) -> bool {
        matches!(
            self,
            StoreOp::Read
                | StoreOp::Ready
                | StoreOp::Prewarm
                | StoreOp::Master
                | StoreOp::Halt
                | StoreOp::Confirm
                | StoreOp::Release
                | StoreOp::Line
                | StoreOp::Fleet
        )
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
    /// The error of a batched call, shared by every item it carried.
    #[error("{0}")]
    Batch(Arc<StoreError>),
    /// The batched call carrying this item was dropped before its answer.
    #[error(transparent)]
    Lost(#[from] crate::coalesce::Lost),
    /// The failover fence refused the call: the segment's Redis master was replaced (see
    /// [`failover`]); nothing ran.
    #[error("the Redis master of this segment was replaced: fenced until resumed")]
    Fenced,
    /// `redis.ack_replicas`: fewer replicas than asked acknowledged the reserve call within its
    /// time (it landed on the master, and is released by the caller as an abandoned one).
    #[error("only {acknowledged} of {wanted} replicas acknowledged the reservation in time")]
    NotReplicated { acknowledged: u32, wanted: u32 },
}

impl StoreError {
    /// Whether the call may have run in Redis although it failed here: our time budget or
    /// redis-rs's own response timeout ran out, the connection dropped after sending, or a
    /// reply came that we could not read. Only a refused connection surely ran nothing.
    pub fn may_have_landed(&self) -> bool {
        match self {
            StoreError::Timeout(_) | StoreError::Protocol { .. } | StoreError::Lost(_) => true,
            StoreError::Redis(e) => !e.is_connection_refusal(),
            StoreError::Batch(e) => e.may_have_landed(),
            StoreError::Fenced => false,
            StoreError::NotReplicated { .. } => true,
        }
    }

    /// Whether the call failed on a connection that broke (a broken pipe, a reset, a closed
    /// socket), as opposed to a slow or refusing Redis.
    pub fn broke_connection(&self) -> bool {
        match self {
            StoreError::Redis(e) => {
                e.is_connection_dropped() || (e.is_io_error() && !e.is_timeout())
            }
            StoreError::Batch(e) => e.broke_connection(),
            _ => false,
        }
    }

    /// An error a batch or a shared read handed to each of its askers: the error itself when
    /// this asker holds the only reference (a batch of one), else shared.
    pub fn shared(error: Arc<StoreError>) -> Self {
        Arc::try_unwrap(error).unwrap_or_else(StoreError::Batch)
    }

    pub fn protocol(script: ScriptName, reply: impl std::fmt::Debug) -> Self {
        StoreError::Protocol {
            script: script.as_str(),
            reply: format!("{reply:?}"),
        }
    }
}

pub struct StockStore {
    /// The connections, bounded and counted.
    redis: client::RedisClient,
    keys: KeyLayout,
    key_ttl_after_end: Duration,
    events_maxlen: u64,
    /// Replicas every reserve call waits for (`redis.ack_replicas`; 0: none).
    ack_replicas: u32,
    clock: clock::RedisClock,
    /// Reserves sent together per segment and version (see [`scripts::reserve`]).
    reserves: scripts::reserve::Batches,
    /// Fleet-bucket asks waiting for the call of their shard.
    token_batches: scripts::tokens::TokenBatches,
    /// Whether an activity has units left anywhere, one read at a time per activity and
    /// version (see `segments::Reserving::standing`).
    standings: Standings,
    /// The failover fence: the masters this process saw accepted, and what is fenced.
    failover: failover::Failover,
    /// How long a stock made after its sale opened, in a segment that had none, is held before
    /// it sells ([`failover::FENCE_SETTLE`]: every live gateway's check looks by then; see
    /// `lua/prewarm.lua`).
    birth_hold: Duration,
    /// How long a fence stands before a rule may lift it ([`failover::FENCE_SETTLE`]).
    fence_settle: Duration,
    /// How long after Redis started every gateway is taken as possibly alive, seen or not
    /// ([`PRESENCE_RETURN`]).
    presence_return: Duration,
    /// This process's presence id: the news listener also listens on its presence channel, so
    /// that other gateways can see it is alive (`KeyLayout::presence_channel`).
    presence: String,
}

/// The longest a gateway's news listener waits before it subscribes again after its subscription
/// broke (a Redis restarted): its presence is seen again within this of Redis answering.
pub const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

/// How long after Redis started a gateway that sees no other one alive still takes them as
/// possibly alive ([`RESUBSCRIBE_MAX`] and the time to connect and subscribe, whole seconds as
/// Redis counts its uptime).
pub const PRESENCE_RETURN: Duration = Duration::from_secs(4);

type Standings =
    crate::coalesce::SingleFlight<(Arc<str>, u64), Result<segments::Standing, Arc<StoreError>>>;

impl StockStore {
    /// Creates the store without connecting: each thread's first call connects, and a Redis
    /// that is down at start-up only makes the gateway unready.
    pub fn new(settings: &RedisSettings, metrics: Arc<Metrics>) -> Result<StockStore, StoreError> {
        Ok(StockStore {
            redis: client::RedisClient::new(settings, metrics)?,
            keys: KeyLayout::new(&settings.key_prefix),
            key_ttl_after_end: settings.key_ttl_after_end,
            events_maxlen: settings.events_maxlen,
            ack_replicas: settings.ack_replicas,
            clock: clock::RedisClock::default(),
            reserves: scripts::reserve::Batches::new(scripts::reserve::MAX_BATCH),
            token_batches: scripts::tokens::TokenBatches::new(scripts::tokens::MAX_TOKEN_BATCH),
            standings: Standings::default(),
            failover: failover::Failover::default(),
            birth_hold: failover::FENCE_SETTLE,
            fence_settle: failover::FENCE_SETTLE,
            presence_return: PRESENCE_RETURN,
            presence: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    /// This process's presence id (see the field): unique per process, the same for its life.
    pub fn presence_id(&self) -> &str {
        &self.presence
    }

    /// This process's presence channel (see the field).
    pub fn presence_channel(&self) -> String {
        self.keys.presence_channel(&self.presence)
    }

    /// Whether another gateway process may be alive on this Redis: one listens on a presence
    /// channel other than this process's (`PUBSUB CHANNELS`, one call), or this process's own
    /// is not seen either, so the silence proves nothing (its listener not subscribed yet at
    /// start-up, or refused: a Redis 7 ACL user without channel rights, whose default
    /// `acl-pubsub-default resetchannels` refuses every gateway alike). Approximations: on
    /// Redis Cluster only the subscriptions of the node asked are seen, and a gateway whose
    /// subscription is being opened again at that moment (after Redis restarted) is not: its
    /// listener tries again within [`RESUBSCRIBE_MAX`], so a Redis up for less than
    /// [`PRESENCE_RETURN`] is taken as one whose gateways may not be back yet (`lua/prewarm.lua`
    /// reads its uptime where the stock is made). A gateway that cannot reach Redis at all
    /// (partitioned, its connections not yet given up) is not seen, and cannot object.
    pub(crate) async fn other_gateways_alive(&self) -> Result<bool, StoreError> {
        let own = self.presence_channel();
        let channels: Vec<String> = self
            .query(
                StoreOp::Read,
                redis::cmd("PUBSUB")
                    .arg("CHANNELS")
                    .arg(self.keys.presence_channel("*")),
            )
            .await?;
        Ok(channels.iter().any(|c| *c != own) || !channels.contains(&own))
    }

    /// Test seam: how long a fence stands before a rule may lift it (see the field), for tests
    /// that stand for the time passing with one check (`Duration::ZERO`: at once).
    #[doc(hidden)]
    pub fn with_fence_settle(mut self, settle: Duration) -> Self {
        self.fence_settle = settle;
        self
    }

    /// Test seam: how long after Redis started a gateway that sees no other one takes them as
    /// possibly alive (see the field; `Duration::ZERO`: never), for tests of a lone gateway
    /// on a Redis they just started.
    #[doc(hidden)]
    pub fn with_presence_return(mut self, window: Duration) -> Self {
        self.presence_return = window;
        self
    }

    /// Test seam: the birth hold (see the field; `Duration::ZERO`: none), for tests that drive
    /// the scripts without a gateway's periodic checks to lift it.
    #[doc(hidden)]
    pub fn with_birth_hold(mut self, hold: Duration) -> Self {
        self.birth_hold = hold;
        self
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

    fn standings(&self) -> &Standings {
        &self.standings
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    /// The Redis client under this store.
    pub fn redis(&self) -> &client::RedisClient {
        &self.redis
    }

    /// A client for connections of other kinds (pub/sub).
    pub fn client(&self) -> &redis::Client {
        self.redis.client()
    }

    /// The per-call time budget (`redis.timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.redis.timeout()
    }
}

impl Publish for StockStore {
    fn news_channel(&self) -> String {
        self.keys().news_channel()
    }

    /// Publishes a message on a pub/sub channel (a cluster delivers it on every node).
    async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        self.redis.publish(channel, message).await
    }
}

impl StockStore {
    /// One command, bounded like every store call.
    async fn query<T: FromRedisValue>(
        &self,
        op: StoreOp,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.redis.query(op, cmd).await
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT) within the time budget, timed and counted
    /// under `script` and `op`.
    pub async fn eval<T: FromRedisValue>(
        &self,
        script: ScriptName,
        op: StoreOp,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.redis.eval(script, op, invocation).await
    }

    /// Whether the store answers, every script is loaded (loading them if not), and Redis's
    /// clock was read at least once. A connection
    /// that broke while Redis was away fails once before it reconnects; readiness tries again
    /// then, so a probe does not report a Redis that is back as down.
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self.redis.load_scripts().await {
            Err(StoreError::Redis(e)) if e.is_connection_dropped() || e.is_io_error() => {
                self.redis.load_scripts().await
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

    /// When an activity's keys expire: `ends_at` plus the configured retention.
    pub fn expire_at(&self, activity: &Activity) -> u64 {
        self.expire_after(activity.ends_at)
    }

    /// When the keys of an activity ending at `ends_at` expire.
    pub fn expire_after(&self, ends_at: chrono::DateTime<chrono::Utc>) -> u64 {
        let end = u64::try_from(ends_at.timestamp()).unwrap_or(0);
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
        // that timed out either way must be abandoned.
        assert!(io(std::io::ErrorKind::TimedOut).may_have_landed());
        assert!(io(std::io::ErrorKind::ConnectionReset).may_have_landed());
        assert!(io(std::io::ErrorKind::BrokenPipe).may_have_landed());
        assert!(StoreError::Timeout(Duration::from_millis(5)).may_have_landed());
        assert!(!io(std::io::ErrorKind::ConnectionRefused).may_have_landed());
    }
}
