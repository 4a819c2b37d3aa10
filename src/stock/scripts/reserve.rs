//! `lua/reserve.lua`: take units for one buyer in one segment (or hand back what their
//! `Idempotency-Key` won). Its keys (in the order the script declares them), its arguments and its
//! reply, in one place; the script itself is in the registry (`super`).

use super::super::records::{int, string};
use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use crate::coalesce::Batcher;
use crate::config::Activity;
use redis::Value;
use std::sync::Arc;
use std::time::Duration;

/// The most reserves one script call carries. Measured as instructions Redis executes
/// (callgrind, repeatable; a private redis-server 7.0, prewarmed keys): about 400,000 for a
/// reserve alone, 101,000 per reservation in batches of 20, 95,000 in batches of 32, against
/// 40,000 for the seed script's (which keeps no record, pending entry, event or key). A batch of
/// 32 holds Redis for about 32 × 30 µs ≈ 1 ms on this class of machine.
pub const MAX_BATCH: usize = 32;

/// A reserve's answer as its batch delivers it: a failed call's error is shared by its items.
type Answer = Result<ReserveOutcome, Arc<StoreError>>;

/// One segment of one activity, at one version: (activity id, segment count, segment index,
/// version, whether it has a second-chance line). Reserves of one lane go to Redis together.
type Lane = (Arc<str>, u32, u32, u64, bool);

/// How many lanes' keys are kept; past it they are dropped and made again as asked (a lane
/// is an activity's segment at one version, so only many reloads reach it).
const KEPT_LANES: usize = 1024;

/// Reserves waiting for their lane's call, and each lane's nine key names, made once per lane
/// rather than once per reserve.
pub(crate) struct Batches {
    calls: Batcher<Lane, Item, Answer>,
    keys: parking_lot::RwLock<std::collections::HashMap<Lane, Arc<[String]>>>,
}

impl Batches {
    pub(crate) fn new(max: usize) -> Batches {
        Batches {
            calls: Batcher::new(max),
            keys: Default::default(),
        }
    }

    /// `segment`'s lane at `version`, and its keys (see [`SegmentKeys::for_reserve`]; with
    /// `line`, the line's two after them).
    fn lane(
        &self,
        layout: &super::super::KeyLayout,
        segment: Segment<'_>,
        version: u64,
        line: bool,
    ) -> (Lane, Arc<[String]>) {
        let shape = segment.layout();
        let lane = (
            shape.lane().clone(),
            shape.count(),
            segment.index(),
            version,
            line,
        );
        if let Some(keys) = self.keys.read().get(&lane) {
            return (lane, keys.clone());
        }
        let of = layout.of(segment);
        let mut keys = of.for_reserve(version).to_vec();
        if line {
            keys.extend([of.line(), of.line_holds()]);
        }
        let keys: Arc<[String]> = keys.into();
        let mut kept = self.keys.write();
        if kept.len() >= KEPT_LANES {
            kept.clear();
        }
        kept.insert(lane.clone(), keys.clone());
        (lane, keys)
    }
}

/// One reserve in a batch: a [`ReserveCall`] owned, with the version left to the batch.
#[derive(Debug)]
pub(crate) struct Item {
    user: String,
    qty: u32,
    per_user_limit: u32,
    reservation_id: String,
    hold_ms: u64,
    idempotency_field: String,
    transfer: String,
    units: u64,
    in_flight_ms: u64,
    replay_only: bool,
    hours: SaleHours,
    steps: String,
}

impl Item {
    fn of(call: &ReserveCall<'_>) -> Item {
        let (transfer, units) = call.deposit.unwrap_or(("", 0));
        Item {
            user: call.user.to_owned(),
            qty: call.qty,
            per_user_limit: call.per_user_limit,
            reservation_id: call.reservation_id.to_owned(),
            hold_ms: call.hold.as_millis() as u64,
            idempotency_field: call
                .idempotency_key
                .map(|key| format!("{}\n{key}", call.user))
                .unwrap_or_default(),
            transfer: transfer.to_owned(),
            units,
            in_flight_ms: call.in_flight.as_millis() as u64,
            replay_only: call.replay_only,
            hours: call.hours,
            steps: call
                .steps
                .map_or_else(String::new, |s| s.encoded().to_owned()),
        }
    }
}

