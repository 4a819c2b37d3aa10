//! The waiting page in a real headless browser (Debian's chromium, driven over WebDriver by
//! chromedriver): a buyer's "buy" form lands on the page, which shows the place, polls by
//! itself, and at the buyer's turn submits the purchase, which the backend receives with the
//! signed reservation; without a `success_url` the buyer is shown what they won. (The
//! harness is `browser.rs`; the other pages are tested in `pages.rs`.)

use crate::browser::{token, Browser, IDENTITY_SECRET};
use crate::pages::{press_buy, sign_in};
use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The purchases the backend received (the product page's own request aside).
pub(crate) async fn purchases(upstream: &Upstream) -> Vec<Value> {
    let mut requests = upstream.requests().await;
    requests.retain(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/api/seckill/"))
    });
    requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_shows_the_place_refreshes_and_lands_on_the_purchase() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("1001", 5)
    };
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config = config.jwt_identity(Jwt::session_cookie());
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    // The queue stands still while the page is looked at; bob is ahead of alice.
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/pause")
            .await
            .status,
        200
    );
    let bob = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("Authorization", &format!("Bearer {}", token("bob")))],
    )
    .await;
    assert_eq!(bob.status, 202);

    let browser = Browser::start().await;
    let origin = format!("http://{}", gw.addr);
    // Alice signs in on the shop (her session cookie) and presses "buy" on its product page.
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let read = "return [document.body ? document.body.getAttribute('data-state') : null, \
                document.getElementById('position') ? \
                document.getElementById('position').textContent : null, \
                document.title, location.pathname, document.body ? document.body.innerText : ''];";
    // The page: alice's place, second in line.
    let shown = wait_for_async("the waiting page", Duration::from_secs(20), || async {
        let v = browser.script(read).await;
        (v[0] == "waiting" && v[1] == "#2").then_some(v)
    })
    .await;
    assert_eq!(
        shown[2], "Queue paused",
        "the title says the queue stands: {shown}"
    );
    assert!(
        shown[4]
            .as_str()
            .unwrap()
            .contains("You are number 2 in the queue"),
        "{shown}"
    );
    // It asks again by itself (polls counted by the gateway), staying on the page.
    let polls = |m: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with("flashgate_queue_polls_total{activity=\"1001\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    let before = polls(&gw.metrics().await);
    wait_for_async(
        "the page to poll twice",
        Duration::from_secs(15),
        || async { (polls(&gw.metrics().await) >= before + 2).then_some(()) },
    )
    .await;
    assert_eq!(browser.script(read).await[0], "waiting");
    assert!(purchases(&upstream).await.is_empty(), "nothing bought yet");
    // The queue moves: bob's turn, then alice's; the page submits her purchase itself.
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/resume")
            .await
            .status,
        200
    );
    let landed = wait_for_async("the purchase to land", Duration::from_secs(30), || async {
        let requests = purchases(&upstream).await;
        (!requests.is_empty()).then_some(requests)
    })
    .await;
    assert_eq!(landed.len(), 1, "{landed:?}");
    let text = landed[0].to_string();
    assert!(text.contains("/api/seckill/1001/buy"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("x-flashgate-reservation"),
        "{text}"
    );
    // Without a success_url, the page says what she won (the backend's answer is not shown).
    let after = wait_for_async(
        "the browser to show what she won",
        Duration::from_secs(15),
        || async {
            let v = browser.script(read).await;
            (v[3] == "/api/seckill/1001/buy" && v[0] == "bought").then_some(v)
        },
    )
    .await;
    assert_eq!(after[2], "You bought it", "{after}");
    let jti = browser
        .script("return document.getElementById('order').textContent;")
        .await;
    let orders = upstream.orders().await;
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert!(
        jti.as_str().unwrap().contains(&orders[0]),
        "{jti} {orders:?}"
    );
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}

