//! The waiting room (`activities[].queue`) through the real binary: tickets, places, turns,
//! lapses, refusals, sold out for everyone waiting, released units to the next in line, the
//! fair start's draw, and one admission rate over three gateways.

use super::queue_support::*;
use crate::support::*;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_is_queued_with_a_ticket_and_buys_at_their_turn() {
    let stack = Stack::start(vec![queued("1001", 10, Queue::admit(1).window_secs(30))]);
    let gw = &stack.gw;
    let r = buy(gw, "1001", "alice", None).await;
    assert_eq!(r.status, 202);
    let body = r.json();
    assert_eq!(body["code"], "queued");
    for field in [
        "message",
        "queue_position",
        "estimated_wait_ms",
        "refresh_after_ms",
        "ticket",
        "likely_too_late",
    ] {
        assert!(body.get(field).is_some(), "{field} missing: {body}");
    }
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    let cookie = r.header("set-cookie").unwrap();
    assert!(
        cookie.starts_with(&format!("flashgate_ticket={ticket};")) && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    // No reservation was made for a buyer without a ticket.
    assert!(stack.upstream.requests().await.is_empty());
    // Asking again: the same ticket number.
    let (again, _) = take_ticket(gw, "1001", "alice").await;
    assert_eq!(number(&again), number(&ticket));
    let (bob, bob_body) = take_ticket(gw, "1001", "bob").await;
    assert_eq!(number(&bob), number(&ticket) + 1);
    assert!(bob_body["queue_position"].as_u64().unwrap() >= 1);
    // Polls are answered from the gateway's memory: no Redis call each.
    let before = redis_calls(&stack.redis);
    let started = Instant::now();
    for _ in 0..200 {
        poll(gw, "1001", "bob", &bob).await;
    }
    let calls = redis_calls(&stack.redis) - before;
    // The refresh loop reads the queue every 250 ms and the sweep/drift loops run meanwhile:
    // far fewer calls than polls.
    let background = started.elapsed().as_millis() as u64 / 100 * 3 + 10;
    assert!(calls <= background, "{calls} script calls for 200 polls");
    // Alice's turn (the cookie works as well as the header).
    wait_state(gw, "1001", "alice", &ticket, "your_turn").await;
    let cookie = format!("flashgate_ticket={ticket}");
    let r = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("X-User-Id", "alice"), ("Cookie", &cookie)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.reservation_id();
    // Her second purchase is refused by the per-user limit, as without a queue.
    assert_eq!(
        buy(gw, "1001", "alice", Some(&ticket)).await.code(),
        "limit_exceeded"
    );
    let m = gw
        .metrics_when(|m| m.contains("flashgate_queue_admitted_total{activity=\"1001\"} 1"))
        .await;
    assert!(
        m.contains("flashgate_queue_tickets_total{activity=\"1001\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("flashgate_queue_wait_seconds_count{activity=\"1001\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("flashgate_admission_decisions_total{activity=\"1001\",decision=\"queued\"}")
    );
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_others_and_lapsed_tickets_are_refused() {
    let (_redis, upstream, mut config) = backends(vec![
        queued("1001", 10, Queue::admit(5).window_secs(1)),
        queued("1002", 10, Queue::admit(5)),
    ]);
    config.per_user = None;
    let gw = &GatewayProc::start(config);
    let (alice, _) = take_ticket(gw, "1001", "alice").await;
    let (other_activity, _) = take_ticket(gw, "1002", "alice").await;
    let mut forged = alice.clone();
    forged.replace_range(forged.len() - 2.., "AA");
    let n = number(&alice);
    let renumbered = alice.replacen(&format!(".{n}."), &format!(".{}.", n + 1), 1);
    for (who, ticket) in [
        ("bob", alice.as_str()),
        ("alice", forged.as_str()),
        ("alice", renumbered.as_str()),
        ("alice", other_activity.as_str()),
        ("alice", "garbage"),
    ] {
        let r = buy(gw, "1001", who, Some(ticket)).await;
        assert_eq!(r.status, 403, "{who} with {ticket}");
        assert_eq!(r.code(), "invalid_ticket");
    }
    // Alice's turn comes and goes (a window of 1 s at 5/s is 5 places).
    wait_state(gw, "1001", "alice", &alice, "expired").await;
    let r = buy(gw, "1001", "alice", Some(&alice)).await;
    assert_eq!(r.status, 410);
    assert_eq!(r.code(), "ticket_expired");
    // Asking for a new one: the same lapsed ticket (one per user and activity).
    let r = buy(gw, "1001", "alice", None).await;
    r.assert_answer(410, "ticket_expired");
    assert!(upstream.requests().await.is_empty());
    let m = gw
        .metrics_when(|m| m.contains("flashgate_queue_lapsed_total{activity=\"1001\"} 1"))
        .await;
    assert!(
        m.contains("flashgate_queue_lapsed_total{activity=\"1001\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everyone_waiting_learns_sold_out_and_a_released_unit_goes_to_the_next_in_line() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        confirm: Some("explicit"),
        hold_secs: Some(600),
        ..queued("1001", 1, Queue::admit(1).window_secs(60))
    };
    let gw = GatewayProc::start(TestConfig::new(&redis, &upstream, vec![activity]));
    let users = ["u0", "u1", "u2", "u3", "u4"];
    let mut tickets = Vec::new();
    for u in users {
        tickets.push(take_ticket(&gw, "1001", u).await.0);
    }
    // u0 buys the only unit (held, not confirmed).
    wait_state(&gw, "1001", "u0", &tickets[0], "your_turn").await;
    let won = buy(&gw, "1001", "u0", Some(&tickets[0])).await;
    assert_eq!(won.status, 200);
    let jti = won.reservation_id();
    // Within a refresh everyone still waiting is told: sold out.
    let told = Instant::now();
    for (u, t) in users.iter().zip(&tickets).skip(1) {
        wait_state(&gw, "1001", u, t, "sold_out").await;
    }
    assert!(
        told.elapsed() < Duration::from_secs(2),
        "{:?}",
        told.elapsed()
    );
    let r = buy(&gw, "1001", "u4", Some(&tickets[4])).await;
    r.assert_answer(410, "sold_out");
    // A newcomer is told at once too (place given anyway).
    let late = buy(&gw, "1001", "late", None).await;
    assert!(
        late.status == 410 || late.json()["state"] == "sold_out",
        "{:?}",
        late.json()
    );
    // The unit comes back: it goes to the next in line, u1, not to u4 clicking fastest.
    let r = gw
        .admin_post(&format!("/v1/activities/1001/reservations/{jti}/release"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let next = wait_for_async("u1's turn", Duration::from_secs(15), || async {
        for (i, (u, t)) in users.iter().zip(&tickets).enumerate().skip(1) {
            if poll(&gw, "1001", u, t).await["state"] == "your_turn" {
                return Some(i);
            }
        }
        None
    })
    .await;
    assert_eq!(next, 1, "the first turn after the release went to u{next}");
    for i in 2..5 {
        let r = buy(&gw, "1001", users[i], Some(&tickets[i])).await;
        assert_eq!(r.status, 202, "u{i} bought before u1: {:?}", r.json());
    }
    let r = buy(&gw, "1001", "u1", Some(&tickets[1])).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_queue_arrivals_are_drawn_at_the_start_and_later_ones_queue_in_order() {
    let starts_at = in_secs(6);
    let activity = TestActivity {
        starts_at,
        per_user_limit: 1,
        ..queued(
            "1001",
            100,
            Queue::admit(1).window_secs(600).opens_at(in_secs(-60)),
        )
    };
    let stack = Stack::start(vec![activity]);
    let gw = &stack.gw;
    // The cursor stands still (paused), so each buyer's position is their place.
    queue_control(gw, "1001", "pause").await;
    let n = 40;
    let mut tickets = Vec::new();
    for i in 0..n {
        let (t, body) = take_ticket(gw, "1001", &format!("early{i}")).await;
        assert_eq!(number(&t), i + 1, "tickets are numbered in arrival order");
        assert_eq!(body["state"], "waiting");
        assert_eq!(
            body["place_final"], false,
            "no place before the draw: {body}"
        );
        tickets.push(t);
    }
    wait_past(starts_at);
    // After the start, later arrivals queue first come, first served, behind the pre-queue.
    let (late1, _) = take_ticket(gw, "1001", "late1").await;
    let (late2, _) = take_ticket(gw, "1001", "late2").await;
    let mut places = Vec::new();
    for (i, t) in tickets.iter().enumerate() {
        let v = poll(gw, "1001", &format!("early{i}"), t).await;
        assert_eq!(v["place_final"], true, "{v}");
        places.push(v["queue_position"].as_u64().unwrap());
    }
    let set: BTreeSet<u64> = places.iter().copied().collect();
    assert_eq!(
        set,
        (1..=n).collect(),
        "the draw is a permutation of the pre-queue"
    );
    assert_ne!(places, (1..=n).collect::<Vec<_>>(), "arrival order kept");
    // Uncorrelated with arrival order (a loose bound for 40; draw.rs tests the statistic).
    let rho = spearman(&places);
    assert!(rho.abs() < 0.6, "rank correlation {rho}");
    assert_eq!(
        poll(gw, "1001", "late1", &late1).await["queue_position"],
        n + 1
    );
    assert_eq!(
        poll(gw, "1001", "late2", &late2).await["queue_position"],
        n + 2
    );
    // The draw is written down: the seed and the pre-queue's size, checkable afterwards.
    let q = gw.admin_get("/v1/activities/1001/queue").await.json();
    assert_eq!(q["draw"]["tickets"], n);
    let seed = flashgate::waiting::draw::parse_seed(q["draw"]["seed"].as_str().unwrap()).unwrap();
    for (i, place) in places.iter().enumerate() {
        assert_eq!(
            flashgate::waiting::draw::place(i as u64 + 1, Some(n), &seed),
            *place
        );
    }
    assert_eq!(q["paused"], true);
    assert_eq!(q["cursor"], 0);
    assert_eq!(q["length"], n + 2);
    assert_eq!(q["admit_per_second"], 1);
    // Resumed: the buyer drawn first goes first.
    queue_control(gw, "1001", "resume").await;
    let first = places.iter().position(|p| *p == 1).unwrap();
    wait_state(
        gw,
        "1001",
        &format!("early{first}"),
        &tickets[first],
        "your_turn",
    )
    .await;
    let second = places.iter().position(|p| *p == 2).unwrap();
    assert_eq!(
        poll(gw, "1001", &format!("early{second}"), &tickets[second]).await["state"],
        "waiting"
    );
}

fn spearman(places: &[u64]) -> f64 {
    let n = places.len() as f64;
    let d2: f64 = places
        .iter()
        .enumerate()
        .map(|(i, p)| (i as f64 + 1.0 - *p as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_pauses_resumes_and_changes_the_rate_for_the_fleet() {
    let stack = Stack::start(vec![queued("1001", 10, Queue::admit(3))]);
    let gw = &stack.gw;
    let q = gw.admin_get("/v1/activities/1001/queue").await;
    assert_eq!(q.status, 200);
    let q = q.json();
    for field in ["length", "cursor", "admit_per_second", "paused"] {
        assert!(q.get(field).is_some(), "{field}: {q}");
    }
    assert_eq!(q["admit_per_second"], 3);
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=70")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["admit_per_second"], 70);
    let r = gw
        .admin_post("/v1/activities/1001/queue/rate?per_second=0")
        .await;
    assert_eq!(r.status, 400);
    let r = queue_control(gw, "1001", "pause").await;
    assert_eq!(r["paused"], true);
    let cursor = r["cursor"].as_u64().unwrap();
    let (t, _) = take_ticket(gw, "1001", "alice").await;
    assert!(number(&t) > cursor);
    assert_eq!(poll(gw, "1001", "alice", &t).await["state"], "waiting");
    // Paused is said as paused: no estimate, and a refresh soon enough to see it run again.
    let paused = wait_for_async("the poll to say paused", Duration::from_secs(5), || async {
        let p = poll(gw, "1001", "alice", &t).await;
        (p["paused"] == true).then_some(p)
    })
    .await;
    assert!(paused["estimated_wait_ms"].is_null(), "{paused}");
    assert!(
        paused["refresh_after_ms"].as_u64().unwrap() <= 5_000,
        "{paused}"
    );
    assert!(
        paused["message"].as_str().unwrap().contains("paused"),
        "{paused}"
    );
    let r = queue_control(gw, "1001", "resume").await;
    assert_eq!(r["paused"], false);
    wait_state(gw, "1001", "alice", &t, "your_turn").await;
    let r = gw.admin_get("/v1/activities/9999/queue").await;
    assert_eq!(r.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_admit_ten_thousand_buyers_at_one_rate() {
    const BUYERS: usize = 10_000;
    const RATE: f64 = 200.0;
    const MEASURED: usize = 1_000;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        stock: 100_000,
        ..queued("1001", 100_000, Queue::admit(200).window_secs(600))
    };
    let gws: Vec<Arc<GatewayProc>> = (0..3)
        .map(|_| {
            let mut config = TestConfig::new(&redis, &upstream, vec![activity.clone()]);
            config.per_user = None;
            Arc::new(GatewayProc::start(config))
        })
        .collect();
    queue_control(&gws[0], "1001", "pause").await;
    // Every buyer arrives at once, spread over the three gateways.
    let next = Arc::new(AtomicUsize::new(0));
    let tickets = Arc::new(parking_lot::Mutex::new(vec![String::new(); BUYERS]));
    let workers: Vec<_> = (0..96)
        .map(|_| {
            let (next, tickets, gws) = (next.clone(), tickets.clone(), gws.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= BUYERS {
                        return;
                    }
                    let (t, _) = take_ticket(&gws[i % 3], "1001", &format!("b{i}")).await;
                    tickets.lock()[i] = t;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let tickets = tickets.lock().clone();
    let numbers: BTreeSet<u64> = tickets.iter().map(|t| number(t)).collect();
    let first = *numbers.first().unwrap();
    assert_eq!(
        numbers,
        (first..first + BUYERS as u64).collect(),
        "one number per buyer, none twice, none skipped while the queue was full"
    );
    // Buyers in the order of their places, each eager: they try at their estimated turn.
    let mut by_number: Vec<(u64, usize)> = tickets
        .iter()
        .enumerate()
        .map(|(i, t)| (number(t), i))
        .collect();
    by_number.sort();
    let order: Arc<Vec<usize>> = Arc::new(by_number.into_iter().map(|(_, i)| i).collect());
    let tickets = Arc::new(tickets);
    let resumed = Instant::now();
    queue_control(&gws[1], "1001", "resume").await;
    let next = Arc::new(AtomicUsize::new(0));
    let admitted_at = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..32)
        .map(|w| {
            let (next, order, tickets, gws, admitted_at) = (
                next.clone(),
                order.clone(),
                tickets.clone(),
                gws.clone(),
                admitted_at.clone(),
            );
            tokio::spawn(async move {
                let mut attempt = w;
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= MEASURED {
                        return;
                    }
                    let i = order[k];
                    let user = format!("b{i}");
                    loop {
                        attempt += 1;
                        let r = buy(&gws[attempt % 3], "1001", &user, Some(&tickets[i])).await;
                        match r.status {
                            200 => {
                                admitted_at.lock().push(resumed.elapsed());
                                break;
                            }
                            202 => {
                                // null while a gateway still sees the queue paused.
                                let wait = r.json()["estimated_wait_ms"].as_u64().unwrap_or(200);
                                tokio::time::sleep(Duration::from_millis(wait.clamp(5, 200))).await;
                            }
                            s => panic!("{user}: {s} {}", r.text()),
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let mut at = admitted_at.lock().clone();
    at.sort();
    assert_eq!(at.len(), MEASURED);
    let last = at.last().unwrap().as_secs_f64();
    let rate = MEASURED as f64 / last;
    eprintln!("fleet admission: {MEASURED} in {last:.3} s = {rate:.1}/s (configured {RATE}/s)");
    assert!(
        (rate - RATE).abs() <= RATE * 0.05,
        "admitted {MEASURED} in {last:.2} s: {rate:.1}/s for a configured {RATE}/s"
    );
    // Never ahead of the cursor at any moment: k admissions by k / rate (less a refresh).
    for (k, t) in at.iter().enumerate() {
        let earliest = (k as f64 + 1.0) / RATE - 0.3;
        assert!(t.as_secs_f64() >= earliest, "admission {k} at {t:?}");
    }
    let upstream_orders = upstream.requests().await.len();
    assert_eq!(upstream_orders, MEASURED, "each admitted buyer bought once");
    let mut admitted = 0;
    for gw in &gws {
        let m = gw.metrics().await;
        admitted += m
            .lines()
            .find(|l| l.starts_with("flashgate_queue_admitted_total{activity=\"1001\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap();
    }
    assert_eq!(admitted, MEASURED as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_of_a_queue_redis_lost_holds_no_place_in_the_new_one() {
    let stack = Stack::start(vec![queued("1001", 10, Queue::admit(1))]);
    let gw = &stack.gw;
    let (alice, _) = take_ticket(gw, "1001", "alice").await;
    // Redis loses the queue (a flush, a failover without the keys).
    stack.redis.del(&["fg:{1001}:q", "fg:{1001}:q:tickets"]);
    let (bob, _) = take_ticket(gw, "1001", "bob").await;
    // Alice's old ticket is genuine but of the lost queue: she is given a new place, behind
    // bob, never bob's place nor an admission on the old number.
    let r = buy(gw, "1001", "alice", Some(&alice)).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let renewed = r.json()["ticket"].as_str().unwrap().to_owned();
    assert_ne!(renewed, alice);
    assert!(number(&renewed) > number(&bob), "{renewed} vs bob's {bob}");
    // The renewed ticket is hers from now on.
    let (again, _) = take_ticket(gw, "1001", "alice").await;
    assert_eq!(number(&again), number(&renewed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_asking_for_their_place_do_not_use_up_the_activity_bucket() {
    let (_redis, _upstream, gw, alice, waiting) = small_activity_bucket().await;
    // The others keep asking for their place (202s) while alice's turn comes.
    for _ in 0..3 {
        for (i, t) in waiting.iter().enumerate() {
            assert_eq!(
                buy(&gw, "1001", &format!("w{i}"), Some(t)).await.status,
                202
            );
        }
    }
    wait_state(&gw, "1001", "alice", &alice, "your_turn").await;
    for (i, t) in waiting.iter().enumerate() {
        buy(&gw, "1001", &format!("w{i}"), Some(t)).await;
    }
    let r = buy(&gw, "1001", "alice", Some(&alice)).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_a_sale_without_a_waiting_room_says_so() {
    let stack = Stack::start(vec![TestActivity::open("2002", 5)]);
    let r = get(
        stack.gw.addr,
        "/flashgate/queue/2002",
        &[("X-User-Id", "alice")],
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["code"], "no_queue");
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("no waiting room"));
    // The message follows Accept-Language, as every JSON message does; the code stays.
    let zh = get(
        stack.gw.addr,
        "/flashgate/queue/2002",
        &[("X-User-Id", "alice"), ("Accept-Language", "zh-CN")],
    )
    .await;
    assert_eq!(zh.json()["code"], "no_queue");
    assert!(
        zh.json()["message"].as_str().unwrap().contains("没有排队"),
        "{}",
        zh.text()
    );
    let unknown = get(
        stack.gw.addr,
        "/flashgate/queue/9999",
        &[("X-User-Id", "alice")],
    )
    .await;
    assert_eq!(unknown.json()["code"], "unknown_activity");
}

/// The waiting room's own address before it opens tells when it does, as a purchase does: JSON
/// with `opens_at` and `Retry-After`, a page with the time and a countdown (it loads itself
/// again at the opening). Before, it said only "the sale has not started yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rooms_address_before_it_opens_says_when() {
    let opens = in_secs(90);
    let queue = Queue::admit(1).opens_at(opens);
    let stack = Stack::start(vec![queued("1001", 5, queue).starts_at(in_secs(180))]);
    let gw = &stack.gw;
    let r = get(gw.addr, "/flashgate/queue/1001", &[("X-User-Id", "alice")]).await;
    assert_eq!(
        (r.status, r.code()),
        (403, "not_started".into()),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["opens_at"].as_str(), Some(opens), "{}", r.text());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((80..=91).contains(&retry), "Retry-After {retry}");
    let page = get(
        gw.addr,
        "/flashgate/queue/1001",
        &[("X-User-Id", "alice"), ("Accept", "text/html")],
    )
    .await;
    assert_eq!(page.status, 403);
    assert!(page.text().contains("id=\"opens-at\""), "{}", page.text());
    assert!(page.text().contains("id=\"countdown\""), "{}", page.text());
}
