//! Reads of one segment (and of the activity registry): metas, ledgers, records, transfer
//! books and the reconcile snapshot. Nothing here changes stock; each read is bounded by the
//! store's time budget (the snapshot, for reconcile only, by a longer one).

use super::records::from;
use super::scripts;
use super::Reads;
use super::{
    LedgerRow, ReservationRecord, ScriptName, Segment, SegmentMeta, StockStore, StoreError, StoreOp,
};
use redis::Value;
use std::time::Duration;

/// An outgoing transfer not yet acknowledged by its giving segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub id: String,
    pub version: u64,
    /// The receiving segment's index.
    pub to: u32,
    pub qty: u64,
    /// When it was withdrawn (Redis time, unix ms).
    pub at_ms: u64,
}

impl Transfer {
    fn parse(id: String, raw: &str) -> Option<Transfer> {
        let mut parts = raw.split('|');
        let transfer = Transfer {
            id,
            version: parts.next()?.parse().ok()?,
            to: parts.next()?.parse().ok()?,
            qty: parts.next()?.parse().ok()?,
            at_ms: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(transfer)
    }
}

/// One segment read in one MULTI/EXEC (see [`StockStore::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Every version the segment's meta listed in the same transaction: when it is not the
    /// list asked for (a version went on sale meanwhile), take the snapshot again with it.
    pub versions: Vec<u64>,
    /// The version on sale here, as the meta said in the same transaction.
    pub current: Option<u64>,
    /// Whether the segment had a meta at all.
    pub meta_exists: bool,
    pub ledgers: Vec<LedgerRow>,
    pub records: Vec<ReservationRecord>,
    pub books: TransferBooks,
}

/// A segment's transfer records.
#[derive(Debug, Clone, Default)]
pub struct TransferBooks {
    /// Given, not yet acknowledged (in flight, or arrived and not yet known to have).
    pub open: Vec<Transfer>,
    pub acknowledged: Vec<Transfer>,
    /// Received: transfer id -> units.
    pub received: std::collections::HashMap<String, u64>,
}

/// A hash's fields and values, as HGETALL answers.
type Fields = Vec<(String, String)>;

impl Reads for StockStore {
    /// A segment's meta (the base tag's also carries the activity's segment count).
    async fn meta(&self, segment: Segment<'_>) -> Result<SegmentMeta, StoreError> {
        let fields: Vec<(String, String)> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGETALL").arg(self.keys.of(segment).meta()),
            )
            .await?;
        Ok(SegmentMeta::parse(fields))
    }

    /// The base tag's meta of a stock lane (`Activity::lane`: an activity id, or
    /// `<id>~<variant>`): its segment count, if it was ever prewarmed.
    async fn base_meta(&self, id: &str) -> Result<SegmentMeta, StoreError> {
        let layout = super::Layout::of_lane(id, 1);
        let fields: Vec<(String, String)> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGETALL").arg(self.keys.base(&layout).meta()),
            )
            .await?;
        Ok(SegmentMeta::parse(fields))
    }

    /// Transfers a segment gave but has not seen acknowledged, with Redis's time now (ms).
    async fn transfers(&self, giver: Segment<'_>) -> Result<(Vec<Transfer>, u64), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(self.keys.of(giver).transfers())
            .cmd("TIME");
        let (raw, (secs, micros)): (Vec<(String, String)>, (u64, u64)) = self
            .redis
            .pipeline(StoreOp::Read, self.timeout(), &pipe, None)
            .await?;
        let transfers = raw
            .into_iter()
            .filter(|(id, _)| !id.is_empty())
            .filter_map(|(id, raw)| Transfer::parse(id, &raw))
            .collect();
        Ok((transfers, secs * 1000 + micros / 1000))
    }

    /// A reservation's record, if the segment has one with that id.
    async fn lookup(
        &self,
        segment: Segment<'_>,
        reservation_id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let raw: Option<String> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGET")
                    .arg(self.keys.of(segment).reservations())
                    .arg(reservation_id),
            )
            .await?;
        raw.filter(|r| !r.is_empty())
            .map(|raw| {
                ReservationRecord::parse(&raw).ok_or_else(|| StoreError::Protocol {
                    script: "reservation record",
                    reply: raw,
                })
            })
            .transpose()
    }

    /// Every activity id ever prewarmed (and not yet expired), with its segment count.
    async fn registered(&self) -> Result<Vec<(String, u32)>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HGETALL").arg(self.keys.registry()),
        )
        .await
    }

    /// The segment count the registry recorded for an activity.
    async fn registered_segments(&self, id: &str) -> Result<Option<u32>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HGET").arg(self.keys.registry()).arg(id),
        )
        .await
    }
}

