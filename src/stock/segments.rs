//! What spans an activity's partitions: putting a version on sale everywhere, a buyer's
//! reserve (in their home partition, pulling units from the others when it runs short),
//! whether anything is left anywhere, and every ledger. Admission and the lifecycle get one
//! outcome back; they never orchestrate partitions themselves.

use super::{
    ClaimOutcome, Layout, LedgerRow, Partition, PrewarmOutcome, Reads, ReserveCall, ReserveOutcome,
    SaleHours, StockStore, StoreError,
};
use crate::config::Activity;
use std::time::Duration;

/// Why a configured activity is not on sale: what Redis recorded about it disagrees with the
/// configuration. Such an activity is refused (buyers get `unavailable`), never sold twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "activity {id}: segments is {configured}, but it was first sold with {first}; the segment \
         count is fixed for the life of an activity's keys (a buyer's units and idempotency keys \
         live in their segment): set segments back to {first}, or sell under a new activity id"
    )]
    SegmentsFixed {
        id: String,
        first: u32,
        configured: u32,
    },
    #[error(
        "activity {id}: version {configured} is older than version {newest}, already put on sale; \
         refusing to sell a retired version again: set version to {newest} or higher"
    )]
    OlderVersion {
        id: String,
        configured: u64,
        newest: u64,
    },
    #[error(
        "activity {id}: its keys in Redis were written by an older flashgate (another key layout); \
         finish that sale first, or sell under a new activity id (see README, Upgrading)"
    )]
    OldLayout { id: String },
    #[error(
        "activity {id}: segment {segment} lost a key it had (removed by hand, evicted, or lost \
         with Redis's data): its buyers' units or records can no longer be trusted; restore Redis, \
         or sell under a new activity id (Redis must run with maxmemory-policy noeviction)"
    )]
    Damaged { id: String, segment: u32 },
    #[error(
        "activity {id}: version {version} was on sale before and its keys are gone (they expire \
         redis.key_ttl_after_end_secs after ends_at, or were removed); a version that was on sale \
         never sells again: raise version above {version} to sell afresh (per-user limits start \
         over), or keep the sale closed"
    )]
    SoldBefore { id: String, version: u64 },
}

impl Refusal {
    /// Whether this refusal still holds for `activity` as now configured: a refusal of one
    /// configuration says nothing about another (a reload raising the version, say).
    pub fn applies_to(&self, activity: &Activity) -> bool {
        match self {
            Refusal::SegmentsFixed { configured, .. } => *configured == activity.segments,
            Refusal::OlderVersion { configured, .. } => *configured == activity.version,
            Refusal::SoldBefore { version, .. } => *version == activity.version,
            Refusal::OldLayout { .. } | Refusal::Damaged { .. } => true,
        }
    }
}

/// What prewarming an activity did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prewarmed {
    /// Partitions where the version went on sale just now.
    pub created: u32,
    /// Partitions whose stock key of the version on sale is gone (removed by hand, or lost):
    /// never re-created; their buyers get `unavailable` until the version is raised.
    pub stock_key_removed: Vec<u32>,
    /// Units left over all partitions, when every partition could be read.
    pub remaining: Option<i64>,
}

