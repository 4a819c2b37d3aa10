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

/// The call to `lua/ledger.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait LedgerScript: Send + Sync {
    /// `lua/ledger.lua` (see the implementation on [`StockStore`] below).
    fn ledger(
        &self,
        segment: Segment<'_>,
        version: u64,
    ) -> impl std::future::Future<Output = Result<LedgerRow, StoreError>> + Send;
}

impl LedgerScript for StockStore {
    /// One version's stock and ledger in one segment, read atomically.
    async fn ledger(&self, segment: Segment<'_>, version: u64) -> Result<LedgerRow, StoreError> {
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
