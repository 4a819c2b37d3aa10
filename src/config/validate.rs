//! From the YAML as written ([`super::file`]) to the runtime types ([`super::settings`]): each
//! section checked, with an error naming the offending key.

use super::bounds;
use super::file::{self, FileConfig};
use super::identity::identity;
use super::keys::{secret, signing};
use super::naming::{field_key, is_id_char, readable_id};
use super::rate::quota;
use super::settings::*;
use super::{ConfigError, SecretSource};
use chrono::{DateTime, Utc};
use governor::Quota;
use std::net::{SocketAddr, ToSocketAddrs};
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

impl Settings {
    pub(super) fn validate(
        raw: FileConfig,
        base_dir: &Path,
        secrets: &dyn SecretSource,
    ) -> Result<Settings, ConfigError> {
        let breaker = BreakerSettings {
            consecutive_failures: match raw.redis.breaker.consecutive_failures {
                0 => {
                    return Err(ConfigError::invalid(
                        "redis.breaker.consecutive_failures",
                        "must be at least 1",
                    ))
                }
                n => n,
            },
            open_for: positive_ms("redis.breaker.open_ms", raw.redis.breaker.open_ms)?,
        };
        let upstream = upstream(raw.upstream)?;
        let redis = redis(raw.redis)?;
        let longest_trip = bounds::longest_sale_trip(&redis, &upstream);
        let written: Vec<_> = (raw.activities.iter())
            .map(|a| super::pages::Written {
                id: &a.id,
                title: a.title.as_ref(),
                success_url: a.success_url.as_ref(),
            })
            .collect();
        let pages = super::pages::pages(raw.pages, &written, base_dir)?;
        let activities = activities(raw.activities, Duration::from_secs(raw.signing.ttl_secs))?;
        bounds::retention_covers_the_lifecycle(&redis, &upstream, &activities, longest_trip)?;
        let sale_routes = super::route::validate_all(raw.sale_routes)?;
        super::variants::reachable(&activities, &sale_routes)?;
        let server = server(raw.server, longest_trip, base_dir)?;
        let mut identity = identity(raw.identity, base_dir, secrets)?;
        super::phase_checks::readable(&activities, &identity)?;
        // A phase's header is the auth layer's word: from anyone else it is removed before the
        // request goes on, as `identity.strip_headers` are.
        for name in super::phase_checks::headers(&activities) {
            if !identity.strip_headers.contains(&name) {
                identity.strip_headers.push(name.clone());
            }
            if !identity.phase_headers.contains(&name) {
                identity.phase_headers.push(name);
            }
        }
        if let Some(open) = identity.spoofable(&server.listen) {
            if !identity.header_from_any_peer {
                return Err(ConfigError::invalid(
                    "identity.header",
                    format!(
                        "{open}; set identity.trusted_proxies to the auth layer's addresses, \
                         or identity.header_from_any_peer: true if something in front strips \
                         the header"
                    ),
                ));
            }
        }
        Ok(Settings {
            breaker,
            server,
            upstream,
            admin: admin(raw.admin, secrets)?,
            redis,
            identity,
            activities,
            signing: signing(raw.signing, base_dir, secrets)?,
            rate_limits: rate_limits(raw.rate_limits)?,
            sold_out_cache: SoldOutCacheSettings {
                ttl: positive_ms("sold_out_cache.ttl_ms", raw.sold_out_cache.ttl_ms)?,
            },
            sale_routes,
            pages,
        })
    }
}

