//! Halt and resume (issue 25): one admin call, stored in Redis, stops every gateway of the fleet
//! within 500 ms of its answer (`unavailable`, 503, `Retry-After`, nothing taken); resume
//! restores selling everywhere; waiting buyers read the queue paused.

use crate::queue_support::{buy, poll, queue_control, queued, take_ticket, wait_state};
use crate::support::*;
use std::time::{Duration, Instant};

/// The contract's bound, from the halt's answer to every gateway's first 503.
const HALT_BOUND: Duration = Duration::from_millis(500);

/// Units reserved so far (pending + confirmed), as Redis's ledger says (once the stock is
/// prewarmed: a gateway just started may not have read it yet).
async fn taken(gw: &GatewayProc, act: &str) -> i64 {
    wait_for_async("the ledger to be read", Duration::from_secs(5), || async {
        let view = gw.activity_view(act).await;
        Some(view["pending"].as_i64()? + view["confirmed"].as_i64()?)
    })
    .await
}

/// Buys as `user` on `gw` until the answer is 503; every answer before it must be 409 (the
/// prober already holds its one unit: probing takes no stock). The instant of the first 503.
async fn first_503(gw: &GatewayProc, user: String) -> Instant {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = gw.buy("1001", &user, None).await;
        let seen = Instant::now();
        match r.status {
            503 => {
                assert_eq!(r.json()["code"], "unavailable");
                assert!(r.header("retry-after").is_some(), "503 without Retry-After");
                return seen;
            }
            409 => {}
            other => panic!("{user} was answered {other} {}", r.text()),
        }
        assert!(
            Instant::now() < end,
            "{user}'s gateway never obeyed the halt"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_stops_three_gateways_within_500_ms_and_a_resume_sells_again() {
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 100)]);
    let config = config.no_per_user_rate();
    let a = GatewayProc::start(config.clone());
    let b = GatewayProc::start(config.clone().on_new_ports());
    let c = GatewayProc::start(config.clone().on_new_ports());
    let gws = [&a, &b, &c];
    // Each prober takes its one unit (per_user_limit 1) on its own gateway.
    for (i, gw) in gws.iter().enumerate() {
        let r = gw.buy("1001", &format!("probe-{i}"), None).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(gw.activity_view("1001").await["halted"], false);
    }
    let before = taken(&a, "1001").await;
    assert_eq!(before, 3);

    // Every gateway is probed without pause while the halt is sent to one of them.
    let probes: Vec<_> = gws
        .iter()
        .enumerate()
        .map(|(i, gw)| first_503(gw, format!("probe-{i}")))
        .collect();
    let halt = async {
        let r = a.admin_post("/v1/activities/1001/halt").await;
        (r, Instant::now())
    };
    let ((halt, answered), seen) = tokio::join!(halt, futures_util::future::join_all(probes));
    assert_eq!(halt.status, 200, "{}", halt.text());
    assert_eq!(halt.json()["halted"], true);
    assert_eq!(
        halt.json()["id"],
        "1001",
        "the halt answers the activity's view"
    );
    let lags: Vec<Duration> = seen
        .iter()
        .map(|s| s.saturating_duration_since(answered))
        .collect();
    eprintln!("halt propagation (answer to first 503) per gateway: {lags:?}");
    for (i, lag) in lags.iter().enumerate() {
        assert!(
            *lag <= HALT_BOUND,
            "gateway {i} obeyed {lag:?} after the halt's answer"
        );
    }

    // Halted: every gateway refuses new buyers (503, Retry-After), a keyed retry too, and
    // nothing is taken; every gateway shows it.
    for (i, gw) in gws.iter().enumerate() {
        for n in 0..5 {
            let r = gw.buy("1001", &format!("buyer-{i}-{n}"), None).await;
            assert_eq!(r.status, 503, "{}", r.text());
            assert_eq!(r.json()["code"], "unavailable");
            assert!(r.header("retry-after").is_some());
        }
        let r = gw.buy_keyed("1001", &format!("keyed-{i}"), "k").await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(gw.activity_view("1001").await["halted"], true);
        gw.wait_metric("flashgate_activity_halted{activity=\"1001\"}", 1.0)
            .await;
    }
    assert_eq!(taken(&a, "1001").await, before, "a halted sale took stock");
    // A second halt changes nothing.
    assert_eq!(a.admin_post("/v1/activities/1001/halt").await.status, 200);

    // Resumed through another gateway: every gateway sells again.
    let resume = b.admin_post("/v1/activities/1001/resume").await;
    assert_eq!(resume.status, 200, "{}", resume.text());
    assert_eq!(resume.json()["halted"], false);
    for (i, gw) in gws.iter().enumerate() {
        let user = format!("after-{i}");
        wait_for_async(
            "a gateway to sell after the resume",
            Duration::from_secs(5),
            || async {
                let r = gw.buy("1001", &user, None).await;
                assert!(matches!(r.status, 200 | 503), "{}", r.text());
                (r.status == 200).then_some(())
            },
        )
        .await;
        gw.wait_metric("flashgate_activity_halted{activity=\"1001\"}", 0.0)
            .await;
    }
    assert_eq!(taken(&a, "1001").await, before + 3);
    a.reconcile_clean();

    // An activity that is not configured: 404, on both routes.
    for route in ["halt", "resume"] {
        let r = a.admin_post(&format!("/v1/activities/nope/{route}")).await;
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["code"], "unknown_activity");
    }
}

