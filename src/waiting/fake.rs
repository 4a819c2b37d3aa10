//! An in-process waiting-room store for unit tests: the queue scripts (`lua/queue_*.lua`) as
//! maps under one `Mutex`, close enough for the waiting room's own logic (its views, tickets,
//! gate and polls); the scripts are proven against Redis by tests/queue_model.rs and e2e. Units
//! left come from a [`FakeStore`] (ledgers and stock keys).
//!
//! Kept: one ticket per user, numbers growing with arrival and skipping what a cursor that ran
//! ahead passed; the cursor (`base + (now - t0) * rate`, standing while paused or held or
//! before the start) restarting from where it is on a pause, a resume, a change of rate or a
//! hold; the draw's freeze at the first call after the start; the epoch; no ticket outside the
//! queue's hours. Approximations: a postponed start is not rescheduled, the history is never
//! pruned (nothing lapses by age), and control of a queue never set up sets it up.
//!
//! Redis's clock is frozen at what the test sets ([`QueueFake::set_now`]); the store's
//! [`RedisClock`] learns it, so the gateway's estimate agrees with it (up to the real time the
//! test takes, a few ms).

use super::draw::{self, Seed};
use super::store::{Control, Fresh, Issued, QueueStore};
use super::view::{Mark, QueueState};
use crate::config::{Activity, QueueSettings};
use crate::stock::clock::RedisClock;
use crate::stock::fake::FakeStore;
use crate::stock::prelude::*;
use crate::stock::{Layout, LedgerRow, Segment, StoreError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

/// One queue hash and its tickets.
#[derive(Debug, Clone)]
struct Queue {
    state: QueueState,
    tickets: HashMap<String, u64>,
    /// The draw's seed, chosen when the queue was set up.
    seed: Seed,
    /// Spent proof-of-work challenges.
    spent: std::collections::HashSet<String>,
}

/// What the fake was asked, for tests to check.
#[derive(Debug, Default)]
pub struct Calls {
    pub tickets: u32,
    /// `rewrite` of each state read.
    pub rewrite: Vec<super::store::Rewrite>,
    /// Places recorded (ticket number, place).
    pub places: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
pub struct QueueFake {
    pub stock: FakeStore,
    clock: RedisClock,
    now_ms: Mutex<u64>,
    queues: Mutex<HashMap<String, Queue>>,
    /// Calls still to fail, by name (`ticket`, `state`, `control`).
    failing: Mutex<HashMap<&'static str, u32>>,
    pub asked: Mutex<Calls>,
}

impl QueueFake {
    /// Redis's clock now, and the gateway's estimate of it.
    pub fn set_now(&self, at: chrono::DateTime<chrono::Utc>) {
        *self.now_ms.lock() = at.timestamp_millis() as u64;
        let local = chrono::Utc::now();
        self.clock.learn(at.timestamp_millis(), local, local);
    }

    /// Moves Redis's clock alone (the gateway's estimate stays): a gateway whose clock is off.
    pub fn skew(&self, by: chrono::Duration) {
        let mut now = self.now_ms.lock();
        *now = (*now as i64 + by.num_milliseconds()) as u64;
    }

    pub fn advance(&self, by: Duration) {
        let now = *self.now_ms.lock() + by.as_millis() as u64;
        self.set_now(chrono::DateTime::from_timestamp_millis(now as i64).unwrap());
    }

    /// The next `calls` calls of `op` fail as a timeout would.
    pub fn fail(&self, op: &'static str, calls: u32) {
        self.failing.lock().insert(op, calls);
    }

    /// Redis lost the queue's keys: the next call sets it up again (a new epoch).
    pub fn lose(&self, activity: &str) {
        self.queues.lock().remove(activity);
    }

    fn enter(&self, op: &'static str) -> Result<u64, StoreError> {
        if let Some(left) = self.failing.lock().get_mut(op).filter(|n| **n > 0) {
            *left -= 1;
            return Err(StoreError::Timeout(Duration::from_millis(1)));
        }
        Ok(*self.now_ms.lock())
    }

    /// `queue_init`, `queue_freeze` and the answer's clock: the queue as a call finds it.
    fn queue<'q>(
        queues: &'q mut HashMap<String, Queue>,
        activity: &Activity,
        rate: u32,
        now: u64,
        fresh: &Fresh,
    ) -> &'q mut Queue {
        let start = activity.opens().timestamp_millis() as u64;
        let q = queues.entry(activity.id.to_string()).or_insert_with(|| {
            let t0 = now.max(start);
            let state = QueueState {
                seq: 0,
                start_ms: start,
                rate: u64::from(rate),
                base: 0,
                t0_ms: t0,
                paused: false,
                held: false,
                drawn: None,
                now_ms: now,
                epoch: fresh.epoch,
                marks: vec![mark(t0, 0, u64::from(rate), true)],
                lapsed: 0,
                commitment: Some(draw::commitment(&fresh.seed)),
                halted_at: None,
                stepped: false,
                active: 0,
            };
            Queue {
                state,
                seed: fresh.seed,
                tickets: HashMap::new(),
                spent: Default::default(),
            }
        });
        if now >= q.state.start_ms && q.state.drawn.is_none() {
            q.state.drawn = Some((q.state.seq, q.seed));
        }
        q.state.now_ms = now;
        q
    }
}

