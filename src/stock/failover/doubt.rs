//! In doubt, hold: what the gateways do to keep a unit off sale without proof that no
//! order holds it. Reservations pending through a fence or a loss are held in doubt
//! (`lua/doubt.lua`: never released by their hold's expiry); a clean `reconcile --orders` is
//! recorded in Redis, which a plain resume of a fence needs (`lua/master.lua`, mode `orders`).

use super::super::scripts::master::MasterCall;
use super::super::{Segment, StockStore, StoreError};
use crate::config::Activity;
use crate::stock::prelude::*;

impl StockStore {
    /// Holds in doubt every reservation pending in `segment` of `activity`, of every version the
    /// segment had (`lua/doubt.lua`). Returns how many it held.
    pub async fn hold_pending_in_doubt(
        &self,
        activity: &Activity,
        segment: Segment<'_>,
    ) -> Result<u64, StoreError> {
        let mut held = 0;
        for version in self.meta(segment).await?.versions {
            held += self.hold_in_doubt(segment, version).await?;
        }
        if held > 0 {
            tracing::warn!(activity = %activity.id, segment = segment.index(), held,
                "reservations pending through a fence or a loss are held in doubt: their hold's \
                 expiry will not release them (confirm or release each, or reconcile --orders \
                 --confirm-pending)");
        }
        Ok(held)
    }

    /// `flashgate reconcile --orders` found nothing of `activity`'s orders missing or in doubt:
    /// recorded in every segment (a plain resume of a fence needs it since the fence began).
    pub async fn orders_checked(&self, activity: &Activity) -> Result<(), StoreError> {
        let layout = super::super::segments::recorded_layout(self, activity).await?;
        for segment in layout.segments() {
            let seen = self.seen(segment, activity, false).await;
            self.master(segment, activity, &seen, MasterCall::Orders, false)
                .await?;
        }
        Ok(())
    }
}
