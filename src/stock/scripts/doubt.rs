//! `lua/doubt.lua`: hold in doubt every reservation of one version still pending in one segment
//! (before an operator resumes it after a fence or a loss). Its keys (in the order the script
//! declares them), its arguments and its reply, in one place; the script itself is in the
//! registry (`super`).

use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};

impl SegmentKeys {
    pub fn for_doubt(&self, version: u64) -> [String; 3] {
        [
            self.pending(version),
            self.reservations(),
            self.ledger(version),
        ]
    }
}

impl StockStore {
    /// Holds in doubt the reservations of `version` still pending in `segment` (flag `d`: never
    /// released by their hold's expiry, see `lua/doubt.lua`), counting their units in the
    /// version's ledger (`held_in_doubt`). Returns how many it held.
    pub async fn hold_in_doubt(
        &self,
        segment: Segment<'_>,
        version: u64,
    ) -> Result<u64, StoreError> {
        let mut invocation = super::DOUBT.prepare_invoke();
        for key in self.keys.of(segment).for_doubt(version) {
            invocation.key(key);
        }
        self.eval::<u64>(ScriptName::Master, StoreOp::Master, &invocation)
            .await
    }
}
