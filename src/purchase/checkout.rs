//! The checkout: what every purchase's gates share (the way to the stock, the sale state's read
//! half, the store's clock and fences, the breaker, the buckets), and the reserve itself: one
//! script in Redis (the only round trip), unless the breaker says Redis is down; then the
//! activity's `on_store_failure` decides: `unavailable`, or forwarded unreserved (marked) under
//! the instance-wide passthrough cap.

use crate::client_policy::{Buckets, PassthroughOutcome, Rules};
use crate::config::{Activity, Settings, StoreFailurePolicy};
use crate::decision::{BadRequest, Decision};
use crate::metrics::Metrics;
use crate::reservation::Reservation;
use crate::sale::SaleView;
use crate::stock::breaker::{Breaker, Pass};
use crate::stock::segments::{Purchase, Refusal, ReserveAnswer};
use crate::stock::{Layout, StockStore, StoreError};
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// What the gates learned about a sale request, kept for the response and the decision log.
#[derive(Debug, Default, Clone)]
pub struct SaleFacts {
    pub activity: Option<Arc<Activity>>,
    pub user: Option<String>,
    pub qty: Option<u32>,
    /// Units left in the stock version after this request's script call, where one was made.
    pub stock_after: Option<u64>,
}

/// The way to the stock, and what the purchase reports to the sale state's owner: one reserve
/// over all of an activity's segments, and what its answer taught. The gateway's
/// implementation is the lifecycle, which abandons a reserve whose reply was lost (so every
/// release is counted in one place) and tells the other gateways; unit tests use a fake.
#[async_trait::async_trait]
pub trait StockPort: Send + Sync {
    /// Reserves `purchase` (see `stock::segments::reserve`). An `Err` is a store failure whose
    /// reserve, if it landed, the implementation gives back.
    async fn reserve(
        &self,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
    ) -> Result<ReserveAnswer, StoreError>;

    /// What the store said is left of `activity`'s version (`left <= 0`: nothing anywhere);
    /// the owner of the sale state keeps it (the gauge, the sold-out mark, word to the other
    /// gateways). `ttl`: the request's `sold_out_cache.ttl_ms`.
    fn learned_left(&self, activity: &Activity, left: i64, ttl: std::time::Duration);

    /// Redis's record refuses the activity's configuration (a reserve's answer).
    fn refused(&self, activity: &Arc<str>, refusal: Refusal);
}

/// What the purchase reads of the store itself before any call: its clock and its fences.
pub trait StoreFacts: Send + Sync {
    /// The time the sale's hours are judged by before any call: the store's clock, as well as
    /// it is known (the reserve script judges again by the store's own).
    fn now(&self) -> DateTime<Utc>;

    /// Whether [`StoreFacts::now`] is the store's clock (read at least once), not a guess:
    /// until it is, nothing is forwarded unreserved, as nothing would judge its hours.
    fn knows_the_clock(&self) -> bool;

    /// Whether the activity is fenced: its Redis master was replaced (`stock::failover`).
    fn is_fenced(&self, activity: &Activity) -> bool;
}

impl StoreFacts for StockStore {
    fn now(&self) -> DateTime<Utc> {
        self.clock().now()
    }

    fn knows_the_clock(&self) -> bool {
        self.clock().known()
    }

    fn is_fenced(&self, activity: &Activity) -> bool {
        StockStore::is_fenced(self, activity)
    }
}

/// A purchase that passed every check made without Redis, as the reserve takes it.
#[derive(Debug)]
pub struct Take {
    pub activity: Arc<Activity>,
    pub user: String,
    pub qty: u32,
    pub idempotency_key: Option<String>,
    /// A new purchase was refused (outside the sale's hours, or by the waiting room): only the
    /// idempotency key's reservation may be handed out.
    pub replay_only: bool,
    /// The reservation's id, when the caller made it (else one for the buyer's home segment).
    pub id: Option<String>,
    /// The buyer's phases, on an activity sold in phases (see `gates::phase`).
    pub steps: Option<crate::stock::Steps>,
}

/// What the reserve gave a purchase.
#[derive(Debug)]
pub enum Admitted {
    /// Stock is held: forward with the signed reservation, or release.
    Reserved(Reservation),
    /// The store is down and the activity passes through: forward unreserved, marked.
    Passthrough,
    /// A replay-only purchase whose key won nothing: the refusal that held it back answers.
    NotReplayed,
}

