//! Before the sale opens, in a real headless browser (chromium) and as JSON: the buyer is told
//! when it opens (in their own language and time zone), sees a countdown, and the page sends the
//! purchase again by itself once it opens; a JSON client gets `opens_at` and `Retry-After`.

use crate::browser::{token, IDENTITY_SECRET};
use crate::drop_pages::{browser_for, FOUR};
use crate::pages::{press_buy, sign_in};
use crate::queue_support::in_secs;
use crate::support::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_opening_the_buyer_sees_when_and_the_page_buys_at_the_opening() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Far enough ahead that two browsers load the page before it on a loaded machine.
    let opens = in_secs(25);
    let sale = TestActivity::open("1001", 5).hours(opens, in_secs(3600));
    let config = TestConfig::new(&redis, &upstream, vec![sale]).jwt_identity(Jwt::session_cookie());
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    // A JSON client: when, and how long to wait.
    let bearer = format!("Bearer {}", token("app"));
    let json = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!((json.status, json.code()), (403, "not_started".into()));
    let at =
        chrono::DateTime::parse_from_rfc3339(json.json()["opens_at"].as_str().unwrap()).unwrap();
    assert_eq!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), opens);
    let retry: u64 = json.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=25).contains(&retry), "Retry-After {retry}");
    // Browsers, in English and in Chinese, on a desktop and on a phone.
    let read = "return [document.documentElement.getAttribute('data-flashgate-code'), \
                document.getElementById('opens-at') ? document.getElementById('opens-at').textContent : null, \
                document.getElementById('countdown') ? document.getElementById('countdown').textContent : null, \
                location.pathname, document.body ? document.body.innerText : ''];";
    let origin = format!("http://{}", gw.addr);
    let mut browsers = Vec::new();
    for (i, seat) in FOUR.iter().enumerate() {
        let browser = browser_for(seat).await;
        sign_in(&browser, &origin, &format!("buyer-{i}")).await;
        press_buy(&browser, "/api/seckill/1001/buy").await;
        browsers.push(browser);
    }
    for (seat, browser) in FOUR.iter().zip(&browsers) {
        let opens_in = if seat.lang == "en" {
            "Opens in"
        } else {
            "距开放还有"
        };
        let shown = wait_for_async(
            "the opening and its countdown",
            Duration::from_secs(10),
            || async {
                let v = browser.script(read).await;
                (v[0] == "not_started" && v[2].as_str().is_some_and(|c| c.contains(opens_in)))
                    .then_some(v)
            },
        )
        .await;
        let when = shown[1].as_str().unwrap();
        assert!(
            !when.contains('T') && !when.is_empty(),
            "{}: a local time, not RFC 3339: {shown}",
            seat.name()
        );
        let overflow = browser
            .script("return document.documentElement.scrollWidth > window.innerWidth;")
            .await;
        assert_eq!(overflow, false, "{}", seat.name());
        browser
            .screenshot(&format!("before-open-{}", seat.name()))
            .await;
    }
    // At the opening every page sends the purchase again by itself: four purchases land.
    let landed = wait_for_async("both purchases", Duration::from_secs(30), || async {
        let sold: Vec<_> = upstream
            .requests()
            .await
            .into_iter()
            .filter(|r| r["headers"].get("x-flashgate-reservation").is_some())
            .collect();
        (sold.len() == 4).then_some(sold)
    })
    .await;
    assert_eq!(landed.len(), 4);
    for browser in &browsers {
        let _ = browser
            .call("DELETE", &format!("/session/{}", browser.session), None)
            .await;
    }
}

/// A size sold out under the buyer's click is not a dead end: the page names it by its title,
/// says other sizes may remain, and offers them (one known sold out shown but disabled); the
/// buyer presses another size and buys it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_sold_out_under_the_click_offers_the_others() {
    use serde_json::json;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(
        &redis,
        &upstream,
        vec![TestActivity::open("2001", 0).limit(1)],
    )
    .jwt_identity(Jwt::session_cookie());
    config.per_user = None;
    // The sold-out marks last the whole test (they expire after the TTL: a slow machine must
    // not see EU 43 come back on the page before the buyer reads it).
    config.sold_out_ttl_ms = 600_000;
    let sizes = json!([
        {"id": "41", "stock": 1, "title": "EU 41"},
        {"id": "42", "stock": 5, "title": "EU 42"},
        {"id": "43", "stock": 1, "title": "EU 43"},
    ]);
    let config = config
        .set("/activities/0/stock", serde_json::Value::Null)
        .set("/activities/0/variants", sizes)
        .set("/sale_routes/0/variant_query", json!("size"));
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    // Others buy the last EU 41 and the last EU 43 first.
    for (user, size) in [("bob", "41"), ("carol", "43")] {
        let bearer = format!("Bearer {}", token(user));
        let path = format!("/api/seckill/2001/buy?size={size}");
        let r = request(gw.addr, "POST", &path, &[("Authorization", &bearer)]).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Someone asking for EU 43 after that teaches this gateway it is gone (its mark).
    let bearer = format!("Bearer {}", token("dave"));
    let r = request(
        gw.addr,
        "POST",
        "/api/seckill/2001/buy?size=43",
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(r.code(), "sold_out");
    let origin = format!("http://{}", gw.addr);
    let read = "var b = Array.from(document.querySelectorAll('#variants button')); \
                return [document.documentElement.getAttribute('data-flashgate-code'), \
                document.body ? document.body.innerText : '', \
                b.map(function (x) { return [x.textContent, x.disabled]; }), \
                document.documentElement.scrollWidth > window.innerWidth];";
    for (i, seat) in FOUR.iter().enumerate() {
        let browser = browser_for(seat).await;
        let user = format!("buyer-{i}");
        sign_in(&browser, &origin, &user).await;
        press_buy(&browser, "/api/seckill/2001/buy?size=41").await;
        let shown = wait_for_async(
            "the sold-out page with the other sizes",
            Duration::from_secs(15),
            || async {
                let v = browser.script(read).await;
                (v[0] == "sold_out" && v[2].as_array().is_some_and(|b| !b.is_empty())).then_some(v)
            },
        )
        .await;
        let text = shown[1].as_str().unwrap();
        let named = match seat.lang {
            "en" => "Variant EU 41 is sold out",
            _ => "款式 EU 41 已售罄",
        };
        assert!(text.contains(named), "{}: {shown}", seat.name());
        assert_eq!(
            shown[2],
            json!([["EU 42", false], ["EU 43", true]]),
            "{shown}"
        );
        assert_eq!(shown[3], false, "{}: wider than the screen", seat.name());
        browser
            .screenshot(&format!("size-sold-out-{}", seat.name()))
            .await;
        browser
            .script("document.querySelector('#variants button:not([disabled])').click();")
            .await;
        let sold = wait_for_async("the buyer's EU 42", Duration::from_secs(15), || async {
            let bought: Vec<_> = upstream
                .requests()
                .await
                .into_iter()
                .filter(|r| r["headers"].get("x-flashgate-reservation").is_some())
                .filter(|r| r["query"].as_str().is_some_and(|q| q.contains("size=42")))
                .collect();
            (bought.len() == i + 1).then_some(bought)
        })
        .await;
        assert_eq!(sold.len(), i + 1);
        let _ = browser
            .call("DELETE", &format!("/session/{}", browser.session), None)
            .await;
    }
}