fn mark(at_ms: u64, cursor: u64, rate: u64, running: bool) -> Mark {
    Mark {
        at_ms,
        cursor,
        rate,
        running,
        postponed_at: None,
    }
}

/// `queue_cursor`.
fn cursor(s: &QueueState, now: u64) -> u64 {
    if now < s.start_ms || now < s.t0_ms || s.paused || s.held {
        return s.base;
    }
    s.base + (now - s.t0_ms) * s.rate / 1000
}

/// `queue_rebase` then `queue_mark` around `change`: the cursor restarts from where it is.
fn restart(s: &mut QueueState, now: u64, change: impl FnOnce(&mut QueueState)) {
    s.base = cursor(s, now);
    s.t0_ms = now.max(s.start_ms);
    change(s);
    if s.marks.last().is_some_and(|m| m.cursor == s.base) {
        s.marks.pop();
    }
    let running = !(s.paused || s.held);
    s.marks.push(mark(s.t0_ms, s.base, s.rate, running));
}

impl QueueStore for QueueFake {
    fn clock(&self) -> &RedisClock {
        &self.clock
    }

    /// `lua/queue_ticket.lua`: each ask in order at one time.
    async fn tickets(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        asks: &[super::store::Ask],
        fresh: &Fresh,
    ) -> Result<(QueueState, Vec<Issued>), StoreError> {
        let now = self.enter("ticket")?;
        self.asked.lock().tickets += asks.len() as u32;
        let mut queues = self.queues.lock();
        let q = Self::queue(&mut queues, activity, queue.admit_per_second, now, fresh);
        let all = if now < queue.opens_at.timestamp_millis() as u64 {
            Some(Issued::NotOpen)
        } else if now >= activity.ends_at.timestamp_millis() as u64 {
            Some(Issued::Closed)
        } else {
            None
        };
        if let Some(all) = all {
            return Ok((q.state.clone(), vec![all; asks.len()]));
        }
        let issued = asks
            .iter()
            .map(|ask| {
                let spend = ask.spend.as_ref();
                let spent = spend.is_some_and(|s| !q.spent.insert(s.challenge.clone()));
                if spent && spend.is_some_and(|s| s.enforce) {
                    return Issued::Spent;
                }
                let (number, fresh) = match q.tickets.get(&ask.user) {
                    Some(&n) => (n, false),
                    None => {
                        q.state.seq = q.state.seq.max(cursor(&q.state, now)) + 1;
                        q.tickets.insert(ask.user.clone(), q.state.seq);
                        (q.state.seq, true)
                    }
                };
                Issued::Ticket {
                    number,
                    fresh,
                    spent,
                }
            })
            .collect();
        Ok((q.state.clone(), issued))
    }

    /// `lua/queue_state.lua`; an unsegmented activity's units left are its stock key's.
    async fn state(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        fresh: &Fresh,
        rewrite: super::store::Rewrite,
        left: Option<i64>,
    ) -> Result<(QueueState, Option<i64>), StoreError> {
        let now = self.enter("state")?;
        self.asked.lock().rewrite.push(rewrite);
        let left = if activity.is_segmented() {
            left
        } else {
            let layout = Layout::of(activity);
            self.stock
                .stock(layout.segment(0).unwrap(), activity.version)
        };
        let mut queues = self.queues.lock();
        let q = Self::queue(&mut queues, activity, queue.admit_per_second, now, fresh);
        let rate = u64::from(queue.admit_per_second);
        if rewrite.rate && rate != q.state.rate {
            restart(&mut q.state, now, |s| s.rate = rate);
        }
        if let Some(left) = left.filter(|l| *l >= 0) {
            let held = left == 0;
            if held != q.state.held {
                restart(&mut q.state, now, |s| s.held = held);
            }
        }
        Ok((q.state.clone(), left.filter(|l| *l >= 0)))
    }

    /// `lua/queue_control.lua`.
    async fn control(
        &self,
        activity: &Activity,
        control: Control,
    ) -> Result<QueueState, StoreError> {
        let now = self.enter("control")?;
        let mut queues = self.queues.lock();
        let q = Self::queue(&mut queues, activity, 1, now, &Fresh::fixed(0));
        restart(&mut q.state, now, |s| match control {
            Control::Pause => s.paused = true,
            Control::Resume => s.paused = false,
            Control::Rate(rate) => s.rate = u64::from(rate),
        });
        Ok(q.state.clone())
    }

    /// `lua/queue_place.lua`.
    async fn record_place(&self, placed: super::store::Placed) -> Result<(), StoreError> {
        self.enter("place")?;
        self.asked.lock().places.push((placed.number, placed.place));
        Ok(())
    }

    /// Never asked: the fake's queues keep the time-function cursor.
    async fn fate(
        &self,
        _activity: &Activity,
        _place: u64,
        _touch: super::store::Touch,
    ) -> Result<super::store::Fate, StoreError> {
        Ok(super::store::Fate::Undecided)
    }

    async fn ledger(&self, segment: Segment<'_>, version: u64) -> Result<LedgerRow, StoreError> {
        LedgerScript::ledger(&self.stock, segment, version).await
    }

    async fn units_held(&self, activity: &Activity, user: &str) -> Result<u64, StoreError> {
        self.enter("units_held")?;
        let layout = Layout::of(activity);
        Ok(self.stock.units_held(layout.home(user), user))
    }
}
