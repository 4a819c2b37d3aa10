//! The local sold-out mark (memory only). A retry with an `Idempotency-Key` may hold a
//! reservation already: only Redis can say, so it is never answered from the mark (the
//! activity's bucket still caps such calls).

use crate::decision::Decision;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct SoldOut;

impl Gate for SoldOut {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let ttl = parts.rules.settings.sold_out_cache.ttl;
        if attempt.key.is_none() && parts.checkout.sale.is_sold_out(attempt.activity(), ttl) {
            return Step::refuse(Decision::SoldOut);
        }
        Step::Pass
    }
}
