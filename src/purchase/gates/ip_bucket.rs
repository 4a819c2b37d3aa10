//! The client IP's token bucket, before any identity work (memory only; with `scope: fleet`,
//! the fleet's in Redis, see `crate::admission::fleet_limit`).

use crate::admission::LimitKind;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct IpBucket;

impl Gate for IpBucket {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let policy = parts.rules.policy;
        let header = attempt.exchange.header();
        match policy.client_ip(&header.headers, attempt.exchange.peer()) {
            Some(ip) => parts
                .admission
                .take_token(parts.rules, LimitKind::PerIp, &ip.to_string())
                .await
                .into(),
            None => Step::Pass,
        }
    }
}
