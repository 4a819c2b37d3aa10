//! A queue as one gateway knows it: the state the queue scripts last answered (read every few
//! hundred milliseconds), and what a ticket's place means against it. Polls and admissions are
//! answered from here, never with a Redis call per request.
//!
//! The cursor is a function of Redis's clock (`base + (now - t0) * rate`): every gateway
//! computes the same one, so the fleet admits `admit_per_second` together, not N times it. A
//! gateway's estimate of Redis's clock is the time of the last read plus the time elapsed
//! locally since (a monotonic clock), so a gateway whose own clock is off admits on time too.
//!
//! Approximations: a change of rate, a pause or a hold reaches a gateway at its next read (up to
//! the refresh interval late); the lapse of an admitted ticket is measured in the queue's
//! progress (`admission_window_secs × admit_per_second` places), which is the window's length
//! in seconds while the queue runs at its rate, and stops while it is paused or held.

use super::draw;
pub use super::marks::{parse_marks, reached_at, Mark};
use crate::config::QueueSettings;
use std::time::{Duration, Instant};

/// The queue hash as the scripts answer it (see `lua/queue_lib.lua`, `queue_reply`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    /// The last ticket number issued (numbers skip places a cursor that ran ahead passed).
    pub seq: u64,
    /// When the cursor starts (unix ms): the sale's start, or a later one it was postponed to;
    /// the cursor stands at `base` before it.
    pub start_ms: u64,
    pub rate: u64,
    pub base: u64,
    pub t0_ms: u64,
    pub paused: bool,
    /// Nothing is left to sell: the cursor waits.
    pub held: bool,
    /// Tickets issued before the start, once drawn, and the draw's seed.
    pub drawn: Option<(u64, draw::Seed)>,
    /// The commitment to the draw's seed (hex SHA-256), once chosen (a queue an older flashgate
    /// drew has none).
    pub commitment: Option<String>,
    /// Redis's clock when it answered (unix ms).
    pub now_ms: u64,
    /// The random id written when this queue was set up: a ticket of another epoch is of a
    /// queue Redis lost.
    pub epoch: u64,
    /// The cursor's recent history, oldest first (when each place was reached).
    pub marks: Vec<Mark>,
    /// Every place up to this one has lapsed (older marks were dropped).
    pub lapsed: u64,
    /// Since when the activity is halted (unix ms, Redis's clock), while it is.
    pub halted_at: Option<u64>,
    /// Stepped admission (`waiting::stepped`): the cursor is `base`; places' fates are in Redis.
    pub stepped: bool,
    /// Stepped: admitted buyers who had not bought nor lapsed at the last step.
    pub active: u64,
}

/// Fields of a state reply, before any extra the script adds.
pub const STATE_FIELDS: usize = 17;

impl QueueState {
    pub fn parse(reply: &[String]) -> Option<QueueState> {
        let n = |i: usize| reply.get(i)?.parse::<u64>().ok();
        let drawn = match (reply.get(7)?.as_str(), reply.get(8)?.as_str()) {
            ("", _) => None,
            (d, s) => Some((d.parse().ok()?, draw::parse_seed(s)?)),
        };
        let commitment = Some(reply.get(13)?.clone()).filter(|c| !c.is_empty());
        Some(QueueState {
            seq: n(0)?,
            start_ms: n(1)?,
            rate: n(2)?.max(1),
            base: n(3)?,
            t0_ms: n(4)?,
            paused: reply.get(5)? == "1",
            held: reply.get(6)? == "1",
            drawn,
            now_ms: n(9)?,
            epoch: n(10)?,
            marks: parse_marks(reply.get(11)?)?,
            lapsed: n(12)?,
            commitment,
            halted_at: Some(n(14)?).filter(|at| *at > 0),
            stepped: reply.get(15)? == "1",
            active: n(16)?,
        })
    }

    /// Places admitted at Redis time `now_ms`.
    pub fn cursor_at(&self, now_ms: u64) -> u64 {
        if self.stepped || now_ms < self.start_ms || now_ms < self.t0_ms || self.paused || self.held
        {
            return self.base;
        }
        self.base + (now_ms - self.t0_ms) * self.rate / 1000
    }

