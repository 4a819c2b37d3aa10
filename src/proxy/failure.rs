//! What a failed proxy attempt does with the reservation it holds: a pure decision, so every
//! case is unit-tested without a socket.

use crate::admission::{BadRequest, Decision};
use crate::stock::ReleaseReason;

/// What the proxy knows when a request fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The request holds a reservation it took (or was handed by a replay).
    pub holds_reservation: bool,
    /// The status of the backend's response header, if one arrived.
    pub upstream_status: Option<u16>,
    /// The error came from the backend's side (connect, read, reset).
    pub from_upstream: bool,
    /// The error came from the buyer's side (hung up, a broken body).
    pub from_downstream: bool,
    /// The reservation was put on a request to the backend.
    pub forwarded: bool,
}

/// What to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Nothing is held, or the backend accepted it: answer the proxy error as it is.
    Report,
    /// The backend has the reservation and may take the order whatever the buyer does now: it
    /// stays pending, settled by the order lookup (or its hold deadline).
    Keep,
    /// Nothing reached the backend or it failed: give the units back (as far as the lifecycle
    /// lets this request) and answer `decision`.
    Release(ReleaseReason, Decision),
}

impl Failure {
    pub fn decide(self) -> OnFailure {
        let accepted = self.upstream_status.is_some_and(|s| s < 500);
        if !self.holds_reservation || accepted {
            return OnFailure::Report;
        }
        let upstream_failed = self.from_upstream || self.upstream_status.is_some();
        if self.forwarded && !upstream_failed {
            return OnFailure::Keep;
        }
        if self.from_downstream {
            // The buyer's side broke before anything reached the backend.
            OnFailure::Release(
                ReleaseReason::BadRequest,
                Decision::BadRequest(BadRequest::MalformedBody),
            )
        } else if self.upstream_status.is_some() {
            OnFailure::Release(ReleaseReason::Upstream5xx, Decision::Unavailable)
        } else {
            OnFailure::Release(ReleaseReason::UpstreamError, Decision::Unavailable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELD: Failure = Failure {
        holds_reservation: true,
        upstream_status: None,
        from_upstream: false,
        from_downstream: false,
        forwarded: false,
    };

    #[test]
    fn nothing_held_or_accepted_is_only_reported() {
        let free = Failure {
            holds_reservation: false,
            ..HELD
        };
        assert_eq!(free.decide(), OnFailure::Report);
        for status in [200, 201, 404, 409] {
            let accepted = Failure {
                upstream_status: Some(status),
                forwarded: true,
                ..HELD
            };
            assert_eq!(accepted.decide(), OnFailure::Report, "{status}");
        }
    }

    #[test]
    fn a_forwarded_reservation_survives_the_buyers_side_failing() {
        let hung_up = Failure {
            forwarded: true,
            from_downstream: true,
            ..HELD
        };
        assert_eq!(hung_up.decide(), OnFailure::Keep);
        let internal = Failure {
            forwarded: true,
            ..HELD
        };
        assert_eq!(internal.decide(), OnFailure::Keep);
    }

    #[test]
    fn failures_before_or_at_the_backend_release() {
        let broken_body = Failure {
            from_downstream: true,
            ..HELD
        };
        assert_eq!(
            broken_body.decide(),
            OnFailure::Release(
                ReleaseReason::BadRequest,
                Decision::BadRequest(BadRequest::MalformedBody)
            )
        );
        let five_xx = Failure {
            upstream_status: Some(503),
            forwarded: true,
            ..HELD
        };
        assert_eq!(
            five_xx.decide(),
            OnFailure::Release(ReleaseReason::Upstream5xx, Decision::Unavailable)
        );
        let refused = Failure {
            from_upstream: true,
            forwarded: true,
            ..HELD
        };
        assert_eq!(
            refused.decide(),
            OnFailure::Release(ReleaseReason::UpstreamError, Decision::Unavailable)
        );
        let never_sent = HELD;
        assert_eq!(
            never_sent.decide(),
            OnFailure::Release(ReleaseReason::UpstreamError, Decision::Unavailable)
        );
    }
}