impl StockStore {
    /// Whether a segment has its meta, or the placeholders prewarm gave its users and records
    /// (what a lost meta leaves behind; a hash holding only tombstones of abandoned reserves
    /// does not count).
    pub async fn has_keys(&self, segment: Segment<'_>) -> Result<bool, StoreError> {
        let keys = self.keys.of(segment);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS")
            .arg(keys.meta())
            .cmd("HEXISTS")
            .arg(keys.users())
            .arg("")
            .cmd("HEXISTS")
            .arg(keys.reservations())
            .arg("");
        let found: (u64, u64, u64) = self
            .redis
            .pipeline(StoreOp::Read, self.timeout(), &pipe, None)
            .await?;
        Ok(found.0 + found.1 + found.2 > 0)
    }
}

impl StockStore {
    /// The newest version of a stock lane (`Activity::lane`) ever claimed (its floor, kept after every other key
    /// expired), if it was ever put on sale.
    pub async fn floor(&self, id: &str) -> Result<Option<u64>, StoreError> {
        let layout = super::Layout::of_lane(id, 1);
        self.query(
            StoreOp::Read,
            redis::cmd("GET").arg(self.keys.base(&layout).floor()),
        )
        .await
    }

    /// Whether a segment's buyers' units still carry prewarm's placeholder (a hash Redis lost,
    /// or that was made again without it, does not: `lua/recount.lua`'s `users_lost`).
    pub async fn users_marked(&self, segment: Segment<'_>) -> Result<bool, StoreError> {
        let marked: u64 = self
            .query(
                StoreOp::Read,
                redis::cmd("HEXISTS")
                    .arg(self.keys.of(segment).users())
                    .arg(""),
            )
            .await?;
        Ok(marked == 1)
    }

    /// The units `user` holds in a segment (pending or confirmed, every version; their home
    /// segment is where the reserve counts them for the per-user limit): 0 when none.
    pub async fn units_held(&self, segment: Segment<'_>, user: &str) -> Result<u64, StoreError> {
        let held: Option<u64> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGET")
                    .arg(self.keys.of(segment).users())
                    .arg(user),
            )
            .await?;
        Ok(held.unwrap_or(0))
    }

    /// Records on a segmented activity's base meta that its segment `index` was made (put on
    /// sale): from then on, that segment found empty lost everything (see `lua/prewarm.lua`).
    pub async fn mark_made(&self, layout: &super::Layout, index: u32) -> Result<(), StoreError> {
        self.query(
            StoreOp::Prewarm,
            redis::cmd("HSET")
                .arg(self.keys.base(layout).meta())
                .arg(format!("made:{index}"))
                .arg(1),
        )
        .await
        .map(|_: i64| ())
    }

    /// Writes an activity's base meta again (its segment count and newest version) after its
    /// keys were lost, for an operator's recount: what the claim writes, without its refusal of
    /// a version whose keys are gone.
    pub async fn reclaim(
        &self,
        layout: &super::Layout,
        version: u64,
        expire_at: u64,
    ) -> Result<(), StoreError> {
        let meta = self.keys.base(layout).meta();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HSET")
            .arg(&meta)
            .arg("segments")
            .arg(layout.count())
            .arg("version")
            .arg(version)
            .ignore()
            .cmd("EXPIREAT")
            .arg(&meta)
            .arg(expire_at)
            .ignore();
        self.redis
            .pipeline(StoreOp::Prewarm, self.timeout(), &pipe, None)
            .await
    }
}

