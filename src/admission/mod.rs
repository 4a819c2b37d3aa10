//! Admission's parts: what the purchase pipeline's gates (`crate::purchase`) decide with. The
//! decisions and their answers, the buyer's identity, the token buckets, reading the target, the
//! quantity and the `Idempotency-Key`, routing, and the reserve itself: one script in Redis (the
//! only round trip), unless the breaker says Redis is down; then the activity's
//! `on_store_failure` decides: `unavailable`, or forwarded unreserved (marked) under the
//! instance-wide passthrough cap.

pub mod fleet_limit;
pub mod identity;
pub mod policy;
pub mod rate_limit;
pub mod request;
pub mod route;
pub mod target;

pub use policy::{LimitKind, LimitMode, PassthroughOutcome, Policy};
pub use request::{body_quantity, idempotency_key, quantity, variant, IDEMPOTENCY_HEADER};

use crate::config::{Activity, SaleRoute, Settings, StoreFailurePolicy};
use crate::decision::{BadRequest, Decision};
use crate::metrics::Metrics;
use crate::reservation::Reservation;
use crate::stock::breaker::{Breaker, Pass};
use crate::stock::segments::{Purchase, Refusal, Reserve};
use crate::stock::{Layout, StoreError};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use target::Target;

/// What admission learned about a sale request, kept for the response and the decision log.
#[derive(Debug, Default, Clone)]
pub struct SaleFacts {
    pub activity: Option<Arc<Activity>>,
    pub user: Option<String>,
    pub qty: Option<u32>,
    /// Units left in the stock version after this request's script call, where one was made.
    pub stock_after: Option<u64>,
}

/// What admission needs from the stock store: one reserve over all of an activity's segments,
/// and word that a version sold out. The gateway's implementation is the lifecycle, which
/// abandons a reserve whose reply was lost (so every release is counted in one place) and tells
/// the other instances; unit tests use a fake.
#[async_trait::async_trait]
pub trait StockPort: Send + Sync {
    /// Reserves `purchase` (see `stock::segments::reserve`). An `Err` is a store failure whose
    /// reserve, if it landed, the implementation gives back.
    async fn reserve(
        &self,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
    ) -> Result<Reserve, StoreError>;

    /// What the store said is left of `activity`'s version (`left <= 0`: nothing anywhere);
    /// the owner of the sale state keeps it (the gauge, the sold-out mark, word to the other
    /// instances). `ttl`: the request's `sold_out_cache.ttl_ms`.
    fn learned_left(&self, activity: &Activity, left: i64, ttl: std::time::Duration);

    /// Redis's record refuses the activity's configuration (a reserve's answer).
    fn refused(&self, activity: &Arc<str>, refusal: Refusal);

    /// Whether the activity, as configured now, is known refused.
    fn is_refused(&self, activity: &Activity) -> bool;

    /// Whether the activity is fenced: its Redis master was replaced (`stock::failover`).
    fn is_fenced(&self, _activity: &Activity) -> bool {
        false
    }

    /// Whether this instance knows the activity's current version sold out.
    fn is_sold_out(&self, activity: &Activity, ttl: std::time::Duration) -> bool;

    /// Whether this instance knows the activity halted for the whole fleet, or cannot know yet.
    fn is_halted(&self, _activity: &Activity) -> bool {
        false
    }

    /// The time the sale's hours are judged by before any call: the store's clock, as well as
    /// it is known (the reserve script judges again by the store's own).
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    /// Whether [`StockPort::now`] is the store's clock (read at least once), not a guess: until
    /// it is, nothing is forwarded unreserved, as nothing would judge its hours.
    fn knows_the_clock(&self) -> bool {
        true
    }
}

/// The rules one configuration generation gives admission: the settings and its buckets.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    pub settings: &'a Settings,
    pub policy: &'a Policy,
}

/// Where a request goes, decided once, before anything else reads it (the edge fails closed).
#[derive(Debug)]
pub enum Routed<'s, 't> {
    /// A sale route, with the activity segment of its path.
    Sale(&'s SaleRoute, &'t str),
    /// Refused (400) on any route: what the gateway cannot read, it never passes through.
    Refused(EdgeRefusal),
    /// Any other route: forwarded, in its normalised form.
    Other,
}

