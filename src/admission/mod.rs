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
pub mod target;

pub use decision::{BadRequest, Decision, Reply};

use crate::config::Bucket;
use crate::config::{Activity, SaleWindow, Settings, StoreFailurePolicy};
use crate::lifecycle::Lifecycle;
use crate::live::Generation;
use crate::metrics::Metrics;
use crate::metrics::PassthroughOutcome;
use crate::metrics::{LimitKind, LimitMode};
use crate::news::{self, News};
use crate::refusals::Refusals;
use crate::reservation::Reservation;
use crate::sold_out::SoldOutCache;
use crate::stock::breaker::{Breaker, Pass};
use crate::stock::segments::{self, Purchase, Reserve};
use crate::stock::{Layout, StockStore};
use chrono::Utc;
use http::HeaderMap;
use identity::Identifier;
use pingora::http::RequestHeader;
use rate_limit::KeyedRateLimiter;
use route::SaleRoute;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use target::{lenient_name, Target};

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

    /// Whether `peer` is one of `identity.trusted_proxies`.
    pub fn trusts(&self, peer: Option<IpAddr>) -> bool {
        self.identifier.trusts(peer)
    }

    /// The client's address: the peer, or from a trusted proxy's `X-Forwarded-For`.
    pub fn client_ip(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        self.identifier.client_ip(headers, peer)
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

/// The sale route a (normalised) request is on, with its activity segment; `None` passes
/// through.
pub fn sale_route<'s, 't>(
    settings: &'s Settings,
    target: &'t Target,
) -> Option<(&'s SaleRoute, &'t str)> {
    settings
        .sale_routes
        .iter()
        .find_map(|r| r.match_target(target).map(|act| (r, act)))
}

/// A request on a sale route, as admission reads it.
#[derive(Debug, Clone, Copy)]
pub struct SaleRequest<'a> {
    pub req: &'a RequestHeader,
    /// Its target, normalised.
    pub target: &'a Target,
    pub route: &'a SaleRoute,
    /// The activity segment of its path.
    pub activity: &'a str,
    /// The TCP peer.
    pub peer: Option<IpAddr>,
}

/// A sale request that passed every check made without Redis.
#[derive(Debug)]
pub struct Checked {
    activity: Arc<Activity>,
    user: String,
    qty: u32,
    idempotency_key: Option<String>,
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
    /// Activities Redis's record refuses (not on sale), learned by prewarm.
    pub refused: Arc<Refusals>,
    lifecycle: Arc<Lifecycle>,
}

impl Admission {
    pub fn new(
        store: Arc<StockStore>,
        metrics: Arc<Metrics>,
        sold_out: Arc<SoldOutCache>,
        breaker: Arc<Breaker>,
        refused: Arc<Refusals>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        Admission {
            sold_out,
            store,
            metrics,
            breaker,
            refused,
            lifecycle,
        }
    }

    /// Steps 0 to 5: everything decided without Redis (identity, activity, quantity, window,
    /// token buckets, the sold-out cache). What passes may then [`Admission::take`] stock.
    pub fn check(
        &self,
        generation: &Generation,
        sale: &SaleRequest<'_>,
        facts: &mut SaleFacts,
    ) -> Result<Checked, Decision> {
        let SaleRequest {
            req,
            target,
            route,
            activity: raw_activity,
            peer,
        } = *sale;
        let policy = &generation.policy;
        if let Some(ip) = policy.identifier.client_ip(&req.headers, peer) {
            self.take_token(&policy.per_ip, &ip)?;
        }
        let user = policy
            .identifier
            .identify(&req.headers, peer)
            .ok_or(Decision::Unauthenticated)?;
        facts.user = Some(user.clone());
        let activity = generation
            .settings
            .activities
            .get(raw_activity)
            .ok_or(Decision::UnknownActivity)?
            .clone();
        facts.activity = Some(activity.clone());
        let qty = quantity(
            target.query.as_deref(),
            route.quantity_query(),
            activity.max_per_request,
        )
        .map_err(Decision::BadRequest)?;
        facts.qty = Some(qty);
        let idempotency_key = idempotency_key(&req.headers)
            .map_err(Decision::BadRequest)?
            .map(str::to_owned);
        match activity.window_at(Utc::now()) {
            SaleWindow::NotStarted => return Err(Decision::NotStarted),
            SaleWindow::Ended => return Err(Decision::Ended),
            SaleWindow::Open => {}
        }
        self.take_token(&policy.per_user, user.as_str())?;
        // A retry with an Idempotency-Key may hold a reservation already: only Redis can say,
        // so it is never answered from the cache (the activity bucket still caps such calls).
        if idempotency_key.is_none() && self.sold_out.is_sold_out(&activity.id, activity.version) {
            return Err(Decision::SoldOut);
        }
        self.take_token(&policy.per_activity, &*activity.id)?;
        Ok(Checked {
            activity,
            user,
            qty,
            idempotency_key,
        })
    }

