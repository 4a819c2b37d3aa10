//! The fleet-wide halt (memory only: every gateway reads it from Redis every 100 ms, see
//! `crate::lifecycle::halt`): a halted activity's sale requests are answered `unavailable`
//! before any bucket, ticket or reserve, so nothing is taken. A purchase already won is still
//! its buyer's (as outside the sale's hours): a retry with its `Idempotency-Key` goes on replay
//! only (no ticket is given meanwhile), and gets its reservation back or `unavailable`.

use crate::decision::Decision;
use crate::purchase::{Attempt, Gate, HeldBack, Parts, Step};

pub struct Halt;

impl Gate for Halt {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        if !parts.checkout.sale.is_halted(attempt.activity()) {
            return Step::Pass;
        }
        if attempt.key.is_none() {
            return Step::refuse(Decision::Halted);
        }
        attempt.held_back = Some(HeldBack::Halted);
        Step::Pass
    }
}
