//! The buyer's phases, on a sale in phases: which of its phases admit them (a claim of their
//! verified token, a header from the trusted auth layer, or an access list in Redis), made into
//! the steps the reserve script judges by Redis's clock (from each phase's start, its limit; the
//! public sale last). A buyer whose first step is still ahead, when an earlier phase has
//! opened, is told when theirs opens (403 `not_eligible`); before the first phase, the hours
//! gate answers as for any sale.
//!
//! Once the public sale has started (by the store's clock as last read) every buyer's step in
//! force is the public one, so nobody's phases are looked up. A list that cannot be read counts
//! as not naming the buyer: they are sold to from a later step, never an earlier one.

use crate::client_policy::identity::{claim_values, Claims};
use crate::config::{Activity, Who};
use crate::decision::Decision;
use crate::purchase::{Attempt, Gate, HeldBack, Parts, Step};
use crate::stock::Steps;

pub struct Phase;

impl Gate for Phase {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let activity = attempt.activity().clone();
        if !activity.has_phases() {
            return Step::Pass;
        }
        let public = (
            activity.starts_at.timestamp_millis(),
            activity.per_user_limit.get(),
            crate::config::phases::PUBLIC,
        );
        if attempt.now >= activity.starts_at {
            attempt.steps = Some(Steps::new([public]));
            return Step::Pass;
        }
        let buyer = Buyer {
            user: attempt.user(),
            claims: &attempt.claims,
            headers: &attempt.incoming.header().headers,
            trusted: parts.rules.policy.trusts(attempt.incoming.peer()),
        };
        let mut steps = Vec::with_capacity(activity.phases.len() + 1);
        for phase in activity.phases.iter() {
            if admits(parts, &buyer, &activity, &phase.who).await {
                let limit = phase.per_user_limit.unwrap_or(activity.per_user_limit);
                steps.push((phase.starts_at.timestamp_millis(), limit.get(), &*phase.id));
            }
        }
        steps.push(public);
        let opens_ms = steps[0].0;
        let now_ms = attempt.now.timestamp_millis();
        attempt.steps = Some(Steps::new(steps));
        if now_ms < opens_ms && now_ms >= activity.opens().timestamp_millis() {
            let refused = Decision::not_eligible(opens_ms, now_ms);
            if attempt.key.is_none() {
                return Step::refuse(refused);
            }
            // A purchase already won is still its buyer's, whatever their phase now (a list
            // dropped, a claim gone): a keyed retry goes on replay only, as outside the hours.
            attempt.held_back = Some(HeldBack::Hours(refused));
        }
        Step::Pass
    }
}

/// What a phase may ask of the buyer.
struct Buyer<'a> {
    user: &'a str,
    claims: &'a Claims,
    headers: &'a http::HeaderMap,
    /// Whether the peer is one of `identity.trusted_proxies` (only those may set a header).
    trusted: bool,
}

/// Whether `who` admits the buyer.
async fn admits(parts: Parts<'_>, buyer: &Buyer<'_>, activity: &Activity, who: &Who) -> bool {
    match who {
        Who::Claim { claim, any_of } => {
            claim_values(buyer.claims, claim).any(|v| Who::admits(any_of, &v))
        }
        Who::Header { name, any_of } => {
            let mut values = buyer.headers.get_all(name).iter();
            let (value, more) = (values.next(), values.next());
            buyer.trusted
                && more.is_none()
                && value
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| Who::admits(any_of, v.trim()))
        }
        Who::List(list) => match &parts.checkout.access {
            Some(lists) => match lists.on_list(activity, list, buyer.user).await {
                Ok(on) => on,
                Err(error) => {
                    tracing::warn!(activity = %activity.id, list = %list, %error,
                        "access list unreadable: the buyer is sold to from a later phase");
                    false
                }
            },
            None => false,
        },
    }
}
