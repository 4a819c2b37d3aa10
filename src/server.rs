//! Assembles a gateway process: the stock store, the Pingora proxy and admin services, upstream
//! health checks and maintenance, then runs until SIGTERM (graceful) or SIGINT (fast).

use crate::admin::AdminApp;
use crate::config::Settings;
use crate::gateway::Gateway;
use crate::maintenance::Maintenance;
use crate::metrics::Metrics;
use crate::proxy::upstream::Upstreams;
use crate::proxy::FlashProxy;
use crate::reload::{ConfigSource, ReloadWatcher, Reloader};
use crate::stock::{StockStore, StoreError};
use pingora::proxy::http_proxy_service_with_name;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::sync::Arc;

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
}

/// Runs a gateway with these settings until it is told to stop. With a `source`, the gateway
/// reloads from that file on SIGHUP, on change, and on `POST /v1/config/reload`.
pub fn run(
    settings: Settings,
    source: Option<ConfigSource>,
    run_args: RunArgs,
) -> Result<(), StartError> {
    // Fail fast with a clear message instead of a Pingora panic deep in start-up.
    for addr in [settings.server.listen, settings.admin.listen] {
        std::net::TcpListener::bind(addr).map_err(|source| StartError::Listen { addr, source })?;
    }
    let settings = Arc::new(settings);
    let metrics = Arc::new(Metrics::new());

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

    let conf = ServerConf {
        threads: settings.server.threads.get(),
        grace_period_seconds: Some(settings.server.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(settings.server.shutdown_timeout.as_secs()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let (upstreams, health_checks) =
        Upstreams::new(&settings.upstream).map_err(StartError::Upstream)?;
    let gateway = Arc::new(Gateway::new(settings.clone(), metrics, store, upstreams));

    let mut proxy = http_proxy_service_with_name(
        &server.configuration,
        FlashProxy::new(gateway.clone()),
        "flashgate proxy",
    );
    proxy.add_tcp(&settings.server.listen.to_string());
    let reloader = source.map(|source| Arc::new(Reloader::new(gateway.clone(), source)));
    let mut admin = Service::new(
        "flashgate admin".to_owned(),
        AdminApp::new(gateway.clone(), reloader.clone()),
    );
    admin.add_tcp(&settings.admin.listen.to_string());
    admin.threads = Some(1);
    let maintenance = background_service("flashgate maintenance", Maintenance::new(gateway));

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
    server.run(run_args);
    Ok(())
}
