//! Security and bad input: spoofed identities, identity tokens, abuse limits, oversized bodies,
//! and a corpus of malformed requests after which the gateway still serves.

use crate::support::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncWriteExt;

const IDENTITY_SECRET: &str = "identity-secret-for-tests";

fn base(activities: Vec<TestActivity>) -> (RedisServer, Upstream, TestConfig) {
    let (redis, upstream, config) = backends(activities);
    (redis, upstream, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_header_counts_only_from_trusted_proxies() {
    let (_redis, upstream, mut config) = base(vec![TestActivity::open("1001", 5)]);
    config = config.trusted_proxies(&["10.0.0.0/8"]);
    let gw = GatewayProc::start(config.clone());
    // We connect from 127.0.0.1, which is not a trusted proxy: the header is ignored.
    let spoofed = gw.buy("1001", "alice", None).await;
    spoofed.assert_answer(401, "unauthenticated");
    assert!(upstream.requests().await.is_empty());
    drop(gw);

    config = config.trusted_proxies(&["127.0.0.0/8"]);
    config = config.on_new_ports();
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
}

fn token(claims: serde_json::Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("idp1".into());
    jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_secret(IDENTITY_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_identified_by_verified_tokens() {
    let (_redis, upstream, mut config) = base(vec![TestActivity::open("1001", 5)]);
    config = config.jwt_identity(Jwt::session_cookie().issuer("https://idp.test"));
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    let buy = |headers: Vec<(&'static str, String)>| {
        let addr = gw.addr;
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            request(addr, "POST", "/api/seckill/1001/buy", &h).await
        }
    };
    let good =
        token(serde_json::json!({"sub": "alice", "iss": "https://idp.test", "exp": now() + 300}));
    let resp = buy(vec![("Authorization", format!("Bearer {good}"))]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let bob =
        token(serde_json::json!({"sub": "bob", "iss": "https://idp.test", "exp": now() + 300}));
    let resp = buy(vec![("Cookie", format!("lang=en; session={bob}"))]).await;
    assert_eq!(resp.status, 200, "the cookie works too");

    let expired =
        token(serde_json::json!({"sub": "carol", "iss": "https://idp.test", "exp": now() - 60}));
    let wrong_iss =
        token(serde_json::json!({"sub": "carol", "iss": "https://evil.test", "exp": now() + 300}));
    for (what, headers) in [
        ("no token", vec![]),
        (
            "expired",
            vec![("Authorization", format!("Bearer {expired}"))],
        ),
        (
            "wrong issuer",
            vec![("Authorization", format!("Bearer {wrong_iss}"))],
        ),
        (
            "forged",
            vec![(
                "Authorization",
                format!("Bearer {}x", &good[..good.len() - 1]),
            )],
        ),
        (
            "a plain header is not an identity here",
            vec![("X-User-Id", "carol".to_owned())],
        ),
    ] {
        let resp = buy(headers).await;
        assert_eq!(
            (resp.status, resp.code().as_str()),
            (401, "unauthenticated"),
            "{what}"
        );
    }
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 2);
    // The reservation names the verified user.
    let claims = jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(
        seen[1]["headers"]["x-flashgate-reservation"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
    .claims;
    assert_eq!(claims["sub"], "bob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_ip_and_per_activity_buckets_with_shadow_mode() {
    let (redis, _upstream, mut config) = base(vec![
        TestActivity::open("1001", 100),
        TestActivity::open("2002", 100),
    ]);
    config.per_user = None;
    config = config.per_ip_rate(Rate::new(1, 3));
    let gw = GatewayProc::start(config.clone());
    // One address, many "users": the IP bucket stops it before any identity work or Redis.
    let mut statuses = Vec::new();
    for i in 0..30 {
        let status = gw.buy("1001", &format!("bot-{i}"), None).await.status;
        statuses.push(status);
        if status == 429 {
            break;
        }
    }
    // A full bucket admits its burst; sending ten times faster than it refills empties it.
    assert_eq!(&statuses[..3], [200, 200, 200]);
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let m = gw
        .metrics_when(|m| {
            m.contains(r#"flashgate_rate_limit_refusals_total{limit="per_ip",mode="enforced"}"#)
                && !m.contains(
                    r#"flashgate_rate_limit_refusals_total{limit="per_ip",mode="enforced"} 0"#,
                )
        })
        .await;
    assert!(m.contains(r#"flashgate_rate_limit_refusals_total{limit="per_ip",mode="enforced"}"#));
    assert!(
        !m.contains(r#"flashgate_rate_limit_refusals_total{limit="per_ip",mode="enforced"} 0"#),
        "{m}"
    );
    drop(gw);

    // A shadow per-activity limit (and no per-IP one) counts what it would refuse but admits.
    config.rate_limits = RateLimits::default();
    config = config.per_activity_rate(Rate::new(1, 1).shadow());
    config = config.on_new_ports();
    let gw = GatewayProc::start(config);
    for i in 0..5 {
        assert_eq!(
            gw.buy("2002", &format!("shadow-{i}"), None).await.status,
            200
        );
    }
    let series = r#"flashgate_rate_limit_refusals_total{limit="per_activity",mode="shadow"}"#;
    let m = gw
        .metrics_when(|m| metric_value(m, series).is_some_and(|v| v >= 3.0))
        .await;
    let shadow = metric_value(&m, series).unwrap() as u64;
    assert!(shadow >= 3, "{shadow} shadow refusals counted");
    assert_eq!(redis.get_int("fg:{2002}:v1:stock"), Some(95));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_sale_bodies_are_refused_and_release_nothing() {
    let (redis, upstream, config) = base(vec![TestActivity::open("1001", 5)]);
    let gw = GatewayProc::start(config);
    // Declared too large: refused before admission.
    let raw = "POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: alice\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n";
    let resp = send_raw(gw.addr, raw.as_bytes()).await.unwrap();
    resp.assert_answer(400, "bad_request");
    // Chunked, growing past the limit while streaming: the reservation is given back.
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = "POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: bob\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 8192, "a".repeat(8192));
    for _ in 0..3 {
        let _ = stream.write_all(chunk.as_bytes()).await;
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let resp = send_on(&mut stream, b"").await;
    if let Ok(resp) = resp {
        assert!(resp.status == 400 || resp.status >= 500, "{}", resp.status);
    }
    wait_for(
        "the chunked buyer's unit to come back",
        Duration::from_secs(10),
        || (redis.get_int("fg:{1001}:v1:stock") == Some(5)).then_some(()),
    );
    assert_eq!(redis.held("1001", "bob"), None);
    assert!(upstream
        .requests()
        .await
        .iter()
        .all(|r| r["body"].as_str().unwrap_or("").len() <= 16 * 1024));
}

/// Requests an edge gateway meets: each must get a 4xx or a closed connection, never a 5xx or a
/// crash, and the gateway must keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corpus_of_malformed_requests_never_breaks_the_gateway() {
    let (redis, _upstream, mut config) = base(vec![TestActivity::open("1001", 1000)]);
    config.per_user = None;
    let gw = GatewayProc::start(config);
    let long_header = format!("X-Junk: {}\r\n", "a".repeat(200_000));
    let many_headers: String = (0..300).map(|i| format!("X-H{i}: v\r\n")).collect();
    let sale =
        |extra: &str| format!("POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
    let corpus: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\x01\x02 hello\r\n\r\n".to_vec()),
        ("no version", b"GET /\r\n\r\n".to_vec()),
        ("bad version", b"GET / HTTP/9.9\r\n\r\n".to_vec()),
        ("lowercase method", b"post /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n".to_vec()),
        ("space in path", b"POST /api/seckill/10 01/buy HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("header without colon", sale("X-User-Id alice\r\n").into_bytes()),
        ("invalid UTF-8 user", [sale("").trim_end().as_bytes(), b"X-User-Id: \xff\xfe\r\n\r\n"].concat()),
        ("NUL in user", [sale("").trim_end().as_bytes(), b"X-User-Id: a\x00b\r\n\r\n"].concat()),
        ("huge header", sale(&format!("X-User-Id: a\r\n{long_header}")).into_bytes()),
        ("300 headers", sale(&format!("X-User-Id: a\r\n{many_headers}")).into_bytes()),
        ("two content lengths", sale("X-User-Id: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n").into_bytes()),
        ("bad content length", sale("X-User-Id: a\r\nContent-Length: abc\r\n").into_bytes()),
        ("negative content length", sale("X-User-Id: a\r\nContent-Length: -1\r\n").into_bytes()),
        ("qty overflow", b"POST /api/seckill/1001/buy?qty=184467440737095516160 HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n".to_vec()),
        ("qty unicode digits", "POST /api/seckill/1001/buy?qty=\u{ff11} HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n".as_bytes().to_vec()),
        ("qty percent-encoded", b"POST /api/seckill/1001/buy?qty=%31 HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n".to_vec()),
        ("activity with a NUL", b"POST /api/seckill/10%0001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n".to_vec()),
        ("activity with a brace", b"POST /api/seckill/%7B1001%7D/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n".to_vec()),
        ("very long path", format!("POST /api/seckill/{}/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: a\r\n\r\n", "9".repeat(60_000)).into_bytes()),
        ("long user id", sale(&format!("X-User-Id: {}\r\n", "u".repeat(5000))).into_bytes()),
        ("bad chunked", sale("X-User-Id: a\r\nTransfer-Encoding: chunked\r\n").into_bytes().into_iter().chain(b"zz\r\nxx\r\n".iter().copied()).collect()),
        ("bad idempotency key", sale("X-User-Id: a\r\nIdempotency-Key: \x01\r\n").into_bytes()),
    ];
    for (what, raw) in &corpus {
        let mut stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let _ = stream.write_all(raw).await;
        let _ = stream.shutdown().await;
        // A closed connection without an answer is fine too.
        if let Ok(resp) = send_on(&mut stream, b"").await {
            assert!(resp.status < 500, "{what}: {} {}", resp.status, resp.text());
        }
    }
    // Slow clients holding connections open do not stop others.
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-Us")
            .await
            .unwrap();
        slow.push(s);
    }
    let started = std::time::Instant::now();
    let resp = gw.buy("1001", "after-the-storm", None).await;
    assert_eq!(resp.status, 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(slow);
    assert_eq!(get(gw.admin, "/healthz", &[]).await.status, 200);
    // No malformed request took stock: only the last buyer did.
    let left = redis.get_int("fg:{1001}:v1:stock").unwrap();
    assert!(left >= 990, "{left}");
}
