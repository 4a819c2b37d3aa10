//! A buyer's reserve over every segment: in their home segment, pulling units from the
//! others when it runs short (withdraw, then deposit together with the reserve), prewarming
//! once when the version is not on sale yet. Over [`Reserving`]: the real store, or an
//! in-process fake in the unit tests.

use super::{available, prewarm, Prewarmed, Refusal};
use crate::config::Activity;
use crate::stock::{
    Layout, Reads, ReserveCall, ReserveOutcome, SaleHours, Segment, StockStore, StoreError,
    Transfers,
};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The store calls a reserve makes.
pub trait Reserving: Reads + Transfers + super::super::ReserveScript {
    /// Puts the activity's version on sale everywhere (see [`prewarm`]).
    fn prewarm(
        &self,
        activity: &Activity,
    ) -> impl Future<Output = Result<Result<Prewarmed, Refusal>, StoreError>> + Send;

    /// Whether the activity's current version still has units anywhere, as read at or after
    /// `fresh_from` (see [`standing`]). The store shares one read among concurrent askers.
    fn standing(
        &self,
        activity: &Activity,
        fresh_from: Instant,
    ) -> impl Future<Output = Result<Standing, StoreError>> + Send {
        let _ = fresh_from;
        standing(self, activity)
    }

    /// A test-only fault between a pull's withdraw and its deposit (see `fault`).
    fn before_deposit(&self, _home: Segment<'_>) -> impl Future<Output = ()> + Send {
        async {}
    }
}

impl Reserving for StockStore {
    async fn prewarm(&self, activity: &Activity) -> Result<Result<Prewarmed, Refusal>, StoreError> {
        prewarm(self, activity).await
    }

    /// One read at a time per activity and version: a sell-out of a segmented activity costs
    /// one determination per gateway, not one per buyer arriving at that moment.
    async fn standing(
        &self,
        activity: &Activity,
        fresh_from: Instant,
    ) -> Result<Standing, StoreError> {
        let key = (activity.lane.clone(), activity.version);
        self.standings()
            .get(key, fresh_from, || async {
                standing(self, activity).await.map_err(Arc::new)
            })
            .await
            .map_err(StoreError::shared)
    }

    #[cfg(feature = "fault-injection")]
    async fn before_deposit(&self, home: Segment<'_>) {
        crate::stock::fault::before_deposit(self, home).await
    }
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
    /// The buyer's phases, on an activity sold in phases (see [`ReserveCall::steps`]).
    pub steps: Option<&'a super::super::Steps>,
}

/// What a buyer's reserve came to, over every segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveAnswer {
    /// Stock is held in `segment` under `id` (this purchase's id, or, `replayed`, the one its
    /// idempotency key already won: then this request did not make it and may not release it).
    Reserved {
        id: String,
        segment: u32,
        version: u64,
        qty: u32,
        replayed: bool,
        /// Units left in the activity, when a single segment answered for all of it.
        remaining: Option<u64>,
        /// When it was made, and when its hold runs out (Redis's clock, unix ms).
        created_ms: u64,
        deadline_ms: u64,
        /// The record's fence once this request's forward is counted: an early order lookup
        /// this request asks for names it (see `lua/lib.lua`).
        fence: u64,
        /// A replay's phase, as its record keeps it (`None` for a new reservation: its phase
        /// is the step in force when it was made).
        phase: Option<String>,
    },
    /// The idempotency key's reservation is pending past its hold deadline (being settled):
    /// retry.
    HoldRanOut,
    /// The failover fence: the segment's Redis master was replaced (see `stock::failover`).
    Fenced,
    /// Not enough for the request anywhere: every segment, and every unit in flight between
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
    /// The idempotency key's reservation is another variant's.
    ReplayOtherVariant,
    /// Outside the sale's hours by Redis's clock (the gateway's own clock disagreed).
    NotStarted,
    Ended,
    /// The units left are the second-chance line's, and the buyer holds none: sold out to
    /// them (`remaining` units are held for the line).
    HeldForLine {
        remaining: u64,
    },
}

/// What is left of an activity's current version as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Units in every segment and in flight between two of them (see [`available`]).
    pub left: i64,
    /// The newest version Redis recorded, read only when `left` is below what one request may
    /// buy (then "nothing left" may be about a version a newer one retired).
    pub newest: Option<u64>,
}

/// Reads [`Standing`] directly.
pub async fn standing<S: Reads + ?Sized>(
    store: &S,
    activity: &Activity,
) -> Result<Standing, StoreError> {
    let left = available(store, activity).await?;
    let newest = if left < i64::from(activity.max_per_request.get()) {
        store.base_meta(&activity.lane).await?.newest
    } else {
        None
    };
    Ok(Standing { left, newest })
}

/// A reserve failed with an unknown outcome: the caller abandons `reservation_id` in
/// `segment` (it may have landed).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ReserveFailed {
    pub error: StoreError,
    /// Set when the failing call may have reserved under that id.
    pub landed_maybe: Option<u32>,
}

