//! The waiting room's door through the real binary: many buyers at once are given one ticket
//! and one place each, in batched script calls, and a buyer asking again is answered from
//! memory.

use super::queue_support::*;
use crate::support::*;
use std::collections::BTreeSet;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_buyers_at_once_get_two_thousand_places_in_batched_calls() {
    const BUYERS: usize = 2_000;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = queued("1001", 1_000_000, Queue::admit(1).window_secs(600));
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config.per_user = None;
    let gw = Arc::new(GatewayProc::start(config));
    queue_control(&gw, "1001", "pause").await;
    let calls_before = redis.script_calls();
    // Every buyer's request leaves at one instant, and every tenth buyer asks twice at once
    // (a second tab): both asks are answered with the one ticket.
    let start = Arc::new(tokio::sync::Barrier::new(BUYERS + BUYERS / 10));
    let asks: Vec<_> = (0..BUYERS)
        .chain((0..BUYERS).step_by(10))
        .map(|i| {
            let (gw, start) = (gw.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let r = buy(&gw, "1001", &format!("b{i}"), None).await;
                assert_eq!(r.status, 202, "b{i}: {}", r.text());
                let body = r.json();
                let ticket = body["ticket"].as_str().unwrap().to_owned();
                (i, number(&ticket), body["queue_position"].as_u64().unwrap())
            })
        })
        .collect();
    let mut by_buyer = std::collections::HashMap::new();
    for ask in asks {
        let (i, number, place) = ask.await.unwrap();
        if let Some(&(n, p)) = by_buyer.get(&i) {
            assert_eq!((number, place), (n, p), "b{i} asked twice: one ticket");
        }
        by_buyer.insert(i, (number, place));
    }
    let numbers: BTreeSet<u64> = by_buyer.values().map(|(n, _)| *n).collect();
    let places: BTreeSet<u64> = by_buyer.values().map(|(_, p)| *p).collect();
    assert_eq!(numbers.len(), BUYERS, "one ticket per buyer, none twice");
    assert_eq!(places.len(), BUYERS, "every place unique");
    let first = *numbers.first().unwrap();
    assert_eq!(numbers, (first..first + BUYERS as u64).collect());
    let calls = redis.script_calls() - calls_before;
    eprintln!(
        "{BUYERS} tickets (and {} repeated asks) in {calls} script calls",
        BUYERS / 10
    );
    assert!(
        calls < BUYERS as u64 / 2,
        "{calls} script calls for {BUYERS} tickets: the asks were not batched"
    );
    // The gateway tells how full its ticket calls were.
    let metrics = gw.metrics().await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{script=\"queue\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    let (sum, count) = (
        value("flashgate_redis_script_batch_size_sum"),
        value("flashgate_redis_script_batch_size_count"),
    );
    assert!(sum >= BUYERS as f64, "{sum} asks sent for {BUYERS} buyers");
    assert!(
        sum / count > 2.0,
        "{sum} asks in {count} calls: the batch size histogram says no batching"
    );
    // Asking again without the ticket (a refresh that lost it) is answered from memory.
    let calls_before = redis.script_calls();
    for i in (0..BUYERS).step_by(100) {
        let (ticket, _) = take_ticket(&gw, "1001", &format!("b{i}")).await;
        assert_eq!(number(&ticket), by_buyer[&i].0);
    }
    let again = redis.script_calls() - calls_before;
    // (The gateway's own state reads, 4 a second, run meanwhile.)
    assert!(again < 10, "{again} script calls for 20 repeated asks");
    let tickets: u64 = redis::cmd("HLEN")
        .arg("fg:{1001}:q:tickets")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(tickets, BUYERS as u64, "Redis holds one ticket per buyer");
}
