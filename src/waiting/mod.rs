//! The waiting room (`activities[].queue`): while an activity's queue is open, a buyer without
//! a ticket is not sent to the reserve script but given a numbered ticket (one per user, issued
//! in Redis) and a place; the buyer comes back with it, and buys once the fleet-wide cursor
//! reaches that place. Stock-aware: an arrival too far behind the units left is told so at
//! once, every waiting buyer learns `sold_out` when nothing is left, and the cursor waits while
//! nothing is left, so units that come back go to the next tickets in line.
//!
//! - [`draw`]: the fair start (the pre-queue's places drawn at the start, checkably);
//! - [`ticket`]: tickets, signed and bound to the buyer and the activity;
//! - [`view`]: the queue as this gateway knows it (polls and admissions answered from memory);
//! - [`store`]: the keys and scripts in Redis;
//! - [`page`]: the JSON answer and the HTML waiting page.

pub mod draw;
pub mod page;
pub mod store;
pub mod ticket;
pub mod view;

use crate::admission::Decision;
use crate::config::{Activity, QueueSettings, Settings};
use crate::metrics::Metrics;
use crate::stock::{StockStore, StoreError};
use moka::sync::Cache;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use ticket::Ticket;
use view::{Status, View};

crate::label_enum! {
    /// Why a queue's cursor stands, as the `why` label of `flashgate_queue_paused`.
    pub enum Standing {
        /// An operator paused it (admin API).
        Operator => "operator",
        /// Nothing is left to sell: held until units come back.
        SoldOut => "sold_out",
    }
}

/// What the waiting room says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
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
    pub ticket: String,
    pub status: Status,
    /// Seconds until the ticket's cookie should expire (the sale's end).
    pub cookie_max_age_secs: u64,
}

/// Tickets admitted this process already counted (per activity, by number): bounded.
const SEEN_CAPACITY: u64 = 2_000_000;

pub struct WaitingRoom {
    store: Arc<StockStore>,
    metrics: Arc<Metrics>,
    views: RwLock<HashMap<Arc<str>, View>>,
    /// The rate each activity's queue was last configured with here: a reload that changes it
    /// writes the new rate to Redis (a restart does not: an operator's change stands).
    configured_rates: RwLock<HashMap<Arc<str>, u32>>,
    /// Tickets seen admitted by this process, counted once.
    admitted: Cache<(Arc<str>, u64), ()>,
    /// Units left over a segmented activity's segments, as the maintenance loop last summed.
    segmented_left: RwLock<HashMap<Arc<str>, i64>>,
}

/// How often each gateway reads each queue's state: a waiting buyer learns `sold_out` (or that
/// the rate or a pause changed) at most this late, plus their own refresh.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);

impl WaitingRoom {
    pub fn new(store: Arc<StockStore>, metrics: Arc<Metrics>) -> WaitingRoom {
        WaitingRoom {
            store,
            metrics,
            views: RwLock::default(),
            configured_rates: RwLock::default(),
            segmented_left: RwLock::default(),
            admitted: Cache::builder()
                .max_capacity(SEEN_CAPACITY)
                .time_to_live(Duration::from_secs(24 * 3600))
                .build(),
        }
    }

    /// Reads every configured queue's state (each gateway every [`REFRESH_INTERVAL`]: one
    /// script call per queue, whatever the number of buyers).
    pub async fn refresh(&self, settings: &Settings) {
        for activity in settings.activities.iter() {
            let Some(queue) = &activity.queue else {
                continue;
            };
            let set_rate = {
                let mut rates = self.configured_rates.write();
                let previous = rates.insert(activity.id.clone(), queue.admit_per_second);
                previous.is_some_and(|p| p != queue.admit_per_second)
            };
            match self.read(activity, queue, set_rate).await {
                Ok(()) => {}
                Err(e) => {
                    if set_rate {
                        // Try again next time.
                        self.configured_rates.write().remove(&activity.id);
                    }
                    tracing::warn!(activity = %activity.id, error = %e, "queue state not read");
                }
            }
        }
    }

    /// What the maintenance loop last summed over a segmented activity's segments (an
    /// unsegmented activity's stock is read by the queue script itself).
    pub fn note_left(&self, activity: &str, left: i64) {
        self.segmented_left
            .write()
            .insert(Arc::from(activity), left);
    }

    async fn read(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        set_rate: bool,
    ) -> Result<(), StoreError> {
        let known = if activity.is_segmented() {
            self.segmented_left.read().get(&activity.id).copied()
        } else {
            None
        };
        let (state, left) =
            store::state(&self.store, activity, queue, seed(), set_rate, known).await?;
        self.learn(activity, View::new(state, left));
        Ok(())
    }

