//! Assembles a gateway process: the stock store, the Pingora proxy and admin services, upstream
//! health checks and maintenance, then runs until SIGTERM (graceful), SIGQUIT (hand the
//! listeners to a new binary, then drain) or SIGINT (fast).

use crate::config::Settings;
use crate::front::Front;
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::reload::{ConfigSource, ReloadWatcher};
use crate::stock::{StockStore, StoreError};
use crate::upstream::Upstreams;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::proxy::http_proxy;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::ShutdownWatch;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start a runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot set up the stock store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot set up the upstreams: {0}")]
    Upstream(std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "cannot take over listeners: the directory of server.upgrade_sock ({0}) does not exist"
    )]
    UpgradeSockDir(String),
}

/// Where the listening sockets come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listeners {
    /// Bind them: the usual start.
    Bind,
    /// Take them over from a running gateway (Pingora's graceful upgrade): wait on
    /// `server.upgrade_sock` until the old process, sent SIGQUIT, hands them over. Both
    /// processes accept for a few seconds, then the old one drains and exits; the listening
    /// sockets never close, so no connection is refused.
    TakeOver,
}

/// Runs a gateway with these settings until it is told to stop. With a `source`, the gateway
/// reloads from that file on SIGHUP, on change, and on `POST /v1/config/reload`.
pub fn run(
    settings: Settings,
    source: Option<ConfigSource>,
    listeners: Listeners,
    run_args: RunArgs,
) -> Result<(), StartError> {
    let upgrade_sock = settings.server.upgrade_sock.clone();
    check_listeners(&settings, listeners)?;
    let settings = Arc::new(settings);
    let metrics = Arc::new(Metrics::new());
    let store = start_store(&settings, &metrics)?;

    let conf = ServerConf {
        threads: settings.server.threads.get(),
        grace_period_seconds: Some(settings.server.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(settings.server.shutdown_timeout.as_secs()),
        // Validated as UTF-8 and short enough for a Unix socket address.
        upgrade_sock: upgrade_sock.to_string_lossy().into_owned(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: listeners == Listeners::TakeOver,
        ..Opt::default()
    };
    if opt.upgrade {
        tracing::info!(
            upgrade_sock = %upgrade_sock.display(),
            "waiting for the running gateway's listeners: send it SIGQUIT (within about 6 s)"
        );
    }
    let mut server = Server::new_with_opt_and_conf(Some(opt), conf);
    // With `upgrade`, this blocks until the sockets arrive, or exits the process (status 1,
    // after logging why) when none arrive within Pingora's fixed 5 retries a second apart.
    server.bootstrap();
    crate::logging::startup_done();

    let (upstreams, health_checks) =
        Upstreams::new(&settings.upstream).map_err(StartError::Upstream)?;
    let gateway = Gateway::new(settings.clone(), metrics, store, upstreams);
    read_halts(&gateway)?;

    // The front reads every connection first and answers the refusals the gateway decides
    // alone; Pingora's proxy (sharing the same `FlashProxy`) takes everything else.
    let flash = gateway.proxy();
    let front = Front::new(flash.clone(), http_proxy(&server.configuration, flash));
    let mut proxy = Service::new(
        "flashgate proxy".to_owned(),
        SettleBeforeClosing {
            inner: Arc::new(front),
            settle: SETTLE_BEFORE_CLOSING,
        },
    );
    proxy.add_tcp(&settings.server.listen.to_string());
    let reloader = source.map(|source| Arc::new(gateway.reloader(source)));
    let mut admin = Service::new(
        "flashgate admin".to_owned(),
        gateway.admin(reloader.clone()),
    );
    admin.add_tcp(&settings.admin.listen.to_string());
    admin.threads = Some(1);
    let maintenance = background_service("flashgate maintenance", gateway.maintenance());

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(health_checks);
    server.add_service(maintenance);
    if let Some(reloader) = reloader {
        server.add_service(background_service(
            "flashgate config reload",
            ReloadWatcher::new(reloader, settings.server.reload_watch_interval),
        ));
    }
    tracing::info!(listen = %settings.server.listen, admin = %settings.admin.listen, "flashgate serving");
    if let Some(open) = settings.identity.spoofable(&settings.server.listen) {
        // Only with `identity.header_from_any_peer: true` (validation refuses it otherwise).
        tracing::warn!("{open} (identity.header_from_any_peer: true)");
    }
    server.run(run_args);
    Ok(())
}

/// Whether the listeners can be had, so a start fails fast with a clear message instead of a
/// Pingora panic deep in start-up: free ports to bind, or the directory of the upgrade socket
/// to take them over through (Pingora would panic binding a socket in a missing directory).
fn check_listeners(settings: &Settings, listeners: Listeners) -> Result<(), StartError> {
    let upgrade_sock = &settings.server.upgrade_sock;
    match listeners {
        // Fail fast with a clear message instead of a Pingora panic deep in start-up.
        Listeners::Bind => {
            for addr in [settings.server.listen, settings.admin.listen] {
                std::net::TcpListener::bind(addr)
                    .map_err(|source| StartError::Listen { addr, source })?;
            }
        }
        // The ports are the old process's; Pingora would panic binding a socket in a
        // missing directory.
        Listeners::TakeOver => {
            if !upgrade_sock.parent().is_some_and(|dir| dir.is_dir()) {
                return Err(StartError::UpgradeSockDir(
                    upgrade_sock.display().to_string(),
                ));
            }
        }
    }
    Ok(())
}

/// The stock store, asked at once whether Redis answers (and the scripts loaded): a Redis that
/// is down now only makes the gateway unready; every thread keeps trying. Also installs the
/// SIGHUP handler before anything can send it.
fn start_store(settings: &Settings, metrics: &Arc<Metrics>) -> Result<Arc<StockStore>, StartError> {
    // Each worker thread makes its own Redis connection on first use (see StockStore::conn).
    let store = Arc::new(StockStore::new(&settings.redis, metrics.clone())?);
    // Say at once whether Redis answers (and load the scripts). A Redis that is down now only
    // makes the gateway unready; every thread keeps trying.
    let startup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    if let Err(e) = startup.block_on(store.ready()) {
        tracing::warn!(error = %e, "stock store not reachable at start-up");
    }
    // From here on SIGHUP must not terminate the process (its default action): a handler stays
    // installed for the life of the process once registered, the watcher below reads it.
    let hangup = startup
        .block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) });
    drop(hangup.map_err(StartError::Runtime)?);
    drop(startup);
    Ok(store)
}

