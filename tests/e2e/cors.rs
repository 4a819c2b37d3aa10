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
        // Vary is a list field: the pages' `Vary: Accept, Accept-Language` may come as its own line.
        resp.headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("vary") && v.contains("Origin")),
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
        // Vary is a list field: the pages' `Vary: Accept, Accept-Language` may come as its own line.
        resp.headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("vary") && v.contains("Origin")),
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

/// A shop page on another origin: a bare HTML page served from a port of its own, until the
/// test ends.
async fn shop_page() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let _ = stream.read(&mut buf).await;
                let body = "<!doctype html><html><body>shop</body></html>";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}")
}

/// What the README's fetch() example does, from a page of `page`: poll the waiting room, then buy,
/// with credentials and the headers a buyer's app sends (which need a preflight).
const APP_SCRIPT: &str = r#"
const [gw, done] = [arguments[0], arguments[arguments.length - 1]];
(async () => {
  const out = {};
  try {
    const poll = await fetch(gw + '/flashgate/queue/q1', {
      credentials: 'include', headers: { 'X-User-Id': 'alice' } });
    out.poll = { status: poll.status, ticket: poll.headers.get('X-Flashgate-Ticket'),
                 state: (await poll.json()).state };
    const buy = await fetch(gw + '/api/seckill/c1/buy', { method: 'POST', credentials: 'include',
      headers: { 'X-User-Id': 'alice', 'Content-Type': 'application/json',
                 'Idempotency-Key': 'app-1' }, body: JSON.stringify({ qty: 1 }) });
    out.buy = { status: buy.status };
  } catch (e) { out.error = String(e); }
  done(out);
})();
"#;

/// In Debian's chromium: an app on a listed origin polls and buys through the gateway with
/// credentials; the same app on another origin is stopped by the browser at the preflight, and
/// its purchase never reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_app_on_a_listed_origin_polls_and_buys() {
    let listed = shop_page().await;
    let other = shop_page().await;
    let acts = vec![
        TestActivity::open("c1", 5),
        TestActivity::open("q1", 5).queue(Queue::admit(50)),
    ];
    let (_redis, upstream, gw) =
        Stack::start_with(acts, |c| c.cors_origins(&[listed.as_str()])).parts();
    let gateway = format!("http://{}", gw.addr);
    let browser = crate::browser::Browser::start().await;
    let run = |page: String| {
        let browser = &browser;
        let gateway = gateway.clone();
        async move {
            browser.go(&page).await;
            browser
                .command(
                    "POST",
                    "execute/async",
                    serde_json::json!({ "script": APP_SCRIPT, "args": [gateway] }),
                )
                .await
        }
    };
    let out = run(listed).await;
    assert_eq!(out["poll"]["status"], 200, "{out}");
    assert!(
        out["poll"]["ticket"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{out}"
    );
    assert_eq!(out["buy"]["status"], 200, "{out}");
    let bought = upstream.requests().await;
    assert_eq!(bought.len(), 1, "{bought:?}");
    let out = run(other).await;
    assert!(
        out["error"]
            .as_str()
            .is_some_and(|e| e.contains("Failed to fetch")),
        "{out}"
    );
    assert_eq!(
        upstream.requests().await.len(),
        1,
        "the other origin's purchase was sent"
    );
}

