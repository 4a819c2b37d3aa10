//! Every bad configuration the gateway must refuse, as one table: a patch onto the contract's
//! example (`tests/fixtures/contract.example.yaml`: a dotted key path, list items by index, and
//! the YAML value set there, or `None` to remove the key) and the message the refusal must
//! contain. Paths of key files resolve against `tests/fixtures`.

/// One bad configuration.
pub struct Bad {
    pub name: &'static str,
    pub patch: &'static [(&'static str, Option<&'static str>)],
    pub expect: &'static str,
}

pub const BAD: &[Bad] = &[
    Bad {
        name: "second-chance-window-zero",
        patch: &[("activities.0.second_chance", Some("{window_secs: 0}"))],
        expect: "activities[id=1001].second_chance.window_secs: must be 1 to 3600",
    },
    Bad {
        name: "second-chance-on-segments",
        patch: &[("activities.0.second_chance", Some("{window_secs: 60}")), ("activities.0.segments", Some("2"))],
        expect: "activities[id=1001].second_chance: needs segments: 1",
    },
    Bad {
        name: "second-chance-unknown-field",
        patch: &[("activities.0.second_chance", Some("{window: 60}"))],
        expect: "unknown field `window`",
    },
    Bad {
        name: "phase-header-the-request-needs",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"header\": \"Authorization\", \"any_of\": [\"x\"]}}]")), ("identity.trusted_proxies", Some("[\"10.0.0.0/8\"]"))],
        expect: "activities[id=1001].phases[id=a].who.header: \"Authorization\" is a header the request or the gateway needs for itself",
    },
    Bad {
        name: "phase-header-of-the-gateway",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"header\": \"X-Flashgate-Ticket\", \"any_of\": [\"x\"]}}]")), ("identity.trusted_proxies", Some("[\"10.0.0.0/8\"]"))],
        expect: "is a header the request or the gateway needs for itself",
    },
    Bad {
        name: "phase-header-is-the-identity-header",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"header\": \"x-user-id\", \"any_of\": [\"x\"]}}]")), ("identity.trusted_proxies", Some("[\"10.0.0.0/8\"]"))],
        expect: "activities[id=1001].phases[id=a].who.header: is the identity header",
    },
    Bad {
        name: "phase-named-public-in-capitals",
        patch: &[("activities.0.phases", Some("[{\"id\": \"PUBLIC\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"x\"}}]"))],
        expect: "and not \"public\" (the sale after the phases)",
    },
    Bad {
        name: "phase-at-the-public-start",
        patch: &[("activities.0.phases", Some("[{\"id\": \"m\", \"starts_at\": \"2026-01-01T00:00:00Z\", \"who\": {\"list\": \"vip\"}}]"))],
        expect: "activities[id=1001].phases[id=m].starts_at: must be before the activity's starts_at (the public sale)",
    },
    Bad {
        name: "phases-out-of-order",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"x\"}}, {\"id\": \"b\", \"starts_at\": \"2025-11-01T00:00:00Z\", \"who\": {\"list\": \"y\"}}]"))],
        expect: "activities[id=1001].phases[id=b].starts_at: must be after phase \"a\"'s start (phases are in order)",
    },
    Bad {
        name: "phase-named-public",
        patch: &[("activities.0.phases", Some("[{\"id\": \"public\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"x\"}}]"))],
        expect: "and not \"public\" (the sale after the phases)",
    },
    Bad {
        name: "phase-id-twice",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-11-01T00:00:00Z\", \"who\": {\"list\": \"x\"}}, {\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"y\"}}]"))],
        expect: "activities[id=1001].phases[].id: \"a\" is used twice",
    },
    Bad {
        name: "phase-who-two-ways",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"x\", \"header\": \"X-Tier\", \"any_of\": [\"gold\"]}}]"))],
        expect: "activities[id=1001].phases[id=a].who: give exactly one of claim (with any_of), header (with any_of) or list",
    },
    Bad {
        name: "phase-header-without-any-of",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"header\": \"X-Tier\"}}]")), ("identity.trusted_proxies", Some("[\"10.0.0.0/8\"]"))],
        expect: "activities[id=1001].phases[id=a].who.any_of: list 1 to 64 values that qualify",
    },
    Bad {
        name: "phase-limit-above-the-activitys",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"x\"}, \"per_user_limit\": 2}]"))],
        expect: "activities[id=1001].phases[id=a].per_user_limit: must be 1 to the activity's per_user_limit (1)",
    },
    Bad {
        name: "phase-claim-with-a-header-identity",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"claim\": \"tier\", \"any_of\": [\"gold\"]}}]"))],
        expect: "activities[id=1001].phases[id=a].who.claim: a claim needs verified identity tokens (identity.jwt)",
    },
    Bad {
        name: "phase-header-without-trusted-proxies",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"header\": \"X-Tier\", \"any_of\": [\"gold\"]}}]"))],
        expect: "activities[id=1001].phases[id=a].who.header: a header phase needs identity.trusted_proxies",
    },
    Bad {
        name: "phase-list-name-unsafe",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"a:b\"}}]"))],
        expect: "activities[id=1001].phases[id=a].who.list: \"a:b\" must be 1 to 64 letters",
    },
    Bad {
        name: "phase-unknown-field",
        patch: &[("activities.0.phases", Some("[{\"id\": \"a\", \"starts_at\": \"2025-12-01T00:00:00Z\", \"who\": {\"list\": \"x\"}, \"limit\": 1}]"))],
        expect: "unknown field `limit`",
    },
    Bad {
        name: "header-identity-trusting-every-address",
        patch: &[("server.listen", Some("\"0.0.0.0:8080\"")), ("identity.trusted_proxies", Some("[\"0.0.0.0/1\", \"128.0.0.0/1\"]"))],
        expect: "is believed from any peer and server.listen 0.0.0.0:8080 is reachable from other hosts",
    },
    Bad {
        name: "variant-id-dot-dot",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"40..5\", \"stock\": 1}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "\"40..5\" must be 1 to 64 letters, digits, '-', '_', or '.' between them (40.5)",
    },
    Bad {
        name: "variant-title-control-character",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": 1, \"title\": \"red\\u001b[2J\"}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "activities[id=1001].variants[id=42].title: must be at most 200 characters, none a control character",
    },
    Bad {
        name: "variant-title-too-long",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": 1, \"title\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "activities[id=1001].variants[id=42].title: must be at most 200 characters",
    },
    Bad {
        name: "frame-ancestor-not-an-origin",
        patch: &[("pages", Some("{frame_ancestors: [\"https://shop.example/path\"]}"))],
        expect: "pages.frame_ancestors[0]: \"https://shop.example/path\" is not an origin",
    },
    Bad {
        name: "header-identity-anyone-can-set",
        patch: &[("server.listen", Some("\"0.0.0.0:8080\""))],
        expect: "identity.header: x-user-id is believed from any peer and server.listen 0.0.0.0:8080 is reachable from other hosts: anyone can send any user id; set identity.trusted_proxies",
    },
    Bad {
        name: "strip-header-not-a-name",
        patch: &[("identity.strip_headers", Some("[\"X Corp\"]"))],
        expect: "identity.strip_headers[0]: \"X Corp\" is not a header name",
    },
    Bad {
        name: "forward-method-is-the-routes-own",
        patch: &[("sale_routes.0.forward_methods", Some("[GET, POST]"))],
        expect: "sale_routes[0].forward_methods: [1]: POST is the route's own method",
    },
    Bad {
        name: "forward-method-unknown",
        patch: &[("sale_routes.0.forward_methods", Some("[get]"))],
        expect: "sale_routes[0].forward_methods: [0]: \"get\" is not an upper-case HTTP method",
    },
    Bad {
        name: "forward-method-twice",
        patch: &[("sale_routes.0.forward_methods", Some("[GET, GET]"))],
        expect: "sale_routes[0].forward_methods: [1]: GET is listed twice",
    },
    Bad {
        name: "admin-public-without-token",
        patch: &[("admin.token_env", None), ("admin.listen", Some("\"0.0.0.0:9091\""))],
        expect: "admin.listen: 0.0.0.0:9091 is reachable from other hosts: set admin.token_env",
    },
    Bad {
        name: "admin-token-unset",
        patch: &[("admin.token_env", Some("\"FLASHGATE_NOT_SET_ANYWHERE\""))],
        expect: "admin.token_env: environment variable FLASHGATE_NOT_SET_ANYWHERE is not set",
    },
    Bad {
        name: "bad-activity-id",
        patch: &[("activities.0.id", Some("\"10{01}\""))],
        expect: "activities[0].id",
    },
    Bad {
        name: "bad-admin-listen",
        patch: &[("admin.listen", Some("\"127.0.0.1\""))],
        expect: "admin.listen",
    },
    Bad {
        name: "bad-identity-header",
        patch: &[("identity.header", Some("\"X User Id\""))],
        expect: "identity.header: \"X User Id\" is not a valid HTTP header name",
    },
    Bad {
        name: "bad-key-prefix",
        patch: &[("redis.key_prefix", Some("\"fg{x}\""))],
        expect: "redis.key_prefix",
    },
    Bad {
        name: "bad-listen",
        patch: &[("server.listen", Some("\"localhost-8080\""))],
        expect: "server.listen: \"localhost-8080\" is not a host:port address",
    },
    Bad {
        name: "bad-quantity-query",
        patch: &[("sale_routes.0.quantity_query", Some("\"q ty\""))],
        expect: "sale_routes[0].quantity_query",
    },
    Bad {
        name: "ack-replicas-too-many",
        patch: &[("redis.ack_replicas", Some("17"))],
        expect: "redis.ack_replicas: must be 0 to 16",
    },
    Bad {
        name: "ack-replicas-negative",
        patch: &[("redis.ack_replicas", Some("-1"))],
        expect: "redis.ack_replicas",
    },
    Bad {
        name: "allow-eviction-not-a-bool",
        patch: &[("redis.allow_eviction", Some("\"sometimes\""))],
        expect: "redis.allow_eviction",
    },
    Bad {
        name: "bad-redis-url",
        patch: &[("redis.url", Some("\"http://127.0.0.1:6379\""))],
        expect: "redis.url: not a Redis URL",
    },
    Bad {
        name: "bad-route-method",
        patch: &[("sale_routes.0.method", Some("\"PO ST\""))],
        expect: "sale_routes[0].method",
    },
    Bad {
        name: "typo-route-method",
        patch: &[("sale_routes.0.method", Some("\"PSOT\""))],
        expect: "sale_routes[0].method: \"PSOT\" is not an upper-case HTTP method (one of GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH)",
    },
    Bad {
        name: "bad-signing-header",
        patch: &[("signing.header", Some("\"\""))],
        expect: "signing.header",
    },
    Bad {
        name: "bad-starts-at",
        patch: &[("activities.0.starts_at", Some("\"tomorrow 10:00\""))],
        expect: "activities[id=1001].starts_at: \"tomorrow 10:00\" is not an RFC 3339 time",
    },
    Bad {
        name: "bad-trusted-proxy",
        patch: &[("identity.trusted_proxies", Some("[\"10.0.0.0/33\"]"))],
        expect: "identity.trusted_proxies[0]: \"10.0.0.0/33\" is not a CIDR",
    },
    Bad {
        name: "bad-upstream-address",
        patch: &[("upstream.addresses", Some("[\"127.0.0.1:9000\", \"not an address\"]"))],
        expect: "upstream.addresses[1]",
    },
    Bad {
        name: "breaker-unknown-key",
        patch: &[("redis.breaker", Some("{\"failures\": 3}"))],
        expect: "unknown field `failures`",
    },
    Bad {
        name: "breaker-zero-failures",
        patch: &[("redis.breaker", Some("{\"consecutive_failures\": 0}"))],
        expect: "redis.breaker.consecutive_failures: must be at least 1",
    },
    Bad {
        name: "breaker-zero-open",
        patch: &[("redis.breaker", Some("{\"open_ms\": 0}"))],
        expect: "redis.breaker.open_ms: must be at least 1",
    },
    Bad {
        name: "duplicate-activity",
        patch: &[("activities", Some("[{\"id\": \"1001\", \"stock\": 1, \"version\": 1, \"per_user_limit\": 1, \"max_per_request\": 1, \"starts_at\": \"2026-01-01T00:00:00Z\", \"ends_at\": \"2030-01-01T00:00:00Z\"}, {\"id\": \"1001\", \"stock\": 100, \"version\": 1, \"per_user_limit\": 1, \"max_per_request\": 1, \"starts_at\": \"2026-01-01T00:00:00Z\", \"ends_at\": \"2030-01-01T00:00:00Z\"}]"))],
        expect: "activities[id=1001].id: \"1001\" is configured twice",
    },
    Bad {
        name: "eddsa-key-file-missing",
        patch: &[("signing.algorithm", Some("\"EdDSA\"")), ("signing.private_key_file", Some("\"no-such-key.pem\""))],
        expect: "signing.private_key_file: cannot read",
    },
    Bad {
        name: "eddsa-key-file-not-a-key",
        patch: &[("signing.algorithm", Some("\"EdDSA\"")), ("signing.private_key_file", Some("\"ed25519.pub.pem\""))],
        expect: "is not a PKCS#8 PEM Ed25519 private key",
    },
    Bad {
        name: "eddsa-without-key-file",
        patch: &[("signing.algorithm", Some("\"EdDSA\""))],
        expect: "signing.private_key_file: is required for algorithm EdDSA",
    },
    Bad {
        name: "empty-key-id",
        patch: &[("signing.key_id", Some("\"\""))],
        expect: "signing.key_id: must not be empty",
    },
    Bad {
        name: "ends-before-start",
        patch: &[("activities.0.ends_at", Some("\"2025-01-01T00:00:00Z\""))],
        expect: "activities[id=1001].ends_at: must be after starts_at",
    },
    Bad {
        name: "events-maxlen-zero",
        patch: &[("redis.events_maxlen", Some("0"))],
        expect: "redis.events_maxlen: must be at least 1",
    },
    Bad {
        name: "hs256-without-secret-env",
        patch: &[("signing.secret_env", None)],
        expect: "signing.secret_env: is required for algorithm HS256",
    },
    Bad {
        name: "identity-both",
        patch: &[("identity.jwt", Some("{\"keys\": [{\"kid\": \"a\", \"algorithm\": \"HS256\", \"secret_env\": \"FLASHGATE_SIGNING_SECRET\"}]}"))],
        expect: "identity: set either header or jwt, not both",
    },
    Bad {
        name: "identity-neither",
        patch: &[("identity.header", None), ("identity.trusted_proxies", Some("[\"10.0.0.0/8\"]"))],
        expect: "identity: set header (a trusted auth layer in front) or jwt",
    },
    Bad {
        name: "jwt-bad-cookie",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"b\", \"algorithm\": \"RS256\", \"public_key_file\": \"rsa.pub.pem\"}], \"cookie\": \"a=b\"}"))],
        expect: "identity.jwt.cookie: \"a=b\" is not a cookie name",
    },
    Bad {
        name: "jwt-duplicate-kid",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"a\", \"algorithm\": \"HS256\", \"secret_env\": \"FLASHGATE_SIGNING_SECRET\"}, {\"kid\": \"a\", \"algorithm\": \"HS256\", \"secret_env\": \"FLASHGATE_SIGNING_SECRET\"}]}"))],
        expect: "identity.jwt.keys[1].kid: \"a\" is empty or listed twice",
    },
    Bad {
        name: "jwt-empty-claim",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"b\", \"algorithm\": \"RS256\", \"public_key_file\": \"rsa.pub.pem\"}], \"claim\": \"\"}"))],
        expect: "identity.jwt.claim: must not be empty",
    },
    Bad {
        name: "jwt-hs256-without-secret",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"a\", \"algorithm\": \"HS256\"}]}"))],
        expect: "identity.jwt.keys[0].secret_env: is required for algorithm HS256",
    },
    Bad {
        name: "jwt-no-keys",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": []}"))],
        expect: "identity.jwt.keys: needs at least one key",
    },
    Bad {
        name: "jwt-rs256-bad-key",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"b\", \"algorithm\": \"RS256\", \"public_key_file\": \"ed25519.pub.pem\"}]}"))],
        expect: "is not a PEM RS256 public key",
    },
    Bad {
        name: "jwt-rs256-without-key-file",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"b\", \"algorithm\": \"RS256\"}]}"))],
        expect: "identity.jwt.keys[0].public_key_file: is required for algorithm RS256",
    },
    Bad {
        name: "jwt-secret-unset",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"a\", \"algorithm\": \"HS256\", \"secret_env\": \"FLASHGATE_NOT_SET_ANYWHERE\"}]}"))],
        expect: "identity.jwt.keys[0].secret_env: environment variable FLASHGATE_NOT_SET_ANYWHERE is not set",
    },
    Bad {
        name: "jwt-unknown-algorithm",
        patch: &[("identity.header", None), ("identity.jwt", Some("{\"keys\": [{\"kid\": \"b\", \"algorithm\": \"none\", \"public_key_file\": \"rsa.pub.pem\"}]}"))],
        expect: "unknown variant `none`",
    },
    Bad {
        name: "max-inflight-zero",
        patch: &[("upstream.max_inflight", Some("0"))],
        expect: "upstream.max_inflight: must be at least 1 (or absent)",
    },
    Bad {
        name: "max-per-request-above-limit",
        patch: &[("activities.0.max_per_request", Some("2"))],
        expect: "activities[id=1001].max_per_request: 2 exceeds per_user_limit 1",
    },
    Bad {
        name: "max-queue-wait-zero",
        patch: &[("upstream.max_queue_wait_ms", Some("0"))],
        expect: "upstream.max_queue_wait_ms: must be at least 1",
    },
    Bad {
        name: "missing-section",
        patch: &[("identity", None)],
        expect: "missing field `identity`",
    },
    Bad {
        name: "negative-stock",
        patch: &[("activities.0.stock", Some("-1"))],
        expect: "activities[id=1001].stock: invalid type: integer `-1`, expected u64",
    },
    Bad {
        name: "no-upstreams",
        patch: &[("upstream.addresses", Some("[]"))],
        expect: "upstream.addresses: needs at least one backend address",
    },
    Bad {
        name: "on-store-failure-unknown",
        patch: &[("activities.0.on_store_failure", Some("\"retry\""))],
        expect: "unknown variant `retry`, expected `reject` or `passthrough`",
    },
    Bad {
        name: "order-lookup-no-jti",
        patch: &[("upstream.order_lookup", Some("{\"path\": \"/orders\"}"))],
        expect: "upstream.order_lookup.path: \"/orders\" must start with '/' and hold {jti} exactly once",
    },
    Bad {
        name: "order-lookup-zero-retry",
        patch: &[("upstream.order_lookup", Some("{\"path\": \"/orders/{jti}\", \"retry_interval_ms\": 0}"))],
        expect: "upstream.order_lookup.retry_interval_ms: must be at least 1",
    },
    Bad {
        name: "order-lookup-zero-timeout",
        patch: &[("upstream.order_lookup", Some("{\"path\": \"/orders/{jti}\", \"timeout_ms\": 0}"))],
        expect: "upstream.order_lookup.timeout_ms: must be at least 1",
    },
    Bad {
        name: "passthrough-shadow",
        patch: &[("rate_limits.passthrough", Some("{\"per_second\": 10, \"burst\": 10, \"shadow\": true}"))],
        expect: "rate_limits.passthrough.shadow: a cap on unreserved forwards cannot be shadow",
    },
    Bad {
        name: "per-activity-fleet-scope",
        patch: &[("rate_limits.per_activity", Some("{\"per_second\": 10, \"burst\": 10, \"scope\": \"fleet\"}"))],
        expect: "rate_limits.per_activity.scope: only rate_limits.per_user and rate_limits.per_ip can be fleet-wide",
    },
    Bad {
        name: "passthrough-fleet-scope",
        patch: &[("rate_limits.passthrough", Some("{\"per_second\": 10, \"burst\": 10, \"scope\": \"fleet\"}"))],
        expect: "rate_limits.passthrough.scope: only rate_limits.per_user and rate_limits.per_ip can be fleet-wide",
    },
    Bad {
        name: "per-user-unknown-scope",
        patch: &[("rate_limits.per_user", Some("{\"per_second\": 5, \"burst\": 5, \"scope\": \"global\"}"))],
        expect: "unknown variant `global`, expected `instance` or `fleet`",
    },
    Bad {
        name: "passthrough-zero-rate",
        patch: &[("rate_limits.passthrough", Some("{\"per_second\": 0, \"burst\": 10}"))],
        expect: "rate_limits.passthrough.per_second: must be at least 1",
    },
    Bad {
        name: "previous-key-is-active",
        patch: &[("signing.secret_env", None), ("signing.algorithm", Some("\"EdDSA\"")), ("signing.private_key_file", Some("\"ed25519.pem\"")), ("signing.previous_keys", Some("[{\"kid\": \"k1\", \"public_key_file\": \"ed25519.pub.pem\"}]"))],
        expect: "signing.previous_keys[0].kid: \"k1\" is empty, the active key_id, or listed twice",
    },
    Bad {
        name: "previous-key-not-a-key",
        patch: &[("signing.secret_env", None), ("signing.algorithm", Some("\"EdDSA\"")), ("signing.private_key_file", Some("\"ed25519.pem\"")), ("signing.previous_keys", Some("[{\"kid\": \"k0\", \"public_key_file\": \"rsa.pub.pem\"}]"))],
        expect: "signing.previous_keys[0].public_key_file: ",
    },
    Bad {
        name: "queue-bad-landing-url",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"landing_url\": \"javascript:alert(1)\"}"))],
        expect: "activities[id=1001].queue.landing_url: \"javascript:alert(1)\" must be a path (/…) or an http(s) URL",
    },
    Bad {
        // Browsers read `/\host` as `//host`: the waiting page would send the buyer away.
        name: "queue-landing-url-backslash-host",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"landing_url\": \"/\\\\evil.example/\"}"))],
        expect: "activities[id=1001].queue.landing_url: \"/\\\\evil.example/\" must be a path (/…) or an http(s) URL",
    },
    Bad {
        name: "queue-bad-opens-at",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"opens_at\": \"tomorrow\"}"))],
        expect: "activities[id=1001].queue.opens_at",
    },
    Bad {
        name: "queue-challenge-zero",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"challenge\": {\"max_number\": 0}}"))],
        expect: "activities[id=1001].queue.challenge.max_number: must be 1 to 50000000",
    },
    Bad {
        name: "queue-challenge-expiry",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"challenge\": {\"max_number\": 10, \"expires_secs\": 1}}"))],
        expect: "activities[id=1001].queue.challenge.expires_secs: must be 10 to 86400",
    },
    Bad {
        name: "queue-challenge-unknown-key",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"challenge\": {\"max_number\": 10, \"difficulty\": 3}}"))],
        expect: "unknown field `difficulty`",
    },
    Bad {
        name: "queue-draw-not-bool",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"draw\": \"yes\"}"))],
        expect: "activities[id=1001].queue.draw: invalid type",
    },
    Bad {
        name: "queue-factor-below-one",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"too_late_factor\": 0.5}"))],
        expect: "activities[id=1001].queue.too_late_factor: must be a number of at least 1",
    },
    Bad {
        name: "queue-max-active-zero",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"max_active\": 0}"))],
        expect: "activities[id=1001].queue.max_active: must be at least 1",
    },
    Bad {
        name: "queue-max-active-negative",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"max_active\": -5}"))],
        expect: "activities[id=1001].queue",
    },
    Bad {
        name: "queue-opens-after-start",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"opens_at\": \"2026-01-02T00:00:00Z\"}"))],
        expect: "activities[id=1001].queue.opens_at: must not be after starts_at",
    },
    Bad {
        name: "queue-rate-too-high",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 2000000}"))],
        expect: "activities[id=1001].queue.admit_per_second: must be 1 to 1000000",
    },
    Bad {
        name: "queue-skip-absent-too-long",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"skip_absent_after_secs\": 86400}"))],
        expect: "activities[id=1001].queue.skip_absent_after_secs: must be 5 to 3600 seconds",
    },
    Bad {
        name: "queue-skip-absent-too-short",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"skip_absent_after_secs\": 1}"))],
        expect: "activities[id=1001].queue.skip_absent_after_secs: must be 5 to 3600 seconds",
    },
    Bad {
        name: "queue-stepped-rate-too-high",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 5000, \"max_active\": 100}"))],
        expect: "activities[id=1001].queue.admit_per_second: must be at most 1000 with skip_absent_after_secs or max_active",
    },
    Bad {
        name: "queue-unknown-key",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_sec\": 10}"))],
        expect: "unknown field `admit_per_sec`",
    },
    Bad {
        name: "queue-zero-rate",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 0}"))],
        expect: "activities[id=1001].queue.admit_per_second: must be 1 to 1000000",
    },
    Bad {
        name: "queue-zero-window",
        patch: &[("activities.0.stock", Some("10")), ("activities.0.queue", Some("{\"admit_per_second\": 10, \"admission_window_secs\": 0}"))],
        expect: "activities[id=1001].queue.admission_window_secs: must be at least 1",
    },
    Bad {
        name: "redis-cluster-bad-node",
        patch: &[("redis.url", None), ("redis.cluster", Some("{\"nodes\": [\"127.0.0.1:7000\", \"nowhere\"]}"))],
        expect: "redis.cluster.nodes[1]: \"nowhere\" is not a host:port address",
    },
    Bad {
        name: "redis-cluster-no-nodes",
        patch: &[("redis.url", None), ("redis.cluster", Some("{\"nodes\": []}"))],
        expect: "redis.cluster.nodes: needs at least one seed node",
    },
    Bad {
        name: "redis-neither",
        patch: &[("redis.url", None)],
        expect: "redis: set url (one Redis) or cluster",
    },
    Bad {
        name: "redis-url-and-cluster",
        patch: &[("redis.cluster", Some("{\"nodes\": [\"127.0.0.1:7000\"]}"))],
        expect: "redis: set either url (one Redis) or cluster",
    },
    Bad {
        name: "route-twice",
        patch: &[("sale_routes", Some("[{\"method\": \"POST\", \"path\": \"/api/seckill/{activity}/buy\", \"quantity_query\": \"qty\"}, {\"method\": \"POST\", \"path\": \"/api/seckill/{activity}/buy\"}]"))],
        expect: "sale_routes[1].path: POST /api/seckill/{activity}/buy is listed twice",
    },
    Bad {
        name: "route-without-activity",
        patch: &[("sale_routes.0.path", Some("\"/api/seckill/buy\""))],
        expect: "sale_routes[0].path",
    },
    Bad {
        name: "sale-body-too-large",
        patch: &[("server.max_sale_body_bytes", Some("65537"))],
        expect: "server.max_sale_body_bytes: must be at most 65536 (a sale body is held in memory until the reservation is forwarded)",
    },
    Bad {
        name: "signing-secret-empty",
        patch: &[("signing.secret_env", Some("\"FLASHGATE_EMPTY_SECRET\""))],
        expect: "signing.secret_env: environment variable FLASHGATE_EMPTY_SECRET is empty",
    },
    Bad {
        name: "signing-secret-unset",
        patch: &[("signing.secret_env", Some("\"FLASHGATE_NOT_SET_ANYWHERE\""))],
        expect: "signing.secret_env: environment variable FLASHGATE_NOT_SET_ANYWHERE is not set",
    },
    Bad {
        name: "stock-too-large",
        patch: &[("activities.0.stock", Some("9007199254740992"))],
        expect: "activities[id=1001].stock: must be at most 9007199254740991 (2^53 - 1, kept exact everywhere)",
    },
    Bad {
        name: "sweep-batch-too-large",
        patch: &[("redis.sweep_batch", Some("5000"))],
        expect: "redis.sweep_batch: must be 1 to 1000",
    },
    Bad {
        name: "sweep-batch-zero",
        patch: &[("redis.sweep_batch", Some("0"))],
        expect: "redis.sweep_batch: must be 1 to 1000",
    },
    Bad {
        name: "too-many-segments",
        patch: &[("activities.0.segments", Some("65"))],
        expect: "activities[id=1001].segments: must be 1 to 64",
    },
    Bad {
        name: "unknown-algorithm",
        patch: &[("signing.algorithm", Some("\"none\""))],
        expect: "unknown variant `none`",
    },
    Bad {
        name: "unknown-confirm-mode",
        patch: &[("activities.0.confirm", Some("\"payment\""))],
        expect: "unknown variant `payment`",
    },
    Bad {
        name: "unknown-key",
        patch: &[("activities.0.stock", None), ("activities.0.stok", Some("100"))],
        expect: "unknown field `stok`",
    },
    Bad {
        name: "upgrade-sock-too-long",
        patch: &[("server.upgrade_sock", Some("\"/tmp/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.sock\""))],
        expect: "server.upgrade_sock: /tmp/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.sock is longer than a Unix socket path may be (107 bytes)",
    },
    Bad {
        name: "version-too-large",
        patch: &[("activities.0.version", Some("9007199254740992"))],
        expect: "activities[id=1001].version: must be at most 9007199254740991 (2^53 - 1, kept exact everywhere)",
    },
    Bad {
        name: "zero-activity-burst",
        patch: &[("rate_limits.per_activity", Some("{\"per_second\": 100, \"burst\": 0}"))],
        expect: "rate_limits.per_activity.burst: must be at least 1",
    },
    Bad {
        name: "zero-burst",
        patch: &[("rate_limits.per_user.burst", Some("0"))],
        expect: "rate_limits.per_user.burst: must be at least 1",
    },
    Bad {
        name: "zero-connect-timeout",
        patch: &[("upstream.connect_timeout_ms", Some("0"))],
        expect: "upstream.connect_timeout_ms: must be at least 1",
    },
    Bad {
        name: "zero-evict-interval",
        patch: &[("rate_limits.evict_interval_ms", Some("0"))],
        expect: "rate_limits.evict_interval_ms: must be at least 1",
    },
    Bad {
        name: "zero-health-check-interval",
        patch: &[("upstream.health_check_interval_ms", Some("0"))],
        expect: "upstream.health_check_interval_ms: must be at least 1",
    },
    Bad {
        name: "zero-hold",
        patch: &[("activities.0.hold_secs", Some("0"))],
        expect: "activities[id=1001].hold_secs: must be at least 1",
    },
    Bad {
        name: "zero-ip-rate",
        patch: &[("rate_limits.per_ip", Some("{\"per_second\": 0, \"burst\": 100}"))],
        expect: "rate_limits.per_ip.per_second: must be at least 1",
    },
    Bad {
        name: "zero-max-per-request",
        patch: &[("activities.0.max_per_request", Some("0"))],
        expect: "activities[id=1001].max_per_request: must be at least 1",
    },
    Bad {
        name: "zero-per-user-limit",
        patch: &[("activities.0.per_user_limit", Some("0"))],
        expect: "activities[id=1001].per_user_limit: must be at least 1",
    },
    Bad {
        name: "zero-prewarm-interval",
        patch: &[("redis.prewarm_interval_ms", Some("0"))],
        expect: "redis.prewarm_interval_ms: must be at least 1",
    },
    Bad {
        name: "zero-rate",
        patch: &[("rate_limits.per_user.per_second", Some("0"))],
        expect: "rate_limits.per_user.per_second: must be at least 1",
    },
    Bad {
        name: "zero-read-timeout",
        patch: &[("upstream.read_timeout_ms", Some("0"))],
        expect: "upstream.read_timeout_ms: must be at least 1",
    },
    Bad {
        name: "zero-reconcile-interval",
        patch: &[("redis.reconcile_interval_ms", Some("0"))],
        expect: "redis.reconcile_interval_ms: must be at least 1",
    },
    Bad {
        name: "zero-redis-timeout",
        patch: &[("redis.timeout_ms", Some("0"))],
        expect: "redis.timeout_ms: must be at least 1",
    },
    Bad {
        name: "zero-sale-body-timeout",
        patch: &[("server.sale_body_timeout_ms", Some("0"))],
        expect: "server.sale_body_timeout_ms: must be at least 1",
    },
    Bad {
        name: "zero-segments",
        patch: &[("activities.0.segments", Some("0"))],
        expect: "activities[id=1001].segments: must be 1 to 64",
    },
    Bad {
        name: "zero-sold-out-ttl",
        patch: &[("sold_out_cache.ttl_ms", Some("0"))],
        expect: "sold_out_cache.ttl_ms: must be at least 1",
    },
    Bad {
        name: "zero-sweep-interval",
        patch: &[("redis.sweep_interval_ms", Some("0"))],
        expect: "redis.sweep_interval_ms: must be at least 1",
    },
    Bad {
        name: "zero-threads",
        patch: &[("server.threads", Some("0"))],
        expect: "server.threads: must be at least 1",
    },
    Bad {
        name: "zero-token-ttl",
        patch: &[("signing.ttl_secs", Some("0"))],
        expect: "signing.ttl_secs: must be at least 1",
    },
    Bad {
        name: "zero-version",
        patch: &[("activities.0.version", Some("0"))],
        expect: "activities[id=1001].version: must be at least 1",
    },
    Bad {
        name: "passthrough-buffer-below-one-body",
        patch: &[(
            "server.max_passthrough_buffered_bytes",
            Some("1024"),
        )],
        expect: "server.max_passthrough_buffered_bytes: must be at least server.max_passthrough_body_bytes",
    },
    Bad {
        name: "retention-below-the-lifecycle",
        patch: &[("redis.key_ttl_after_end_secs", Some("60"))],
        expect: "redis.key_ttl_after_end_secs: is 60 s, but a reservation made at the close can settle up to",
    },
    Bad {
        name: "pages-dir-missing",
        patch: &[("pages", Some("{dir: no-such-dir}"))],
        expect: "pages.dir: ",
    },
    Bad {
        name: "pages-template-broken",
        patch: &[("pages", Some("{dir: pages-broken}"))],
        expect: "pages-broken/waiting.html: syntax error: unexpected end of block (in waiting.html:3)",
    },
    Bad {
        name: "pages-dir-without-templates",
        patch: &[("pages", Some("{dir: edge}"))],
        expect: "holds neither waiting.html nor refusal.html",
    },
    Bad {
        name: "pages-unknown-key",
        patch: &[("pages", Some("{shopname: Mine}"))],
        expect: "unknown field `shopname`",
    },
    Bad {
        name: "pages-shop-url-other-host",
        patch: &[("pages", Some("{shop_url: \"//evil.example/\"}"))],
        expect: "pages.shop_url: \"//evil.example/\" must be a path",
    },
    Bad {
        name: "success-url-script",
        patch: &[("activities.0.success_url", Some("\"javascript:alert(1)\""))],
        expect: "activities[id=1001].success_url: \"javascript:alert(1)\" must be a path (/…) or an http(s) URL",
    },
    Bad {
        // Browsers read `/\\host` as `//host`: a redirect to another site.
        name: "success-url-backslash-host",
        patch: &[("activities.0.success_url", Some("\"/\\\\evil.example/{jti}\""))],
        expect: "activities[id=1001].success_url: \"/\\\\evil.example/{jti}\" must be a path (/…) or an http(s) URL",
    },
    Bad {
        name: "shop-url-backslash-host",
        patch: &[("pages", Some("{shop_url: \"/\\\\evil.example/\"}"))],
        expect: "pages.shop_url: \"/\\\\evil.example/\" must be a path",
    },
    Bad {
        name: "title-control-character",
        patch: &[("activities.0.title", Some("\"Phone\\u0007X\""))],
        expect: "activities[id=1001].title: must be at most 200 characters, none a control character",
    },
    Bad {
        name: "cors-origin-with-a-path",
        patch: &[("server.cors", Some("{\"allowed_origins\": [\"https://shop.example/\"]}"))],
        expect: "server.cors.allowed_origins[0]: \"https://shop.example/\" is not an origin",
    },
    Bad {
        name: "cors-origin-not-http",
        patch: &[("server.cors", Some("{\"allowed_origins\": [\"https://a.example\", \"ftp://shop.example\"]}"))],
        expect: "server.cors.allowed_origins[1]: \"ftp://shop.example\" is not an origin",
    },
    Bad {
        name: "cors-origin-null",
        patch: &[("server.cors", Some("{\"allowed_origins\": [\"null\"]}"))],
        expect: "server.cors.allowed_origins[0]: \"null\" is not an origin",
    },
    Bad {
        name: "cors-unknown-key",
        patch: &[("server.cors", Some("{\"allowed_origin\": [\"https://shop.example\"]}"))],
        expect: "unknown field `allowed_origin`",
    },
    Bad {
        name: "second-activity-parse-error-named-by-id",
        patch: &[("activities", Some("[{\"id\": \"1001\", \"stock\": 1, \"version\": 1, \"per_user_limit\": 1, \"max_per_request\": 1, \"starts_at\": \"2026-01-01T00:00:00Z\", \"ends_at\": \"2030-01-01T00:00:00Z\"}, {\"id\": \"2002\", \"stock\": -1, \"version\": 1, \"per_user_limit\": 1, \"max_per_request\": 1, \"starts_at\": \"2026-01-01T00:00:00Z\", \"ends_at\": \"2030-01-01T00:00:00Z\"}]"))],
        expect: "activities[id=2002].stock: invalid type: integer `-1`, expected u64",
    },
    Bad {
        name: "second-activity-invalid-named-by-id",
        patch: &[("activities", Some("[{\"id\": \"1001\", \"stock\": 1, \"version\": 1, \"per_user_limit\": 1, \"max_per_request\": 1, \"starts_at\": \"2026-01-01T00:00:00Z\", \"ends_at\": \"2030-01-01T00:00:00Z\"}, {\"id\": \"2002\", \"stock\": 5, \"version\": 1, \"per_user_limit\": 1, \"max_per_request\": 1, \"starts_at\": \"2026-01-01T00:00:00Z\", \"ends_at\": \"2025-01-01T00:00:00Z\"}]"))],
        expect: "activities[id=2002].ends_at: must be after starts_at",
    },
    Bad {
        name: "rate-without-a-rate",
        patch: &[("rate_limits.per_ip", Some("{\"burst\": 10}"))],
        expect: "rate_limits.per_ip: give the rate as one of per_second, per_minute or per_hour",
    },
    Bad {
        name: "rate-in-two-units",
        patch: &[("rate_limits.per_ip", Some("{\"per_second\": 1, \"per_minute\": 6, \"burst\": 10}"))],
        expect: "rate_limits.per_ip.per_minute: give only one of per_second, per_minute or per_hour",
    },
    Bad {
        name: "rate-per-minute-zero",
        patch: &[("rate_limits.per_user", Some("{\"per_minute\": 0, \"burst\": 1}"))],
        expect: "rate_limits.per_user.per_minute: must be at least 1",
    },
    Bad {
        name: "rate-per-hour-zero",
        patch: &[("rate_limits.per_activity", Some("{\"per_hour\": 0, \"burst\": 1}"))],
        expect: "rate_limits.per_activity.per_hour: must be at least 1",
    },
    Bad {
        name: "rate-per-minute-negative",
        patch: &[("rate_limits.per_user", Some("{\"per_minute\": -6, \"burst\": 1}"))],
        expect: "rate_limits.per_user.per_minute: invalid type: integer `-6`, expected u32",
    },
    Bad {
        name: "rate-per-day-unknown",
        patch: &[("rate_limits.per_user", Some("{\"per_day\": 6, \"burst\": 1}"))],
        expect: "unknown field `per_day`, expected one of `per_second`, `per_minute`, `per_hour`",
    },
    Bad {
        name: "variants-and-stock",
        patch: &[("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": 1}]"))],
        expect: "activities[id=1001].variants: an activity has `stock` or `variants`, not both",
    },
    Bad {
        name: "neither-stock-nor-variants",
        patch: &[("activities.0.stock", None)],
        expect: "activities[id=1001].stock: missing: give `stock`, or `variants` with a stock each",
    },
    Bad {
        name: "variants-empty",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "activities[id=1001].variants: is empty: list at least one variant, or give `stock`",
    },
    Bad {
        name: "variant-twice",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": 1}, {\"id\": \"42\", \"stock\": 2}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "activities[id=1001].variants[id=42].id: \"42\" is configured twice",
    },
    Bad {
        name: "variant-id-unsafe",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"4 2\", \"stock\": 1}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "activities[id=1001].variants[].id: \"4 2\" must be 1 to 64 letters, digits, '-', '_', or '.' between them",
    },
    Bad {
        name: "variant-unknown-field",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": 1, \"colour\": \"red\"}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "unknown field `colour`, expected one of `id`, `stock`, `title`",
    },
    Bad {
        name: "variant-stock-negative",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": -1}]")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "invalid type: integer `-1`, expected u64",
    },
    Bad {
        name: "variants-without-a-route-naming-one",
        patch: &[("activities.0.stock", None), ("activities.0.variants", Some("[{\"id\": \"42\", \"stock\": 1}]"))],
        expect: "activities[id=1001].variants: no sale route names a variant",
    },
    Bad {
        name: "variant-query-not-plain",
        patch: &[("sale_routes.0.variant_query", Some("\"v&x\""))],
        expect: "sale_routes[0].variant_query: \"v&x\" must be a plain query parameter name",
    },
    Bad {
        name: "variant-query-is-the-quantity",
        patch: &[("sale_routes.0.variant_query", Some("qty"))],
        expect: "sale_routes[0].variant_query: \"qty\" is the quantity_query too",
    },
    Bad {
        name: "variant-in-path-and-query",
        patch: &[("sale_routes.0.path", Some("\"/api/seckill/{activity}/{variant}/buy\"")), ("sale_routes.0.variant_query", Some("variant"))],
        expect: "sale_routes[0].variant_query: the path names the variant ({variant})",
    },
    Bad {
        name: "variant-twice-in-path",
        patch: &[("sale_routes.0.path", Some("\"/api/{activity}/{variant}/{variant}\""))],
        expect: "sale_routes[0].path: \"/api/{activity}/{variant}/{variant}\" may contain {variant} once at most",
    },

];
