//! The buyer's pages in a real headless browser (chromium over WebDriver): refusals as pages
//! in the buyer's language, the waiting page through the turns to a won purchase landing at the
//! sale's `success_url` (and the README's fetch() example run in the page), and the path of a
//! buyer without JavaScript, which never sends a GET to the sale URL. Screenshots at desktop
//! and phone widths go to `target/screenshots/`.

use crate::browser::{token, Browser, IDENTITY_SECRET};
use crate::support::*;
use crate::waiting_page::purchases;
use serde_json::{json, Value};
use std::time::Duration;

const DESKTOP: (u32, u32) = (1280, 800);
const PHONE: (u32, u32) = (390, 844);

/// A gateway whose buyers sign in with a session cookie, with `activities`, a shop name, and
/// each `(index, title, success_url)`.
fn gateway(
    redis: &RedisServer,
    upstream: &Upstream,
    activities: Vec<TestActivity>,
    pages: &[(usize, &str, Option<&str>)],
) -> GatewayProc {
    let mut config = TestConfig::new(redis, upstream, activities)
        .jwt_identity(Jwt::session_cookie())
        .set("/pages", json!({ "shop_name": "Example Shop" }));
    for (i, title, success) in pages {
        config = config.set(&format!("/activities/{i}/title"), json!(title));
        if let Some(url) = success {
            config = config.set(&format!("/activities/{i}/success_url"), json!(url));
        }
    }
    GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)])
}

/// Waits for the one unit sold of `act` to be confirmed, then checks none is pending and
/// `remaining` units are left.
async fn confirmed_once(gw: &GatewayProc, act: &str, remaining: u64) {
    let view = wait_for_async("the confirm", Duration::from_secs(10), || async {
        let v = gw.activity_view(act).await;
        (v["confirmed"] == 1).then_some(v)
    })
    .await;
    assert_eq!(
        (view["pending"].as_u64(), view["remaining"].as_u64()),
        (Some(0), Some(remaining)),
        "{view}"
    );
}

/// Signs the browser in as `user` on the shop (its session cookie), from the shop's page.
pub(crate) async fn sign_in(browser: &Browser, origin: &str, user: &str) {
    browser.go(&format!("{origin}/product")).await;
    browser
        .command(
            "POST",
            "cookie",
            json!({"cookie": {"name": "session", "value": token(user), "path": "/"}}),
        )
        .await;
}

/// Presses a "buy" form posting to `path` (the shop's product page does this).
pub(crate) async fn press_buy(browser: &Browser, path: &str) {
    browser
        .script(&format!(
            "var f = document.createElement('form'); f.method = 'POST'; f.action = '{path}'; \
             document.body.appendChild(f); f.submit();"
        ))
        .await;
}

/// What the page in front of the buyer says: `lang`, `data-flashgate-code`, the title, the
/// text, the status the document came with, its path, `data-state`.
async fn page(browser: &Browser) -> Value {
    browser
        .script(
            "var n = performance.getEntriesByType('navigation')[0]; \
             return {lang: document.documentElement.lang, \
             code: document.documentElement.getAttribute('data-flashgate-code'), \
             title: document.title, text: document.body ? document.body.innerText : '', \
             status: n ? n.responseStatus : null, path: location.pathname, \
             state: document.body ? document.body.getAttribute('data-state') : null};",
        )
        .await
}

/// Waits until the page shows `code` at `path`.
async fn wait_page(browser: &Browser, path: &str, code: &str) -> Value {
    wait_for_async(
        &format!("the {code} page at {path}"),
        Duration::from_secs(20),
        || async {
            let p = page(browser).await;
            (p["path"] == path && p["code"] == code).then_some(p)
        },
    )
    .await
}