/// The phase a reservation was bought in: a replay's as its record keeps it (`recorded`); a
/// new one's, the step the script judged by, found again from when it was made (`created_ms`,
/// Redis's clock).
fn phase_of(purchase: Purchase<'_>, recorded: Option<String>, created_ms: u64) -> Option<Arc<str>> {
    if let Some(phase) = recorded {
        return Some(Arc::from(phase));
    }
    let (_, phase) = purchase.steps?.at(created_ms as i64)?;
    Some(Arc::from(phase))
}

/// What every purchase's gates share (see the module's doc). The rules come with each call,
/// from the request's generation.
pub struct Checkout {
    stock: Arc<dyn StockPort>,
    store: Arc<dyn StoreFacts>,
    /// The sale state, read (the lifecycle writes it).
    pub sale: SaleView,
    pub breaker: Arc<Breaker>,
    pub buckets: Buckets,
    /// The access lists of sales in phases (`None`: none can be read; a list phase admits
    /// nobody, and the buyer waits for a later phase).
    pub access: Option<Arc<dyn crate::access::AccessLists>>,
}

impl Checkout {
    pub fn new(
        stock: Arc<dyn StockPort>,
        store: Arc<dyn StoreFacts>,
        sale: SaleView,
        metrics: Arc<Metrics>,
        breaker: Arc<Breaker>,
    ) -> Self {
        Checkout {
            stock,
            store,
            sale,
            breaker,
            buckets: Buckets::new(metrics),
            access: None,
        }
    }

    /// Reads sales' access lists from `lists`.
    pub fn with_access(mut self, lists: Arc<dyn crate::access::AccessLists>) -> Self {
        self.access = Some(lists);
        self
    }

    /// Keeps `scope: fleet` buckets in `store` (without, they are each gateway's own).
    pub fn with_fleet_buckets(
        mut self,
        store: Arc<dyn crate::client_policy::fleet_limit::FleetTokens>,
    ) -> Self {
        self.buckets = self.buckets.with_fleet(store);
        self
    }

    /// The time the sale's hours are judged by before any call (see [`StoreFacts::now`]).
    pub fn now(&self) -> DateTime<Utc> {
        self.store.now()
    }

    /// One reserve in Redis (the only round trip), unless the breaker says Redis is down; then
    /// the activity's `on_store_failure` decides. On `Reserved` the stock is held and the caller
    /// must either forward the reservation or release it.
    pub async fn take_stock(
        &self,
        rules: Rules<'_>,
        take: Take,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        let Take {
            activity,
            user,
            qty,
            idempotency_key,
            replay_only,
            id,
            steps,
        } = take;
        let id = id.unwrap_or_else(|| {
            let home = Layout::of(&activity).home(&user).index();
            Reservation::id_in_segment(&activity, home)
        });
        let purchase = Purchase {
            user: &user,
            qty,
            reservation_id: &id,
            idempotency_key: idempotency_key.as_deref(),
            in_flight: rules.settings.server.longest_sale_trip,
            replay_only,
            steps: steps.as_ref(),
        };
        match self
            .reserve_in_store(rules.settings, &activity, purchase, facts)
            .await
        {
            Ok(admitted) => Ok(admitted),
            // Never unreserved past a waiting room (or hours) that held the buyer back.
            Err(Decision::StoreUnavailable)
                if activity.on_store_failure == StoreFailurePolicy::Passthrough
                    && !replay_only
                    && self.store.knows_the_clock() =>
            {
                match self.buckets.pass_through(rules, &activity.id) {
                    PassthroughOutcome::Forwarded => Ok(Admitted::Passthrough),
                    PassthroughOutcome::Capped => Err(Decision::StoreUnavailable),
                }
            }
            Err(decision) => Err(decision),
        }
    }

