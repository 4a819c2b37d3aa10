//! The waiting room (`activities[].queue`): while an activity's queue is open, a buyer without
//! a ticket is not sent to the reserve script but given a numbered ticket (one per user, issued
//! in Redis) and a place; the buyer comes back with it, and buys once the fleet-wide cursor
//! reaches that place. Stock-aware: an arrival too far behind the units left is told so at
//! once, every waiting buyer learns `sold_out` when nothing is left, and the cursor waits while
//! nothing is left, so units that come back go to the next tickets in line.
//!
//! - [`draw`]: the fair start (the pre-queue's places drawn at the start, checkably), and
//!   [`audit`], `flashgate draw`'s check of it;
//! - [`challenge`]: proof of work before a ticket;
//! - [`ticket`]: tickets, signed and bound to the buyer and the activity;
//! - [`view`]: the queue as this gateway knows it (polls and admissions answered from memory);
//! - [`store`]: the keys and scripts in Redis;
//! - [`page`]: the JSON answer and the HTML waiting page.

pub mod audit;
mod bought;
pub mod challenge;
mod defence;
pub mod draw;
#[cfg(test)]
mod fake;
mod issue;
pub mod line;
mod marks;
pub mod page;
mod refresh;
pub mod start;
mod stepped;
pub mod store;
pub mod ticket;
pub mod view;

use crate::config::{Activity, QueueSettings, Settings};
use crate::decision::Decision;
use crate::metrics::Metrics;
use crate::stock::{StockStore, StoreError};
use moka::sync::Cache;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use store::QueueStore;
use ticket::Ticket;
use view::{Status, View};

pub use defence::{ChallengeOutcome, Published};

crate::label_enum! {
    /// Why a queue's cursor stands, as the `why` label of `flashgate_queue_paused`.
    pub enum Standing {
        /// An operator paused it (admin API).
        Operator => "operator",
        /// Nothing is left to sell: held until units come back.
        SoldOut => "sold_out",
    }
}

/// A ticket a request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    pub ticket: String,
    /// From the `flashgate_ticket` cookie (one per browser, whatever the activity): a genuine
    /// ticket of another activity there is a browser that queued elsewhere too, and any other
    /// ticket not this buyer's (another account's in a shared browser, junk) is not held
    /// against them either: a new ticket is issued and the cookie replaced. From the header
    /// every ticket not this buyer's for this activity is refused (403 `invalid_ticket`).
    pub from_cookie: bool,
}

/// What the waiting room says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// No queue (or it is closed), or this ticket's turn: on to the purchase.
    Pass,
    /// Not yet: answer with the place (202 `queued`).
    Wait(Answer),
    /// Refused (`invalid_ticket`, `ticket_expired`, `sold_out`, `unavailable`).
    Refuse(Decision),
}

/// A ticket holder's answer: the ticket, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Empty with a challenge (no ticket yet).
    pub ticket: String,
    /// An activity with variants: each, and whether it is still on sale (empty otherwise).
    pub variants: Vec<Availability>,
    pub status: Status,
    /// With [`Status::YourTurn`]: how long the admission window has left (by Redis's clock as
    /// last read); `None` while a halt stands (the window does not run out then).
    pub turn_left_ms: Option<u64>,
    /// With [`Status::Challenge`]: the proof of work to solve for a ticket.
    pub challenge: Option<Box<challenge::Challenge>>,
    /// With `queue.draw`: what is published of the pre-queue's draw so far.
    pub draw: Option<Published>,
    /// Seconds until the ticket's cookie should expire (the sale's end).
    pub cookie_max_age_secs: u64,
    /// The ticket cookie the browser sent was not this buyer's (another account's, forged or
    /// damaged): this answer's ticket replaces it (never a lockout), and the page says so.
    pub ticket_replaced: bool,
}

/// One variant of a drop as a ticket holder sees it: its id, its title, whether units of it
/// are left (as the last refresh read them: unknown reads as available).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Availability {
    pub id: Arc<str>,
    pub title: String,
    pub available: bool,
}

/// Tickets admitted this process already counted (per activity, by number): bounded.
const SEEN_CAPACITY: u64 = 2_000_000;

