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
    // The drop's story counts the same solves (Redis's record of the spent solutions).
    let config = gw.config_path();
    let (code, out, err) = run_cli(
        &[
            "report",
            "--config",
            config.to_str().unwrap(),
            "--activity",
            "1001",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["challenges_solved"], accounts, "{story}");
    assert_eq!(story["buyers"]["queued"], accounts, "{story}");
    eprintln!("{accounts} accounts: {accounts} solves for {tickets} tickets");
}

/// The README's Python check (the block after `<!-- draw-check -->`), run on `seed` for a
/// pre-queue of `drawn`: (its commitment, every place).
fn python_check(seed: &str, drawn: u64) -> (String, Vec<u64>) {
    let readme = std::fs::read_to_string(repo_path("docs/buyers-and-frontends.md")).unwrap();
    let block = readme
        .split("<!-- draw-check -->\n```python\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the README's draw-check block");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("check.py");
    std::fs::write(
        &script,
        format!(
            "{block}\n\nimport json, sys\nseed, drawn = sys.argv[1], int(sys.argv[2])\n\
             print(json.dumps({{'commitment': commitment(seed), \
             'places': [place(n, drawn, seed) for n in range(1, drawn + 1)]}}))\n"
        ),
    )
    .unwrap();
    let out = run_bounded(
        "the README's python check",
        std::process::Command::new("python3")
            .arg(&script)
            .arg(seed)
            .arg(drawn.to_string()),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let places = v["places"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    (v["commitment"].as_str().unwrap().to_owned(), places)
}

/// `draw: true`: the commitment is shown from `opens_at`, the seed from the start; the
/// seed hashes to the commitment, the README's Python recomputes every place the gateway gave,
/// and `flashgate draw` says `match`, then names what differs once Redis's record is tampered
/// with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draw_is_committed_revealed_and_checkable_by_anyone() {
    let starts_at = in_secs(5);
    let activity = TestActivity {
        starts_at,
        ..queued(
            "1001",
            100,
            Queue::admit(2)
                .window_secs(600)
                .opens_at(in_secs(-60))
                .draw(),
        )
    };
    let stack = Stack::start(vec![activity]);
    let gw = &stack.gw;
    // The cursor stands still (paused), so each buyer's position is their place.
    queue_control(gw, "1001", "pause").await;
    let n = 25u64;
    let mut tickets = Vec::new();
    for i in 0..n {
        let (t, _) = take_ticket(gw, "1001", &format!("early{i}")).await;
        tickets.push(t);
    }
    let before = poll(gw, "1001", "early0", &tickets[0]).await;
    let commitment = before["draw_commitment"]
        .as_str()
        .unwrap_or_else(|| panic!("a commitment before the start: {before}"))
        .to_owned();
    assert_eq!(commitment.len(), 64);
    assert!(
        before.get("draw_seed").is_none(),
        "no seed before the start: {before}"
    );
    // The operator reads the same commitment in the admin API before the start, no seed.
    let admin = gw.admin_get("/v1/activities/1001/queue").await.json();
    assert_eq!(admin["draw_commitment"], commitment.as_str(), "{admin}");
    assert!(admin["draw"].is_null(), "no seed before the start: {admin}");
    stack
        .redis
        .wait_time_past("the start", rfc3339_ms(starts_at));
    let after = wait_for_async(
        "the seed to be revealed",
        Duration::from_secs(10),
        || async {
            let v = poll(gw, "1001", "early0", &tickets[0]).await;
            v["draw_seed"].is_string().then_some(v)
        },
    )
    .await;
    assert_eq!(
        after["draw_commitment"],
        commitment.as_str(),
        "the commitment never changes"
    );
    let seed = after["draw_seed"].as_str().unwrap().to_owned();
    let mut places = Vec::new();
    for (i, t) in tickets.iter().enumerate() {
        let v = poll(gw, "1001", &format!("early{i}"), t).await;
        assert_eq!(v["place_final"], true, "{v}");
        places.push(v["queue_position"].as_u64().unwrap());
    }
    // Anyone: the seed is the one committed to, and it draws exactly these places.
    let (python_commitment, python_places) = python_check(&seed, n);
    assert_eq!(python_commitment, commitment);
    let by_number: Vec<u64> = tickets.iter().map(|t| number(t)).collect();
    assert_eq!(by_number, (1..=n).collect::<Vec<_>>());
    assert_eq!(
        python_places, places,
        "the README's Python against the gateway"
    );
    // The first drawn buys: its place is recorded; flashgate draw agrees.
    queue_control(gw, "1001", "resume").await;
    let first = places.iter().position(|p| *p == 1).unwrap();
    let user = format!("early{first}");
    wait_state(gw, "1001", &user, &tickets[first], "your_turn").await;
    let r = buy(gw, "1001", &user, Some(&tickets[first])).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let places_key = "fg:{1001}:q:places";
    wait_for(
        "the admitted place to be recorded",
        Duration::from_secs(10),
        || {
            let recorded: Option<u64> = redis::cmd("HGET")
                .arg(places_key)
                .arg(first + 1)
                .query(&mut stack.redis.conn())
                .unwrap();
            recorded.filter(|p| *p == 1)
        },
    );
    let config = gw.config_path();
    let config = config.to_str().unwrap();
    let args = ["draw", "--config", config, "--activity", "1001"];
    let (code, out, err) = run_cli(&args, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.ends_with("match\n"), "{out}");
    assert!(out.contains(&seed), "{out}");
    // A place admitted that the seed does not draw: named.
    let _: () = redis::cmd("HSET")
        .arg(places_key)
        .arg(first + 1)
        .arg(2)
        .query(&mut stack.redis.conn())
        .unwrap();
    let (code, out, _) = run_cli(&args, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "DIFFERS: ticket {}: admitted at place 2",
            first + 1
        )),
        "{out}"
    );
    assert!(out.ends_with("differ\n"), "{out}");
    // A seed swapped after the commitment: named.
    let _: () = redis::cmd("HSET")
        .arg("fg:{1001}:q")
        .arg("seed")
        .arg("ab".repeat(32))
        .query(&mut stack.redis.conn())
        .unwrap();
    let (code, out, _) = run_cli(&args, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is not sha256 of the seed"), "{out}");
    let (code, _, err) = run_cli(&["draw", "--config", config, "--activity", "nope"], &[]);
    assert_eq!(code, 2, "{err}");
}

