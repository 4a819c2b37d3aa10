//! Bursts: many buyers at the same instant never oversell, and only winners reach the upstream.

use crate::support::*;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::collections::HashSet;

#[derive(Debug, Deserialize)]
struct Claims {
    jti: String,
    sub: String,
    act: String,
    qty: u32,
    ver: u64,
    iat: u64,
    exp: u64,
}

fn verify(token: &str) -> Claims {
    let header = jsonwebtoken::decode_header(token).expect("JWT header");
    assert_eq!(header.alg, Algorithm::HS256);
    assert_eq!(header.kid.as_deref(), Some("k1"));
    assert_eq!(header.typ.as_deref(), Some("JWT"));
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp", "iat", "jti", "sub"]);
    validation.leeway = 0;
    jsonwebtoken::decode::<Claims>(
        token,
        &DecodingKey::from_secret(SIGNING_SECRET.as_bytes()).unwrap(),
        &validation,
    )
    .expect("reservation verifies")
    .claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_buyers_one_instant_exactly_the_stock_wins() {
    const BUYERS: usize = 2000;
    const STOCK: u64 = 100;
    let (redis, upstream, mut config) = backends(vec![TestActivity::open("1001", STOCK)]);
    config.redis_timeout_ms = 2000; // a debug build on 2 cores under a 2,000-connection burst
    let gw = GatewayProc::start(config);

    let requests = (0..BUYERS)
        .map(|i| {
            raw_request(
                "POST",
                "/api/seckill/1001/buy",
                &[("X-User-Id", &format!("buyer-{i}"))],
            )
        })
        .collect();
    let responses = burst(gw.addr, requests).await;

    let winners: Vec<&HttpResponse> = responses.iter().filter(|r| r.status == 200).collect();
    let losers = responses
        .iter()
        .filter(|r| r.status == 410 && r.code() == "sold_out")
        .count();
    assert_eq!(
        winners.len() as u64,
        STOCK,
        "statuses: {:?}",
        status_counts(&responses)
    );
    assert_eq!(
        losers,
        BUYERS - STOCK as usize,
        "statuses: {:?}",
        status_counts(&responses)
    );

    // Exactly the winners reached the upstream, each with a valid, unique reservation.
    let seen = upstream.requests().await;
    assert_eq!(seen.len() as u64, STOCK);
    let mut jtis = HashSet::new();
    let mut users = HashSet::new();
    for req in &seen {
        let token = req["headers"]["x-flashgate-reservation"]
            .as_str()
            .expect("signed reservation");
        let claims = verify(token);
        assert_eq!(claims.act, "1001");
        assert_eq!((claims.qty, claims.ver), (1, 1));
        assert_eq!(claims.exp, claims.iat + 900);
        assert_eq!(
            req["headers"]["x-user-id"].as_str(),
            Some(claims.sub.as_str())
        );
        assert!(jtis.insert(claims.jti), "duplicate jti");
        assert!(users.insert(claims.sub), "a user won twice");
    }
    // The ids the buyers were told are the ids the upstream got.
    let told: HashSet<String> = winners
        .iter()
        .map(|r| r.header("x-flashgate-reservation-id").unwrap().to_owned())
        .collect();
    assert_eq!(told, jtis);

    let mut conn = redis.conn();
    let left: i64 = redis::cmd("GET")
        .arg("fg:{1001}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, 0, "never negative, nothing left");
    assert_eq!(gw.activity_view("1001").await["sold_out"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_in_parallel_with_multi_unit_quantities_stays_within_the_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut activity = TestActivity::open("multi", 1000);
    activity.per_user_limit = 3;
    activity.max_per_request = 2;
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config.per_user = Some((1000, 1000));
    config.redis_timeout_ms = 2000;
    let gw = GatewayProc::start(config);

    for round in 0..5 {
        let user = format!("greedy-{round}");
        let requests = (0..40)
            .map(|i| {
                let qty = 1 + i % 2;
                raw_request(
                    "POST",
                    &format!("/api/seckill/multi/buy?qty={qty}"),
                    &[("X-User-Id", &user)],
                )
            })
            .collect();
        let responses = burst(gw.addr, requests).await;
        let mut units = 0;
        for (i, r) in responses.iter().enumerate() {
            match r.status {
                200 => units += 1 + i % 2,
                409 => assert_eq!(r.code(), "limit_exceeded"),
                other => panic!("unexpected {other}: {}", r.text()),
            }
        }
        assert!(units <= 3, "{user} got {units} units with a limit of 3");
        // A greedy buyer who asks in both sizes always fills the limit exactly.
        assert_eq!(units, 3, "{user}");
        let mut conn = redis.conn();
        let held: i64 = redis::cmd("HGET")
            .arg("fg:{multi}:users")
            .arg(&user)
            .query(&mut conn)
            .unwrap();
        assert_eq!(held, 3);
    }
    let mut conn = redis.conn();
    let left: i64 = redis::cmd("GET")
        .arg("fg:{multi}:v1:stock")
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, 1000 - 5 * 3);
}

fn status_counts(responses: &[HttpResponse]) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for r in responses {
        *counts.entry(r.status).or_default() += 1;
    }
    counts
}
