//! What spans an activity's segments: putting a version on sale everywhere, a buyer's
//! reserve (in their home segment, pulling units from the others when it runs short),
//! whether anything is left anywhere, and every ledger. Admission and the lifecycle get one
//! outcome back; they never orchestrate segments themselves. The reserve is in [`reserve`].

use super::scripts::prewarm::Past;
use super::{
    ClaimOutcome, Layout, LedgerRow, PrewarmOutcome, Reads, Segment, SharedKeys, StockStore,
    StoreError,
};
use crate::config::transition::Recorded;
use crate::config::Activity;
use crate::stock::prelude::*;

mod recount;
mod reserve;

pub use recount::{recount, RecountError, Recounted, Settles};
pub use reserve::{
    deposit_and_reserve, reserve, standing, Purchase, ReserveAnswer, ReserveFailed, Reserving,
    Standing,
};

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
        "activity {id}: Redis's maxmemory-policy is {policy}, which may evict keys, and a key \
         evicted forgets what was sold: not sold on such a Redis; set maxmemory-policy \
         noeviction (or redis.allow_eviction: true to take the risk)"
    )]
    MayEvict { id: String, policy: String },
    #[error(
        "activity {id}: its keys in Redis were written by an older flashgate (another key layout); \
         finish that sale first, or sell under a new activity id (see docs/operating.md, Stock in Redis)"
    )]
    OldLayout { id: String },
    #[error(
        "activity {id}: segment {segment} lost a key it had (removed by hand, evicted, or lost \
         with Redis's data): its buyers' units or records can no longer be trusted; count what is \
         left (flashgate reconcile --orders) and resume with it (POST /v1/activities/{id}/resume \
         {{\"remaining\": N}}), or sell under a new activity id (Redis must run with \
         maxmemory-policy noeviction)"
    )]
    Damaged { id: String, segment: u32 },
    #[error(
        "activity {id}: segment {segment} holds less of version {version} than was sold (Redis \
         was emptied, went back to an older snapshot, or lost keys): never sold from the \
         configuration again; count what is left (the stock less the backend's orders: \
         flashgate reconcile --orders) and resume with it (POST /v1/activities/{id}/resume \
         {{\"remaining\": N}}), or raise version above {version} to sell afresh"
    )]
    Lost {
        id: String,
        segment: u32,
        version: u64,
    },
    #[error(
        "activity {id}: version {version} was on sale before and its keys are gone (they expire \
         redis.key_ttl_after_end_secs after ends_at, or were removed); a version that was on sale \
         never sells again: raise version above {version} to sell afresh (per-user limits start \
         over), or keep the sale closed"
    )]
    SoldBefore { id: String, version: u64 },
    #[error(
        "activity {id}: variant {variant} is not one version {version} was put on sale with \
         ({recorded}): a change of the variants is a stock change; raise version to sell the new \
         set"
    )]
    VariantAdded {
        id: String,
        variant: String,
        version: u64,
        recorded: String,
    },
}

impl Refusal {
    /// Whether the refusal says the store forgot what was sold (keys lost, emptied, gone):
    /// an operator's recount may put the version on sale again.
    pub fn store_forgot(&self) -> bool {
        matches!(
            self,
            Refusal::Lost { .. } | Refusal::Damaged { .. } | Refusal::SoldBefore { .. }
        )
    }

    /// Whether this refusal still holds for `activity` as now configured: a refusal of one
    /// configuration says nothing about another (a reload raising the version, say).
    pub fn applies_to(&self, activity: &Activity) -> bool {
        match self {
            Refusal::SegmentsFixed { configured, .. } => *configured == activity.segments,
            Refusal::OlderVersion { configured, .. } => *configured == activity.version,
            Refusal::SoldBefore { version, .. }
            | Refusal::Lost { version, .. }
            | Refusal::VariantAdded { version, .. } => *version == activity.version,
            Refusal::OldLayout { .. } | Refusal::Damaged { .. } | Refusal::MayEvict { .. } => true,
        }
    }
}

