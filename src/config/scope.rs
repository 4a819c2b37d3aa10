//! `rate_limits.per_user.scope` and `rate_limits.per_ip.scope`: whether a bucket is each
//! gateway's own or one for the whole fleet (see `crate::client_policy::fleet_limit`).

use schemars::JsonSchema;
use serde::Deserialize;

/// Who shares a token bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Each gateway its own bucket: N gateways allow N times the rate.
    #[default]
    Instance,
    /// One bucket for all gateways together, kept in Redis; each gateway's own bucket takes
    /// over while Redis does not answer in time.
    Fleet,
}

/// Refuses `scope: fleet` where a bucket cannot be fleet-wide (the per-activity bucket keeps
/// Redis's own load down, and the passthrough cap works while Redis is down).
pub(super) fn instance_only(key: &str, scope: Scope) -> Result<(), super::ConfigError> {
    match scope {
        Scope::Instance => Ok(()),
        Scope::Fleet => Err(super::ConfigError::invalid(
            format!("{key}.scope"),
            "only rate_limits.per_user and rate_limits.per_ip can be fleet-wide",
        )),
    }
}