/// Puts the activity's configured version on sale in every partition (created once, never
/// reset; the version before it retired), after checking what Redis recorded about the activity.
pub async fn prewarm(
    store: &StockStore,
    activity: &Activity,
) -> Result<Result<Prewarmed, Refusal>, StoreError> {
    let layout = Layout::of(activity);
    let expire_at = store.expire_at(activity);
    let id = activity.id.to_string();
    // The registry keeps a second record of the segment count, outside the activity's keys
    // (it outlives them: a record whose segments hold nothing any more is stale).
    if let Some(first) = store.registered_segments(&activity.id).await? {
        if first != layout.count() && alive(store, &Layout::new(activity.id.clone(), first)).await?
        {
            return Ok(Err(Refusal::SegmentsFixed {
                id,
                first,
                configured: layout.count(),
            }));
        }
    }
    match store.claim(&layout, activity.version, expire_at).await? {
        ClaimOutcome::Claimed => {}
        ClaimOutcome::SegmentsFixed { first } => {
            return Ok(Err(Refusal::SegmentsFixed {
                id,
                first,
                configured: layout.count(),
            }))
        }
        ClaimOutcome::Older { newest } => {
            return Ok(Err(Refusal::OlderVersion {
                id,
                configured: activity.version,
                newest,
            }))
        }
        ClaimOutcome::OldLayout => return Ok(Err(Refusal::OldLayout { id })),
        ClaimOutcome::SoldBefore { version } => {
            return Ok(Err(Refusal::SoldBefore { id, version }))
        }
    }
    store
        .register(&activity.id, layout.count(), expire_at)
        .await?;
    let mut report = Prewarmed {
        remaining: Some(0),
        ..Prewarmed::default()
    };
    // Which segments were made before (read after the claim, which the base meta outlives).
    let made = if layout.is_segmented() {
        store.base_meta(&activity.id).await?.made
    } else {
        Vec::new()
    };
    for partition in layout.partitions() {
        let units = layout.share(activity.stock, partition.index());
        let made_before = made.contains(&partition.index());
        let outcome = store
            .prewarm(partition, activity.version, units, expire_at, made_before)
            .await?;
        if matches!(outcome, PrewarmOutcome::Created | PrewarmOutcome::Exists)
            && layout.is_segmented()
            && !made_before
        {
            store.mark_made(&layout, partition.index()).await?;
        }
        match outcome {
            PrewarmOutcome::Created => report.created += 1,
            PrewarmOutcome::Exists => {}
            PrewarmOutcome::Damaged => {
                return Ok(Err(Refusal::Damaged {
                    id,
                    segment: partition.index(),
                }))
            }
            PrewarmOutcome::StockKeyRemoved => report.stock_key_removed.push(partition.index()),
            // The claim passed, so a newer version here means another instance claimed it since.
            PrewarmOutcome::Older { current } => {
                return Ok(Err(Refusal::OlderVersion {
                    id,
                    configured: activity.version,
                    newest: current,
                }))
            }
        }
        let left = store.remaining(partition, activity.version).await?;
        report.remaining = report.remaining.zip(left).map(|(t, l)| t + l);
    }
    Ok(Ok(report))
}

/// The layout Redis recorded for an activity: the segment count its base meta holds, else the
/// registry's record, else (never prewarmed) the configured one. Whatever reads or settles what
/// is in Redis uses this, not the configuration, which may disagree (and is then refused).
pub async fn recorded_layout<S: Reads + ?Sized>(
    store: &S,
    activity: &Activity,
) -> Result<Layout, StoreError> {
    let segments = match store.base_meta(&activity.id).await?.segments {
        Some(s) => Some(s),
        None => store.registered_segments(&activity.id).await?,
    };
    Ok(Layout::new(
        activity.id.clone(),
        segments.unwrap_or(activity.segments),
    ))
}

/// Whether any partition of `layout` still has keys: its meta, or what a lost meta leaves
/// behind (a buyer's units, the records).
async fn alive(store: &StockStore, layout: &Layout) -> Result<bool, StoreError> {
    for partition in layout.partitions() {
        if store.has_keys(partition).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A buyer's purchase, as the stock layer takes it.
#[derive(Debug, Clone, Copy)]
pub struct Purchase<'a> {
    pub user: &'a str,
    pub qty: u32,
    /// Made by the caller (see `Reservation::id_in_segment`), so that an ambiguous call can be
    /// abandoned by id.
    pub reservation_id: &'a str,
    pub idempotency_key: Option<&'a str>,
    /// The longest the request may take once admitted (`server.longest_sale_trip`): its
    /// reservation is not released under it while it is at the backend.
    pub in_flight: Duration,
    /// Only the idempotency key's reservation, never new stock (see [`ReserveCall::replay_only`]).
    pub replay_only: bool,
}

/// What a buyer's reserve came to, over every partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// Stock is held in `partition` under `id` (this purchase's id, or, `replayed`, the one its
    /// idempotency key already won: then this request did not make it and may not release it).
    Reserved {
        id: String,
        partition: u32,
        version: u64,
        qty: u32,
        replayed: bool,
        /// Units left in the activity, when a single partition answered for all of it.
        remaining: Option<u64>,
        /// When it was made, and when its hold runs out (Redis's clock, unix ms).
        created_ms: u64,
        deadline_ms: u64,
        /// The record's fence once this request's forward is counted: an early order lookup
        /// this request asks for names it (see `lua/lib.lua`).
        fence: u64,
    },
    /// The idempotency key's reservation is pending past its hold deadline (being settled):
    /// retry.
    HoldRanOut,
    /// Not enough for the request anywhere: every partition, and every unit in flight between
    /// two of them, adds up to `left`, less than the quantity.
    SoldOut {
        left: i64,
    },
    /// Enough units exist, but other buyers took them first each time: retry.
    Busy,
    LimitExceeded,
    /// The version is not on sale (no stock key, even after prewarming), or Redis's record of
    /// the activity refuses this configuration.
    NotOnSale(Option<Refusal>),
    /// The reservation id exists already (a tombstone of an abandoned attempt).
    DuplicateId,
    /// Replay only, and the idempotency key had won nothing.
    NotReplayed,
    /// The idempotency key's reservation is for another quantity.
    ReplayQuantityDiffers,
    /// Outside the sale's hours by Redis's clock (the gateway's own clock disagreed).
    NotStarted,
    Ended,
}

