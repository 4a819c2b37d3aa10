//! The shop backend as the gateway sees it: the health-checked address pool ([`pool`]), the
//! FIFO that keeps at most `upstream.max_inflight` winners at it ([`queue`]), the exchanges that
//! send it a purchase holding stock (the proxy's, [`forward`], on Pingora's connector; the
//! front's, [`wire`], on the gateway's own connections), and the order lookup that asks it
//! whether it holds an order ([`lookup`]).

pub mod lookup;
pub mod pool;
pub mod queue;
pub mod wire;

pub use pool::Upstreams;

crate::label_enum! {
    /// Upstream answers by class, as the `class` label.
    pub enum UpstreamClass {
        Success => "2xx",
        ClientError => "4xx",
        ServerError => "5xx",
        /// No answer: refused, reset, timed out.
        Error => "error",
    }
}

impl UpstreamClass {
    pub fn from_status(status: u16) -> Self {
        match status {
            500.. => UpstreamClass::ServerError,
            400..=499 => UpstreamClass::ClientError,
            _ => UpstreamClass::Success,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_classes() {
        assert_eq!(UpstreamClass::from_status(204), UpstreamClass::Success);
        assert_eq!(UpstreamClass::from_status(404), UpstreamClass::ClientError);
        assert_eq!(UpstreamClass::from_status(502), UpstreamClass::ServerError);
    }
}
