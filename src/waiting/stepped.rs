//! The stepped admission, as a gateway answers it (`queue.skip_absent_after_secs`,
//! `queue.max_active`; the walk itself is `queue_step` in `lua/queue_lib.lua`, run by every
//! gateway's state read). A stepped queue's cursor moves only when a read walks it, and which
//! places it admitted or gave away is in Redis: a ticket holder's poll or purchase attempt asks
//! (one script call, which also records that the ticket is still watched), and the answer
//! follows the place's fate. A purchase that won frees its place among the active buyers.
//!
//! Approximations: `estimated_wait_ms` assumes every ticket ahead is live (the absent ones are
//! skipped faster, so the estimate is an upper bound while `max_active` does not hold the queue);
//! a purchase whose "bought" call fails keeps its place active until its window lapses; a buyer
//! told `sold_out` (final: their page stops polling) is not recorded as polling, so if units come
//! back after longer than `skip_absent_after_secs` their turn is given away unless they return;
//! a queue turned stepped mid-sale (a reload added a key) keeps the windows of the places its
//! time-function cursor had reached, which `max_active` does not count, and counts the tickets
//! it had issued as seen at the switch (a buyer told then to come back later than
//! `skip_absent_after_secs` may be skipped), and counts every ticket as seen when a halt is
//! lifted (a halt refuses purchase attempts before this records them); a stepped queue stays stepped, a reload removing
//! both keys walking it with no absence check and no limit (see `lua/queue_state.lua`).

use super::store::{Fate, QueueStore, Touch};
use super::ticket::Ticket;
use super::view::Status;
use super::WaitingRoom;
use crate::config::{Activity, QueueSettings};
use crate::decision::Decision;

impl<S: QueueStore> WaitingRoom<S> {
    /// What a ticket of a stepped queue is told, `status` being what the view alone says; a
    /// queue on the time-function cursor keeps `status`. With it, when its turn is now, when
    /// its window ends (Redis's clock, unix ms) as its admission says.
    pub(super) async fn stepped_status(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        user: &str,
        ticket: Ticket,
        status: Status,
    ) -> Result<(Status, Option<u64>), Decision> {
        let Some(view) = self.view(activity).filter(|v| v.state.stepped) else {
            return Ok((status, None));
        };
        let Some(place) = view.place(ticket.number) else {
            return Ok((cap_refresh(status, queue), None));
        };
        if matches!(status, Status::SoldOut | Status::Bought) {
            return Ok((status, None));
        }
        let fate = self
            .store
            .fate(activity, place, Touch::Poll)
            .await
            .map_err(|e| {
                tracing::warn!(activity = %activity.id, error = %e, "queue place not read");
                Decision::Unavailable
            })?;
        let mut ends_at = None;
        let status = match fate {
            Fate::Admitted { at_ms } => {
                let window = queue.admission_window.as_millis() as u64;
                if window_open(at_ms, window, view.redis_now_ms(), view.state.halted_at) {
                    self.places
                        .insert((activity.id.clone(), user.to_owned()), place);
                    ends_at = Some(at_ms + window);
                    Status::YourTurn
                } else {
                    Status::Expired
                }
            }
            Fate::Skipped => Status::GivenAway,
            // Reached by the time-function cursor before the queue turned stepped (a reload
            // added a key mid-sale): its window runs from the cursor's history, as before.
            Fate::Undecided if place <= view.state.base => status,
            Fate::Undecided => match status {
                Status::Waiting { .. } => cap_refresh(status, queue),
                // The view's read is newer than Redis's answer cannot be: the next read says.
                _ => Status::Waiting {
                    position: 1,
                    estimated_wait_ms: 1_000 / view.state.rate.max(1),
                    refresh_after_ms: 1_000,
                    likely_too_late: false,
                    drawn: true,
                    paused: view.state.paused,
                },
            },
        };
        Ok((status, ends_at))
    }