/// A halt lives in Redis: a gateway started while the activity is halted refuses from its first
/// request; the halt does not need the gateway that took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_during_a_halt_obeys_it() {
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 10)]);
    let mut a = GatewayProc::start(config.clone());
    assert_eq!(a.admin_post("/v1/activities/1001/halt").await.status, 200);
    a.kill();
    let b = GatewayProc::start(config.on_new_ports());
    let r = b.buy("1001", "alice", None).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(b.activity_view("1001").await["halted"], true);
}

/// Waiting buyers see the queue paused, not failed: the cursor stands from the halt (an
/// operator's pause and its resume do not lift it), and runs again from the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_pauses_the_waiting_room_without_failing_anyone() {
    let (_redis, _up, config) = backends(vec![queued("1001", 10, Queue::admit(1))]);
    let gw = GatewayProc::start(config);
    let mut tickets = Vec::new();
    for n in 0..5 {
        let user = format!("w{n}");
        let (ticket, _) = take_ticket(&gw, "1001", &user).await;
        tickets.push((user, ticket));
    }
    assert_eq!(gw.admin_post("/v1/activities/1001/halt").await.status, 200);
    let stood = queue_control(&gw, "1001", "resume").await;
    assert_eq!(stood["paused"], true, "an operator's resume lifts no halt");
    let (user, ticket) = &tickets[4];
    let p = poll(&gw, "1001", user, ticket).await;
    assert_eq!(p["state"], "waiting", "{p}");
    assert_eq!(p["paused"], true, "{p}");
    assert!(p["estimated_wait_ms"].is_null(), "{p}");
    let cursor = stood["cursor"].as_u64().unwrap();
    // The cursor stands while halted: Redis's TIME moves on, the cursor does not (1 a second).
    let later = wait_for_async(
        "two seconds of Redis's time to pass",
        Duration::from_secs(10),
        || async {
            let q = gw.admin_get("/v1/activities/1001/queue").await.json();
            let p = poll(&gw, "1001", user, ticket).await;
            assert_eq!(p["paused"], true, "{p}");
            let since =
                q["redis_time_ms"].as_u64().unwrap() - stood["redis_time_ms"].as_u64().unwrap();
            (since >= 2000).then_some(q)
        },
    )
    .await;
    assert_eq!(
        later["cursor"].as_u64().unwrap(),
        cursor,
        "the cursor moved while halted"
    );
    assert_eq!(
        gw.admin_post("/v1/activities/1001/resume").await.status,
        200
    );
    let p = wait_for_async("the queue to run again", Duration::from_secs(5), || async {
        let p = poll(&gw, "1001", user, ticket).await;
        (p["paused"] == false).then_some(p)
    })
    .await;
    assert_eq!(p["state"], "waiting", "{p}");
}