    /// Step 6: one reserve in Redis (the only round trip), unless the breaker says Redis is
    /// down; then the activity's `on_store_failure` decides. On `Reserved` the stock is held
    /// and the caller must either forward the reservation or release it.
    pub async fn take(
        &self,
        generation: &Generation,
        checked: Checked,
        facts: &mut SaleFacts,
    ) -> Result<Admitted, Decision> {
        let home = Layout::of(&checked.activity).home(&checked.user).index();
        let id = Reservation::id_in_segment(&checked.activity, home);
        self.take_with_id(generation, checked, facts, id).await
    }

    /// [`Admission::take`] with the reservation id made by the caller (the ids of a request are
    /// the gateway's own; tests use this to replay a reserve whose abandon landed first).
    pub async fn take_with_id(
        &self,
        generation: &Generation,
        checked: Checked,
        facts: &mut SaleFacts,
        id: String,
    ) -> Result<Admitted, Decision> {
        let Checked {
            activity,
            user,
            qty,
            idempotency_key,
        } = checked;
        match self
            .reserve(&activity, &user, qty, idempotency_key.as_deref(), facts, id)
            .await
        {
            Ok(reservation) => Ok(Admitted::Reserved(reservation)),
            Err(Decision::StoreUnavailable)
                if activity.on_store_failure == StoreFailurePolicy::Passthrough =>
            {
                self.pass_through(&generation.policy, &activity)
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

    /// Reserves through the stock layer (the buyer's home segment, pulling from the others when
    /// it runs short) and turns its outcome into a reservation or a decision.
    async fn reserve(
        &self,
        activity: &Arc<Activity>,
        user: &str,
        qty: u32,
        idempotency_key: Option<&str>,
        facts: &mut SaleFacts,
        id: String,
    ) -> Result<Reservation, Decision> {
        if self.refused.is_refused(activity) {
            return Err(Decision::Unavailable);
        }
        let pass = self.breaker.pass();
        if pass == Pass::Skip {
            return Err(Decision::StoreUnavailable);
        }
        let purchase = Purchase {
            user,
            qty,
            reservation_id: &id,
            idempotency_key,
        };
        let outcome = segments::reserve(&self.store, activity, purchase).await;
        self.breaker.record(pass, outcome.is_ok());
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(failed) => {
                if let Some(partition) = failed.landed_maybe {
                    self.lifecycle
                        .abandon_in_background(activity.clone(), partition, id);
                }
                tracing::warn!(activity = %activity.id, error = %failed, "reserve failed");
                return Err(Decision::StoreUnavailable);
            }
        };
        match outcome {
            Reserve::Reserved {
                id,
                partition,
                version,
                qty,
                replayed,
                remaining,
                created_ms,
                deadline_ms,
            } => {
                facts.qty = Some(qty);
                facts.stock_after = remaining;
                if let Some(left) = remaining {
                    self.learn_remaining(activity, left as i64);
                }
                Ok(Reservation {
                    id,
                    user: user.to_owned(),
                    activity: activity.id.clone(),
                    segment: partition,
                    qty,
                    version,
                    owned: !replayed,
                    created_ms,
                    deadline_ms,
                })
            }
            Reserve::SoldOut { left } => {
                if !activity.is_segmented() {
                    facts.stock_after = Some(left.max(0) as u64);
                }
                self.learn_remaining(activity, left);
                Err(Decision::SoldOut)
            }
            Reserve::Busy | Reserve::HoldRanOut => Err(Decision::Unavailable),
            Reserve::LimitExceeded => Err(Decision::LimitExceeded),
            Reserve::NotOnSale(refusal) => {
                match refusal {
                    Some(refusal) => {
                        tracing::error!(activity = %activity.id, %refusal, "not on sale");
                        self.refused.set(&activity.id, Some(refusal));
                    }
                    None => tracing::warn!(activity = %activity.id,
                        "reserve found no stock key even after prewarming"),
                }
                Err(Decision::Unavailable)
            }
            Reserve::DuplicateId => {
                tracing::warn!(activity = %activity.id, "reservation id already used");
                Err(Decision::Unavailable)
            }
        }
    }

    /// Records what the store said about the stock: the gauge (where the answer covered the
    /// whole activity), and the sold-out cache when nothing is left anywhere.
    fn learn_remaining(&self, activity: &Activity, left: i64) {
        if !activity.is_segmented() {
            self.metrics
                .stock_remaining
                .with_label_values(&[&activity.id])
                .set(left);
        }
        if left <= 0 && !self.sold_out.is_sold_out(&activity.id, activity.version) {
            self.sold_out.mark_sold_out(&activity.id, activity.version);
            news::publish(
                &self.store,
                News::SoldOut {
                    activity: activity.id.to_string(),
                    version: activity.version,
                },
            );
        }
    }
}

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

/// A quantity a sale request's body names under the quantity parameter's name (or a lenient
/// spelling of it), for a backend that reads it there: form fields
/// (`application/x-www-form-urlencoded`) and top-level keys of a JSON object. `Err` when one is
/// not a plain number or two disagree; `None` when the body names none (or is of another type,
/// which flashgate does not read).
pub fn body_quantity(
    content_type: Option<&str>,
    body: &[u8],
    name: &str,
) -> Result<Option<u32>, BadRequest> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase());
    let lenient = name.to_ascii_lowercase();
    let mut found: Vec<String> = Vec::new();
    match media.as_deref() {
        Some("application/x-www-form-urlencoded") => {
            for pair in String::from_utf8_lossy(body).split('&') {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                if lenient_name(key) == lenient {
                    found.push(value.to_owned());
                }
            }
        }
        Some(m) if m == "application/json" || m.ends_with("+json") => {
            let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(body) else {
                return Ok(None);
            };
            for (key, value) in map {
                if lenient_name(&key) == lenient {
                    found.push(match value {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    });
                }
            }
        }
        _ => return Ok(None),
    }
    let mut qty = None;
    for value in found {
        let n: u32 = value
            .trim()
            .parse()
            .map_err(|_| BadRequest::QuantityAmbiguous)?;
        if qty.is_some_and(|q| q != n) {
            return Err(BadRequest::QuantityAmbiguous);
        }
        qty = Some(n);
    }
    Ok(qty)
}

