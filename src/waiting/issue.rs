//! Issuing tickets: a buyer without one is given theirs by Redis (one per buyer: Redis answers
//! a buyer's own again), signed and remembered here. The asks of one activity that arrive while
//! its ticket call is out go together in the next call (`lua/queue_ticket.lua`, the queue's
//! bookkeeping once per call), each answered as if it had come alone; the queue's state the call
//! answers is learnt once per call, not once per ticket.

use super::store::{self, Ask, Fresh, Issued, QueueStore};
use super::ticket::{self, Ticket};
use super::view::View;
use super::WaitingRoom;
use crate::coalesce::Batcher;
use crate::config::{Activity, QueueSettings};
use crate::decision::Decision;
use crate::stock::StoreError;
use std::sync::Arc;

/// What one ask got from its batch: the answer, and the call's Redis time and queue epoch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Issuance {
    issued: Issued,
    now_ms: u64,
    epoch: u64,
}

/// Ticket asks waiting for their activity's call.
pub(super) type TicketCalls = Batcher<Arc<str>, Ask, Result<Issuance, Arc<StoreError>>>;

impl<S: QueueStore> WaitingRoom<S> {
    /// The ticket this process last had Redis issue `user`, if it is of the queue as it is now.
    pub(super) fn remembered(&self, activity: &Activity, user: &str) -> Option<(Ticket, String)> {
        let (ticket, raw) = self.issued.get(&(activity.id.clone(), user.to_owned()))?;
        let current = self.with_view(activity, |v| v.state.epoch) == Some(ticket.epoch);
        current.then_some((ticket, raw))
    }

    /// A new ticket from Redis, signed and remembered here. A batch carries the configuration
    /// of the ask that leads it, its earliest (an ask that arrived just after a reload, within
    /// one call's round trip, is judged by the configuration before it, as if it had come a
    /// moment earlier; Redis's clock still bounds the queue's hours, and the next call has the
    /// new file).
    pub(super) async fn issue(
        &self,
        key: &[u8; 32],
        activity: &Activity,
        queue: &QueueSettings,
        user: &str,
        spend: Option<&store::Spend>,
    ) -> Result<(Ticket, String), Decision> {
        let ask = Ask {
            user: user.to_owned(),
            spend: spend.cloned(),
        };
        let answer = self
            .ticket_calls
            .submit(activity.id.clone(), ask, |asks| {
                self.issue_batch(activity, queue, asks)
            })
            .await
            .map_err(StoreError::from)
            .and_then(|a| a.map_err(StoreError::shared));
        let Issuance {
            issued,
            now_ms,
            epoch,
        } = answer.map_err(|e| {
            tracing::warn!(activity = %activity.id, error = %e, "no ticket issued");
            Decision::Unavailable
        })?;
        self.count_spend(activity, spend, &issued);
        let number = match issued {
            Issued::Ticket { number, .. } => number,
            Issued::Spent => return Err(Decision::InvalidTicket),
            // This gateway's clock runs ahead of or behind Redis's: Redis's counts.
            Issued::NotOpen => {
                return Err(Decision::before_opening(
                    activity
                        .opens_after(self.store.clock().now())
                        .map(|t| t.timestamp_millis()),
                    now_ms as i64,
                ))
            }
            Issued::Closed => return Err(Decision::Ended),
        };
        let ticket = Ticket {
            number,
            issued_ms: now_ms,
            epoch,
        };
        let raw = ticket::sign(key, &activity.id, user, ticket);
        self.issued.insert(
            (activity.id.clone(), user.to_owned()),
            (ticket, raw.clone()),
        );
        Ok((ticket, raw))
    }

    /// One ticket call for a batch of asks: the state it answers learnt, the tickets issued
    /// now counted, once for the batch.
    async fn issue_batch(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        asks: Vec<Ask>,
    ) -> Vec<Result<Issuance, Arc<StoreError>>> {
        let n = asks.len();
        let (state, issued) = match self
            .store
            .tickets(activity, queue, &asks, &Fresh::random())
            .await
        {
            Ok(answer) => answer,
            Err(e) => {
                let e = Arc::new(e);
                return (0..n).map(|_| Err(e.clone())).collect();
            }
        };
        let fresh = issued
            .iter()
            .filter(|i| matches!(i, Issued::Ticket { fresh: true, .. }))
            .count();
        if fresh > 0 {
            self.metrics
                .queue_tickets
                .with_label_values(&[&activity.id])
                .inc_by(fresh as u64);
        }
        let (now_ms, epoch) = (state.now_ms, state.epoch);
        // A ticket call does not read the units left: `learn` keeps what was known.
        self.learn(activity, View::new(state, None));
        issued
            .into_iter()
            .map(|issued| {
                Ok(Issuance {
                    issued,
                    now_ms,
                    epoch,
                })
            })
            .collect()
    }
}
