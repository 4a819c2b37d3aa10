//! The shop backend(s): round robin over TCP-health-checked addresses (Pingora load balancing).
//! A request picks among the healthy addresses of its own configuration generation, with that
//! generation's timeouts. The balancer health-checks the addresses of the current generation and
//! of the one before (for requests still in flight under it); a reload replaces that set.

use crate::config::UpstreamSettings;
use arc_swap::ArcSwap;
use futures_util::FutureExt;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};
use pingora::prelude::*;
use pingora::services::background::{background_service, GenBackgroundService};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

/// The configured backend addresses, as service discovery for the balancer.
#[derive(Clone, Default)]
struct ConfiguredAddresses(Arc<ArcSwap<BTreeSet<Backend>>>);

impl ConfiguredAddresses {
    fn set(&self, addresses: &[SocketAddr]) {
        let backends = addresses
            .iter()
            .map(|a| Backend::new(&a.to_string()).expect("a socket address is a valid backend"))
            .collect();
        self.0.store(Arc::new(backends));
    }
}

#[async_trait::async_trait]
impl ServiceDiscovery for ConfiguredAddresses {
    async fn discover(&self) -> Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        Ok((BTreeSet::clone(&self.0.load()), HashMap::new()))
    }
}

pub struct Upstreams {
    balancer: Arc<LoadBalancer<RoundRobin>>,
    addresses: ConfiguredAddresses,
}

impl Upstreams {
    /// The balancer and the background service that health-checks it (add it to the server).
    pub fn new(
        settings: &UpstreamSettings,
    ) -> std::io::Result<(Upstreams, GenBackgroundService<LoadBalancer<RoundRobin>>)> {
        let addresses = ConfiguredAddresses::default();
        addresses.set(&settings.addresses);
        let mut balancer =
            LoadBalancer::<RoundRobin>::from_backends(Backends::new(Box::new(addresses.clone())));
        // Discovery reads memory: the first update completes at once.
        balancer
            .update()
            .now_or_never()
            .expect("static discovery does not wait")
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        balancer.set_health_check(TcpHealthCheck::new());
        balancer.health_check_frequency = Some(settings.health_check_interval);
        let service = background_service("upstream health checks", balancer);
        let upstreams = Upstreams {
            balancer: service.task(),
            addresses,
        };
        Ok((upstreams, service))
    }

    /// Replaces the health-checked list (a reload): the new addresses and the previous
    /// generation's. New backends count as healthy until checked.
    pub async fn set_addresses(&self, addresses: &[SocketAddr], previous: &[SocketAddr]) {
        let mut both = addresses.to_vec();
        both.extend(previous.iter().filter(|a| !addresses.contains(a)));
        self.addresses.set(&both);
        if let Err(e) = self.balancer.update().await {
            tracing::error!(error = %e, "cannot update the upstream list");
        }
    }

    /// The next healthy backend among `settings.addresses`.
    fn pick(&self, settings: &UpstreamSettings) -> Option<Backend> {
        self.balancer.select_with(b"", 256, |backend, healthy| {
            healthy
                && backend
                    .addr
                    .as_inet()
                    .is_some_and(|a| settings.addresses.contains(a))
        })
    }

    /// The next healthy backend's address among `settings.addresses`.
    pub fn select(&self, settings: &UpstreamSettings) -> Option<SocketAddr> {
        self.pick(settings)?.addr.as_inet().copied()
    }

    /// A healthy backend's address (round robin), for the gateway's own connections
    /// (`super::wire`).
    pub fn address(&self, settings: &UpstreamSettings) -> Result<SocketAddr> {
        self.pick(settings)
            .and_then(|backend| backend.addr.as_inet().copied())
            .ok_or_else(|| {
                Error::explain(ErrorType::ConnectNoRoute, "no healthy upstream").into_up()
            })
    }

    /// The next healthy backend of `settings`, as a peer with its timeouts.
    pub fn peer(&self, settings: &UpstreamSettings) -> Result<Box<HttpPeer>> {
        let backend = self.pick(settings).ok_or_else(|| {
            Error::explain(ErrorType::ConnectNoRoute, "no healthy upstream").into_up()
        })?;
        let mut peer = HttpPeer::new(backend.addr, false, String::new());
        peer.options.connection_timeout = Some(settings.connect_timeout);
        peer.options.read_timeout = Some(settings.read_timeout);
        Ok(Box::new(peer))
    }
}
