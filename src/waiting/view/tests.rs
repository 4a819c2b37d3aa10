use super::*;
use chrono::Utc;

fn settings() -> QueueSettings {
    QueueSettings {
        admit_per_second: 10,
        opens_at: Utc::now(),
        admission_window: Duration::from_secs(2),
        too_late_factor: 1.5,
        landing_url: None,
        stepped: None,
        challenge: None,
        draw: false,
    }
}

fn state(now_ms: u64) -> QueueState {
    QueueState {
        seq: 100,
        start_ms: 10_000,
        rate: 10,
        base: 0,
        t0_ms: 10_000,
        paused: false,
        held: false,
        drawn: Some((0, draw::legacy_seed(1))),
        commitment: None,
        now_ms,
        epoch: 0,
        marks: vec![Mark {
            at_ms: 10_000,
            cursor: 0,
            rate: 10,
            running: true,
            postponed_at: None,
        }],
        lapsed: 0,
        halted_at: None,
        stepped: false,
        active: 0,
    }
}

#[test]
fn the_cursor_runs_at_the_rate_from_the_start_and_stops_when_paused_or_held() {
    let s = state(0);
    assert_eq!(s.cursor_at(5_000), 0, "before the start");
    assert_eq!(s.cursor_at(10_000), 0);
    assert_eq!(s.cursor_at(10_099), 0);
    assert_eq!(s.cursor_at(10_100), 1);
    assert_eq!(s.cursor_at(20_000), 100);
    let paused = QueueState {
        paused: true,
        base: 7,
        ..s.clone()
    };
    assert_eq!(paused.cursor_at(99_000), 7);
    let held = QueueState {
        held: true,
        base: 9,
        ..s
    };
    assert_eq!(held.cursor_at(99_000), 9);
}

#[test]
fn a_places_window_runs_from_when_it_was_reached_whatever_the_rate_did_since() {
    // 10/s from 10 s; at 20 s (cursor 100) an operator raised the rate to 1000/s.
    let s = QueueState {
        base: 100,
        t0_ms: 20_000,
        rate: 1000,
        marks: vec![
            Mark {
                at_ms: 10_000,
                cursor: 0,
                rate: 10,
                running: true,
                postponed_at: None,
            },
            Mark {
                at_ms: 20_000,
                cursor: 100,
                rate: 1000,
                running: true,
                postponed_at: None,
            },
        ],
        ..state(20_500)
    };
    assert_eq!(s.window_ends_at(50, 2_000), Some(17_000));
    assert_eq!(s.window_ends_at(100, 2_000), Some(22_000));
    assert_eq!(s.window_ends_at(150, 2_000), Some(22_050));
    let q = settings(); // a 2 s window
    let v = View::new(s.clone(), None);
    assert_eq!(
        v.status(50, &q),
        Status::Expired,
        "lapsed at 17 s, stays lapsed"
    );
    assert_eq!(v.status(99, &q), Status::YourTurn, "reached at 19.9 s");
    assert_eq!(v.status(400, &q), Status::YourTurn);
    // Places before the history kept have lapsed.
    let old = QueueState { lapsed: 60, ..s };
    assert_eq!(old.window_ends_at(60, 2_000), None);
    assert_eq!(old.window_ends_at(61, 2_000), Some(18_100));
}

#[test]
fn a_halt_stands_the_windows_open_when_it_came_until_its_resume() {
    // 10/s from 10 s; halted at 12 s: the cursor stands at 20.
    let m = |at_ms, cursor, running, postponed_at| Mark {
        at_ms,
        cursor,
        rate: 10,
        running,
        postponed_at,
    };
    let halted = QueueState {
        marks: vec![m(10_000, 0, true, None), m(12_000, 20, false, None)],
        halted_at: Some(12_000),
        ..state(30_000)
    };
    // Place 15 (reached at 11.5 s) is open while halted, however long; place 1 (0.1 s
    // left at the halt) is not lengthened.
    assert_eq!(halted.window_ends_at(15, 2_000), Some(u64::MAX));
    assert_eq!(halted.window_ends_at(1, 2_000), Some(12_100));
    // Resumed at 40 s: 28 s stood, what was left runs on.
    let resumed = QueueState {
        marks: vec![
            m(10_000, 0, true, None),
            m(12_000, 20, false, None),
            m(40_000, 20, true, Some(12_000)),
        ],
        halted_at: None,
        ..state(40_000)
    };
    assert_eq!(resumed.window_ends_at(15, 2_000), Some(41_500));
}

