//! The reservations requests hold until they are forwarded or released: one count, written by
//! the guards requests keep, read by the shutdown drain and exported as
//! `flashgate_reservations_in_flight` (the gauge is derived from the count, never set apart).

use std::sync::Arc;

/// The reservations requests hold until they are forwarded or released: one count, written by
/// the [`Holding`] guards only, read by the drain (awaited, not polled) and exported as a gauge.
pub struct Held {
    count: tokio::sync::watch::Sender<i64>,
    gauge: prometheus::IntGauge,
}

impl Held {
    pub fn new(gauge: prometheus::IntGauge) -> Arc<Held> {
        Arc::new(Held {
            count: tokio::sync::watch::Sender::new(0),
            gauge,
        })
    }

    /// A request holds a reservation until the guard is dropped.
    pub fn hold(self: &Arc<Self>) -> Holding {
        self.add(1);
        Holding(self.clone())
    }

    fn add(&self, n: i64) {
        self.count.send_modify(|c| {
            *c += n;
            self.gauge.set(*c);
        });
    }

    pub fn now(&self) -> i64 {
        *self.count.borrow()
    }

    /// The count as it changes (the shutdown drain waits on it).
    pub fn watch(&self) -> tokio::sync::watch::Receiver<i64> {
        self.count.subscribe()
    }
}

/// One reservation held by a request (see [`Held`]).
pub struct Holding(Arc<Held>);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.add(-1);
    }
}
