//! An operator's recount: after the store forgot what it sold (emptied, an older snapshot, keys
//! lost), the remaining stock of the version on sale is set from the operator's count, once, in
//! every segment's ledger and event stream, and the activity sells again
//! (`POST /v1/activities/{act}/resume` with `{"remaining": N}`). The count is documented as the
//! configured stock less the backend's orders (`flashgate reconcile --orders` lists them).
//!
//! A recount is set once: it settles the loss it read in Redis (each segment's loss stamp:
//! its `known` hash's `lost`, `fenced_at` and last `recount`, or keys gone altogether), never
//! what this gateway remembers (another gateway's recount may have settled it). Before any
//! segment is touched it takes an activity-wide claim on those stamps (one MSETNX on the base
//! tag, [`StockStore::claim_recount`]): a second recount of the same loss, from any gateway, at
//! any moment, is refused there ([`RecountError::AlreadyRecounted`]) or, read once the first
//! settled it, finds nothing lost ([`RecountError::NothingLost`]); and `lua/recount.lua`
//! refuses, atomically, a segment that no longer carries the stamp read (every recount writes a
//! new one). Approximation: a claim taken whose recount never ran (the store's answer lost
//! between the two) holds the loss: a second recount of it is refused all the same (in doubt,
//! hold); a newer version sells afresh.
//!
//! The units go to segment 0 (the other segments' buyers pull them as they would a restock's),
//! less the units still in flight between segments (given, not yet received: they land on top).
//! Each segment's ledger takes the difference in `recounted` (`lua/recount.lua`).
//! Approximation: what the store lost of the buyers' units cannot be restored, so a buyer whose
//! units were forgotten may buy up to `per_user_limit` again (the count itself never sells more
//! than N); idempotency keys whose reservations were forgotten win anew.

use super::{claimed, recorded_layout, Refusal};
use crate::config::Activity;
use crate::stock::prelude::*;
use crate::stock::scripts::recount::SegmentRecount;
use crate::stock::{Layout, StockStore, StoreError};

/// Why a recount was refused (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum RecountError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Redis's record refuses the configuration (an older version, another segment count).
    #[error("{0}")]
    Refused(Refusal),
    #[error(
        "remaining {asked} is more than version {version} of {activity} ever had ({most}: its \
         stock plus what was restocked)"
    )]
    TooMany {
        activity: String,
        version: u64,
        asked: u64,
        most: u64,
    },
    #[error(
        "remaining {asked} is more than version {version} of {activity} can have left: Redis still \
         holds {held} of its units sold (pending or confirmed reservations), so at most {} of \
         its {most} are left; count the backend's orders and the pending reservations \
         (flashgate reconcile --orders) and resume with what neither holds",
        most.saturating_sub(*held)
    )]
    HeldStill {
        activity: String,
        version: u64,
        asked: u64,
        most: u64,
        held: u64,
    },
    #[error(
        "version {current} of {activity} is on sale in segment {segment}, not the configured \
         version {version}: nothing recounted"
    )]
    OtherVersion {
        activity: String,
        segment: u32,
        version: u64,
        current: u64,
    },
    #[error(
        "the buyers' units of {activity}, shared by all its variants, are lost (or were made \
         again empty since its keys were lost): a count of one variant cannot rebuild them (the \
         per-buyer limit across variants would start over); sell under a new activity id"
    )]
    SharedUnitsLost { activity: String },
    /// Redis holds no loss of the activity to settle: not fenced, not lost, its keys not gone.
    #[error(
        "{activity} is selling from what Redis holds (not fenced, nothing lost, its keys not \
         gone): there is nothing to recount. A recount is set once: a second count of a loss \
         already settled (by this gateway or another) changes nothing; to add units, restock"
    )]
    NothingLost { activity: String },
    /// Another recount already claimed the loss this one read (the same loss: set once).
    #[error(
        "a recount of this loss of {activity} was already taken (by this or another gateway, \
         just now or before): a recount is set once, nothing changed; read the activity \
         (GET /v1/activities/{activity}): if it sells, the count was set"
    )]
    AlreadyRecounted { activity: String },
    /// A segment no longer carries the loss this recount read (recounted since by another, or
    /// another loss found): nothing changed there.
    #[error(
        "segment {segment} of {activity} changed since this recount read it (recounted by \
         another call, or another loss found): nothing changed there; read the activity (GET \
         /v1/activities/{activity}) and, if it is still lost, count again"
    )]
    LossChanged { activity: String, segment: u32 },
}

/// What a recount did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recounted {
    /// Units on sale now (the count, less what is in flight between segments).
    pub remaining: u64,
    /// Units taken off sale by the count, over every segment (negative: put on sale).
    pub moved: i64,
}

