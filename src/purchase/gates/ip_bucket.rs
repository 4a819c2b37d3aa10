//! The client IP's token bucket, before any identity work (memory only; with `scope: fleet`,
//! the fleet's in Redis, see `crate::client_policy::fleet_limit`).

use crate::client_policy::LimitKind;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct IpBucket;

impl Gate for IpBucket {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let policy = parts.rules.policy;
        let header = attempt.incoming.header();
        match policy.client_ip(&header.headers, attempt.incoming.peer()) {
            Some(ip) => parts
                .checkout
                .buckets
                .take(parts.rules, LimitKind::PerIp, &ip.to_string())
                .await
                .into(),
            None => Step::Pass,
        }
    }
}
