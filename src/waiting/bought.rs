//! Who bought: a buyer whose purchase won reads `bought` in the queue (the contract's final
//! state), remembered by the gateway that relayed the win, and asked of Redis before anyone is
//! told `sold_out` (a buyer told `sold_out` could not have bought).

use super::store::QueueStore;
use super::view::Status;
use super::{Answer, WaitingRoom};
use crate::config::Activity;
use crate::decision::Decision;

impl<S: QueueStore> WaitingRoom<S> {
    /// Whether a buyer about to be told `sold_out` bought after all, through another gateway
    /// (or this one before a restart): they hold units of the sale in Redis. Asked only then
    /// (a final state: the buyer stops polling), so polls stay answered from memory. A buyer
    /// told `sold_out` could not have bought: when Redis cannot say, `unavailable` (retry).
    pub(super) async fn bought_elsewhere(
        &self,
        activity: &Activity,
        user: &str,
        answer: &Answer,
    ) -> Result<bool, Decision> {
        if answer.status != Status::SoldOut {
            return Ok(false);
        }
        match self.store.units_held(activity, user).await {
            Ok(held) => Ok(held > 0),
            Err(e) => {
                tracing::warn!(activity = %activity.id, error = %e, "a buyer's units not read");
                Err(Decision::Unavailable)
            }
        }
    }

    /// Seconds until the sale's end by Redis's clock (as last read): how long a ticket's
    /// cookie is kept.
    pub fn until_the_end_secs(&self, activity: &Activity) -> u64 {
        (activity.ends_at - self.store.clock().now())
            .num_seconds()
            .max(0) as u64
    }

    /// `user`'s purchase in `activity` won (the backend answered 2xx): their polls say
    /// `bought` from now on, and a stepped queue's place they held is freed.
    pub async fn bought(&self, activity: &Activity, user: &str) {
        if activity.queue.is_some() {
            self.bought
                .insert((activity.id.clone(), user.to_owned()), ());
            self.stepped_bought(activity, user).await;
        }
    }
}