async fn screenshots(browser: &Browser, name: &str) {
    for (width, (w, h)) in [("desktop", DESKTOP), ("phone", PHONE)] {
        browser.viewport(w, h).await;
        browser.screenshot(&format!("{name}-{width}")).await;
    }
    browser.viewport(DESKTOP.0, DESKTOP.1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_pages_in_the_buyers_language_and_json_stays_json() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activities = vec![
        TestActivity::open("1001", 1),
        TestActivity::open("2002", 5).ended(),
    ];
    let pages = [(0, "Phone X, launch edition", None), (1, "Old sale", None)];
    let gw = gateway(&redis, &upstream, activities, &pages);
    // Bob buys the only unit.
    let bob = format!("session={}", token("bob"));
    let bought = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("Cookie", &bob)],
    )
    .await;
    assert_eq!(bought.status, 200);

    let browser = Browser::start_with(true, "zh-CN,zh;q=0.9,en;q=0.5").await;
    let origin = format!("http://{}", gw.addr);
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let p = wait_page(&browser, "/api/seckill/1001/buy", "sold_out").await;
    assert_eq!(p["lang"], "zh", "{p}");
    assert_eq!(p["status"], 410, "{p}");
    let text = p["text"].as_str().unwrap();
    for shown in [
        "已售罄",
        "Example Shop",
        "Phone X, launch edition",
        "返回商店",
    ] {
        assert!(text.contains(shown), "{shown} not in {p}");
    }
    screenshots(&browser, "refusal-sold-out-zh").await;
    // Every refusal is a page with its code and status.
    for (path, code, status, says) in [
        (
            "/api/seckill/9999/buy",
            "unknown_activity",
            404,
            "没有这个抢购活动",
        ),
        ("/api/seckill/2002/buy", "ended", 410, "抢购已结束"),
        (
            "/api/seckill/1001/buy?qty=0",
            "bad_request",
            400,
            "数量至少为 1",
        ),
    ] {
        browser.go(&format!("{origin}/product")).await;
        press_buy(&browser, path).await;
        let p = wait_page(&browser, path.split('?').next().unwrap(), code).await;
        assert_eq!(
            (p["lang"].as_str(), p["status"].as_u64()),
            (Some("zh"), Some(status))
        );
        assert!(p["text"].as_str().unwrap().contains(says), "{p}");
    }
    // Signed out: unauthenticated, as a page.
    browser.command("DELETE", "cookie/session", json!({})).await;
    browser.go(&format!("{origin}/product")).await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let p = wait_page(&browser, "/api/seckill/1001/buy", "unauthenticated").await;
    assert_eq!(p["status"], 401);
    assert!(p["text"].as_str().unwrap().contains("请先登录"), "{p}");
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;

    // An English browser's page says it in English.
    let browser = Browser::start().await;
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let p = wait_page(&browser, "/api/seckill/1001/buy", "sold_out").await;
    assert_eq!(p["lang"], "en");
    assert_eq!(p["title"], "Sold out · Example Shop", "{p}");
    assert!(
        p["text"].as_str().unwrap().contains("Back to the shop"),
        "{p}"
    );
    screenshots(&browser, "refusal-sold-out").await;
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;

    // Apps: JSON as before (`*/*` or none), the message in their language, the code the same.
    let carol = format!("session={}", token("carol"));
    let buy = |accept: &'static str, lang: &'static str| {
        let carol = carol.clone();
        async move {
            let mut headers = vec![("Cookie", carol.as_str())];
            if !accept.is_empty() {
                headers.push(("Accept", accept));
            }
            if !lang.is_empty() {
                headers.push(("Accept-Language", lang));
            }
            request(gw.addr, "POST", "/api/seckill/1001/buy", &headers).await
        }
    };
    for accept in [
        "",
        "*/*",
        "application/json, text/html",
        "text/html;q=0.5, */*",
    ] {
        let r = buy(accept, "").await;
        assert_eq!(r.status, 410);
        assert_eq!(
            r.header("content-type"),
            Some("application/json"),
            "{accept}"
        );
        assert_eq!(r.json(), json!({"code": "sold_out", "message": "Sold out"}));
    }
    let zh = buy("application/json", "zh").await.json();
    assert_eq!(zh, json!({"code": "sold_out", "message": "已售罄"}));
    // A page keeps the answer's headers: Retry-After on a rate-limited buyer.
    let limited = wait_for_async(
        "carol's bucket to empty",
        Duration::from_secs(10),
        || async {
            let r = buy("text/html", "").await;
            (r.status == 429).then_some(r)
        },
    )
    .await;
    assert!(limited.header("retry-after").is_some());
    assert_eq!(
        limited.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let html = String::from_utf8_lossy(&limited.body).into_owned();
    assert!(
        html.contains("data-flashgate-code=\"rate_limited\""),
        "{html}"
    );
}

