//! One gateway's in-process parts, as the server assembles them (live configuration, the
//! checkout, lifecycle), and one purchase through the gateway's own pipeline: for the model tests, which
//! drive the real code against a real redis-server without the HTTP layer in between.

use flashgate::config::{Activity, Settings};
use flashgate::edge::sale_route;
use flashgate::edge::target::Target;
use flashgate::lifecycle::Lifecycle;
use flashgate::live::{Generation, Live};
use flashgate::metrics::Metrics;
use flashgate::purchase::{self, Attempt, Buffered, Checkout, NoQueues, Parts, Verdict};
use flashgate::reservation::Reservation;
use flashgate::sale::SaleView;
use flashgate::stock::breaker::Breaker;
use flashgate::stock::StockStore;
use flashgate::upstream::Upstreams;
use pingora::http::RequestHeader;
use std::sync::Arc;

/// One gateway instance's in-process parts.
pub struct Instance {
    pub live: Live,
    pub checkout: Checkout,
    pub lifecycle: Arc<Lifecycle>,
}

impl Instance {
    /// `marks`: whose sold-out marks this instance shares (as if news reached it at once); its
    /// refusals are its own, as a separate process's are. Reads every halt once first, as the
    /// server does before it serves.
    pub async fn new(settings: Arc<Settings>, marks: &SaleView, store: &Arc<StockStore>) -> Self {
        let metrics = Arc::new(Metrics::new());
        let live = Live::new(Generation::build(settings.clone(), None));
        let (upstreams, _health) = Upstreams::new(&settings.upstream).unwrap();
        let (sale, sale_writer) = marks.sharing_marks();
        let lifecycle = Arc::new(Lifecycle::new(
            live.clone(),
            store.clone(),
            metrics.clone(),
            sale_writer,
            Arc::new(upstreams),
        ));
        lifecycle.refresh_halts(&settings).await;
        assert!(lifecycle.state().halts_read(), "the halts were read");
        let checkout = Checkout::new(
            Arc::new(lifecycle.clone()),
            store.clone(),
            sale,
            metrics.clone(),
            Arc::new(Breaker::new(metrics)),
        );
        Instance {
            live,
            checkout,
            lifecycle,
        }
    }

    /// Activity `id` as this instance's configuration has it.
    pub fn activity(&self, id: &str) -> Arc<Activity> {
        self.live
            .settings()
            .activities
            .get(id)
            .expect("configured")
            .clone()
    }

    /// Publishes `settings` as the next generation (a reload, or the same configuration with
    /// another option for one call).
    pub fn publish(&self, settings: Arc<Settings>) {
        let next = Generation::build(settings, Some(&self.live.current()));
        self.live.publish(next);
    }
}

/// One purchase of `qty` units of `activity` by `user` on `instance`, through the gateway's
/// pipeline, on the sale route `POST /buy/{activity}`; with `key` an `Idempotency-Key`, with
/// `id` the reservation id an abandon used first. The decision's code, and the reservation
/// for `admitted`.
pub async fn purchase(
    instance: &Instance,
    activity: &str,
    user: &str,
    qty: u64,
    key: Option<&str>,
    id: Option<&str>,
) -> (&'static str, Option<Reservation>) {
    let generation = instance.live.current();
    let mut req = RequestHeader::build(
        "POST",
        format!("/buy/{activity}?qty={qty}").as_bytes(),
        None,
    )
    .unwrap();
    req.insert_header("x-user-id", user).unwrap();
    if let Some(k) = key {
        req.insert_header("idempotency-key", k).unwrap();
    }
    let target = Target::of(&req.method, req.raw_path());
    let Some((route, raw)) = sale_route(&generation.settings, &target) else {
        panic!("a sale route");
    };
    let uri: http::Uri = req.uri.clone();
    let asked = purchase::Asked {
        route,
        activity: raw,
        target: &target,
        canonical: (&http::Method::POST, &uri),
    };
    let mut incoming = Buffered {
        header: req.clone(),
        peer: None,
        body: Default::default(),
    };
    let parts = Parts {
        rules: generation.rules(),
        checkout: &instance.checkout,
        room: &NoQueues,
    };
    let mut attempt = Attempt::new(asked, &mut incoming, instance.checkout.now());
    // A reserve whose id was abandoned first: the same path, with that id.
    attempt.reservation_id = id.map(str::to_owned);
    match purchase::run(parts, &mut attempt).await {
        Verdict::Reserved(r) => ("admitted", Some(r)),
        Verdict::Passthrough => ("passthrough", None),
        Verdict::Queue(_) => ("queued", None),
        Verdict::Refuse(decision) => (decision.code(), None),
    }
}
