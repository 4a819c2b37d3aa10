//! The restock call: units an operator adds to the version on sale, once per idempotency key,
//! counted in the ledger (`restocked`) and purchasable at once everywhere.

use super::{Lifecycle, LifecycleStore};
use crate::config::Activity;
use crate::stock::{Layout, RestockOutcome, StoreError};

impl<S: LifecycleStore> Lifecycle<S> {
    /// Adds `units` to `activity`'s version on sale. They go to its first segment, from where
    /// the other segments' buyers pull them as they would any segment's surplus (one script
    /// call: the restock lands whole or not at all). `expire_at` (unix s) is when the
    /// activity's keys expire (the book of restocks by key expires with them).
    pub async fn restock(
        &self,
        activity: &Activity,
        units: u64,
        idempotency_key: Option<&str>,
        expire_at: u64,
    ) -> Result<RestockOutcome, StoreError> {
        let layout = Layout::of(activity);
        let first = layout.segment(0).expect("every layout has a segment 0");
        let outcome = self
            .store
            .restock(first, activity.version, units, idempotency_key, expire_at)
            .await?;
        if let RestockOutcome::Added { remaining } = outcome {
            self.metrics
                .restocked_units
                .with_label_values(&[&activity.id])
                .inc_by(units);
            if !activity.is_segmented() {
                self.units_left(&activity.id, activity.variant.as_deref(), remaining as i64);
            }
            self.units_returned(&activity.lane, activity.version);
            tracing::info!(activity = %activity.id, variant = activity.variant.as_deref(),
                version = activity.version, units, key = idempotency_key.unwrap_or(""),
                "restocked");
        }
        if let RestockOutcome::Repeated { .. } = outcome {
            tracing::info!(activity = %activity.id, variant = activity.variant.as_deref(),
                version = activity.version, units, key = idempotency_key.unwrap_or(""),
                "restock repeated under its Idempotency-Key: nothing added again");
        }
        Ok(outcome)
    }
}