/// The waiting room over its store `S` (Redis unless a test says otherwise).
pub struct WaitingRoom<S = StockStore> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    views: RwLock<HashMap<Arc<str>, View>>,
    /// The rate and start each activity's queue was last configured with here, and what of
    /// them is still to be written: a reload that changes one writes it to Redis (a restart
    /// does not: an operator's change of rate stands, and an older file must not move a start).
    configured: RwLock<HashMap<Arc<str>, refresh::Configured>>,
    /// Units left of each variant of an activity with variants (by its lane's name,
    /// `Activity::lane`), as the last refresh read them: which variants a poll lists available.
    variant_left: RwLock<HashMap<Arc<str>, i64>>,
    /// Tickets seen admitted by this process, counted once.
    admitted: Cache<(Arc<str>, u64), ()>,
    /// The ticket this process last had Redis issue each buyer (per activity): one ticket per
    /// buyer, so a buyer without one (a poll or a purchase with no ticket, again and again) is
    /// answered from here, without a Redis call, while its queue's epoch holds.
    issued: Cache<(Arc<str>, String), (Ticket, String)>,
    /// Buyers whose purchase won (per activity), for their polls' `bought`. Approximation:
    /// kept by the gateway that relayed the win, in memory (bounded, a day): a poll another gateway answers, or one after a restart, reads
    /// the queue's state instead, but for `sold_out`, which asks Redis first.
    bought: Cache<(Arc<str>, String), ()>,
    /// Stepped queues: the place of each buyer told `your_turn` here, freed when they buy.
    places: Cache<(Arc<str>, String), u64>,
    /// Tickets asked of Redis, per activity: the asks that arrive while a call is out go
    /// together in the next one (see [`issue`]).
    ticket_calls: issue::TicketCalls,
}

/// Buyers whose issued ticket is remembered, per process (each entry about 200 bytes).
const ISSUED_CAPACITY: u64 = 1_000_000;
/// How long an issued ticket is remembered without being asked for again.
const ISSUED_IDLE: Duration = Duration::from_secs(600);

/// How often each gateway reads each queue's state: a waiting buyer learns `sold_out` (or that
/// the rate or a pause changed) at most this late, plus their own refresh.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);

impl<S: QueueStore> WaitingRoom<S> {
    pub fn new(store: Arc<S>, metrics: Arc<Metrics>) -> WaitingRoom<S> {
        WaitingRoom {
            store,
            metrics,
            views: RwLock::default(),
            configured: RwLock::default(),
            variant_left: RwLock::default(),
            admitted: Cache::builder()
                .max_capacity(SEEN_CAPACITY)
                .time_to_live(Duration::from_secs(24 * 3600))
                .build(),
            issued: Cache::builder()
                .max_capacity(ISSUED_CAPACITY)
                .time_to_idle(ISSUED_IDLE)
                .build(),
            bought: Cache::builder()
                .max_capacity(ISSUED_CAPACITY)
                .time_to_live(Duration::from_secs(24 * 3600))
                .build(),
            places: Cache::new(ISSUED_CAPACITY),
            ticket_calls: issue::TicketCalls::new(store::MAX_TICKET_BATCH),
        }
    }

    pub(super) fn learn(&self, activity: &Activity, view: View) {
        let label = &*activity.id;
        self.metrics
            .queue_length
            .with_label_values(&[label])
            .set(view.length() as i64);
        self.metrics
            .queue_cursor
            .with_label_values(&[label])
            .set(view.cursor() as i64);
        self.metrics
            .queue_start_time
            .with_label_values(&[label])
            .set((view.state.start_ms / 1000) as i64);
        for (why, on) in [
            (Standing::Operator, view.state.paused),
            (Standing::SoldOut, view.state.held),
        ] {
            self.metrics
                .queue_paused
                .with_label_values(&[label, why.as_str()])
                .set(i64::from(on));
        }
        let mut views = self.views.write();
        if let Some(old) = views.get(&activity.id) {
            if old.state.epoch != view.state.epoch {
                tracing::error!(activity = %activity.id,
                    "the waiting room's queue was set up again (Redis lost its keys): earlier tickets hold no place, their holders are given new ones");
            }
        }
        // Keep what this gateway knew of the units left if the new read did not say.
        let view = match (views.get(&activity.id), view.left) {
            (Some(old), None) => View {
                left: old.left,
                ..view
            },
            _ => view,
        };
        views.insert(activity.id.clone(), view);
    }

