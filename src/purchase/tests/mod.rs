//! The purchase pipeline against a fake stock port and a fake waiting room: every verdict it
//! gives from the request and what the store answers (or fails to), without Redis. The real
//! store is proven by tests/scripts.rs, the model test and the end-to-end suites.

use super::*;
use crate::client_policy::Policy;
use crate::config::Settings;
use crate::edge::sale_route;
use crate::edge::target::Target;
use crate::metrics::Metrics;
use crate::sale::{SaleState, SaleWriter};
use crate::stock::breaker::Breaker;
use crate::stock::breaker::{BreakerMode, BreakerState};
use crate::stock::segments::Refusal;
use crate::stock::segments::{Purchase, ReserveAnswer};
use crate::stock::StoreError;
use crate::waiting::view::Status;
use crate::waiting::{self, Answer, Presented};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What one reserve asked: user, quantity, key, replay only.
type Asked4 = (String, u32, Option<String>, bool);

/// A stock port that answers from a script and records what it was asked; what the reserves
/// learn it writes to the sale state, as the lifecycle does (sold out once nothing is left,
/// marks that outlive any test; refusals).
struct FakeStock {
    sale: SaleWriter,
    answers: Mutex<VecDeque<Result<ReserveAnswer, StoreError>>>,
    /// (user, qty, key, replay only) of every reserve.
    asked: Mutex<Vec<Asked4>>,
    /// What every reserve learned is left: (activity, units).
    learned: Mutex<Vec<(String, i64)>>,
    /// Refusals the reserves reported.
    refused: Mutex<Vec<(String, Refusal)>>,
}

