//! The token buckets of one configuration (per user, per IP, per activity, and the cap on
//! unreserved forwards), and who the buyer is: the part of admission a reload rebuilds.

use super::fleet_limit::FleetBuckets;
use super::identity::Identifier;
use super::rate_limit::KeyedRateLimiter;
use crate::config::{Bucket, Scope, Settings};
use crate::decision::Decision;
use crate::metrics::Metrics;
use http::HeaderMap;
use std::net::IpAddr;
use std::sync::Arc;

crate::label_enum! {
    /// Token buckets, as the `limit` label.
    pub enum LimitKind {
        PerUser => "per_user",
        PerIp => "per_ip",
        PerActivity => "per_activity",
        /// The cap on unreserved forwards (its refusals are counted as passthrough `capped`).
        Passthrough => "passthrough",
    }
}

crate::label_enum! {
    /// Whether a bucket's refusal was enforced or only counted, as the `mode` label.
    pub enum LimitMode {
        Enforced => "enforced",
        Shadow => "shadow",
    }
}

crate::label_enum! {
    /// What happened to a sale request forwarded without a reservation (`on_store_failure:
    /// passthrough`), as the `outcome` label.
    pub enum PassthroughOutcome {
        /// Forwarded, marked, for the backend to decide.
        Forwarded => "forwarded",
        /// Over the global passthrough cap: answered `unavailable`.
        Capped => "capped",
    }
}

/// One configured token bucket: its limiter (this gateway's own: with `scope: fleet`, the
/// fallback), whether it only counts (shadow), and whether the fleet shares it.
struct Limit {
    kind: LimitKind,
    quota: governor::Quota,
    limiter: Arc<KeyedRateLimiter>,
    shadow: bool,
    scope: Scope,
}

impl Limit {
    /// A bucket's answer as the buyer gets it: a refusal is counted, and enforced unless the
    /// bucket is shadow.
    fn judge(
        &self,
        checked: Result<(), std::time::Duration>,
        metrics: &Metrics,
    ) -> Result<(), Decision> {
        let Err(retry_after) = checked else {
            return Ok(());
        };
        let mode = if self.shadow {
            LimitMode::Shadow
        } else {
            LimitMode::Enforced
        };
        metrics
            .rate_limit_refusals
            .with_label_values(&[self.kind.as_str(), mode.as_str()])
            .inc();
        if self.shadow {
            Ok(())
        } else {
            Err(Decision::RateLimited { retry_after })
        }
    }

    /// The limit for `bucket`, keeping `previous`'s buckets when the quota is the same (only
    /// `shadow` changed, or nothing did). A changed quota starts every bucket full.
    fn new(kind: LimitKind, bucket: Option<Bucket>, previous: Option<&Limit>) -> Option<Limit> {
        bucket.map(|b| Limit {
            kind,
            quota: b.quota,
            limiter: match previous {
                Some(p) if p.quota == b.quota => p.limiter.clone(),
                _ => Arc::new(KeyedRateLimiter::new(Some(b.quota))),
            },
            shadow: b.shadow,
            scope: b.scope,
        })
    }
}

/// The admission rules built from one configuration: who the buyer is, and the token buckets.
/// Part of a configuration generation, so a reload swaps them with the settings.
pub struct Policy {
    identifier: Identifier,
    per_user: Option<Limit>,
    per_ip: Option<Limit>,
    per_activity: Option<Limit>,
    /// The cap on unreserved forwards while the store is down (one bucket).
    passthrough: Limit,
}

