//! Every decision code of the contract table, as a buyer sees it.

use crate::support::*;
use std::time::Duration;

fn setup(activities: Vec<TestActivity>) -> (RedisServer, Upstream, GatewayProc) {
    let (redis, upstream, config) = backends(activities);
    let gw = GatewayProc::start(config);
    (redis, upstream, gw)
}

fn assert_gateway_answer(resp: &HttpResponse, status: u16, code: &str) {
    assert_eq!(resp.status, status, "body: {}", resp.text());
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert_eq!(body["code"], code);
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_contract_code_except_unavailable() {
    let mut multi = TestActivity::open("multi", 10);
    multi.per_user_limit = 3;
    multi.max_per_request = 2;
    let mut future = TestActivity::open("future", 10);
    future.starts_at = "2099-01-01T00:00:00Z";
    future.ends_at = "2099-02-01T00:00:00Z";
    let mut past = TestActivity::open("past", 10);
    past.starts_at = "2020-01-01T00:00:00Z";
    past.ends_at = "2021-01-01T00:00:00Z";
    let (redis, upstream, gw) = setup(vec![TestActivity::open("1001", 2), multi, future, past]);

    // unauthenticated: missing, empty, two identities.
    let no_one: [&[(&str, &str)]; 3] = [
        &[],
        &[("X-User-Id", "")],
        &[("X-User-Id", "a"), ("X-User-Id", "b")],
    ];
    for headers in no_one {
        let resp = request(gw.addr, "POST", "/api/seckill/1001/buy", headers).await;
        assert_gateway_answer(&resp, 401, "unauthenticated");
    }

    // bad_request: not an integer, < 1, > max_per_request, repeated.
    for q in [
        "qty=abc",
        "qty=0",
        "qty=-1",
        "qty=1.5",
        "qty=3",
        "qty=1&qty=1",
        "qty=99999999999999999999",
    ] {
        let resp = request(
            gw.addr,
            "POST",
            &format!("/api/seckill/multi/buy?{q}"),
            &[("X-User-Id", "u")],
        )
        .await;
        assert_gateway_answer(&resp, 400, "bad_request");
    }

    assert_gateway_answer(&gw.buy("nope", "u", None).await, 404, "unknown_activity");
    assert_gateway_answer(&gw.buy("future", "u", None).await, 403, "not_started");
    assert_gateway_answer(&gw.buy("past", "u", None).await, 410, "ended");

    // The winner reaches the upstream and learns its reservation id.
    let win = gw.buy("1001", "alice", None).await;
    assert_eq!(win.status, 200, "{}", win.text());
    let jti = win
        .header("x-flashgate-reservation-id")
        .expect("reservation id")
        .to_owned();
    assert!(!jti.is_empty());

    // limit_exceeded: alice already holds her one unit (one unit is still on sale).
    assert_gateway_answer(&gw.buy("1001", "alice", None).await, 409, "limit_exceeded");
    assert_eq!(gw.buy("1001", "bob", None).await.status, 200);
    // sold_out: both units are gone.
    assert_gateway_answer(&gw.buy("1001", "carol", None).await, 410, "sold_out");

    // Multi-unit: 2 + 2 > limit 3 is refused; 2 + 1 fits.
    assert_eq!(gw.buy("multi", "carol", Some(2)).await.status, 200);
    assert_gateway_answer(
        &gw.buy("multi", "carol", Some(2)).await,
        409,
        "limit_exceeded",
    );
    assert_eq!(gw.buy("multi", "carol", Some(1)).await.status, 200);

    // rate_limited: burst 5 per user; a user hammering gets 429 with Retry-After.
    let mut limited = None;
    for _ in 0..30 {
        let resp = gw.buy("1001", "hammer", None).await;
        if resp.status == 429 {
            limited = Some(resp);
            break;
        }
    }
    let limited = limited.expect("a hammering buyer is rate limited");
    assert_gateway_answer(&limited, 429, "rate_limited");
    let retry: u64 = limited
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1);

    // One structured decision line per request, with the stock before and after.
    let logs = wait_for_async(
        "decision lines to be written",
        std::time::Duration::from_secs(5),
        || async {
            let logs = gw.logs();
            logs.contains("outcome=\"sold_out\"").then_some(logs)
        },
    )
    .await;
    let winner = logs
        .lines()
        .find(|l| {
            l.contains("flashgate::decision")
                && l.contains("user=\"alice\"")
                && l.contains("outcome=\"admitted\"")
        })
        .expect("alice's decision line");
    for field in [
        "activity=\"1001\"",
        "qty=1",
        "stock_before=2",
        "stock_after=1",
        "reservation=",
    ] {
        assert!(winner.contains(field), "{field} missing in {winner}");
    }

    // Only the four winners reached the upstream.
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 4, "{seen:#?}");
    // Redis agrees: 1001 sold out, multi has 7 left.
    let mut conn = redis.conn();
    let left: i64 = redis::cmd("GET")
        .arg("fg:{multi}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, 7);
    let left: i64 = redis::cmd("GET")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_sale_routes_pass_through_unchanged() {
    let (_redis, upstream, gw) = setup(vec![TestActivity::open("1001", 5)]);
    // Other paths reach the upstream as they are; the sale path with another method is 405
    // (a method-agnostic handler would sell unreserved), unless the route forwards it.
    let resp = get(
        gw.addr,
        "/api/products/7?color=red",
        &[("X-Custom", "kept")],
    )
    .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["path"], "/api/products/7");
    let resp = get(gw.addr, "/api/seckill/1001/buy", &[]).await;
    assert_eq!(resp.status, 405, "GET is not the sale route's method");
    assert_eq!(resp.header("allow"), Some("POST"));
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["query"], "color=red");
    assert_eq!(seen[0]["headers"]["x-custom"], "kept");
    assert!(seen[0]["headers"].get("x-flashgate-reservation").is_none());
    // No reservation was taken for them (read once the prewarm has written the stock: no
    // request here made it).
    let remaining = wait_for_async(
        "the stock to be prewarmed",
        Duration::from_secs(10),
        || async { gw.activity_view("1001").await["remaining"].as_u64() },
    )
    .await;
    assert_eq!(remaining, 5);
}

/// A route that forwards GET (`forward_methods: [GET]`, a product page at the purchase's
/// address) passes it through unreserved; any other method there is still 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_forwards_the_methods_it_names() {
    let (_redis, upstream, config) = backends(vec![TestActivity::open("1001", 5)]);
    let config = config.set("/sale_routes/0/forward_methods", serde_json::json!(["GET"]));
    let gw = GatewayProc::start(config);
    let resp = get(gw.addr, "/api/seckill/1001/buy", &[]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 1);
    assert!(seen[0]["headers"].get("x-flashgate-reservation").is_none());
    let put = request(gw.addr, "PUT", "/api/seckill/1001/buy", &[]).await;
    assert_eq!(put.status, 405);
    assert_eq!(put.header("allow"), Some("POST, GET"));
}
