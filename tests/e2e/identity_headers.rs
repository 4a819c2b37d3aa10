//! Identity at the edge, over raw sockets: headers that carry an identity an auth proxy vouched
//! for never reach the backend from an untrusted peer (one header of each family, on a purchase
//! and on another route), and a request names one buyer or is refused.

use crate::support::*;

/// One header of each family the gateway strips by default, and one the YAML adds.
const FAMILIES: &[(&str, &str)] = &[
    ("oauth2-proxy", "X-Forwarded-Groups"),
    ("oauth2-proxy", "X-Auth-Request-Email"),
    ("oauth2-proxy", "X-Auth-Request-Access-Token"),
    ("Authelia / forward auth", "Remote-Groups"),
    ("Authelia / forward auth", "Remote-Email"),
    ("Apache behind a proxy", "X-Remote-User"),
    ("Grafana-style auth proxy", "X-WEBAUTH-USER"),
    ("authentik", "X-authentik-groups"),
    ("Pomerium", "X-Pomerium-Claim-Email"),
    ("Google IAP", "X-Goog-Authenticated-User-Email"),
    ("AWS ALB", "X-Amzn-Oidc-Identity"),
    ("Cloudflare Access", "Cf-Access-Authenticated-User-Email"),
    ("Azure Easy Auth", "X-MS-CLIENT-PRINCIPAL-NAME"),
    ("client certificate", "X-Forwarded-Client-Cert"),
    ("client certificate", "X-SSL-Client-S-DN"),
    ("client certificate", "X-Client-Cert"),
    // From the adversarial pass.
    (
        "Traefik client certificate",
        "X-Forwarded-Tls-Client-Cert-Info",
    ),
    ("AWS ALB mTLS", "X-Amzn-Mtls-Clientcert-Leaf"),
    ("nginx client certificate", "Ssl-Client-Verify"),
    ("oauth2-proxy, any suffix", "X-Auth-Request-Anything"),
    ("Apache relatives", "X-Remote-Groups"),
    ("auth-proxy relatives", "X-Webauth-Role"),
    ("Kong", "X-Consumer-Username"),
    ("Kong", "X-Authenticated-Userid"),
    ("Keycloak gatekeeper", "X-Auth-Roles"),
    ("Vouch Proxy", "X-Vouch-User"),
    ("Tailscale", "Tailscale-User-Login"),
    ("Shibboleth", "Shib-Identity-Provider"),
    ("Cloudflare mTLS", "Cf-Client-Cert-Sha256"),
    // The second pass: other separators (lighttpd maps every one to `_`), more families.
    ("lighttpd-read separators", "X.Remote.User"),
    ("lighttpd-read separators", "Shib+Uid"),
    ("mod_auth_openidc", "Oidc-Claim-Email"),
    ("kong-oidc", "X-Userinfo"),
    ("Google Cloud Endpoints", "X-Endpoint-Api-Userinfo"),
    ("identity.strip_headers", "X-Corp-Role"),
    ("an underscore spelling", "X_Forwarded_Groups"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_proxy_identity_headers_from_an_untrusted_peer_never_reach_the_backend() {
    let (_redis, upstream, config) = backends(vec![TestActivity::open("1001", 5)]);
    let gw = GatewayProc::start(config.strip_headers(&["X-Corp-*"]));
    let mut headers: Vec<(&str, &str)> = FAMILIES.iter().map(|(_, h)| (*h, "admins")).collect();
    headers.push(("X-User-Id", "alice"));
    // A purchase (the front forwards it) and another route (Pingora's proxy forwards it).
    let buy = raw_request("POST", "/api/seckill/1001/buy", &headers);
    assert_eq!(send_raw(gw.addr, buy.as_bytes()).await.unwrap().status, 200);
    let other = raw_request("GET", "/shop/item", &headers);
    assert_eq!(
        send_raw(gw.addr, other.as_bytes()).await.unwrap().status,
        200
    );
    let seen = upstream.requests().await;
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for request in &seen {
        let got = request["headers"].as_object().expect("headers recorded");
        for (family, header) in FAMILIES {
            let name = header.to_ascii_lowercase();
            assert!(
                !got.contains_key(&name),
                "{family}: {header} reached the backend: {request}"
            );
        }
        assert_eq!(got.get("x-user-id").and_then(|v| v.as_str()), Some("alice"));
    }
}

/// Two bearer headers, a bearer and another buyer's session cookie, or the session cookie twice:
/// the gateway never picks one (the backend, receiving both, might read the other): 400, and
/// nothing is reserved or forwarded. The same buyer twice over is one identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_names_two_buyers_is_refused() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    const SECRET: &str = "identity-secret-for-tests";
    let (_redis, upstream, config) = backends(vec![TestActivity::open("1001", 5)]);
    let config = config.jwt_identity(Jwt::session_cookie().issuer("https://idp.test"));
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", SECRET)]);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 300;
    let token = |sub: &str| {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("idp1".into());
        let claims = serde_json::json!({"sub": sub, "iss": "https://idp.test", "exp": exp});
        let key = EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let (bearer_a, bearer_b) = (format!("Bearer {alice}"), format!("Bearer {bob}"));
    let (cookie_a, cookie_b) = (format!("session={alice}"), format!("session={bob}"));
    let both_in_one = format!("session={alice}; lang=en; session={bob}");
    // Spellings other frameworks read as the session cookie (ASP.NET Core, PHP, Node).
    let other_case = format!("Session={bob}");
    let encoded = format!("%73ession={bob}; session={alice}");
    for (what, headers) in [
        (
            "two bearer headers",
            vec![("Authorization", &bearer_a), ("Authorization", &bearer_b)],
        ),
        (
            "a bearer and another buyer's cookie",
            vec![("Authorization", &bearer_a), ("Cookie", &cookie_b)],
        ),
        ("the session cookie twice", vec![("Cookie", &both_in_one)]),
        (
            "the session cookie in two headers",
            vec![("Cookie", &cookie_a), ("Cookie", &cookie_b)],
        ),
        (
            "a bearer and another buyer's Session cookie",
            vec![("Authorization", &bearer_a), ("Cookie", &other_case)],
        ),
        ("an encoded cookie name", vec![("Cookie", &encoded)]),
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let req = raw_request("POST", "/api/seckill/1001/buy", &h);
        let resp = send_raw(gw.addr, req.as_bytes()).await.unwrap();
        assert_eq!(
            (resp.status, resp.code()),
            (400, "bad_request".into()),
            "{what}"
        );
        assert!(resp.json()["message"]
            .as_str()
            .unwrap()
            .contains("more than one buyer"));
    }
    assert!(upstream.requests().await.is_empty(), "nothing forwarded");
    // The same buyer by bearer and cookie: one identity.
    let h = [
        ("Authorization", bearer_a.as_str()),
        ("Cookie", cookie_a.as_str()),
    ];
    let req = raw_request("POST", "/api/seckill/1001/buy", &h);
    assert_eq!(send_raw(gw.addr, req.as_bytes()).await.unwrap().status, 200);
}
