//! The waiting room against the in-process queue fake (`super::fake`): refresh, gate and poll,
//! from what the store answers (or fails to). Redis's clock is the fake's, set by each test;
//! the scripts are proven against Redis by tests/queue_model.rs and the e2e suite.

use super::fake::QueueFake;
use super::*;
use crate::stock::Layout;
use chrono::{DateTime, Utc};

/// The sale's start (`a1` and `seg`).
fn start() -> DateTime<Utc> {
    "2030-01-01T00:00:00Z".parse().unwrap()
}

fn settings(rate: u32) -> Settings {
    crate::config::testing::settings(&format!(
        r#"  - {{ id: a1, stock: 10, version: 1, per_user_limit: 5, max_per_request: 1, starts_at: "2030-01-01T00:00:00Z", ends_at: "2030-01-02T00:00:00Z", hold_secs: 900, queue: {{ admit_per_second: {rate}, opens_at: "2029-12-31T23:00:00Z", admission_window_secs: 60 }} }}
  - {{ id: seg, stock: 4, version: 1, per_user_limit: 5, max_per_request: 1, starts_at: "2030-01-01T00:00:00Z", ends_at: "2030-01-02T00:00:00Z", hold_secs: 900, segments: 2, queue: {{ admit_per_second: 1 }} }}
  - {{ id: plain, stock: 10, version: 1, per_user_limit: 5, max_per_request: 1, starts_at: "2030-01-01T00:00:00Z", ends_at: "2030-01-02T00:00:00Z", hold_secs: 900 }}
"#
    ))
}

struct Harness {
    store: Arc<QueueFake>,
    room: WaitingRoom<QueueFake>,
    metrics: Arc<Metrics>,
    settings: Settings,
}

impl Harness {
    /// Redis's clock at the start plus `ms` (half a place into the second, so the cursor is
    /// not on the edge of a place while the test runs).
    fn at(ms: u64) -> Harness {
        let store = Arc::new(QueueFake::default());
        store.set_now(start() + chrono::Duration::milliseconds(ms as i64));
        let metrics = Arc::new(Metrics::new());
        Harness {
            room: WaitingRoom::new(store.clone(), metrics.clone()),
            store,
            metrics,
            settings: settings(1),
        }
    }

    fn activity(&self, id: &str) -> Arc<Activity> {
        self.settings.activities.get(id).unwrap().clone()
    }

    async fn gate(&self, user: &str, presented: Option<&Presented>) -> Turn {
        let a1 = self.activity("a1");
        self.room
            .gate(&self.settings, &a1, user, presented, None)
            .await
    }

    /// The ticket a gate handed out while making the buyer wait.
    async fn waiting_ticket(&self, user: &str) -> String {
        match self.gate(user, None).await {
            Turn::Wait(answer) => answer.ticket,
            other => panic!("{other:?}"),
        }
    }

    fn admitted(&self) -> u64 {
        self.metrics.queue_admitted.with_label_values(&["a1"]).get()
    }
}

fn header(ticket: &str) -> Presented {
    Presented {
        ticket: ticket.to_owned(),
        from_cookie: false,
    }
}

#[tokio::test]
async fn no_queue_or_outside_its_hours_passes() {
    let h = Harness::at(10_500);
    let plain = h.activity("plain");
    assert_eq!(
        h.room.gate(&h.settings, &plain, "u1", None, None).await,
        Turn::Pass
    );
    h.store.set_now("2029-12-31T22:59:59Z".parse().unwrap());
    assert_eq!(h.gate("u1", None).await, Turn::Pass, "not open yet");
    h.store.set_now("2030-01-02T00:00:00Z".parse().unwrap());
    assert_eq!(h.gate("u1", None).await, Turn::Pass, "closed");
    assert_eq!(h.store.asked.lock().tickets, 0, "no store call");
}

