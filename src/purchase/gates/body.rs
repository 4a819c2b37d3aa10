//! The whole body, read within the route's size and deadline just before the reserve: after
//! every refusal that needs no body (so a sold-out, rate-limited, closed or queued buyer is
//! answered at once, without `100 Continue`), before anything is taken (so a slow or broken body
//! holds no stock, and nothing the buyer does later can cut a forwarded reservation's body
//! short). A quantity the body names, as a backend might read it, must be the one the query
//! admitted.

use crate::decision::{BadRequest, Decision};
use crate::purchase::request::body_quantity;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct Body;

impl Gate for Body {
    async fn check(&self, _parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let body = match attempt.incoming.body().await {
            Ok(body) => body,
            Err(bad) => return Step::refuse(Decision::BadRequest(bad)),
        };
        let name = attempt.asked.route.quantity_query();
        match body_quantity(&attempt.incoming.header().headers, &body, name) {
            Ok(None) => Step::Pass,
            Ok(Some(q)) if q == attempt.qty() => Step::Pass,
            Ok(Some(_)) => Step::refuse(Decision::BadRequest(BadRequest::QuantityAmbiguous)),
            Err(bad) => Step::refuse(Decision::BadRequest(bad)),
        }
    }
}