/// Review: a purchase that passed the halt gate before the halt but whose body came later (a
/// slow client; the body is read just before the reserve, for up to `sale_body_timeout_ms`)
/// took stock well after the halt's answer plus 500 ms. The reserve looks at the halt again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_after_the_halt_takes_no_stock() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 10)]);
    let gw = GatewayProc::start(config);
    let before = taken(&gw, "1001").await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(
        b"POST /api/seckill/1001/buy HTTP/1.1\r\nHost: flashgate.test\r\nConnection: close\r\n\
          X-User-Id: slow\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\
          Expect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    // The gateway asks for the body (100 Continue) only at the body gate: past the halt gate.
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("a 100 Continue within 5 s")
        .unwrap();
    let first = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(first.starts_with("HTTP/1.1 100"), "{first}");
    let halt = gw.admin_post("/v1/activities/1001/halt").await;
    assert_eq!(halt.status, 200, "{}", halt.text());
    let answered = Instant::now();
    wait_for_async(
        "the contract's bound to pass",
        Duration::from_secs(5),
        || async { (answered.elapsed() > HALT_BOUND).then_some(()) },
    )
    .await;
    s.write_all(b"{}").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&rest).to_string();
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "a purchase finished after the halt's answer + 500 ms: {answer}"
    );
    assert_eq!(taken(&gw, "1001").await, before, "stock taken after a halt");
    gw.reconcile_clean();
}

/// Review: a buyer admitted before a halt (their turn's window open) is told `unavailable` while
/// halted, which says they may retry; a halt longer than what was left of their window had
/// lapsed their ticket by the resume (403 `ticket_expired`). A halt stands the windows open at
/// it, as a postponement does: they run on after the resume with what they had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_does_not_lapse_the_tickets_it_kept_from_buying() {
    let (_redis, _up, config) =
        backends(vec![queued("1001", 10, Queue::admit(100).window_secs(2))]);
    let gw = GatewayProc::start(config);
    let (ticket, _) = take_ticket(&gw, "1001", "early").await;
    wait_state(&gw, "1001", "early", &ticket, "your_turn").await;
    let halt = gw.admin_post("/v1/activities/1001/halt").await;
    assert_eq!(halt.status, 200, "{}", halt.text());
    let r = buy(&gw, "1001", "early", Some(&ticket)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    // Halted for longer than the whole window (Redis's clock).
    let from = gw.admin_get("/v1/activities/1001/queue").await.json()["redis_time_ms"]
        .as_u64()
        .unwrap();
    wait_for_async(
        "three seconds of Redis's time",
        Duration::from_secs(10),
        || async {
            let q = gw.admin_get("/v1/activities/1001/queue").await.json();
            let p = poll(&gw, "1001", "early", &ticket).await;
            assert_eq!(p["state"], "your_turn", "told while halted: {p}");
            (q["redis_time_ms"].as_u64().unwrap() >= from + 3000).then_some(())
        },
    )
    .await;
    assert_eq!(
        gw.admin_post("/v1/activities/1001/resume").await.status,
        200
    );
    let r = wait_for_async(
        "the gateway to sell again",
        Duration::from_secs(5),
        || async {
            let r = buy(&gw, "1001", "early", Some(&ticket)).await;
            (r.status != 503).then_some(r)
        },
    )
    .await;
    assert_eq!(r.status, 200, "after the resume: {}", r.text());
}