#[test]
fn a_postponement_lengthens_the_windows_open_when_it_came_even_twice() {
    // 10/s from 10 s; at 12 s the sale is postponed to 15 s, at 14 s again to 18 s.
    let m = |at_ms, cursor, postponed_at| Mark {
        at_ms,
        cursor,
        rate: 10,
        running: true,
        postponed_at,
    };
    let s = QueueState {
        marks: vec![
            m(10_000, 0, None),
            m(15_000, 20, Some(12_000)),
            m(18_000, 20, Some(14_000)),
        ],
        ..state(14_500)
    };
    // Place 15 was reached at 11.5 s: 0.5 s of a 2 s window used, then 6 s stood still.
    assert_eq!(s.window_ends_at(15, 2_000), Some(19_500));
    // Place 1, reached at 10.1 s, had 0.1 s left at 12 s: less than a read may be old, so
    // a gateway may have said "expired" already; not lengthened.
    assert_eq!(s.window_ends_at(1, 2_000), Some(12_100));
    // A window closed before the first postponement stays closed.
    assert_eq!(s.window_ends_at(1, 1_000), Some(11_100));
    // Places reached after the postponement: from the new start.
    assert_eq!(s.window_ends_at(21, 2_000), Some(20_100));
}

#[test]
fn a_ticket_waits_then_buys_within_its_window_then_lapses() {
    let q = settings();
    // 1 s after the start at 10/s: places 1..=10 admitted.
    let v = View::new(state(11_000), Some(1000));
    assert_eq!(v.status(10, &q), Status::YourTurn);
    let Status::Waiting {
        position,
        estimated_wait_ms,
        ..
    } = v.status(15, &q)
    else {
        panic!("waiting");
    };
    assert_eq!(position, 5);
    assert!(
        (400..=600).contains(&estimated_wait_ms),
        "{estimated_wait_ms}"
    );
    // 3 s later (30 places on, window 2 s = 20 places): place 10 lapsed, 25 has its turn.
    let later = View::new(state(14_000), Some(1000));
    assert_eq!(later.status(10, &q), Status::Expired);
    assert_eq!(later.status(25, &q), Status::YourTurn);
}

#[test]
fn too_far_behind_the_units_left_is_told_at_once() {
    let q = settings();
    let v = View::new(state(10_000), Some(10));
    let told = |n| match v.status(n, &q) {
        Status::Waiting {
            likely_too_late, ..
        } => likely_too_late,
        other => panic!("{other:?}"),
    };
    assert!(!told(10), "9 ahead, 10 left x 1.5");
    assert!(told(16), "15 ahead of 10 left x 1.5");
    let sold = View::new(
        QueueState {
            held: true,
            ..state(10_000)
        },
        Some(0),
    );
    assert_eq!(sold.status(1, &q), Status::SoldOut);
}

#[test]
fn too_late_is_judged_by_what_admitted_buyers_bought_once_enough_were() {
    let q = settings();
    let told = |v: &View, n| match v.status(n, &q) {
        Status::Waiting {
            likely_too_late, ..
        } => likely_too_late,
        other => panic!("{other:?}"),
    };
    // At 16 s: 60 admitted (10 a second), 40 of them with their 2 s window closed; 20 of
    // 30 units bought: half a unit each.
    let v = View::new(state(16_000), Some(10)).of_stock(30);
    assert_eq!(v.units_per_admitted(2_000), Some(0.5));
    assert!(!told(&v, 80), "19 ahead want ~9.5 of 10 left x 1.5");
    assert!(told(&v, 95), "34 ahead want ~17 of 10 left x 1.5");
    // Without what was sold, one unit each: 19 ahead of 10 x 1.5 is too late.
    assert!(told(&View::new(state(16_000), Some(10)), 80));
    // Right after the start: 30 admitted, but only 10 had their whole window (nobody may
    // have bought yet): one unit each, not none.
    let early = View::new(state(13_000), Some(10)).of_stock(10);
    assert_eq!(early.units_per_admitted(2_000), None);
    assert!(told(&early, 50), "19 ahead of 10 left x 1.5");
    // Restocked (more left than configured): what sold cannot be told, one unit each.
    let restocked = View::new(state(16_000), Some(40)).of_stock(30);
    assert_eq!(restocked.sold, None);
    assert!(told(&restocked, 121), "60 ahead of 40 left x 1.5");
}

#[test]
fn pre_queue_tickets_wait_for_the_draw_then_take_their_drawn_place() {
    let q = settings();
    let before = View::new(
        QueueState {
            drawn: None,
            seq: 40,
            ..state(9_000)
        },
        None,
    );
    assert!(matches!(
        before.status(3, &q),
        Status::Waiting {
            drawn: false,
            position: 40,
            ..
        }
    ));
    let after = View::new(
        QueueState {
            drawn: Some((40, draw::legacy_seed(77))),
            seq: 45,
            ..state(10_000)
        },
        None,
    );
    assert_eq!(
        after.place(3),
        Some(draw::place(3, Some(40), &draw::legacy_seed(77)))
    );
    assert_eq!(
        after.place(41),
        Some(41),
        "after the start: first come, first served"
    );
}

#[test]
fn refresh_grows_with_the_distance_from_the_front() {
    assert_eq!(refresh_after(0), 1_000);
    assert_eq!(refresh_after(20_000), 5_000);
    assert_eq!(refresh_after(10_000_000), 30_000);
}
