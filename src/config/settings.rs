//! The runtime configuration types: every value checked and converted once, at load time
//! (by [`super::validate`]), so the gateway never holds an unchecked value.

pub use super::file::{ConfirmMode, StoreFailurePolicy};
pub use super::route::SaleRoute;
use chrono::{DateTime, Utc};
use governor::Quota;
use http::HeaderName;
use ipnet::IpNet;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The stock-store circuit breaker's thresholds (`redis.breaker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Store calls failing in a row that open the breaker.
    pub consecutive_failures: u32,
    /// How long it stays open before one probe call.
    pub open_for: Duration,
}

/// The validated configuration the gateway runs on.
#[derive(Debug)]
pub struct Settings {
    pub server: ServerSettings,
    pub admin: AdminSettings,
    pub upstream: UpstreamSettings,
    pub redis: RedisSettings,
    pub identity: IdentitySettings,
    pub signing: SigningSettings,
    pub rate_limits: RateLimitSettings,
    pub sold_out_cache: SoldOutCacheSettings,
    pub sale_routes: Vec<SaleRoute>,
    pub activities: Activities,
    /// From `redis.breaker` (reloadable, unlike the rest of `redis`).
    pub breaker: BreakerSettings,
    /// `pages:` and the activities' titles and success URLs.
    pub pages: super::PagesSettings,
}

#[derive(Debug)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub threads: NonZeroUsize,
    pub grace_period: Duration,
    /// The longest a sale request can take once admitted (see `longest_sale_trip`).
    pub longest_sale_trip: Duration,
    pub shutdown_timeout: Duration,
    pub max_sale_body_bytes: u64,
    pub sale_body_timeout: Duration,
    pub max_sale_header_bytes: u64,
    /// Another route's request body: read whole, at most this many bytes, within this long.
    pub max_passthrough_body_bytes: u64,
    pub passthrough_body_timeout: Duration,
    /// Most bytes of other routes' bodies held at once (over every connection).
    pub max_passthrough_buffered_bytes: u64,
    /// `None`: the file is not watched.
    pub reload_watch_interval: Option<Duration>,
    /// Where listening sockets are handed to a new binary on a graceful upgrade.
    pub upgrade_sock: PathBuf,
    /// The origins allowed to call sale routes and the waiting room from a browser.
    pub cors: super::CorsSettings,
}

#[derive(Debug)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    /// Bearer token for `/v1/*`; `None` means the token API is closed to everyone.
    pub token: Option<AdminToken>,
}

/// The admin bearer token. Kept out of `Debug` output.
#[derive(Clone)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

#[derive(Debug)]
pub struct UpstreamSettings {
    pub addresses: Vec<SocketAddr>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub health_check_interval: Duration,
    /// `None`: no limit on sale requests at the backend at once.
    pub max_inflight: Option<NonZeroUsize>,
    pub max_queue_wait: Duration,
    /// `None`: no limit on requests of other routes at the backend at once.
    pub max_passthrough_inflight: Option<NonZeroUsize>,
    pub order_lookup: Option<OrderLookupSettings>,
}

/// `upstream.order_lookup`: the backend's answer to "do you hold this order?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderLookupSettings {
    /// The path before and after `{jti}`.
    pub path: (String, String),
    pub timeout: Duration,
    pub retry_interval: Duration,
    pub give_up_after: Option<Duration>,
}

