//! `lua/deposit.lua`: the receiving half of a transfer, once per transfer. Its keys (in the order
//! the script declares them), its arguments and its reply, in one place; the script itself is in
//! the registry (`super`).

use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};

impl SegmentKeys {
    pub fn for_deposit(&self, version: u64) -> [String; 3] {
        [self.stock(version), self.ledger(version), self.received()]
    }
}

/// What a deposit (the second half of a transfer) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deposit {
    /// The units arrived now.
    Landed,
    /// They had arrived before (once per transfer id).
    AlreadyLanded,
    /// They cannot land: no ledger of their version here, or the segment lost its book of
    /// received transfers. Nothing changed; the transfer stays in flight (never acknowledged).
    Refused,
}

impl Deposit {
    pub(super) fn parse(code: i64) -> Option<Deposit> {
        match code {
            1 => Some(Deposit::Landed),
            0 => Some(Deposit::AlreadyLanded),
            -1 | -2 => Some(Deposit::Refused),
            _ => None,
        }
    }

    /// Whether the giver may forget the transfer (acknowledge it).
    pub fn arrived(self) -> bool {
        self != Deposit::Refused
    }
}

/// The call to `lua/deposit.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait DepositScript: Send + Sync {
    /// `lua/deposit.lua` (see the implementation on [`StockStore`] below).
    fn deposit(
        &self,
        receiver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        qty: u64,
    ) -> impl std::future::Future<Output = Result<Deposit, StoreError>> + Send;
}

impl DepositScript for StockStore {
    /// Second half on its own: the units arrive in `version` of `receiver`, once per transfer id.
    /// `Ok(false)` if they had arrived already (or that version has no ledger there).
    async fn deposit(
        &self,
        receiver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        qty: u64,
    ) -> Result<Deposit, StoreError> {
        let mut invocation = super::DEPOSIT.prepare_invoke();
        for key in self.keys.of(receiver).for_deposit(version) {
            invocation.key(key);
        }
        invocation.arg(transfer_id).arg(qty);
        let code: i64 = self
            .eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await?;
        Deposit::parse(code).ok_or_else(|| StoreError::protocol(ScriptName::Transfer, code))
    }
}