fn server(
    raw: file::ServerSection,
    longest_trip: Duration,
    base_dir: &Path,
) -> Result<ServerSettings, ConfigError> {
    let grace_period = match raw.grace_period_secs {
        Some(secs) => Duration::from_secs(secs),
        None => bounds::default_grace_period(longest_trip),
    };
    let listen = socket_addr("server.listen", &raw.listen)?;
    let upgrade_sock = match raw.upgrade_sock {
        Some(path) => base_dir.join(path),
        None => PathBuf::from(format!("/tmp/flashgate-upgrade-{}.sock", listen.port())),
    };
    // sockaddr_un holds 108 bytes including the terminating NUL.
    if upgrade_sock.as_os_str().len() > 107 {
        return Err(ConfigError::invalid(
            "server.upgrade_sock",
            format!(
                "{} is longer than a Unix socket path may be (107 bytes)",
                upgrade_sock.display()
            ),
        ));
    }
    if upgrade_sock.to_str().is_none() {
        return Err(ConfigError::invalid(
            "server.upgrade_sock",
            "must be valid UTF-8",
        ));
    }
    Ok(ServerSettings {
        listen,
        threads: NonZeroUsize::new(raw.threads)
            .ok_or_else(|| ConfigError::invalid("server.threads", "must be at least 1"))?,
        grace_period,
        longest_sale_trip: longest_trip,
        shutdown_timeout: Duration::from_secs(raw.shutdown_timeout_secs),
        max_sale_body_bytes: match raw.max_sale_body_bytes {
            0..=MAX_SALE_BODY_BYTES => raw.max_sale_body_bytes,
            _ => {
                return Err(ConfigError::invalid(
                    "server.max_sale_body_bytes",
                    format!("must be at most {MAX_SALE_BODY_BYTES} (a sale body is held in memory until the reservation is forwarded)"),
                ))
            }
        },
        sale_body_timeout: positive_ms("server.sale_body_timeout_ms", raw.sale_body_timeout_ms)?,
        max_sale_header_bytes: raw.max_sale_header_bytes,
        max_passthrough_body_bytes: raw.max_passthrough_body_bytes,
        max_passthrough_buffered_bytes: match raw.max_passthrough_buffered_bytes {
            n if n < raw.max_passthrough_body_bytes => {
                return Err(ConfigError::invalid(
                    "server.max_passthrough_buffered_bytes",
                    format!(
                        "must be at least server.max_passthrough_body_bytes ({}): it holds every body being read at once",
                        raw.max_passthrough_body_bytes
                    ),
                ))
            }
            n => n,
        },
        passthrough_body_timeout: positive_ms(
            "server.passthrough_body_timeout_ms",
            raw.passthrough_body_timeout_ms,
        )?,
        reload_watch_interval: (raw.reload_watch_interval_ms > 0)
            .then(|| Duration::from_millis(raw.reload_watch_interval_ms)),
        upgrade_sock,
        cors: super::cors::cors(raw.cors)?,
    })
}

fn admin(
    raw: file::AdminSection,
    secrets: &dyn SecretSource,
) -> Result<AdminSettings, ConfigError> {
    let token = match raw.token_env {
        None => None,
        Some(var) => Some(AdminToken(secret("admin.token_env", &var, secrets)?)),
    };
    let listen = socket_addr("admin.listen", &raw.listen)?;
    if token.is_none() && !listen.ip().is_loopback() {
        return Err(ConfigError::invalid(
            "admin.listen",
            format!("{listen} is reachable from other hosts: set admin.token_env, or listen on loopback"),
        ));
    }
    Ok(AdminSettings { listen, token })
}

fn upstream(raw: file::UpstreamSection) -> Result<UpstreamSettings, ConfigError> {
    if raw.addresses.is_empty() {
        return Err(ConfigError::invalid(
            "upstream.addresses",
            "needs at least one backend address",
        ));
    }
    let addresses = raw
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| socket_addr(&format!("upstream.addresses[{i}]"), a))
        .collect::<Result<_, _>>()?;
    Ok(UpstreamSettings {
        addresses,
        connect_timeout: positive_ms("upstream.connect_timeout_ms", raw.connect_timeout_ms)?,
        read_timeout: positive_ms("upstream.read_timeout_ms", raw.read_timeout_ms)?,
        health_check_interval: positive_ms(
            "upstream.health_check_interval_ms",
            raw.health_check_interval_ms,
        )?,
        max_inflight: raw
            .max_inflight
            .map(|n| {
                NonZeroUsize::new(n).ok_or_else(|| {
                    ConfigError::invalid("upstream.max_inflight", "must be at least 1 (or absent)")
                })
            })
            .transpose()?,
        max_queue_wait: positive_ms("upstream.max_queue_wait_ms", raw.max_queue_wait_ms)?,
        max_passthrough_inflight: match raw.max_passthrough_inflight {
            Some(0) => {
                return Err(ConfigError::invalid(
                    "upstream.max_passthrough_inflight",
                    "must be at least 1 (leave it out for no limit)",
                ))
            }
            n => n.and_then(NonZeroUsize::new),
        },
        order_lookup: raw.order_lookup.map(order_lookup).transpose()?,
    })
}