    /// When `place`'s admission window (`window_ms` long) closes (Redis time, unix ms): from
    /// when the cursor reached it (its history), lengthened by the time of any postponement
    /// that came while it was open (no one can buy while a sale is postponed), and by a halt's
    /// (the resume's mark records it as a postponement; while the halt lasts, a window open at
    /// it does not end: `u64::MAX`); `None` for a place of the lapsed past, or not reached.
    pub fn window_ends_at(&self, place: u64, window_ms: u64) -> Option<u64> {
        if place <= self.lapsed {
            return None;
        }
        let reached = reached_at(&self.marks, place)?;
        // The postponements, as time intervals the cursor stood (merged where they overlap: a
        // sale postponed again while postponed).
        let mut stood: Vec<(u64, u64)> = self
            .marks
            .iter()
            .filter_map(|m| m.postponed_at.map(|p| (p, m.at_ms.max(p))))
            .collect();
        stood.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(stood.len());
        for (from, to) in stood {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        // A window lengthened only if it had more left than a gateway's read may be old when
        // the postponement came (two refresh intervals): no gateway reading on time can have
        // told that buyer "expired" already (a lapsed ticket stays lapsed); one with less left
        // loses at most that much. Approximation: a gateway whose reads failed for longer may.
        let margin = 2 * super::REFRESH_INTERVAL.as_millis() as u64;
        let mut end = reached + window_ms;
        for (from, to) in merged {
            if from.saturating_add(margin) < end && to > reached {
                end += to - from.max(reached);
            }
        }
        match self.halted_at {
            Some(from) if from.saturating_add(margin) < end => Some(u64::MAX),
            _ => Some(end),
        }
    }
}

/// What a ticket holder is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not yet: `position` 1 is next. Before the draw, `position` is the pre-queue's size (the
    /// place is drawn at the start).
    Waiting {
        position: u64,
        estimated_wait_ms: u64,
        refresh_after_ms: u64,
        likely_too_late: bool,
        drawn: bool,
        /// An operator paused the queue: the cursor stands, and `estimated_wait_ms` means
        /// nothing until it runs again (the JSON says `null`).
        paused: bool,
    },
    /// The ticket may buy now.
    YourTurn,
    /// Nothing is left to sell.
    SoldOut,
    /// Its admission window passed.
    Expired,
    /// Stepped: its turn came while it was absent (not polled) and went to the next buyer.
    GivenAway,
    /// The buyer's purchase won (the backend answered 2xx): never given by the queue itself,
    /// only by a poll of a buyer the room saw buy (see `WaitingRoom::bought`).
    Bought,
    /// No ticket yet: a proof of work to solve first (the answer carries it).
    Challenge,
}

impl Status {
    /// Whether nothing more will change: the answer asks for no refresh.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Status::Waiting { .. } | Status::YourTurn | Status::Challenge
        )
    }

    /// The `state` field of the poll answer.
    pub fn state(&self) -> &'static str {
        match self {
            Status::Waiting { .. } => "waiting",
            Status::YourTurn => "your_turn",
            Status::SoldOut => "sold_out",
            Status::Expired | Status::GivenAway => "expired",
            Status::Bought => "bought",
            Status::Challenge => "challenge",
        }
    }
}

/// Shortest and longest pause a waiting client is asked to take before asking again.
const MIN_REFRESH_MS: u64 = 1_000;
const MAX_REFRESH_MS: u64 = 30_000;
/// The longest pause asked of a client while the queue is paused (the contract's 5 s).
const PAUSED_REFRESH_MS: u64 = 5_000;

/// One queue as this gateway read it.
#[derive(Debug, Clone)]
pub struct View {
    pub state: QueueState,
    /// When it was read (this process's monotonic clock).
    pub read_at: Instant,
    /// Units left over the activity, as last read (`None`: not known yet).
    pub left: Option<i64>,
    /// Units sold so far (the configured stock less `left`), when `left` is known.
    pub sold: Option<u64>,
}

/// Buyers admitted before what they bought says how much the buyers ahead will want: fewer,
/// and each buyer ahead is counted as wanting one unit.
const DEMAND_SAMPLE: u64 = 20;

impl View {
    pub fn new(state: QueueState, left: Option<i64>) -> View {
        View {
            state,
            read_at: Instant::now(),
            left,
            sold: None,
        }
    }

    /// With the units sold so far, out of the activity's configured `stock` (`None` once as
    /// many are left as that: a restock, whose units sold cannot be told apart).
    pub fn of_stock(mut self, stock: u64) -> View {
        self.sold = self
            .left
            .filter(|left| (left.max(&0).unsigned_abs()) < stock)
            .map(|left| stock - left.max(0) as u64);
        self
    }

