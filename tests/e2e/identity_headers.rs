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
