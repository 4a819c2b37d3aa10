//! The quantity, from every source a backend might read it at once: the query string and the
//! whole body (read here, within the route's size and deadline, before anything is taken, so a
//! slow or broken body holds nothing). They must agree; absent everywhere means 1.

use crate::admission::{body_quantity, quantity, BadRequest, Decision};
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct Quantity;

#[async_trait::async_trait]
impl Gate for Quantity {
    async fn check(&self, _parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let route = attempt.asked.route;
        let max = attempt.activity().max_per_request;
        let qty = match quantity(
            attempt.asked.target.query.as_deref(),
            route.quantity_query(),
            max,
        ) {
            Ok(qty) => qty,
            Err(bad) => return Step::refuse(Decision::BadRequest(bad)),
        };
        attempt.facts.qty = Some(qty);
        let in_body = match attempt.exchange.body().await {
            Ok(body) => body_quantity(
                &attempt.exchange.header().headers,
                &body,
                route.quantity_query(),
            ),
            Err(bad) => Err(bad),
        };
        match in_body {
            Ok(None) => Step::Pass,
            Ok(Some(q)) if q == qty => Step::Pass,
            Ok(Some(_)) => Step::refuse(Decision::BadRequest(BadRequest::QuantityAmbiguous)),
            Err(bad) => Step::refuse(Decision::BadRequest(bad)),
        }
    }
}