    /// A stepped queue's place of `user`, admitted through this gateway, leaves the active
    /// buyers (their purchase won). A failed call is logged: the place lapses at its window's end.
    pub(super) async fn stepped_bought(&self, activity: &Activity, user: &str) {
        let key = (activity.id.clone(), user.to_owned());
        let Some(place) = self.places.remove(&key) else {
            return;
        };
        if let Err(e) = self.store.fate(activity, place, Touch::Bought).await {
            tracing::warn!(activity = %activity.id, error = %e,
                "a purchase's place not freed: it stays active until its window lapses");
        }
    }
}

/// Whether a place admitted at `at_ms` (Redis's clock, unix ms) is still in its window at
/// `now`. While the activity is halted (since `halted_at`), a window with more than two state
/// reads left at the halt does not run out: the resume lengthens it by the halt's length
/// (`queue_lengthen` in lua/queue_lib.lua moves its admission time later), as the time-function
/// cursor does (`View::window_ends_at`); one with less lapses on its own time.
fn window_open(at_ms: u64, window_ms: u64, now: u64, halted_at: Option<u64>) -> bool {
    let end = at_ms + window_ms;
    let margin = 2 * super::REFRESH_INTERVAL.as_millis() as u64;
    now <= end || halted_at.is_some_and(|halted| halted.saturating_add(margin) < end)
}

/// A waiting client is asked back at least three times within `skip_absent_after_secs`, so a
/// live buyer's page is never taken for absent.
fn cap_refresh(status: Status, queue: &QueueSettings) -> Status {
    let Some(skip) = queue.stepped.and_then(|s| s.skip_absent_after) else {
        return status;
    };
    match status {
        Status::Waiting {
            position,
            estimated_wait_ms,
            refresh_after_ms,
            likely_too_late,
            drawn,
            paused,
        } => Status::Waiting {
            position,
            estimated_wait_ms,
            refresh_after_ms: refresh_after_ms.min(skip.as_millis() as u64 / 3),
            likely_too_late,
            drawn,
            paused,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::live_queue::Stepped;
    use std::time::Duration;

    fn queue(skip_secs: Option<u64>) -> QueueSettings {
        QueueSettings {
            admit_per_second: 10,
            opens_at: chrono::Utc::now(),
            admission_window: Duration::from_secs(60),
            too_late_factor: 1.5,
            landing_url: None,
            challenge: None,
            draw: false,
            stepped: Some(Stepped {
                skip_absent_after: skip_secs.map(Duration::from_secs),
                max_active: Some(5),
            }),
        }
    }

    fn waiting(refresh_after_ms: u64) -> Status {
        Status::Waiting {
            position: 900,
            estimated_wait_ms: 90_000,
            refresh_after_ms,
            likely_too_late: false,
            drawn: true,
            paused: false,
        }
    }

    #[test]
    fn no_window_runs_out_while_halted() {
        // Admitted at 1 s with a 2 s window: open until 3 s.
        assert!(window_open(1_000, 2_000, 3_000, None));
        assert!(!window_open(1_000, 2_000, 3_001, None));
        // Halted at 2.4 s (0.6 s left, more than two reads): open while the halt lasts.
        assert!(window_open(1_000, 2_000, 10_000, Some(2_400)));
        // Halted at 2.5 s, 0.5 s left (a gateway's view may be that old: it may have said
        // `expired` already): runs out on its own time, as Redis lapses it.
        assert!(window_open(1_000, 2_000, 3_000, Some(2_500)));
        assert!(!window_open(1_000, 2_000, 3_001, Some(2_500)));
        // Halted after the window closed: closed.
        assert!(!window_open(1_000, 2_000, 10_000, Some(3_500)));
    }

    #[test]
    fn a_waiting_client_is_asked_back_three_times_within_the_absence_allowed() {
        assert_eq!(
            cap_refresh(waiting(30_000), &queue(Some(6))),
            waiting(2_000)
        );
        assert_eq!(cap_refresh(waiting(1_000), &queue(Some(6))), waiting(1_000));
        assert_eq!(cap_refresh(waiting(30_000), &queue(None)), waiting(30_000));
        assert_eq!(
            cap_refresh(Status::YourTurn, &queue(Some(6))),
            Status::YourTurn
        );
    }
}