/// What a recount may settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settles {
    /// Only a loss Redis carries now (a segment lost or fenced, or the version's keys gone):
    /// refused ([`RecountError::NothingLost`]) when there is none. The admin API's recount.
    Loss,
    /// Whatever Redis holds (a library caller that judged the loss itself: the model test);
    /// still claimed and stamp-checked, so two recounts that read the same state set once.
    Anything,
}

/// Sets `activity`'s version on sale to `remaining` units (see the module doc).
pub async fn recount(
    store: &StockStore,
    activity: &Activity,
    remaining: u64,
    settles: Settles,
) -> Result<Recounted, RecountError> {
    let expire_at = store.expire_at(activity);
    let layout = recorded_layout(store, activity).await?;
    // The loss, read in Redis: the stamps first, then whether the keys are gone (a recount
    // makes the keys again before it writes its stamps, so stamps read after another's recount
    // come with keys found there).
    let mut stamps = Vec::new();
    let mut lost = false;
    let mut keys_were_gone = false;
    for segment in layout.segments() {
        let stamp = store.loss_stamp(segment).await?;
        lost |= stamp.is_loss();
        keys_were_gone |= stamp.keys_were_gone();
        stamps.push(stamp.stamp());
    }
    // Another version on sale refuses before the version's claim is asked (a refused recount
    // moves nothing, the version floor neither); the script checks again, atomically.
    check_on_sale(store, activity, &layout).await?;
    check_shared_units(store, activity, &layout, keys_were_gone).await?;
    // Nothing lost: a recount of a loss already settled (read after it was) is refused before
    // the count is judged (whatever it is, the answer is the same).
    let mut gone = None;
    if !lost && settles == Settles::Loss {
        if !keys_gone(store, activity, expire_at).await? {
            return Err(RecountError::NothingLost {
                activity: activity.id.to_string(),
            });
        }
        gone = Some(true);
    }
    check_count(store, activity, &layout, remaining).await?;
    let gone = match gone {
        Some(gone) => gone,
        None => keys_gone(store, activity, expire_at).await?,
    };
    if !store
        .claim_recount(&layout, activity.version, &stamps, remaining, expire_at)
        .await?
    {
        return Err(RecountError::AlreadyRecounted {
            activity: activity.id.to_string(),
        });
    }
    claim(store, activity, &layout, gone, expire_at).await?;
    let (done, births) =
        set_counts(store, activity, &layout, remaining, &stamps, expire_at).await?;
    // On sale from now: if the store forgets it again, it is never made from the YAML.
    store
        .failover()
        .saw_on_sale(&activity.lane, activity.version, births);
    store.recounted(activity);
    tracing::warn!(activity = %activity.id, version = activity.version, count = remaining,
        on_sale = done.remaining, taken_off = done.moved,
        "the operator's count of the remaining stock was set (recount): the activity sells again");
    Ok(done)
}

/// Sets the count in every segment (the units in segment 0, less what is in flight between
/// segments), each under the loss stamp read for it, holding what is pending in doubt first.
/// Returns what was set and when the version went on sale in each segment.
async fn set_counts(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
    remaining: u64,
    stamps: &[String],
    expire_at: u64,
) -> Result<(Recounted, Vec<u64>), RecountError> {
    let in_flight = in_flight(store, activity, layout).await?;
    let mut done = Recounted {
        remaining: 0,
        moved: 0,
    };
    let mut births = Vec::new();
    for segment in layout.segments() {
        let units = if segment.index() == 0 {
            remaining.saturating_sub(in_flight)
        } else {
            0
        };
        let share = layout.share(activity.stock, segment.index());
        // In doubt, hold: what is still pending in a store that forgot what it sold may be a
        // sale the backend took; its expiry is no proof (held before the count lifts the loss).
        store.hold_pending_in_doubt(activity, segment).await?;
        let stamp = &stamps[segment.index() as usize];
        let outcome = store
            .recount_segment(
                segment,
                activity.version,
                units,
                share,
                remaining,
                stamp,
                expire_at,
            )
            .await?;
        match outcome {
            SegmentRecount::Done {
                remaining,
                moved,
                born,
            } => {
                done.remaining += remaining;
                done.moved += moved;
                births.push(born);
            }
            SegmentRecount::OtherVersion { current } => {
                return Err(other_version(activity, segment.index(), current))
            }
            SegmentRecount::SharedUnitsLost => {
                return Err(RecountError::SharedUnitsLost {
                    activity: activity.id.to_string(),
                })
            }
            SegmentRecount::StampChanged { now } => {
                tracing::warn!(activity = %activity.id, segment = segment.index(),
                    read = %stamp, now = %now,
                    "a recount was refused: the segment's loss changed since it was read");
                return Err(RecountError::LossChanged {
                    activity: activity.id.to_string(),
                    segment: segment.index(),
                });
            }
        }
        if layout.is_segmented() {
            store.mark_made(layout, segment.index()).await?;
        }
    }
    Ok((done, births))
}

