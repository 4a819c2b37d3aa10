//! `lua/sweep.lua`: expire what is due, or hand it out for an order lookup (a bounded batch). Its
//! keys (in the order the script declares them), its arguments and its reply, in one place; the
//! script itself is in the registry (`super`).

use super::super::failover::unacked::FateWrite;
use super::super::records::{int, string};
use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use redis::Value;
use std::time::Duration;

impl SegmentKeys {
    pub fn for_sweep(&self, version: u64) -> [String; 8] {
        [
            self.pending(version),
            self.reservations(),
            self.users(),
            self.stock(version),
            self.ledger(version),
            self.events(),
            self.master(),
            self.known(),
        ]
    }
}

/// How a sweep hands due reservations out for an order lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupLease {
    /// Due again this long after being handed out, unless settled meanwhile.
    pub lease: Duration,
    /// Released as expired once this long past the hold deadline; `None`: never.
    pub give_up_after: Option<Duration>,
}

/// What one sweep call did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SweepOutcome {
    pub released: u64,
    pub units: u64,
    /// Due entries looked at; a full batch means more may be due.
    pub scanned: u64,
    /// Released reservations whose version was no longer on sale (units retired).
    pub retired: u64,
    /// Due reservations handed out to ask the backend about (order lookup).
    pub for_lookup: Vec<Leased>,
}

/// A reservation a sweep handed out for an order lookup, with the fence the hand-out set: a
/// "not found" releases it only under that fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub id: String,
    pub fence: u64,
}

impl SweepOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let n = |i: usize| int(reply.get(i)).and_then(|v| u64::try_from(v).ok());
        Some(SweepOutcome {
            released: n(0)?,
            units: n(1)?,
            scanned: n(2)?,
            retired: n(3)?,
            for_lookup: reply[4.min(reply.len())..]
                .chunks(2)
                .map(|pair| {
                    Some(Leased {
                        id: string(pair.first())?,
                        fence: string(pair.get(1))?.parse().ok()?,
                    })
                })
                .collect::<Option<_>>()?,
        })
    }
}

/// The call to `lua/sweep.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait SweepScript: Send + Sync {
    /// `lua/sweep.lua` (see the implementation on [`StockStore`] below).
    fn sweep(
        &self,
        segment: Segment<'_>,
        version: u64,
        batch: u32,
        lookup: Option<LookupLease>,
    ) -> impl std::future::Future<Output = Result<SweepOutcome, StoreError>> + Send;
}

impl SweepScript for StockStore {
    /// Handles up to `batch` pending reservations of one version whose time has come: released
    /// as expired, or, with a `lookup`, handed out to ask the backend about (and due again after
    /// its lease unless settled meanwhile; released as expired once past its give-up time).
    /// In doubt, hold: nothing at all while the segment is fenced or lost for this gateway (its
    /// fencing token, as a reserve's), and a reservation held in doubt is never released by
    /// expiry (see `lua/sweep.lua`).
    /// With `redis.ack_replicas`, followed by its `WAIT` (see `failover::unacked`).
    async fn sweep(
        &self,
        segment: Segment<'_>,
        version: u64,
        batch: u32,
        lookup: Option<LookupLease>,
    ) -> Result<SweepOutcome, StoreError> {
        let keys = self.keys.of(segment).for_sweep(version);
        let expected = self.failover.expected(&keys[6]);
        let (most, life) = self.failover.watermark(&keys[6]).seen();
        let mut cmd = super::super::client::evalsha(&super::SWEEP, keys.len());
        for key in &keys {
            cmd.arg(key);
        }
        cmd.arg(batch)
            .arg(self.events_maxlen)
            .arg(lookup.map_or(0, |l| l.lease.as_millis().max(1) as u64))
            .arg(
                lookup
                    .and_then(|l| l.give_up_after)
                    .map_or(0, |g| g.as_millis().max(1) as u64),
            )
            .arg(expected)
            .arg(most)
            .arg(life);
        let reply: Vec<Value> = self
            .fate_call(
                segment,
                ScriptName::Sweep,
                &super::SWEEP,
                StoreOp::Sweep,
                &cmd,
                // Kept when it released units. A sweep whose answer was lost is not: an expiry
                // the replica never got is made again there by its own sweep (the hold expired
                // there too), and no reserve acknowledged after it could miss it (replication
                // is in order).
                |reply: Option<&Vec<Value>>| {
                    reply
                        .and_then(|r| int(r.first()))
                        .is_some_and(|released| released > 0)
                        .then_some(FateWrite::Sweep)
                },
            )
            .await?;
        SweepOutcome::parse(&reply).ok_or_else(|| StoreError::protocol(ScriptName::Sweep, reply))
    }
}
