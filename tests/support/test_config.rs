//! The gateway configuration of a test, typed: tests set values by name (builder methods on
//! [`TestConfig`] and [`TestActivity`]) and [`TestConfig::to_yaml`] serialises the whole with
//! serde_yaml. Options a test leaves unset (`None`) are left out of the YAML, so the gateway's
//! defaults apply.

use super::{free_port, RedisServer, Upstream, ADMIN_TOKEN, SIGNING_SECRET};
use serde::Serialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;

/// An activity's `queue:` section (the waiting room).
#[derive(Clone, Debug, Serialize)]
pub struct Queue {
    pub admit_per_second: u32,
    pub admission_window_secs: Option<u64>,
    /// RFC 3339.
    pub opens_at: Option<String>,
    pub skip_absent_after_secs: Option<u64>,
    pub max_active: Option<u32>,
    /// `challenge:` (proof of work before a ticket), as YAML.
    pub challenge: Option<Value>,
    /// `draw: true`: publish the draw's commitment and seed.
    pub draw: Option<bool>,
}

impl Queue {
    /// A waiting room admitting `per_second` tickets a second.
    pub fn admit(per_second: u32) -> Self {
        Queue {
            admit_per_second: per_second,
            admission_window_secs: None,
            opens_at: None,
            skip_absent_after_secs: None,
            max_active: None,
            challenge: None,
            draw: None,
        }
    }

    /// The admission that follows live buyers: a ticket not polled for `secs` gives its turn.
    pub fn skip_absent_after_secs(mut self, secs: u64) -> Self {
        self.skip_absent_after_secs = Some(secs);
        self
    }

    /// At most `n` admitted buyers who have not bought, fleet-wide.
    pub fn max_active(mut self, n: u32) -> Self {
        self.max_active = Some(n);
        self
    }

    /// A proof of work before a ticket: `challenge: <yaml>` (e.g. `{"max_number": 1000}`).
    pub fn challenge(mut self, yaml: Value) -> Self {
        self.challenge = Some(yaml);
        self
    }

    /// `draw: true`.
    pub fn draw(mut self) -> Self {
        self.draw = Some(true);
        self
    }

    pub fn window_secs(mut self, secs: u64) -> Self {
        self.admission_window_secs = Some(secs);
        self
    }

    pub fn opens_at(mut self, at: &str) -> Self {
        self.opens_at = Some(at.to_owned());
        self
    }
}

/// One activity of a test configuration.
#[derive(Clone, Debug, Serialize)]
pub struct TestActivity {
    pub id: &'static str,
    pub stock: u64,
    pub version: u64,
    pub per_user_limit: u32,
    pub max_per_request: u32,
    pub starts_at: &'static str,
    pub ends_at: &'static str,
    /// `upstream` (default) or `explicit`.
    pub confirm: Option<&'static str>,
    pub hold_secs: Option<u64>,
    pub segments: Option<u32>,
    /// `reject` (default) or `passthrough`.
    pub on_store_failure: Option<&'static str>,
    pub queue: Option<Queue>,
}

impl TestActivity {
    /// On sale from 2020 to 2099, one unit a buyer.
    pub fn open(id: &'static str, stock: u64) -> Self {
        TestActivity {
            id,
            stock,
            version: 1,
            per_user_limit: 1,
            max_per_request: 1,
            starts_at: "2020-01-01T00:00:00Z",
            ends_at: "2099-01-01T00:00:00Z",
            confirm: None,
            hold_secs: None,
            segments: None,
            on_store_failure: None,
            queue: None,
        }
    }

    /// Reservations stay pending until the admin API confirms them, and expire after `hold_secs`.
    pub fn explicit(id: &'static str, stock: u64, hold_secs: u64) -> Self {
        TestActivity::open(id, stock).confirm_explicit(hold_secs)
    }

    pub fn confirm_explicit(mut self, hold_secs: u64) -> Self {
        self.confirm = Some("explicit");
        self.hold_secs = Some(hold_secs);
        self
    }

    pub fn version(mut self, version: u64) -> Self {
        self.version = version;
        self
    }

