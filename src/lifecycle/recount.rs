//! The recount: an operator's count of the remaining stock, set after the store forgot what it
//! sold (see `stock::segments::recount`), then purchasable at once everywhere.

use super::Lifecycle;
use crate::config::Activity;
use crate::stock::segments::{self, RecountError, Recounted, Settles};
use crate::stock::StockStore;

impl Lifecycle<StockStore> {
    /// Sets `activity`'s remaining stock to `remaining` (the version on sale), lifting the
    /// loss and the fence; sold-out marks of the version are lifted on every gateway. Then the
    /// activity's halt is lifted: the caller resumes it.
    pub async fn recount(
        &self,
        activity: &Activity,
        remaining: u64,
    ) -> Result<Recounted, RecountError> {
        self.recount_settling(activity, remaining, Settles::Anything)
            .await
    }

    /// [`Self::recount`] of the loss Redis carries now, set once (the admin API's): refused
    /// when Redis carries none (`RecountError::NothingLost`), or when another recount claimed
    /// the same loss (`RecountError::AlreadyRecounted`); see `stock::segments::recount`.
    pub async fn recount_once(
        &self,
        activity: &Activity,
        remaining: u64,
    ) -> Result<Recounted, RecountError> {
        self.recount_settling(activity, remaining, Settles::Loss)
            .await
    }

    async fn recount_settling(
        &self,
        activity: &Activity,
        remaining: u64,
        settles: Settles,
    ) -> Result<Recounted, RecountError> {
        let done = segments::recount(&self.store, activity, remaining, settles).await?;
        if !activity.is_segmented() {
            self.units_left(
                &activity.id,
                activity.variant.as_deref(),
                done.remaining as i64,
            );
        }
        self.units_returned(&activity.lane, activity.version);
        // The prewarm's refusal of the lost version no longer holds: asked again at once.
        self.refused(&activity.lane, None);
        self.prewarm_soon();
        Ok(done)
    }
}
