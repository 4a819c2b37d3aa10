//! The local sold-out mark (memory only). A retry with an `Idempotency-Key` may hold a
//! reservation already: only Redis can say, so it is never answered from the mark (the
//! activity's bucket still caps such calls); nor is a buyer presenting their ticket to the
//! lane's second-chance line (a unit may be held for them: `crate::waiting::line`).

use crate::decision::Decision;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct SoldOut;

impl Gate for SoldOut {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let ttl = parts.rules.settings.sold_out_cache.ttl;
        if attempt.key.is_none()
            && parts.checkout.sale.is_sold_out(attempt.activity(), ttl)
            && !in_line(parts, attempt)
        {
            return Step::refuse(Decision::SoldOut);
        }
        Step::Pass
    }
}

/// Whether the buyer presents their ticket to the lane's second-chance line.
fn in_line(parts: Parts<'_>, attempt: &Attempt<'_>) -> bool {
    let lane = attempt.activity();
    if lane.second_chance.is_none() {
        return false;
    }
    let key = &parts.rules.settings.signing.ticket_key;
    match super::waiting_room::presented(&attempt.incoming.header().headers) {
        Some(p) => crate::waiting::line::holds_ticket(key, &lane.lane, attempt.user(), &p.ticket),
        None => false,
    }
}