impl FakeStock {
    fn answering(answers: Vec<Result<ReserveAnswer, StoreError>>) -> Arc<FakeStock> {
        let (_, sale) = SaleState::new();
        sale.halts_were_read();
        Arc::new(FakeStock {
            sale,
            answers: Mutex::new(answers.into()),
            asked: Default::default(),
            learned: Default::default(),
            refused: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl StockPort for FakeStock {
    async fn reserve(
        &self,
        _activity: &Arc<Activity>,
        purchase: Purchase<'_>,
    ) -> Result<ReserveAnswer, StoreError> {
        self.asked.lock().push((
            purchase.user.to_owned(),
            purchase.qty,
            purchase.idempotency_key.map(str::to_owned),
            purchase.replay_only,
        ));
        self.answers
            .lock()
            .pop_front()
            .expect("the test scripted an answer for every reserve")
    }

    fn learned_left(&self, activity: &Activity, left: i64, ttl: Duration) {
        self.learned.lock().push((activity.id.to_string(), left));
        if left <= 0 {
            self.sale
                .mark_sold_out(&activity.lane, activity.version, ttl);
        }
    }

    fn refused(&self, activity: &Arc<str>, refusal: Refusal) {
        self.refused
            .lock()
            .push((activity.to_string(), refusal.clone()));
        self.sale.set_refusal(activity, Some(refusal));
    }
}

/// The store's clock as this process's, read; nothing fenced.
struct LocalStore;

impl StoreFacts for LocalStore {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn knows_the_clock(&self) -> bool {
        true
    }

    fn is_fenced(&self, _activity: &Activity) -> bool {
        false
    }
}

fn settings(extra_activity: &str, extra_top: &str) -> Settings {
    let mut lines = vec![
        r#"redis: { url: "redis://127.0.0.1:4", breaker: { consecutive_failures: 2, open_ms: 60000 } }"#,
    ];
    lines.extend(extra_top.lines().filter(|l| !l.trim().is_empty()));
    crate::config::testing::settings_with(
        &lines,
        &format!(
            r#"  - {{ id: a1, stock: 10, version: 1, per_user_limit: 5, max_per_request: 3, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900{extra_activity} }}
  - {{ id: later, stock: 10, version: 1, per_user_limit: 5, max_per_request: 1, starts_at: "2098-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900 }}
"#
        ),
    )
}

/// A waiting room that answers every purchase the same way, and counts them.
#[derive(Default)]
struct FakeRoom {
    answer: Mutex<Option<waiting::Turn>>,
    asked: Mutex<Vec<(String, Option<String>)>>,
}

#[async_trait::async_trait]
impl Room for FakeRoom {
    async fn gate(
        &self,
        _settings: &Settings,
        _activity: &Activity,
        user: &str,
        presented: Option<&Presented>,
        _solution: Option<&str>,
    ) -> waiting::Turn {
        let ticket = presented.map(|p| p.ticket.clone());
        self.asked.lock().push((user.to_owned(), ticket));
        match &*self.answer.lock() {
            None | Some(waiting::Turn::Pass) => waiting::Turn::Pass,
            Some(waiting::Turn::Wait(answer)) => waiting::Turn::Wait(answer.clone()),
            Some(waiting::Turn::Refuse(decision)) => waiting::Turn::Refuse(*decision),
        }
    }
}

/// A request as the proxy hands it to the pipeline, counting how often its body was asked for.
struct TestIncoming<'h> {
    header: RequestHeader,
    /// `None`: the body never arrives.
    body: Option<bytes::Bytes>,
    asked: &'h AtomicUsize,
}

#[async_trait::async_trait]
impl Incoming for TestIncoming<'_> {
    fn header(&self) -> &RequestHeader {
        &self.header
    }

    fn peer(&self) -> Option<std::net::IpAddr> {
        None
    }

    async fn body(&mut self) -> Result<bytes::Bytes, BadRequest> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.body.clone().ok_or(BadRequest::BodyTooSlow)
    }
}

struct Harness {
    /// How often a request's body was asked for.
    body_asked: AtomicUsize,
    settings: Settings,
    policy: Policy,
    stock: Arc<FakeStock>,
    checkout: Checkout,
    metrics: Arc<Metrics>,
    room: FakeRoom,
}

impl Harness {
    fn new(settings: Settings, answers: Vec<Result<ReserveAnswer, StoreError>>) -> Harness {
        let metrics = Arc::new(Metrics::new());
        let stock = FakeStock::answering(answers);
        let breaker = Arc::new(Breaker::new(metrics.clone()));
        let checkout = Checkout::new(
            stock.clone(),
            Arc::new(LocalStore),
            stock.sale.view(),
            metrics.clone(),
            breaker,
        );
        Harness {
            body_asked: AtomicUsize::new(0),
            policy: Policy::new(&settings, None),
            settings,
            stock,
            checkout,
            metrics,
            room: FakeRoom::default(),
        }
    }

    fn rules(&self) -> Rules<'_> {
        Rules {
            settings: &self.settings,
            policy: &self.policy,
        }
    }

    /// One sale request through every gate, as the proxy makes it: `Err` is a refusal.
    fn buy(
        &self,
        user: Option<&str>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Verdict, Decision> {
        self.buy_with_body(user, path, headers, b"")
    }

    fn buy_with_body(
        &self,
        user: Option<&str>,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Verdict, Decision> {
        self.buy_as(user, path, headers, Some(body))
    }

    /// `body: None`: a body that never arrives (asked for, it runs out of time).
    fn buy_as(
        &self,
        user: Option<&str>,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<Verdict, Decision> {
        let mut req = RequestHeader::build("POST", path.as_bytes(), None).unwrap();
        if let Some(user) = user {
            req.insert_header("x-user-id", user).unwrap();
        }
        for (name, value) in headers {
            req.append_header(name.to_string(), *value).unwrap();
        }
        let target = Target::of(&req.method, req.raw_path());
        let (route, activity) = sale_route(&self.settings, &target).expect("a sale route");
        let uri: http::Uri = path.parse().unwrap();
        let asked = Asked {
            route,
            activity,
            target: &target,
            canonical: (&http::Method::POST, &uri),
        };
        let mut incoming = TestIncoming {
            header: req,
            body: body.map(bytes::Bytes::copy_from_slice),
            asked: &self.body_asked,
        };
        let parts = Parts {
            rules: self.rules(),
            checkout: &self.checkout,
            room: &self.room,
        };
        let mut attempt = Attempt::new(asked, &mut incoming, self.checkout.now());
        match futures_executor(run(parts, &mut attempt)) {
            Verdict::Refuse(decision) => Err(decision),
            verdict => Ok(verdict),
        }
    }
}

/// Runs a future to completion on a fresh current-thread runtime.
fn futures_executor<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn reserved(remaining: Option<u64>, replayed: bool) -> Result<ReserveAnswer, StoreError> {
    Ok(ReserveAnswer::Reserved {
        id: "r-1".into(),
        segment: 0,
        version: 1,
        qty: 2,
        replayed,
        remaining,
        created_ms: 1_000,
        deadline_ms: 901_000,
        fence: 1,
        phase: None,
    })
}

fn down() -> Result<ReserveAnswer, StoreError> {
    Err(StoreError::Timeout(Duration::from_millis(5)))
}

#[test]
fn checks_made_without_the_store_never_reach_it() {
    let h = Harness::new(settings("", ""), vec![]);
    assert_eq!(
        h.buy(None, "/buy/a1", &[]).unwrap_err(),
        Decision::Unauthenticated
    );
    assert_eq!(
        h.buy(Some("u"), "/buy/nope", &[]).unwrap_err(),
        Decision::UnknownActivity
    );
    assert!(matches!(
        h.buy(Some("u"), "/buy/later", &[]).unwrap_err(),
        Decision::NotOpenYet { .. }
    ));
    assert_eq!(
        h.buy(Some("u"), "/buy/a1?qty=4", &[]).unwrap_err(),
        Decision::BadRequest(BadRequest::QuantityTooLarge)
    );
    assert_eq!(
        h.buy(
            Some("u"),
            "/buy/a1",
            &[("idempotency-key", "a"), ("idempotency-key", "b")]
        )
        .unwrap_err(),
        Decision::BadRequest(BadRequest::IdempotencyKeyInvalid)
    );
    assert!(h.stock.asked.lock().is_empty());
}

#[test]
fn a_reservation_carries_what_the_store_answered() {
    let h = Harness::new(
        settings("", ""),
        vec![reserved(Some(8), false), reserved(Some(8), true)],
    );
    let Ok(Verdict::Reserved(r)) = h.buy(Some("alice"), "/buy/a1?qty=2", &[]) else {
        panic!("reserved");
    };
    assert_eq!(
        (r.user.as_str(), r.qty, r.version, r.owned),
        ("alice", 2, 1, true)
    );
    assert_eq!((r.created_ms, r.deadline_ms), (1_000, 901_000));
    // A replay is handed the earlier reservation, which this request may never release.
    let Ok(Verdict::Reserved(r)) =
        h.buy(Some("alice"), "/buy/a1?qty=2", &[("idempotency-key", "k")])
    else {
        panic!("replayed");
    };
    assert!(!r.owned);
    assert_eq!(
        h.stock.asked.lock()[1],
        ("alice".to_owned(), 2, Some("k".to_owned()), false)
    );
}

#[test]
fn sold_out_is_learned_announced_and_answered_from_memory() {
    let h = Harness::new(
        settings("", ""),
        vec![
            Ok(ReserveAnswer::SoldOut { left: 0 }),
            Ok(ReserveAnswer::SoldOut { left: 0 }),
        ],
    );
    assert_eq!(
        h.buy(Some("u1"), "/buy/a1", &[]).unwrap_err(),
        Decision::SoldOut
    );
    assert_eq!(*h.stock.learned.lock(), [("a1".to_owned(), 0)]);
    // The next buyer is answered by the cache: no store call.
    assert_eq!(
        h.buy(Some("u2"), "/buy/a1", &[]).unwrap_err(),
        Decision::SoldOut
    );
    assert_eq!(h.stock.asked.lock().len(), 1);
    // A keyed retry may hold a reservation already: only the store can say.
    assert_eq!(
        h.buy(Some("u3"), "/buy/a1", &[("idempotency-key", "k")])
            .unwrap_err(),
        Decision::SoldOut
    );
    assert_eq!(h.stock.asked.lock().len(), 2);
    assert_eq!(
        h.stock.learned.lock().len(),
        2,
        "both answers told the owner"
    );
}

#[test]
fn store_answers_map_to_decisions() {
    let refusal = Refusal::OldLayout { id: "a1".into() };
    let h = Harness::new(
        settings("", ""),
        vec![
            Ok(ReserveAnswer::LimitExceeded),
            Ok(ReserveAnswer::Busy),
            Ok(ReserveAnswer::HoldRanOut),
            Ok(ReserveAnswer::DuplicateId),
            Ok(ReserveAnswer::NotOnSale(Some(refusal.clone()))),
        ],
    );
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
        Decision::LimitExceeded
    );
    for _ in 0..3 {
        assert_eq!(
            h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
            Decision::Unavailable
        );
    }
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
        Decision::Unavailable
    );
    assert_eq!(*h.stock.refused.lock(), [("a1".to_owned(), refusal)]);
    // Refused: buyers are turned away without a store call.
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
        Decision::Unavailable
    );
    assert_eq!(h.stock.asked.lock().len(), 5);
}

#[test]
fn a_failing_store_opens_the_breaker_under_the_requests_settings() {
    let h = Harness::new(settings("", ""), vec![down(), down()]);
    for _ in 0..2 {
        assert_eq!(
            h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
            Decision::StoreUnavailable
        );
    }
    // consecutive_failures: 2 → open for a minute: no store call.
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
        Decision::StoreUnavailable
    );
    assert_eq!(h.stock.asked.lock().len(), 2);
    assert_eq!(
        h.checkout.breaker.status(&h.settings.breaker),
        (BreakerState::Open, BreakerMode::Auto)
    );
}

#[test]
fn passthrough_forwards_unreserved_under_its_cap() {
    let top = "rate_limits: { passthrough: { per_second: 1, burst: 1 } }\n";
    let h = Harness::new(
        settings(", on_store_failure: passthrough", top),
        vec![down(), down()],
    );
    assert!(matches!(
        h.buy(Some("u"), "/buy/a1", &[]),
        Ok(Verdict::Passthrough)
    ));
    assert_eq!(
        h.buy(Some("u"), "/buy/a1", &[]).unwrap_err(),
        Decision::StoreUnavailable,
        "capped"
    );
    let text = String::from_utf8(h.metrics.encode()).unwrap();
    assert!(text.contains(
        r#"flashgate_store_failure_passthrough_total{activity="a1",outcome="capped"} 1"#
    ));
}

#[test]
fn token_buckets_refuse_before_the_store_and_shadow_only_counts() {
    let top = "rate_limits: { per_user: { per_second: 1, burst: 1 }, per_activity: { per_second: 1, burst: 1, shadow: true } }\n";
    let h = Harness::new(
        settings("", top),
        vec![reserved(Some(9), false), reserved(Some(8), false)],
    );
    assert!(h.buy(Some("u1"), "/buy/a1", &[]).is_ok());
    assert!(matches!(
        h.buy(Some("u1"), "/buy/a1", &[]).unwrap_err(),
        Decision::RateLimited { .. }
    ));
    // Another user: the activity bucket is empty but only in shadow.
    assert!(h.buy(Some("u2"), "/buy/a1", &[]).is_ok());
    let text = String::from_utf8(h.metrics.encode()).unwrap();
    assert!(text
        .contains(r#"flashgate_rate_limit_refusals_total{limit="per_activity",mode="shadow"} 1"#));
    assert!(
        text.contains(r#"flashgate_rate_limit_refusals_total{limit="per_user",mode="enforced"} 1"#)
    );
}

mod gates;