impl StockStore {
    /// Every transfer a segment gave, read in one MULTI/EXEC: (not yet acknowledged,
    /// acknowledged). Reconcile checks each transfer another segment received against them,
    /// and each acknowledged one against its receiver's book.
    pub async fn transfers_given(
        &self,
        giver: Segment<'_>,
    ) -> Result<(Vec<Transfer>, Vec<Transfer>), StoreError> {
        let keys = self.keys.of(giver);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGETALL")
            .arg(keys.transfers())
            .cmd("HGETALL")
            .arg(keys.acknowledged());
        let budget = self.timeout().max(Duration::from_secs(10));
        let (open, done): (Fields, Fields) = self
            .redis
            .pipeline(StoreOp::Read, budget, &pipe, None)
            .await?;
        let parse = |fields: Fields| -> Vec<Transfer> {
            fields
                .into_iter()
                .filter(|(id, _)| !id.is_empty())
                .filter_map(|(id, raw)| Transfer::parse(id, &raw))
                .collect()
        };
        Ok((parse(open), parse(done)))
    }

    /// Redis's `maxmemory-policy`, if it lets us read it (managed services may hide CONFIG).
    /// Anything but `noeviction` may evict flashgate's keys (all of which expire, so the
    /// `volatile-*` policies too), and a lost key can sell units twice.
    pub async fn eviction_policy(&self) -> Result<Option<String>, StoreError> {
        let reply: Result<Vec<String>, StoreError> = self
            .query(
                StoreOp::Read,
                redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"),
            )
            .await;
        Ok(match reply {
            Ok(pair) => pair.into_iter().nth(1),
            Err(StoreError::Redis(e)) if e.kind() != redis::ErrorKind::Io => None,
            Err(e) => return Err(e),
        })
    }

    /// Whether a segment has received a transfer.
    pub async fn received(
        &self,
        receiver: Segment<'_>,
        transfer_id: &str,
    ) -> Result<bool, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HEXISTS")
                .arg(self.keys.of(receiver).received())
                .arg(transfer_id),
        )
        .await
    }
}

impl StockStore {
    /// Every reservation record of a segment, the ledgers of the given versions and its
    /// transfer books, read in one MULTI/EXEC snapshot (for `flashgate reconcile`;
    /// O(reservations), not for the hot path).
    pub async fn snapshot(
        &self,
        segment: Segment<'_>,
        versions: &[u64],
    ) -> Result<Snapshot, StoreError> {
        let keys = self.keys.of(segment);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for &v in versions {
            // EVALSHA inside MULTI: a NOSCRIPT (after a restart or SCRIPT FLUSH) fails the
            // transaction, which is then sent again once the script is loaded.
            pipe.cmd("EVALSHA")
                .arg(scripts::LEDGER.get_hash())
                .arg(3)
                .arg(keys.for_ledger(v).as_slice());
        }
        pipe.cmd("HGETALL").arg(keys.reservations());
        for key in [
            keys.transfers(),
            keys.acknowledged(),
            keys.received(),
            keys.meta(),
        ] {
            pipe.cmd("HGETALL").arg(key);
        }
        // An operator command: allowed more time than a buyer's request.
        let budget = self.timeout().max(Duration::from_secs(10));
        let values: Vec<Value> = self
            .redis
            .pipeline(StoreOp::Read, budget, &pipe, Some(&scripts::LEDGER))
            .await?;
        let n = versions.len();
        if values.len() != n + 5 {
            return Err(StoreError::protocol(ScriptName::Ledger, "snapshot"));
        }
        let mut ledgers = Vec::with_capacity(n);
        for (value, &v) in values.iter().zip(versions) {
            let reply: Vec<i64> = from(value)?;
            ledgers.push(
                LedgerRow::parse(v, &reply)
                    .ok_or_else(|| StoreError::protocol(ScriptName::Ledger, reply))?,
            );
        }
        let records = parse_records(from(&values[n])?)?;
        let transfers = |v: &Value| -> Result<Vec<Transfer>, StoreError> {
            let raw: Vec<(String, String)> = from(v)?;
            Ok(raw
                .into_iter()
                .filter(|(id, _)| !id.is_empty())
                .filter_map(|(id, raw)| Transfer::parse(id, &raw))
                .collect())
        };
        let received: Vec<(String, String)> = from(&values[n + 3])?;
        let meta: Vec<(String, String)> = from(&values[n + 4])?;
        let meta_exists = !meta.is_empty();
        let meta = SegmentMeta::parse(meta);
        Ok(Snapshot {
            versions: meta.versions,
            current: meta.current,
            meta_exists,
            ledgers,
            records,
            books: TransferBooks {
                open: transfers(&values[n + 1])?,
                acknowledged: transfers(&values[n + 2])?,
                received: received
                    .into_iter()
                    .filter(|(id, _)| !id.is_empty())
                    .filter_map(|(id, qty)| Some((id, qty.parse().ok()?)))
                    .collect(),
            },
        })
    }

