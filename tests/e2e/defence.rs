//! The defence of the drop through the real binary: a proof of work before a ticket (solved
//! here in Rust, as a bot farm would; in Chromium by tests/e2e/waiting_page.rs).

use super::queue_support::*;
use crate::support::*;
use base64::Engine;
use flashgate::waiting::challenge::{self, Challenge};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SOLUTION: &str = "X-Flashgate-Solution";

fn with_challenge(id: &'static str, max_number: u64) -> TestActivity {
    queued(
        id,
        100_000,
        Queue::admit(1)
            .window_secs(600)
            .challenge(json!({ "max_number": max_number })),
    )
}

/// The 202's challenge, solved (the header value to send back).
fn solve(body: &Value) -> String {
    let c = &body["challenge"];
    assert_eq!(c["algorithm"], "SHA-256", "{body}");
    let c = Challenge {
        algorithm: challenge::ALGORITHM,
        challenge: c["challenge"].as_str().unwrap().into(),
        salt: c["salt"].as_str().unwrap().into(),
        signature: c["signature"].as_str().unwrap().into(),
        max_number: c["max_number"].as_u64().unwrap(),
    };
    challenge::solve(&c).expect("the challenge has a solution")
}

async fn buy_with(gw: &GatewayProc, act: &str, user: &str, solution: &str) -> HttpResponse {
    let path = format!("/api/seckill/{act}/buy");
    request(
        gw.addr,
        "POST",
        &path,
        &[("X-User-Id", user), (SOLUTION, solution)],
    )
    .await
}

/// A first contact: 202 `queued` with a challenge and no ticket.
async fn challenged(gw: &GatewayProc, act: &str, user: &str) -> Value {
    let r = buy(gw, act, user, None).await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.header(TICKET), None, "no ticket before the proof of work");
    assert_eq!(r.header("set-cookie"), None);
    let body = r.json();
    assert_eq!(body["code"], "queued", "{body}");
    assert_eq!(body["state"], "challenge", "{body}");
    assert!(body.get("ticket").is_none(), "{body}");
    body
}

fn challenges(m: &str, act: &str, outcome: &str) -> u64 {
    let series =
        format!("flashgate_queue_challenges_total{{activity=\"{act}\",outcome=\"{outcome}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_solved_challenge_gives_one_ticket_to_its_own_user_once() {
    let stack = Stack::start(vec![with_challenge("1001", 3_000)]);
    let gw = &stack.gw;
    let body = challenged(gw, "1001", "alice").await;
    let c = &body["challenge"];
    for field in ["challenge", "salt", "signature", "max_number"] {
        assert!(c.get(field).is_some(), "{field} missing: {body}");
    }
    assert_eq!(c["max_number"], 3_000);
    let solution = solve(&body);
    // Another user sending alice's solution: refused, and the solution is not spent by it.
    let theirs = buy_with(gw, "1001", "bob", &solution).await;
    assert_eq!(
        (theirs.status, theirs.code()),
        (403, "invalid_ticket".into())
    );
    // Alice's own: a ticket.
    let r = buy_with(gw, "1001", "alice", &solution).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let ticket = r.json()["ticket"].as_str().unwrap().to_owned();
    assert_eq!(r.header(TICKET), Some(ticket.as_str()));
    // Sent again (by alice or anyone): 403; alice keeps her ticket.
    let replay = buy_with(gw, "1001", "alice", &solution).await;
    assert_eq!(
        (replay.status, replay.code()),
        (403, "invalid_ticket".into())
    );
    let (again, _) = {
        let r = buy(gw, "1001", "alice", Some(&ticket)).await;
        assert_eq!(r.status, 202, "{}", r.text());
        (r.json()["ticket"].as_str().unwrap().to_owned(), ())
    };
    assert_eq!(number(&again), number(&ticket));
    assert_eq!(poll(gw, "1001", "alice", &ticket).await["state"], "waiting");
    // A wrong number, a forged signature, garbage: 403.
    let payload: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&solution)
            .unwrap(),
    )
    .unwrap();
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let fresh = solve(&challenged(gw, "1001", "carol").await);
    let mut wrong: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&fresh)
            .unwrap(),
    )
    .unwrap();
    wrong["number"] = json!(wrong["number"].as_u64().unwrap() + 1);
    let mut forged = payload.clone();
    forged["signature"] = json!("00".repeat(32));
    for bad in [b64(&wrong), b64(&forged), "not base64!".to_owned()] {
        let r = buy_with(gw, "1001", "carol", &bad).await;
        assert_eq!(
            (r.status, r.code()),
            (403, "invalid_ticket".into()),
            "{bad}"
        );
    }
    // Carol's right solution still works (the wrong one spent nothing).
    let r = buy_with(gw, "1001", "carol", &fresh).await;
    assert_eq!(r.status, 202, "{}", r.text());
    // The poll endpoint takes a solution too.
    let body = challenged(gw, "1001", "dave").await;
    let r = get(
        gw.addr,
        "/flashgate/queue/1001",
        &[("X-User-Id", "dave"), (SOLUTION, &solve(&body))],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["ticket"].as_str().is_some());
    let m = gw
        .metrics_when(|m| challenges(m, "1001", "solved") == 3)
        .await;
    assert_eq!(challenges(&m, "1001", "issued"), 3, "{m}");
    assert_eq!(challenges(&m, "1001", "refused"), 5, "{m}");
    assert_eq!(challenges(&m, "1001", "shadow_passed"), 0, "{m}");
}

