//! Admission: decides, per sale request, whether the buyer may take stock. Each step is cheaper
//! than the next and the first that refuses answers:
//!
//! 0. the client IP's token bucket, before any identity work (memory);
//! 1. identify the buyer, the activity and the quantity (no I/O);
//! 2. gate on configuration alone: unknown activity, not started, ended (no I/O);
//! 3. the buyer's token bucket (memory);
//! 4. the local sold-out cache (memory);
//! 5. the activity's admission bucket, which keeps a scripted flood off Redis (memory);
//! 6. one reserve script in Redis (the only round trip), unless the breaker says Redis is down;
//!    then the activity's `on_store_failure` decides: `unavailable`, or forwarded unreserved
//!    (marked) under the instance-wide passthrough cap.

pub mod decision;
pub mod identity;
pub mod rate_limit;
pub mod route;
pub mod sold_out;

pub use decision::{BadRequest, Decision, Reply};

use crate::config::Bucket;
use crate::config::{Activity, SaleWindow, Settings, StoreFailurePolicy};
use crate::live::Generation;
use crate::metrics::Metrics;
use crate::metrics::PassthroughOutcome;
use crate::metrics::{LimitKind, LimitMode};
use crate::news::News;
use crate::reservation::Reservation;
use crate::stock::breaker::{Breaker, Pass};
use crate::stock::{
    until_answered, PrewarmOutcome, ReleaseOutcome, ReserveOutcome, ReserveRequest, StockStore,
};
use chrono::Utc;
use http::HeaderMap;
use identity::Identifier;
use pingora::http::RequestHeader;
use rate_limit::KeyedRateLimiter;
use route::SaleRoute;
use sold_out::SoldOutCache;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

/// What admission learned about a sale request, kept for the response and the decision log.
#[derive(Debug, Default, Clone)]
pub struct SaleFacts {
    pub activity: Option<Arc<Activity>>,
    pub user: Option<String>,
    pub qty: Option<u32>,
    /// Units left in the stock version after this request's script call, where one was made.
    pub stock_after: Option<u64>,
}

/// One configured token bucket: its limiter, and whether it only counts (shadow).
struct Limit {
    kind: LimitKind,
    quota: governor::Quota,
    limiter: Arc<KeyedRateLimiter>,
    shadow: bool,
}

impl Limit {
    /// The limit for `bucket`, keeping `previous`'s buckets when the quota is the same (only
    /// `shadow` changed, or nothing did). A changed quota starts every bucket full.
    fn new(kind: LimitKind, bucket: Option<Bucket>, previous: Option<&Limit>) -> Option<Limit> {
        bucket.map(|b| Limit {
            kind,
            quota: b.quota,
            limiter: match previous {
                Some(p) if p.quota == b.quota => p.limiter.clone(),
                _ => Arc::new(KeyedRateLimiter::new(Some(b.quota))),
            },
            shadow: b.shadow,
        })
    }
}

/// The admission rules built from one configuration: who the buyer is, and the token buckets.
/// Part of a [`crate::live::Generation`], so a reload swaps them with the settings.
pub struct Policy {
    identifier: Identifier,
    per_user: Option<Limit>,
    per_ip: Option<Limit>,
    per_activity: Option<Limit>,
    /// The cap on unreserved forwards while the store is down (one bucket).
    passthrough: Limit,
}

impl Policy {
    pub fn new(settings: &Settings, previous: Option<&Policy>) -> Policy {
        let limits = &settings.rate_limits;
        Policy {
            identifier: Identifier::new(&settings.identity),
            per_user: Limit::new(
                LimitKind::PerUser,
                limits.per_user,
                previous.and_then(|p| p.per_user.as_ref()),
            ),
            per_ip: Limit::new(
                LimitKind::PerIp,
                limits.per_ip,
                previous.and_then(|p| p.per_ip.as_ref()),
            ),
            per_activity: Limit::new(
                LimitKind::PerActivity,
                limits.per_activity,
                previous.and_then(|p| p.per_activity.as_ref()),
            ),
            passthrough: Limit::new(
                LimitKind::Passthrough,
                Some(Bucket {
                    quota: limits.passthrough,
                    shadow: false,
                }),
                previous.map(|p| &p.passthrough),
            )
            .expect("a bucket is given"),
        }
    }

    fn limits(&self) -> impl Iterator<Item = &Limit> {
        [&self.per_user, &self.per_ip, &self.per_activity]
            .into_iter()
            .flatten()
    }

