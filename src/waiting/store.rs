//! The waiting room's keys and scripts in Redis: `<prefix>:{<id>}:q` (the queue's state) and
//! `<prefix>:{<id>}:q:tickets` (user -> ticket number), on the activity's own hash tag (one
//! Cluster slot, with an unsegmented activity's stock). Scripts in `lua/queue_*.lua`, with
//! `lib.lua` and `queue_lib.lua` prepended; every call bounded by the store's time budget.

use super::view::{QueueState, STATE_FIELDS};
use crate::config::{Activity, QueueSettings};
use crate::stock::clock::RedisClock;
use crate::stock::prelude::*;
use crate::stock::{Layout, LedgerRow, ScriptName, Segment, StockStore, StoreError, StoreOp};
use std::future::Future;

use super::draw::{self, Seed};
use crate::stock::scripts::{
    QUEUE_CONTROL as CONTROL, QUEUE_PLACE as PLACE, QUEUE_POLL as POLL, QUEUE_STATE as STATE,
    QUEUE_TICKET as TICKET,
};

/// Random values offered to the queue scripts: the epoch is taken only by a queue set up now,
/// the draw's seed only by a queue that has none yet (set up now, or by an older flashgate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fresh {
    pub epoch: u64,
    pub seed: Seed,
}

impl Fresh {
    /// New random values (the epoch within Lua's exact integers).
    pub fn random() -> Fresh {
        Fresh {
            epoch: uuid::Uuid::new_v4().as_u64_pair().0 >> 11,
            seed: draw::random_seed(),
        }
    }

    /// Fixed values (tests).
    pub fn fixed(n: u64) -> Fresh {
        Fresh {
            epoch: n,
            seed: draw::legacy_seed(n),
        }
    }
}

/// The store calls the waiting room makes: [`StockStore`] in the gateway (the functions below),
/// an in-process fake in the unit tests (`super::fake`).
pub trait QueueStore: Send + Sync + 'static {
    /// Redis's clock as last read (see [`StockStore::clock`]).
    fn clock(&self) -> &RedisClock;

    /// See [`tickets`].
    fn tickets(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        asks: &[Ask],
        fresh: &Fresh,
    ) -> impl Future<Output = Result<(QueueState, Vec<Issued>), StoreError>> + Send;

    /// See [`state`].
    fn state(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        fresh: &Fresh,
        rewrite: Rewrite,
        left: Option<i64>,
    ) -> impl Future<Output = Result<(QueueState, Option<i64>), StoreError>> + Send;

    /// See [`control`].
    fn control(
        &self,
        activity: &Activity,
        control: Control,
    ) -> impl Future<Output = Result<QueueState, StoreError>> + Send;

    /// See [`fate`].
    fn fate(
        &self,
        activity: &Activity,
        place: u64,
        touch: Touch,
    ) -> impl Future<Output = Result<Fate, StoreError>> + Send;

    /// See [`record_place`].
    fn record_place(&self, place: Placed) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One segment's ledger (see [`StockStore::ledger`]): a segmented activity's units left.
    fn ledger(
        &self,
        segment: Segment<'_>,
        version: u64,
    ) -> impl Future<Output = Result<LedgerRow, StoreError>> + Send;

    /// The units a buyer holds in their home segment (see [`StockStore::units_held`]): a
    /// buyer holding some bought, whichever gateway relayed it.
    fn units_held(
        &self,
        activity: &Activity,
        user: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl QueueStore for StockStore {
    fn clock(&self) -> &RedisClock {
        StockStore::clock(self)
    }

    async fn tickets(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        asks: &[Ask],
        fresh: &Fresh,
    ) -> Result<(QueueState, Vec<Issued>), StoreError> {
        tickets(self, activity, queue, asks, fresh).await
    }

    async fn state(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        fresh: &Fresh,
        rewrite: Rewrite,
        left: Option<i64>,
    ) -> Result<(QueueState, Option<i64>), StoreError> {
        state(self, activity, queue, fresh, rewrite, left).await
    }

    async fn control(
        &self,
        activity: &Activity,
        control: Control,
    ) -> Result<QueueState, StoreError> {
        self::control(self, activity, control).await
    }

    async fn fate(
        &self,
        activity: &Activity,
        place: u64,
        touch: Touch,
    ) -> Result<Fate, StoreError> {
        fate(self, activity, place, touch).await
    }

    async fn record_place(&self, place: Placed) -> Result<(), StoreError> {
        record_place(self, place).await
    }

    async fn ledger(&self, segment: Segment<'_>, version: u64) -> Result<LedgerRow, StoreError> {
        LedgerScript::ledger(self, segment, version).await
    }

    async fn units_held(&self, activity: &Activity, user: &str) -> Result<u64, StoreError> {
        let layout = Layout::of(activity);
        StockStore::units_held(self, layout.home(user), user).await
    }
}

/// An operator's change to a queue (admin API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Pause,
    Resume,
    Rate(u32),
}

