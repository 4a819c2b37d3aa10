//! The buyer's token bucket (memory only; with `scope: fleet`, the fleet's in Redis, asked in
//! batches, see `crate::client_policy::fleet_limit`); a keyed retry of a closed sale spends from it too, so
//! hammering a closed sale costs Redis no more than an open one.

use crate::client_policy::LimitKind;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct UserBucket;

impl Gate for UserBucket {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        parts
            .checkout
            .buckets
            .take(parts.rules, LimitKind::PerUser, attempt.user())
            .await
            .into()
    }
}
