//! The drop's story (issue 36): a sale run against the real gateway and redis-server (a
//! waiting room with a pre-queue and its draw, two variants, a restock, a release, no-shows),
//! then `flashgate report` must tell what the test counted, what the admin view and reconcile
//! say, and its page must render in Chromium with charts that drew something.

use crate::browser::Browser;
use crate::queue_support::*;
use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

/// Variant a: 3 units, then 2 restocked; variant b: 4 units.
fn drop_config(redis: &RedisServer, upstream: &Upstream, starts_at: &'static str) -> TestConfig {
    let activity = TestActivity {
        starts_at,
        per_user_limit: 1,
        ..queued(
            "2001",
            0,
            Queue::admit(20).window_secs(600).opens_at(in_secs(-60)),
        )
    };
    let mut config = TestConfig::new(redis, upstream, vec![activity]);
    config.per_user = None;
    config
        .set("/activities/0/stock", Value::Null)
        .set(
            "/activities/0/variants",
            json!([{"id": "a", "stock": 3}, {"id": "b", "stock": 4}]),
        )
        .set("/sale_routes/0/variant_query", json!("variant"))
        .set("/pages", json!({"shop_name": "Example Shop"}))
}

async fn buy_variant(gw: &GatewayProc, user: &str, variant: &str, ticket: &str) -> HttpResponse {
    request(
        gw.addr,
        "POST",
        &format!("/api/seckill/2001/buy?variant={variant}"),
        &[("X-User-Id", user), (TICKET, ticket)],
    )
    .await
}

