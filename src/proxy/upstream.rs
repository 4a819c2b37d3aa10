//! The shop backend(s): round robin over TCP-health-checked addresses (Pingora load balancing).

use crate::config::UpstreamSettings;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::LoadBalancer;
use pingora::prelude::*;
use pingora::services::background::{background_service, GenBackgroundService};
use std::sync::Arc;
use std::time::Duration;

pub struct Upstreams {
    balancer: Arc<LoadBalancer<RoundRobin>>,
    count: usize,
    connect_timeout: Duration,
    read_timeout: Duration,
}

impl Upstreams {
    /// The balancer and the background service that health-checks it (add it to the server).
    pub fn new(
        settings: &UpstreamSettings,
    ) -> std::io::Result<(Upstreams, GenBackgroundService<LoadBalancer<RoundRobin>>)> {
        let mut balancer = LoadBalancer::<RoundRobin>::try_from_iter(
            settings.addresses.iter().map(|a| a.to_string()),
        )?;
        balancer.set_health_check(TcpHealthCheck::new());
        balancer.health_check_frequency = Some(settings.health_check_interval);
        let service = background_service("upstream health checks", balancer);
        let upstreams = Upstreams {
            balancer: service.task(),
            count: settings.addresses.len(),
            connect_timeout: settings.connect_timeout,
            read_timeout: settings.read_timeout,
        };
        Ok((upstreams, service))
    }

    /// The next healthy backend, as a peer with the configured timeouts.
    pub fn peer(&self) -> Result<Box<HttpPeer>> {
        let backend = self.balancer.select(b"", 256).ok_or_else(|| {
            Error::explain(ErrorType::ConnectNoRoute, "no healthy upstream").into_up()
        })?;
        let mut peer = HttpPeer::new(backend.addr, false, String::new());
        peer.options.connection_timeout = Some(self.connect_timeout);
        peer.options.read_timeout = Some(self.read_timeout);
        Ok(Box::new(peer))
    }

    /// Configured backends.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}