/// With a challenge, the page a browser lands on solves the proof of work in a Web Worker
/// (progress shown), sends the solution, gets its ticket (the cookie) and goes on to the
/// waiting page with its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_challenge_page_solves_the_proof_of_work_and_gets_a_ticket() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        queue: Some(
            Queue::admit(1)
                .window_secs(60)
                .challenge(json!({ "max_number": 300_000 })),
        ),
        ..TestActivity::open("1001", 5)
    };
    let config =
        TestConfig::new(&redis, &upstream, vec![activity]).jwt_identity(Jwt::session_cookie());
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    // The queue stands still while the page is looked at.
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/pause")
            .await
            .status,
        200
    );
    let browser = Browser::start().await;
    let origin = format!("http://{}", gw.addr);
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let read = "return [document.body ? document.body.getAttribute('data-state') : null, \
                document.getElementById('position') ? \
                document.getElementById('position').textContent : null, \
                location.pathname, sessionStorage.getItem('flashgate-challenge-progress')];";
    let shown = wait_for_async(
        "the waiting page after the challenge",
        Duration::from_secs(60),
        || async {
            let v = browser.script(read).await;
            (v[0] == "waiting" && v[1] == "#1").then_some(v)
        },
    )
    .await;
    assert_eq!(shown[2], "/flashgate/queue/1001", "{shown}");
    let m = gw.metrics().await;
    for (outcome, n) in [("issued", 1), ("solved", 1), ("refused", 0)] {
        let series = format!(
            "flashgate_queue_challenges_total{{activity=\"1001\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(m.contains(&series), "{series} in {m}");
    }
    // The ticket is the browser's (its cookie), one in Redis.
    let tickets: u64 = redis::cmd("HLEN")
        .arg("fg:{1001}:q:tickets")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(tickets, 1);
    // The worker reported its progress to the page as it went.
    assert!(shown[3].as_str().is_some(), "no progress shown: {shown}");
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}

/// A drop with variants: at the buyer's turn the waiting page lists the variants (one sold out,
/// shown but not offered) in the buyer's language, and buys the one they choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_lets_the_buyer_choose_a_variant_at_their_turn() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("2001", 0).limit(1)
    };
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config = config
        .jwt_identity(Jwt::session_cookie())
        .set("/activities/0/stock", Value::Null)
        .set(
            "/activities/0/variants",
            json!([{"id": "42", "stock": 0, "title": "EU 42"}, {"id": "43", "stock": 2, "title": "EU 43"}]),
        )
        .set("/sale_routes/0/variant_query", json!("variant"));
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    let origin = format!("http://{}", gw.addr);
    let read = "var b = document.querySelectorAll('#variants button'); \
                return [document.body.getAttribute('data-state'), \
                document.getElementById('chooser').hidden, \
                Array.prototype.map.call(b, function (x) { \
                  return x.getAttribute('data-variant') + (x.disabled ? ':off' : ':on'); }).join(','), \
                document.getElementById('choose').textContent];";
    for (user, languages, choose) in [
        ("alice", "en-US,en", "Choose one to buy:"),
        ("bob", "zh-CN,zh", "请选择要购买的款式："),
    ] {
        let browser = Browser::start_with(true, languages).await;
        sign_in(&browser, &origin, user).await;
        // The product page's buy button names no variant: a place in the queue first.
        press_buy(&browser, "/api/seckill/2001/buy").await;
        let shown = wait_for_async(
            "the chooser at the buyer's turn",
            Duration::from_secs(30),
            || async {
                let v = browser.script(read).await;
                (v[0] == "your_turn" && v[1] == false && v[2] != "").then_some(v)
            },
        )
        .await;
        assert_eq!(shown[2], "42:off,43:on", "{shown}");
        assert_eq!(shown[3], choose, "{shown}");
        browser
            .screenshot(&format!("waiting-variants-{user}"))
            .await;
        browser.click("#variants button[data-variant='43']").await;
        wait_for_async("the purchase of 43", Duration::from_secs(20), || async {
            let bought = purchases(&upstream).await.iter().any(|r| {
                r["headers"]["x-flashgate-reservation"]
                    .as_str()
                    .map(|t| {
                        jsonwebtoken::dangerous::insecure_decode::<Value>(t)
                            .unwrap()
                            .claims
                    })
                    .is_some_and(|c| c["sub"] == user && c["var"] == "43")
            });
            let v = browser.script(read).await;
            (bought && v[0] == "bought").then_some(())
        })
        .await;
        let _ = browser
            .call("DELETE", &format!("/session/{}", browser.session), None)
            .await;
    }
    let claims: Vec<Value> = purchases(&upstream)
        .await
        .iter()
        .filter_map(|r| r["headers"]["x-flashgate-reservation"].as_str())
        .map(|t| {
            jsonwebtoken::dangerous::insecure_decode::<Value>(t)
                .unwrap()
                .claims
        })
        .collect();
    assert_eq!(claims.len(), 2, "{claims:?}");
    assert!(claims.iter().all(|c| c["var"] == "43"), "{claims:?}");
    gw.reconcile_clean();
}