    /// Units taken in each of `phases` (a sale in phases: the ledger's `sold@<phase>`, see
    /// `lua/reserve.lua`) in the lane's configured version, summed over its segments; 0 where
    /// none were (or the ledger is gone).
    pub async fn phase_sold(
        &self,
        lane: &crate::config::Activity,
        phases: &[&str],
    ) -> Result<Vec<u64>, StoreError> {
        let mut sold = vec![0u64; phases.len()];
        if phases.is_empty() {
            return Ok(sold);
        }
        for segment in super::Layout::of(lane).segments() {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(self.keys.of(segment).ledger(lane.version));
            for p in phases {
                cmd.arg(format!("sold@{p}"));
            }
            let counts: Vec<Option<u64>> = self.query(StoreOp::Read, &cmd).await?;
            for (total, n) in sold.iter_mut().zip(counts) {
                *total += n.unwrap_or(0);
            }
        }
        Ok(sold)
    }

    /// A lane's second-chance line: buyers waiting, units held for its first ones, and units it
    /// sold (the ledger's `line_sold`, of the configured version).
    pub async fn line_figures(
        &self,
        lane: &crate::config::Activity,
    ) -> Result<(u64, u64, u64), StoreError> {
        let layout = super::Layout::of(lane);
        let keys = self.keys.of(layout.segment(0).expect("a first segment"));
        let waiting: u64 = self
            .query(StoreOp::Read, redis::cmd("ZCARD").arg(keys.line()))
            .await?;
        let held: u64 = self
            .query(StoreOp::Read, redis::cmd("HLEN").arg(keys.line_holds()))
            .await?;
        let sold: Option<u64> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGET")
                    .arg(keys.ledger(lane.version))
                    .arg("line_sold"),
            )
            .await?;
        Ok((waiting, held, sold.unwrap_or(0)))
    }

    /// Units remaining in `version` of one segment; `None` if its key does not exist.
    pub async fn remaining(
        &self,
        segment: Segment<'_>,
        version: u64,
    ) -> Result<Option<i64>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("GET").arg(self.keys.of(segment).stock(version)),
        )
        .await
    }

    /// Records an activity id as prewarmed, with its segment count (called once the claim on its
    /// base tag succeeded, so the two agree), so that sweeps reach it even once it is removed
    /// from the configuration, and so that the count has a second record outside the activity's
    /// own keys. The registry lives as long as the longest-lived activity.
    pub async fn register(
        &self,
        id: &str,
        segments: u32,
        expire_at: u64,
    ) -> Result<(), StoreError> {
        let key = self.keys.registry();
        let mut pipe = redis::pipe();
        pipe.cmd("HSET").arg(&key).arg(id).arg(segments).ignore();
        pipe.cmd("EXPIREAT")
            .arg(&key)
            .arg(expire_at)
            .arg("NX")
            .ignore();
        pipe.cmd("EXPIREAT")
            .arg(&key)
            .arg(expire_at)
            .arg("GT")
            .ignore();
        self.redis
            .pipeline::<()>(StoreOp::Prewarm, self.timeout(), &pipe, None)
            .await
    }
}

/// Every record of a records hash (HGETALL) but the placeholder (field '', whose value names
/// the records' life).
fn parse_records(raw: Fields) -> Result<Vec<ReservationRecord>, StoreError> {
    raw.iter()
        .filter(|(id, _)| !id.is_empty())
        .map(|(_, r)| {
            ReservationRecord::parse(r).ok_or_else(|| StoreError::Protocol {
                script: "reservation record",
                reply: r.clone(),
            })
        })
        .collect()
}
