//! Upstream protection: at most `upstream.max_inflight` sale requests at the backend at once.
//! Winners beyond it wait in a FIFO for at most `upstream.max_queue_wait_ms`; one who waits
//! longer is turned away, and so is one whose estimated wait is already longer when they arrive
//! (no point holding their units). Either learns their place in line and the estimated wait;
//! the caller releases their reservation.
//!
//! The limit is the caller's: each request passes its own configuration generation's
//! `max_inflight`, so a reload applies to the requests that start after it (raising it lets
//! them in at once; lowering it holds them back until enough slots were given back). Every
//! forwarded sale request holds a slot, limited or not, so switching a limit on counts the
//! requests already at the backend.
//!
//! Approximations, on purpose:
//! - The position is the place in line on arrival (waiting then, plus one).
//! - The estimated wait is position / drain rate, the rate measured over the last completed
//!   second of slots given back; before any was measured, the wait limit itself (and nobody
//!   is turned away on arrival).
//! - While requests of two generations with different limits wait, a slot given back goes to
//!   the first in line whose own limit lets them in: first come, first served within a limit.

use crate::metrics::Metrics;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Why a winner did not get a slot in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnedAway {
    /// 1-based place in line when turned away.
    pub position: u64,
    pub estimated_wait: Duration,
}

pub struct UpstreamQueue {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

struct State {
    /// Slots held now.
    inflight: usize,
    /// In arrival order.
    waiters: VecDeque<Waiter>,
    next_ticket: u64,
    drain: DrainRate,
}

struct Waiter {
    ticket: u64,
    /// The waiter's own `max_inflight`.
    limit: usize,
    handoff: oneshot::Sender<Slot>,
}

/// Slots given back per second, measured over whole-second windows.
#[derive(Debug)]
struct DrainRate {
    window_start: Instant,
    in_window: u64,
    per_second: Option<f64>,
}

/// A slot at the backend; given back when dropped (after the response was relayed).
pub struct Slot {
    queue: Arc<UpstreamQueue>,
    /// Cleared when a hand-off failed and the slot was taken back under the lock.
    held: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.held {
            self.queue.give_back();
        }
    }
}

impl UpstreamQueue {
    pub fn new(metrics: Arc<Metrics>) -> Arc<UpstreamQueue> {
        Arc::new(UpstreamQueue {
            state: Mutex::new(State {
                inflight: 0,
                waiters: VecDeque::new(),
                next_ticket: 0,
                drain: DrainRate {
                    window_start: Instant::now(),
                    in_window: 0,
                    per_second: None,
                },
            }),
            metrics,
        })
    }

    /// Waits for a slot, at most `max_wait`, under the caller's `limit` (`None`: no limit, a
    /// slot at once).
    pub async fn enter(
        self: &Arc<Self>,
        limit: Option<usize>,
        max_wait: Duration,
    ) -> Result<Slot, TurnedAway> {
        let started = Instant::now();
        let (ticket, handoff, turned_away) = {
            let mut state = self.state.lock();
            let Some(limit) = limit else {
                return Ok(self.take(&mut state));
            };
            // Nobody waiting could use a free slot (or nobody waits): come straight in.
            let ahead_can_go = state.waiters.iter().any(|w| state.inflight < w.limit);
            if state.inflight < limit && !ahead_can_go {
                let slot = self.take(&mut state);
                drop(state);
                self.metrics.upstream_queue_wait.observe(0.0);
                return Ok(slot);
            }
            let position = state.waiters.len() as u64 + 1;
            let turned_away = TurnedAway {
                position,
                estimated_wait: state.drain.estimated_wait(position).unwrap_or(max_wait),
            };
            if turned_away.estimated_wait > max_wait {
                drop(state);
                self.metrics.upstream_queue_wait.observe(0.0);
                return Err(turned_away);
            }
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            let (tx, rx) = oneshot::channel();
            state.waiters.push_back(Waiter {
                ticket,
                limit,
                handoff: tx,
            });
            self.metrics.upstream_queue_depth.inc();
            (ticket, rx, turned_away)
        };
        let mut handoff = handoff;
        let outcome = match tokio::time::timeout(max_wait, &mut handoff).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => {
                // Out of time: leave the line, unless a slot was handed over meanwhile.
                let mut state = self.state.lock();
                match state.waiters.iter().position(|w| w.ticket == ticket) {
                    Some(at) => {
                        state.waiters.remove(at);
                        self.metrics.upstream_queue_depth.dec();
                        Err(turned_away)
                    }
                    None => {
                        drop(state);
                        handoff.try_recv().map_err(|_| turned_away)
                    }
                }
            }
        };
        self.metrics
            .upstream_queue_wait
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    /// Waiting now.
    pub fn depth(&self) -> u64 {
        self.state.lock().waiters.len() as u64
    }

