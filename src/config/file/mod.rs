//! The YAML shape SREs edit, exactly as written in the file.
//!
//! Nothing here is trusted: [`crate::config::validate`] turns it into [`crate::config::Settings`]. Every struct
//! denies unknown fields so a typo is an error, not a silently ignored key.

use schemars::JsonSchema;
use serde::Deserialize;
use std::path::PathBuf;

mod activity;
pub use activity::*;

/// The whole configuration file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The public proxy listener.
    pub server: ServerSection,
    /// The admin listener (/metrics, /healthz, /readyz, /v1/*).
    pub admin: AdminSection,
    /// The shop backend the winners (and all other routes) are forwarded to.
    pub upstream: UpstreamSection,
    /// The stock store.
    pub redis: RedisSection,
    /// How the buyer is identified.
    pub identity: IdentitySection,
    /// How the reservation handed to the upstream is signed.
    pub signing: SigningSection,
    /// Token buckets applied before any Redis call.
    #[serde(default)]
    pub rate_limits: RateLimitsSection,
    /// The local "sold out" pre-check.
    #[serde(default)]
    pub sold_out_cache: SoldOutCacheSection,
    /// Which requests are purchase attempts. Everything else passes through unchanged.
    #[serde(default)]
    pub sale_routes: Vec<SaleRouteSection>,
    /// The flash-sale activities.
    #[serde(default)]
    pub activities: Vec<ActivitySection>,
    /// The buyer's pages: the shop's name and link, templates of your own.
    #[serde(default)]
    pub pages: Option<crate::config::pages::PagesSection>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address of the public listener, `host:port`.
    pub listen: String,
    /// Worker threads of the proxy (match the machine's cores).
    #[serde(default = "default_threads")]
    #[schemars(range(min = 1))]
    pub threads: usize,
    /// On SIGTERM (or after a SIGQUIT hand-over): seconds in-flight requests get to finish;
    /// the process exits after it. Listeners close at once; sale requests still arriving on
    /// open connections take reservations only while the rest of the grace period covers a
    /// whole trip, then get `unavailable`. Default: a queued winner's whole trip (store timeout +
    /// max queue wait + upstream connect + read timeout), rounded up, plus one second.
    #[serde(default)]
    pub grace_period_secs: Option<u64>,
    /// On SIGTERM: seconds in-flight requests get to finish after the grace period.
    #[serde(default = "default_shutdown_timeout_secs")]
    pub shutdown_timeout_secs: u64,
    /// Largest request body a sale route accepts (bytes, at most 65536); larger ones get
    /// `bad_request`. A sale request's body is read whole before any stock is taken.
    #[serde(default = "default_max_sale_body_bytes")]
    #[schemars(range(max = 65536))]
    pub max_sale_body_bytes: u64,
    /// Longest a sale request's body may take to arrive, after its headers; past it the buyer
    /// gets `bad_request` and nothing was held for them (a slow body cannot hold stock or a slot).
    #[serde(default = "default_sale_body_timeout_ms")]
    pub sale_body_timeout_ms: u64,
    /// Largest total of header names and values a sale request may carry (bytes).
    #[serde(default = "default_max_sale_header_bytes")]
    pub max_sale_header_bytes: u64,
    /// Largest request body another route (not a sale route) may send (bytes). The gateway reads
    /// such a body whole before the backend sees the request (a slow body holds no backend
    /// worker); larger ones get 413.
    #[serde(default = "default_max_passthrough_body_bytes")]
    pub max_passthrough_body_bytes: u64,
    /// Longest another route's request body may take to arrive, after its headers; past it the
    /// client gets 408 and the backend never saw the request.
    #[serde(default = "default_passthrough_body_timeout_ms")]
    pub passthrough_body_timeout_ms: u64,
    /// Most bytes of other routes' bodies the gateway holds at once, over every connection;
    /// past it a body's client gets 503 (so many large bodies cannot exhaust its memory).
    #[serde(default = "default_max_passthrough_buffered_bytes")]
    pub max_passthrough_buffered_bytes: u64,
    /// How often the configuration file is checked for changes (reloaded when its content
    /// changed); 0 turns the check off (SIGHUP and the admin API still reload).
    #[serde(default = "default_reload_watch_interval_ms")]
    pub reload_watch_interval_ms: u64,
    /// Unix socket through which a running gateway hands its listening sockets to a new
    /// binary (`flashgate serve --upgrade`, then SIGQUIT to the old process within about 6 s,
    /// Pingora 0.9's fixed wait: 5 retries a second apart). Relative paths
    /// are resolved against the configuration file's directory. Default:
    /// `/tmp/flashgate-upgrade-<listen port>.sock`.
    #[serde(default)]
    pub upgrade_sock: Option<String>,
    /// Browsers on other origins (`server.cors.allowed_origins`); absent: none allowed.
    #[serde(default)]
    pub cors: Option<crate::config::cors::CorsSection>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Address of the admin listener, `host:port`; loopback unless a token is configured.
    #[serde(default = "default_admin_listen")]
    pub listen: String,
    /// Environment variable holding the bearer token for `/v1/*`.
    #[serde(default)]
    pub token_env: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Backend addresses, `host:port`; round robin over the healthy ones.
    #[schemars(length(min = 1))]
    pub addresses: Vec<String>,
    /// TCP connect timeout to a backend.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Longest wait for a backend's response (between reads).
    #[serde(default = "default_read_timeout_ms")]
    pub read_timeout_ms: u64,
    /// How often each backend is TCP health-checked.
    #[serde(default = "default_health_check_interval_ms")]
    pub health_check_interval_ms: u64,
    /// Most sale requests (winners and passthroughs) at the backend at once; more wait in a
    /// FIFO. Absent: no limit.
    #[serde(default)]
    pub max_inflight: Option<usize>,
    /// Longest a winner waits in that FIFO; past it they get `unavailable` (with their queue
    /// position and an estimated wait) and their reservation is released.
    #[serde(default = "default_max_queue_wait_ms")]
    pub max_queue_wait_ms: u64,
    /// Most requests of other routes (not sale routes) at the backend at once, so that they
    /// never take the backend's workers that winners need (set it to the backend's workers minus
    /// `max_inflight`); more get 503 at once. Absent: no limit.
    #[serde(default)]
    pub max_passthrough_inflight: Option<usize>,
    /// Ask the backend whether it holds an order before its reservation expires unconfirmed.
    #[serde(default)]
    pub order_lookup: Option<OrderLookupSection>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderLookupSection {
    /// Path of the backend's order lookup, with `{jti}` where the reservation id goes:
    /// `GET <path>` answers 200 (it holds the order: confirmed) or 404 (it does not: released);
    /// anything else, or nothing, leaves the reservation pending and asks again later.
    pub path: String,
    /// Longest wait for one lookup's answer.
    #[serde(default = "default_order_lookup_timeout_ms")]
    pub timeout_ms: u64,
    /// How long after an unanswered lookup the same reservation is asked about again.
    #[serde(default = "default_order_lookup_retry_interval_ms")]
    pub retry_interval_ms: u64,
    /// When set: a reservation whose lookups went unanswered this long after its hold deadline
    /// is released as expired (units may then sell twice if the backend did hold the order).
    /// Absent: it stays pending, asked again every `retry_interval_ms`, until answered.
    #[serde(default)]
    pub give_up_after_secs: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// A single Redis, e.g. `redis://127.0.0.1:6379/0`.
    #[serde(default)]
    pub url: Option<String>,
    /// A Redis Cluster instead of `url`: `{ nodes: ["host:port", ...] }` (some of its masters).
    #[serde(default)]
    pub cluster: Option<ClusterSection>,
    /// Budget for one stock-store call (connect, script, reply); past it the buyer gets 503.
    #[serde(default = "default_redis_timeout_ms")]
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
    /// Prefix of every key flashgate writes.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Stock keys live until the activity's `ends_at` plus this long.
    #[serde(default = "default_key_ttl_after_end_secs")]
    pub key_ttl_after_end_secs: u64,
    /// How often each instance makes sure the stock keys exist (created once, never reset) and
    /// refreshes the stock gauge.
    #[serde(default = "default_prewarm_interval_ms")]
    pub prewarm_interval_ms: u64,
    /// How often each instance releases pending reservations past their hold deadline.
    #[serde(default = "default_sweep_interval_ms")]
    pub sweep_interval_ms: u64,
    /// Most reservations one sweep script call releases (1 to 1000; keeps each call short).
    #[serde(default = "default_sweep_batch")]
    #[schemars(range(min = 1, max = 1000))]
    pub sweep_batch: u32,
    /// How often each instance checks the stock ledger and exports `flashgate_reconcile_drift`
    /// and `flashgate_units_held_in_doubt`.
    #[serde(default = "default_reconcile_interval_ms")]
    pub reconcile_interval_ms: u64,
    /// Approximate cap on entries of each activity's event stream (XADD MAXLEN ~).
    #[serde(default = "default_events_maxlen")]
    pub events_maxlen: u64,
    /// The circuit breaker in front of the store on the buyer's path.
    #[serde(default)]
    pub breaker: BreakerSection,
    /// Sell on a Redis whose `maxmemory-policy` may evict keys (anything but `noeviction`).
    /// Off by default: an evicted key forgets what was sold, and such a Redis is refused for
    /// selling (`/readyz` 503 naming the policy) unless this says the risk is taken.
    #[serde(default)]
    pub allow_eviction: bool,
    /// Replicas each write deciding a unit's fate must reach (Redis `WAIT`): the winner's
    /// reservation before the winner is answered, and every confirm, release and expiry. 0
    /// (default) waits for none. A reserve batch not acknowledged within `timeout_ms` is
    /// released and answered 503; a confirm or release not acknowledged changes nothing for
    /// the buyer (the backend took the order) but is logged, counted
    /// (`flashgate_redis_unacknowledged_writes_total`) and sent again until acknowledged. With
    /// it covering every replica, a promoted replica sells again by itself only when no
    /// gateway reported such a write since its fence began (in memory: a gateway restarted
    /// meanwhile forgets its own).
    #[serde(default)]
    #[schemars(range(max = 16))]
    pub ack_replicas: u32,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BreakerSection {
    /// Store calls failing in a row (errors or timeouts) that open the breaker.
    #[serde(default = "default_breaker_failures")]
    pub consecutive_failures: u32,
    /// How long the breaker stays open (buyers answered at once) before one probe call.
    #[serde(default = "default_breaker_open_ms")]
    pub open_ms: u64,
}

impl Default for BreakerSection {
    fn default() -> Self {
        Self {
            consecutive_failures: default_breaker_failures(),
            open_ms: default_breaker_open_ms(),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Seed nodes, `host:port`; the rest of the cluster is discovered from them.
    pub nodes: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentitySection {
    /// Request header carrying the buyer's user id (set by the auth layer in front).
    #[serde(default)]
    pub header: Option<String>,
    /// CIDRs (or addresses) of the proxies in front: when set, the identity header counts only
    /// from these peers, and the client address for `per_ip` is taken from `X-Forwarded-For`.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Verify a bearer token instead of trusting a header.
    #[serde(default)]
    pub jwt: Option<JwtIdentitySection>,
    /// More headers that carry an identity an auth proxy vouched for, removed (under any
    /// spelling) from every request of a peer that is not in `trusted_proxies`, on every route,
    /// beside the built-in list (oauth2-proxy, Authelia, authentik, Pomerium, IAP, ALB,
    /// Cloudflare Access, Azure, client certificates); a trailing `*` matches a prefix
    /// (`X-Corp-Auth-*`).
    #[serde(default)]
    pub strip_headers: Vec<String>,
    /// Believe `header` from any peer although `server.listen` is reachable from other hosts
    /// and no `trusted_proxies` are set: anyone who reaches the gateway can then buy as anyone.
    /// Only for a gateway behind something that strips the header; said as a warning at every
    /// start and by `flashgate check`.
    #[serde(default)]
    pub header_from_any_peer: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtIdentitySection {
    /// Verification keys, chosen by the token's `kid`.
    pub keys: Vec<IdentityKeySection>,
    /// Claim holding the user id.
    #[serde(default = "default_identity_claim")]
    pub claim: String,
    /// Also read the token from this cookie when there is no `Authorization: Bearer` header.
    #[serde(default)]
    pub cookie: Option<String>,
    /// Required `iss`, if set.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Required `aud`, if set.
    #[serde(default)]
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    #[serde(default = "default_identity_leeway_secs")]
    pub leeway_secs: u64,
}

/// Algorithms accepted for buyers' identity tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum IdentityAlgorithm {
    HS256,
    RS256,
    EdDSA,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentityKeySection {
    /// The `kid` tokens signed with this key carry.
    pub kid: String,
    /// How tokens with this `kid` are signed: `HS256` (a shared secret, `secret_env`), `RS256`
    /// or `EdDSA` (a public key, `public_key_file`).
    pub algorithm: IdentityAlgorithm,
    /// HS256: environment variable holding the shared secret.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// RS256 or EdDSA: PEM file with the public key.
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
}

/// Signature algorithms for the reservation JWT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum SigningAlgorithm {
    /// HMAC-SHA256 with a shared secret from `secret_env`.
    HS256,
    /// Ed25519 with the PKCS#8 PEM private key at `private_key_file`.
    EdDSA,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SigningSection {
    /// Request header the upstream receives the signed reservation in.
    pub header: String,
    /// Signature algorithm.
    pub algorithm: SigningAlgorithm,
    /// `kid` put in the JWT header so backends can pick the verification key.
    pub key_id: String,
    /// Environment variable holding the HS256 secret.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// PKCS#8 PEM file holding the EdDSA (Ed25519) private key.
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// Lifetime of a reservation token: `exp = iat + ttl_secs`.
    #[schemars(range(min = 1))]
    pub ttl_secs: u64,
    /// EdDSA public keys that signed earlier reservations (after a rotation), published with the
    /// active one at `/.well-known/jwks.json` until their reservations have expired.
    #[serde(default)]
    pub previous_keys: Vec<PreviousKeySection>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviousKeySection {
    /// The `kid` those reservations carry.
    pub kid: String,
    /// PEM file with the Ed25519 public key.
    pub public_key_file: PathBuf,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsSection {
    /// Token bucket per user id; absent means no per-user limit.
    #[serde(default)]
    pub per_user: Option<BucketSection>,
    /// Token bucket per client IP, checked before any identity work.
    #[serde(default)]
    pub per_ip: Option<BucketSection>,
    /// One bucket per activity: the most admissions per second that may reach Redis.
    #[serde(default)]
    pub per_activity: Option<BucketSection>,
    /// How often idle buckets (full again, so indistinguishable from new) are dropped.
    #[serde(default = "default_evict_interval_ms")]
    pub evict_interval_ms: u64,
    /// One bucket for the whole instance: most sale requests per second forwarded unreserved
    /// while the store is down (activities with `on_store_failure: passthrough`).
    #[serde(default)]
    pub passthrough: Option<BucketSection>,
}

impl Default for RateLimitsSection {
    fn default() -> Self {
        Self {
            per_user: None,
            per_ip: None,
            per_activity: None,
            evict_interval_ms: default_evict_interval_ms(),
            passthrough: None,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketSection {
    /// Sustained requests per second (or give `per_minute` or `per_hour`: exactly one).
    #[serde(default)]
    pub per_second: Option<u32>,
    /// Sustained requests per minute (`6`: one every 10 s).
    #[serde(default)]
    pub per_minute: Option<u32>,
    /// Sustained requests per hour.
    #[serde(default)]
    pub per_hour: Option<u32>,
    /// Requests allowed at once from a full bucket.
    pub burst: u32,
    /// Count what this bucket would refuse, but admit it (to try a limit out before enforcing).
    #[serde(default)]
    pub shadow: bool,
    /// `instance` (each gateway its own bucket) or `fleet` (one for all gateways together;
    /// per_user and per_ip only).
    #[serde(default)]
    pub scope: crate::config::Scope,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SoldOutCacheSection {
    /// How long a learned "sold out" is answered locally before Redis is asked again.
    #[serde(default = "default_sold_out_ttl_ms")]
    pub ttl_ms: u64,
}

impl Default for SoldOutCacheSection {
    fn default() -> Self {
        Self {
            ttl_ms: default_sold_out_ttl_ms(),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SaleRouteSection {
    /// HTTP method of the purchase request.
    pub method: String,
    /// Path template; one segment must be `{activity}`; one may be `{variant}` (the variant
    /// of an activity with variants).
    pub path: String,
    /// Query parameter holding the quantity; absent means 1.
    #[serde(default = "default_quantity_query")]
    pub quantity_query: String,
    /// Query parameter naming the variant bought (`?variant=42`), for activities with
    /// variants; a path with `{variant}` names it instead.
    #[serde(default)]
    pub variant_query: Option<String>,
    /// Other methods on the route's path forwarded to the backend unreserved (`[GET]`: a
    /// product page at the purchase's path, say). Any other method on that path is answered
    /// 405 with `Allow`; none by default.
    #[serde(default)]
    pub forward_methods: Vec<String>,
}

fn default_admin_listen() -> String {
    "127.0.0.1:9091".to_owned()
}
fn default_max_passthrough_body_bytes() -> u64 {
    8 * 1024 * 1024
}
fn default_max_passthrough_buffered_bytes() -> u64 {
    64 * 1024 * 1024
}
fn default_passthrough_body_timeout_ms() -> u64 {
    30_000
}
fn default_max_sale_body_bytes() -> u64 {
    16 * 1024
}
fn default_sale_body_timeout_ms() -> u64 {
    3000
}
fn default_max_sale_header_bytes() -> u64 {
    16 * 1024
}
fn default_reload_watch_interval_ms() -> u64 {
    1000
}
fn default_max_queue_wait_ms() -> u64 {
    2000
}
fn default_order_lookup_timeout_ms() -> u64 {
    500
}
fn default_order_lookup_retry_interval_ms() -> u64 {
    5000
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_breaker_open_ms() -> u64 {
    1000
}
fn default_identity_claim() -> String {
    "sub".to_owned()
}
fn default_identity_leeway_secs() -> u64 {
    5
}
fn default_threads() -> usize {
    2
}
fn default_shutdown_timeout_secs() -> u64 {
    10
}
fn default_connect_timeout_ms() -> u64 {
    1000
}
fn default_read_timeout_ms() -> u64 {
    5000
}
fn default_health_check_interval_ms() -> u64 {
    1000
}
fn default_redis_timeout_ms() -> u64 {
    50
}
fn default_key_prefix() -> String {
    "fg".to_owned()
}
fn default_key_ttl_after_end_secs() -> u64 {
    24 * 3600
}
fn default_prewarm_interval_ms() -> u64 {
    5000
}
fn default_sweep_interval_ms() -> u64 {
    1000
}
fn default_sweep_batch() -> u32 {
    100
}
fn default_reconcile_interval_ms() -> u64 {
    10_000
}
fn default_events_maxlen() -> u64 {
    100_000
}
fn default_evict_interval_ms() -> u64 {
    10_000
}
fn default_sold_out_ttl_ms() -> u64 {
    1000
}
fn default_quantity_query() -> String {
    "qty".to_owned()
}