crate::label_enum! {
    /// Why the edge refused a request before routing it (the `reason` label of
    /// `flashgate_edge_refusals_total`).
    pub enum EdgeRefusal {
        /// The decoded path is not UTF-8.
        NotUtf8 => "not_utf8",
        /// The decoded path holds a control character.
        ControlCharacter => "control_character",
        /// Deeper than `target::MAX_SEGMENTS` segments while resolving.
        TooDeep => "too_deep",
        /// Resembles a sale route (see `route::resembles`) without being one.
        LookAlike => "look_alike",
    }
}

impl EdgeRefusal {
    /// What the buyer is told (400 `bad_request`).
    pub fn decision(self) -> Decision {
        Decision::BadRequest(match self {
            EdgeRefusal::LookAlike => BadRequest::LookAlikeTarget,
            _ => BadRequest::UnreadableTarget,
        })
    }
}

/// Routes a normalised request: a sale route, refused, or another route.
pub fn route<'s, 't>(settings: &'s Settings, target: &'t Target) -> Routed<'s, 't> {
    if let Err(unreadable) = &target.segments {
        return Routed::Refused(match unreadable {
            target::Unreadable::NotUtf8 => EdgeRefusal::NotUtf8,
            target::Unreadable::ControlCharacter => EdgeRefusal::ControlCharacter,
            target::Unreadable::TooDeep => EdgeRefusal::TooDeep,
        });
    }
    if let Some((route, activity)) = sale_route(settings, target) {
        return Routed::Sale(route, activity);
    }
    let resembles = |t: &Target| settings.sale_routes.iter().any(|r| route::resembles(r, t));
    if resembles(target) {
        return Routed::Refused(EdgeRefusal::LookAlike);
    }
    // A proxy between the gateway and the backend may decode the path again (`%252F` becoming
    // `/`, joining or splitting segments): read as they would be, up to twice more.
    let mut again = target.decoded_again();
    for _ in 0..2 {
        let Some(t) = again else { break };
        if sale_route(settings, &t).is_some() || resembles(&t) {
            return Routed::Refused(EdgeRefusal::LookAlike);
        }
        again = t.decoded_again();
    }
    Routed::Other
}