/// The README's "Integrating the waiting room" example, as written there.
fn readme_fetch_example() -> String {
    let readme = std::fs::read_to_string(repo_path("docs/buyers-and-frontends.md")).unwrap();
    let after = readme
        .split("<!-- fetch-example -->")
        .nth(1)
        .expect("README marks its fetch() example");
    let code = after.split("```js").nth(1).expect("a js block");
    code.split("```").next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_goes_through_the_turns_to_the_success_url() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("1001", 5)
    };
    let scarce = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("1002", 1)
    };
    let pages = [(0, "Phone X, launch edition", Some("/orders/{jti}"))];
    let gw = gateway(&redis, &upstream, vec![activity, scarce], &pages);
    for id in ["1001", "1002"] {
        let path = format!("/v1/activities/{id}/queue/pause");
        assert_eq!(gw.admin_post(&path).await.status, 200);
    }
    // Four buyers ahead of alice.
    for user in ["b1", "b2", "b3", "b4"] {
        let cookie = format!("session={}", token(user));
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/1001/buy",
            &[("Cookie", &cookie)],
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let browser = Browser::start().await;
    let origin = format!("http://{}", gw.addr);
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    // Paused: said so, in the title, with no estimate.
    let p = wait_for_async("the paused page", Duration::from_secs(20), || async {
        let p = page(&browser).await;
        (p["state"] == "waiting" && p["title"] == "Queue paused · Example Shop").then_some(p)
    })
    .await;
    assert_eq!(
        (p["code"].as_str(), p["status"].as_u64()),
        (Some("queued"), Some(202))
    );
    let text = p["text"].as_str().unwrap();
    assert!(text.contains("#5") && text.contains("Paused"), "{p}");
    assert!(text.contains("Phone X, launch edition"), "{p}");
    let accessible = browser
        .script(
            "return [document.getElementById('live').getAttribute('aria-live'), \
             document.getElementById('bar').labels.length, \
             document.getElementById('back').hidden];",
        )
        .await;
    assert_eq!(accessible, json!(["polite", 1, true]));
    screenshots(&browser, "waiting-paused").await;
    // Running: the place and an estimate; then her turn, and the page buys.
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/resume")
            .await
            .status,
        200
    );
    let p = wait_for_async("the running page", Duration::from_secs(20), || async {
        let p = page(&browser).await;
        let text = p["text"].as_str().unwrap_or("").to_owned();
        (p["state"] == "waiting" && text.contains("Estimated wait")).then_some(p)
    })
    .await;
    assert_eq!(p["title"], "In the queue · Example Shop", "{p}");
    screenshots(&browser, "waiting").await;
    let landed = wait_for_async("the purchase to land", Duration::from_secs(30), || async {
        let orders = upstream.orders().await;
        (!orders.is_empty()).then_some(orders)
    })
    .await;
    let jti = &landed[0];
    wait_for_async("the success URL", Duration::from_secs(20), || async {
        let url = browser.url().await;
        url.ends_with(&format!("/orders/{jti}")).then_some(())
    })
    .await;
    assert_eq!(purchases(&upstream).await.len(), 1);
    // The backend's cookie (the order it made) came with the redirect.
    let cookies = browser.script("return document.cookie;").await;
    assert!(
        cookies
            .as_str()
            .unwrap()
            .contains(&format!("demo_order={jti}")),
        "{cookies}"
    );
    // The page the gateway wrote instead of the backend's answer changed nothing of the
    // settlement: the backend's 2xx confirmed the reservation, once.
    confirmed_once(&gw, "1001", 4).await;
    // The README's example, run here: the queue says she bought, and asks for no refresh.
    let script = format!(
        "var done = arguments[arguments.length - 1];\n{}\n\
         waitForTurn('1001').then(done, function (e) {{ done({{error: String(e)}}); }});",
        readme_fetch_example()
    );
    let answer = browser
        .command(
            "POST",
            "execute/async",
            json!({ "script": script, "args": [] }),
        )
        .await;
    assert_eq!(answer["state"], "bought", "{answer}");
    assert!(answer.get("refresh_after_ms").is_none(), "{answer}");
    // The queue's page says so too, with the way back to the shop.
    browser.go(&format!("{origin}/flashgate/queue/1001")).await;
    let p = wait_page(&browser, "/flashgate/queue/1001", "bought").await;
    assert_eq!(p["state"], "bought");
    assert_eq!(p["title"], "You bought it · Example Shop");
    let back = browser
        .script("return document.getElementById('back').hidden;")
        .await;
    assert_eq!(back, false);
    // Another sale with one unit and two buyers ahead of her: told once that she is probably
    // too late, as an estimate (her place still shown).
    for user in ["c1", "c2"] {
        let cookie = format!("session={}", token(user));
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/1002/buy",
            &[("Cookie", &cookie)],
        )
        .await;
        assert_eq!(r.status, 202);
    }
    browser.go(&format!("{origin}/product")).await;
    press_buy(&browser, "/api/seckill/1002/buy").await;
    let p = wait_for_async("the too-late page", Duration::from_secs(20), || async {
        let p = page(&browser).await;
        (p["path"] == "/api/seckill/1002/buy" && p["state"] == "waiting").then_some(p)
    })
    .await;
    let text = p["text"].as_str().unwrap().to_lowercase();
    assert_eq!(text.matches("too late").count(), 1, "{p}");
    assert!(text.contains("an estimate"), "{p}");
    assert!(text.contains("#3"), "{p}");
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_javascript_the_buyer_refreshes_the_queue_and_posts_at_their_turn() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("1001", 5)
    };
    let pages = [(0, "Phone X", Some("/orders/{jti}"))];
    let gw = gateway(&redis, &upstream, vec![activity], &pages);
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/pause")
            .await
            .status,
        200
    );
    let bob = format!("session={}", token("bob"));
    let r = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("Cookie", &bob)],
    )
    .await;
    assert_eq!(r.status, 202);
    // As a page, the answer keeps its ticket header and cookie.
    let page_headers = [("Cookie", bob.as_str()), ("Accept", "text/html")];
    let r = request(gw.addr, "POST", "/api/seckill/1001/buy", &page_headers).await;
    assert_eq!(r.status, 202);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let ticket = r.header("x-flashgate-ticket").expect("the ticket header");
    let cookie = r.header("set-cookie").expect("the ticket cookie");
    assert!(
        cookie.starts_with(&format!("flashgate_ticket={ticket};")),
        "{cookie}"
    );

    let browser = Browser::start_with(false, "en").await;
    let origin = format!("http://{}", gw.addr);
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    // The page (no script runs: the driver reads it) refreshes the queue's URL, not the sale's,
    // and offers no purchase before her turn.
    let p = wait_page(&browser, "/api/seckill/1001/buy", "queued").await;
    assert!(p["text"].as_str().unwrap().contains("#2"), "{p}");
    let refresh = browser
        .script(
            "var m = document.querySelector('meta[http-equiv=refresh]'); \
             return [m ? m.content : null, document.forms.length];",
        )
        .await;
    assert!(
        refresh[0]
            .as_str()
            .unwrap()
            .ends_with("url=/flashgate/queue/1001"),
        "{refresh}"
    );
    assert_eq!(refresh[1], 0, "no purchase form before the turn");
    wait_for_async(
        "the page to refresh the queue",
        Duration::from_secs(20),
        || async {
            let url = browser.url().await;
            url.ends_with("/flashgate/queue/1001").then_some(())
        },
    )
    .await;
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/resume")
            .await
            .status,
        200
    );
    // Her turn: a form that POSTs the purchase, pressed by her.
    let p = wait_for_async("her turn", Duration::from_secs(30), || async {
        let p = page(&browser).await;
        (p["state"] == "your_turn").then_some(p)
    })
    .await;
    assert_eq!(p["title"], "It is your turn · Example Shop", "{p}");
    let form = browser
        .script(
            "var f = document.getElementById('buy'); \
             return [f.method, new URL(f.action).pathname, \
             document.querySelector('meta[http-equiv=refresh]') === null];",
        )
        .await;
    assert_eq!(form, json!(["post", "/api/seckill/1001/buy", true]));
    assert!(
        purchases(&upstream).await.is_empty(),
        "nothing bought before she pressed"
    );
    browser.click("#buy button").await;
    let orders = wait_for_async("the purchase", Duration::from_secs(20), || async {
        let orders = upstream.orders().await;
        (!orders.is_empty()).then_some(orders)
    })
    .await;
    wait_for_async("the success URL", Duration::from_secs(20), || async {
        let url = browser.url().await;
        url.ends_with(&format!("/orders/{}", orders[0]))
            .then_some(())
    })
    .await;
    // The backend never saw a GET of the sale URL: one purchase, a POST.
    let sale_requests = purchases(&upstream).await;
    assert_eq!(sale_requests.len(), 1, "{sale_requests:?}");
    assert_eq!(sale_requests[0]["method"], "POST");
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_edit_applies_on_reload_and_a_broken_one_is_refused() {
    const REFUSED: &str = r#"flashgate_config_reloads_total{result="refused"}"#;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let template = |version: &str| {
        format!(
            "<!doctype html><html lang=\"{{{{ lang }}}}\" data-flashgate-code=\"{{{{ code }}}}\">\
             <p>{version} {{{{ shop_name }}}}: {{{{ message }}}}</p></html>"
        )
    };
    std::fs::write(dir.path().join("refusal.html"), template("v1")).unwrap();
    let config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", 1)])
        .reload_watch_interval_ms(0)
        .set("/pages", json!({ "dir": dir.path(), "shop_name": "Mine" }));
    let gw = GatewayProc::start(config);
    let page = || async {
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/9999/buy",
            &[("X-User-Id", "u1"), ("Accept", "text/html")],
        )
        .await;
        assert_eq!(r.status, 404);
        String::from_utf8_lossy(&r.body).into_owned()
    };
    assert!(page().await.contains("v1 Mine: No such sale"));
    // A template that does not parse: the reload is refused, the running pages stay.
    std::fs::write(dir.path().join("refusal.html"), "{% if %}").unwrap();
    gw.signal("HUP");
    wait_for_async(
        "the reload to be refused",
        Duration::from_secs(10),
        || async { (gw.metric(REFUSED).await == Some(1.0)).then_some(()) },
    )
    .await;
    assert!(gw.logs().contains("pages.dir"), "{}", gw.logs());
    assert!(page().await.contains("v1 Mine"));
    // A good one: applied on the next reload, no rebuild, no restart.
    std::fs::write(dir.path().join("refusal.html"), template("v2")).unwrap();
    gw.signal("HUP");
    gw.wait_generation(2).await;
    assert!(page().await.contains("v2 Mine: No such sale"));
}