impl Policy {
    pub fn new(settings: &Settings, previous: Option<&Policy>) -> Policy {
        let limits = &settings.rate_limits;
        Policy {
            identifier: Identifier::new(&settings.identity),
            per_user: Limit::new(
                LimitKind::PerUser,
                limits.per_user,
                previous.and_then(|p| p.per_user.as_ref()),
            ),
            per_ip: Limit::new(
                LimitKind::PerIp,
                limits.per_ip,
                previous.and_then(|p| p.per_ip.as_ref()),
            ),
            per_activity: Limit::new(
                LimitKind::PerActivity,
                limits.per_activity,
                previous.and_then(|p| p.per_activity.as_ref()),
            ),
            passthrough: Limit::new(
                LimitKind::Passthrough,
                Some(Bucket {
                    quota: limits.passthrough,
                    shadow: false,
                    scope: Scope::Instance,
                }),
                previous.map(|p| &p.passthrough),
            )
            .expect("a bucket is given"),
        }
    }

    /// Whether `peer` is one of `identity.trusted_proxies`.
    pub fn trusts(&self, peer: Option<IpAddr>) -> bool {
        self.identifier.trusts(peer)
    }

    /// The client's address: the peer, or from a trusted proxy's `X-Forwarded-For`.
    pub fn client_ip(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        self.identifier.client_ip(headers, peer)
    }

    /// Who the buyer is (`None`: unauthenticated).
    pub fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<super::identity::Buyer, super::identity::Unidentified> {
        self.identifier.identify(headers, peer)
    }

    /// Takes a token from this gateway's own `kind` bucket for `key` (no such bucket
    /// configured: passes); a shadow bucket only counts its refusals. A fleet-wide bucket is
    /// taken with [`Policy::take_fleet_token`].
    pub fn take_token<K: std::hash::Hash + ?Sized>(
        &self,
        kind: LimitKind,
        key: &K,
        metrics: &Metrics,
    ) -> Result<(), Decision> {
        let Some(limit) = self.limit(kind) else {
            return Ok(());
        };
        limit.judge(limit.limiter.check(key), metrics)
    }

    /// Takes a token from the `kind` bucket for `key`: the fleet's (`scope: fleet`, asked
    /// through `fleet`), else this gateway's own.
    pub async fn take_fleet_token(
        &self,
        kind: LimitKind,
        key: &str,
        fleet: Option<&FleetBuckets>,
        metrics: &Metrics,
    ) -> Result<(), Decision> {
        let Some(limit) = self.limit(kind) else {
            return Ok(());
        };
        let checked = match (limit.scope, fleet) {
            (Scope::Fleet, Some(fleet)) => {
                fleet.check(kind, limit.quota, key, &limit.limiter).await
            }
            _ => limit.limiter.check(key),
        };
        limit.judge(checked, metrics)
    }

    fn limit(&self, kind: LimitKind) -> Option<&Limit> {
        match kind {
            LimitKind::PerUser => self.per_user.as_ref(),
            LimitKind::PerIp => self.per_ip.as_ref(),
            LimitKind::PerActivity => self.per_activity.as_ref(),
            LimitKind::Passthrough => unreachable!("the passthrough cap is taken by pass_through"),
        }
    }

    /// The store cannot be asked and the activity passes through: forwarded unreserved while
    /// the instance-wide cap allows (for the backend's own stock check to decide), counted.
    pub fn pass_through(&self, activity: &str, metrics: &Metrics) -> PassthroughOutcome {
        let outcome = if self.passthrough.limiter.check(&()).is_ok() {
            PassthroughOutcome::Forwarded
        } else {
            PassthroughOutcome::Capped
        };
        metrics
            .passthrough
            .with_label_values(&[activity, outcome.as_str()])
            .inc();
        outcome
    }

    fn limits(&self) -> impl Iterator<Item = &Limit> {
        [&self.per_user, &self.per_ip, &self.per_activity]
            .into_iter()
            .flatten()
    }

    /// Drops idle rate-limit buckets; returns how many remain.
    pub fn evict_idle_buckets(&self) -> usize {
        self.limits().map(|l| l.limiter.evict_idle()).sum()
    }

    /// Token buckets held in memory.
    pub fn buckets(&self) -> usize {
        self.limits().map(|l| l.limiter.len()).sum()
    }
}