fn stepped_keys(store: &StockStore, activity: &Activity) -> [String; 3] {
    store
        .keys()
        .base(&Layout::new(activity.id.clone(), 1))
        .queue_stepped()
}

pub(super) fn keys(store: &StockStore, activity: &Activity) -> (String, String) {
    let layout = Layout::new(activity.id.clone(), 1);
    let base = store.keys().base(&layout);
    (base.queue(), base.queue_tickets())
}

/// What a reload of this gateway changed in a queue's configuration, to be written to Redis
/// at the next state read (until one succeeds) even where Redis has otherwise: the rate (an
/// operator's change at the admin API stands otherwise), and the start (moved earlier only
/// while the queue has not opened; see `queue_reschedule` in lua/queue_lib.lua). A restart
/// writes neither: it cannot tell a newer file from an older one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rewrite {
    pub rate: bool,
    pub start: bool,
    /// A reload applied the start unchanged here (this process may have started with it): an
    /// earlier start is written as `start` would (before the room opened), a later one only as
    /// any gateway's is (past a superseded start).
    pub advance: bool,
}

impl Rewrite {
    /// Nothing to write: Redis's values stand.
    pub const NONE: Rewrite = Rewrite {
        rate: false,
        start: false,
        advance: false,
    };
    /// The configured rate.
    pub const RATE: Rewrite = Rewrite {
        rate: true,
        start: false,
        advance: false,
    };
    /// The configured start.
    pub const START: Rewrite = Rewrite {
        rate: false,
        start: true,
        advance: false,
    };
    /// The configured start, applied by a reload that did not change it here.
    pub const ADVANCE: Rewrite = Rewrite {
        rate: false,
        start: false,
        advance: true,
    };
}

pub(super) fn start_ms(activity: &Activity) -> i64 {
    activity.opens().timestamp_millis()
}

fn parse(reply: &[String]) -> Result<QueueState, StoreError> {
    QueueState::parse(reply).ok_or_else(|| StoreError::protocol(ScriptName::Queue, reply.join("|")))
}

/// A proof-of-work solution spent with a ticket (once: its challenge is written until it
/// expires).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    /// The solved challenge (hex).
    pub challenge: String,
    /// Until when it could be sent (unix ms): kept as spent until then. Checked again in the
    /// script by Redis's clock (the gateway checked it against its last read of Redis's time).
    pub expires_ms: u64,
    /// The queue epoch it is bound to: checked again in the script against the queue as it is
    /// (the gateway checked it against its last read of the queue).
    pub epoch: u64,
    /// Refuse one spent before (else, shadow mode, only report it).
    pub enforce: bool,
}

/// What asking for a ticket got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Issued {
    /// The user's ticket number; `fresh`: issued now (else they had it already); `spent`: the
    /// solution given had been spent before (shadow mode only: else [`Issued::Spent`]).
    Ticket {
        number: u64,
        fresh: bool,
        spent: bool,
    },
    /// The solution given was spent before: no ticket.
    Spent,
    /// The queue is not open yet by Redis's clock (the asking gateway's clock runs ahead).
    NotOpen,
    /// The sale closed by Redis's clock.
    Closed,
}

/// One buyer asking for a ticket, in a batch ([`tickets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub user: String,
    /// The proof-of-work solution spent with it, if any.
    pub spend: Option<Spend>,
}

/// The most asks one ticket call carries. Measured in instructions Redis executes (callgrind,
/// `scripts/redis-cost`): see BENCHMARKS.md; a batch of 64 holds Redis for well under 1 ms.
pub const MAX_TICKET_BATCH: usize = 64;

/// The user's ticket (issued now if they had none, and the queue is open by Redis's clock),
/// and the queue's state: a batch of one.
pub async fn ticket(
    store: &StockStore,
    activity: &Activity,
    queue: &QueueSettings,
    user: &str,
    fresh: &Fresh,
    spend: Option<&Spend>,
) -> Result<(QueueState, Issued), StoreError> {
    let ask = Ask {
        user: user.to_owned(),
        spend: spend.cloned(),
    };
    let (state, mut issued) = tickets(store, activity, queue, &[ask], fresh).await?;
    Ok((state, issued.pop().expect("one answer an ask")))
}