impl OrderLookupSettings {
    /// The request path for one reservation id (ids are UUIDs with a segment suffix: nothing
    /// to escape).
    pub fn path_for(&self, jti: &str) -> String {
        format!("{}{jti}{}", self.path.0, self.path.1)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct RedisSettings {
    /// The single Redis; with a cluster, the first seed node (used for pub/sub, which a cluster
    /// delivers on every node).
    pub url: String,
    /// Seed node URLs of a Redis Cluster; empty for a single Redis.
    pub cluster_nodes: Vec<String>,
    pub timeout: Duration,
    pub key_prefix: String,
    pub key_ttl_after_end: Duration,
    pub prewarm_interval: Duration,
    pub sweep_interval: Duration,
    pub sweep_batch: u32,
    pub reconcile_interval: Duration,
    pub events_maxlen: u64,
    /// Sell on a Redis that may evict keys (`redis.allow_eviction`).
    pub allow_eviction: bool,
    /// Replicas every winner's reservation must reach before it is answered (`WAIT`; 0: none).
    pub ack_replicas: u32,
}

/// Most replicas `redis.ack_replicas` may wait for.
pub const MAX_ACK_REPLICAS: u32 = 16;

/// Largest `server.max_sale_body_bytes`: the most Pingora buffers of a request body to send it
/// upstream after it was read whole.
pub const MAX_SALE_BODY_BYTES: u64 = 64 * 1024;

/// Most reservations one sweep call may release.
pub const MAX_SWEEP_BATCH: u32 = 1000;

#[derive(Debug)]
pub struct IdentitySettings {
    pub source: IdentitySource,
    /// Proxies whose identity header and `X-Forwarded-For` are believed; empty trusts every
    /// peer's header (the auth layer in front is the only way in) and no `X-Forwarded-For`.
    pub trusted_proxies: Vec<IpNet>,
    /// More identity headers to strip from untrusted peers' requests (lower case; a trailing
    /// `*` matches a prefix), beside `crate::header_names::IDENTITY_CLAIMS`.
    pub strip_headers: Vec<String>,
    /// The operator's opt-out: a header identity believed from any peer on a listener other
    /// hosts reach (see the YAML key `identity.header_from_any_peer`).
    pub header_from_any_peer: bool,
    /// The headers phases read (`activities[].phases[].who.header`), in lower case: believed
    /// only from `trusted_proxies`, in one spelling.
    pub phase_headers: Vec<String>,
}

impl IdentitySettings {
    /// Why a header identity is open to anyone, if it is: believed from every peer (no
    /// `trusted_proxies`) on a proxy listener other hosts reach.
    pub fn spoofable(&self, listen: &std::net::SocketAddr) -> Option<String> {
        let IdentitySource::Header(name) = &self.source else {
            return None;
        };
        // Trusting every address (`0.0.0.0/0`, `::/0`, or halves that add up to it) trusts
        // anyone, as no list does.
        let everyone = IpNet::aggregate(&self.trusted_proxies)
            .iter()
            .any(|net| net.prefix_len() == 0);
        let anyone = self.trusted_proxies.is_empty() || everyone;
        (anyone && !listen.ip().is_loopback()).then(|| {
            format!(
                "{name} is believed from any peer and server.listen {listen} is reachable from \
                 other hosts: anyone can send any user id"
            )
        })
    }
}

/// Where the buyer's identity comes from.
#[derive(Debug)]
pub enum IdentitySource {
    Header(HeaderName),
    Jwt(JwtIdentitySettings),
}

#[derive(Debug)]
pub struct JwtIdentitySettings {
    pub keys: Vec<IdentityKey>,
    pub claim: String,
    pub cookie: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Duration,
}

/// One identity-token verification key.
pub struct IdentityKey {
    pub kid: String,
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

impl std::fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityKey")
            .field("kid", &self.kid)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

pub struct SigningSettings {
    pub header: HeaderName,
    pub algorithm: Algorithm,
    pub key_id: String,
    pub key: EncodingKey,
    pub ttl: Duration,
    /// Ed25519 public keys backends may fetch (JWKS): the active one (EdDSA only) first, then
    /// `previous_keys`.
    pub published_keys: Vec<PublishedKey>,
    /// Signs waiting-room tickets (derived from the signing key: the same on every gateway).
    pub ticket_key: [u8; 32],
}

/// An Ed25519 verification key, by `kid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedKey {
    pub kid: String,
    pub public_key: [u8; 32],
}

impl std::fmt::Debug for SigningSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningSettings")
            .field("header", &self.header)
            .field("algorithm", &self.algorithm)
            .field("key_id", &self.key_id)
            .field("ttl", &self.ttl)
            .field("published_keys", &self.published_keys)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct RateLimitSettings {
    pub per_user: Option<Bucket>,
    pub per_ip: Option<Bucket>,
    pub per_activity: Option<Bucket>,
    pub evict_interval: Duration,
    /// The instance-wide cap on unreserved forwards while the store is down.
    pub passthrough: Quota,
}

/// `rate_limits.passthrough` when not configured: 100 per second, bursts of 100.
pub const DEFAULT_PASSTHROUGH_PER_SECOND: u32 = 100;

/// A token bucket's rate and burst, enforced or only counted (shadow).
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    pub quota: Quota,
    pub shadow: bool,
    /// Each gateway's own, or one for the fleet.
    pub scope: super::Scope,
}

#[derive(Debug)]
pub struct SoldOutCacheSettings {
    pub ttl: Duration,
}

/// One flash-sale activity.
#[derive(Debug, Clone)]
pub struct Activity {
    pub id: Arc<str>,
    pub stock: u64,
    pub version: u64,
    pub per_user_limit: NonZeroU32,
    pub max_per_request: NonZeroU32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub confirm: ConfirmMode,
    pub on_store_failure: StoreFailurePolicy,
    /// How long a reservation stays pending before it expires.
    pub hold: Duration,
    /// Segments the stock is split over (1: not segmented); fixed for the life of the
    /// activity's keys.
    pub segments: u32,
    /// The waiting room in front of the purchase, if any.
    pub queue: Option<QueueSettings>,
    /// The drop's variants (empty: the activity sells one stock). On such an activity `stock`
    /// is the sum of theirs; each variant sells from its own stock lane ([`Activities::lane`]).
    pub variants: Arc<[Variant]>,
    /// The variant this stock lane sells (`None`: the activity itself, or one without
    /// variants). Its `stock` is the variant's; every other field is the activity's.
    pub variant: Option<Arc<str>>,
    /// The stock lane's name in this process's memory (sold-out marks, refusals, news): the
    /// id, or `<id>~<variant>` for a variant's lane (`~` is in no id).
    pub lane: Arc<str>,
    /// The phases before the public sale (`starts_at`), in order (empty: none; the sale opens
    /// at `starts_at` for everyone).
    pub phases: Arc<[super::phases::Phase]>,
    /// The second-chance line's hold window (`None`: no line; a returned unit goes back on
    /// sale to whoever asks first).
    pub second_chance: Option<Duration>,
}

/// `activities[].variants[]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub id: Arc<str>,
    pub stock: u64,
    pub title: Option<String>,
}