impl SegmentKeys {
    pub fn for_reserve(&self, version: u64) -> [String; 10] {
        [
            self.stock(version),
            self.users(),
            self.reservations(),
            self.ledger(version),
            self.pending(version),
            self.idempotency(),
            self.events(),
            self.received(),
            self.master(),
            self.known(),
        ]
    }
}

/// One reserve call's inputs.
#[derive(Debug, Clone, Copy)]
pub struct ReserveCall<'a> {
    pub user: &'a str,
    pub qty: u32,
    pub per_user_limit: u32,
    pub version: u64,
    pub reservation_id: &'a str,
    pub hold: Duration,
    /// The buyer's `Idempotency-Key`, if any.
    pub idempotency_key: Option<&'a str>,
    /// A transfer withdrawn from another segment, deposited in the same step: (id, units).
    pub deposit: Option<(&'a str, u64)>,
    /// The longest a forwarded request may take: the reservation is not due for the sweep
    /// before that long from now (nor, when replayed, from the replay), whatever its hold.
    pub in_flight: Duration,
    /// Only answer the `idempotency_key`'s reservation, if it has one; never take stock.
    pub replay_only: bool,
    /// When new reservations may be made, checked by the script on Redis's clock.
    pub hours: SaleHours,
    /// The buyer's phases (`None`: an activity without phases): the script takes their limit
    /// from the step in force, instead of `per_user_limit`, and refuses before the first.
    pub steps: Option<&'a super::super::Steps>,
    /// The lane has a second-chance line (`activities[].second_chance`): while anyone waits in
    /// it, the script sells only to a buyer holding a unit for it.
    pub line: bool,
}

/// A sale's hours as unix ms, `opens_ms <= now < closes_ms`, judged by the script on Redis's
/// clock: a gateway whose clock runs ahead or behind checks the hours itself first (and may
/// turn a buyer away early or late), but never reserves outside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleHours {
    pub opens_ms: i64,
    pub closes_ms: i64,
}

impl SaleHours {
    /// No bounds (tools and tests that call the store directly).
    pub const ALWAYS: SaleHours = SaleHours {
        opens_ms: i64::MIN,
        closes_ms: i64::MAX,
    };

