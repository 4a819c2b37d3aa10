//! Who buys what: the buyer (by the configured identity), the activity named by the path, and
//! the purchase's `Idempotency-Key` (no I/O).

use crate::decision::Decision;
use crate::purchase::request::idempotency_key;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct Identity;

impl Gate for Identity {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let header = attempt.incoming.header();
        let policy = parts.rules.policy;
        let buyer = match policy.identify(&header.headers, attempt.incoming.peer()) {
            Ok(buyer) => buyer,
            Err(why) => return Step::refuse(why.decision()),
        };
        attempt.facts.user = Some(buyer.user);
        attempt.claims = buyer.claims;
        let Some(activity) = parts.rules.settings.activities.get(attempt.asked.activity) else {
            return Step::refuse(Decision::UnknownActivity);
        };
        attempt.facts.activity = Some(activity.clone());
        match idempotency_key(&attempt.incoming.header().headers) {
            Ok(key) => {
                attempt.key = key.map(str::to_owned);
                Step::Pass
            }
            Err(bad) => Step::refuse(Decision::BadRequest(bad)),
        }
    }
}
