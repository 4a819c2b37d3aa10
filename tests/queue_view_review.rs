//! The fourth review of the waiting room (postponement marks): each reply below is what
//! lua/queue_state.lua answers on a real redis-server (lib.lua + queue_lib.lua +
//! queue_state.lua, driven by redis-cli EVAL), fed to the gateway's view logic as a gateway
//! reading it at the new start would. Each failed on 1d0de0b.

use chrono::Utc;
use flashgate::config::QueueSettings;
use flashgate::waiting::view::{QueueState, Status, View};
use std::time::Duration;

fn settings(rate: u32, window_secs: u64) -> QueueSettings {
    QueueSettings {
        admit_per_second: rate,
        opens_at: Utc::now(),
        admission_window: Duration::from_secs(window_secs),
        too_late_factor: 1.5,
        landing_url: None,
    }
}

/// A state reply (queue_reply): seq start rate base t0 paused held drawn seed now epoch hist lapsed.
fn reply(start: u64, rate: u64, base: u64, now: u64, hist: &str) -> QueueState {
    let r: Vec<String> = [
        "0".to_string(),
        start.to_string(),
        rate.to_string(),
        base.to_string(),
        start.to_string(),
        "0".into(),
        "0".into(),
        "0".into(),
        "12345".into(),
        now.to_string(),
        "1".into(),
        hist.to_string(),
        "0".into(),
    ]
    .to_vec();
    QueueState::parse(&r).expect("reply parses")
}

/// Two postponements, the second arriving while the first still stands the cursor:
/// start S0 passed, rate 10/s; at p1 = ...135043 (cursor 3) the start moves to ...138024; at
/// ...135558 (before ...138024) it moves again, to ...143545; the second mark carries that
/// postponement too (on 1d0de0b it did not: the shift stopped at the first postponement's
/// start). Place 3 was reached at ...135023 with 1980 ms of its 2 s window left at p1; nobody
/// can buy until ...143545, so its window must still be open then.
#[test]
fn a_second_postponement_during_the_first_does_not_eat_an_admitted_window() {
    let hist = "1796126134723,0,10,1;1796126138024,3,10,1,1796126135043;\
                1796126143545,3,10,1,1796126135558";
    let s = reply(1796126143545, 10, 3, 1796126143545, hist);
    let v = View::new(s.clone(), None);
    let q = settings(10, 2);
    assert_eq!(
        v.status(3, &q),
        Status::YourTurn,
        "place 3 had 1980 ms of window left when the sale was postponed; window opened at {:?}",
        s.window_ends_at(3, 2_000)
    );
}

/// One postponement, at rate 1000/s: the place the cursor reached in the very millisecond of
/// the postponement (place 311, reached at ...146893 = p) is not shifted (`at < postponed` is
/// strict), although its whole window was still ahead of it. At rate r this hits the last
/// admitted place with probability about r/1000 per postponement (always at 1000/s).
#[test]
fn the_place_reached_at_the_postponement_keeps_its_window() {
    let hist = "1796126146582,0,1000,1;1796126151883,311,1000,1,1796126146893";
    let s = reply(1796126151883, 1000, 311, 1796126151883, hist);
    let v = View::new(s.clone(), None);
    let q = settings(1000, 2);
    assert_eq!(
        v.status(310, &q),
        Status::YourTurn,
        "reached 1 ms before: shifted"
    );
    assert_eq!(
        v.status(311, &q),
        Status::YourTurn,
        "reached at the postponement, its 2 s window all ahead; opened at {:?}",
        s.window_ends_at(311, 2_000)
    );
}

/// A postponement revives a ticket a gateway already told was expired. Rate 10/s from
/// ...134723; place 1 reached at ...134823, its 2 s window ends at ...136823. The sale is
/// postponed at p = ...136800 (23 ms before that) to ...140000 (queue_reschedule writes
/// "140000,20,10,1,136800": cursor floor(2077 * 10 / 1000) = 20). A gateway that last read at
/// ...136700 (before p; reads are 250 ms apart) answers at ...136850: 410 ticket_expired. Its
/// next read shifts place 1's window to ...138023..140023: at the new start the same ticket is
/// your_turn and buys. (Before 1d0de0b a window never moved, so a stale read could not undo an
/// expiry.)
#[test]
fn a_ticket_told_expired_stays_expired_across_a_postponement() {
    let q = settings(10, 2);
    // The stale read: taken at ...136700, evaluated 150 ms later.
    let stale = reply(1796126134723, 10, 0, 1796126136850, "1796126134723,0,10,1");
    let stale = QueueState {
        t0_ms: 1796126134723,
        ..stale
    };
    assert_eq!(View::new(stale, None).status(1, &q), Status::Expired);
    // The next read, evaluated at the new start.
    let fresh = reply(
        1796126140000,
        10,
        20,
        1796126140000,
        "1796126134723,0,10,1;1796126140000,20,10,1,1796126136800",
    );
    assert_eq!(
        View::new(fresh, None).status(1, &q),
        Status::Expired,
        "a lapsed ticket stays lapsed"
    );
}