    pub fn per_user_limit(mut self, units: u32) -> Self {
        self.per_user_limit = units;
        self
    }

    pub fn max_per_request(mut self, units: u32) -> Self {
        self.max_per_request = units;
        self
    }

    /// A buyer may hold `units`, and ask for them all in one request.
    pub fn limit(self, units: u32) -> Self {
        self.per_user_limit(units).max_per_request(units)
    }

    pub fn hold_secs(mut self, secs: u64) -> Self {
        self.hold_secs = Some(secs);
        self
    }

    pub fn segments(mut self, segments: u32) -> Self {
        self.segments = Some(segments);
        self
    }

    /// The sale's hours (RFC 3339, see [`super::from_now`]).
    pub fn hours(mut self, starts_at: &'static str, ends_at: &'static str) -> Self {
        self.starts_at = starts_at;
        self.ends_at = ends_at;
        self
    }

    pub fn starts_at(mut self, at: &'static str) -> Self {
        self.starts_at = at;
        self
    }

    pub fn ends_at(mut self, at: &'static str) -> Self {
        self.ends_at = at;
        self
    }

    /// Opened three hours ago, closed ten minutes ago.
    pub fn ended(self) -> Self {
        self.hours(
            super::from_now(chrono::Duration::hours(-3)),
            super::from_now(chrono::Duration::minutes(-10)),
        )
    }

    /// Opens in an hour, for four hours.
    pub fn opening_in_an_hour(self) -> Self {
        self.hours(
            super::from_now(chrono::Duration::hours(1)),
            super::from_now(chrono::Duration::hours(5)),
        )
    }

    /// `on_store_failure: passthrough`: forwarded unreserved while the store is down.
    pub fn passthrough_on_store_failure(mut self) -> Self {
        self.on_store_failure = Some("passthrough");
        self
    }

    pub fn queue(mut self, queue: Queue) -> Self {
        self.queue = Some(queue);
        self
    }
}

/// A token bucket of `rate_limits:`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
    pub shadow: Option<bool>,
    /// `instance` or `fleet` (unset: the default, instance).
    pub scope: Option<&'static str>,
}

impl Rate {
    pub fn new(per_second: u32, burst: u32) -> Self {
        Rate {
            per_second,
            burst,
            shadow: None,
            scope: None,
        }
    }

    /// One bucket for all gateways together (`scope: fleet`).
    pub fn fleet(mut self) -> Self {
        self.scope = Some("fleet");
        self
    }

    /// Counts what it would refuse, but admits.
    pub fn shadow(mut self) -> Self {
        self.shadow = Some(true);
        self
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RateLimits {
    /// Replaces the per-user bucket `TestConfig::per_user` gives, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_user: Option<Rate>,
    pub per_ip: Option<Rate>,
    pub per_activity: Option<Rate>,
    pub passthrough: Option<Rate>,
}

/// `upstream.order_lookup`: the backend asked about a hold before it runs out.
#[derive(Clone, Debug, Serialize)]
pub struct OrderLookup {
    pub path: &'static str,
    pub timeout_ms: u64,
    pub retry_interval_ms: u64,
}

impl OrderLookup {
    /// `GET /orders/{jti}` at the backend.
    pub fn new(timeout_ms: u64, retry_interval_ms: u64) -> Self {
        OrderLookup {
            path: "/orders/{jti}",
            timeout_ms,
            retry_interval_ms,
        }
    }
}

/// Options of `server:` a test may set (the rest is fixed by [`TestConfig::to_yaml`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerOptions {
    pub sale_body_timeout_ms: Option<u64>,
    pub reload_watch_interval_ms: Option<u64>,
    pub grace_period_secs: Option<u64>,
    pub upgrade_sock: Option<PathBuf>,
    pub max_passthrough_body_bytes: Option<u64>,
    pub max_passthrough_buffered_bytes: Option<u64>,
    /// `server.cors`.
    pub cors: Option<Value>,
    /// `server.threads` (2 when unset).
    pub threads: Option<u32>,
}

/// Options of `upstream:` a test may set.
#[derive(Clone, Debug, Default, Serialize)]
pub struct UpstreamOptions {
    pub order_lookup: Option<OrderLookup>,
    pub max_inflight: Option<u32>,
    pub max_queue_wait_ms: Option<u64>,
    pub max_passthrough_inflight: Option<u32>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Breaker {
    pub consecutive_failures: u32,
    pub open_ms: u64,
}

/// Options of `redis:` a test may set.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RedisOptions {
    pub prewarm_interval_ms: Option<u64>,
    pub key_ttl_after_end_secs: Option<u64>,
    pub breaker: Option<Breaker>,
}

/// A key of `identity.jwt.keys`.
#[derive(Clone, Debug, Serialize)]
pub struct JwtKey {
    pub kid: &'static str,
    pub algorithm: &'static str,
    pub secret_env: &'static str,
}

/// `identity.jwt`: the buyer is the subject of a signed token in a cookie.
#[derive(Clone, Debug, Serialize)]
pub struct Jwt {
    pub keys: Vec<JwtKey>,
    pub cookie: Option<&'static str>,
    pub issuer: Option<&'static str>,
}

impl Jwt {
    /// HS256 tokens of the provider `idp1` (its secret in `FLASHGATE_IDENTITY_SECRET`), in the
    /// cookie `session`.
    pub fn session_cookie() -> Self {
        Jwt {
            keys: vec![JwtKey {
                kid: "idp1",
                algorithm: "HS256",
                secret_env: "FLASHGATE_IDENTITY_SECRET",
            }],
            cookie: Some("session"),
            issuer: None,
        }
    }

