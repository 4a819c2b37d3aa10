//! `lua/confirm.lua`: mark reservations sold (a batch), or count a late acceptance. Its keys (in
//! the order the script declares them), its arguments and its reply, in one place; the script
//! itself is in the registry (`super`).

use super::super::failover::unacked::FateWrite;
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

/// The call to `lua/confirm.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait ConfirmScript: Send + Sync {
    /// `lua/confirm.lua` (see the implementation on [`StockStore`] below).
    fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> impl std::future::Future<Output = Result<Vec<ConfirmOutcome>, StoreError>> + Send;
}

impl ConfirmScript for StockStore {
    /// Moves pending reservations of one version to confirmed, each exactly once; one outcome
    /// per id, in order. The caller keeps batches small (one script call confirms them all).
    /// With `redis.ack_replicas`, followed by its `WAIT`; a confirm not acknowledged is kept
    /// and sent again (see `failover::unacked`), its outcomes returned all the same.
    async fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<ConfirmOutcome>, StoreError> {
        let cmd = self.confirm_cmd(segment, version, reservation_ids, via);
        self.redis
            .observe_batch(ScriptName::Confirm, reservation_ids.len());
        let reply: Vec<i64> = self
            .fate_call(
                segment,
                ScriptName::Confirm,
                &super::CONFIRM,
                StoreOp::Confirm,
                &cmd,
                |_| {
                    Some(FateWrite::Confirm {
                        version,
                        ids: reservation_ids.iter().map(|id| (*id).to_owned()).collect(),
                        via,
                    })
                },
            )
            .await?;
        let outcomes: Option<Vec<ConfirmOutcome>> =
            reply.iter().map(|&r| ConfirmOutcome::parse(r)).collect();
        match outcomes {
            Some(o) if o.len() == reservation_ids.len() => Ok(o),
            _ => Err(StoreError::protocol(ScriptName::Confirm, reply)),
        }
    }
}

impl StockStore {
    /// The confirm sent again (an unacknowledged one, by the master check): no `WAIT`, not kept
    /// again (the check keeps it until its own `WAIT` covers it).
    pub(in crate::stock) async fn confirm_again(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<i64>, StoreError> {
        let cmd = self.confirm_cmd(segment, version, reservation_ids, via);
        self.redis
            .once_more(true, || {
                self.redis
                    .eval_cmd(ScriptName::Confirm, &super::CONFIRM, StoreOp::Confirm, &cmd)
            })
            .await
    }

    fn confirm_cmd(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> redis::Cmd {
        let keys = self.keys.of(segment).for_confirm(version);
        let mut cmd = super::super::client::evalsha(&super::CONFIRM, keys.len());
        for key in &keys {
            cmd.arg(key);
        }
        cmd.arg(version).arg(via.as_str()).arg(self.events_maxlen);
        for id in reservation_ids {
            cmd.arg(*id);
        }
        cmd
    }
}
