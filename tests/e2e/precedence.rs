//! What a buyer is told when an early check refuses and the body is slow, large or names
//! another quantity: the refusals that need no body answer at once, without `100 Continue`; the
//! body is read last, just before the reserve (review of issue 22: reading it first had turned
//! these into 400s after the body's deadline).

use crate::support::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BUY: &str = "/api/seckill/1001/buy";

/// Sends `head` (a request's header, ending in CRLFCRLF) and `body_part` (possibly less than the
/// announced body), keeps the connection open, and returns the first final response (skipping
/// a `100 Continue`), with how long it took and whether a `100 Continue` came first.
async fn ask_partial(
    addr: SocketAddr,
    head: &str,
    body_part: &[u8],
) -> (u16, String, Duration, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body_part).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut saw_continue = false;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut chunk))
            .await
            .expect("an answer within 15 s")
            .unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if text.starts_with("HTTP/1.1 100") {
            if let Some(end) = text.find("\r\n\r\n") {
                saw_continue = true;
                buf.drain(..end + 4);
                continue;
            }
        }
        if let Some(end) = text.find("\r\n\r\n") {
            // Read the JSON body (Content-Length).
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body, started.elapsed(), saw_continue)
}

fn head(user: &str, extra: &[(&str, &str)]) -> String {
    let mut h = format!(
        "POST {BUY} HTTP/1.1\r\nHost: flashgate.test\r\nConnection: close\r\nX-User-Id: {user}\r\n"
    );
    for (k, v) in extra {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

fn code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("<{body}>"))
}

fn slow_body_config(config: TestConfig) -> TestConfig {
    let mut config = config;
    config.server.sale_body_timeout_ms = Some(2000);
    config
}

/// Each precedence case on one stack: what the buyer is told with a body that is slow, too large
/// (chunked) or names another quantity, when an earlier, cheaper check refuses anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_need_no_body_do_not_wait_for_it() {
    let (_redis, _up, gw) =
        Stack::start_with(vec![TestActivity::open("1001", 1)], slow_body_config).parts();
    let won = gw.buy("1001", "winner", None).await;
    assert_eq!(won.status, 200, "{}", won.text());
    // The mark is set: a second buyer is told sold_out from memory.
    gw.buy("1001", "second", None)
        .await
        .assert_answer(410, "sold_out");

    let mut failures = Vec::new();

    // 1. Slow body (Content-Length 10, nothing sent) on a sold-out activity.
    let (status, body, took, _) =
        ask_partial(gw.addr, &head("slow", &[("Content-Length", "10")]), b"").await;
    eprintln!(
        "slow body, sold out: {status} {} after {took:?}",
        code(&body)
    );
    if (status, code(&body).as_str()) != (410, "sold_out") || took > Duration::from_millis(1000) {
        failures.push(format!(
            "slow body on a sold-out sale: want 410 sold_out at once, got {status} {} after {took:?}",
            code(&body)
        ));
    }

    // 2. Oversized chunked body (no Content-Length) on a sold-out activity.
    let big = vec![b'a'; 20 * 1024];
    let mut chunked = format!("{:x}\r\n", big.len()).into_bytes();
    chunked.extend_from_slice(&big);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let (status, body, took, _) = ask_partial(
        gw.addr,
        &head(
            "big",
            &[
                ("Transfer-Encoding", "chunked"),
                ("Content-Type", "application/octet-stream"),
            ],
        ),
        &chunked,
    )
    .await;
    eprintln!(
        "chunked 20 KiB, sold out: {status} {} after {took:?}",
        code(&body)
    );
    if (status, code(&body).as_str()) != (410, "sold_out") {
        failures.push(format!(
            "oversized chunked body on a sold-out sale: want 410 sold_out, got {status} {}",
            code(&body)
        ));
    }

    // 3. Expect: 100-continue on a sold-out activity: the final answer came without asking the
    //    client for its body.
    let (status, body, took, saw_continue) = ask_partial(
        gw.addr,
        &head(
            "expects",
            &[
                ("Content-Length", "12"),
                ("Expect", "100-continue"),
                ("Content-Type", "text/plain"),
            ],
        ),
        b"",
    )
    .await;
    eprintln!(
        "expect 100-continue, sold out: {status} {} after {took:?}, 100 sent: {saw_continue}",
        code(&body)
    );
    if saw_continue || (status, code(&body).as_str()) != (410, "sold_out") {
        failures.push(format!(
            "Expect: 100-continue on a sold-out sale: want 410 sold_out without 100 Continue, got 100 Continue={saw_continue} then {status} {} after {took:?}",
            code(&body)
        ));
    }

    // 4. A malformed JSON body naming another quantity on a sold-out activity.
    let json = br#"{"qty": 2}"#;
    let (status, body, _, _) = ask_partial(
        gw.addr,
        &head(
            "json",
            &[
                ("Content-Length", &json.len().to_string()),
                ("Content-Type", "application/json"),
            ],
        ),
        json,
    )
    .await;
    eprintln!("body qty 2, sold out: {status} {}", code(&body));
    if (status, code(&body).as_str()) != (410, "sold_out") {
        failures.push(format!(
            "body naming another quantity on a sold-out sale: want 410 sold_out (as before), got {status} {}",
            code(&body)
        ));
    }

    // 5. Rate limited: the buyer's bucket (5/s burst 5) emptied, then a slow body.
    for _ in 0..6 {
        let _ = gw.buy("1001", "hammer", None).await;
    }
    let (status, body, took, _) =
        ask_partial(gw.addr, &head("hammer", &[("Content-Length", "10")]), b"").await;
    eprintln!(
        "slow body, rate limited: {status} {} after {took:?}",
        code(&body)
    );
    if (status, code(&body).as_str()) != (429, "rate_limited") || took > Duration::from_millis(1000)
    {
        failures.push(format!(
            "slow body from a rate-limited buyer: want 429 rate_limited at once, got {status} {} after {took:?}",
            code(&body)
        ));
    }

    let metrics = gw.metrics().await;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("flashgate_admission_decisions_total"))
    {
        eprintln!("{line}");
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// An ended sale: a purchase with a slow body was told 410 `ended` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_sale_with_slow_body_is_answered_ended_at_once() {
    let (_redis, _up, gw) = Stack::start_with(
        vec![TestActivity::open("1001", 5).ended()],
        slow_body_config,
    )
    .parts();
    let (status, body, took, _) =
        ask_partial(gw.addr, &head("late", &[("Content-Length", "10")]), b"").await;
    assert_eq!(
        (status, code(&body).as_str()),
        (410, "ended"),
        "after {took:?}"
    );
    assert!(took < Duration::from_millis(1000), "took {took:?}");
}

/// A waiting room: a buyer without a ticket, with a slow body, was given a ticket and a place
/// (202 `queued`) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_purchase_with_slow_body_gets_its_place_at_once() {
    let activity = TestActivity::open("1001", 5).queue(Queue::admit(1));
    let (_redis, _up, gw) = Stack::start_with(vec![activity], slow_body_config).parts();
    // The first arrival takes the first turn; the second waits.
    let _ = gw.buy("1001", "first", None).await;
    let (status, body, took, _) =
        ask_partial(gw.addr, &head("second", &[("Content-Length", "10")]), b"").await;
    assert_eq!(
        (status, code(&body).as_str()),
        (202, "queued"),
        "after {took:?}"
    );
    assert!(took < Duration::from_millis(1000), "took {took:?}");
}