/// Each ask's ticket, in order, in one script call (`lua/queue_ticket.lua`): each answered as
/// if it had come alone at the call's time (a user asking twice in one batch is told the same
/// number, issued by the first ask); and the queue's state after the batch.
pub async fn tickets(
    store: &StockStore,
    activity: &Activity,
    queue: &QueueSettings,
    asks: &[Ask],
    fresh: &Fresh,
) -> Result<(QueueState, Vec<Issued>), StoreError> {
    let (q, tickets) = keys(store, activity);
    let [seen, ..] = stepped_keys(store, activity);
    let mut invocation = TICKET.prepare_invoke();
    invocation.key(q).key(tickets).key(seen);
    invocation
        .arg(queue.admit_per_second)
        .arg(start_ms(activity))
        .arg(fresh.epoch)
        .arg(store.expire_at(activity))
        .arg(queue.opens_at.timestamp_millis())
        .arg(activity.ends_at.timestamp_millis())
        .arg(draw::seed_hex(&fresh.seed))
        .arg(draw::commitment(&fresh.seed));
    let layout = Layout::new(activity.id.clone(), 1);
    let mut solution_keys = 3;
    for ask in asks {
        invocation.arg(&ask.user);
        match &ask.spend {
            Some(spend) => {
                solution_keys += 1;
                invocation.key(store.keys().base(&layout).queue_solution(&spend.challenge));
                invocation
                    .arg(solution_keys)
                    .arg(spend.expires_ms)
                    .arg(if spend.enforce { "1" } else { "0" })
                    .arg(spend.epoch);
            }
            None => {
                invocation.arg(0).arg(0).arg("").arg("");
            }
        }
    }
    store.redis().observe_batch(ScriptName::Queue, asks.len());
    let reply: Vec<String> = store
        .eval(ScriptName::Queue, StoreOp::Queue, &invocation)
        .await?;
    let state = parse(&reply)?;
    let issued = issued(&reply[STATE_FIELDS..], asks.len())
        .ok_or_else(|| StoreError::protocol(ScriptName::Queue, reply.join("|")))?;
    Ok((state, issued))
}

/// The asks' answers in a ticket reply (after the state): `0 early` or `0 late` for all, or
/// three values an ask.
fn issued(rest: &[String], asks: usize) -> Option<Vec<Issued>> {
    let all = match rest {
        [zero, why] if zero == "0" && why == "early" => Some(Issued::NotOpen),
        [zero, why] if zero == "0" && why == "late" => Some(Issued::Closed),
        _ => None,
    };
    if let Some(all) = all {
        return Some(vec![all; asks]);
    }
    if rest.len() != asks * 3 {
        return None;
    }
    rest.chunks_exact(3)
        .map(|one| match (one[0].parse::<u64>().ok()?, one[1].as_str()) {
            (0, "used") => Some(Issued::Spent),
            (number, fresh @ ("0" | "1")) if number > 0 => Some(Issued::Ticket {
                number,
                fresh: fresh == "1",
                spent: one[2] == "1",
            }),
            _ => None,
        })
        .collect()
}

/// Reads the queue's state (setting it up the first time, drawing the pre-queue once the start
/// passed, holding the cursor while nothing is left). `left`: units left over all segments,
/// for a segmented activity (an unsegmented one's stock key is read in the script).
/// `rewrite`: what a reload of this gateway changed (written even where Redis has otherwise).
/// Also answers the units left, where known.
pub async fn state(
    store: &StockStore,
    activity: &Activity,
    queue: &QueueSettings,
    fresh: &Fresh,
    rewrite: Rewrite,
    left: Option<i64>,
) -> Result<(QueueState, Option<i64>), StoreError> {
    let (q, tickets) = keys(store, activity);
    let layout = Layout::of(activity);
    let stock_key = store
        .keys()
        .of(layout.segment(0).expect("one segment at least"))
        .stock(activity.version);
    let halt = store
        .keys()
        .base(&Layout::new(activity.id.clone(), 1))
        .halt();
    let mut invocation = STATE.prepare_invoke();
    // A segmented activity's stock is in other slots: only the queue's keys are passed.
    invocation.key(q).key(tickets).key(halt);
    for key in stepped_keys(store, activity) {
        invocation.key(key);
    }
    // Likewise an activity with variants: each variant's stock is a lane of its own.
    let elsewhere = activity.is_segmented() || activity.has_variants();
    if !elsewhere {
        invocation.key(stock_key);
    }
    invocation
        .arg(queue.admit_per_second)
        .arg(start_ms(activity))
        .arg(fresh.epoch)
        .arg(store.expire_at(activity))
        .arg(if rewrite.rate { "1" } else { "0" })
        .arg(match (elsewhere, left) {
            (true, Some(left)) => left.to_string(),
            // Not known yet: say nothing about holding.
            (true, None) => "-1".to_owned(),
            (false, _) => String::new(),
        })
        .arg(draw::seed_hex(&fresh.seed))
        .arg(draw::commitment(&fresh.seed));
    match queue.stepped {
        Some(stepped) => invocation
            .arg(
                stepped
                    .skip_absent_after
                    .map_or(0, |d| d.as_millis() as u64),
            )
            .arg(stepped.max_active.unwrap_or(0))
            .arg(queue.admission_window.as_millis() as u64),
        // A queue already stepped keeps stepping (see lua/queue_state.lua): its window counts.
        None => invocation
            .arg("")
            .arg(0)
            .arg(queue.admission_window.as_millis() as u64),
    };
    invocation.arg(match (rewrite.start, rewrite.advance) {
        (true, _) => "1",
        (false, true) => "2",
        (false, false) => "0",
    });
    let reply: Vec<String> = store
        .eval(ScriptName::Queue, StoreOp::Queue, &invocation)
        .await?;
    let state = parse(&reply)?;
    let left = reply
        .get(STATE_FIELDS)
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n >= 0);
    Ok((state, left))
}

