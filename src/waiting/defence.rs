//! The defence of the drop in the waiting room: a proof of work before a ticket (the challenge
//! is checked here, spent with the ticket's issue), and what is published and recorded of the
//! pre-queue's draw (`queue.draw`).

use super::store::{self, QueueStore};
use super::ticket::Ticket;
use super::{challenge, draw, WaitingRoom};
use crate::config::{Activity, QueueSettings};
use crate::decision::Decision;

crate::label_enum! {
    /// What became of a proof-of-work challenge, as the `outcome` label of
    /// `flashgate_queue_challenges_total`.
    pub enum ChallengeOutcome {
        /// A challenge sent instead of a ticket.
        Issued => "issued",
        /// A ticket given for a valid solution (spent now).
        Solved => "solved",
        /// A solution refused: wrong, forged, another user's or activity's, expired, spent.
        Refused => "refused",
        /// Shadow mode: a ticket given without a valid solution.
        ShadowPassed => "shadow_passed",
    }
}

/// What the poll publishes of the draw (`queue.draw: true`): the commitment to the seed from
/// `opens_at`, the seed once the sale started and the pre-queue was drawn (both hex).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Published {
    pub commitment: Option<String>,
    pub seed: Option<String>,
}

impl<S: QueueStore> WaitingRoom<S> {
    /// What the poll shows of the draw, by Redis's clock as last read: the commitment from
    /// `opens_at`, the seed from `starts_at` once the pre-queue is drawn (never before: the
    /// seed known early would tell which ticket numbers draw the first places).
    pub(super) fn published(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
    ) -> Option<Published> {
        if !queue.draw {
            return None;
        }
        let view = self.view(activity)?;
        let now = view.redis_now_ms() as i64;
        let commitment = view
            .state
            .commitment
            .clone()
            .filter(|_| now >= queue.opens_at.timestamp_millis());
        let seed = view
            .state
            .drawn
            .filter(|_| now >= activity.opens().timestamp_millis() && commitment.is_some())
            .map(|(_, seed)| draw::seed_hex(&seed));
        Some(Published { commitment, seed })
    }

    /// A buyer with no ticket of their own: the one remembered or issued now, or (with a
    /// challenge) a challenge to solve first; a solution sent is checked (no Redis read) and
    /// spent with the ticket's issue (one write). A solution is looked at only here: a request
    /// with a valid ticket is answered for its ticket.
    pub(super) async fn without_ticket(
        &self,
        key: &[u8; 32],
        activity: &Activity,
        queue: &QueueSettings,
        user: &str,
        solution: Option<&str>,
    ) -> Result<Result<(Ticket, String), Box<challenge::Challenge>>, Decision> {
        let Some(setting) = &queue.challenge else {
            return match self.remembered(activity, user) {
                Some(found) => Ok(Ok(found)),
                None => self.issue(key, activity, queue, user, None).await.map(Ok),
            };
        };
        let view = self.current_view(activity, queue).await?;
        // Nothing left to sell (the cursor holds): a newcomer is told so, as a ticket holder
        // is, rather than set a challenge for a place that buys nothing.
        if view.state.held {
            return Err(Decision::SoldOut);
        }
        let ckey = challenge::key(key);
        let binding = challenge::Binding {
            activity: &activity.id,
            user,
            epoch: view.state.epoch,
        };
        let now_ms = view.redis_now_ms();
        let count = |outcome| self.count_challenge(activity, outcome);
        let Some(raw) = solution else {
            if let Some(found) = self.remembered(activity, user) {
                return Ok(Ok(found));
            }
            if setting.shadow {
                count(ChallengeOutcome::ShadowPassed);
                return self.issue(key, activity, queue, user, None).await.map(Ok);
            }
            count(ChallengeOutcome::Issued);
            let expires_ms = now_ms + setting.expires.as_millis() as u64;
            let max_number = setting.max_number_for(view.length());
            let c = challenge::issue(&ckey, binding, now_ms, expires_ms, max_number);
            return Ok(Err(Box::new(c)));
        };
        let opens_ms = queue.opens_at.timestamp_millis().max(0) as u64;
        match challenge::verify(&ckey, binding, raw, now_ms, opens_ms) {
            Ok(solved) => {
                let spend = store::Spend {
                    challenge: solved.challenge,
                    expires_ms: solved.expires_ms,
                    epoch: binding.epoch,
                    enforce: !setting.shadow,
                };
                self.issue(key, activity, queue, user, Some(&spend))
                    .await
                    .map(Ok)
            }
            Err(why) => {
                tracing::debug!(activity = %activity.id, %why, "challenge solution refused");
                count(ChallengeOutcome::Refused);
                if !setting.shadow {
                    return Err(Decision::InvalidTicket);
                }
                count(ChallengeOutcome::ShadowPassed);
                self.issue(key, activity, queue, user, None).await.map(Ok)
            }
        }
    }

    pub(super) fn count_challenge(&self, activity: &Activity, outcome: ChallengeOutcome) {
        self.metrics
            .queue_challenges
            .with_label_values(&[&activity.id, outcome.as_str()])
            .inc();
    }

    /// A pre-queue ticket admitted: the place this gateway admitted it at is written down in
    /// the background (once per ticket, the first gateway's), for `flashgate draw` to check
    /// against the seed. Lost if Redis does not answer (logged): the check then has one place
    /// fewer to compare, never a wrong one.
    pub(super) fn record_place(&self, activity: &Activity, number: u64) {
        let Some(place) = self
            .view(activity)
            .and_then(|v| v.state.drawn)
            .filter(|(drawn, _)| number <= *drawn)
            .map(|(drawn, seed)| draw::place(number, Some(drawn), &seed))
        else {
            return;
        };
        let placed = store::Placed {
            activity: activity.id.clone(),
            ends_at: activity.ends_at,
            number,
            place,
        };
        let store = self.store.clone();
        tokio::spawn(async move {
            let activity = placed.activity.clone();
            if let Err(e) = store.record_place(placed).await {
                tracing::warn!(%activity, error = %e, "a drawn place not recorded");
            }
        });
    }

    /// Counts what became of a solution sent with a ticket's issue: solved (spent now), or
    /// refused (spent before; in shadow mode the ticket is given anyway).
    pub(super) fn count_spend(
        &self,
        activity: &Activity,
        spend: Option<&store::Spend>,
        issued: &store::Issued,
    ) {
        if spend.is_none() {
            return;
        }
        match issued {
            store::Issued::Ticket { spent: false, .. } => {
                self.count_challenge(activity, ChallengeOutcome::Solved);
            }
            store::Issued::Ticket { spent: true, .. } => {
                self.count_challenge(activity, ChallengeOutcome::Refused);
                self.count_challenge(activity, ChallengeOutcome::ShadowPassed);
            }
            store::Issued::Spent => self.count_challenge(activity, ChallengeOutcome::Refused),
            store::Issued::NotOpen | store::Issued::Closed => {}
        }
    }
}