    /// Reserves through the stock port (the buyer's home segment, pulling from the others when
    /// it runs short) and turns its outcome into a reservation or a decision.
    async fn reserve_in_store(
        &self,
        settings: &Settings,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        if self.sale.is_refused(activity) || self.store.is_fenced(activity) {
            return Err(Decision::Unavailable);
        }
        let pass = self.breaker.pass(&settings.breaker);
        if pass == Pass::Skip {
            return Err(Decision::StoreUnavailable);
        }
        let outcome = self.stock.reserve(activity, purchase).await;
        self.breaker
            .record(&settings.breaker, pass, outcome.is_ok());
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::warn!(activity = %activity.id, %error, "reserve failed");
                return Err(Decision::StoreUnavailable);
            }
        };
        self.answer(settings, activity, purchase, outcome, facts)
    }

    /// What the store's answer to a reserve means for the buyer (and what it taught the sale
    /// state's owner).
    fn answer(
        &self,
        settings: &Settings,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
        outcome: ReserveAnswer,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        match outcome {
            reserved @ ReserveAnswer::Reserved { .. } => {
                Ok(self.admitted(settings, activity, purchase, reserved, facts))
            }
            ReserveAnswer::SoldOut { left } => {
                if !activity.is_segmented() {
                    facts.stock_after = Some(left.max(0) as u64);
                }
                self.learn_remaining(settings, activity, left);
                Err(Decision::SoldOut)
            }
            ReserveAnswer::Busy | ReserveAnswer::HoldRanOut | ReserveAnswer::Fenced => {
                Err(Decision::Unavailable)
            }
            ReserveAnswer::LimitExceeded => Err(Decision::LimitExceeded),
            // Sold out to everyone outside the line: answered from memory from now on (as a
            // sale with nothing left), but for a buyer presenting their line ticket.
            ReserveAnswer::HeldForLine { .. } => {
                self.learn_remaining(settings, activity, 0);
                Err(Decision::SoldOut)
            }
            ReserveAnswer::NotOnSale(refusal) => {
                match refusal {
                    Some(refusal) => self.stock.refused(&activity.lane, refusal),
                    None => tracing::warn!(activity = %activity.id,
                        "reserve found no stock key even after prewarming"),
                }
                Err(Decision::Unavailable)
            }
            // Answered only to a replay-only purchase, made only when a new one was refused.
            ReserveAnswer::NotReplayed => Ok(Admitted::NotReplayed),
            // The gateway's clock said open, Redis's did not: Redis's is the one that counts.
            // In a sale in phases, a buyer whose own phase opens after the first one's is told
            // when theirs does.
            ReserveAnswer::NotStarted => Err(self.not_started(activity, purchase)),
            ReserveAnswer::Ended => Err(Decision::Ended),
            ReserveAnswer::ReplayQuantityDiffers => {
                Err(Decision::BadRequest(BadRequest::QuantityDiffersFromRetry))
            }
            ReserveAnswer::ReplayOtherVariant => {
                Err(Decision::BadRequest(BadRequest::VariantDiffersFromRetry))
            }
            ReserveAnswer::DuplicateId => {
                tracing::warn!(activity = %activity.id, "reservation id already used");
                Err(Decision::Unavailable)
            }
        }
    }

    /// A reservation the store made (or replayed): what the buyer is forwarded with.
    fn admitted(
        &self,
        settings: &Settings,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
        reserved: ReserveAnswer,
        facts: &mut SaleFacts,
    ) -> Admitted {
        let ReserveAnswer::Reserved {
            id,
            segment,
            version,
            qty,
            replayed,
            remaining,
            created_ms,
            deadline_ms,
            fence,
            phase,
        } = reserved
        else {
            unreachable!("called with a reservation")
        };
        facts.qty = Some(qty);
        facts.stock_after = remaining;
        if let Some(left) = remaining {
            self.learn_remaining(settings, activity, left as i64);
        }
        Admitted::Reserved(Reservation {
            id,
            user: purchase.user.to_owned(),
            activity: activity.id.clone(),
            variant: activity.variant.clone(),
            segment,
            qty,
            version,
            owned: !replayed,
            created_ms,
            deadline_ms,
            fence,
            phase: phase_of(purchase, phase, created_ms),
        })
    }

    /// Before the buyer may buy, by Redis's clock: in a sale in phases, a buyer whose own
    /// phase opens after the first one's is told when theirs does.
    fn not_started(&self, activity: &Activity, purchase: Purchase<'_>) -> Decision {
        match purchase.steps.and_then(|s| s.opens_ms()) {
            Some(opens) if opens > activity.opens().timestamp_millis() => {
                Decision::not_eligible(opens, self.now().timestamp_millis())
            }
            _ => Decision::NotStarted,
        }
    }

    /// Tells the sale state's owner what the store said is left.
    fn learn_remaining(&self, settings: &Settings, activity: &Activity, left: i64) {
        let ttl = settings.sold_out_cache.ttl;
        self.stock.learned_left(activity, left, ttl);
    }
}
