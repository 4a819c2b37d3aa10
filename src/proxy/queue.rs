//! Upstream protection: at most `upstream.max_inflight` sale requests at the backend at once.
//! Winners beyond it wait in a FIFO (tokio's semaphore is fair) for at most
//! `upstream.max_queue_wait_ms`; one who waits longer is turned away, and so is one whose
//! estimated wait is already longer when they arrive (no point holding their units). Either
//! learns their place in line and the estimated wait; the caller releases their reservation.
//!
//! Approximations, on purpose:
//! - The position is the place in line on arrival (waiting then, plus one).
//! - The estimated wait is position / drain rate, the rate measured over the last completed
//!   second of slots given back; before any was measured, the wait limit itself (and nobody
//!   is turned away on arrival).
//! - A reload lowering `max_inflight` takes effect as slots are given back; one switching the
//!   limit on does not count requests already at the backend.

use crate::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Why a winner did not get a slot in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnedAway {
    /// 1-based place in line when turned away.
    pub position: u64,
    pub estimated_wait: Duration,
}

pub struct UpstreamQueue {
    slots: Arc<Semaphore>,
    state: Mutex<Limits>,
    /// Waiting now.
    waiting: AtomicU64,
    drain: Mutex<DrainRate>,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct Limits {
    /// `None`: no limit (the queue is bypassed).
    max_inflight: Option<usize>,
    /// Permits the semaphore was given so far (minus those taken back).
    issued: usize,
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
    permit: Option<OwnedSemaphorePermit>,
    queue: Arc<UpstreamQueue>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.permit.take().is_some() {
            self.queue.metrics.upstream_inflight.dec();
            self.queue.given_back();
        }
    }
}

impl UpstreamQueue {
    pub fn new(max_inflight: Option<usize>, metrics: Arc<Metrics>) -> Arc<UpstreamQueue> {
        let issued = max_inflight.unwrap_or(0);
        Arc::new(UpstreamQueue {
            slots: Arc::new(Semaphore::new(issued)),
            state: Mutex::new(Limits {
                max_inflight,
                issued,
            }),
            waiting: AtomicU64::new(0),
            drain: Mutex::new(DrainRate {
                window_start: Instant::now(),
                in_window: 0,
                per_second: None,
            }),
            metrics,
        })
    }

    /// A new limit (a reload). Raising adds slots at once; lowering takes slots back as they
    /// are given back.
    pub fn set_max_inflight(self: &Arc<Self>, max_inflight: Option<usize>) {
        let mut limits = self.state.lock().expect("not poisoned");
        limits.max_inflight = max_inflight;
        let Some(target) = max_inflight else { return };
        if target > limits.issued {
            self.slots.add_permits(target - limits.issued);
        } else if target < limits.issued {
            let surplus = (limits.issued - target) as u32;
            let slots = self.slots.clone();
            tokio::spawn(async move {
                if let Ok(permits) = slots.acquire_many_owned(surplus).await {
                    permits.forget();
                }
            });
        }
        limits.issued = target;
    }

    /// Waits for a slot, at most `max_wait`.
    pub async fn enter(self: &Arc<Self>, max_wait: Duration) -> Result<Slot, TurnedAway> {
        let limited = self
            .state
            .lock()
            .expect("not poisoned")
            .max_inflight
            .is_some();
        if !limited {
            return Ok(Slot {
                permit: None,
                queue: self.clone(),
            });
        }
        let started = Instant::now();
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(_) => {
                let position = self.waiting.fetch_add(1, Ordering::Relaxed) + 1;
                self.metrics.upstream_queue_depth.inc();
                let turned_away = TurnedAway {
                    position,
                    estimated_wait: self.estimated_wait(position).unwrap_or(max_wait),
                };
                let waited = if turned_away.estimated_wait > max_wait {
                    None
                } else {
                    tokio::time::timeout(max_wait, self.slots.clone().acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                };
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                self.metrics.upstream_queue_depth.dec();
                waited.ok_or(turned_away)
            }
        };
        self.metrics
            .upstream_queue_wait
            .observe(started.elapsed().as_secs_f64());
        let permit = permit?;
        self.metrics.upstream_inflight.inc();
        Ok(Slot {
            permit: Some(permit),
            queue: self.clone(),
        })
    }

    /// Waiting now.
    pub fn depth(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// How long the `position`th in line should wait at the measured drain rate.
    fn estimated_wait(&self, position: u64) -> Option<Duration> {
        let drain = self.drain.lock().expect("not poisoned");
        drain
            .per_second
            .filter(|rate| *rate > 0.0)
            .map(|rate| Duration::from_secs_f64(position as f64 / rate))
    }

    fn given_back(&self) {
        let mut drain = self.drain.lock().expect("not poisoned");
        drain.in_window += 1;
        let elapsed = drain.window_start.elapsed();
        if elapsed >= Duration::from_secs(1) {
            drain.per_second = Some(drain.in_window as f64 / elapsed.as_secs_f64());
            drain.in_window = 0;
            drain.window_start = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(max: usize) -> Arc<UpstreamQueue> {
        UpstreamQueue::new(Some(max), Arc::new(Metrics::new()))
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
    async fn reload_raises_and_lowers_the_limit() {
        let q = queue(1);
        let a = q.enter(Duration::from_millis(10)).await.unwrap();
        assert!(q.enter(Duration::from_millis(10)).await.is_err());
        q.set_max_inflight(Some(2));
        let b = q.enter(Duration::from_millis(10)).await.unwrap();
        q.set_max_inflight(Some(1));
        drop(a);
        tokio::task::yield_now().await;
        // The slot a gave back went to the lowering, not to a newcomer.
        assert!(q.enter(Duration::from_millis(10)).await.is_err());
        drop(b);
        assert!(q.enter(Duration::from_millis(10)).await.is_ok());
        q.set_max_inflight(None);
        let _c = q.enter(Duration::from_millis(10)).await.unwrap();
        let _d = q.enter(Duration::from_millis(10)).await.unwrap();
    }
}
