//! `lua/due.lua`: make a reservation due for the sweep soon (never before a forward still in
//! flight). Its keys (in the order the script declares them), its arguments and its reply, in one
//! place; the script itself is in the registry (`super`).

use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use std::time::Duration;

impl SegmentKeys {
    pub fn for_due(&self, version: u64) -> [String; 2] {
        [self.pending(version), self.reservations()]
    }
}

/// The call to `lua/due.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait DueScript: Send + Sync {
    /// `lua/due.lua` (see the implementation on [`StockStore`] below).
    fn due_in(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        fence: u64,
        after: Duration,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send;
}

impl DueScript for StockStore {
    /// Makes a pending reservation due (for the sweep and its order lookup) no later than
    /// `after` from now, by Redis's clock, for a forward that ended without an answer and got
    /// `fence`: the due time only moves earlier, only while the fence is still that forward's,
    /// and never before the trips of the forwards before it end (see `lua/due.lua`).
    async fn due_in(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        fence: u64,
        after: Duration,
    ) -> Result<(), StoreError> {
        let mut invocation = super::DUE.prepare_invoke();
        for key in self.keys.of(segment).for_due(version) {
            invocation.key(key);
        }
        invocation
            .arg(reservation_id)
            .arg(after.as_millis() as u64)
            .arg(fence);
        self.eval::<i64>(ScriptName::Sweep, StoreOp::Sweep, &invocation)
            .await
            .map(|_| ())
    }
}