/// Without listed origins the gateway runs without the CORS module (it costs every request):
/// preflights are still answered here, never forwarded; listing the first origins is named as
/// needing a restart, and after one they are allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_the_first_origins_takes_a_restart() {
    let (_redis, upstream, mut gw) = Stack::start(vec![TestActivity::open("c1", 5)]).parts();
    let sale = "/api/seckill/c1/buy";
    let pre = request(gw.addr, "OPTIONS", sale, &preflight_headers(SHOP, "POST")).await;
    assert_eq!(pre.status, 204, "{}", pre.text());
    assert_eq!(pre.header("access-control-allow-origin"), None);
    assert!(
        upstream.requests().await.is_empty(),
        "a preflight was forwarded"
    );

    let listed = gw.config.clone().cors_origins(&[SHOP]);
    gw.rewrite_config(listed);
    let reload = gw.admin_post("/v1/config/reload").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    let restart = reload.json()["needs_restart"].clone();
    assert!(
        restart
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "server.cors.allowed_origins"),
        "{restart}"
    );
    // Until the restart the answers cannot carry the allow headers, so the preflight does not
    // allow the origin either: a browser never passes a preflight for an answer it cannot read.
    let pre = request(gw.addr, "OPTIONS", sale, &preflight_headers(SHOP, "POST")).await;
    assert_eq!(pre.status, 204, "{}", pre.text());
    assert_eq!(pre.header("access-control-allow-origin"), None);
    assert_eq!(pre.header("access-control-allow-methods"), None);
    let poll = "/flashgate/queue/c1";
    let pre = request(gw.addr, "OPTIONS", poll, &preflight_headers(SHOP, "GET")).await;
    assert_eq!(pre.header("access-control-allow-origin"), None);
    let early = [("X-User-Id", "bob"), ("Origin", SHOP)];
    let answer = request(gw.addr, "POST", sale, &early).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("access-control-allow-origin"), None);
    gw.restart();
    let pre = request(gw.addr, "OPTIONS", sale, &preflight_headers(SHOP, "POST")).await;
    assert_allowed(&pre, SHOP);
    let headers = [("X-User-Id", "alice"), ("Origin", SHOP)];
    let won = request(gw.addr, "POST", sale, &headers).await;
    assert_eq!(won.status, 200, "{}", won.text());
    assert_allowed(&won, SHOP);
}

/// The README's fetch() example ("Apps on another origin"), as written there, from a page of a
/// listed origin in Chromium, the buyer signed in by a session cookie: the poll's ticket is
/// readable and the purchase goes through the preflight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_fetch_example_runs_in_chromium() {
    use crate::browser::{token, Browser, IDENTITY_SECRET};
    let readme = std::fs::read_to_string(repo_path("docs/buyers-and-frontends.md")).unwrap();
    let section = &readme[readme
        .find("## Apps on another origin (CORS)")
        .expect("the README's CORS section")..];
    let start = section.find("```js\n").expect("its fetch() example") + "```js\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    let gw_line = example
        .lines()
        .find(|l| l.starts_with("const gw = "))
        .expect("the example names the gateway in `const gw`");
    let body = example.replace(gw_line, "const gw = arguments[0];");
    let script = format!(
        "const done = arguments[arguments.length - 1];\n(async () => {{ try {{\n{body}\n\
         done({{ poll: poll.status, ticket, state: place.state, buy: buy.status }});\n\
         }} catch (e) {{ done({{ error: String(e) }}); }} }})();"
    );

    let page = shop_page().await;
    let (_redis, upstream, config) =
        backends(vec![TestActivity::open("1003", 5).queue(Queue::admit(1000))]);
    let config = config
        .jwt_identity(Jwt::session_cookie())
        .cors_origins(&[page.as_str()]);
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    let gateway = format!("http://{}", gw.addr);
    let browser = Browser::start().await;
    // Alice signed in: her session cookie, set on the gateway's host.
    browser.go(&format!("{gateway}/catalogue")).await;
    let cookie =
        serde_json::json!({"cookie": {"name": "session", "value": token("alice"), "path": "/"}});
    browser.command("POST", "cookie", cookie).await;
    browser.go(&page).await;
    let out = browser
        .command(
            "POST",
            "execute/async",
            serde_json::json!({ "script": script, "args": [gateway] }),
        )
        .await;
    eprintln!("the README example gave {out}");
    assert_eq!(out["poll"], 200, "{out}");
    assert!(
        out["ticket"].as_str().is_some_and(|t| !t.is_empty()),
        "{out}"
    );
    assert!(out["state"].is_string(), "{out}");
    let bought = out["buy"].as_u64().unwrap_or_default();
    assert!(bought == 200 || bought == 202, "{out}");
    if bought == 200 {
        let purchases = upstream.requests().await;
        assert!(
            purchases
                .iter()
                .any(|r| r["path"] == "/api/seckill/1003/buy"),
            "{purchases:?}"
        );
    }
}

