//! The reservation header: only the gateway's, never a client's.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_reservation_header_never_reaches_the_upstream() {
    let (_redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 0)]).parts();
    let forged = "eyJhbGciOiJub25lIn0.eyJqdGkiOiJmb3JnZWQifQ.";

    // On a pass-through route the header is removed.
    let resp = request(
        gw.addr,
        "POST",
        "/api/orders",
        &[("X-Flashgate-Reservation", forged)],
    )
    .await;
    assert_eq!(resp.status, 200);
    // On a sale route that loses, nothing is forwarded at all.
    let resp = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[
            ("X-User-Id", "mallory"),
            ("X-Flashgate-Reservation", forged),
        ],
    )
    .await;
    assert_eq!(resp.code(), "sold_out");
    // Twice, in different cases, on a pass-through route.
    let resp = request(
        gw.addr,
        "GET",
        "/api/orders",
        &[
            ("x-flashgate-reservation", forged),
            ("X-FLASHGATE-RESERVATION", forged),
        ],
    )
    .await;
    assert_eq!(resp.status, 200);

    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 2);
    for req in seen {
        assert!(
            req["headers"].get("x-flashgate-reservation").is_none(),
            "{req:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_winner_carries_the_gateways_reservation_not_the_clients() {
    let (_redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    let resp = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[
            ("X-User-Id", "alice"),
            ("X-Flashgate-Reservation", "forged"),
        ],
    )
    .await;
    assert_eq!(resp.status, 200);
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 1);
    let token = seen[0]["headers"]["x-flashgate-reservation"]
        .as_str()
        .unwrap();
    assert_ne!(token, "forged");
    assert_eq!(token.split('.').count(), 3, "a compact JWS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eddsa_reservations_verify_with_the_public_key() {
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};
    let (_redis, upstream, mut config) = backends(vec![TestActivity::open("1001", 5)]);
    config.eddsa_key_file = Some(repo_path("tests/fixtures/ed25519.pem"));
    let gw = GatewayProc::start(config);
    assert_eq!(gw.buy("1001", "alice", Some(1)).await.status, 200);
    let seen = upstream.requests().await;
    let token = seen[0]["headers"]["x-flashgate-reservation"]
        .as_str()
        .unwrap();
    assert_eq!(
        jsonwebtoken::decode_header(token).unwrap().alg,
        Algorithm::EdDSA
    );
    let public = std::fs::read(repo_path("tests/fixtures/ed25519.pub.pem")).unwrap();
    let claims = jsonwebtoken::decode::<serde_json::Value>(
        token,
        &DecodingKey::from_ed_pem(&public).unwrap(),
        &Validation::new(Algorithm::EdDSA),
    )
    .expect("verifies with the public key")
    .claims;
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["act"], "1001");

    // A backend can fetch the verification key instead: the admin JWKS, by kid.
    let jwks: jsonwebtoken::jwk::JwkSet =
        serde_json::from_slice(&get(gw.admin, "/.well-known/jwks.json", &[]).await.body).unwrap();
    let kid = jsonwebtoken::decode_header(token).unwrap().kid.unwrap();
    let jwk = jwks.find(&kid).expect("the active key is published");
    jsonwebtoken::decode::<serde_json::Value>(
        token,
        &DecodingKey::from_jwk(jwk).unwrap(),
        &Validation::new(Algorithm::EdDSA),
    )
    .expect("verifies with the published key");
}