    /// Takes a slot (the caller checked it may).
    fn take(self: &Arc<Self>, state: &mut State) -> Slot {
        state.inflight += 1;
        self.metrics.upstream_inflight.inc();
        Slot {
            queue: self.clone(),
            held: true,
        }
    }

    /// A slot came back: hand it (and any other free one) to the first in line whose limit
    /// lets them in.
    fn give_back(self: &Arc<Self>) {
        let mut state = self.state.lock();
        state.inflight -= 1;
        self.metrics.upstream_inflight.dec();
        state.drain.given_back();
        while let Some(at) = state.waiters.iter().position(|w| state.inflight < w.limit) {
            let waiter = state.waiters.remove(at).expect("found just now");
            self.metrics.upstream_queue_depth.dec();
            let slot = self.take(&mut state);
            if let Err(mut slot) = waiter.handoff.send(slot) {
                // The waiter is gone (its request was dropped): take the slot back here.
                slot.held = false;
                state.inflight -= 1;
                self.metrics.upstream_inflight.dec();
            }
        }
    }
}

impl DrainRate {
    /// How long the `position`th in line should wait at the measured drain rate.
    fn estimated_wait(&self, position: u64) -> Option<Duration> {
        self.per_second
            .filter(|rate| *rate > 0.0)
            .map(|rate| Duration::from_secs_f64(position as f64 / rate))
    }