    pub fn issuer(mut self, issuer: &'static str) -> Self {
        self.issuer = Some(issuer);
        self
    }
}

/// `identity:`: a header the buyer's id comes in (from trusted proxies), or a JWT.
#[derive(Clone, Debug, Serialize)]
pub struct Identity {
    pub header: Option<&'static str>,
    pub trusted_proxies: Option<Vec<&'static str>>,
    pub jwt: Option<Jwt>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub strip_headers: Vec<&'static str>,
}

/// A gateway configuration for tests, rendered to YAML.
#[derive(Clone)]
pub struct TestConfig {
    pub redis_url: String,
    /// Seed nodes of a Redis Cluster, used instead of `redis_url` when set.
    pub redis_cluster: Option<Vec<String>>,
    pub upstreams: Vec<SocketAddr>,
    pub activities: Vec<TestActivity>,
    /// (per_second, burst)
    pub per_user: Option<(u32, u32)>,
    pub sold_out_ttl_ms: u64,
    pub redis_timeout_ms: u64,
    pub read_timeout_ms: u64,
    pub listen_port: u16,
    pub admin_port: u16,
    /// Sign with EdDSA using this PKCS#8 PEM instead of HS256.
    pub eddsa_key_file: Option<PathBuf>,
    pub sweep_interval_ms: u64,
    pub identity: Identity,
    pub rate_limits: RateLimits,
    pub server: ServerOptions,
    pub upstream: UpstreamOptions,
    pub redis: RedisOptions,
    /// Values set at JSON-pointer paths of the YAML last (`/pages`, `/activities/0/title`).
    pub patches: Vec<(String, Value)>,
}

impl TestConfig {
    pub fn new(redis: &RedisServer, upstream: &Upstream, activities: Vec<TestActivity>) -> Self {
        Self::at(redis.url(), upstream.addr, activities)
    }

    /// A configuration for this Redis and this backend, on ports of its own.
    pub fn at(redis_url: String, upstream: SocketAddr, activities: Vec<TestActivity>) -> Self {
        // Waiting-room polls spend from the buyer's bucket, and the queue tests poll far faster
        // than a buyer's page (every 20 ms while they wait for a state): a roomier bucket there.
        let per_user = if activities.iter().any(|a| a.queue.is_some()) {
            (100, 100)
        } else {
            (5, 5)
        };
        TestConfig {
            redis_url,
            redis_cluster: None,
            upstreams: vec![upstream],
            activities,
            per_user: Some(per_user),
            sold_out_ttl_ms: 1000,
            redis_timeout_ms: 1000,
            read_timeout_ms: 5000,
            listen_port: free_port(),
            admin_port: free_port(),
            eddsa_key_file: None,
            sweep_interval_ms: 100,
            identity: Identity {
                header: Some("X-User-Id"),
                trusted_proxies: None,
                strip_headers: vec![],
                jwt: None,
            },
            rate_limits: RateLimits::default(),
            server: ServerOptions::default(),
            upstream: UpstreamOptions::default(),
            redis: RedisOptions::default(),
            patches: Vec::new(),
        }
    }

