//! The quantity the query string names (absent means 1; plain digits, once, at most the
//! activity's `max_per_request`; another spelling a lenient backend would read is refused). The
//! body, which may name it too, is read last, by the body gate, so that refusals which need no
//! body never wait for one.

use crate::decision::Decision;
use crate::purchase::request::quantity;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct Quantity;

impl Gate for Quantity {
    async fn check(&self, _parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let route = attempt.asked.route;
        let max = attempt.activity().max_per_request;
        match quantity(
            attempt.asked.target.query.as_deref(),
            route.quantity_query(),
            max,
        ) {
            Ok(qty) => {
                attempt.facts.qty = Some(qty);
                Step::Pass
            }
            Err(bad) => Step::refuse(Decision::BadRequest(bad)),
        }
    }
}