    /// Drops idle rate-limit buckets; returns how many remain.
    pub fn evict_idle_buckets(&self) -> usize {
        self.limits().map(|l| l.limiter.evict_idle()).sum()
    }

    /// Token buckets held in memory.
    pub fn buckets(&self) -> usize {
        self.limits().map(|l| l.limiter.len()).sum()
    }
}

/// The sale route a request is on, with the raw activity segment; `None` passes through.
pub fn sale_route<'s, 'p>(
    settings: &'s Settings,
    req: &'p RequestHeader,
) -> Option<(&'s SaleRoute, &'p str)> {
    let path = req.uri.path();
    settings
        .sale_routes
        .iter()
        .find_map(|r| r.match_request(&req.method, path).map(|act| (r, act)))
}

/// What an admitted sale request carries upstream.
#[derive(Debug)]
pub enum Admitted {
    /// Stock is held: forward with the signed reservation, or release.
    Reserved(Reservation),
    /// The store is down and the activity passes through: forward unreserved, marked.
    Passthrough,
}

/// Admission's shared parts: the store, the sold-out cache, the breaker in front of the store.
pub struct Admission {
    sold_out: Arc<SoldOutCache>,
    store: Arc<StockStore>,
    metrics: Arc<Metrics>,
    pub breaker: Arc<Breaker>,
}

impl Admission {
    pub fn new(
        store: Arc<StockStore>,
        metrics: Arc<Metrics>,
        sold_out: Arc<SoldOutCache>,
        breaker: Arc<Breaker>,
    ) -> Self {
        Admission {
            sold_out,
            store,
            metrics,
            breaker,
        }
    }

    /// Runs the whole admission for a request on `route`. On `Reserved` the stock is held in
    /// Redis and the caller must either forward the reservation or release it.
    pub async fn admit(
        &self,
        generation: &Generation,
        req: &RequestHeader,
        route: &SaleRoute,
        raw_activity: &str,
        peer: Option<IpAddr>,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        let policy = &generation.policy;
        if let Some(ip) = policy.identifier.client_ip(&req.headers, peer) {
            self.take_token(&policy.per_ip, &ip)?;
        }
        let user = policy
            .identifier
            .identify(&req.headers, peer)
            .ok_or(Decision::Unauthenticated)?;
        let user = facts.user.insert(user).clone();
        let user = user.as_str();
        let activity = generation
            .settings
            .activities
            .get(raw_activity)
            .ok_or(Decision::UnknownActivity)?
            .clone();
        facts.activity = Some(activity.clone());
        let qty = quantity(
            req.uri.query(),
            route.quantity_query(),
            activity.max_per_request,
        )
        .map_err(Decision::BadRequest)?;
        facts.qty = Some(qty);
        let idempotency_key = idempotency_key(&req.headers).map_err(Decision::BadRequest)?;
        match activity.window_at(Utc::now()) {
            SaleWindow::NotStarted => return Err(Decision::NotStarted),
            SaleWindow::Ended => return Err(Decision::Ended),
            SaleWindow::Open => {}
        }
        self.take_token(&policy.per_user, user)?;
        if self.sold_out.is_sold_out(&activity.id, activity.version) {
            return Err(Decision::SoldOut);
        }
        self.take_token(&policy.per_activity, &*activity.id)?;
        match self
            .reserve(&activity, user, qty, idempotency_key, facts)
            .await
        {
            Ok(reservation) => Ok(Admitted::Reserved(reservation)),
            Err(Decision::StoreUnavailable)
                if activity.on_store_failure == StoreFailurePolicy::Passthrough =>
            {
                self.pass_through(policy, &activity)
            }
            Err(decision) => Err(decision),
        }
    }

    /// The store cannot be asked and the activity passes through: forward unreserved while the
    /// instance-wide cap allows, for the backend's own stock check to decide.
    fn pass_through(&self, policy: &Policy, activity: &Activity) -> Result<Admitted, Decision> {
        let outcome = if policy.passthrough.limiter.check(&()).is_ok() {
            PassthroughOutcome::Forwarded
        } else {
            PassthroughOutcome::Capped
        };
        self.metrics
            .passthrough
            .with_label_values(&[&activity.id, outcome.as_str()])
            .inc();
        match outcome {
            PassthroughOutcome::Forwarded => Ok(Admitted::Passthrough),
            PassthroughOutcome::Capped => Err(Decision::StoreUnavailable),
        }
    }