    pub fn of(activity: &Activity) -> Self {
        SaleHours {
            opens_ms: activity.opens().timestamp_millis(),
            closes_ms: activity.ends_at.timestamp_millis(),
        }
    }
}

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    Reserved {
        remaining: u64,
        /// When it was made and when its hold runs out (Redis's clock, unix ms).
        created_ms: u64,
        deadline_ms: u64,
        /// The record's fence once this request's forward is counted (see `lua/lib.lua`).
        fence: u64,
    },
    /// The buyer's `Idempotency-Key` already won this (not released) reservation.
    Replayed {
        id: String,
        qty: u32,
        version: u64,
        /// Units left in the segment's current version, if its key exists.
        remaining: Option<u64>,
        created_ms: u64,
        deadline_ms: u64,
        /// The record's fence once this request's forward is counted.
        fence: u64,
        /// The phase it was bought in (a sale in phases), as its record keeps it.
        phase: Option<String>,
    },
    /// The key's reservation is pending past its hold deadline: being settled (expiry or the
    /// order lookup), never handed out again.
    HoldRanOut,
    /// Replay only, and the key had won nothing.
    NotReplayed,
    /// The key's reservation is for another quantity: this request is not its retry.
    ReplayQuantityDiffers {
        qty: u32,
    },
    /// The key's reservation is another variant's (of the same activity): this request is not
    /// its retry.
    ReplayOtherVariant,
    /// The key's reservation is pending under another version: asked again (replay only)
    /// with that version's keys, so the replay moves its due time where the sweep reads it.
    OtherVersion {
        version: u64,
    },
    /// The key's reservation kept changing under repeated asks (settled, then won again
    /// under another version): nothing taken, the buyer may try again.
    Contended,
    /// Before the sale's hours, by Redis's clock: nothing changed.
    NotStarted,
    /// The lane's units are its second-chance line's, and this buyer holds none of them:
    /// nothing changed.
    HeldForLine {
        remaining: u64,
    },
    /// After the sale's hours, by Redis's clock: nothing changed.
    Ended,
    /// The stock key of this version does not exist (not prewarmed yet, or retired).
    NoStockKey,
    Insufficient {
        remaining: u64,
    },
    LimitExceeded {
        held: u64,
    },
    /// The reservation id exists already (a tombstone of an abandoned attempt).
    DuplicateId,
    /// The segment lost a key it had (its users or records): refused.
    Damaged,
    /// The failover fence: this master is not the one the segment's stock was accepted under
    /// (see `stock::failover`); nothing changed.
    Fenced,
    /// The transfer to deposit first could not land (its version has no ledger here, or the
    /// segment lost its book of received transfers): nothing changed, it stays in flight.
    DepositRefused {
        /// The received book is lost (the segment is damaged).
        damaged: bool,
    },
}

impl ReserveOutcome {
    /// Whether a reserve that carried a deposit surely made it (the script deposits before
    /// every answer but these: a segment never prewarmed or damaged answers before it, a
    /// refused deposit changed nothing, and "no stock key" comes both before and after it).
    pub fn deposit_landed(&self) -> bool {
        !matches!(
            self,
            ReserveOutcome::NoStockKey
                | ReserveOutcome::Damaged
                | ReserveOutcome::Fenced
                | ReserveOutcome::DepositRefused { .. }
        )
    }

    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let at = |i: usize| int(reply.get(i));
        let unsigned = |i: usize| at(i).map(|v| v.max(0) as u64);
        // Times and fences come as integers (a new reservation) or as the record's strings.
        let ms = |i: usize| match reply.get(i) {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            other => string(other)?.parse::<u64>().ok(),
        };
        Some(match at(0)? {
            1 => ReserveOutcome::Reserved {
                remaining: unsigned(1)?,
                created_ms: ms(3)?,
                deadline_ms: ms(4)?,
                fence: ms(5)?,
            },
            2 => ReserveOutcome::Replayed {
                remaining: at(1).and_then(|r| u64::try_from(r).ok()),
                qty: u32::try_from(at(2)?).ok()?,
                id: string(reply.get(3))?,
                version: string(reply.get(4))?.parse().ok()?,
                created_ms: ms(5)?,
                deadline_ms: ms(6)?,
                fence: ms(7)?,
                phase: string(reply.get(8)).filter(|p| !p.is_empty()),
            },
            -1 => ReserveOutcome::NoStockKey,
            -2 => ReserveOutcome::Insufficient {
                remaining: unsigned(1)?,
            },
            -3 => ReserveOutcome::LimitExceeded { held: unsigned(2)? },
            -4 => ReserveOutcome::DuplicateId,
            -5 => ReserveOutcome::HoldRanOut,
            -6 => ReserveOutcome::Damaged,
            -8 => ReserveOutcome::NotReplayed,
            -13 => ReserveOutcome::Fenced,
            -9 => ReserveOutcome::NotStarted,
            -15 => ReserveOutcome::HeldForLine {
                remaining: unsigned(1)?,
            },
            -10 => ReserveOutcome::Ended,
            -11 => ReserveOutcome::ReplayQuantityDiffers {
                qty: u32::try_from(at(1)?).ok()?,
            },
            -14 => ReserveOutcome::ReplayOtherVariant,
            -12 => ReserveOutcome::OtherVersion {
                version: unsigned(1)?,
            },
            -7 => ReserveOutcome::DepositRefused {
                damaged: at(1)? == -2,
            },
            _ => return None,
        })
    }
}