/// Rounds of pulling units from the other segments one purchase may make: each round asks
/// every other segment once; after a round that left the buyer short, the activity's units
/// are counted (sold out if too few) and, after a short wait (2, 4, 8, 16 ms: units in flight
/// settle within a round trip; at most 16 ms), the home segment is tried again before the next round.
const MAX_REBALANCE_ROUNDS: u32 = 24;

/// A segment short of units takes at least `stock / (segments * this)` from a giver.
const REBALANCE_CHUNKS_PER_SEGMENT: u64 = 8;

/// Reserves in the buyer's home segment. Not prewarmed yet: prewarms once and retries. Short
/// of units in a segmented activity: withdraws from the other segments, each withdrawal
/// deposited together with the reserve in one step (nobody can take the units in between).
/// `sold_out` only when the units of every segment and in flight add up to less than asked.
pub async fn reserve<S: Reserving + ?Sized>(
    store: &S,
    activity: &Activity,
    purchase: Purchase<'_>,
) -> Result<ReserveAnswer, ReserveFailed> {
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
        steps: purchase.steps,
        line: activity.second_chance.is_some(),
    };
    // When the purchase reached the store: a determination that the activity is sold out is
    // one read after this (shared with the buyers asking at the same moment), so it describes
    // the activity during this purchase, never before it.
    let asked_at = Instant::now();
    let mut outcome = attempt(store, home, &call).await?;
    if outcome == ReserveOutcome::NoStockKey && purchase.replay_only {
        // Never prewarmed here (or its keys expired): the key won nothing in this segment,
        // and a replay-only call (outside the hours, or held back) puts nothing on sale.
        return Ok(ReserveAnswer::NotReplayed);
    }
    if outcome == ReserveOutcome::NoStockKey {
        // Not prewarmed yet (or retired by a newer version): put the configured version on sale
        // (create-once, never a reset; refused if Redis knows better) and try once more.
        let prewarmed = store
            .prewarm(activity)
            .await
            .map_err(|error| ReserveFailed {
                error,
                landed_maybe: None,
            })?;
        match prewarmed {
            Err(refusal) => return Ok(ReserveAnswer::NotOnSale(Some(refusal))),
            Ok(_) => outcome = attempt(store, home, &call).await?,
        }
    }
    let outcome = match rebalance(store, activity, &layout, home, &call, outcome, asked_at).await? {
        Ok(outcome) => outcome,
        Err(answered) => return Ok(answered),
    };
    Ok(answer(
        outcome,
        activity,
        purchase,
        home,
        layout.is_segmented(),
    ))
}