fn order_lookup(raw: file::OrderLookupSection) -> Result<OrderLookupSettings, ConfigError> {
    let key = "upstream.order_lookup.path";
    let valid = raw.path.starts_with('/')
        && raw.path.matches("{jti}").count() == 1
        && raw.path.bytes().all(|b| b.is_ascii_graphic());
    let Some((before, after)) = raw.path.split_once("{jti}").filter(|_| valid) else {
        return Err(ConfigError::invalid(
            key,
            format!(
                "{:?} must start with '/' and hold {{jti}} exactly once",
                raw.path
            ),
        ));
    };
    Ok(OrderLookupSettings {
        path: (before.to_owned(), after.to_owned()),
        timeout: positive_ms("upstream.order_lookup.timeout_ms", raw.timeout_ms)?,
        retry_interval: positive_ms(
            "upstream.order_lookup.retry_interval_ms",
            raw.retry_interval_ms,
        )?,
        give_up_after: raw.give_up_after_secs.map(Duration::from_secs),
    })
}

fn redis(raw: file::RedisSection) -> Result<RedisSettings, ConfigError> {
    let (url, cluster_nodes) = match (raw.url, raw.cluster) {
        (Some(url), None) => {
            if let Err(e) = redis::Client::open(url.as_str()) {
                return Err(ConfigError::invalid(
                    "redis.url",
                    format!("not a Redis URL ({e})"),
                ));
            }
            (url, Vec::new())
        }
        (None, Some(cluster)) => {
            if cluster.nodes.is_empty() {
                return Err(ConfigError::invalid(
                    "redis.cluster.nodes",
                    "needs at least one seed node",
                ));
            }
            let mut urls = Vec::with_capacity(cluster.nodes.len());
            for (i, node) in cluster.nodes.iter().enumerate() {
                socket_addr(&format!("redis.cluster.nodes[{i}]"), node)?;
                urls.push(format!("redis://{node}"));
            }
            (urls[0].clone(), urls)
        }
        (Some(_), Some(_)) => {
            return Err(ConfigError::invalid(
                "redis",
                "set either url (one Redis) or cluster (a Redis Cluster), not both",
            ))
        }
        (None, None) => {
            return Err(ConfigError::invalid(
                "redis",
                "set url (one Redis) or cluster: { nodes: [...] }",
            ))
        }
    };
    if raw.key_prefix.is_empty() || !raw.key_prefix.chars().all(is_key_char) {
        return Err(ConfigError::invalid(
            "redis.key_prefix",
            "must be non-empty letters, digits, '-', '_', ':' or '.'",
        ));
    }
    Ok(RedisSettings {
        url,
        cluster_nodes,
        timeout: positive_ms("redis.timeout_ms", raw.timeout_ms)?,
        key_prefix: raw.key_prefix,
        key_ttl_after_end: Duration::from_secs(raw.key_ttl_after_end_secs),
        prewarm_interval: positive_ms("redis.prewarm_interval_ms", raw.prewarm_interval_ms)?,
        sweep_interval: positive_ms("redis.sweep_interval_ms", raw.sweep_interval_ms)?,
        sweep_batch: match raw.sweep_batch {
            1..=MAX_SWEEP_BATCH => raw.sweep_batch,
            _ => {
                return Err(ConfigError::invalid(
                    "redis.sweep_batch",
                    format!("must be 1 to {MAX_SWEEP_BATCH}"),
                ))
            }
        },
        reconcile_interval: positive_ms("redis.reconcile_interval_ms", raw.reconcile_interval_ms)?,
        events_maxlen: match raw.events_maxlen {
            0 => {
                return Err(ConfigError::invalid(
                    "redis.events_maxlen",
                    "must be at least 1",
                ))
            }
            n => n,
        },
        allow_eviction: raw.allow_eviction,
        ack_replicas: ack_replicas(raw.ack_replicas)?,
    })
}

fn ack_replicas(n: u32) -> Result<u32, ConfigError> {
    if n > MAX_ACK_REPLICAS {
        return Err(ConfigError::invalid(
            "redis.ack_replicas",
            format!("must be 0 to {MAX_ACK_REPLICAS}"),
        ));
    }
    Ok(n)
}

