//! CORS on the gateway's routes (`server.cors.allowed_origins`), through the real binary and the
//! demo upstream, which records every request it gets: preflights on sale routes and the
//! waiting room are answered by the gateway and never reach the backend; the allow headers go
//! to listed origins only, on the gateway's own answers and on the backend's relayed ones.

use crate::support::*;

const SHOP: &str = "https://shop.example";

fn preflight_headers<'a>(origin: &'a str, method: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("Origin", origin),
        ("Access-Control-Request-Method", method),
        (
            "Access-Control-Request-Headers",
            "content-type,idempotency-key,x-user-id",
        ),
    ]
}

#[track_caller]
fn assert_allowed(resp: &HttpResponse, origin: &str) {
    assert_eq!(
        resp.header("access-control-allow-origin"),
        Some(origin),
        "{:?}",
        resp.headers
    );
    assert_eq!(
        resp.header("access-control-allow-credentials"),
        Some("true")
    );
    assert!(
        resp.header("vary").is_some_and(|v| v.contains("Origin")),
        "{:?}",
        resp.headers
    );
}

#[track_caller]
fn assert_not_allowed(resp: &HttpResponse) {
    let cors: Vec<_> = resp
        .headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-"))
        .collect();
    assert!(
        cors.is_empty(),
        "allow headers for an unlisted origin: {cors:?}"
    );
    assert!(
        resp.header("vary").is_some_and(|v| v.contains("Origin")),
        "{:?}",
        resp.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_here_and_allow_listed_origins_only() {
    let acts = vec![
        TestActivity::open("c1", 5),
        TestActivity::open("q1", 5).queue(Queue::admit(50)),
    ];
    let (_redis, upstream, gw) =
        Stack::start_with(acts, |c| c.cors_origins(&[SHOP, "http://127.0.0.1:1"])).parts();
    let sale = "/api/seckill/c1/buy";

    // A listed origin, spelled as a browser may (upper case, the default port): allowed.
    for origin in [SHOP, "HTTPS://Shop.Example:443"] {
        let pre = request(gw.addr, "OPTIONS", sale, &preflight_headers(origin, "POST")).await;
        assert_eq!(pre.status, 204, "{}", pre.text());
        assert_allowed(&pre, SHOP);
        let methods = pre.header("access-control-allow-methods").unwrap();
        assert!(methods.contains("POST"), "{methods}");
        let allowed = pre
            .header("access-control-allow-headers")
            .unwrap()
            .to_ascii_lowercase();
        for h in [
            "content-type",
            "idempotency-key",
            "x-flashgate-ticket",
            "x-user-id",
        ] {
            assert!(allowed.contains(h), "{h} not in {allowed}");
        }
    }
    // The waiting room's poll: GET allowed.
    let pre = request(
        gw.addr,
        "OPTIONS",
        "/flashgate/queue/q1",
        &preflight_headers(SHOP, "GET"),
    )
    .await;
    assert_eq!(pre.status, 204);
    assert_allowed(&pre, SHOP);
    assert!(pre
        .header("access-control-allow-methods")
        .unwrap()
        .contains("GET"));
    // Unlisted, look-alike and malformed origins: answered, without allow headers.
    for origin in [
        "https://evil.example",
        "https://shop.example.evil.example",
        "http://shop.example",
        "https://shop.example/",
        "https://shop.example:444",
        "null",
        "https://shop.example\tx",
    ] {
        let pre = request(gw.addr, "OPTIONS", sale, &preflight_headers(origin, "POST")).await;
        assert_eq!(pre.status, 204, "{origin}: {}", pre.text());
        assert_not_allowed(&pre);
    }
    // None of those reached the backend.
    let seen = upstream.requests().await;
    assert!(
        seen.iter().all(|r| r["method"] != "OPTIONS"),
        "a preflight was forwarded: {seen:?}"
    );
    // An OPTIONS on another route is the backend's business, as before.
    let other = request(
        gw.addr,
        "OPTIONS",
        "/catalogue",
        &preflight_headers(SHOP, "GET"),
    )
    .await;
    assert_eq!(other.status, 200, "{}", other.text());
    let seen = upstream.requests().await;
    assert_eq!(
        seen.iter().filter(|r| r["method"] == "OPTIONS").count(),
        1,
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_carry_the_allow_headers_for_listed_origins_only() {
    let acts = vec![
        TestActivity::open("c1", 5),
        TestActivity::open("q1", 5).queue(Queue::admit(50)),
    ];
    let (_redis, upstream, gw) = Stack::start_with(acts, |c| c.cors_origins(&[SHOP])).parts();
    let addr = gw.addr;
    let buy = |user: &'static str, origin: &'static str| async move {
        let headers = [("X-User-Id", user), ("Origin", origin)];
        request(addr, "POST", "/api/seckill/c1/buy", &headers).await
    };
    // The backend's answer to a winner, relayed: allowed, the ticket header readable.
    let won = buy("alice", SHOP).await;
    assert_eq!(won.status, 200, "{}", won.text());
    assert_allowed(&won, SHOP);
    let exposed = won.header("access-control-expose-headers").unwrap();
    assert!(exposed.contains("X-Flashgate-Ticket"), "{exposed}");
    assert_eq!(upstream.requests().await.len(), 1);
    // The gateway's own refusal (over the per-user limit): allowed too.
    let refused = buy("alice", SHOP).await;
    assert!(refused.status >= 400, "{}", refused.text());
    assert_allowed(&refused, SHOP);
    // Another origin: the same answers, no allow headers.
    let won = buy("bob", "https://evil.example").await;
    assert_eq!(won.status, 200, "{}", won.text());
    assert_not_allowed(&won);
    let refused = buy("bob", "https://evil.example").await;
    assert!(refused.status >= 400);
    assert_not_allowed(&refused);
    // The waiting room's poll: the ticket is readable by the listed origin's script.
    let poll = get(
        gw.addr,
        "/flashgate/queue/q1",
        &[("X-User-Id", "carol"), ("Origin", SHOP)],
    )
    .await;
    assert_eq!(poll.status, 200, "{}", poll.text());
    assert!(poll.header("x-flashgate-ticket").is_some());
    assert_allowed(&poll, SHOP);
    assert!(poll
        .header("access-control-expose-headers")
        .unwrap()
        .contains("X-Flashgate-Ticket"));
    // Off the gateway's routes nothing changes.
    let other = get(gw.addr, "/catalogue", &[("Origin", SHOP)]).await;
    assert_eq!(other.header("access-control-allow-origin"), None);
}