/// A shop backend that speaks CORS itself, as many do: every answer (200, JSON) allows the
/// request's `Origin` with credentials. Serves keep-alive connections until the test ends.
async fn origin_reflecting_backend() -> std::net::SocketAddr {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let (mut origin, mut length) = (None, 0usize);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = l.split_once(':') {
                            match k.trim().to_ascii_lowercase().as_str() {
                                "origin" => origin = Some(v.trim().to_owned()),
                                "content-length" => length = v.trim().parse().unwrap_or(0),
                                _ => {}
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let allow = origin.map_or(String::new(), |o| {
                        format!(
                            "Access-Control-Allow-Origin: {o}\r\n\
                             Access-Control-Allow-Credentials: true\r\n"
                        )
                    });
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{allow}\
                         Content-Length: 11\r\n\r\n{{\"ok\":true}}"
                    );
                    if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Review finding: the gateway alone speaks CORS on its routes, also when no origin is listed
/// (the module that decorates answers is then not installed). A backend's own allow headers
/// on a sale route's relayed answer reached the browser, so an unlisted origin could read a
/// purchase's answer (a simple, credentialed POST needs no preflight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backends_own_allow_headers_never_reach_an_unlisted_origin() {
    let upstream = Upstream::start();
    let backend = origin_reflecting_backend().await;
    for listed in [&[][..], &[SHOP][..]] {
        let redis = RedisServer::start();
        let config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("c1", 5)])
            .cors_origins(listed)
            .set(
                "/upstream/addresses",
                serde_json::json!([backend.to_string()]),
            );
        let gw = GatewayProc::start(config);
        let headers = [
            ("X-User-Id", "alice"),
            ("Origin", "https://evil.example"),
            ("Content-Type", "text/plain"),
        ];
        let won = request(gw.addr, "POST", "/api/seckill/c1/buy", &headers).await;
        assert_eq!(won.status, 200, "{}", won.text());
        won.reservation_id();
        let cors: Vec<_> = (won.headers.iter())
            .filter(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-"))
            .collect();
        assert!(cors.is_empty(), "listed {listed:?}: {cors:?}");
    }
}

/// Review: every spelling of a sale route or the waiting room that the gateway reads as its own
/// (a trailing slash, doubled or dot segments, case, a percent-encoded character, a query, a
/// lower-case method, an empty `Access-Control-Request-Method`) has its preflight answered here;
/// none reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_on_every_spelling_of_the_routes_stay_here() {
    let acts = vec![
        TestActivity::open("c1", 5),
        TestActivity::open("q1", 5).queue(Queue::admit(50)),
    ];
    let (_redis, upstream, gw) = Stack::start_with(acts, |c| c.cors_origins(&[SHOP])).parts();
    for (method, path) in [
        ("OPTIONS", "/api/seckill/c1/buy/"),
        ("OPTIONS", "//api/seckill/c1/buy"),
        ("OPTIONS", "/API/Seckill/c1/BUY"),
        ("OPTIONS", "/api/seckill/c%31/buy"),
        ("OPTIONS", "/api/seckill/c1/buy?x=1"),
        ("OPTIONS", "/api/./seckill/c1/buy"),
        ("options", "/api/seckill/c1/buy"),
        ("OPTIONS", "/flashgate/queue/q1/"),
        ("OPTIONS", "/flashgate/queue/q%31"),
    ] {
        for acrm in ["POST", ""] {
            let mut headers = preflight_headers(SHOP, "POST");
            headers[1].1 = acrm;
            let pre = request(gw.addr, method, path, &headers).await;
            assert_eq!(pre.status, 204, "{method} {path} [{acrm}]: {}", pre.text());
        }
    }
    let seen = upstream.requests().await;
    assert!(seen.is_empty(), "forwarded: {seen:?}");
}
