//! `lua/release.lua`: give a reservation's units back, exactly once, as far as the caller may. Its
//! keys (in the order the script declares them), its arguments and its reply, in one place; the
//! script itself is in the registry (`super`).

use super::super::failover::unacked::FateWrite;
use super::super::{
    ReleaseReason, ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp,
};

impl SegmentKeys {
    pub fn for_release(&self, version: u64) -> [String; 8] {
        [
            self.reservations(),
            self.users(),
            self.stock(version),
            self.ledger(version),
            self.pending(version),
            self.events(),
            self.master(),
            self.known(),
        ]
    }
}

/// Who asks for a release, which decides what may be released (see `lua/release.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseMode {
    /// The request that made the reservation failed: pending only, and not once a replay handed
    /// the reservation to another request.
    Owner,
    /// The request that sent the reserve does not know whether it landed: as `Owner`, and an
    /// unknown id is tombstoned so the reserve can never land later.
    Abandon,
    /// The backend said it holds no such order: pending only, and only if the reservation's
    /// fence is still the one the sweep's hand-out set (nothing forwarded or handed out since
    /// the question was asked).
    Lookup { fence: u64 },
    /// The backend or an operator cancels: pending or confirmed.
    Admin,
}

impl ReleaseMode {
    /// The fence a release names (`ARGV[6]` of `lua/release.lua`; lookup only).
    pub fn fence(self) -> Option<u64> {
        match self {
            ReleaseMode::Lookup { fence } => Some(fence),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseMode::Owner => "owner",
            ReleaseMode::Abandon => "abandon",
            ReleaseMode::Lookup { .. } => "lookup",
            ReleaseMode::Admin => "admin",
        }
    }
}

/// What the release script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Units returned; `remaining` is `None` when the version is no longer on sale in that
    /// segment (the units are then counted as retired: stock is never created from nothing).
    Released {
        remaining: Option<u64>,
    },
    AlreadyReleased,
    Unknown,
    VersionMismatch,
    /// Kept: it is confirmed, and only an admin release gives back a confirmed sale.
    KeptConfirmed,
    /// Kept: an idempotent replay handed it to another request.
    KeptReplayed,
    /// Kept: a lookup's answer older than a forward (a replay) or a hand-out since.
    Fenced,
    /// Kept: a lookup's "not found" before the hold deadline (its token is still valid, so a
    /// slow backend may still take the order); asked again at the deadline.
    TooEarly,
}

impl ReleaseOutcome {
    pub(super) fn parse(reply: &[i64]) -> Option<Self> {
        Some(match (reply.first()?, reply.get(1)?) {
            (1, remaining) => ReleaseOutcome::Released {
                remaining: u64::try_from(*remaining).ok(),
            },
            (0, _) => ReleaseOutcome::AlreadyReleased,
            (-1, _) => ReleaseOutcome::Unknown,
            (-2, _) => ReleaseOutcome::VersionMismatch,
            (-3, _) => ReleaseOutcome::KeptConfirmed,
            (-4, _) => ReleaseOutcome::KeptReplayed,
            (-5, _) => ReleaseOutcome::Fenced,
            (-6, _) => ReleaseOutcome::TooEarly,
            _ => return None,
        })
    }
}

/// The call to `lua/release.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait ReleaseScript: Send + Sync {
    /// `lua/release.lua` (see the implementation on [`StockStore`] below).
    fn release(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> impl std::future::Future<Output = Result<ReleaseOutcome, StoreError>> + Send;
}

impl ReleaseScript for StockStore {
    /// Gives a reservation's units back to its version's stock (or retires them) and to its
    /// user, exactly once, as far as `mode` allows (see [`ReleaseMode`]). With
    /// `redis.ack_replicas`, followed by its `WAIT`; a release not acknowledged is kept and
    /// sent again (see `failover::unacked`), its outcome returned all the same.
    async fn release(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        let cmd = self.release_cmd(segment, version, reservation_id, mode, reason);
        let reply: Vec<i64> = self
            .fate_call(
                segment,
                ScriptName::Release,
                &super::RELEASE,
                StoreOp::Release,
                &cmd,
                |_| {
                    Some(FateWrite::Release {
                        version,
                        id: reservation_id.to_owned(),
                        mode,
                        reason,
                    })
                },
            )
            .await?;
        ReleaseOutcome::parse(&reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Release, reply))
    }
}

impl StockStore {
    /// The release sent again (an unacknowledged one, by the master check): no `WAIT`, not
    /// kept again (the check keeps it until its own `WAIT` covers it).
    pub(in crate::stock) async fn release_again(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> Result<Vec<i64>, StoreError> {
        let cmd = self.release_cmd(segment, version, reservation_id, mode, reason);
        self.redis
            .once_more(true, || {
                self.redis
                    .eval_cmd(ScriptName::Release, &super::RELEASE, StoreOp::Release, &cmd)
            })
            .await
    }

    fn release_cmd(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> redis::Cmd {
        let keys = self.keys.of(segment).for_release(version);
        let expected = self.failover.expected(&keys[6]);
        let (most, life, sold) = self.failover.watermark(&keys[6]).token();
        let mut cmd = super::super::client::evalsha(&super::RELEASE, keys.len());
        for key in &keys {
            cmd.arg(key);
        }
        cmd.arg(reservation_id)
            .arg(version)
            .arg(reason.as_str())
            .arg(mode.as_str())
            .arg(self.events_maxlen)
            .arg(mode.fence().map(|f| f.to_string()).unwrap_or_default())
            .arg(expected)
            .arg(most)
            .arg(life)
            .arg(sold);
        cmd
    }
}