/// A reserve failed with an unknown outcome: the caller abandons `reservation_id` in
/// `partition` (it may have landed).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ReserveFailed {
    pub error: StoreError,
    /// Set when the failing call may have reserved under that id.
    pub landed_maybe: Option<u32>,
}

/// Rounds of pulling units from the other partitions one purchase may make: each round asks
/// every other partition once; after a round that left the buyer short, the activity's units
/// are counted (sold out if too few) and, after a short wait (2, 4, 8, 16 ms: units in flight
/// settle within a round trip; at most 16 ms), the home partition is tried again before the next round.
const MAX_REBALANCE_ROUNDS: u32 = 24;

/// A partition short of units takes at least `stock / (partitions * this)` from a giver.
const REBALANCE_CHUNKS_PER_PARTITION: u64 = 8;

/// Reserves in the buyer's home partition. Not prewarmed yet: prewarms once and retries. Short
/// of units in a segmented activity: withdraws from the other partitions, each withdrawal
/// deposited together with the reserve in one step (nobody can take the units in between).
/// `sold_out` only when the units of every partition and in flight add up to less than asked.
pub async fn reserve(
    store: &StockStore,
    activity: &Activity,
    purchase: Purchase<'_>,
) -> Result<Reserve, ReserveFailed> {
    let layout = Layout::of(activity);
    let home = layout.home(purchase.user);
    let call = ReserveCall {
        user: purchase.user,
        qty: purchase.qty,
        per_user_limit: activity.per_user_limit.get(),
        version: activity.version,
        reservation_id: purchase.reservation_id,
        hold: activity.hold,
        idempotency_key: purchase.idempotency_key,
        deposit: None,
        in_flight: purchase.in_flight,
        replay_only: purchase.replay_only,
        hours: SaleHours::of(activity),
    };
    let mut outcome = attempt(store, home, &call).await?;
    if outcome == ReserveOutcome::NoStockKey && purchase.replay_only {
        // Never prewarmed here (or its keys expired): the key won nothing in this partition,
        // and a replay-only call (outside the hours, or held back) puts nothing on sale.
        return Ok(Reserve::NotReplayed);
    }
    if outcome == ReserveOutcome::NoStockKey {
        // Not prewarmed yet (or retired by a newer version): put the configured version on sale
        // (create-once, never a reset; refused if Redis knows better) and try once more.
        let prewarmed = prewarm(store, activity)
            .await
            .map_err(|error| ReserveFailed {
                error,
                landed_maybe: None,
            })?;
        match prewarmed {
            Err(refusal) => return Ok(Reserve::NotOnSale(Some(refusal))),
            Ok(_) => outcome = attempt(store, home, &call).await?,
        }
    }
    let mut rounds = 0;
    while let ReserveOutcome::Insufficient { remaining } = outcome {
        if !layout.is_segmented() {
            return Ok(Reserve::SoldOut {
                left: remaining as i64,
            });
        }
        let mut have = remaining;
        if rounds > 0 {
            // A round left the buyer short: the units left may be in flight between two others,
            // or just deposited here by another buyer. Sold out only when the whole activity
            // holds less than asked; else look again after a moment.
            let left = available(store, activity)
                .await
                .map_err(|error| ReserveFailed {
                    error,
                    landed_maybe: None,
                })?;
            if left < i64::from(purchase.qty) {
                return Ok(newer_version(store, activity)
                    .await
                    .map_or(Reserve::SoldOut { left }, |r| Reserve::NotOnSale(Some(r))));
            }
            if rounds == MAX_REBALANCE_ROUNDS {
                return Ok(Reserve::Busy);
            }
            tokio::time::sleep(Duration::from_millis(1 << rounds.min(4))).await;
            match attempt(store, home, &call).await? {
                ReserveOutcome::Insufficient { remaining } => have = remaining,
                settled => {
                    outcome = settled;
                    break;
                }
            }
        }
        rounds += 1;
        outcome = match pull(store, activity, &layout, home, &call, have).await {
            Pulled::Nothing => ReserveOutcome::Insufficient { remaining: have },
            Pulled::Reserved(next) => next,
            Pulled::Failed(error) => {
                return Err(ReserveFailed {
                    landed_maybe: error.may_have_landed().then_some(home.index()),
                    error,
                })
            }
        };
    }
    Ok(match outcome {
        ReserveOutcome::Reserved {
            remaining,
            created_ms,
            deadline_ms,
            fence,
        } => Reserve::Reserved {
            id: purchase.reservation_id.to_owned(),
            partition: home.index(),
            version: activity.version,
            qty: purchase.qty,
            replayed: false,
            remaining: (!layout.is_segmented()).then_some(remaining),
            created_ms,
            deadline_ms,
            fence,
        },
        ReserveOutcome::Replayed {
            id,
            qty,
            version,
            remaining,
            created_ms,
            deadline_ms,
            fence,
        } => Reserve::Reserved {
            id,
            partition: home.index(),
            version,
            qty,
            replayed: true,
            remaining: remaining.filter(|_| !layout.is_segmented()),
            created_ms,
            deadline_ms,
            fence,
        },
        ReserveOutcome::HoldRanOut => Reserve::HoldRanOut,
        ReserveOutcome::NotReplayed => Reserve::NotReplayed,
        ReserveOutcome::ReplayQuantityDiffers { .. } => Reserve::ReplayQuantityDiffers,
        ReserveOutcome::NotStarted => Reserve::NotStarted,
        ReserveOutcome::Ended => Reserve::Ended,
        ReserveOutcome::LimitExceeded { .. } => Reserve::LimitExceeded,
        ReserveOutcome::NoStockKey => Reserve::NotOnSale(None),
        ReserveOutcome::DuplicateId => Reserve::DuplicateId,
        ReserveOutcome::Damaged | ReserveOutcome::DepositRefused { damaged: true } => {
            Reserve::NotOnSale(Some(Refusal::Damaged {
                id: activity.id.to_string(),
                segment: home.index(),
            }))
        }
        ReserveOutcome::DepositRefused { damaged: false } => Reserve::Busy,
        ReserveOutcome::Insufficient { .. } => unreachable!("the loop above ends every shortage"),
    })
}