    fn learn(&self, activity: &Activity, view: View) {
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
        self.views
            .read()
            .get(&activity.id)
            .filter(|v| v.read_at.elapsed() < view::STALE_AFTER)
            .cloned()
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
        presented: Option<&str>,
    ) -> Gate {
        let Some(queue) = activity.queue.as_ref() else {
            return Gate::Pass;
        };
        if !activity.queue_open_at(chrono::Utc::now()) {
            return Gate::Pass;
        }
        let key = &settings.signing.ticket_key;
        match self.answer(key, activity, queue, user, presented).await {
            Ok((answer, ticket)) => match answer.status {
                Status::YourTurn if presented.is_some() => {
                    self.count_admitted(activity, ticket);
                    Gate::Pass
                }
                Status::YourTurn | Status::Waiting { .. } => Gate::Wait(answer),
                Status::SoldOut => Gate::Refuse(Decision::SoldOut),
                Status::Expired if presented.is_some() => {
                    self.metrics
                        .queue_lapsed
                        .with_label_values(&[&activity.id])
                        .inc();
                    Gate::Refuse(Decision::TicketExpired)
                }
                Status::Expired => Gate::Refuse(Decision::TicketExpired),
            },
            Err(decision) => Gate::Refuse(decision),
        }
    }

    /// A ticket holder polling `GET /flashgate/queue/{activity}` (a browser without a ticket
    /// is given one, as a purchase would be).
    pub async fn poll(
        &self,
        settings: &Settings,
        activity: &Activity,
        user: &str,
        presented: Option<&str>,
    ) -> Result<Answer, Decision> {
        let Some(queue) = activity.queue.as_ref() else {
            return Err(Decision::UnknownActivity);
        };
        if !activity.queue_open_at(chrono::Utc::now()) && presented.is_none() {
            return Err(if chrono::Utc::now() >= activity.ends_at {
                Decision::Ended
            } else {
                Decision::NotStarted
            });
        }
        self.metrics
            .queue_polls
            .with_label_values(&[&activity.id])
            .inc();
        self.answer(
            &settings.signing.ticket_key,
            activity,
            queue,
            user,
            presented,
        )
        .await
        .map(|(answer, _)| answer)
    }

    /// Where `user` stands: from a presented ticket (checked, answered from memory), or from
    /// the ticket Redis issues (or already issued) them.
    async fn answer(
        &self,
        key: &[u8; 32],
        activity: &Activity,
        queue: &QueueSettings,
        user: &str,
        presented: Option<&str>,
    ) -> Result<(Answer, Ticket), Decision> {
        let (ticket, raw) = match presented {
            Some(raw) => {
                let ticket = ticket::verify(key, &activity.id, user, raw)
                    .map_err(|_| Decision::InvalidTicket)?;
                if self.view(activity).is_none() {
                    // Nothing read lately (just started, or the store was away): read now.
                    self.read(activity, queue, false).await.map_err(|e| {
                        tracing::warn!(activity = %activity.id, error = %e, "queue state not read");
                        Decision::Unavailable
                    })?;
                }
                (ticket, raw.to_owned())
            }
            None => {
                let (state, number, fresh) =
                    store::ticket(&self.store, activity, queue, user, seed())
                        .await
                        .map_err(|e| {
                            tracing::warn!(activity = %activity.id, error = %e, "no ticket issued");
                            Decision::Unavailable
                        })?;
                let known = self.view(activity).and_then(|v| v.left);
                self.learn(activity, View::new(state, known));
                if fresh {
                    self.metrics
                        .queue_tickets
                        .with_label_values(&[&activity.id])
                        .inc();
                }
                let ticket = Ticket {
                    number,
                    issued_ms: state.now_ms,
                };
                let raw = ticket::sign(key, &activity.id, user, ticket);
                (ticket, raw)
            }
        };
        let view = self.view(activity).ok_or(Decision::Unavailable)?;
        let status = view.status(ticket.number, queue);
        if presented.is_none() {
            if let Status::Waiting {
                likely_too_late: true,
                ..
            } = status
            {
                self.metrics
                    .queue_too_late
                    .with_label_values(&[&activity.id])
                    .inc();
            }
        }
        let ends_in = (activity.ends_at - chrono::Utc::now()).num_seconds().max(0) as u64;
        Ok((
            Answer {
                ticket: raw,
                status,
                cookie_max_age_secs: ends_in,
            },
            ticket,
        ))
    }

    /// The first time this process sees a ticket admitted: counted, and its wait observed.
    fn count_admitted(&self, activity: &Activity, ticket: Ticket) {
        let key = (activity.id.clone(), ticket.number);
        if self.admitted.contains_key(&key) {
            return;
        }
        self.admitted.insert(key, ());
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
        self.read(activity, queue, false).await?;
        Ok(self.state(activity).expect("just read"))
    }

    /// Pauses or resumes the cursor, or changes its rate, for the whole fleet.
    pub async fn control(
        &self,
        activity: &Activity,
        control: store::Control,
    ) -> Result<View, StoreError> {
        let state = store::control(&self.store, activity, control).await?;
        let known = self.views.read().get(&activity.id).and_then(|v| v.left);
        let view = View::new(state, known);
        self.learn(activity, view.clone());
        Ok(view)
    }
}

/// A fresh random seed, offered for the draw (Redis keeps the first one offered at the start).
fn seed() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0 >> 11
}
