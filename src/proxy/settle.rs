//! What the backend's answer to a purchase holding stock (or the lack of one) does to its
//! reservation: a pure decision, so every case is unit-tested without a socket.

use crate::decision::Decision;
use crate::stock::ReleaseReason;

/// Where a purchase holding stock stands: a state machine that only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stage {
    /// No reservation (yet): nothing to settle.
    #[default]
    Unreserved,
    /// The gateway holds the reservation: released if the request ends before the forward
    /// (a queue timeout), never by anything the backend does.
    Held,
    /// Sent to the backend: from here on the backend may hold the order, so no buyer-side event
    /// (a hang-up, a reset) may give the units back.
    Sent,
    /// The backend's answer (or its absence) was acted on: confirmed, kept or released; nothing
    /// that happens afterwards touches the reservation.
    Settled,
}

impl Stage {
    /// Moves to `next`; a stage never goes back (checked in debug builds).
    pub fn advance(&mut self, next: Stage) {
        debug_assert!(
            (*self as u8) < (next as u8),
            "a purchase's stage moved from {self:?} to {next:?}"
        );
        *self = next;
    }
}

/// How the exchange with the backend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// No backend got the request (none healthy, or every connect failed).
    NotSent,
    /// Sent, and no answer came in time (or the connection broke): the backend may hold the
    /// order.
    NoAnswer,
    /// The backend answered with this status.
    Answered(u16),
}

impl Exchange {
    /// How a forward that got no answer ended (logged here, once for either exchange).
    pub fn failed(e: &crate::upstream::wire::ForwardError) -> Exchange {
        use crate::upstream::wire::ForwardError;
        let exchange = match e {
            ForwardError::NotSent(_) => Exchange::NotSent,
            ForwardError::NoAnswer(_) => Exchange::NoAnswer,
        };
        tracing::info!(error = %e.error(), ?exchange, "the backend did not answer a purchase");
        exchange
    }
}

/// What to do with the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// A 2xx on a `confirm: upstream` activity: confirm it, and relay the answer.
    Confirm,
    /// Any other answer below 500: it stays pending (an explicit confirm or release, or its
    /// hold deadline, ends it); relay the answer.
    Keep,
    /// No answer, with an order lookup configured: it stays pending and the backend is asked
    /// about it once its answer is surely in; the buyer is told `decision`.
    Ask(Decision),
    /// Give the units back and tell the buyer `decision`.
    Release(ReleaseReason, Decision),
}

/// The settlement of one exchange. `confirm_upstream`: the activity is confirmed by a 2xx;
/// `lookup`: an order lookup is configured.
///
/// Approximation: without an order lookup, a request that reached the backend and got no
/// answer in time is released, although the backend may still take the order; with one, the
/// backend is asked instead.
pub fn settle(exchange: Exchange, confirm_upstream: bool, lookup: bool) -> Settlement {
    match exchange {
        Exchange::NotSent => {
            Settlement::Release(ReleaseReason::UpstreamError, Decision::Unavailable)
        }
        Exchange::NoAnswer if lookup => Settlement::Ask(Decision::Unavailable),
        Exchange::NoAnswer => {
            Settlement::Release(ReleaseReason::UpstreamError, Decision::Unavailable)
        }
        Exchange::Answered(status) if status >= 500 => {
            Settlement::Release(ReleaseReason::Upstream5xx, Decision::Unavailable)
        }
        Exchange::Answered(status) if (200..300).contains(&status) && confirm_upstream => {
            Settlement::Confirm
        }
        Exchange::Answered(_) => Settlement::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_settle_the_reservation() {
        let release_5xx = Settlement::Release(ReleaseReason::Upstream5xx, Decision::Unavailable);
        for lookup in [false, true] {
            assert_eq!(
                settle(Exchange::Answered(201), true, lookup),
                Settlement::Confirm
            );
            assert_eq!(
                settle(Exchange::Answered(201), false, lookup),
                Settlement::Keep
            );
            for status in [301, 404, 409, 422] {
                assert_eq!(
                    settle(Exchange::Answered(status), true, lookup),
                    Settlement::Keep
                );
            }
            for status in [500, 502, 503] {
                assert_eq!(
                    settle(Exchange::Answered(status), true, lookup),
                    release_5xx
                );
            }
        }
    }

    #[test]
    fn without_an_answer_the_lookup_decides_where_there_is_one() {
        let release = Settlement::Release(ReleaseReason::UpstreamError, Decision::Unavailable);
        assert_eq!(
            settle(Exchange::NotSent, true, true),
            release,
            "nothing reached a backend"
        );
        assert_eq!(settle(Exchange::NotSent, true, false), release);
        assert_eq!(
            settle(Exchange::NoAnswer, true, true),
            Settlement::Ask(Decision::Unavailable)
        );
        assert_eq!(settle(Exchange::NoAnswer, true, false), release);
    }
}
