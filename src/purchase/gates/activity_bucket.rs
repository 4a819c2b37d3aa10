//! The activity's admission bucket, which keeps a scripted flood off Redis (memory only). It
//! counts what goes on to the reserve script: a purchase the waiting room held back (replay
//! only: it takes no stock) takes no token, so buyers re-asking for their place with their key
//! do not use up what admitted buyers need.

use crate::client_policy::LimitKind;
use crate::purchase::{Attempt, Gate, HeldBack, Parts, Step};

pub struct ActivityBucket;

impl Gate for ActivityBucket {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        if matches!(attempt.held_back, Some(HeldBack::Queue(..))) {
            return Step::Pass;
        }
        let buckets = &parts.checkout.buckets;
        buckets
            .take_here(parts.rules, LimitKind::PerActivity, &*attempt.activity().id)
            .into()
    }
}
