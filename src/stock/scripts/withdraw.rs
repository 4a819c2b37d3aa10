//! `lua/withdraw.lua`: the giving half of a transfer between two segments. Its keys (in the order
//! the script declares them), its arguments and its reply, in one place; the script itself is in
//! the registry (`super`).

use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};

impl SegmentKeys {
    pub fn for_withdraw(&self, version: u64) -> [String; 6] {
        [
            self.stock(version),
            self.ledger(version),
            self.transfers(),
            self.acknowledged(),
            self.master(),
            self.reservations(),
        ]
    }
}

/// The call to `lua/withdraw.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait WithdrawScript: Send + Sync {
    /// `lua/withdraw.lua` (see the implementation on [`StockStore`] below).
    fn withdraw(
        &self,
        giver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> impl std::future::Future<Output = Result<u64, StoreError>> + Send;
}

impl WithdrawScript for StockStore {
    /// First half of moving units between segments: takes up to `want` units of `version` out
    /// of `giver`. Returns the units taken (0: it has none, or that version is not on sale there);
    /// [`StoreError::Fenced`] when the giver's master was replaced (the failover fence).
    async fn withdraw(
        &self,
        giver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> Result<u64, StoreError> {
        let mut invocation = super::WITHDRAW.prepare_invoke();
        let keys = self.keys.of(giver).for_withdraw(version);
        for key in &keys {
            invocation.key(key);
        }
        invocation
            .arg(transfer_id)
            .arg(want)
            .arg(to)
            .arg(version)
            .arg(self.failover.expected(&keys[4]));
        let (most, life) = self.failover.watermark(&keys[4]).seen();
        invocation.arg(most).arg(life);
        let taken: i64 = self
            .eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await?;
        if taken < 0 {
            self.failover.saw_fenced(&keys[4]);
            return Err(StoreError::Fenced);
        }
        Ok(taken as u64)
    }
}