/// A newer version than this configuration's is on sale (this instance runs an older YAML
/// while another's prewarm retires its version segment by segment): then "nothing left" is
/// about a retired version, and the buyer is told `unavailable`, not `sold_out`.
async fn newer_version(store: &StockStore, activity: &Activity) -> Option<Refusal> {
    let newest = store.base_meta(&activity.id).await.ok()?.newest?;
    (newest > activity.version).then(|| Refusal::OlderVersion {
        id: activity.id.to_string(),
        configured: activity.version,
        newest,
    })
}

/// One reserve call in the home partition; an error says whether it may have landed.
async fn attempt(
    store: &StockStore,
    home: Partition<'_>,
    call: &ReserveCall<'_>,
) -> Result<ReserveOutcome, ReserveFailed> {
    store
        .reserve(home, call)
        .await
        .map_err(|error| ReserveFailed {
            landed_maybe: error.may_have_landed().then_some(home.index()),
            error,
        })
}

enum Pulled {
    /// No other partition had units of this version.
    Nothing,
    /// Units arrived with the reserve: its outcome (possibly still short).
    Reserved(ReserveOutcome),
    /// The deposit-and-reserve failed with an unknown outcome.
    Failed(StoreError),
}

/// One round over the other partitions (starting at one chosen by the reservation id, so
/// buyers of one home do not all empty the same giver): withdraw what the home lacks (at least
/// a chunk, so a busy home does not come back for every unit) and deposit it with the reserve.
/// A withdrawal whose deposit is cut short stays recorded on the giver; the sweep delivers it.
async fn pull(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
    home: Partition<'_>,
    call: &ReserveCall<'_>,
    mut have: u64,
) -> Pulled {
    let count = layout.count();
    let chunk = (activity.stock / (u64::from(count) * REBALANCE_CHUNKS_PER_PARTITION)).max(1);
    let start = call
        .reservation_id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let mut moved_any = false;
    for step in 0..count - 1 {
        let giver = layout
            .partition((home.index() + 1 + (start.wrapping_add(step)) % (count - 1)) % count)
            .expect("partition index in range");
        let needed = u64::from(call.qty).saturating_sub(have);
        let transfer_id = uuid::Uuid::now_v7().to_string();
        let taken = match store
            .withdraw(
                giver,
                call.version,
                &transfer_id,
                needed.max(chunk),
                home.index(),
            )
            .await
        {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(activity = %activity.id, error = %e, "withdraw failed");
                continue;
            }
        };
        if taken == 0 {
            continue;
        }
        moved_any = true;
        match deposit_and_reserve(store, giver, home, call, &transfer_id, taken).await {
            Ok(ReserveOutcome::Insufficient { remaining }) => have = remaining,
            Ok(other) => return Pulled::Reserved(other),
            Err(e) => return Pulled::Failed(e),
        }
    }
    if moved_any {
        Pulled::Reserved(ReserveOutcome::Insufficient { remaining: have })
    } else {
        Pulled::Nothing
    }
}