    fn view(&self, activity: &Activity) -> Option<View> {
        self.with_view(activity, View::clone)
    }

    /// `f` of the queue as last read, if it was read lately (without copying the view).
    fn with_view<T>(&self, activity: &Activity, f: impl FnOnce(&View) -> T) -> Option<T> {
        self.views
            .read()
            .get(&activity.id)
            .filter(|v| v.read_at.elapsed() < view::STALE_AFTER)
            .map(f)
    }

    /// The queue's state as this gateway knows it (admin API).
    pub fn state(&self, activity: &Activity) -> Option<View> {
        self.views.read().get(&activity.id).cloned()
    }

    /// The gate in front of a purchase by `user` (identified), presenting `presented` (a
    /// ticket from the header or cookie), if any.
    pub async fn gate(
        &self,
        settings: &Settings,
        activity: &Activity,
        user: &str,
        presented: Option<&Presented>,
        solution: Option<&str>,
    ) -> Turn {
        let Some(queue) = activity.queue.as_ref() else {
            return Turn::Pass;
        };
        if !activity.queue_open_at(self.store.clock().now()) {
            return Turn::Pass;
        }
        let key = &settings.signing.ticket_key;
        match self
            .answer(key, activity, queue, user, presented, solution)
            .await
        {
            Ok((answer, ticket, honoured)) => match answer.status {
                Status::YourTurn | Status::Bought if honoured => {
                    if let Some(ticket) = ticket {
                        self.count_admitted(activity, queue, ticket);
                    }
                    Turn::Pass
                }
                Status::YourTurn | Status::Bought | Status::Waiting { .. } | Status::Challenge => {
                    Turn::Wait(answer)
                }
                Status::SoldOut => Turn::Refuse(Decision::SoldOut),
                Status::Expired if honoured => {
                    self.metrics
                        .queue_lapsed
                        .with_label_values(&[&activity.id])
                        .inc();
                    Turn::Refuse(Decision::TicketExpired)
                }
                Status::Expired => Turn::Refuse(Decision::TicketExpired),
                Status::GivenAway => Turn::Refuse(Decision::TurnGivenAway),
            },
            Err(decision) => Turn::Refuse(decision),
        }
    }

    /// A ticket holder polling `GET /flashgate/queue/{activity}` (a browser without a ticket
    /// is given one, as a purchase would be).
    pub async fn poll(
        &self,
        settings: &Settings,
        activity: &Activity,
        user: &str,
        presented: Option<&Presented>,
        solution: Option<&str>,
    ) -> Result<Answer, Decision> {
        let Some(queue) = activity.queue.as_ref() else {
            return Err(Decision::UnknownActivity);
        };
        // By Redis's clock (as last read), as the gate judges it.
        let now = self.store.clock().now();
        if !activity.queue_open_at(now) && presented.is_none() {
            return Err(if now >= activity.ends_at {
                Decision::Ended
            } else {
                // When the room opens, as a purchase before it is told.
                Decision::before_opening(
                    activity.opens_after(now).map(|t| t.timestamp_millis()),
                    now.timestamp_millis(),
                )
            });
        }
        self.metrics
            .queue_polls
            .with_label_values(&[&activity.id])
            .inc();
        let (mut answer, _, _) = self
            .answer(
                &settings.signing.ticket_key,
                activity,
                queue,
                user,
                presented,
                solution,
            )
            .await?;
        let key = (activity.id.clone(), user.to_owned());
        // Units found in Redis are not remembered: they may still be released (a purchase the
        // backend refused, held until its deadline), and the stock with them.
        if self.bought.contains_key(&key) || self.bought_elsewhere(activity, user, &answer).await? {
            answer.status = Status::Bought;
        }
        Ok(answer)
    }

