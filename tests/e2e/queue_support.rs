//! Helpers of the waiting-room tests (tests/e2e/queue.rs, queue_windows.rs).

use crate::support::*;
use chrono::{SecondsFormat, Utc};
use serde_json::Value;
use std::time::Duration;

pub const TICKET: &str = "X-Flashgate-Ticket";

pub fn queued(id: &'static str, stock: u64, queue: Queue) -> TestActivity {
    TestActivity::open(id, stock).queue(queue)
}

/// An RFC 3339 time `secs` from now (leaked: test activities hold `&'static str`).
pub fn in_secs(secs: i64) -> &'static str {
    let t = Utc::now() + chrono::Duration::seconds(secs);
    Box::leak(
        t.to_rfc3339_opts(SecondsFormat::Secs, true)
            .into_boxed_str(),
    )
}

/// Waits until the clock passed `at` (an RFC 3339 time as [`in_secs`] gives).
pub fn wait_past(at: &str) {
    wait_for("the start", Duration::from_secs(10), || {
        (Utc::now()
            .to_rfc3339_opts(SecondsFormat::Secs, true)
            .as_str()
            > at)
            .then_some(())
    });
}

/// An RFC 3339 time (as [`in_secs`] gives) in unix milliseconds.
pub fn rfc3339_ms(at: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(at)
        .expect("an RFC 3339 time")
        .timestamp_millis() as u64
}

pub async fn buy(gw: &GatewayProc, act: &str, user: &str, ticket: Option<&str>) -> HttpResponse {
    let path = format!("/api/seckill/{act}/buy");
    let mut headers = vec![("X-User-Id", user)];
    if let Some(t) = ticket {
        headers.push((TICKET, t));
    }
    request(gw.addr, "POST", &path, &headers).await
}

/// Polls as a well-behaved client does: a poll spends from the buyer's rate-limit bucket, so
/// a `429` is waited out (briefly, a few times) rather than failing.
pub async fn poll(gw: &GatewayProc, act: &str, user: &str, ticket: &str) -> Value {
    for _ in 0..40 {
        let r = get(
            gw.addr,
            &format!("/flashgate/queue/{act}"),
            &[("X-User-Id", user), (TICKET, ticket)],
        )
        .await;
        if r.status == 429 {
            // A client's back-off before asking again (its bucket refills), not a wait for a
            // fact: polling faster would only spend the bucket again.
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        return r.json();
    }
    panic!("{user}'s polls stayed rate limited");
}

/// A ticket for `user`: the 202 answer to a purchase without one.
pub async fn take_ticket(gw: &GatewayProc, act: &str, user: &str) -> (String, Value) {
    let r = buy(gw, act, user, None).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let body = r.json();
    let ticket = body["ticket"].as_str().unwrap().to_owned();
    assert_eq!(r.header(TICKET), Some(ticket.as_str()));
    (ticket, body)
}

/// The ticket's number (`t1.<act>.<number>.<issued>.<mac>`).
pub fn number(ticket: &str) -> u64 {
    ticket.split('.').nth(2).unwrap().parse().unwrap()
}

pub async fn wait_state(
    gw: &GatewayProc,
    act: &str,
    user: &str,
    ticket: &str,
    state: &str,
) -> Value {
    wait_for_async(
        &format!("{user}'s ticket to be {state}"),
        Duration::from_secs(15),
        || async {
            let v = poll(gw, act, user, ticket).await;
            (v["state"] == state).then_some(v)
        },
    )
    .await
}

pub fn redis_calls(redis: &RedisServer) -> u64 {
    redis.script_calls()
}

/// `POST /v1/activities/{act}/queue/{action}` (`pause`, `resume`) at the admin API, answered
/// 200: the queue's state.
pub async fn queue_control(gw: &GatewayProc, act: &str, action: &str) -> Value {
    let r = gw
        .admin_post(&format!("/v1/activities/{act}/queue/{action}"))
        .await;
    assert_eq!(r.status, 200, "{action}: {}", r.text());
    r.json()
}

/// A purchase with extra request headers.
pub async fn buy_with(
    gw: &GatewayProc,
    act: &str,
    user: &str,
    extra: &[(&str, &str)],
) -> HttpResponse {
    let path = format!("/api/seckill/{act}/buy");
    let mut headers = vec![("X-User-Id", user)];
    headers.extend_from_slice(extra);
    request(gw.addr, "POST", &path, &headers).await
}

/// A queue at 1 a second behind an activity bucket of 2 a second (burst 2), no per-user bucket:
/// the processes, the gateway, alice's ticket (first in line) and four more buyers' tickets.
pub async fn small_activity_bucket() -> (RedisServer, Upstream, GatewayProc, String, Vec<String>) {
    let (redis, upstream, gw) =
        Stack::start_with(vec![queued("1001", 10, Queue::admit(1))], |config| {
            config.no_per_user_rate().per_activity_rate(Rate::new(2, 2))
        })
        .parts();
    let (alice, _) = take_ticket(&gw, "1001", "alice").await;
    let mut waiting = Vec::new();
    for i in 0..4 {
        waiting.push(take_ticket(&gw, "1001", &format!("w{i}")).await.0);
    }
    (redis, upstream, gw, alice, waiting)
}
