//! Which variant of a drop is bought: named by the route (its `{variant}` path segment, or its
//! `variant_query` parameter), once, and one the activity sells; the purchase then runs on that
//! variant's stock lane (every gate after this one reads the lane as the activity bought). An
//! activity without variants takes a purchase that names none (no I/O). A drop with a waiting
//! room lets an arrival that names none take its place; the reserve refuses it.

use crate::decision::{BadRequest, Decision};
use crate::edge::route::path_variant;
use crate::purchase::request::variant;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct Variant;

impl Gate for Variant {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let route = attempt.asked.route;
        let target = attempt.asked.target;
        let named = match route.variant_query() {
            Some(name) => match variant(target.query.as_deref(), name) {
                Ok(named) => named,
                Err(bad) => return Step::refuse(Decision::BadRequest(bad)),
            },
            None => path_variant(route, target),
        };
        let activity = attempt.activity();
        match (activity.has_variants(), named) {
            (false, None) => Step::Pass,
            (false, Some(_)) => Step::refuse(Decision::BadRequest(BadRequest::VariantNotSold)),
            // A drop's waiting room takes arrivals that name no variant yet (the buyer chooses
            // at their turn); the reserve refuses a purchase that still names none.
            (true, None) if activity.queue.is_some() => Step::Pass,
            (true, None) => Step::refuse(Decision::BadRequest(BadRequest::VariantMissing)),
            (true, Some(v)) => {
                let activities = &parts.rules.settings.activities;
                match activities.lane(&activity.id, Some(v)) {
                    Some(lane) => {
                        attempt.facts.activity = Some(lane.clone());
                        Step::Pass
                    }
                    None => Step::refuse(Decision::UnknownVariant),
                }
            }
        }
    }
}