    /// Where `user` stands: from a presented ticket (checked, answered from memory), or from
    /// the ticket Redis issues (or already issued) them, or, with a challenge configured, the
    /// challenge to solve first. The flag: the presented ticket was the one answered for (not
    /// one issued now).
    async fn answer(
        &self,
        key: &[u8; 32],
        activity: &Activity,
        queue: &QueueSettings,
        user: &str,
        presented: Option<&Presented>,
        solution: Option<&str>,
    ) -> Result<(Answer, Option<Ticket>, bool), Decision> {
        let (kept, ticket_replaced) = self.kept(key, activity, queue, user, presented).await?;
        let honoured = kept.is_some();
        let ends_in = self.until_the_end_secs(activity);
        let found = match kept {
            Some(kept) => Ok(kept),
            None => {
                self.without_ticket(key, activity, queue, user, solution)
                    .await?
            }
        };
        let (ticket, raw) = match found {
            Ok(found) => found,
            Err(challenge) => {
                let answer = Answer {
                    ticket: String::new(),
                    variants: Vec::new(),
                    status: Status::Challenge,
                    turn_left_ms: None,
                    challenge: Some(challenge),
                    draw: None,
                    cookie_max_age_secs: ends_in,
                    ticket_replaced,
                };
                return Ok((answer, None, false));
            }
        };
        let status = self.status(activity, queue, ticket, honoured)?;
        let (status, stepped_end) = self
            .stepped_status(activity, queue, user, ticket, status)
            .await?;
        let turn_left_ms = match status {
            Status::YourTurn => self.turn_left_ms(activity, queue, ticket, stepped_end),
            _ => None,
        };
        Ok((
            Answer {
                ticket: raw,
                variants: self.availability(activity),
                status,
                turn_left_ms,
                challenge: None,
                draw: self.published(activity, queue),
                cookie_max_age_secs: ends_in,
                ticket_replaced,
            },
            Some(ticket),
            honoured,
        ))
    }

    /// The admission window's time left for `ticket`, whose turn it is: from its admission
    /// (`stepped_end`, a stepped queue's) or from the cursor's history. Approximation: by
    /// Redis's clock as estimated from the last read (up to a read's interval, 250 ms, off).
    fn turn_left_ms(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        ticket: Ticket,
        stepped_end: Option<u64>,
    ) -> Option<u64> {
        let view = self.view(activity)?;
        let window = queue.admission_window.as_millis() as u64;
        let end = match stepped_end {
            Some(end) => end,
            None => view
                .state
                .window_ends_at(view.place(ticket.number)?, window)?,
        };
        (end != u64::MAX && view.state.halted_at.is_none())
            .then(|| end.saturating_sub(view.redis_now_ms()))
    }

    /// Whether any of `variant` of `activity` was left when last read (true when not read:
    /// only a reading of none says no).
    pub fn variant_left(&self, activity: &str, variant: &str) -> bool {
        self.variant_left
            .read()
            .get(format!("{activity}~{variant}").as_str())
            .is_none_or(|&n| n > 0)
    }

    /// Each variant of `activity` and whether any of it is left, as last read.
    fn availability(&self, activity: &Activity) -> Vec<Availability> {
        if !activity.has_variants() {
            return Vec::new();
        }
        let left = self.variant_left.read();
        activity
            .variants
            .iter()
            .map(|v| Availability {
                id: v.id.clone(),
                title: v.title.clone().unwrap_or_else(|| v.id.to_string()),
                available: left
                    .get(format!("{}~{}", activity.id, v.id).as_str())
                    .is_none_or(|&n| n > 0),
            })
            .collect()
    }

    /// The queue as last read, read now if nothing was read lately.
    async fn current_view(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
    ) -> Result<View, Decision> {
        if let Some(view) = self.view(activity) {
            return Ok(view);
        }
        self.read(activity, queue, store::Rewrite::default())
            .await
            .map_err(|e| {
                tracing::warn!(activity = %activity.id, error = %e, "queue state not read");
                Decision::Unavailable
            })?;
        self.view(activity).ok_or(Decision::Unavailable)
    }

