//! The admission that follows live buyers (`queue.skip_absent_after_secs`, `queue.max_active`)
//! through the real binary, two gateways on one Redis: with half the tickets silently
//! abandoned, the live buyers are admitted at the configured rate once the absent are skipped
//! (a fixed-rate cursor would give them half); an abandoned buyer who comes back is told their
//! turn went while they were away; `max_active` holds across the fleet. Figures in BENCHMARKS.md.

use super::queue_support::*;
use crate::support::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn fleet(redis: &RedisServer, upstream: &Upstream, queue: Queue) -> Vec<Arc<GatewayProc>> {
    let activity = queued("1001", 10_000, queue.window_secs(60));
    (0..2)
        .map(|_| {
            let mut config = TestConfig::new(redis, upstream, vec![activity.clone()]);
            config.per_user = None;
            Arc::new(GatewayProc::start(config))
        })
        .collect()
}

/// Each place's fate as Redis recorded it: admitted at (Redis ms), or `None` given away.
fn fates(redis: &RedisServer) -> HashMap<u64, Option<u64>> {
    let adm: HashMap<u64, String> = redis::cmd("HGETALL")
        .arg("fg:{1001}:q:adm")
        .query(&mut redis.conn())
        .unwrap();
    adm.into_iter().map(|(p, f)| (p, f.parse().ok())).collect()
}