/// The call to `lua/reserve.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait ReserveScript: Send + Sync {
    /// `lua/reserve.lua` in one segment (see the implementation on [`StockStore`] below).
    fn reserve(
        &self,
        segment: Segment<'_>,
        call: &ReserveCall<'_>,
    ) -> impl std::future::Future<Output = Result<ReserveOutcome, StoreError>> + Send;
}

impl ReserveScript for StockStore {
    /// Atomically checks the per-user limit and the stock, deducts, and records the reservation
    /// (ledger, hold deadline from Redis's clock, event). With an idempotency key that already
    /// won, returns that reservation instead; one pending under another version is asked for
    /// again with that version's keys (replay only), so its due time moves where the sweep
    /// reads it, and if it was settled in between, the purchase is asked for again as it was.
    async fn reserve(
        &self,
        segment: Segment<'_>,
        call: &ReserveCall<'_>,
    ) -> Result<ReserveOutcome, StoreError> {
        let mut asked = *call;
        for _ in 0..3 {
            match self.reserve_once(segment, &asked).await? {
                ReserveOutcome::OtherVersion { version } => {
                    asked = ReserveCall {
                        version,
                        replay_only: true,
                        deposit: None,
                        ..*call
                    };
                }
                ReserveOutcome::NotReplayed | ReserveOutcome::NoStockKey
                    if asked.replay_only && !call.replay_only =>
                {
                    asked = ReserveCall {
                        deposit: None,
                        ..*call
                    };
                }
                outcome => return Ok(outcome),
            }
        }
        Ok(ReserveOutcome::Contended)
    }
}

impl StockStore {
    /// One reserve, sent at once when no reserve of its segment and version is out, else
    /// together with the others that arrived meanwhile in the next call (see
    /// [`crate::coalesce::Batcher`]): judged exactly as if sent alone, in arrival order.
    async fn reserve_once(
        &self,
        segment: Segment<'_>,
        call: &ReserveCall<'_>,
    ) -> Result<ReserveOutcome, StoreError> {
        let (lane, keys) = self
            .reserves
            .lane(&self.keys, segment, call.version, call.line);
        let version = call.version;
        let answer = self
            .reserves
            .calls
            .submit(lane, Item::of(call), |items| {
                self.reserve_batch(&keys, version, items)
            })
            .await?;
        answer.map_err(StoreError::shared)
    }

    /// One reserve script call for `items` (in one segment and version), answering each in
    /// order; a failed call's error goes to every item (each may have landed).
    async fn reserve_batch(&self, keys: &[String], version: u64, items: Vec<Item>) -> Vec<Answer> {
        let n = items.len();
        let mark = self.failover.watermark(&keys[8]);
        let (most, life, seen_version) = mark.token();
        let mut call = super::super::client::evalsha(&super::RESERVE, keys.len());
        for key in keys.iter() {
            call.arg(key);
        }
        call.arg(version)
            .arg(self.events_maxlen)
            .arg(self.failover.expected(&keys[8]))
            .arg(most)
            .arg(life)
            .arg(seen_version);
        for item in &items {
            call.arg(&item.user)
                .arg(item.qty)
                .arg(item.per_user_limit)
                .arg(&item.reservation_id)
                .arg(item.hold_ms)
                .arg(&item.idempotency_field)
                .arg(&item.transfer)
                .arg(item.units)
                .arg(item.in_flight_ms)
                .arg(if item.replay_only { "1" } else { "0" })
                .arg(item.hours.opens_ms)
                .arg(item.hours.closes_ms)
                .arg(&item.steps);
        }
        self.redis.observe_batch(ScriptName::Reserve, n);
        let batch = match self.send_reserve(&call).await {
            Ok((reply, acknowledged)) => parse_batch(reply, n).map(|b| (b, acknowledged)),
            Err(e) => Err(e),
        };
        let ((mut answers, held, life), acknowledged) = match batch {
            Ok(batch) => batch,
            Err(error) => {
                let error = Arc::new(error);
                return (0..n).map(|_| Err(error.clone())).collect();
            }
        };
        if matches!(answers.first(), Some(Ok(ReserveOutcome::Fenced))) {
            self.failover.saw_fenced(&keys[8]);
        }
        let acks = |a: &Answer| {
            matches!(
                a,
                Ok(ReserveOutcome::Reserved { .. } | ReserveOutcome::Replayed { .. })
            )
        };
        if let Some(acknowledged) = acknowledged.filter(|&a| a < self.ack_replicas) {
            // Not on enough replicas in time: no winner of this call is answered. Each one that
            // holds a reservation is told the store failed (its request abandons the id it
            // made: released, as a lost reply's is; a replay's reservation is not this
            // request's, and stays).
            let error = Arc::new(StoreError::NotReplicated {
                acknowledged,
                wanted: self.ack_replicas,
            });
            for answer in answers.iter_mut().filter(|a| acks(a)) {
                *answer = Err(error.clone());
            }
        } else if answers.iter().any(acks) {
            // What this gateway acknowledged the segment holding (`failover::watermark`).
            mark.saw(&life, held, version);
        }
        answers
    }