/// Before `opens_at` nothing is issued and nothing is taken; a challenge made before it (with
/// the gateway's own key, as an insider could) is refused after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_challenge_before_opens_at_and_none_made_before_it_counts() {
    let opens_at = in_secs(3);
    let activity = TestActivity {
        starts_at: in_secs(60),
        ..queued(
            "1001",
            10,
            Queue::admit(1)
                .opens_at(opens_at)
                .challenge(json!({ "max_number": 100 })),
        )
    };
    let stack = Stack::start(vec![activity]);
    let gw = &stack.gw;
    let r = buy(gw, "1001", "alice", None).await;
    assert_eq!((r.status, r.code()), (403, "not_started".into()));
    let ticket_key = {
        use hmac::{KeyInit, Mac};
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(SIGNING_SECRET.as_bytes()).unwrap();
        mac.update(b"flashgate waiting-room ticket key v1");
        let key: [u8; 32] = mac.finalize().into_bytes().into();
        key
    };
    let key = challenge::key(&ticket_key);
    let epoch: u64 = wait_for("the queue to be set up", Duration::from_secs(10), || {
        redis::cmd("HGET")
            .arg("fg:{1001}:q")
            .arg("epoch")
            .query::<Option<u64>>(&mut stack.redis.conn())
            .ok()
            .flatten()
    });
    let now = stack.redis.time_ms();
    let binding = challenge::Binding {
        activity: "1001",
        user: "alice",
        epoch,
    };
    let early = challenge::issue(&key, binding, now, now + 600_000, 100);
    let early = challenge::solve(&early).unwrap();
    // Refused before the queue opens (not started) ...
    let r = buy_with(gw, "1001", "alice", &early).await;
    assert_eq!((r.status, r.code()), (403, "not_started".into()));
    stack
        .redis
        .wait_time_past("the queue to open", rfc3339_ms(opens_at));
    // ... and after: solved ahead of the opening, it counts for nothing.
    let r = wait_for_async(
        "the queue to open here",
        Duration::from_secs(10),
        || async {
            let r = buy_with(gw, "1001", "alice", &early).await;
            (r.code() != "not_started").then_some(r)
        },
    )
    .await;
    assert_eq!((r.status, r.code()), (403, "invalid_ticket".into()));
    // One issued after the opening does.
    let body = challenged(gw, "1001", "alice").await;
    let r = buy_with(gw, "1001", "alice", &solve(&body)).await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(r.json()["ticket"].as_str().is_some());
}

/// Shadow mode counts and lets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_but_gives_tickets() {
    let stack = Stack::start(vec![queued(
        "1001",
        10,
        Queue::admit(1).challenge(json!({ "max_number": 100, "shadow": true })),
    )]);
    let (t, _) = take_ticket(&stack.gw, "1001", "alice").await;
    assert!(!t.is_empty());
    let r = buy_with(&stack.gw, "1001", "bob", "garbage").await;
    assert_eq!(r.status, 202, "{}", r.text());
    let m = stack
        .gw
        .metrics_when(|m| challenges(m, "1001", "shadow_passed") == 2)
        .await;
    assert_eq!(challenges(&m, "1001", "refused"), 1, "{m}");
    assert_eq!(challenges(&m, "1001", "issued"), 0, "{m}");
}

/// A bot farm: every account pays its own solve for its own ticket, and no solution is taken
/// twice. `FLASHGATE_BOT_FARM=1000` for the issue's 1,000 accounts (default 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_farm_pays_one_solve_per_ticket() {
    let accounts: usize = std::env::var("FLASHGATE_BOT_FARM")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(&redis, &upstream, vec![with_challenge("1001", 2_000)]);
    config.per_user = None;
    let gw = Arc::new(GatewayProc::start(config));
    let next = Arc::new(AtomicUsize::new(0));
    let solutions = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let (gw, next, solutions) = (gw.clone(), next.clone(), solutions.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= accounts {
                        return;
                    }
                    let user = format!("bot{i}");
                    let body = challenged(&gw, "1001", &user).await;
                    let solution = solve(&body);
                    let r = buy_with(&gw, "1001", &user, &solution).await;
                    assert_eq!(r.status, 202, "{}", r.text());
                    assert!(r.json()["ticket"].as_str().is_some());
                    solutions.lock().push((user, solution));
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let tickets: u64 = redis::cmd("HLEN")
        .arg("fg:{1001}:q:tickets")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(tickets as usize, accounts);
    // Every solution replayed, by its own account and by the next: all refused.
    let solutions = solutions.lock().clone();
    for (i, (user, solution)) in solutions.iter().enumerate().take(50) {
        let other = &solutions[(i + 1) % solutions.len()].0;
        for by in [user, other] {
            let r = buy_with(&gw, "1001", by, solution).await;
            assert_eq!((r.status, r.code()), (403, "invalid_ticket".into()));
        }
    }
    let m = gw.metrics().await;
    assert_eq!(challenges(&m, "1001", "solved"), accounts as u64, "{m}");
    assert_eq!(challenges(&m, "1001", "issued"), accounts as u64, "{m}");
    eprintln!("{accounts} accounts: {accounts} solves for {tickets} tickets");
}