/// The sale route a (normalised) request is on, with its activity segment; `None` passes
/// through.
pub fn sale_route<'s, 't>(
    settings: &'s Settings,
    target: &'t Target,
) -> Option<(&'s SaleRoute, &'t str)> {
    settings
        .sale_routes
        .iter()
        .find_map(|r| route::match_target(r, target).map(|act| (r, act)))
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

/// Admission's shared parts: the stock port (which also answers what is known of the sale:
/// sold out, refused) and the breaker in front of the store. The rules come with each call, from
/// the request's generation.
pub struct Admission {
    stock: Arc<dyn StockPort>,
    metrics: Arc<Metrics>,
    pub breaker: Arc<Breaker>,
    /// The fleet-wide buckets (`scope: fleet`), where the store can keep them.
    fleet: Option<fleet_limit::FleetBuckets>,
}

impl Admission {
    pub fn new(stock: Arc<dyn StockPort>, metrics: Arc<Metrics>, breaker: Arc<Breaker>) -> Self {
        Admission {
            stock,
            metrics,
            breaker,
            fleet: None,
        }
    }

    /// Keeps `scope: fleet` buckets in `store` (without, they are each gateway's own).
    pub fn with_fleet_buckets(mut self, store: Arc<dyn fleet_limit::FleetTokens>) -> Self {
        self.fleet = Some(fleet_limit::FleetBuckets::new(store, self.metrics.clone()));
        self
    }

    /// Takes a token from the `kind` bucket for `key`: the fleet's or this gateway's own, as
    /// configured (see [`Policy::take_fleet_token`]).
    pub async fn take_token(
        &self,
        rules: Rules<'_>,
        kind: LimitKind,
        key: &str,
    ) -> Result<(), Decision> {
        rules
            .policy
            .take_fleet_token(kind, key, self.fleet.as_ref(), &self.metrics)
            .await
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether this instance knows `activity` halted for the whole fleet.
    pub fn is_halted(&self, activity: &Activity) -> bool {
        self.stock.is_halted(activity)
    }

    /// The time the sale's hours are judged by before any call (see [`StockPort::now`]).
    pub fn now(&self) -> DateTime<Utc> {
        self.stock.now()
    }

    /// Whether this instance knows `activity`'s current version sold out.
    pub fn is_sold_out(&self, activity: &Activity, ttl: std::time::Duration) -> bool {
        self.stock.is_sold_out(activity, ttl)
    }

    /// One reserve in Redis (the only round trip), unless the breaker says Redis is down; then
    /// the activity's `on_store_failure` decides. On `Reserved` the stock is held and the caller
    /// must either forward the reservation or release it.
    pub async fn take(
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
        };
        match self
            .reserve(rules.settings, &activity, purchase, facts)
            .await
        {
            Ok(admitted) => Ok(admitted),
            // Never unreserved past a waiting room (or hours) that held the buyer back.
            Err(Decision::StoreUnavailable)
                if activity.on_store_failure == StoreFailurePolicy::Passthrough
                    && !replay_only
                    && self.stock.knows_the_clock() =>
            {
                match rules.policy.pass_through(&activity.id, &self.metrics) {
                    PassthroughOutcome::Forwarded => Ok(Admitted::Passthrough),
                    PassthroughOutcome::Capped => Err(Decision::StoreUnavailable),
                }
            }
            Err(decision) => Err(decision),
        }
    }

    /// Reserves through the stock port (the buyer's home segment, pulling from the others when
    /// it runs short) and turns its outcome into a reservation or a decision.
    async fn reserve(
        &self,
        settings: &Settings,
        activity: &Arc<Activity>,
        purchase: Purchase<'_>,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        if self.stock.is_refused(activity) || self.stock.is_fenced(activity) {
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
        outcome: Reserve,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        match outcome {
            Reserve::Reserved {
                id,
                segment,
                version,
                qty,
                replayed,
                remaining,
                created_ms,
                deadline_ms,
                fence,
            } => {
                facts.qty = Some(qty);
                facts.stock_after = remaining;
                if let Some(left) = remaining {
                    self.learn_remaining(settings, activity, left as i64);
                }
                Ok(Admitted::Reserved(Reservation {
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
                }))
            }
            Reserve::SoldOut { left } => {
                if !activity.is_segmented() {
                    facts.stock_after = Some(left.max(0) as u64);
                }
                self.learn_remaining(settings, activity, left);
                Err(Decision::SoldOut)
            }
            Reserve::Busy | Reserve::HoldRanOut | Reserve::Fenced => Err(Decision::Unavailable),
            Reserve::LimitExceeded => Err(Decision::LimitExceeded),
            Reserve::NotOnSale(refusal) => {
                match refusal {
                    Some(refusal) => self.stock.refused(&activity.lane, refusal),
                    None => tracing::warn!(activity = %activity.id,
                        "reserve found no stock key even after prewarming"),
                }
                Err(Decision::Unavailable)
            }
            // Answered only to a replay-only purchase, made only when a new one was refused.
            Reserve::NotReplayed => Ok(Admitted::NotReplayed),
            // The gateway's clock said open, Redis's did not: Redis's is the one that counts.
            Reserve::NotStarted => Err(Decision::NotStarted),
            Reserve::Ended => Err(Decision::Ended),
            Reserve::ReplayQuantityDiffers => {
                Err(Decision::BadRequest(BadRequest::QuantityDiffersFromRetry))
            }
            Reserve::ReplayOtherVariant => {
                Err(Decision::BadRequest(BadRequest::VariantDiffersFromRetry))
            }
            Reserve::DuplicateId => {
                tracing::warn!(activity = %activity.id, "reservation id already used");
                Err(Decision::Unavailable)
            }
        }
    }

    /// Tells the sale state's owner what the store said is left.
    fn learn_remaining(&self, settings: &Settings, activity: &Activity, left: i64) {
        let ttl = settings.sold_out_cache.ttl;
        self.stock.learned_left(activity, left, ttl);
    }
}
