//! `lua/ledger.lua`: one version's ledger in one segment, read atomically (also inside the
//! reconcile snapshot). Its keys (in the order the script declares them), its arguments and its
//! reply, in one place; the script itself is in the registry (`super`).

use super::super::{LedgerRow, ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};

impl SegmentKeys {
    pub fn for_ledger(&self, version: u64) -> [String; 3] {
        [
            self.stock(version),
            self.ledger(version),
            self.pending(version),
        ]
    }
}

impl StockStore {
    /// One version's stock and ledger in one segment, read atomically.
    pub async fn ledger(
        &self,
        segment: Segment<'_>,
        version: u64,
    ) -> Result<LedgerRow, StoreError> {
        let mut invocation = super::LEDGER.prepare_invoke();
        for key in self.keys.of(segment).for_ledger(version) {
            invocation.key(key);
        }
        let reply: Vec<i64> = self
            .eval(ScriptName::Ledger, StoreOp::Read, &invocation)
            .await?;
        LedgerRow::parse(version, &reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Ledger, reply))
    }
}