/// What prewarming an activity did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prewarmed {
    /// Segments where the version went on sale just now.
    pub created: u32,
    /// Segments whose stock key of the version on sale is gone (removed by hand, or lost):
    /// never re-created; their buyers get `unavailable` until the version is raised.
    pub stock_key_removed: Vec<u32>,
    /// Units left over all segments, when every segment could be read.
    pub remaining: Option<i64>,
}

/// Puts the activity's configured version on sale in every segment (created once, never
/// reset; the version before it retired), after checking what Redis recorded about the activity.
/// A version this process saw on sale is never created again, nor taken when another gateway
/// made it again (its birth in a segment differs from the one remembered, and no recount made
/// it): the store forgot what it sold, and the segment is marked lost (`stock::failover`).
pub async fn prewarm(
    store: &StockStore,
    activity: &Activity,
) -> Result<Result<Prewarmed, Refusal>, StoreError> {
    let layout = Layout::of(activity);
    let expire_at = store.expire_at(activity);
    if let Err(refusal) = claimed(store, activity, &layout, expire_at).await? {
        return Ok(Err(refusal));
    }
    store
        .register(&activity.lane, layout.count(), expire_at)
        .await?;
    let mut report = Prewarmed {
        remaining: Some(0),
        ..Prewarmed::default()
    };
    // Which segments were made before (read after the claim, which the base meta outlives).
    let made = if layout.is_segmented() {
        store.base_meta(&activity.lane).await?.made
    } else {
        Vec::new()
    };
    let shared = shared_keys(store, activity).await?;
    let mut births = Vec::new();
    for segment in layout.segments() {
        let past = Past {
            made_before: made.contains(&segment.index()),
            seen_on_sale: store
                .failover()
                .was_on_sale(&activity.lane, activity.version),
            shared,
            opens_ms: super::SaleHours::of(activity).opens_ms,
        };
        let birth = match prewarm_segment(store, activity, segment, expire_at, past).await? {
            Ok(Some(birth)) => birth,
            Ok(None) => {
                report.stock_key_removed.push(segment.index());
                (0, false, false)
            }
            Err(refusal) => return Ok(Err(refusal)),
        };
        report.created += u32::from(birth.1);
        if birth.2 {
            store.failover().birth_held(&activity.lane);
        }
        births.push(birth.0);
        let left = store.remaining(segment, activity.version).await?;
        report.remaining = report.remaining.zip(left).map(|(t, l)| t + l);
    }
    if report.stock_key_removed.is_empty() {
        store
            .failover()
            .saw_on_sale(&activity.lane, activity.version, births);
    }
    Ok(Ok(report))
}

/// Whether the lane's buyers' units and idempotency keys are shared with other variants, and
/// whether any of those was put on sale before (its floor: kept after every other key).
async fn shared_keys(store: &StockStore, activity: &Activity) -> Result<SharedKeys, StoreError> {
    let Some(variant) = &activity.variant else {
        return Ok(SharedKeys::No);
    };
    for other in activity.variants.iter().filter(|v| v.id != *variant) {
        if store
            .floor(&format!("{}~{}", activity.id, other.id))
            .await?
            .is_some()
        {
            return Ok(SharedKeys::AfterSiblings);
        }
    }
    Ok(SharedKeys::First)
}