fn rate_limits(raw: file::RateLimitsSection) -> Result<RateLimitSettings, ConfigError> {
    let bucket =
        |key: &str, raw: Option<file::BucketSection>| -> Result<Option<Bucket>, ConfigError> {
            raw.map(|b| {
                Ok(Bucket {
                    quota: quota(key, &b)?,
                    shadow: b.shadow,
                    scope: b.scope,
                })
            })
            .transpose()
        };
    Ok(RateLimitSettings {
        per_user: bucket("rate_limits.per_user", raw.per_user)?,
        per_ip: bucket("rate_limits.per_ip", raw.per_ip)?,
        per_activity: match bucket("rate_limits.per_activity", raw.per_activity)? {
            Some(b) => super::scope::instance_only("rate_limits.per_activity", b.scope)
                .map(|()| Some(b))?,
            None => None,
        },
        evict_interval: positive_ms("rate_limits.evict_interval_ms", raw.evict_interval_ms)?,
        passthrough: match &raw.passthrough {
            Some(b) if b.shadow => {
                return Err(ConfigError::invalid(
                    "rate_limits.passthrough.shadow",
                    "a cap on unreserved forwards cannot be shadow",
                ))
            }
            Some(b) => {
                super::scope::instance_only("rate_limits.passthrough", b.scope)?;
                quota("rate_limits.passthrough", b)?
            }
            None => Quota::per_second(
                NonZeroU32::new(DEFAULT_PASSTHROUGH_PER_SECOND).expect("non-zero"),
            ),
        },
    })
}

fn activities(
    raw: Vec<file::ActivitySection>,
    default_hold: Duration,
) -> Result<Activities, ConfigError> {
    let mut out = Activities::default();
    for (i, a) in raw.into_iter().enumerate() {
        // Named by id (an index shifts as activities are added), by index while the id itself
        // cannot be read.
        let id = a.id.clone();
        let key = |field: &str| field_key(i, &id, field);
        if out.by_id.contains_key(a.id.as_str()) {
            return Err(ConfigError::invalid(
                key("id"),
                format!("{:?} is configured twice", a.id),
            ));
        }
        let activity = Arc::new(activity(a, &key, default_hold)?);
        out.by_id.insert(activity.id.clone(), activity.clone());
        if activity.has_variants() {
            for v in activity.variants.iter() {
                out.lanes.push(Arc::new(activity.lane(v)));
            }
        } else {
            out.lanes.push(activity.clone());
        }
        out.ordered.push(activity);
    }
    Ok(out)
}

/// One activity; `key` names its fields (`activities[id=…].…`) for errors.
fn activity(
    a: file::ActivitySection,
    key: &dyn Fn(&str) -> String,
    default_hold: Duration,
) -> Result<Activity, ConfigError> {
    if !readable_id(&a.id) {
        return Err(ConfigError::invalid(
            key("id"),
            format!(
                "{:?} must be 1 to {MAX_ACTIVITY_ID_LEN} letters, digits, '-' or '_'",
                a.id
            ),
        ));
    }
    if a.version == 0 {
        return Err(ConfigError::invalid(key("version"), "must be at least 1"));
    }
    let (stock, variants) = super::variants::stock_and_variants(&a, key)?;
    for (field, value) in [("version", a.version), ("stock", stock)] {
        if value > MAX_EXACT_INTEGER {
            return Err(ConfigError::invalid(
                key(field),
                format!("must be at most {MAX_EXACT_INTEGER} (2^53 - 1, kept exact everywhere)"),
            ));
        }
    }
    let (per_user_limit, max_per_request) = limits(&a, key)?;
    let starts_at = timestamp(&key("starts_at"), &a.starts_at)?;
    let ends_at = timestamp(&key("ends_at"), &a.ends_at)?;
    if ends_at <= starts_at {
        return Err(ConfigError::invalid(
            key("ends_at"),
            "must be after starts_at",
        ));
    }
    let hold = match a.hold_secs {
        Some(0) => return Err(ConfigError::invalid(key("hold_secs"), "must be at least 1")),
        Some(secs) => Duration::from_secs(secs),
        None => default_hold,
    };
    if a.segments == 0 || a.segments > MAX_SEGMENTS {
        return Err(ConfigError::invalid(
            key("segments"),
            format!("must be 1 to {MAX_SEGMENTS}"),
        ));
    }
    let phases = super::phase_checks::phases(a.phases, key, starts_at, per_user_limit, timestamp)?;
    // The sale opens with its first phase: the waiting room opens before or at it.
    let opens = phases.first().map_or(starts_at, |p| p.starts_at);
    let queue = a
        .queue
        .map(|q| queue(&key("queue"), q, opens))
        .transpose()?;
    let second_chance =
        super::phase_checks::second_chance(a.second_chance.as_ref(), key, a.segments)?;
    let id: Arc<str> = Arc::from(a.id.as_str());
    Ok(Activity {
        id: id.clone(),
        lane: id,
        stock,
        version: a.version,
        per_user_limit,
        max_per_request,
        starts_at,
        ends_at,
        confirm: a.confirm,
        on_store_failure: a.on_store_failure,
        hold,
        segments: a.segments,
        queue,
        variants: variants.into(),
        variant: None,
        phases,
        second_chance,
    })
}