/// Review finding: a replay (same `Idempotency-Key`) of a won purchase from a page client is
/// let through replay-only whatever ticket it presents, and the gateway's "bought" answer used
/// to echo that ticket, never verified, into `X-Flashgate-Ticket` and `Set-Cookie` (a ticket
/// `x; Domain=evil.example` set a cookie for another domain). Only a ticket the gateway signed
/// for this buyer and sale is ever written back; the reservation is the same and confirmed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_with_a_forged_ticket_never_gets_it_written_back() {
    use crate::queue_support::{queued, take_ticket, wait_state, TICKET};
    let stack = Stack::start(vec![queued("1001", 5, Queue::admit(50).window_secs(30))]);
    let gw = &stack.gw;
    let (ticket, _) = take_ticket(gw, "1001", "alice").await;
    wait_state(gw, "1001", "alice", &ticket, "your_turn").await;
    let page = [("Accept", "text/html"), ("Idempotency-Key", "k-page-1")];
    let mut headers = vec![("X-User-Id", "alice"), (TICKET, ticket.as_str())];
    headers.extend_from_slice(&page);
    let won = request(gw.addr, "POST", "/api/seckill/1001/buy", &headers).await;
    assert_eq!(won.status, 200, "{}", won.text());
    let jti = won.reservation_id();
    let forged = "x; Domain=evil.example; SameSite=None";
    let mut headers = vec![("X-User-Id", "alice"), (TICKET, forged)];
    headers.extend_from_slice(&page);
    let again = request(gw.addr, "POST", "/api/seckill/1001/buy", &headers).await;
    assert!(again.status < 500, "{} {}", again.status, again.text());
    for (name, value) in &again.headers {
        assert!(
            !value.contains("evil.example"),
            "the forged ticket was written back: {name}: {value}"
        );
    }
    if again.status == 200 {
        assert_eq!(again.reservation_id(), jti, "a replay gives the same jti");
    }
    confirmed_once(gw, "1001", 4).await;
    gw.reconcile_clean();
}

