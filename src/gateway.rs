//! The composition root: builds one gateway process's parts once, and hands each service (the
//! proxy, the admin listener, the maintenance loops, the reloader) a narrow handle holding only
//! the parts it uses. Nothing below imports this module; services never reach each other's
//! parts through it.

use crate::admin::{AdminApp, AdminParts};
use crate::config::Settings;
use crate::fleet::Roster;
use crate::lifecycle::Lifecycle;
use crate::live::{Generation, Live};
use crate::maintenance::{Maintenance, MaintenanceParts};
use crate::metrics::Metrics;
use crate::proxy::{FlashProxy, ProxyParts};
use crate::purchase::Checkout;
use crate::reload::{ConfigSource, ReloadParts, Reloader};
use crate::sale::SaleState;
use crate::series::{preset_activity_series, preset_static_series};
use crate::shutdown::Drain;
use crate::stock::breaker::Breaker;
use crate::stock::StockStore;
use crate::upstream::queue::UpstreamQueue;
use crate::upstream::Upstreams;
use crate::waiting::WaitingRoom;
use std::sync::Arc;

/// One process's parts, each built once.
pub struct Gateway {
    /// The current configuration generation (replaced by reloads).
    live: Live,
    metrics: Arc<Metrics>,
    store: Arc<StockStore>,
    breaker: Arc<Breaker>,
    checkout: Arc<Checkout>,
    lifecycle: Arc<Lifecycle>,
    upstreams: Arc<Upstreams>,
    /// At most `upstream.max_inflight` sale requests at the backend; the rest wait in line.
    upstream_queue: Arc<UpstreamQueue>,
    /// The activities' waiting rooms.
    waiting: Arc<WaitingRoom>,
    /// Shutdown, and the reservations held that it waits on.
    drain: Arc<Drain>,
    /// The fleet's gateways as Redis last listed them.
    roster: Arc<Roster>,
}

impl Gateway {
    pub fn new(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        store: Arc<StockStore>,
        upstreams: Upstreams,
    ) -> Gateway {
        preset_static_series(&metrics);
        for activity in settings.activities.iter() {
            preset_activity_series(&metrics, activity);
        }
        let upstreams = Arc::new(upstreams);
        let breaker = Arc::new(Breaker::new(metrics.clone()));
        let live = Live::new(Generation::build(settings, None));
        let (sale, sale_writer) = SaleState::new();
        let lifecycle = Arc::new(Lifecycle::new(
            live.clone(),
            store.clone(),
            metrics.clone(),
            sale_writer,
            upstreams.clone(),
        ));
        let held = crate::held::Held::new(metrics.reservations_in_flight.clone());
        Gateway {
            checkout: Arc::new(
                Checkout::new(
                    Arc::new(lifecycle.clone()),
                    store.clone(),
                    sale,
                    metrics.clone(),
                    breaker.clone(),
                )
                .with_fleet_buckets(store.clone())
                .with_access(Arc::new(crate::access::Lists::new(store.clone()))),
            ),
            breaker,
            upstream_queue: UpstreamQueue::new(metrics.clone()),
            waiting: Arc::new(WaitingRoom::new(store.clone(), metrics.clone())),
            drain: Arc::new(Drain::new(held)),
            roster: Arc::default(),
            lifecycle,
            live,
            metrics,
            store,
            upstreams,
        }
    }

    /// Reads every activity's halt once (see `crate::server`: before the proxy serves); whether
    /// every one was read.
    pub async fn read_halts(&self) -> bool {
        self.lifecycle.refresh_halts(&self.live.settings()).await;
        self.lifecycle.state().halts_read()
    }

    /// The proxy: every request's way through the gateway.
    pub fn proxy(&self) -> FlashProxy {
        FlashProxy::new(ProxyParts {
            live: self.live.clone(),
            metrics: self.metrics.clone(),
            checkout: self.checkout.clone(),
            lifecycle: self.lifecycle.clone(),
            waiting: self.waiting.clone(),
            drain: self.drain.clone(),
            upstream_queue: self.upstream_queue.clone(),
            upstreams: self.upstreams.clone(),
            #[cfg(feature = "fault-injection")]
            fault: crate::proxy::Fault::from_env(),
        })
    }

    /// The admin listener (`reloader`: `None` when not started from a file).
    pub fn admin(&self, reloader: Option<Arc<Reloader>>) -> AdminApp {
        AdminApp::new(
            AdminParts {
                live: self.live.clone(),
                metrics: self.metrics.clone(),
                store: self.store.clone(),
                lifecycle: self.lifecycle.clone(),
                waiting: self.waiting.clone(),
                breaker: self.breaker.clone(),
                drain: self.drain.clone(),
                roster: self.roster.clone(),
            },
            reloader,
        )
    }

    /// The background loops, and the shutdown drain.
    pub fn maintenance(&self) -> Maintenance {
        Maintenance::new(MaintenanceParts {
            live: self.live.clone(),
            metrics: self.metrics.clone(),
            store: self.store.clone(),
            lifecycle: self.lifecycle.clone(),
            waiting: self.waiting.clone(),
            drain: self.drain.clone(),
            roster: self.roster.clone(),
        })
    }

    /// Reloads from `source`'s file.
    pub fn reloader(&self, source: ConfigSource) -> Reloader {
        let parts = ReloadParts {
            live: self.live.clone(),
            metrics: self.metrics.clone(),
            lifecycle: self.lifecycle.clone(),
            upstreams: self.upstreams.clone(),
            store: self.store.clone(),
            waiting: self.waiting.clone(),
        };
        Reloader::new(parts, source)
    }
}