fn report(gw: &GatewayProc, extra: &[&str]) -> (i32, String, String) {
    gw.report("2001", extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_tells_what_the_sale_did_and_draws_it() {
    let starts_at = in_secs(4);
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gw = GatewayProc::start(drop_config(&redis, &upstream, starts_at));
    // Before the sale: nothing opened, nothing sold.
    let (code, out, err) = report(&gw, &["--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let early: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(early["opened_at"], Value::Null, "{early}");
    assert_eq!(early["units"]["sold"], 0);
    // Ten buyers queue: six in the pre-queue (drawn at the start), four after it.
    let users: Vec<String> = (0..10).map(|i| format!("buyer{i}")).collect();
    let mut tickets = Vec::new();
    for user in &users[..6] {
        tickets.push(take_ticket(&gw, "2001", user).await.0);
    }
    wait_past(starts_at);
    for user in &users[6..] {
        tickets.push(take_ticket(&gw, "2001", user).await.0);
    }
    for (user, ticket) in users.iter().zip(&tickets) {
        wait_state(&gw, "2001", user, ticket, "your_turn").await;
    }
    // Variant a sells out (3), b sells 2; buyer5's purchase of b fails at the backend
    // (released); a restock of 2 units of a sells out again to buyer6 and buyer7. buyer8 and
    // buyer9 never buy: with buyer5, three admitted buyers hold nothing.
    for (i, variant) in [(0, "a"), (1, "a"), (2, "a"), (3, "b"), (4, "b")] {
        let r = buy_variant(&gw, &users[i], variant, &tickets[i]).await;
        assert_eq!(r.status, 200, "{}: {}", users[i], r.text());
    }
    upstream.set_status(500).await;
    let r = buy_variant(&gw, &users[5], "b", &tickets[5]).await;
    assert_eq!(r.status, 503, "{}", r.text());
    upstream.set_status(200).await;
    let r = gw
        .restock("2001", r#"{"add": 2, "variant": "a"}"#, Some("more-a"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for i in [6, 7] {
        let r = buy_variant(&gw, &users[i], "a", &tickets[i]).await;
        assert_eq!(r.status, 200, "{}: {}", users[i], r.text());
    }
    let view = wait_for_async("nothing pending", Duration::from_secs(10), || async {
        let v = gw.activity_view("2001").await;
        (v["pending"] == 0 && v["released"] == 1).then_some(v)
    })
    .await;
    gw.reconcile_clean();

    let (code, out, err) = report(&gw, &["--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["activity"], "2001");
    assert_eq!(
        story["units"],
        json!({"sold": 7, "released": 1, "pending": 0, "held_in_doubt": 0, "restocked": 2}),
        "{story}"
    );
    // The admin view says the same.
    for (field, key) in [
        ("sold", "confirmed"),
        ("released", "released"),
        ("restocked", "restocked"),
    ] {
        assert_eq!(story["units"][field], view[key], "{field}: {view}");
    }
    assert_eq!(
        story["buyers"],
        json!({"queued": 10, "admitted": 10, "bought": 7, "no_shows": 3}),
        "{story}"
    );
    let variants = story["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2);
    assert_eq!(variants[0]["id"], "a");
    assert_eq!(
        variants[0]["units"],
        json!({"sold": 5, "released": 0, "pending": 0, "held_in_doubt": 0, "restocked": 2})
    );
    assert_eq!(
        variants[1]["units"],
        json!({"sold": 2, "released": 1, "pending": 0, "held_in_doubt": 0, "restocked": 0})
    );
    for v in variants {
        let lane = view["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["id"] == v["id"])
            .unwrap();
        assert_eq!(v["units"]["sold"], lane["confirmed"], "{lane}");
    }
    // Variant a sold out after its restock; b has a unit left, so the drop has not.
    let time = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    assert!(variants[1]["sold_out_at"].is_null());
    assert!(story["sold_out_at"].is_null());
    let opened = time(&story["opened_at"]);
    assert_eq!(opened.timestamp_millis() as u64, rfc3339_ms(starts_at));
    let first = time(&story["first_sale_at"]);
    let sold_out_a = time(&variants[0]["sold_out_at"]);
    assert!(opened <= first && first < sold_out_a, "{story}");
    // Waits: the pre-queue waited from its tickets to the start at least.
    let w = &story["wait_ms"];
    let (p50, p95, max) = (
        w["p50"].as_u64().unwrap(),
        w["p95"].as_u64().unwrap(),
        w["max"].as_u64().unwrap(),
    );
    assert!(p50 <= p95 && p95 <= max && max >= 1000, "{w}");
    assert_eq!(story["challenges_solved"], 0);
    assert_eq!(story["draw"], "match");
    assert!(story.get("refusals").is_none(), "only with --prometheus");

    // The page: one file, no network, charts that drew lines and bars; Chinese on request.
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let (code, out, err) = report(&gw, &["--html", page.to_str().unwrap(), "--lang", "zh"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("units          sold 7"), "{out}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("按代码统计的拒绝"),
        "no refusals table without --prometheus"
    );
    for fetches in ["src=", "<link", "url(", "<script", "@import"] {
        assert!(!html.contains(fetches), "nothing to fetch: {fetches}");
    }
    let browser = Browser::start().await;
    browser.viewport(390, 844).await;
    browser.go(&format!("file://{}", page.display())).await;
    let seen = browser
        .script(
            "const n = (id, sel) => document.querySelectorAll('#' + id + ' svg ' + sel).length;
             return { lang: document.documentElement.lang, title: document.title,
                      sold: document.getElementById('sold').textContent,
                      lines: n('chart-events', 'polyline'), stock: n('chart-stock', 'polygon, path, polyline'),
                      bars: n('chart-waits', 'rect'),
                      width: document.querySelector('#chart-events svg').getBoundingClientRect().width,
                      overflow: document.documentElement.scrollWidth > window.innerWidth };",
        )
        .await;
    browser.screenshot("report-phone-zh").await;
    assert_eq!(seen["lang"], "zh", "{seen}");
    assert!(
        seen["title"].as_str().unwrap().contains("Example Shop"),
        "{seen}"
    );
    assert_eq!(seen["sold"], "7");
    assert!(
        seen["lines"].as_u64().unwrap() >= 5,
        "five series drawn: {seen}"
    );
    assert!(seen["stock"].as_u64().unwrap() >= 1, "{seen}");
    assert!(seen["bars"].as_u64().unwrap() >= 2, "{seen}");
    assert!(
        seen["width"].as_f64().unwrap() <= 390.0,
        "fits a phone: {seen}"
    );
    assert_eq!(
        seen["overflow"], false,
        "no sideways scroll on a phone: {seen}"
    );
    let (code, out, err) = report(&gw, &["--html", page.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    browser.viewport(1280, 900).await;
    browser.go(&format!("file://{}", page.display())).await;
    browser.screenshot("report-desk-en").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_refuses_what_it_cannot_tell() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gw = GatewayProc::start(drop_config(&redis, &upstream, in_secs(-10)));
    let (code, _, err) = gw.report("nope", &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nope"), "{err}");
    // A Prometheus that is not there: a clear error, exit 3.
    let url = format!("http://127.0.0.1:{}", free_port());
    let (code, _, err) = report(&gw, &["--prometheus", &url]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("prometheus"), "{err}");
}