    /// Takes a token from `limit`'s bucket for `key`; a shadow limit only counts its refusals.
    fn take_token<K: std::hash::Hash + ?Sized>(
        &self,
        limit: &Option<Limit>,
        key: &K,
    ) -> Result<(), Decision> {
        let Some(limit) = limit else { return Ok(()) };
        let Err(retry_after) = limit.limiter.check(key) else {
            return Ok(());
        };
        let mode = if limit.shadow {
            LimitMode::Shadow
        } else {
            LimitMode::Enforced
        };
        self.metrics
            .rate_limit_refusals
            .with_label_values(&[limit.kind.as_str(), mode.as_str()])
            .inc();
        if limit.shadow {
            Ok(())
        } else {
            Err(Decision::RateLimited { retry_after })
        }
    }

    /// Reserves in the buyer's home segment (the activity itself when it is not segmented); a
    /// segmented activity whose home segment runs short pulls units from the others first.
    async fn reserve(
        &self,
        activity: &Arc<Activity>,
        user: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        facts: &mut SaleFacts,
    ) -> Result<Reservation, Decision> {
        let pass = self.breaker.pass();
        if pass == Pass::Skip {
            return Err(Decision::StoreUnavailable);
        }
        let segment = activity.home_segment(user);
        let home = activity.segment(segment).expect("the home segment exists");
        let id = Reservation::id_in_segment(activity, segment);
        let request = ReserveRequest {
            activity: home,
            user,
            qty,
            reservation_id: &id,
            idempotency_key,
        };
        let mut outcome = self.store.reserve(request).await;
        if let Ok(ReserveOutcome::NoStockKey) = outcome {
            // Not prewarmed yet (or Redis lost it): create it once (never a reset) and retry once;
            // another instance may have created it meanwhile.
            // (Never under a segment count other than the one the version was first sold with.)
            let layout_ok = matches!(self.store.claim_layout(activity).await, Ok(Ok(())));
            let prewarmed = if layout_ok {
                self.store.prewarm(home).await.ok()
            } else {
                None
            };
            // Created by this call: a mark from before the key was lost is stale. Created by
            // another caller: any mark was set since, by a reserve that saw the new key.
            if prewarmed == Some(PrewarmOutcome::Created) {
                self.sold_out.clear(&activity.id, activity.version);
            }
            if matches!(
                prewarmed,
                Some(PrewarmOutcome::Created | PrewarmOutcome::Exists)
            ) {
                outcome = self.store.reserve(request).await;
            }
        }
        // A segment short of units: move some over from the others, then try again. With one
        // segment, "not enough here" is "not enough anywhere".
        let mut exhausted = activity.shards.is_empty();
        let mut rounds = 0;
        while let Ok(ReserveOutcome::Insufficient { remaining }) = outcome {
            if activity.shards.is_empty() || rounds == MAX_REBALANCE_ROUNDS {
                break;
            }
            rounds += 1;
            let needed = u64::from(qty).saturating_sub(remaining);
            if self.rebalance(activity, segment, needed).await == 0 {
                // The others are empty; concurrent buyers may just have moved units here, so
                // look once more before calling it sold out.
                if exhausted {
                    break;
                }
                exhausted = true;
            } else {
                exhausted = false;
            }
            outcome = self.store.reserve(request).await;
        }
        self.breaker.record(pass, outcome.is_ok());
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                if e.may_have_landed() {
                    // Only on this rare path: the home segment as an owned handle for the task.
                    let home = match activity.shards.get(segment as usize) {
                        Some(shard) => shard.clone(),
                        None => activity.clone(),
                    };
                    self.abandon_in_background(home, id);
                }
                tracing::warn!(activity = %activity.id, error = %e, "reserve failed");
                return Err(Decision::StoreUnavailable);
            }
        };
        let reservation = |id: String, qty: u32, version: u64| Reservation {
            id,
            user: user.to_owned(),
            activity: activity.id.clone(),
            segment,
            qty,
            version,
        };
        match outcome {
            ReserveOutcome::Replayed {
                id,
                qty,
                version,
                remaining,
            } => {
                facts.qty = Some(qty);
                facts.stock_after = remaining;
                Ok(reservation(id, qty, version))
            }
            ReserveOutcome::Reserved { remaining } => {
                self.learn_remaining(activity, remaining, activity.shards.is_empty());
                facts.stock_after = Some(remaining);
                Ok(reservation(id, qty, activity.version))
            }
            ReserveOutcome::Insufficient { remaining } => {
                // Segmented: the others looked empty, but units may be on their way between two
                // segments; only an activity whose every segment reads zero is sold out.
                let everywhere = exhausted
                    && (activity.shards.is_empty() || self.every_segment_empty(activity).await);
                self.learn_remaining(activity, remaining, everywhere);
                facts.stock_after = Some(remaining);
                if exhausted {
                    Err(Decision::SoldOut)
                } else {
                    // Other segments still had units, but others took them first every time:
                    // not sold out; busy.
                    Err(Decision::Unavailable)
                }
            }
            ReserveOutcome::LimitExceeded { .. } => Err(Decision::LimitExceeded),
            ReserveOutcome::NoStockKey | ReserveOutcome::DuplicateId => {
                tracing::warn!(activity = %activity.id, ?outcome, "reserve refused by the store");
                Err(Decision::Unavailable)
            }
        }
    }

    /// Whether every segment of an activity reads zero with no transfer between two of them
    /// (two reads per segment; the reads are not one snapshot, so a transfer finishing between
    /// them can still leave a sold-out mark that the next deposit or the cache TTL clears).
    async fn every_segment_empty(&self, activity: &Activity) -> bool {
        for segment in activity.segments() {
            let in_flight = self.store.unacknowledged_transfers(segment).await;
            if !matches!(in_flight, Ok(ref t) if t.is_empty()) {
                return false;
            }
        }
        for segment in activity.segments() {
            if !matches!(self.store.remaining(segment).await, Ok(Some(0))) {
                return false;
            }
        }
        true
    }

    /// Moves units from the other segments into segment `to` until `needed` arrived (taking at
    /// least a chunk, so a busy segment does not come back for every unit). Each move is a
    /// withdraw on the giver and a deposit on the receiver, idempotent on a transfer id; one cut
    /// short by a failure is delivered later by the sweep. Returns the units moved.
    async fn rebalance(&self, activity: &Activity, to: u32, needed: u64) -> u64 {
        let count = activity.segment_count();
        let receiver = activity.segment(to).expect("the receiving segment exists");
        let chunk = (activity.stock / (u64::from(count) * REBALANCE_CHUNKS_PER_SEGMENT)).max(1);
        let want = needed.max(chunk);
        let mut moved = 0;
        for step in 1..count {
            let giver = activity
                .segment((to + step) % count)
                .expect("segment index in range");
            let transfer_id = Reservation::new_id();
            let taken = match self
                .store
                .withdraw(giver, &transfer_id, want - moved, receiver)
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
            // On failure the transfer stays recorded on the giver; the sweep delivers it.
            if self
                .store
                .deposit(receiver, &transfer_id, taken)
                .await
                .is_ok()
            {
                let _ = self.store.acknowledge(giver, &transfer_id).await;
                moved += taken;
                // Units arrived: an activity marked sold out meanwhile is not.
                if self.sold_out.is_sold_out(&activity.id, activity.version) {
                    self.sold_out.clear(&activity.id, activity.version);
                    self.store.announce(News::Available {
                        activity: activity.id.to_string(),
                        version: activity.version,
                    });
                }
            }
            if moved >= needed {
                break;
            }
        }
        moved
    }

    /// Records what a script said about the stock: gauge, and the sold-out cache at zero. For a
    /// segmented activity the script saw one segment only: the gauge is the maintenance loop's,
    /// and "sold out" is learned when no segment had anything left to move.
    fn learn_remaining(&self, activity: &Activity, remaining: u64, everywhere: bool) {
        if activity.shards.is_empty() {
            self.metrics
                .stock_remaining
                .with_label_values(&[&activity.id])
                .set(remaining as i64);
        }
        if everywhere
            && remaining == 0
            && !self.sold_out.is_sold_out(&activity.id, activity.version)
        {
            self.sold_out.mark_sold_out(&activity.id, activity.version);
            self.store.announce(News::SoldOut {
                activity: activity.id.to_string(),
                version: activity.version,
            });
        }
    }

    /// A reserve whose outcome is unknown (timed out, connection lost) is released by id until
    /// Redis answers, so units never stay stranded behind a buyer who was told `unavailable`.
    fn abandon_in_background(&self, activity: Arc<Activity>, id: String) {
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            match until_answered(|| store.abandon(&activity, &id)).await {
                Some(ReleaseOutcome::Released { .. }) => metrics
                    .reservations_released
                    .with_label_values(&[
                        &activity.id,
                        crate::metrics::ReleaseReason::StoreTimeout.as_str(),
                    ])
                    .inc(),
                Some(_) => {}
                None => tracing::error!(activity = %activity.id, reservation = %id,
                    "could not release a reservation whose reserve timed out"),
            }
        });
    }
}