    /// Sets `value` at `pointer` (a JSON pointer into the YAML: `/pages/shop_name`); the
    /// mapping it goes in must exist, but for the last key.
    pub fn set(mut self, pointer: &str, value: Value) -> Self {
        self.patches.push((pointer.to_owned(), value));
        self
    }

    /// The same configuration on new ports (for another gateway beside this one's, or after it).
    pub fn on_new_ports(mut self) -> Self {
        self.listen_port = free_port();
        self.admin_port = free_port();
        self
    }

    /// No per-user rate limit.
    pub fn no_per_user_rate(mut self) -> Self {
        self.per_user = None;
        self
    }

    pub fn per_user_rate(mut self, per_second: u32, burst: u32) -> Self {
        self.per_user = Some((per_second, burst));
        self
    }

    /// Stock in a Redis Cluster seeded by `nodes`, instead of the single Redis.
    pub fn cluster(mut self, nodes: Vec<String>) -> Self {
        self.redis_cluster = Some(nodes);
        self
    }

    pub fn breaker(mut self, consecutive_failures: u32, open_ms: u64) -> Self {
        self.redis.breaker = Some(Breaker {
            consecutive_failures,
            open_ms,
        });
        self
    }

    /// `server.max_passthrough_body_bytes` and `server.max_passthrough_buffered_bytes`.
    pub fn passthrough_body_bytes(mut self, each: u64, buffered: u64) -> Self {
        self.server.max_passthrough_body_bytes = Some(each);
        self.server.max_passthrough_buffered_bytes = Some(buffered);
        self
    }

    /// `server.cors.allowed_origins`.
    pub fn cors_origins(mut self, origins: &[&str]) -> Self {
        self.server.cors = Some(json!({ "allowed_origins": origins }));
        self
    }

