//! `lua/acknowledge.lua`: the giver forgets a transfer that landed. Its keys (in the order the
//! script declares them), its arguments and its reply, in one place; the script itself is in the
//! registry (`super`).

use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};

impl SegmentKeys {
    pub fn for_acknowledge(&self) -> [String; 2] {
        [self.transfers(), self.acknowledged()]
    }
}

/// The call to `lua/acknowledge.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait AcknowledgeScript: Send + Sync {
    /// `lua/acknowledge.lua` (see the implementation on [`StockStore`] below).
    fn acknowledge(
        &self,
        giver: Segment<'_>,
        transfer_id: &str,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send;
}

impl AcknowledgeScript for StockStore {
    /// The giving segment learns a transfer arrived (it is kept, as acknowledged).
    async fn acknowledge(&self, giver: Segment<'_>, transfer_id: &str) -> Result<(), StoreError> {
        let mut invocation = super::ACKNOWLEDGE.prepare_invoke();
        for key in self.keys.of(giver).for_acknowledge() {
            invocation.key(key);
        }
        invocation.arg(transfer_id);
        self.eval::<i64>(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await
            .map(|_| ())
    }
}
