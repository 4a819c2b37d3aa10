//! The names of the HTTP headers flashgate itself reads or writes (the configurable ones, the
//! identity and reservation headers, come from the configuration): one list, for admission and
//! the proxy alike.

/// Response header telling the buyer which reservation they won.
pub const RESERVATION_ID: &str = "x-flashgate-reservation-id";

/// Request header marking a sale request forwarded without a reservation (the store was down
/// and the activity is `on_store_failure: passthrough`): the backend's own stock check decides.
pub const PASSTHROUGH: &str = "x-flashgate-passthrough";
/// Its value: why no reservation was made.
pub const PASSTHROUGH_VALUE: &str = "store-unavailable";

/// Request header a buyer's client sets to make retries of one purchase return the same
/// reservation.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Headers that claim the client's address, the original URL, host or scheme, another method, or
/// an identity an auth proxy vouched for, which frameworks and middlewares believe (Rails, Rack,
/// Tornado, Symfony, Spring, Java servers, Express, ASP.NET, IIS rewrite, Envoy, Traefik, CDNs,
/// auth proxies): from a peer that is not a trusted proxy they are removed on every route, since only a
/// proxy the shop runs may say such things. `X-Forwarded-For`, `Forwarded` and `X-Real-IP` are
/// rewritten instead (see `proxy::headers::write_forwarding`).
pub const CLIENT_CLAIMS: [&str; 34] = [
    "true-client-ip",
    "client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "proxy-client-ip",
    "wl-proxy-client-ip",
    "x-original-forwarded-for",
    "x-original-for",
    "x-forwarded",
    "forwarded-for",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-forwarded-proto",
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-ssl",
    "x-forwarded-uri",
    "x-forwarded-method",
    "x-scheme",
    "x-original-proto",
    "front-end-https",
    "x-original-host",
    "x-host",
    "x-original-url",
    "x-original-uri",
    "x-original-method",
    "x-rewrite-url",
    "x-envoy-original-path",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Headers that carry an identity an auth proxy vouched for, by where they come from; from a
/// peer that is not a trusted proxy they are removed on every route, under any spelling, like
/// [`CLIENT_CLAIMS`] (a backend that authorises on `X-Forwarded-Groups: admins` must not be open
/// to anyone who reaches the gateway). A trailing `*` matches every name with that prefix.
/// `identity.strip_headers` adds more; the configured identity header has its own rule.
pub const IDENTITY_CLAIMS: [&str; 56] = [
    // oauth2-proxy (`--set-xauthrequest`, `--pass-user-headers`), nginx `auth_request`.
    "x-forwarded-user",
    "x-forwarded-email",
    "x-forwarded-groups",
    "x-forwarded-preferred-username",
    "x-forwarded-access-token",
    "x-auth-request-*",
    // Keycloak gatekeeper / louketo (not `X-Auth-Token`, which clients send themselves).
    "x-auth-userid",
    "x-auth-username",
    "x-auth-email",
    "x-auth-roles",
    "x-auth-groups",
    "x-auth-subject",
    "x-auth-audience",
    // Authelia and Traefik / Caddy forward auth; Apache `mod_auth_*` behind a proxy.
    "remote-user",
    "remote-groups",
    "remote-email",
    "remote-name",
    "x-remote-*",
    // Grafana's and many apps' auth-proxy headers.
    "x-webauth-*",
    // authentik's proxy outpost.
    "x-authentik-*",
    // Pomerium.
    "x-pomerium-*",
    // Vouch Proxy.
    "x-vouch-*",
    // Kong's authentication plugins, and kong-oidc (not `X-Access-Token`, which clients send
    // themselves).
    "x-consumer-*",
    "x-authenticated-*",
    "x-credential-identifier",
    "x-credential-username",
    "x-anonymous-consumer",
    "x-userinfo",
    "x-id-token",
    // Apache mod_auth_openidc and mod_auth_mellon.
    "oidc-claim-*",
    "oidc-access-token",
    "oidc-id-token*",
    "mellon-*",
    // Google Cloud Endpoints and API Gateway; WSO2.
    "x-endpoint-api-userinfo",
    "x-apigateway-api-userinfo",
    "x-jwt-assertion*",
    // Tailscale serve / funnel.
    "tailscale-user-*",
    // Shibboleth behind a proxy.
    "shib-*",
    // Google Cloud IAP.
    "x-goog-authenticated-user-*",
    "x-goog-iap-jwt-assertion",
    // AWS Application Load Balancer (OIDC, and mTLS pass-through).
    "x-amzn-oidc-*",
    "x-amzn-mtls-*",
    // Cloudflare Access, and its mTLS fingerprints.
    "cf-access-*",
    "cf-client-cert-*",
    // Azure App Service authentication (Easy Auth).
    "x-ms-client-principal*",
    "x-ms-token-*",
    // Client certificates a TLS-terminating proxy passes on (Envoy XFCC, Traefik, nginx,
    // HAProxy, IIS ARR).
    "x-forwarded-client-cert*",
    "x-forwarded-tls-client-cert*",
    "x-ssl-client-*",
    "x-client-cert*",
    "x-client-verify",
    "x-client-dn",
    "ssl-client-*",
    "x-ssl-cert",
    "x-tls-client-*",
    "x-arr-clientcert",
];

pub const X_FORWARDED_FOR: &str = "x-forwarded-for";
pub const X_REAL_IP: &str = "x-real-ip";
pub const FORWARDED: &str = "forwarded";

/// Request and response header carrying a waiting-room ticket (also the `flashgate_ticket`
/// cookie).
pub const QUEUE_TICKET: &str = "x-flashgate-ticket";
/// A proof-of-work solution sent for a waiting-room ticket (base64 of the ALTCHA payload).
pub const QUEUE_SOLUTION: &str = "x-flashgate-solution";

/// The value of cookie `name` in a request's `Cookie` headers, if any.
pub fn cookie<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    cookie_values(headers, name).next()
}

/// Every value of the cookie `name`, in the order sent (a browser sends one cookie twice when
/// two paths or domains set it).
pub fn cookies<'h>(headers: &'h http::HeaderMap, name: &str) -> Vec<&'h str> {
    cookie_values(headers, name).collect()
}

/// Every value of a cookie whose name reads as `name` to some framework: trimmed, percent-decoded
/// (PHP, Rack) and compared without case (ASP.NET Core): `Session`, ` session `, `%73ession`;
/// in a header of any bytes (one byte not ASCII does not hide the rest), split at `;` and at
/// `,` (Python's `SimpleCookie`); each value unquoted and percent-decoded (PHP, Rack, Express),
/// as the frameworks that read it most leniently would.
pub fn cookies_read_as(headers: &http::HeaderMap, name: &str) -> Vec<String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let reads_as = |k: &str| {
        let k = k.trim_matches(|c: char| c.is_whitespace() || c == '"');
        decode(k).trim().eq_ignore_ascii_case(name)
    };
    let mut out = Vec::new();
    for value in headers.get_all(http::header::COOKIE) {
        let text = String::from_utf8_lossy(value.as_bytes());
        for pair in text.split([';', ',']) {
            if let Some((k, v)) = pair.split_once('=') {
                if reads_as(k) {
                    out.push(decode(v.trim().trim_matches('"')));
                }
            }
        }
    }
    out
}

fn cookie_values<'h, 'n>(
    headers: &'h http::HeaderMap,
    name: &'n str,
) -> impl Iterator<Item = &'h str> + use<'h, 'n> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}