/// Review: a page buyer's purchase the backend fails (5xx) is released and answered with the
/// `unavailable` page, and their queue state is not `bought`; the retry that wins is confirmed
/// once and the ledger stays reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_page_purchase_is_released_and_its_retry_settles_once() {
    use crate::queue_support::{poll, queued, take_ticket, wait_state, TICKET};
    let stack = Stack::start(vec![queued("1001", 5, Queue::admit(50).window_secs(30))]);
    let gw = &stack.gw;
    let (ticket, _) = take_ticket(gw, "1001", "alice").await;
    wait_state(gw, "1001", "alice", &ticket, "your_turn").await;
    let headers = [
        ("X-User-Id", "alice"),
        (TICKET, ticket.as_str()),
        ("Accept", "text/html"),
    ];
    stack.upstream.set_status(500).await;
    let failed = request(gw.addr, "POST", "/api/seckill/1001/buy", &headers).await;
    assert_eq!(failed.status, 503, "{}", failed.text());
    assert!(
        failed
            .text()
            .contains("data-flashgate-code=\"unavailable\""),
        "{}",
        failed.text()
    );
    let view = gw.activity_view("1001").await;
    assert_eq!(
        (view["pending"].as_u64(), view["remaining"].as_u64()),
        (Some(0), Some(5)),
        "released: {view}"
    );
    assert_ne!(poll(gw, "1001", "alice", &ticket).await["state"], "bought");
    stack.upstream.set_status(200).await;
    let won = request(gw.addr, "POST", "/api/seckill/1001/buy", &headers).await;
    assert_eq!(won.status, 200, "{}", won.text());
    assert!(won.text().contains("data-flashgate-code"), "a page");
    assert_eq!(poll(gw, "1001", "alice", &ticket).await["state"], "bought");
    confirmed_once(gw, "1001", 4).await;
    gw.reconcile_clean();
}