/// Reads every activity's halt once before the proxy serves: a process takes requests as soon
/// as its listeners run (after an upgrade's hand-over, readiness or not), and sells nothing
/// before it knows the halts (see `crate::lifecycle::halt`); reading them first spares those
/// requests an `unavailable`. A Redis that does not answer leaves that to the halt poll.
fn read_halts(gateway: &Gateway) -> Result<(), StartError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    // On a thread of its own: the store keeps a connection per thread, and this thread's was
    // made on `start_store`'s runtime, gone since.
    let read = std::thread::scope(|s| {
        s.spawn(|| runtime.block_on(gateway.read_halts()))
            .join()
            .unwrap_or(false)
    });
    if !read {
        tracing::warn!("halts not read at start-up: nothing is sold before they are");
    }
    Ok(())
}

/// How long the proxy keeps reading connections after its listeners stop (see
/// [`SettleBeforeClosing`]).
const SETTLE_BEFORE_CLOSING: Duration = Duration::from_millis(500);

/// Pingora, the moment its listeners stop (SIGTERM, or SIGQUIT after the hand-over), closes
/// every connection still waiting for a request. A connection accepted an instant earlier
/// already has its buyer's request on the way; closing it resets the buyer with nothing to
/// show (seen about once per upgrade at 800 requests/s). Waiting `settle` first lets those
/// requests be read and served under the drain rules; idle keep-alive connections are closed
/// that much later, well inside the grace period.
struct SettleBeforeClosing<A> {
    inner: Arc<A>,
    settle: Duration,
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for SettleBeforeClosing<A> {
    async fn process_new(
        self: &Arc<Self>,
        session: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.inner.process_new(session, shutdown).await
    }

    async fn cleanup(&self) {
        tokio::time::sleep(self.settle).await;
        self.inner.cleanup().await;
    }
}