/// Most rebalancing rounds one purchase may trigger (each round asks every other segment once
/// and moves at least one unit, so the loop ends anyway; the cap bounds one buyer's wait while
/// many buyers of one segment keep taking what was just moved in).
const MAX_REBALANCE_ROUNDS: usize = 32;

/// A segment short of units takes at least `stock / (segments * this)` from a giver at a time.
const REBALANCE_CHUNKS_PER_SEGMENT: u64 = 8;

/// Header a buyer's client sets to make retries of one purchase return the same reservation.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// The `Idempotency-Key`, if sent: once, 1 to 128 visible ASCII characters.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, BadRequest> {
    let mut values = headers.get_all(IDEMPOTENCY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(BadRequest::IdempotencyKeyInvalid);
    }
    let key = value.as_bytes();
    let valid = !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && key.iter().all(u8::is_ascii_graphic);
    if !valid {
        return Err(BadRequest::IdempotencyKeyInvalid);
    }
    Ok(std::str::from_utf8(key).ok())
}

/// Most digits a quantity may have (keeps parsing trivially overflow-free).
const MAX_QUANTITY_DIGITS: usize = 9;

/// The requested quantity from the query string: absent means 1; otherwise plain decimal
/// digits, given once, between 1 and `max`.
pub fn quantity(query: Option<&str>, name: &str, max: NonZeroU32) -> Result<u32, BadRequest> {
    let mut found = None;
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            if found.is_some() {
                return Err(BadRequest::QuantityRepeated);
            }
            found = Some(value);
        }
    }
    let Some(value) = found else {
        return Ok(1);
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadRequest::QuantityNotInteger);
    }
    let digits = value.trim_start_matches('0');
    if digits.len() > MAX_QUANTITY_DIGITS {
        return Err(BadRequest::QuantityTooLarge);
    }
    let qty: u32 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| BadRequest::QuantityNotInteger)?
    };
    if qty == 0 {
        Err(BadRequest::QuantityTooSmall)
    } else if qty > max.get() {
        Err(BadRequest::QuantityTooLarge)
    } else {
        Ok(qty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn quantity_rules() {
        let max = NonZeroU32::new(3).unwrap();
        let q = |s: Option<&str>| quantity(s, "qty", max);
        assert_eq!(q(None), Ok(1));
        assert_eq!(q(Some("a=1")), Ok(1));
        assert_eq!(q(Some("qty=2")), Ok(2));
        assert_eq!(q(Some("x=9&qty=03")), Ok(3));
        assert_eq!(q(Some("qty=4")), Err(BadRequest::QuantityTooLarge));
        assert_eq!(q(Some("qty=0")), Err(BadRequest::QuantityTooSmall));
        assert_eq!(q(Some("qty=000")), Err(BadRequest::QuantityTooSmall));
        for bad in [
            "qty=", "qty", "qty=-1", "qty=+1", "qty=1.0", "qty=%201", "qty=one", "qty=1 ",
        ] {
            assert_eq!(q(Some(bad)), Err(BadRequest::QuantityNotInteger), "{bad}");
        }
        assert_eq!(
            q(Some("qty=99999999999999999999")),
            Err(BadRequest::QuantityTooLarge)
        );
        assert_eq!(q(Some("qty=1&qty=1")), Err(BadRequest::QuantityRepeated));
    }

    #[test]
    fn idempotency_key_rules() {
        let with = |values: &[&[u8]]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(IDEMPOTENCY_HEADER, HeaderValue::from_bytes(v).unwrap());
            }
            h
        };
        assert_eq!(idempotency_key(&with(&[])), Ok(None));
        assert_eq!(idempotency_key(&with(&[b"k-1"])), Ok(Some("k-1")));
        for bad in [&b""[..], b"a b", &[b'k'; 129], &[0xff]] {
            assert_eq!(
                idempotency_key(&with(&[bad])),
                Err(BadRequest::IdempotencyKeyInvalid)
            );
        }
        assert_eq!(
            idempotency_key(&with(&[b"a", b"b"])),
            Err(BadRequest::IdempotencyKeyInvalid)
        );
    }
}