/// Review: the won page's ticket cookie lives until the sale's end by Redis's clock, as every
/// ticket's cookie does; a gateway whose clock ran past the end gave it one second (correctness
/// never depends on gateway clocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_won_pages_ticket_cookie_lasts_to_the_end_by_redis_clock() {
    use crate::queue_support::{in_secs, queued, take_ticket, wait_state, TICKET};
    let activity = TestActivity {
        ends_at: in_secs(3600),
        ..queued("1001", 5, Queue::admit(50).window_secs(30))
    };
    let (_redis, _upstream, config) = backends(vec![activity]);
    // This gateway's clock is two hours ahead: past the sale's end by its own reckoning.
    let gw = GatewayProc::start_skewed(&config, "+2h");
    let (ticket, _) = take_ticket(&gw, "1001", "alice").await;
    wait_state(&gw, "1001", "alice", &ticket, "your_turn").await;
    let headers = [
        ("X-User-Id", "alice"),
        (TICKET, ticket.as_str()),
        ("Accept", "text/html"),
    ];
    let won = request(gw.addr, "POST", "/api/seckill/1001/buy", &headers).await;
    assert_eq!(won.status, 200, "{}", won.text());
    let cookie = (won.headers.iter())
        .find(|(k, v)| k.eq_ignore_ascii_case("set-cookie") && v.starts_with("flashgate_ticket="))
        .map(|(_, v)| v.clone())
        .expect("the ticket's cookie");
    let max_age: u64 = cookie
        .split("Max-Age=")
        .nth(1)
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{cookie}"));
    assert!(max_age > 3000, "{cookie}");
}
