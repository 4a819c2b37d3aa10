//! The client IP's token bucket, before any identity work (memory only).

use crate::admission::LimitKind;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct IpBucket;

#[async_trait::async_trait]
impl Gate for IpBucket {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let policy = parts.rules.policy;
        let header = attempt.exchange.header();
        match policy.client_ip(&header.headers, attempt.exchange.peer()) {
            Some(ip) => policy
                .take_token(LimitKind::PerIp, &ip, parts.admission.metrics())
                .into(),
            None => Step::Pass,
        }
    }
}