/// `activities[].queue`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSettings {
    /// Tickets admitted per second, fleet-wide.
    pub admit_per_second: u32,
    /// When arrivals start queueing: `opens_at`, or `starts_at`. Arrivals before `starts_at`
    /// are shuffled at `starts_at`.
    pub opens_at: DateTime<Utc>,
    /// Seconds (of the queue's progress) an admitted ticket may buy before it lapses.
    pub admission_window: Duration,
    pub too_late_factor: f64,
    /// Where the waiting page sends a browser whose turn came; `None`: the page buys itself.
    pub landing_url: Option<String>,
    /// A proof of work before a ticket, if configured.
    pub challenge: Option<super::defence::ChallengeSettings>,
    /// Publish the draw's commitment and seed on the poll.
    pub draw: bool,
    /// The admission that follows live buyers (`skip_absent_after_secs`, `max_active`);
    /// `None`: the time-function cursor.
    pub stepped: Option<super::live_queue::Stepped>,
}

impl QueueSettings {
    /// Places the queue admits within one admission window at `rate` (the rate in force, which
    /// an operator may have changed): a ticket the cursor is further past than this has lapsed.
    pub fn window_places(&self, rate: u64) -> u64 {
        (self.admission_window.as_secs_f64() * rate as f64).ceil() as u64
    }
}

/// Most tickets admitted per second a queue may be configured with.
pub const MAX_ADMIT_PER_SECOND: u32 = 1_000_000;

/// Most segments one activity may have.
pub const MAX_SEGMENTS: u32 = 64;

/// Most variants one activity may have (each is a stock lane with its own keys, checks and
/// series: sizes and colours, not a catalogue).
pub const MAX_VARIANTS: usize = 64;

/// Largest `stock` and `version`: 2^53 - 1, the integers Lua (and JSON readers) hold exactly.
pub const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

impl Activity {
    /// The stock lane of one of this activity's variants (its stock, the rest the same).
    pub fn lane(&self, variant: &Variant) -> Activity {
        Activity {
            stock: variant.stock,
            variant: Some(variant.id.clone()),
            lane: Arc::from(format!("{}~{}", self.id, variant.id)),
            ..self.clone()
        }
    }

    /// Whether the activity sells variants (then a purchase names one).
    pub fn has_variants(&self) -> bool {
        !self.variants.is_empty()
    }