/// Refuses a count the version cannot have left: more than it ever had, or more than it has
/// once what its ledgers still count sold is taken off.
async fn check_count(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
    remaining: u64,
) -> Result<(), RecountError> {
    let (most, held) = most_units(store, activity, layout).await?;
    if remaining > most {
        return Err(RecountError::TooMany {
            activity: activity.id.to_string(),
            version: activity.version,
            asked: remaining,
            most,
        });
    }
    if remaining > most - held.min(most) {
        return Err(RecountError::HeldStill {
            activity: activity.id.to_string(),
            version: activity.version,
            asked: remaining,
            most,
            held,
        });
    }
    Ok(())
}

/// Refuses a variant's recount whose buyers' units (the activity's, shared by its variants)
/// cannot be trusted, before the claim: their hash is lost, or the lane's keys were gone (the
/// loss `emptied` or `keys_lost`: the hash went with them, and one found now was made again by a
/// gateway that never saw the sale, empty). In doubt, hold: a count of one variant would let
/// every buyer of the drop buy again. A refused recount moves nothing and claims nothing, so it
/// answers the same however often it is sent; `lua/recount.lua` checks the hash again,
/// atomically.
async fn check_shared_units(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
    keys_were_gone: bool,
) -> Result<(), RecountError> {
    if activity.variant.is_none() {
        return Ok(());
    }
    if keys_were_gone {
        return Err(RecountError::SharedUnitsLost {
            activity: activity.id.to_string(),
        });
    }
    for segment in layout.segments() {
        if !store.users_marked(segment).await? {
            return Err(RecountError::SharedUnitsLost {
                activity: activity.id.to_string(),
            });
        }
    }
    Ok(())
}

/// Refuses another version on sale, before the claim (a refused recount moves nothing, the
/// version floor neither); the script checks again, atomically.
async fn check_on_sale(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
) -> Result<(), RecountError> {
    for segment in layout.segments() {
        if let Some(current) = store
            .meta(segment)
            .await?
            .current
            .filter(|&c| c != activity.version)
        {
            return Err(other_version(activity, segment.index(), current));
        }
    }
    Ok(())
}

/// Whether the version's keys are gone (it was on sale, and its claim's record is gone): the
/// very case a recount is for. The claim on the version (a prewarm's) otherwise; another
/// refusal refuses the recount.
async fn keys_gone(
    store: &StockStore,
    activity: &Activity,
    expire_at: u64,
) -> Result<bool, RecountError> {
    match claimed(store, activity, &Layout::of(activity), expire_at).await? {
        Ok(()) => Ok(false),
        Err(Refusal::SoldBefore { .. }) => Ok(true),
        Err(refusal) => Err(RecountError::Refused(refusal)),
    }
}

/// Once the recount's claim is taken: the claim's record made again if the keys were gone
/// (the operator's count puts the version on sale again), and the registry's record of the
/// activity for the sweeps (so that its holds still run out once the configuration drops it).
async fn claim(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
    gone: bool,
    expire_at: u64,
) -> Result<(), RecountError> {
    if gone {
        store.reclaim(layout, activity.version, expire_at).await?;
    }
    store
        .register(&activity.lane, layout.count(), expire_at)
        .await?;
    Ok(())
}

fn other_version(activity: &Activity, segment: u32, current: u64) -> RecountError {
    RecountError::OtherVersion {
        activity: activity.id.to_string(),
        segment,
        version: activity.version,
        current,
    }
}

/// The most units the version can have: its configured stock plus what its surviving ledgers
/// say was restocked; and the units they still count sold (pending or confirmed: whatever the
/// store forgot, what it still holds was sold, so a count leaving less is refused).
async fn most_units(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
) -> Result<(u64, u64), StoreError> {
    let (mut restocked, mut held) = (0i64, 0i64);
    for segment in layout.segments() {
        let ledger = store.ledger(segment, activity.version).await?;
        restocked += ledger.restocked;
        held += ledger.pending + ledger.confirmed;
    }
    Ok((
        activity.stock + u64::try_from(restocked).unwrap_or(0),
        u64::try_from(held).unwrap_or(0),
    ))
}

/// Units of the version given by one segment and not yet received by another: they land on
/// top of the count.
async fn in_flight(
    store: &StockStore,
    activity: &Activity,
    layout: &Layout,
) -> Result<u64, StoreError> {
    if !layout.is_segmented() {
        return Ok(0);
    }
    let mut units = 0;
    for segment in layout.segments() {
        let (open, _) = store.transfers_given(segment).await?;
        for t in open.iter().filter(|t| t.version == activity.version) {
            let arrived = match layout.segment(t.to) {
                Some(receiver) => store.received(receiver, &t.id).await?,
                None => true,
            };
            if !arrived {
                units += t.qty;
            }
        }
    }
    Ok(units)
}