    /// The buyer's id header is believed from these proxies only.
    pub fn trusted_proxies(mut self, cidrs: &[&'static str]) -> Self {
        self.identity.trusted_proxies = Some(cidrs.to_vec());
        self
    }

    /// More identity headers stripped from untrusted peers (`identity.strip_headers`).
    pub fn strip_headers(mut self, names: &[&'static str]) -> Self {
        self.identity.strip_headers = names.to_vec();
        self
    }

    /// The buyer is the subject of a JWT (no id header).
    pub fn jwt_identity(mut self, jwt: Jwt) -> Self {
        self.identity.header = None;
        self.identity.jwt = Some(jwt);
        self
    }

    pub fn to_yaml(&self) -> String {
        let redis_at = match &self.redis_cluster {
            Some(nodes) => json!({ "cluster": { "nodes": nodes } }),
            None => json!({ "url": self.redis_url }),
        };
        let signing_key = match &self.eddsa_key_file {
            Some(path) => json!({ "algorithm": "EdDSA", "private_key_file": path }),
            None => json!({ "algorithm": "HS256", "secret_env": "FLASHGATE_SIGNING_SECRET" }),
        };
        let per_user = self
            .per_user
            .map(|(per_second, burst)| Rate::new(per_second, burst));
        let mut doc = json!({
            "server": with(
                json!({ "listen": format!("127.0.0.1:{}", self.listen_port), "threads": 2 }),
                &self.server,
            ),
            "admin": {
                "listen": format!("127.0.0.1:{}", self.admin_port),
                "token_env": "FLASHGATE_ADMIN_TOKEN",
            },
            "upstream": with(
                json!({
                    "addresses": self.upstreams.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                    "connect_timeout_ms": 500,
                    "read_timeout_ms": self.read_timeout_ms,
                    "health_check_interval_ms": 200,
                }),
                &self.upstream,
            ),
            "redis": with(
                with(
                    redis_at,
                    &json!({
                        "timeout_ms": self.redis_timeout_ms,
                        "sweep_interval_ms": self.sweep_interval_ms,
                        "reconcile_interval_ms": 200,
                    }),
                ),
                &self.redis,
            ),
            "identity": self.identity,
            "signing": with(
                json!({ "header": "X-Flashgate-Reservation", "key_id": "k1", "ttl_secs": 900 }),
                &signing_key,
            ),
            "sold_out_cache": { "ttl_ms": self.sold_out_ttl_ms },
            "sale_routes": [{
                "method": "POST",
                "path": "/api/seckill/{activity}/buy",
                "quantity_query": "qty",
            }],
            "rate_limits": with(
                json!({ "evict_interval_ms": 10000, "per_user": per_user }),
                &self.rate_limits,
            ),
            "activities": self.activities,
        });
        for (pointer, value) in &self.patches {
            let (parent, key) = pointer.rsplit_once('/').expect("a JSON pointer");
            if parent.is_empty() {
                doc[key] = value.clone();
                continue;
            }
            let at = doc
                .pointer_mut(parent)
                .unwrap_or_else(|| panic!("{parent} is not in the configuration"));
            at[key] = value.clone();
        }
        drop_nulls(&mut doc);
        serde_yaml::to_string(&doc).expect("a test configuration serialises")
    }

    /// The configuration as the gateway reads it (secrets as the tests' gateways are given).
    pub fn settings(&self) -> flashgate::config::Settings {
        let secrets = |name: &str| match name {
            "FLASHGATE_SIGNING_SECRET" => Some(SIGNING_SECRET.to_owned()),
            "FLASHGATE_ADMIN_TOKEN" => Some(ADMIN_TOKEN.to_owned()),
            _ => None,
        };
        flashgate::config::Settings::from_yaml(&self.to_yaml(), std::path::Path::new("."), &secrets)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.to_yaml()))
    }
}

/// Builder methods of [`TestConfig`] that each set one field (an option is set to `Some`):
/// `name(Type) => field`.
macro_rules! setters {
    ($($name:ident($ty:ty) => $($field:ident).+,)*) => {
        impl TestConfig {
            $(pub fn $name(mut self, value: $ty) -> Self {
                self.$($field).+ = value.into();
                self
            })*
        }
    };
}

setters! {
    per_user_bucket(Rate) => rate_limits.per_user,
    per_ip_rate(Rate) => rate_limits.per_ip,
    per_activity_rate(Rate) => rate_limits.per_activity,
    passthrough_rate(Rate) => rate_limits.passthrough,
    sold_out_ttl_ms(u64) => sold_out_ttl_ms,
    redis_timeout_ms(u64) => redis_timeout_ms,
    read_timeout_ms(u64) => read_timeout_ms,
    order_lookup(OrderLookup) => upstream.order_lookup,
    max_inflight(u32) => upstream.max_inflight,
    max_queue_wait_ms(u64) => upstream.max_queue_wait_ms,
    max_passthrough_inflight(u32) => upstream.max_passthrough_inflight,
    prewarm_interval_ms(u64) => redis.prewarm_interval_ms,
    key_ttl_after_end_secs(u64) => redis.key_ttl_after_end_secs,
    sale_body_timeout_ms(u64) => server.sale_body_timeout_ms,
    reload_watch_interval_ms(u64) => server.reload_watch_interval_ms,
    grace_period_secs(u64) => server.grace_period_secs,
    upgrade_sock(PathBuf) => server.upgrade_sock,
}

/// `base` (a mapping) with the fields of `extra` added.
fn with(mut base: Value, extra: &impl Serialize) -> Value {
    let Value::Object(extra) = serde_json::to_value(extra).expect("serialisable") else {
        panic!("not a mapping");
    };
    base.as_object_mut().expect("a mapping").extend(extra);
    base
}

/// Options left unset stay out of the YAML.
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}