    /// Sends one reserve call; with `redis.ack_replicas`, followed by its `WAIT` (the replicas
    /// that acknowledged it come back too).
    async fn send_reserve(
        &self,
        call: &redis::Cmd,
    ) -> Result<(Vec<Value>, Option<u32>), StoreError> {
        let source = &super::RESERVE;
        match self.ack_replicas {
            0 => self
                .redis
                .eval_cmd(ScriptName::Reserve, source, StoreOp::Reserve, call)
                .await
                .map(|reply| (reply, None)),
            replicas => self
                .redis
                .eval_cmd_acknowledged(
                    ScriptName::Reserve,
                    source,
                    StoreOp::Reserve,
                    call,
                    replicas,
                    self.timeout().as_millis() as u64,
                )
                .await
                .map(|(reply, acked)| (reply, Some(acked))),
        }
    }

    /// Test seam: holds every reserve (nothing leaves) until [`StockStore::release_reserves`],
    /// which sends each segment and version's held reserves in one call, in arrival order.
    #[doc(hidden)]
    pub fn hold_reserves(&self) {
        self.reserves.calls.hold();
    }

    /// Test seam: see [`StockStore::hold_reserves`].
    #[doc(hidden)]
    pub fn release_reserves(&self) {
        self.reserves.calls.release();
    }

    /// Test seam: reserves held or waiting for a call.
    #[doc(hidden)]
    pub fn reserves_waiting(&self) -> usize {
        self.reserves.calls.waiting()
    }
}

/// A reserve call's reply: each of its `n` items' answers, then the records the segment holds
/// once the batch is written, and their life.
fn parse_batch(mut reply: Vec<Value>, n: usize) -> Result<(Vec<Answer>, u64, String), StoreError> {
    let (life, held) = (reply.pop(), reply.pop());
    let (held, life) = match (held, life.as_ref().and_then(|l| string(Some(l)))) {
        (Some(Value::Int(held)), Some(life)) if reply.len() == n => {
            (u64::try_from(held).unwrap_or(0), life)
        }
        (held, _) => {
            return Err(StoreError::protocol(
                ScriptName::Reserve,
                (held, life, reply),
            ))
        }
    };
    let answers = reply
        .into_iter()
        .map(|one| match &one {
            Value::Array(fields) => ReserveOutcome::parse(fields)
                .ok_or_else(|| Arc::new(StoreError::protocol(ScriptName::Reserve, &one))),
            _ => Err(Arc::new(StoreError::protocol(ScriptName::Reserve, &one))),
        })
        .collect();
    Ok((answers, held, life))
}