    /// The ticket presented, if it is this buyer's for this activity and of the queue as it is
    /// now (a ticket of a queue Redis lost, set up again since, holds no place in this one: the
    /// buyer is given a new ticket, as if they had none), and whether a cookie's ticket was
    /// set aside as not the buyer's. A cookie's ticket of another activity is ignored, and any
    /// other cookie ticket not the buyer's is replaced (see [`Presented::from_cookie`]); a
    /// header's ticket that is not the buyer's is refused.
    async fn kept(
        &self,
        key: &[u8; 32],
        activity: &Activity,
        queue: &QueueSettings,
        user: &str,
        presented: Option<&Presented>,
    ) -> Result<(Option<(Ticket, String)>, bool), Decision> {
        let Some(p) = presented else {
            return Ok((None, false));
        };
        let ticket = match ticket::verify(key, &activity.id, user, &p.ticket) {
            Ok(ticket) => ticket,
            Err(ticket::Invalid::OtherActivity) if p.from_cookie => return Ok((None, false)),
            Err(_) if p.from_cookie => return Ok((None, true)),
            Err(_) => return Err(Decision::InvalidTicket),
        };
        // Nothing read lately (just started, or the store was away): read now.
        let current = self.current_view(activity, queue).await?.state.epoch == ticket.epoch;
        if !current {
            tracing::warn!(activity = %activity.id,
                "a ticket of a queue Redis lost (set up again since): issuing a new one");
            return Ok((None, false));
        }
        Ok((Some((ticket, p.ticket.clone())), false))
    }

    /// Where a ticket stands. Redis's queue may run on an earlier start than this
    /// configuration's (a sale postponed, this gateway reloaded first): nobody buys before the
    /// configured start, by Redis's clock (estimated from the last read), not this gateway's.
    /// A buyer new to the queue told they are likely too late is counted.
    fn status(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        ticket: Ticket,
        honoured: bool,
    ) -> Result<Status, Decision> {
        let view = self.view(activity).ok_or(Decision::Unavailable)?;
        let mut status = view.status(ticket.number, queue);
        let until_start = activity.opens().timestamp_millis() - view.redis_now_ms() as i64;
        if status == Status::YourTurn && until_start > 0 {
            let until_start = until_start as u64;
            status = Status::Waiting {
                position: 1,
                estimated_wait_ms: until_start,
                refresh_after_ms: until_start.clamp(1_000, 30_000),
                likely_too_late: false,
                drawn: true,
                paused: false,
            };
        }
        let too_late = matches!(
            status,
            Status::Waiting {
                likely_too_late: true,
                ..
            }
        );
        if too_late && !honoured {
            self.metrics
                .queue_too_late
                .with_label_values(&[&activity.id])
                .inc();
        }
        Ok(status)
    }

    /// The first time this process sees a ticket admitted: counted, and its wait observed.
    fn count_admitted(&self, activity: &Activity, queue: &QueueSettings, ticket: Ticket) {
        let key = (activity.id.clone(), ticket.number);
        if self.admitted.contains_key(&key) {
            return;
        }
        self.admitted.insert(key, ());
        if queue.draw {
            self.record_place(activity, ticket.number);
        }
        let label = &*activity.id;
        self.metrics
            .queue_admitted
            .with_label_values(&[label])
            .inc();
        if let Some(view) = self.view(activity) {
            let waited = view.redis_now_ms().saturating_sub(ticket.issued_ms);
            self.metrics
                .queue_wait
                .with_label_values(&[label])
                .observe(waited as f64 / 1000.0);
        }
    }

    /// The queue's state read from Redis now (admin API).
    pub async fn read_fresh(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
    ) -> Result<View, StoreError> {
        self.read(activity, queue, store::Rewrite::default())
            .await?;
        Ok(self.state(activity).expect("just read"))
    }

    /// Pauses or resumes the cursor, or changes its rate, for the whole fleet.
    pub async fn control(
        &self,
        activity: &Activity,
        control: store::Control,
    ) -> Result<View, StoreError> {
        let state = self.store.control(activity, control).await?;
        let known = self.views.read().get(&activity.id).and_then(|v| v.left);
        let view = View::new(state, known);
        self.learn(activity, view.clone());
        Ok(view)
    }
}

#[cfg(test)]
mod tests;