#[tokio::test]
async fn a_buyer_without_a_ticket_gets_one_and_waits() {
    let h = Harness::at(10_500);
    // The queue is set up now (its cursor runs from now) and nobody comes for ten seconds.
    h.room.refresh(&h.settings).await;
    h.store.advance(Duration::from_secs(10));
    let Turn::Wait(answer) = h.gate("u1", None).await else {
        panic!("a ticket")
    };
    // The cursor passed everyone (at 10): the ticket takes the next place.
    let ticket = ticket::verify(&h.settings.signing.ticket_key, "a1", "u1", &answer.ticket);
    assert_eq!(ticket.unwrap().number, 11);
    assert!(
        matches!(answer.status, Status::Waiting { position: 1, .. }),
        "{:?}",
        answer.status
    );
    let tickets = h.metrics.queue_tickets.with_label_values(&["a1"]);
    assert_eq!(tickets.get(), 1);
    // Asked again without it: the same ticket, from memory.
    assert_eq!(h.waiting_ticket("u1").await, answer.ticket);
    assert_eq!(h.store.asked.lock().tickets, 1);
    assert_eq!(tickets.get(), 1);
}

#[tokio::test]
async fn a_ticket_whose_turn_came_passes_and_is_counted_once() {
    let h = Harness::at(10_500);
    let raw = h.waiting_ticket("u1").await;
    assert!(matches!(
        h.gate("u1", Some(&header(&raw))).await,
        Turn::Wait(_)
    ));
    h.store.advance(Duration::from_secs(1));
    h.room.refresh(&h.settings).await;
    assert_eq!(h.gate("u1", Some(&header(&raw))).await, Turn::Pass);
    assert_eq!(h.gate("u1", Some(&header(&raw))).await, Turn::Pass);
    assert_eq!(h.admitted(), 1, "counted once");
    // Someone else's ticket is not theirs.
    let theirs = h.gate("u2", Some(&header(&raw))).await;
    assert_eq!(theirs, Turn::Refuse(Decision::InvalidTicket));
    // Past its admission window (60 s) it has lapsed.
    h.store.advance(Duration::from_secs(61));
    h.room.refresh(&h.settings).await;
    let lapsed = h.gate("u1", Some(&header(&raw))).await;
    assert_eq!(lapsed, Turn::Refuse(Decision::TicketExpired));
    let counted = h.metrics.queue_lapsed.with_label_values(&["a1"]);
    assert_eq!(counted.get(), 1);
}

#[tokio::test]
async fn forged_and_foreign_tickets() {
    let h = Harness::at(10_500);
    let forged = h.gate("u1", Some(&header("t1.a1.1.2.3.4"))).await;
    assert_eq!(forged, Turn::Refuse(Decision::InvalidTicket));
    let key = &h.settings.signing.ticket_key;
    let other = ticket::Ticket {
        number: 1,
        issued_ms: 0,
        epoch: 0,
    };
    let foreign = ticket::sign(key, "seg", "u1", other);
    let from_header = h.gate("u1", Some(&header(&foreign))).await;
    assert_eq!(from_header, Turn::Refuse(Decision::InvalidTicket));
    // From the browser's one cookie: it queued elsewhere too; a ticket of its own is issued.
    let cookie = Presented {
        ticket: foreign,
        from_cookie: true,
    };
    let Turn::Wait(answer) = h.gate("u1", Some(&cookie)).await else {
        panic!("a new ticket")
    };
    assert!(ticket::verify(key, "a1", "u1", &answer.ticket).is_ok());
}

#[tokio::test]
async fn nothing_left_refuses_every_waiting_buyer() {
    let h = Harness::at(10_500);
    let a1 = h.activity("a1");
    let layout = Layout::of(&a1);
    let raw = h.waiting_ticket("u1").await;
    h.store.stock.on_sale(&layout, 1, 1);
    h.room.refresh(&h.settings).await;
    assert!(matches!(
        h.gate("u1", Some(&header(&raw))).await,
        Turn::Wait(_)
    ));
    h.store.stock.lose(layout.segment(0).unwrap(), 1, 1);
    h.room.refresh(&h.settings).await;
    let view = h.room.state(&a1).unwrap();
    assert!(view.state.held && view.left == Some(0));
    let sold_out = h.gate("u1", Some(&header(&raw))).await;
    assert_eq!(sold_out, Turn::Refuse(Decision::SoldOut));
    let standing = h
        .metrics
        .queue_paused
        .with_label_values(&["a1", "sold_out"]);
    assert_eq!(standing.get(), 1);
}

