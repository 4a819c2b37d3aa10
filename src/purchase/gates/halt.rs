//! The fleet-wide halt (memory only: every gateway reads it from Redis every 100 ms, see
//! `crate::lifecycle::halt`): a halted activity's sale requests are answered `unavailable`
//! before any bucket, ticket or reserve, so nothing is taken, a replay included (the buyer
//! retries after the resume).

use crate::admission::Decision;
use crate::purchase::{Attempt, Gate, Parts, Step};

pub struct Halt;

#[async_trait::async_trait]
impl Gate for Halt {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        if parts.admission.is_halted(attempt.activity()) {
            return Step::refuse(Decision::Halted);
        }
        Step::Pass
    }
}