/// A shared family computer: alice queues, then bob signs in on the same browser and presses
/// "buy". Her ticket cookie is not his: he is not locked out (no 403 on every poll until the
/// sale ends) but given a place of his own, the cookie replaced, and told why; alice keeps hers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_buyer_in_the_same_browser_gets_a_place_of_their_own() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("1001", 5)
    };
    let config =
        TestConfig::new(&redis, &upstream, vec![activity]).jwt_identity(Jwt::session_cookie());
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/pause")
            .await
            .status,
        200
    );
    let browser = Browser::start().await;
    let origin = format!("http://{}", gw.addr);
    let read = "return [document.body ? document.body.getAttribute('data-state') : null, \
                document.getElementById('position') ? \
                document.getElementById('position').textContent : null, \
                document.getElementById('replaced') ? \
                !document.getElementById('replaced').hidden : null, \
                document.body ? document.body.innerText : '', \
                document.documentElement.getAttribute('data-flashgate-code')];";
    sign_in(&browser, &origin, "alice").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let alice = wait_for_async("alice's place", Duration::from_secs(20), || async {
        let v = browser.script(read).await;
        (v[0] == "waiting" && v[1] == "#1").then_some(v)
    })
    .await;
    assert_eq!(alice[2], false, "nothing replaced: {alice}");
    // Bob, on the same browser (alice's ticket cookie still in it).
    sign_in(&browser, &origin, "bob").await;
    press_buy(&browser, "/api/seckill/1001/buy").await;
    let bob = wait_for_async("bob's own place", Duration::from_secs(20), || async {
        let v = browser.script(read).await;
        (v[0] == "waiting" && v[1] == "#2").then_some(v)
    })
    .await;
    assert_eq!(bob[2], true, "the page says the ticket was replaced: {bob}");
    assert!(bob[3].as_str().unwrap().contains("not yours"), "{bob}");
    // The page polls with the new cookie: bob's, never 403.
    let count = |m: &str, name: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    let polls = r#"flashgate_queue_polls_total{activity="1001"}"#;
    let refused = r#"flashgate_decisions_total{activity="1001",decision="invalid_ticket"}"#;
    let before = gw.metrics().await;
    wait_for_async(
        "the page to poll twice",
        Duration::from_secs(15),
        || async {
            let now = gw.metrics().await;
            (count(&now, polls) >= count(&before, polls) + 2).then_some(())
        },
    )
    .await;
    assert_eq!(browser.script(read).await[1], "#2");
    let after = gw.metrics().await;
    assert_eq!(
        count(&after, refused),
        count(&before, refused),
        "no invalid_ticket"
    );
    // Alice keeps her place (asking again returns it).
    let again = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("Authorization", &format!("Bearer {}", token("alice")))],
    )
    .await;
    assert_eq!(again.status, 202, "{}", again.text());
    assert_eq!(again.json()["queue_position"], 1, "{}", again.text());
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}