#[tokio::test]
async fn a_segmented_activitys_units_left_are_summed_and_never_guessed() {
    let h = Harness::at(10_500);
    let seg = h.activity("seg");
    let layout = Layout::of(&seg);
    let p1 = layout.segment(1).unwrap();
    h.store.stock.on_sale(&layout, 1, 4);
    h.room.refresh(&h.settings).await;
    assert_eq!(h.room.state(&seg).unwrap().left, Some(4));
    // Units in flight between two segments still count.
    h.store.stock.withdrawn(p1, 1, "t1", 0, 1);
    h.room.refresh(&h.settings).await;
    assert_eq!(h.room.state(&seg).unwrap().left, Some(4));
    // A segment that cannot say (its stock key gone): the last sum stands, nothing is held.
    h.store.stock.retire(p1, 1);
    h.room.refresh(&h.settings).await;
    let view = h.room.state(&seg).unwrap();
    assert_eq!(view.left, Some(4));
    assert!(!view.state.held);
}

#[tokio::test]
async fn a_reloaded_rate_is_written_until_a_write_succeeds() {
    let mut h = Harness::at(10_500);
    h.room.refresh(&h.settings).await;
    h.settings = settings(5);
    h.store.fail("state", 1);
    h.room.refresh(&h.settings).await;
    h.room.refresh(&h.settings).await;
    h.room.refresh(&h.settings).await;
    // Both queues are read each time (a1, then seg); a1's reads: as configured, failed (not
    // answered), the new rate written, as configured.
    let asked: Vec<bool> = h
        .store
        .asked
        .lock()
        .rewrite
        .iter()
        .map(|r| r.rate)
        .collect();
    assert_eq!(asked, [false, false, false, true, false, false, false]);
    assert!(h.store.asked.lock().rewrite.iter().all(|r| !r.start));
    let a1 = h.activity("a1");
    assert_eq!(h.room.state(&a1).unwrap().state.rate, 5);
}

#[tokio::test]
async fn a_ticket_of_a_queue_redis_lost_is_replaced() {
    let h = Harness::at(10_500);
    let a1 = h.activity("a1");
    let raw = h.waiting_ticket("u1").await;
    let epoch = h.room.state(&a1).unwrap().state.epoch;
    h.store.lose("a1");
    h.room.refresh(&h.settings).await;
    assert_ne!(h.room.state(&a1).unwrap().state.epoch, epoch);
    let Turn::Wait(answer) = h.gate("u1", Some(&header(&raw))).await else {
        panic!("a new ticket")
    };
    assert_ne!(answer.ticket, raw);
    let key = &h.settings.signing.ticket_key;
    let number = ticket::verify(key, "a1", "u1", &answer.ticket)
        .unwrap()
        .number;
    assert_eq!(number, 1, "the first of the new queue");
}

#[tokio::test]
async fn redis_s_clock_decides_the_queue_s_hours() {
    let h = Harness::at(0);
    h.store.set_now("2029-12-31T23:00:01Z".parse().unwrap());
    // This gateway's estimate says open; Redis's clock is two seconds behind it.
    h.store.skew(chrono::Duration::seconds(-2));
    let early = h.gate("u1", None).await;
    assert_eq!(early, Turn::Refuse(Decision::NotStarted));
    h.store.skew(chrono::Duration::days(3));
    assert_eq!(h.gate("u1", None).await, Turn::Refuse(Decision::Ended));
}

#[tokio::test]
async fn a_store_failure_answers_unavailable() {
    let h = Harness::at(10_500);
    h.store.fail("ticket", 1);
    assert_eq!(
        h.gate("u1", None).await,
        Turn::Refuse(Decision::Unavailable)
    );
    assert!(matches!(h.gate("u1", None).await, Turn::Wait(_)));
}