/// The second half of a pull: the units `giver` gave under `transfer_id` land in `home` in the
/// same step as the buyer's reserve there; the giver forgets the transfer (acknowledges it) only
/// when the answer proves it landed. Otherwise (a damaged home, a refused deposit, no answer) it
/// stays recorded on the giver, in flight, and the sweep delivers it (or finds it received)
/// and acknowledges it then: a giver never forgets a transfer that did not arrive.
pub async fn deposit_and_reserve(
    store: &StockStore,
    giver: Partition<'_>,
    home: Partition<'_>,
    call: &ReserveCall<'_>,
    transfer_id: &str,
    units: u64,
) -> Result<ReserveOutcome, StoreError> {
    #[cfg(feature = "fault-injection")]
    fault::before_deposit(store, home).await;
    let with_deposit = ReserveCall {
        deposit: Some((transfer_id, units)),
        ..*call
    };
    let outcome = store.reserve(home, &with_deposit).await;
    if outcome.as_ref().is_ok_and(ReserveOutcome::deposit_landed) {
        let _ = store.acknowledge(giver, transfer_id).await;
    }
    outcome
}

/// Test-only faults in the stock layer (feature `fault-injection`, env `FLASHGATE_FAULT`).
#[cfg(feature = "fault-injection")]
mod fault {
    use super::{Partition, StockStore};

    /// `damage_home_before_deposit`: as an operator deleting a key by hand in the instant
    /// between a pull's withdraw and its deposit, the home partition loses its users
    /// placeholder (it is then damaged, and its reserve answers before the deposit).
    pub(super) async fn before_deposit(store: &StockStore, home: Partition<'_>) {
        if std::env::var("FLASHGATE_FAULT").as_deref() != Ok("damage_home_before_deposit") {
            return;
        }
        let users = store.keys().of(home).users();
        let _ = store
            .query::<i64>(
                super::super::StoreOp::Read,
                redis::cmd("HDEL").arg(users).arg(""),
            )
            .await;
    }
}

/// Units of the activity's current version left anywhere: every partition's stock plus what is
/// in flight between two of them (exact whatever the order of the reads, see
/// [`LedgerRow::available`]; a release landing after its partition was read is not counted).
pub async fn available<S: Reads + ?Sized>(
    store: &S,
    activity: &Activity,
) -> Result<i64, StoreError> {
    let layout = Layout::of(activity);
    let reads = layout
        .partitions()
        .map(|p| store.ledger(p, activity.version));
    let rows = futures_util::future::join_all(reads).await;
    let mut total = 0;
    for row in rows {
        total += row?.available();
    }
    Ok(total)
}

/// Every partition's ledger of every version it has had, in partition then version order.
pub async fn ledgers<S: Reads + ?Sized>(
    store: &S,
    layout: &Layout,
) -> Result<Vec<(u32, LedgerRow)>, StoreError> {
    let mut rows = Vec::new();
    for partition in layout.partitions() {
        for version in store.meta(partition).await?.versions {
            rows.push((partition.index(), store.ledger(partition, version).await?));
        }
    }
    Ok(rows)
}
