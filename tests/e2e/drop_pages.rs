//! A sneaker drop's waiting-room pages as four buyers see them, in a real headless browser
//! (chromium): English and Chinese, on a desktop and on a phone. Far back in the queue the page
//! says the buyer is probably too late, as an estimate; at their turn it names the sizes to
//! choose from and counts down the admission window under the heading, without repeating it.
//! Nothing overflows a phone's width. Screenshots go to `target/screenshots/`.

use crate::browser::{token, Browser, IDENTITY_SECRET};
use crate::pages::{press_buy, sign_in};
use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

/// One of the four ways a buyer's page is tried.
pub(crate) struct Seat {
    pub lang: &'static str,
    pub accept_language: &'static str,
    pub width: u32,
    pub height: u32,
}

impl Seat {
    /// `<lang>-<desktop|phone>`, for screenshot names.
    pub fn name(&self) -> String {
        let form = if self.width < 600 { "phone" } else { "desktop" };
        format!("{}-{form}", self.lang)
    }
}

/// English and Chinese, each on a desktop (1280 x 800) and a phone (390 x 844).
pub(crate) const FOUR: [Seat; 4] = [
    Seat {
        lang: "en",
        accept_language: "en-US,en",
        width: 1280,
        height: 800,
    },
    Seat {
        lang: "en",
        accept_language: "en-US,en",
        width: 390,
        height: 844,
    },
    Seat {
        lang: "zh",
        accept_language: "zh-CN,zh;q=0.9",
        width: 1280,
        height: 800,
    },
    Seat {
        lang: "zh",
        accept_language: "zh-CN,zh;q=0.9",
        width: 390,
        height: 844,
    },
];

/// A browser for `seat`, at its size.
pub(crate) async fn browser_for(seat: &Seat) -> Browser {
    let browser = Browser::start_with(true, seat.accept_language).await;
    browser.viewport(seat.width, seat.height).await;
    browser
}