/// Review: a halt stops taking stock; a keyed replay of a purchase already won takes none, and
/// its buyer is owed the same jti (as outside the sale's hours). It was answered 503; a key that
/// won nothing is still told `unavailable`, and nothing is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_replay_of_a_won_purchase_during_a_halt_gets_its_jti() {
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 10)]);
    let gw = GatewayProc::start(config);
    let won = gw.buy_keyed("1001", "alice", "k-1").await;
    assert_eq!(won.status, 200, "{}", won.text());
    let before = taken(&gw, "1001").await;
    assert_eq!(gw.admin_post("/v1/activities/1001/halt").await.status, 200);
    let replay = gw.buy_keyed("1001", "alice", "k-1").await;
    assert_eq!(
        replay.status,
        200,
        "a replay during a halt: {}",
        replay.text()
    );
    assert_eq!(
        replay.reservation_id(),
        won.reservation_id(),
        "a replay returns the same jti"
    );
    let fresh = gw.buy_keyed("1001", "bob", "k-2").await;
    fresh.assert_answer(503, "unavailable");
    assert!(fresh.header("retry-after").is_some());
    assert_eq!(taken(&gw, "1001").await, before, "a halted sale took stock");
    gw.reconcile_clean();
}

/// Review: a gateway takes requests as soon as its listener is up (a process that took over
/// the listeners in an upgrade, or behind a balancer that does not read `/readyz`), before it
/// read the halts: during a halt it sold. Until every halt was read once it answers
/// `unavailable` (it cannot know).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_has_not_read_the_halts_yet_sells_nothing() {
    let (_redis, _up, config) = backends(vec![TestActivity::open("1001", 10)]);
    let mut a = GatewayProc::start(config.clone());
    assert_eq!(a.admin_post("/v1/activities/1001/halt").await.status, 200);
    let before = taken(&a, "1001").await;
    a.kill();
    let b = GatewayProc::start_unready(
        config.clone().on_new_ports(),
        &[("FLASHGATE_FAULT", "slow_halt_reads")],
    );
    let r = b.buy("1001", "early", None).await;
    assert_eq!(r.status, 503, "sold before the halt was read: {}", r.text());
    assert!(r.header("retry-after").is_some());
    let after = GatewayProc::start(config.on_new_ports());
    assert_eq!(
        taken(&after, "1001").await,
        before,
        "a halted sale took stock"
    );
}

/// The halt key expires (no key outlives the sale's retention) and never before the sale's
/// other keys: an `ends_at` moved later by a reload moves the halt's expiry with it (every
/// gateway's read), so a long sale's halt never lapses while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_halt_key_expires_with_the_sale_and_follows_a_later_end() {
    let sale = TestActivity::open("1001", 10).ends_at(from_now(chrono::Duration::hours(1)));
    let (redis, _up, config) = backends(vec![sale.clone()]);
    let mut gw = GatewayProc::start(config.clone());
    assert_eq!(gw.admin_post("/v1/activities/1001/halt").await.status, 200);
    let expire_time = || -> i64 {
        redis::cmd("EXPIRETIME")
            .arg("fg:{1001}:halt")
            .query(&mut redis.conn())
            .unwrap()
    };
    let end = |at: &str| {
        chrono::DateTime::parse_from_rfc3339(at)
            .unwrap()
            .timestamp()
    };
    let retention = expire_time() - end(sale.ends_at);
    assert!(retention > 0, "the halt key expires at {}", expire_time());
    let later = from_now(chrono::Duration::hours(5));
    let mut moved = config.clone();
    moved.activities = vec![sale.ends_at(later)];
    gw.rewrite_config(moved);
    wait_for(
        "the halt's expiry to follow the later end",
        Duration::from_secs(20),
        || (expire_time() == end(later) + retention).then_some(()),
    );
    let r = gw.buy("1001", "alice", None).await;
    assert_eq!(r.status, 503, "{}", r.text());
}
