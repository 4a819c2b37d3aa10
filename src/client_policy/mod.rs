//! Client policy: what the gateway decides by who is asking, before any stock is looked at.
//! The buyer's identity (header, cookie or JWT, the client IP behind trusted proxies) and the
//! token buckets (per IP, per user, per activity; each gateway's own or the fleet's in Redis),
//! with the instance-wide passthrough cap.

pub mod fleet_limit;
pub mod identity;
pub mod policy;
pub mod rate_limit;
mod token;

pub use policy::{LimitKind, LimitMode, PassthroughOutcome, Policy};

use crate::config::Settings;
use crate::decision::Decision;
use crate::metrics::Metrics;
use std::sync::Arc;

/// The rules one configuration generation gives the purchase: the settings and its buckets.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    pub settings: &'a Settings,
    pub policy: &'a Policy,
}

/// The token buckets' shared part: where `scope: fleet` buckets are kept (without a store, they
/// are each gateway's own), and the metrics their refusals count in.
pub struct Buckets {
    metrics: Arc<Metrics>,
    fleet: Option<fleet_limit::FleetBuckets>,
}

impl Buckets {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Buckets {
            metrics,
            fleet: None,
        }
    }

    /// Keeps `scope: fleet` buckets in `store`.
    pub fn with_fleet(mut self, store: Arc<dyn fleet_limit::FleetTokens>) -> Self {
        self.fleet = Some(fleet_limit::FleetBuckets::new(store, self.metrics.clone()));
        self
    }

    /// Takes a token from the `kind` bucket for `key`: the fleet's or this gateway's own, as
    /// configured (see [`Policy::take_fleet_token`]).
    pub async fn take(&self, rules: Rules<'_>, kind: LimitKind, key: &str) -> Result<(), Decision> {
        rules
            .policy
            .take_fleet_token(kind, key, self.fleet.as_ref(), &self.metrics)
            .await
    }

    /// Takes a token from this gateway's own `kind` bucket for `key` (memory only, whatever its
    /// scope).
    pub fn take_here<K: std::hash::Hash + ?Sized>(
        &self,
        rules: Rules<'_>,
        kind: LimitKind,
        key: &K,
    ) -> Result<(), Decision> {
        rules.policy.take_token(kind, key, &self.metrics)
    }

    /// The store cannot be asked and the activity passes through: forwarded unreserved while
    /// the instance-wide cap allows (see [`Policy::pass_through`]).
    pub fn pass_through(&self, rules: Rules<'_>, activity: &str) -> PassthroughOutcome {
        rules.policy.pass_through(activity, &self.metrics)
    }
}
