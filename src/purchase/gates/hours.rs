//! The sale's hours, by the store's clock as last read (the reserve script judges again by its
//! own). Outside them nothing new is sold, but a purchase already won is still its buyer's: a
//! retry with its `Idempotency-Key` goes on replay only, and gets its reservation back or this
//! refusal. An open waiting room takes arrivals before the start (and gives them tickets).

use crate::config::SaleWindow;
use crate::decision::Decision;
use crate::purchase::{Attempt, Gate, HeldBack, Parts, Step};

pub struct Hours;

impl Gate for Hours {
    async fn check(&self, _parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        let activity = attempt.activity();
        // In a sale in phases, a buyer whose first phase is a later one waits for it, even in
        // the waiting room's pre-queue (which is for the first phase's buyers).
        let later = (attempt.steps.as_ref())
            .and_then(|s| s.opens_ms())
            .filter(|&ms| ms > activity.opens().timestamp_millis());
        let closed = match activity.window_at(attempt.now) {
            SaleWindow::NotStarted if later.is_none() && activity.queue_open_at(attempt.now) => {
                return Step::Pass
            }
            SaleWindow::NotStarted => Decision::before_opening(
                later.or_else(|| {
                    activity
                        .opens_after(attempt.now)
                        .map(|t| t.timestamp_millis())
                }),
                attempt.now.timestamp_millis(),
            ),
            SaleWindow::Ended => Decision::Ended,
            SaleWindow::Open => return Step::Pass,
        };
        if attempt.key.is_none() {
            return Step::refuse(closed);
        }
        attempt.held_back = Some(HeldBack::Hours(closed));
        Step::Pass
    }
}