#[tokio::test]
async fn polls() {
    let h = Harness::at(10_500);
    let (a1, plain) = (h.activity("a1"), h.activity("plain"));
    let unknown = h.room.poll(&h.settings, &plain, "u1", None, None).await;
    assert_eq!(unknown, Err(Decision::UnknownActivity));
    let answer = h
        .room
        .poll(&h.settings, &a1, "u1", None, None)
        .await
        .unwrap();
    assert!(matches!(answer.status, Status::Waiting { .. }));
    let polled = h.metrics.queue_polls.with_label_values(&["a1"]);
    assert_eq!(polled.get(), 1);
    h.store.set_now("2029-12-31T22:00:00Z".parse().unwrap());
    // An hour before the room opens (23:00): when it opens, as a purchase is told.
    let early = h.room.poll(&h.settings, &a1, "u2", None, None).await;
    let opens_at_ms = "2029-12-31T23:00:00Z"
        .parse::<chrono::DateTime<chrono::Utc>>()
        .unwrap()
        .timestamp_millis();
    assert_eq!(
        early,
        Err(Decision::NotOpenYet {
            opens_at_ms,
            in_secs: 3600
        })
    );
    h.store.set_now("2030-01-02T00:00:00Z".parse().unwrap());
    let late = h.room.poll(&h.settings, &a1, "u2", None, None).await;
    assert_eq!(late, Err(Decision::Ended));
    // A ticket holder is still answered after the close.
    let kept = header(&answer.ticket);
    assert!(h
        .room
        .poll(&h.settings, &a1, "u1", Some(&kept), None)
        .await
        .is_ok());
}

#[tokio::test]
async fn an_operator_pause_stands_the_cursor() {
    let h = Harness::at(10_500);
    let a1 = h.activity("a1");
    let raw = h.waiting_ticket("u1").await;
    let view = h.room.control(&a1, store::Control::Pause).await.unwrap();
    assert!(view.state.paused);
    let paused = h
        .metrics
        .queue_paused
        .with_label_values(&["a1", "operator"]);
    assert_eq!(paused.get(), 1);
    h.store.advance(Duration::from_secs(5));
    h.room.refresh(&h.settings).await;
    assert!(matches!(
        h.gate("u1", Some(&header(&raw))).await,
        Turn::Wait(_)
    ));
    h.room.control(&a1, store::Control::Resume).await.unwrap();
    h.store.advance(Duration::from_secs(1));
    h.room.refresh(&h.settings).await;
    assert_eq!(h.gate("u1", Some(&header(&raw))).await, Turn::Pass);
}

/// A buyer holding units of a sale bought it (through whichever gateway): once it is sold out
/// their poll reads `bought`, never `sold_out`; when Redis cannot say, `unavailable`.
#[tokio::test]
async fn a_buyer_holding_units_reads_bought_when_sold_out() {
    let h = Harness::at(10_500);
    let a1 = h.activity("a1");
    let layout = Layout::of(&a1);
    let (alice, bob) = (
        h.waiting_ticket("alice").await,
        h.waiting_ticket("bob").await,
    );
    h.store.stock.on_sale(&layout, 1, 1);
    h.store
        .stock
        .reserve_one(layout.home("alice"), "alice", 1, "r1");
    h.room.refresh(&h.settings).await;
    assert!(h.room.state(&a1).unwrap().state.held, "sold out");
    let poll = |user: &'static str, raw: String| {
        let (h, a1) = (&h, a1.clone());
        async move {
            let ticket = header(&raw);
            h.room
                .poll(&h.settings, &a1, user, Some(&ticket), None)
                .await
        }
    };
    assert_eq!(
        poll("bob", bob.clone()).await.unwrap().status,
        Status::SoldOut
    );
    h.store.fail("units_held", 1);
    assert_eq!(
        poll("alice", alice.clone()).await,
        Err(Decision::Unavailable)
    );
    assert_eq!(poll("alice", alice).await.unwrap().status, Status::Bought);
}