/// `per_user_limit` and `max_per_request`: each at least 1, a request never over the limit.
fn limits(
    a: &file::ActivitySection,
    key: &dyn Fn(&str) -> String,
) -> Result<(NonZeroU32, NonZeroU32), ConfigError> {
    let per_user_limit = NonZeroU32::new(a.per_user_limit)
        .ok_or_else(|| ConfigError::invalid(key("per_user_limit"), "must be at least 1"))?;
    let max_per_request = NonZeroU32::new(a.max_per_request)
        .ok_or_else(|| ConfigError::invalid(key("max_per_request"), "must be at least 1"))?;
    if max_per_request > per_user_limit {
        return Err(ConfigError::invalid(
            key("max_per_request"),
            format!(
                "{max_per_request} exceeds per_user_limit {per_user_limit}: such requests could never succeed"
            ),
        ));
    }
    Ok((per_user_limit, max_per_request))
}

fn queue(
    key: &str,
    raw: file::QueueSection,
    starts_at: DateTime<Utc>,
) -> Result<QueueSettings, ConfigError> {
    let field = |f: &str| format!("{key}.{f}");
    if raw.admit_per_second == 0 || raw.admit_per_second > MAX_ADMIT_PER_SECOND {
        return Err(ConfigError::invalid(
            field("admit_per_second"),
            format!("must be 1 to {MAX_ADMIT_PER_SECOND}"),
        ));
    }
    let opens_at = match raw.opens_at.as_deref() {
        Some(t) => {
            let opens_at = timestamp(&field("opens_at"), t)?;
            if opens_at > starts_at {
                return Err(ConfigError::invalid(
                    field("opens_at"),
                    "must not be after starts_at (the queue opens before or at the sale's start, \
                     its first phase's if it has phases)",
                ));
            }
            opens_at
        }
        None => starts_at,
    };
    if raw.admission_window_secs == 0 {
        return Err(ConfigError::invalid(
            field("admission_window_secs"),
            "must be at least 1",
        ));
    }
    if !(raw.too_late_factor.is_finite() && raw.too_late_factor >= 1.0) {
        return Err(ConfigError::invalid(
            field("too_late_factor"),
            "must be a number of at least 1",
        ));
    }
    if let Some(url) = &raw.landing_url {
        // The one check of a link the buyer is sent to (a path here, or an http(s) URL).
        super::pages::url(&field("landing_url"), url)?;
    }
    Ok(QueueSettings {
        stepped: super::live_queue::stepped(field, &raw)?,
        admit_per_second: raw.admit_per_second,
        opens_at,
        admission_window: Duration::from_secs(raw.admission_window_secs),
        too_late_factor: raw.too_late_factor,
        landing_url: raw.landing_url,
        challenge: raw
            .challenge
            .map(|c| super::defence::challenge(&field("challenge"), c))
            .transpose()?,
        draw: raw.draw,
    })
}

fn is_key_char(c: char) -> bool {
    is_id_char(c) || c == ':' || c == '.'
}

fn socket_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| ConfigError::invalid(key, format!("{value:?} is not a host:port address")))
}

fn positive_ms(key: &str, ms: u64) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(ConfigError::invalid(key, "must be at least 1"));
    }
    Ok(Duration::from_millis(ms))
}

fn timestamp(key: &str, value: &str) -> Result<DateTime<Utc>, ConfigError> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            ConfigError::invalid(
                key,
                format!("{value:?} is not an RFC 3339 time like 2026-01-01T10:00:00Z ({e})"),
            )
        })
}
