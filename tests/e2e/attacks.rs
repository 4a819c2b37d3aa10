//! An attack corpus through the real gateway, in front of the recording demo backend: every
//! spelling of a purchase, quantity look-alikes, slow and cut bodies, header look-alikes,
//! forwarding headers from untrusted peers, conflicting lengths. Each case asserts what the
//! backend received (never a purchase without a valid reservation, never a forged header) and
//! that stock and limits are exact afterwards.

use crate::support::*;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The claims of a reservation the backend received, verified as a backend must.
fn verified(token: &str) -> serde_json::Value {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp", "iat", "jti", "sub"]);
    jsonwebtoken::decode::<serde_json::Value>(
        token,
        &DecodingKey::from_secret(SIGNING_SECRET.as_bytes()).unwrap(),
        &validation,
    )
    .expect("a reservation signed by the gateway")
    .claims
}

/// Sends raw bytes, with `Connection: close` expected in them; the status, if any answer came.
async fn status_of(gw: &GatewayProc, raw: String) -> Option<u16> {
    send_raw(gw.addr, raw.as_bytes())
        .await
        .ok()
        .map(|r| r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_purchase_is_admitted_in_its_canonical_form() {
    // #13 defect 1: a purchase whose path differed from the sale route only by encoding, an
    // absolute-form target, the method's case or a missing leading slash was forwarded with no
    // reservation: no stock taken, no limit, sold out or not.
    let (redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 100)]).parts();
    let spellings = [
        ("POST", "/api/seckill/1001/buy"),
        ("POST", "/api/seckill/10%301/buy"),
        ("POST", "/%61pi/seckill/1001/buy"),
        ("POST", "/api%2Fseckill%2F1001/buy"),
        ("POST", "http://shop.test/api/seckill/1001/buy"),
        ("POST", "api/seckill/1001/buy"),
        ("POST", "/api/seckill/./1001/buy"),
        ("POST", "/api/x/../seckill/1001/buy"),
        ("POST", "/api\\seckill\\1001\\buy"),
        ("POST", "/api/seckill/1001/buy;jsessionid=1"),
        ("POST", "/API/SECKILL/1001/BUY"),
        ("POST", "//api//seckill//1001//buy//"),
        ("post", "/api/seckill/1001/buy"),
        ("Post", "/api/seckill/1001/buy"),
    ];
    let mut admitted = 0;
    for (i, (method, path)) in spellings.iter().enumerate() {
        let user = format!("speller-{i}");
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: shop.test\r\nX-User-Id: {user}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let status = status_of(&gw, raw).await;
        assert_eq!(status, Some(200), "{method} {path}");
        admitted += 1;
    }
    let received = upstream.requests().await;
    assert_eq!(received.len(), admitted, "each reached the backend once");
    for r in &received {
        assert_eq!(r["method"], "POST", "{r}");
        assert_eq!(
            r["path"], "/api/seckill/1001/buy",
            "forwarded in canonical form: {r}"
        );
        let claims = verified(r["headers"]["x-flashgate-reservation"].as_str().unwrap());
        assert_eq!(claims["act"], "1001");
    }
    assert_eq!(
        redis.get_int("fg:{1001}:v1:stock"),
        Some(100 - admitted as i64)
    );
    // The limit holds across spellings: one buyer, two of them.
    let again = "POST /api/seckill/%31001/buy HTTP/1.1\r\nHost: shop.test\r\nX-User-Id: speller-0\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let resp = send_raw(gw.addr, again.as_bytes()).await.unwrap();
    assert_eq!(resp.code(), "limit_exceeded");
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_sale_is_sold_out_under_every_spelling() {
    let (_redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 0)]).parts();
    for (method, path) in [
        ("POST", "/api/seckill/1001/buy"),
        ("POST", "/api%2fseckill/1001/buy"),
        ("post", "/API/seckill/1001/buy"),
        ("POST", "http://x/api/seckill/1001/buy"),
    ] {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nX-User-Id: u\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let resp = send_raw(gw.addr, raw.as_bytes()).await.unwrap();
        assert_eq!(resp.code(), "sold_out", "{method} {path}");
    }
    assert!(upstream.requests().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantity_lookalikes_are_refused_never_ignored() {
    // #13 defect 1, the quantity: `QTY`, `%71ty`, `qty[]` were ignored (one unit reserved)
    // while a lenient backend read them.
    let (redis, upstream, gw) = Stack::start(vec![TestActivity {
        per_user_limit: 5,
        max_per_request: 5,
        ..TestActivity::open("1001", 20)
    }])
    .parts();
    let buy = |user: &str, query: &str, body: Option<(&str, &str)>| {
        let (ct, body) = body.unwrap_or(("", ""));
        let ct = if ct.is_empty() {
            String::new()
        } else {
            format!("Content-Type: {ct}\r\n")
        };
        format!(
            "POST /api/seckill/1001/buy{query} HTTP/1.1\r\nHost: x\r\nX-User-Id: {user}\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let form = "application/x-www-form-urlencoded";
    for (i, (query, body)) in [
        ("?QTY=4", None),
        ("?%71ty=4", None),
        ("?qty[]=4", None),
        ("?qty=1&Qty=4", None),
        ("?qty=1", Some((form, "qty=4"))),
        ("", Some((form, "QTY=2"))),
        ("?qty=1", Some(("application/json", r#"{"qty": 4}"#))),
        ("?qty=2", Some((form, "qty=2&qty[]=3"))),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = send_raw(
            gw.addr,
            buy(&format!("lookalike-{i}"), query, body).as_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(
            (resp.status, resp.code().as_str()),
            (400, "bad_request"),
            "{query} {body:?}"
        );
    }
    assert!(upstream.requests().await.is_empty());
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(20));
    // A body that agrees with the query is fine.
    let resp = send_raw(
        gw.addr,
        buy("agrees", "?qty=2", Some((form, "qty=2&note=hi"))).as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 200);
    let received = upstream.requests().await;
    assert_eq!(
        received[0]["body"], "qty=2&note=hi",
        "the body reaches the backend whole"
    );
    assert_eq!(
        verified(
            received[0]["headers"]["x-flashgate-reservation"]
                .as_str()
                .unwrap()
        )["qty"],
        2
    );
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(18));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_stock_and_no_backend_slot() {
    // #13 defect 2: 200 sale requests trickling a chunked body a byte at a time each held a
    // reservation and an upstream slot with no deadline; with max_inflight 200 every real buyer
    // got 503.
    let (redis, upstream, mut config) = backends(vec![TestActivity::open("1001", 500)]);
    config.per_user = None;
    config = config.max_inflight(200);
    config = config.sale_body_timeout_ms(1500);
    let gw = std::sync::Arc::new(GatewayProc::start(config));
    let mut slow = Vec::new();
    for i in 0..200 {
        let addr = gw.addr;
        slow.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: slow-{i}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await.unwrap();
            // A byte every 400 ms, for longer than the deadline allows: the slow client's pace
            // (on purpose), not a wait for anything.
            for _ in 0..10 {
                if s.write_all(b"1\r\na\r\n").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
            send_on(&mut s, b"").await.ok().map(|r| r.status)
        }));
    }
    // Meanwhile, real buyers are served.
    wait_for_async(
        "the slow bodies to be under way",
        Duration::from_secs(10),
        || async {
            let m = gw.metrics().await;
            (!m.is_empty()).then_some(())
        },
    )
    .await;
    for i in 0..20 {
        assert_eq!(
            gw.buy("1001", &format!("buyer-{i}"), None).await.status,
            200
        );
    }
    for task in slow {
        let status = task.await.unwrap();
        assert!(
            matches!(status, None | Some(400)),
            "a slow body got {status:?}"
        );
    }
    let received = upstream.requests().await;
    assert_eq!(
        received.len(),
        20,
        "only the real buyers reached the backend"
    );
    assert!(received.iter().all(|r| r["headers"]["x-user-id"]
        .as_str()
        .unwrap()
        .starts_with("buyer-")));
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(480));
    assert_eq!(redis.held("1001", "slow-0"), None);
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_body_holds_nothing() {
    let (redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: cutter\r\nContent-Length: 50\r\n\r\nhalf")
        .await
        .unwrap();
    drop(s);
    // An ordinary buyer after it: the cut one never took anything.
    wait_for_async(
        "the gateway to answer the next buyer",
        Duration::from_secs(10),
        || async { (gw.buy("1001", "next", None).await.status == 200).then_some(()) },
    )
    .await;
    assert_eq!(redis.held("1001", "cutter"), None);
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(4));
    assert_eq!(upstream.requests().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookalikes_of_the_reservation_header_never_reach_the_backend() {
    // #13 defect 4: `X_Flashgate_Reservation` reached the backend, where CGI-style servers map
    // it onto the real header's variable.
    let (_redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    let forged = [
        ("X_Flashgate_Reservation", "forged"),
        ("x-flashgate_reservation", "forged"),
        ("X-FLASHGATE-RESERVATION", "forged"),
        ("X_Flashgate_Passthrough", "store-unavailable"),
    ];
    let sale = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[&[("X-User-Id", "alice")][..], &forged[..]].concat(),
    )
    .await;
    assert_eq!(sale.status, 200);
    let other = request(gw.addr, "GET", "/products/1", &forged).await;
    assert_eq!(other.status, 200);
    let received = upstream.requests().await;
    assert_eq!(received.len(), 2);
    for r in &received {
        for (name, value) in r["headers"].as_object().unwrap() {
            let reads_as = name.replace('_', "-").to_ascii_lowercase();
            if reads_as == "x-flashgate-reservation" {
                assert_eq!(name, "x-flashgate-reservation", "{r}");
                verified(value.as_str().unwrap());
            }
            assert_ne!(reads_as, "x-flashgate-passthrough", "{r}");
        }
    }
    assert!(received[1]["headers"]
        .get("x-flashgate-reservation")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_address_headers_from_untrusted_peers_are_dropped() {
    // #13 defect 3: with trusted_proxies set, a request from an untrusted peer on a pass-through
    // route kept its X-User-Id, X-Forwarded-For, X-Real-IP and Forwarded.
    let (_redis, upstream, mut config) = backends(vec![TestActivity::open("1001", 5)]);
    config = config.trusted_proxies(&["10.0.0.0/8"]);
    let gw = GatewayProc::start(config.clone());
    let claims = [
        ("X-User-Id", "victim"),
        ("X_User_Id", "victim"),
        ("X-Forwarded-For", "198.51.100.7"),
        ("X-Real-IP", "198.51.100.7"),
        ("Forwarded", "for=198.51.100.7"),
    ];
    assert_eq!(
        request(gw.addr, "GET", "/account", &claims).await.status,
        200
    );
    let r = &upstream.requests().await[0];
    let h = &r["headers"];
    assert!(
        h.get("x-user-id").is_none() && h.get("x_user_id").is_none(),
        "{r}"
    );
    assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{r}");
    assert_eq!(h["x-real-ip"], "127.0.0.1", "{r}");
    assert_eq!(h["forwarded"], "for=127.0.0.1", "{r}");
    drop(gw);

    // From a trusted proxy the identity stays (its look-alike does not), and the chain grows.
    upstream.reset().await;
    config = config.trusted_proxies(&["127.0.0.0/8"]);
    config = config.on_new_ports();
    let gw = GatewayProc::start(config);
    assert_eq!(
        request(gw.addr, "GET", "/account", &claims).await.status,
        200
    );
    let r = &upstream.requests().await[0];
    let h = &r["headers"];
    assert_eq!(h["x-user-id"], "victim", "{r}");
    assert!(h.get("x_user_id").is_none(), "{r}");
    assert_eq!(h["x-forwarded-for"], "198.51.100.7, 127.0.0.1", "{r}");
    assert_eq!(h["x-real-ip"], "198.51.100.7", "{r}");
    assert_eq!(h["forwarded"], "for=198.51.100.7, for=127.0.0.1", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_lengths_are_refused_and_repeated_ones_normalised() {
    // #13 defect 5: `Content-Length: 3, 3` was forwarded verbatim.
    let (redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    for path in ["/api/seckill/1001/buy", "/cart"] {
        let refused = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\nContent-Length: 3, 4\r\nConnection: close\r\n\r\nabcd"
        );
        assert_eq!(status_of(&gw, refused).await, Some(400), "{path}");
    }
    assert!(upstream.requests().await.is_empty());
    for (i, path) in ["/api/seckill/1001/buy", "/cart"].iter().enumerate() {
        let repeated = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nX-User-Id: r{i}\r\nContent-Length: 3, 3\r\nConnection: close\r\n\r\nabc"
        );
        let status = status_of(&gw, repeated).await;
        // Either refused outright by the HTTP parser, or forwarded with one Content-Length.
        assert!(
            matches!(status, Some(200) | Some(400)),
            "{path}: {status:?}"
        );
    }
    for r in upstream.requests().await {
        assert_eq!(r["headers"]["content-length"], "3", "{r}");
        assert_eq!(r["body"], "abc");
    }
    // At most the one forwarded purchase took a unit (read once the prewarm has written the
    // stock: every other request was refused before it, so nothing waited for it).
    let left = wait_for("the stock to be prewarmed", Duration::from_secs(10), || {
        redis.get_int("fg:{1001}:v1:stock")
    });
    assert!(left >= 4, "{left}");
}
