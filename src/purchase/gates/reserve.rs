//! The reserve: one script call in Redis (the only round trip) holding stock for the buyer in
//! their home segment (pulling from the others when it runs short), unless the breaker says the
//! store is down; then the activity's `on_store_failure` decides. A purchase held back runs
//! replay only: the key's reservation if it won one, else the hold-back's answer.
//!
//! The halt is looked at again here (memory only): the body gate before this one may wait for a
//! slow client for up to `sale_body_timeout_ms`, and a purchase that passed the halt gate before
//! a halt must not take stock after it (the contract's 500 ms runs from the halt's answer): an
//! unkeyed one is refused, a keyed one goes on replay only.

use crate::purchase::checkout::{Admitted, Take};
use crate::purchase::{Attempt, Gate, Parts, Step, Verdict};

pub struct Reserve;

impl Gate for Reserve {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        if let step @ Step::Answer(_) = super::halt::Halt.check(parts, attempt).await {
            return step;
        }
        if attempt.activity().has_variants() && attempt.activity().variant.is_none() {
            // An arrival at a drop's waiting room named no variant: its turn needs one.
            let missing = crate::decision::BadRequest::VariantMissing;
            return Step::refuse(crate::decision::Decision::BadRequest(missing));
        }
        let held_back = attempt.held_back.take();
        let take = Take {
            activity: attempt.activity().clone(),
            user: attempt.user().to_owned(),
            qty: attempt.qty(),
            idempotency_key: attempt.key.take(),
            replay_only: held_back.is_some(),
            id: attempt.reservation_id.take(),
            steps: attempt.steps.take(),
        };
        let taken = parts
            .checkout
            .take_stock(parts.rules, take, &mut attempt.facts)
            .await;
        Step::Answer(match (taken, held_back) {
            (Ok(Admitted::Reserved(reservation)), _) => Verdict::Reserved(reservation),
            (Ok(Admitted::Passthrough), _) => Verdict::Passthrough,
            (Ok(Admitted::NotReplayed), Some(held_back)) => held_back.verdict(),
            (Ok(Admitted::NotReplayed), None) => {
                Verdict::Refuse(crate::decision::Decision::Unavailable)
            }
            (Err(decision), _) => Verdict::Refuse(decision),
        })
    }
}