/// One segment of [`prewarm`]: the version's birth there, whether it was created just now and
/// whether it was born on hold, `None` when its stock key is gone (not created again), or the
/// refusal.
async fn prewarm_segment(
    store: &StockStore,
    activity: &Activity,
    segment: Segment<'_>,
    expire_at: u64,
    past: Past,
) -> Result<Result<Option<(u64, bool, bool)>, Refusal>, StoreError> {
    let layout = segment.layout();
    let id = || activity.id.to_string();
    if let Some(refusal) = older_than_seen(store, activity, segment).await? {
        return Ok(Err(refusal));
    }
    let remembered = store
        .failover()
        .born(&activity.lane, activity.version, segment.index());
    let (outcome, recounted) = store
        .prewarm(
            segment,
            activity.version,
            layout.share(activity.stock, segment.index()),
            expire_at,
            past,
        )
        .await?;
    let lost = match outcome {
        PrewarmOutcome::Damaged | PrewarmOutcome::StockKeyRemoved | PrewarmOutcome::Lost => true,
        // Made again by a gateway that did not see it on sale (after the store forgot it), and
        // not by a recount: what was sold of it is gone.
        PrewarmOutcome::Created(b) | PrewarmOutcome::Exists(b) => {
            remembered != 0 && b.born != remembered && b.recounted < b.born
        }
        PrewarmOutcome::Older { .. } => false,
    };
    if lost {
        // Whatever else this segment holds, the store forgot what it sold. Marked for every
        // gateway (their reserves here are refused from now) and for reconcile; an existing
        // mark is kept.
        store
            .mark_lost(activity, segment, "keys_lost", Some(recounted))
            .await?;
    }
    if matches!(
        outcome,
        PrewarmOutcome::Created(_) | PrewarmOutcome::Exists(_)
    ) && layout.is_segmented()
        && !past.made_before
    {
        store.mark_made(layout, segment.index()).await?;
    }
    let lost_refusal = || Refusal::Lost {
        id: id(),
        segment: segment.index(),
        version: activity.version,
    };
    Ok(match outcome {
        _ if lost
            && outcome != PrewarmOutcome::Damaged
            && outcome != PrewarmOutcome::StockKeyRemoved =>
        {
            Err(lost_refusal())
        }
        PrewarmOutcome::Created(b) => Ok(Some((b.born, true, b.on_hold))),
        PrewarmOutcome::Exists(b) => Ok(Some((b.born, false, false))),
        PrewarmOutcome::StockKeyRemoved => Ok(None),
        PrewarmOutcome::Damaged => Err(Refusal::Damaged {
            id: id(),
            segment: segment.index(),
        }),
        PrewarmOutcome::Lost => Err(lost_refusal()),
        // The claim passed, so a newer version here means another instance claimed it since.
        PrewarmOutcome::Older { current } => Err(Refusal::OlderVersion {
            id: id(),
            configured: activity.version,
            newest: current,
        }),
    })
}

/// A version older than one this process saw on sale, whose claim passed: the store forgot its
/// floor (emptied, an older snapshot). An older YAML never sells, and the loss is marked.
async fn older_than_seen(
    store: &StockStore,
    activity: &Activity,
    segment: Segment<'_>,
) -> Result<Option<Refusal>, StoreError> {
    let Some(newest) = store
        .failover()
        .newest_on_sale(&activity.lane)
        .filter(|&newest| newest > activity.version)
    else {
        return Ok(None);
    };
    store
        .mark_lost(activity, segment, "keys_lost", None)
        .await?;
    Ok(Some(Refusal::OlderVersion {
        id: activity.id.to_string(),
        configured: activity.version,
        newest,
    }))
}

/// Whether the activity may go on sale in this layout and version: the registry's record of its
/// segment count (it outlives the activity's keys: a record whose segments hold nothing any more
/// is stale), then the claim on its version floor and layout.
async fn claimed(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
    expire_at: u64,
) -> Result<Result<(), Refusal>, StoreError> {
    let id = activity.id.to_string();
    if let Some(first) = store.registered_segments(&activity.lane).await? {
        if first != layout.count() && alive(store, &Layout::of_lane(&activity.lane, first)).await? {
            return Ok(Err(Refusal::SegmentsFixed {
                id,
                first,
                configured: layout.count(),
            }));
        }
    }
    match store
        .claim(layout, activity.version, expire_at, &activity.variants)
        .await?
    {
        ClaimOutcome::Claimed => Ok(Ok(())),
        ClaimOutcome::SegmentsFixed { first } => Ok(Err(Refusal::SegmentsFixed {
            id,
            first,
            configured: layout.count(),
        })),
        ClaimOutcome::Older { newest } => Ok(Err(Refusal::OlderVersion {
            id,
            configured: activity.version,
            newest,
        })),
        ClaimOutcome::OldLayout => Ok(Err(Refusal::OldLayout { id })),
        ClaimOutcome::SoldBefore { version } => Ok(Err(Refusal::SoldBefore { id, version })),
        ClaimOutcome::VariantAdded { recorded } => Ok(Err(Refusal::VariantAdded {
            id,
            variant: activity.variant.as_deref().unwrap_or_default().to_owned(),
            version: activity.version,
            recorded,
        })),
    }
}