/// What the page says: code, state, heading, the message line, the whole text, the sizes
/// offered (title, disabled), and whether anything is wider than the viewport.
const READ: &str = "var b = Array.from(document.querySelectorAll('#variants button')); \
    var m = document.getElementById('message'); var h = document.getElementById('heading'); \
    return {code: document.documentElement.getAttribute('data-flashgate-code'), \
    state: document.body ? document.body.getAttribute('data-state') : null, \
    heading: h ? h.textContent : null, message: m ? m.textContent : null, \
    text: document.body ? document.body.innerText : '', \
    sizes: b.map(function (x) { return [x.textContent, x.disabled]; }), \
    overflow: document.documentElement.scrollWidth > window.innerWidth};";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drops_too_late_and_your_turn_pages_in_both_languages_and_widths() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sizes = json!([
        {"id": "41", "stock": 1, "title": "EU 41"},
        {"id": "42", "stock": 1, "title": "EU 42"},
    ]);
    let mut config = TestConfig::new(
        &redis,
        &upstream,
        vec![TestActivity::open("2001", 0)
            .limit(1)
            .queue(Queue::admit(1).window_secs(120))],
    )
    .jwt_identity(Jwt::session_cookie())
    .set("/activities/0/stock", Value::Null)
    .set("/activities/0/variants", sizes)
    .set("/sale_routes/0/variant_query", json!("size"));
    config.per_user = None;
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    // Sixty buyers ahead (who never buy), at one admission a second: every browser has more
    // than 2 units x 1.5 ahead of it for the next minute, however slowly the four browsers start
    // (CI took 13 s for them; twelve ahead were all admitted by the fourth).
    for i in 0..60 {
        let bearer = format!("Bearer {}", token(&format!("ahead-{i}")));
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/2001/buy",
            &[("Authorization", &bearer)],
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let origin = format!("http://{}", gw.addr);
    let mut browsers = Vec::new();
    for (i, seat) in FOUR.iter().enumerate() {
        let browser = browser_for(seat).await;
        sign_in(&browser, &origin, &format!("buyer-{i}")).await;
        press_buy(&browser, "/api/seckill/2001/buy").await;
        browsers.push(browser);
    }
    for (seat, browser) in FOUR.iter().zip(&browsers) {
        let shown = wait_for_async("the too-late page", Duration::from_secs(15), || async {
            let v = browser.script(READ).await;
            (v["state"] == "waiting").then_some(v)
        })
        .await;
        let text = shown["text"].as_str().unwrap();
        match seat.lang {
            "en" => {
                assert_eq!(text.matches("too late").count(), 1, "{shown}");
                assert!(text.contains("an estimate"), "{shown}");
            }
            _ => assert!(
                text.contains("可能来不及") && text.contains("估计"),
                "{shown}"
            ),
        }
        assert_eq!(shown["overflow"], false, "{}: {shown}", seat.name());
        browser
            .screenshot(&format!("drop-too-late-{}", seat.name()))
            .await;
    }
    // Everyone admitted at once: each browser's turn, the sizes offered, the window counted down.
    let r = gw
        .admin_post("/v1/activities/2001/queue/rate?per_second=1000")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for (seat, browser) in FOUR.iter().zip(&browsers) {
        let shown = wait_for_async("the your-turn page", Duration::from_secs(15), || async {
            let v = browser.script(READ).await;
            (v["state"] == "your_turn" && v["sizes"].as_array().is_some_and(|s| !s.is_empty()))
                .then_some(v)
        })
        .await;
        let (heading, message) = (
            shown["heading"].as_str().unwrap(),
            shown["message"].as_str().unwrap(),
        );
        let (title, within) = match seat.lang {
            "en" => ("It is your turn", "Buy within "),
            _ => ("轮到您了", "请在 "),
        };
        assert_eq!(heading, title, "{shown}");
        assert!(message.starts_with(within), "{}: {shown}", seat.name());
        assert!(!message.contains(heading), "the heading again: {shown}");
        // m:ss, counting down from the 120 s window.
        let clock = message[within.len()..]
            .split(|c: char| !c.is_ascii_digit() && c != ':')
            .next()
            .unwrap()
            .trim_end_matches(':');
        let (m, s) = clock.split_once(':').expect("m:ss");
        let left: u64 = m.parse::<u64>().unwrap() * 60 + s.parse::<u64>().unwrap();
        assert!((60..=120).contains(&left), "{clock}: {shown}");
        assert_eq!(
            shown["sizes"],
            json!([["EU 41", false], ["EU 42", false]]),
            "{shown}"
        );
        assert_eq!(shown["overflow"], false, "{}: {shown}", seat.name());
        browser
            .screenshot(&format!("drop-your-turn-{}", seat.name()))
            .await;
    }
    // While they choose, the pages keep up: the first buyer takes the last EU 41, and the
    // others' EU 41 turns disabled without a reload; the second takes the last EU 42, and the
    // two left read sold out, with no size offered.
    let click = |size: &str| {
        format!("document.querySelector('#variants button[data-variant=\"{size}\"]').click(); return true;")
    };
    browsers[0].script(&click("41")).await;
    for browser in &browsers[1..] {
        wait_for_async(
            "EU 41 disabled in place",
            Duration::from_secs(15),
            || async {
                let v = browser.script(READ).await;
                (v["state"] == "your_turn"
                    && v["sizes"] == json!([["EU 41", true], ["EU 42", false]]))
                .then_some(())
            },
        )
        .await;
    }
    browsers[1].script(&click("42")).await;
    for browser in &browsers[2..] {
        let shown = wait_for_async("the drop sold out", Duration::from_secs(15), || async {
            let v = browser.script(READ).await;
            (v["state"] == "sold_out").then_some(v)
        })
        .await;
        let hidden = browser
            .script("return document.getElementById('chooser').hidden;")
            .await;
        assert_eq!(hidden, true, "no size offered: {shown}");
    }
    let bought = upstream
        .requests()
        .await
        .into_iter()
        .filter(|r| r["headers"].get("x-flashgate-reservation").is_some())
        .count();
    assert_eq!(bought, 2, "one EU 41 and one EU 42");
    for browser in &browsers {
        let _ = browser
            .call("DELETE", &format!("/session/{}", browser.session), None)
            .await;
    }
}