/// Short of units in a segmented activity's home segment: pulls from the others, round after
/// round, each withdrawal deposited together with the reserve, until the reserve is answered
/// otherwise. `Err(answer)`: sold out as a whole (or, a newer version on sale, not on sale), or
/// still short after every round (busy).
async fn rebalance<S: Reserving + ?Sized>(
    store: &S,
    activity: &Activity,
    layout: &Layout,
    home: Segment<'_>,
    call: &ReserveCall<'_>,
    mut outcome: ReserveOutcome,
    asked_at: Instant,
) -> Result<Result<ReserveOutcome, ReserveAnswer>, ReserveFailed> {
    let mut rounds = 0;
    while let ReserveOutcome::Insufficient { remaining } = outcome {
        if !layout.is_segmented() {
            return Ok(Err(ReserveAnswer::SoldOut {
                left: remaining as i64,
            }));
        }
        // Sold out only when the whole activity holds less than asked (units in flight
        // between two segments included).
        let standing = store
            .standing(activity, asked_at)
            .await
            .map_err(|error| ReserveFailed {
                error,
                landed_maybe: None,
            })?;
        if standing.left < i64::from(call.qty) {
            return Ok(Err(match newer_version(activity, standing.newest) {
                Some(refusal) => ReserveAnswer::NotOnSale(Some(refusal)),
                None => ReserveAnswer::SoldOut {
                    left: standing.left,
                },
            }));
        }
        let mut have = remaining;
        if rounds > 0 {
            // A round left the buyer short although units exist: in flight between two
            // others, or just deposited here by another buyer. Look again after a moment.
            if rounds == MAX_REBALANCE_ROUNDS {
                return Ok(Err(ReserveAnswer::Busy));
            }
            tokio::time::sleep(Duration::from_millis(1 << rounds.min(4))).await;
            match attempt(store, home, call).await? {
                ReserveOutcome::Insufficient { remaining } => have = remaining,
                settled => {
                    outcome = settled;
                    break;
                }
            }
        }
        rounds += 1;
        outcome = match pull(store, activity, layout, home, call, have).await {
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
    Ok(Ok(outcome))
}

/// What a reserve's last outcome means for the purchase.
fn answer(
    outcome: ReserveOutcome,
    activity: &Activity,
    purchase: Purchase<'_>,
    home: Segment<'_>,
    segmented: bool,
) -> ReserveAnswer {
    match outcome {
        ReserveOutcome::Reserved {
            remaining,
            created_ms,
            deadline_ms,
            fence,
        } => ReserveAnswer::Reserved {
            id: purchase.reservation_id.to_owned(),
            segment: home.index(),
            version: activity.version,
            qty: purchase.qty,
            replayed: false,
            remaining: (!segmented).then_some(remaining),
            created_ms,
            deadline_ms,
            fence,
            phase: None,
        },
        ReserveOutcome::Replayed {
            id,
            qty,
            version,
            remaining,
            created_ms,
            deadline_ms,
            fence,
            phase,
        } => ReserveAnswer::Reserved {
            id,
            segment: home.index(),
            version,
            qty,
            replayed: true,
            // A replay answered under another version (its own) says nothing of what is left of
            // the version on sale now: no figure, or a restock would be marked sold out.
            remaining: remaining.filter(|_| !segmented && version == activity.version),
            created_ms,
            deadline_ms,
            fence,
            phase,
        },
        ReserveOutcome::HoldRanOut => ReserveAnswer::HoldRanOut,
        ReserveOutcome::NotReplayed => ReserveAnswer::NotReplayed,
        ReserveOutcome::ReplayQuantityDiffers { .. } => ReserveAnswer::ReplayQuantityDiffers,
        ReserveOutcome::ReplayOtherVariant => ReserveAnswer::ReplayOtherVariant,
        ReserveOutcome::NotStarted => ReserveAnswer::NotStarted,
        ReserveOutcome::Ended => ReserveAnswer::Ended,
        ReserveOutcome::HeldForLine { remaining } => ReserveAnswer::HeldForLine { remaining },
        ReserveOutcome::LimitExceeded { .. } => ReserveAnswer::LimitExceeded,
        ReserveOutcome::NoStockKey => ReserveAnswer::NotOnSale(None),
        ReserveOutcome::DuplicateId => ReserveAnswer::DuplicateId,
        ReserveOutcome::Fenced => ReserveAnswer::Fenced,
        ReserveOutcome::Damaged | ReserveOutcome::DepositRefused { damaged: true } => {
            ReserveAnswer::NotOnSale(Some(Refusal::Damaged {
                id: activity.id.to_string(),
                segment: home.index(),
            }))
        }
        ReserveOutcome::DepositRefused { damaged: false }
        | ReserveOutcome::OtherVersion { .. }
        | ReserveOutcome::Contended => ReserveAnswer::Busy,
        ReserveOutcome::Insufficient { .. } => unreachable!("the loop above ends every shortage"),
    }
}

/// A newer version than this configuration's is on sale (this instance runs an older YAML
/// while another's prewarm retires its version segment by segment): then "nothing left" is
/// about a retired version, and the buyer is told `unavailable`, not `sold_out`.
fn newer_version(activity: &Activity, newest: Option<u64>) -> Option<Refusal> {
    let newest = newest?;
    (newest > activity.version).then(|| Refusal::OlderVersion {
        id: activity.id.to_string(),
        configured: activity.version,
        newest,
    })
}

/// One reserve call in the home segment; an error says whether it may have landed.
async fn attempt<S: Reserving + ?Sized>(
    store: &S,
    home: Segment<'_>,
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
    /// No other segment had units of this version.
    Nothing,
    /// Units arrived with the reserve: its outcome (possibly still short).
    Reserved(ReserveOutcome),
    /// The deposit-and-reserve failed with an unknown outcome.
    Failed(StoreError),
}

/// One round over the other segments (starting at one chosen by the reservation id, so
/// buyers of one home do not all empty the same giver): withdraw what the home lacks (at least
/// a chunk, so a busy home does not come back for every unit) and deposit it with the reserve.
/// A withdrawal whose deposit is cut short stays recorded on the giver; the sweep delivers it.
async fn pull<S: Reserving + ?Sized>(
    store: &S,
    activity: &Activity,
    layout: &Layout,
    home: Segment<'_>,
    call: &ReserveCall<'_>,
    mut have: u64,
) -> Pulled {
    let count = layout.count();
    let chunk = (activity.stock / (u64::from(count) * REBALANCE_CHUNKS_PER_SEGMENT)).max(1);
    let start = call
        .reservation_id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let mut moved_any = false;
    for step in 0..count - 1 {
        let giver = layout
            .segment((home.index() + 1 + (start.wrapping_add(step)) % (count - 1)) % count)
            .expect("segment index in range");
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
pub async fn deposit_and_reserve<S: Reserving + ?Sized>(
    store: &S,
    giver: Segment<'_>,
    home: Segment<'_>,
    call: &ReserveCall<'_>,
    transfer_id: &str,
    units: u64,
) -> Result<ReserveOutcome, StoreError> {
    store.before_deposit(home).await;
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

#[cfg(test)]
mod tests;