/// Most digits a quantity may have (keeps parsing trivially overflow-free).
const MAX_QUANTITY_DIGITS: usize = 9;

/// The requested quantity from the query string: absent means 1; otherwise plain decimal
/// digits, given once, between 1 and `max`. A parameter a lenient backend would read as the
/// quantity under another spelling (`QTY`, `%71ty`, `qty[]`) is refused, never ignored.
pub fn quantity(query: Option<&str>, name: &str, max: NonZeroU32) -> Result<u32, BadRequest> {
    let mut found = None;
    let lenient = name.to_ascii_lowercase();
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            if found.is_some() {
                return Err(BadRequest::QuantityRepeated);
            }
            found = Some(value);
        } else if lenient_name(key) == lenient {
            return Err(BadRequest::QuantityAmbiguous);
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
        for lookalike in ["QTY=5", "qty=1&%71ty=5", "qty[]=5", "Qty%5B%5D=2"] {
            assert_eq!(
                q(Some(lookalike)),
                Err(BadRequest::QuantityAmbiguous),
                "{lookalike}"
            );
        }
    }

    #[test]
    fn a_body_quantity_is_read_as_a_backend_would() {
        let form = Some("application/x-www-form-urlencoded; charset=utf-8");
        assert_eq!(body_quantity(form, b"item=7&qty=2", "qty"), Ok(Some(2)));
        assert_eq!(body_quantity(form, b"QTY=2&qty=2", "qty"), Ok(Some(2)));
        assert_eq!(
            body_quantity(form, b"qty=2&qty%5B%5D=5", "qty"),
            Err(BadRequest::QuantityAmbiguous)
        );
        assert_eq!(body_quantity(form, b"note=hi", "qty"), Ok(None));
        let json = Some("application/json");
        assert_eq!(body_quantity(json, br#"{"qty": 3}"#, "qty"), Ok(Some(3)));
        assert_eq!(body_quantity(json, br#"{"Qty": "3"}"#, "qty"), Ok(Some(3)));
        assert_eq!(
            body_quantity(json, br#"{"qty": 1.5}"#, "qty"),
            Err(BadRequest::QuantityAmbiguous)
        );
        assert_eq!(body_quantity(json, b"not json", "qty"), Ok(None));
        assert_eq!(body_quantity(Some("text/plain"), b"qty=9", "qty"), Ok(None));
        assert_eq!(body_quantity(None, b"qty=9", "qty"), Ok(None));
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