    fn given_back(&mut self) {
        self.in_window += 1;
        let elapsed = self.window_start.elapsed();
        if elapsed >= Duration::from_secs(1) {
            self.per_second = Some(self.in_window as f64 / elapsed.as_secs_f64());
            self.in_window = 0;
            self.window_start = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue entered with a fixed limit, as every request of one generation would.
    struct Limited(Arc<UpstreamQueue>, usize);

    impl Limited {
        async fn enter(&self, max_wait: Duration) -> Result<Slot, TurnedAway> {
            self.0.enter(Some(self.1), max_wait).await
        }
        fn depth(&self) -> u64 {
            self.0.depth()
        }
    }

    impl Clone for Limited {
        fn clone(&self) -> Self {
            Limited(self.0.clone(), self.1)
        }
    }

    fn queue(max: usize) -> Limited {
        Limited(UpstreamQueue::new(Arc::new(Metrics::new())), max)
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_order_and_time_out_with_their_position() {
        let q = queue(1);
        let first = q.enter(Duration::from_secs(1)).await.unwrap();
        let q2 = q.clone();
        let second = tokio::spawn(async move { q2.enter(Duration::from_secs(10)).await });
        let q3 = q.clone();
        let third = tokio::spawn(async move { q3.enter(Duration::from_secs(2)).await });
        tokio::task::yield_now().await;
        assert_eq!(q.depth(), 2);
        // The second gets the slot when the first gives it back; the third waits on.
        drop(first);
        let second = second.await.unwrap().expect("second in line is served");
        let turned = third.await.unwrap().err().expect("third times out");
        assert_eq!(turned.position, 2, "second in line on arrival");
        assert_eq!(
            turned.estimated_wait,
            Duration::from_secs(2),
            "no rate measured yet"
        );
        assert_eq!(q.depth(), 0);
        drop(second);
        // The slot is free again.
        assert!(q.enter(Duration::from_millis(1)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn estimated_wait_follows_the_measured_drain_rate() {
        let q = queue(1);
        // Ten slots given back over one second: 10 per second.
        for _ in 0..10 {
            let slot = q.enter(Duration::from_secs(1)).await.unwrap();
            tokio::time::advance(Duration::from_millis(100)).await;
            drop(slot);
        }
        let _held = q.enter(Duration::from_secs(1)).await.unwrap();
        let start = Instant::now();
        let mut waiters = Vec::new();
        for _ in 0..5 {
            let q = q.clone();
            waiters.push(tokio::spawn(async move {
                let outcome = q.enter(Duration::from_millis(300)).await;
                (outcome, start.elapsed())
            }));
            tokio::task::yield_now().await;
        }
        let mut turned: Vec<TurnedAway> = Vec::new();
        let mut after = Vec::new();
        for w in waiters {
            let (outcome, elapsed) = w.await.unwrap();
            turned.push(outcome.err().expect("nobody is served"));
            after.push(elapsed.as_millis() as u64);
        }
        let positions: Vec<u64> = turned.iter().map(|t| t.position).collect();
        // The 4th is turned away on arrival and does not stay in line: the 5th is 4th too.
        assert_eq!(positions, [1, 2, 3, 4, 4]);
        let waits: Vec<u64> = turned
            .iter()
            .map(|t| t.estimated_wait.as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 300, 400, 400]);
        // The 4th and 5th were turned away on arrival (400 ms > 300 ms), not after waiting.
        assert_eq!(after, [300, 300, 300, 0, 0]);
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn each_request_enters_under_its_own_generations_limit() {
        let q = UpstreamQueue::new(Arc::new(Metrics::new()));
        let ms = Duration::from_millis;
        let a = q.enter(Some(1), ms(10)).await.unwrap();
        assert!(q.enter(Some(1), ms(10)).await.is_err());
        // A reload raised the limit: its requests get in at once.
        let b = q.enter(Some(2), ms(10)).await.unwrap();
        // Lowered again: two are at the backend, more than 1.
        drop(a);
        assert!(q.enter(Some(1), ms(10)).await.is_err());
        drop(b);
        assert!(q.enter(Some(1), ms(10)).await.is_ok());
        // No limit: a slot at once, and it counts, so a limit switched on sees it.
        let c = q.enter(None, ms(10)).await.unwrap();
        let _d = q.enter(None, ms(10)).await.unwrap();
        assert!(q.enter(Some(2), ms(10)).await.is_err());
        drop(c);
        assert!(q.enter(Some(2), ms(10)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_given_back_slot_goes_to_the_first_waiter_its_limit_admits() {
        let q = UpstreamQueue::new(Arc::new(Metrics::new()));
        let s = Duration::from_secs;
        let a = q.enter(Some(2), s(1)).await.unwrap();
        let b = q.enter(Some(2), s(1)).await.unwrap();
        let (q1, q2) = (q.clone(), q.clone());
        let old = tokio::spawn(async move { q1.enter(Some(1), s(10)).await });
        tokio::task::yield_now().await;
        let new = tokio::spawn(async move { q2.enter(Some(2), s(10)).await });
        tokio::task::yield_now().await;
        assert_eq!(q.depth(), 2);
        // One slot back: 1 at the backend, so the first in line (limit 1) must still wait,
        // and the second (limit 2) goes.
        drop(a);
        let new = new.await.unwrap().expect("the raised limit admits");
        assert_eq!(q.depth(), 1);
        drop(b);
        drop(new);
        old.await
            .unwrap()
            .expect("served once the backend has room under its limit");
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_handed_to_a_waiter_that_left_comes_back() {
        let q = UpstreamQueue::new(Arc::new(Metrics::new()));
        let a = q.enter(Some(1), Duration::from_secs(1)).await.unwrap();
        let q1 = q.clone();
        let waiter = tokio::spawn(async move { q1.enter(Some(1), Duration::from_secs(10)).await });
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        drop(a);
        assert_eq!(q.depth(), 0);
        assert!(q.enter(Some(1), Duration::from_millis(1)).await.is_ok());
    }
}
