//! `lua/confirm.lua`: mark reservations sold (a batch), or count a late acceptance. Its keys (in
//! the order the script declares them), its arguments and its reply, in one place; the script
//! itself is in the registry (`super`).

use super::super::{
    ConfirmedVia, ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp,
};

impl SegmentKeys {
    pub fn for_confirm(&self, version: u64) -> [String; 6] {
        [
            self.reservations(),
            self.ledger(version),
            self.pending(version),
            self.events(),
            self.stock(version),
            self.users(),
        ]
    }
}

/// What the confirm script did with one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmOutcome {
    Confirmed,
    AlreadyConfirmed,
    /// Too late: the reservation was released (cancelled, failed or expired).
    Released,
    /// Released, yet the backend took the order (its 2xx, or its order lookup): counted as
    /// accepted late, and covered by a unit of the version's stock.
    LateCovered,
    /// The same with no stock left to cover it: the version is oversold by its units.
    LateOversold,
    Unknown,
    VersionMismatch,
}

impl ConfirmOutcome {
    /// Whether the reservation had been released (too late to confirm), accepted late or not.
    pub fn released(self) -> bool {
        matches!(
            self,
            ConfirmOutcome::Released | ConfirmOutcome::LateCovered | ConfirmOutcome::LateOversold
        )
    }

    /// The backend accepted it after its release: what became of its units.
    pub fn late(self) -> Option<super::super::LateOutcome> {
        match self {
            ConfirmOutcome::LateCovered => Some(super::super::LateOutcome::Covered),
            ConfirmOutcome::LateOversold => Some(super::super::LateOutcome::Oversold),
            _ => None,
        }
    }

    pub(super) fn parse(reply: i64) -> Option<Self> {
        Some(match reply {
            1 => ConfirmOutcome::Confirmed,
            0 => ConfirmOutcome::AlreadyConfirmed,
            -1 => ConfirmOutcome::Unknown,
            -2 => ConfirmOutcome::VersionMismatch,
            -3 => ConfirmOutcome::Released,
            -4 => ConfirmOutcome::LateCovered,
            -5 => ConfirmOutcome::LateOversold,
            _ => return None,
        })
    }
}

impl StockStore {
    /// Moves pending reservations of one version to confirmed, each exactly once; one outcome
    /// per id, in order. The caller keeps batches small (one script call confirms them all).
    pub async fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<ConfirmOutcome>, StoreError> {
        let mut invocation = super::CONFIRM.prepare_invoke();
        for key in self.keys.of(segment).for_confirm(version) {
            invocation.key(key);
        }
        invocation
            .arg(version)
            .arg(via.as_str())
            .arg(self.events_maxlen);
        for id in reservation_ids {
            invocation.arg(*id);
        }
        self.redis
            .observe_batch(ScriptName::Confirm, reservation_ids.len());
        let reply: Vec<i64> = self
            .eval(ScriptName::Confirm, StoreOp::Confirm, &invocation)
            .await?;
        let outcomes: Option<Vec<ConfirmOutcome>> =
            reply.iter().map(|&r| ConfirmOutcome::parse(r)).collect();
        match outcomes {
            Some(o) if o.len() == reservation_ids.len() => Ok(o),
            _ => Err(StoreError::protocol(ScriptName::Confirm, reply)),
        }
    }
}