/// A pre-queue ticket admitted at its drawn place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub activity: std::sync::Arc<str>,
    /// The sale's end (the record expires with the activity's keys).
    pub ends_at: chrono::DateTime<chrono::Utc>,
    pub number: u64,
    pub place: u64,
}

/// Records the place a pre-queue ticket was admitted at (the first gateway's; once).
pub async fn record_place(store: &StockStore, placed: Placed) -> Result<(), StoreError> {
    let layout = Layout::new(placed.activity.clone(), 1);
    let mut invocation = PLACE.prepare_invoke();
    invocation
        .key(store.keys().base(&layout).queue_places())
        .arg(placed.number)
        .arg(placed.place)
        .arg(store.expire_after(placed.ends_at));
    let _: i64 = store
        .eval(ScriptName::Queue, StoreOp::Queue, &invocation)
        .await?;
    Ok(())
}

/// Pauses or resumes the cursor, or changes the rate.
pub async fn control(
    store: &StockStore,
    activity: &Activity,
    control: Control,
) -> Result<QueueState, StoreError> {
    let (q, _) = keys(store, activity);
    let mut invocation = CONTROL.prepare_invoke();
    invocation.key(q);
    match control {
        Control::Pause => invocation.arg("pause"),
        Control::Resume => invocation.arg("resume"),
        Control::Rate(rate) => invocation.arg("rate").arg(rate),
    };
    let reply: Vec<String> = store
        .eval(ScriptName::Queue, StoreOp::Queue, &invocation)
        .await?;
    parse(&reply)
}

/// What a stepped poll does besides reading its place's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// A poll or a purchase attempt: an undecided place is recorded as watched now.
    Poll,
    /// The holder's purchase won: the place leaves `active` (a place for the next buyer).
    Bought,
}

/// A place's fate in a stepped queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The cursor has not reached it yet.
    Undecided,
    /// Admitted at this Redis time (unix ms): its window runs from there.
    Admitted { at_ms: u64 },
    /// Its turn came while its ticket was absent (not polled for `skip_absent_after_secs`):
    /// given away.
    Skipped,
}

/// Reads `place`'s fate in a stepped queue (`lua/queue_poll.lua`), recording the poll or the
/// purchase as `touch` says.
pub async fn fate(
    store: &StockStore,
    activity: &Activity,
    place: u64,
    touch: Touch,
) -> Result<Fate, StoreError> {
    let [seen, adm, active] = stepped_keys(store, activity);
    let mut invocation = POLL.prepare_invoke();
    invocation
        .key(seen)
        .key(adm)
        .key(active)
        .arg(match touch {
            Touch::Poll => "poll",
            Touch::Bought => "bought",
        })
        .arg(place)
        .arg(store.expire_at(activity));
    let reply: Vec<String> = store
        .eval(ScriptName::Queue, StoreOp::Queue, &invocation)
        .await?;
    match reply.first().map(String::as_str) {
        Some("") => Ok(Fate::Undecided),
        Some("s") => Ok(Fate::Skipped),
        Some(at) => at
            .parse()
            .map(|at_ms| Fate::Admitted { at_ms })
            .map_err(|_| StoreError::protocol(ScriptName::Queue, reply.join("|"))),
        None => Err(StoreError::protocol(ScriptName::Queue, reply.join("|"))),
    }
}