/// The layout Redis recorded for an activity: the segment count its base meta holds, else the
/// registry's record, else (never prewarmed) the configured one. Whatever reads or settles what
/// is in Redis uses this, not the configuration, which may disagree (and is then refused).
pub async fn recorded_layout<S: Reads + ?Sized>(
    store: &S,
    activity: &Activity,
) -> Result<Layout, StoreError> {
    let segments = match store.base_meta(&activity.lane).await?.segments {
        Some(s) => Some(s),
        None => store.registered_segments(&activity.lane).await?,
    };
    Ok(Layout::of_lane(
        &activity.lane,
        segments.unwrap_or(activity.segments),
    ))
}

/// Whether any segment of `layout` still has keys: its meta, or what a lost meta leaves
/// behind (a buyer's units, the records).
async fn alive(store: &StockStore, layout: &Layout) -> Result<bool, StoreError> {
    for segment in layout.segments() {
        if store.has_keys(segment).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Units of the activity's current version left anywhere: every segment's stock plus what is
/// in flight between two of them (exact whatever the order of the reads, see
/// [`LedgerRow::available`]; a release landing after its segment was read is not counted).
pub async fn available<S: Reads + ?Sized>(
    store: &S,
    activity: &Activity,
) -> Result<i64, StoreError> {
    Ok(available_on_sale(store, activity).await?.unwrap_or(0))
}

/// [`available`], or `None` when no segment has the version's ledger: never put on sale (a
/// reload ahead of the prewarm), which is not sold out.
pub async fn available_on_sale<S: Reads + ?Sized>(
    store: &S,
    activity: &Activity,
) -> Result<Option<i64>, StoreError> {
    let layout = Layout::of(activity);
    let reads = layout.segments().map(|p| store.ledger(p, activity.version));
    let rows = futures_util::future::join_all(reads).await;
    let (mut total, mut on_sale) = (0, false);
    for row in rows {
        let row = row?;
        on_sale |= row.ledger;
        total += row.available();
    }
    Ok(on_sale.then_some(total))
}

/// What Redis recorded of an activity, as a reload's judgement reads it
/// ([`crate::config::transition::judge`]): its newest version (the floor, or the base meta's
/// newer claim), that version's configured stock (the sum of its segments' `initial`, restocks
/// not included; unknown once its ledgers expired) and its segment count. `None`: never sold.
pub async fn recorded(
    store: &StockStore,
    activity: &Activity,
) -> Result<Option<Recorded>, StoreError> {
    let base = store.base_meta(&activity.lane).await?;
    let floor = store.floor(&activity.lane).await?;
    let Some(version) = base.newest.max(floor) else {
        return Ok(None);
    };
    let layout = recorded_layout(store, activity).await?;
    // Known only when every segment has the version's ledger (one still being put on sale, or
    // one whose keys expired, would give a part of it).
    let mut stock = Some(0u64);
    for segment in layout.segments() {
        let row = store.ledger(segment, version).await?;
        stock = match (stock, row.ledger) {
            (Some(sum), true) => Some(sum + u64::try_from(row.initial).unwrap_or(0)),
            _ => None,
        };
    }
    let segments = match base.segments {
        Some(s) => Some(s),
        None => store.registered_segments(&activity.lane).await?,
    };
    Ok(Some(Recorded {
        version,
        stock,
        segments,
    }))
}

/// Every segment's ledger of every version it has had, in segment then version order.
pub async fn ledgers<S: Reads + ?Sized>(
    store: &S,
    layout: &Layout,
) -> Result<Vec<(u32, LedgerRow)>, StoreError> {
    let mut rows = Vec::new();
    for segment in layout.segments() {
        for version in store.meta(segment).await?.versions {
            rows.push((segment.index(), store.ledger(segment, version).await?));
        }
    }
    Ok(rows)
}