    /// Whether the stock is split over several segments.
    pub fn is_segmented(&self) -> bool {
        self.segments > 1
    }
}

/// Where an activity stands at a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleWindow {
    NotStarted,
    Open,
    Ended,
}

impl Activity {
    /// Whether the waiting room takes arrivals at `now` (from `opens_at` until `ends_at`).
    pub fn queue_open_at(&self, now: DateTime<Utc>) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|q| now >= q.opens_at && now < self.ends_at)
    }

    /// When a buyer arriving at `now`, before they may, may come back: the waiting room's
    /// opening if it has one still ahead, else the sale's start; `None` once either is past.
    pub fn opens_after(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let opens = self.queue.as_ref().map_or(self.opens(), |q| q.opens_at);
        (now < opens).then_some(opens)
    }

    /// When the sale opens to its first buyers: its first phase's start, else `starts_at`.
    /// Stock is prewarmed for it, the waiting room admits from it, and no reservation is made
    /// before it.
    pub fn opens(&self) -> DateTime<Utc> {
        self.phases.first().map_or(self.starts_at, |p| p.starts_at)
    }

    /// Whether the activity sells in phases before its public start.
    pub fn has_phases(&self) -> bool {
        !self.phases.is_empty()
    }

    /// Where the sale stands at `now` (open from [`Activity::opens`], for someone).
    pub fn window_at(&self, now: DateTime<Utc>) -> SaleWindow {
        if now < self.opens() {
            SaleWindow::NotStarted
        } else if now >= self.ends_at {
            SaleWindow::Ended
        } else {
            SaleWindow::Open
        }
    }
}

/// The configured activities, by id and in file order.
#[derive(Debug, Default)]
pub struct Activities {
    pub(super) ordered: Vec<Arc<Activity>>,
    pub(super) by_id: HashMap<Arc<str>, Arc<Activity>>,
    /// Every stock lane: each activity without variants, and each variant of the others.
    pub(super) lanes: Vec<Arc<Activity>>,
}

impl Activities {
    pub fn get(&self, id: &str) -> Option<&Arc<Activity>> {
        self.by_id.get(id)
    }

    /// The stock lane of `variant` of activity `id` (`None` for variant: the activity's own,
    /// when it has no variants).
    pub fn lane(&self, id: &str, variant: Option<&str>) -> Option<&Arc<Activity>> {
        match variant {
            None => self.get(id).filter(|a| a.variants.is_empty()),
            Some(v) => self
                .lanes
                .iter()
                .find(|l| &*l.id == id && l.variant.as_deref() == Some(v)),
        }
    }

    /// Every stock lane, in the configuration's order: what prewarm, sweeps, fences,
    /// reconcile and the stock gauges walk.
    pub fn lanes(&self) -> impl Iterator<Item = &Arc<Activity>> {
        self.lanes.iter()
    }

    /// The stock lane of `variant` of activity `id` whether the configuration still sells it or
    /// not: a removed variant, or the activity's own lane from before it gained variants (or a
    /// variant's, after it lost them), for reading and settling what Redis still holds of it
    /// (its stock is 0: nothing of it is put on sale).
    pub fn lane_or_former(&self, id: &str, variant: Option<&str>) -> Option<Arc<Activity>> {
        if let Some(lane) = self.lane(id, variant) {
            return Some(lane.clone());
        }
        let activity = self.get(id)?;
        Some(Arc::new(Activity {
            stock: 0,
            variant: variant.map(Arc::from),
            lane: match variant {
                Some(v) => Arc::from(format!("{id}~{v}")),
                None => activity.id.clone(),
            },
            ..Activity::clone(activity)
        }))
    }

    /// The stock lane named `lane` ([`Activity::lane`]).
    pub fn lane_named(&self, lane: &str) -> Option<&Arc<Activity>> {
        self.lanes.iter().find(|l| &*l.lane == lane)
    }

    /// The stock lanes of one activity: itself, or each of its variants.
    pub fn lanes_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Arc<Activity>> + 'a {
        self.lanes.iter().filter(move |l| &*l.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Activity>> {
        self.ordered.iter()
    }

    pub fn len(&self) -> usize {
        self.ordered.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }
}

pub use super::naming::{variant_id, MAX_ACTIVITY_ID_LEN};