/// A live buyer: polls as the answers ask (`refresh_after_ms`, at most `max_pause`), buys at
/// their turn after `dawdle`; returns when they bought.
async fn live_buyer(
    gws: Vec<Arc<GatewayProc>>,
    user: String,
    ticket: String,
    max_pause: Duration,
    dawdle: Duration,
) {
    for attempt in 0.. {
        let gw = &gws[attempt % gws.len()];
        let v = poll(gw, "1001", &user, &ticket).await;
        match v["state"].as_str() {
            Some("your_turn") => {
                tokio::time::sleep(dawdle).await;
                let r = buy(gw, "1001", &user, Some(&ticket)).await;
                assert_eq!(r.status, 200, "{user}: {}", r.text());
                return;
            }
            Some("waiting") => {
                let pause = Duration::from_millis(v["refresh_after_ms"].as_u64().unwrap());
                tokio::time::sleep(pause.min(max_pause)).await;
            }
            _ => panic!("{user}: {v}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_half_the_tickets_abandoned_live_buyers_are_admitted_at_the_rate() {
    const RATE: f64 = 20.0;
    const BUYERS: usize = 200;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gws = fleet(
        &redis,
        &upstream,
        Queue::admit(RATE as u32).skip_absent_after_secs(5),
    );
    queue_control(&gws[0], "1001", "pause").await;
    // Every other buyer takes a ticket and leaves without a word.
    let mut live = Vec::new();
    let mut abandoned = Vec::new();
    for i in 0..BUYERS {
        let user = format!("b{i}");
        let (ticket, _) = take_ticket(&gws[i % 2], "1001", &user).await;
        match i % 2 {
            0 => live.push((user, ticket)),
            _ => abandoned.push((user, ticket)),
        }
    }
    // The live ones poll as their page asks (the answers ask at most every 5 s / 3).
    let buyers: Vec<_> = live
        .iter()
        .map(|(user, ticket)| {
            tokio::spawn(live_buyer(
                gws.clone(),
                user.clone(),
                ticket.clone(),
                Duration::from_secs(30),
                Duration::ZERO,
            ))
        })
        .collect();
    // The abandoned stay away longer than skip_absent_after_secs: the scenario itself (their
    // absence), not a wait for a fact.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
    let resumed = secs * 1000 + micros / 1000;
    queue_control(&gws[1], "1001", "resume").await;
    let all = futures_util::future::join_all(buyers);
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every live buyer bought within a minute")
        .into_iter()
        .for_each(|r| r.unwrap());
    let fates = fates(&redis);
    let mut admitted: Vec<u64> = live
        .iter()
        .map(|(user, t)| {
            fates
                .get(&number(t))
                .copied()
                .flatten()
                .unwrap_or_else(|| panic!("live {user} not admitted"))
        })
        .collect();
    for (user, t) in &abandoned {
        assert_eq!(
            fates.get(&number(t)),
            Some(&None),
            "{user} absent yet admitted"
        );
    }
    admitted.sort();
    // From the resume (Redis's clock, read just before it) to the last live admission.
    let span = (admitted.last().unwrap() - resumed) as f64 / 1000.0;
    let rate = admitted.len() as f64 / span;
    eprintln!(
        "live admission with 50 % abandoned: {} live buyers in {span:.3} s from the resume = {rate:.1}/s (configured {RATE}/s)",
        admitted.len()
    );
    // Never above either (no credit is banked while nobody can be admitted).
    assert!(
        (RATE * 0.95..=RATE * 1.05).contains(&rate),
        "{rate:.1}/s for a configured {RATE}/s"
    );
    assert_eq!(upstream.requests().await.len(), live.len());
    // An abandoned buyer who comes back is told why, by a poll and by a purchase.
    let (user, ticket) = &abandoned[0];
    let v = poll(&gws[0], "1001", user, ticket).await;
    assert_eq!(
        (v["state"].as_str(), v["code"].as_str()),
        (Some("expired"), Some("ticket_expired")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("while you were away"),
        "{v}"
    );
    assert!(v.get("refresh_after_ms").is_none(), "final: {v}");
    let r = buy(&gws[1], "1001", user, Some(ticket)).await;
    assert_eq!((r.status, r.code()), (410, "ticket_expired".to_owned()));
    assert!(r.text().contains("while you were away"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_active_holds_across_the_fleet() {
    const MAX_ACTIVE: u64 = 4;
    const BUYERS: usize = 40;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gws = fleet(
        &redis,
        &upstream,
        Queue::admit(50).max_active(MAX_ACTIVE as u32),
    );
    queue_control(&gws[0], "1001", "pause").await;
    let mut tickets = Vec::new();
    for i in 0..BUYERS {
        let user = format!("b{i}");
        let (ticket, _) = take_ticket(&gws[i % 2], "1001", &user).await;
        tickets.push((user, ticket));
    }
    // Watch the active set (admitted, not bought, not lapsed) as Redis holds it.
    let done = Arc::new(AtomicBool::new(false));
    let highest = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (done, highest, samples) = (done.clone(), highest.clone(), samples.clone());
        let url = redis.url();
        tokio::task::spawn_blocking(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            while !done.load(Ordering::Relaxed) {
                let n: u64 = redis::cmd("ZCARD")
                    .arg("fg:{1001}:q:active")
                    .query(&mut conn)
                    .unwrap();
                highest.fetch_max(n, Ordering::Relaxed);
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let started = std::time::Instant::now();
    queue_control(&gws[1], "1001", "resume").await;
    // Each buyer takes 300 ms to buy at their turn: without the cap, 50/s would hold 15 active.
    let buyers: Vec<_> = tickets
        .iter()
        .map(|(user, ticket)| {
            tokio::spawn(live_buyer(
                gws.clone(),
                user.clone(),
                ticket.clone(),
                Duration::from_millis(100),
                Duration::from_millis(300),
            ))
        })
        .collect();
    let all = futures_util::future::join_all(buyers);
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every buyer bought within a minute")
        .into_iter()
        .for_each(|r| r.unwrap());
    let took = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    let highest = highest.load(Ordering::Relaxed);
    eprintln!(
        "max_active {MAX_ACTIVE}: highest active {highest} over {} samples; {BUYERS} bought in {took:.2} s",
        samples.load(Ordering::Relaxed)
    );
    assert!(highest <= MAX_ACTIVE, "{highest} active");
    assert_eq!(highest, MAX_ACTIVE, "the cap was reached (it binds here)");
    let fates = fates(&redis);
    assert_eq!(fates.len(), BUYERS, "each place decided once");
    assert!(fates.values().all(Option::is_some), "nobody was absent");
    assert_eq!(upstream.requests().await.len(), BUYERS);
}