    /// Units bought per buyer whose admission window has closed (who had their whole chance),
    /// once [`DEMAND_SAMPLE`] had: in drops many admitted buyers never buy. Approximations: the
    /// units sold count those of buyers still in their window too (an overestimate, so "too
    /// late" errs towards being said), the places whose window closed are reckoned at the
    /// current rate (pauses and rate changes aside), and places the cursor passed while nobody
    /// held them count as buyers who did not buy.
    pub fn units_per_admitted(&self, window_ms: u64) -> Option<f64> {
        let closed_before = self.redis_now_ms().checked_sub(window_ms)?;
        let done = self.state.cursor_at(closed_before).min(self.state.seq);
        if done < DEMAND_SAMPLE {
            return None;
        }
        Some(self.sold? as f64 / done as f64)
    }

    /// Whether a buyer with `ahead` places before theirs is very likely too late: the units
    /// those ahead are expected to want (one each, or as many as buyers who had their chance
    /// bought so far) exceed what is left by `too_late_factor`. An estimate, and said as one.
    pub fn likely_too_late(&self, ahead: u64, settings: &QueueSettings) -> bool {
        let Some(left) = self.left else {
            return false;
        };
        let window = settings.admission_window.as_millis() as u64;
        let each = self.units_per_admitted(window).unwrap_or(1.0);
        ahead as f64 * each >= left.max(0) as f64 * settings.too_late_factor
    }

    /// Redis's clock now, estimated from the last read.
    pub fn redis_now_ms(&self) -> u64 {
        self.state.now_ms + self.read_at.elapsed().as_millis() as u64
    }

    pub fn cursor(&self) -> u64 {
        self.state.cursor_at(self.redis_now_ms())
    }

    /// Ticket `number`'s place, once it is known: the draw at the start decides every place
    /// (the pre-queue's by lot, later ones by number), so until this gateway has read it, none.
    pub fn place(&self, number: u64) -> Option<u64> {
        self.state
            .drawn
            .map(|(drawn, seed)| draw::place(number, Some(drawn), &seed))
    }

    /// What the holder of ticket `number` is told now.
    pub fn status(&self, number: u64, settings: &QueueSettings) -> Status {
        if self.state.held {
            return Status::SoldOut;
        }
        let rate = self.state.rate;
        let Some(place) = self.place(number) else {
            // Before the draw: everyone in the pre-queue shares it.
            let until_start = self.state.start_ms.saturating_sub(self.redis_now_ms());
            let expected = (self.state.seq / 2).max(1) * 1000 / rate;
            return Status::Waiting {
                position: self.state.seq.max(1),
                estimated_wait_ms: until_start + expected,
                refresh_after_ms: refresh_after(until_start.max(MIN_REFRESH_MS)),
                likely_too_late: false,
                drawn: false,
                paused: false,
            };
        };
        let cursor = self.cursor();
        if place <= cursor {
            // The window runs from when the cursor reached the place (Redis's clock), whatever
            // the rate did since. A place reached before the history kept has lapsed.
            let window = settings.admission_window.as_millis() as u64;
            return match self.state.window_ends_at(place, window) {
                Some(end) if self.redis_now_ms() <= end => Status::YourTurn,
                _ => Status::Expired,
            };
        }
        let ahead = place - cursor - 1;
        let until_start = self.state.start_ms.saturating_sub(self.redis_now_ms());
        let estimated_wait_ms = until_start + (ahead + 1) * 1000 / rate;
        // Paused by an operator, the cursor stands: no estimate holds, and the buyer is asked
        // back often enough to see it run again.
        let paused = self.state.paused;
        let refresh_after_ms = match paused {
            true => refresh_after(estimated_wait_ms).min(PAUSED_REFRESH_MS),
            false => refresh_after(estimated_wait_ms),
        };
        Status::Waiting {
            position: ahead + 1,
            estimated_wait_ms,
            refresh_after_ms,
            likely_too_late: self.likely_too_late(ahead, settings),
            drawn: true,
            paused,
        }
    }

    /// Tickets issued and not yet reached by the cursor.
    pub fn length(&self) -> u64 {
        self.state.seq.saturating_sub(self.cursor())
    }
}

/// Asks a client to come back after a quarter of its expected wait, between 1 and 30 seconds:
/// often near the front, rarely far from it.
fn refresh_after(wait_ms: u64) -> u64 {
    (wait_ms / 4).clamp(MIN_REFRESH_MS, MAX_REFRESH_MS)
}

/// How stale a view may be before polls stop trusting it (the store is unreachable).
pub const STALE_AFTER: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests;