/// Sold out (the cursor holds: nothing left), a newcomer is told `sold_out` at once, as a ticket
/// holder is, not set a proof of work for a place that buys nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_after_the_sell_out_is_told_sold_out_not_challenged() {
    let activity = queued(
        "1001",
        1,
        Queue::admit(1000)
            .window_secs(600)
            .challenge(json!({ "max_number": 1000 })),
    );
    let stack = Stack::start(vec![activity]);
    let gw = &stack.gw;
    let solution = solve(&challenged(gw, "1001", "alice").await);
    let r = buy_with(gw, "1001", "alice", &solution).await;
    let ticket = r.header(TICKET).expect("a ticket").to_owned();
    let bought = wait_for_async("alice's purchase", Duration::from_secs(10), || async {
        let r = buy(gw, "1001", "alice", Some(&ticket)).await;
        (r.status == 200).then_some(r)
    })
    .await;
    assert_eq!(bought.status, 200);
    let told = wait_for_async(
        "a newcomer told sold out",
        Duration::from_secs(10),
        || async {
            let r = buy(gw, "1001", "bob", None).await;
            (r.status != 202 || r.json()["state"] != "challenge").then_some(r)
        },
    )
    .await;
    assert_eq!(
        (told.status, told.code()),
        (410, "sold_out".into()),
        "{}",
        told.text()
    );
}
