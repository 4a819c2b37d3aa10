//! The drop's story (issue 36): a sale run against the real gateway and redis-server (a
//! waiting room with a pre-queue and its draw, two variants, a restock, a release, no-shows),
//! then `flashgate report` must tell what the test counted, what the admin view and reconcile
//! say, and its page must render in Chromium with charts that drew something.

use crate::browser::Browser;
use crate::queue_support::*;
use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

/// Variant a: 3 units, then 2 restocked; variant b: 4 units. The waiting room opens a minute
/// before the test.
fn drop_config(redis: &RedisServer, upstream: &Upstream, starts_at: &'static str) -> TestConfig {
    drop_config_opening(redis, upstream, starts_at, in_secs(-60))
}

/// [`drop_config`] with the waiting room opening at `opens_at`.
fn drop_config_opening(
    redis: &RedisServer,
    upstream: &Upstream,
    starts_at: &'static str,
    opens_at: &'static str,
) -> TestConfig {
    let activity = TestActivity {
        starts_at,
        per_user_limit: 1,
        ..queued(
            "2001",
            0,
            Queue::admit(20).window_secs(600).opens_at(opens_at),
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
    // Each chart is drawn twice (a desk's and a phone's): what is counted is the one shown.
    let seen = browser
        .script(
            "const shown = id => [...document.querySelectorAll('#' + id + ' svg')]
                 .find(s => s.getBoundingClientRect().width > 0);
             const n = (id, sel) => shown(id).querySelectorAll(sel).length;
             return { lang: document.documentElement.lang, title: document.title,
                      sold: document.getElementById('sold').textContent,
                      lines: n('chart-events', 'polyline'), stock: n('chart-stock', 'polygon, path, polyline'),
                      bars: n('chart-waits', 'rect'),
                      width: shown('chart-events').getBoundingClientRect().width,
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

/// The time of day `label` (`22:46:05`, UTC) as the unix second nearest `near`.
fn label_second(label: &str, near: i64) -> i64 {
    let parts: Vec<i64> = label.split(':').map(|p| p.parse().unwrap()).collect();
    let of_day = parts[0] * 3600 + parts[1] * 60 + parts[2];
    let day = near - near.rem_euclid(86400);
    [day - 86400, day, day + 86400]
        .map(|d| d + of_day)
        .into_iter()
        .min_by_key(|s| (s - near).abs())
        .unwrap()
}

/// What a page's charts show, read in the browser: for each chart, the SVG shown (of its
/// two drawings), its box, and each text's string, box and font size as drawn (CSS px: the
/// SVG's font size times the scale its viewBox is drawn at).
const CHART_TEXTS: &str = "
    const charts = {};
    for (const id of ['chart-before', 'chart-events', 'chart-stock', 'chart-waits']) {
        const fig = document.getElementById(id);
        if (!fig) { continue; }
        const shown = [...fig.querySelectorAll('svg')].filter(s => s.getBoundingClientRect().width > 0);
        const svg = shown[0];
        const box = svg.getBoundingClientRect();
        const scale = box.width / svg.viewBox.baseVal.width;
        const caption = fig.querySelector('figcaption');
        charts[id] = {
            shown: shown.length,
            caption: caption ? caption.textContent : '',
            box: [box.left, box.top, box.right, box.bottom],
            texts: [...svg.querySelectorAll('text')].map(t => {
                const r = t.getBoundingClientRect();
                return { text: t.textContent.trim(), box: [r.left, r.top, r.right, r.bottom],
                         px: parseFloat(getComputedStyle(t).fontSize) * scale };
            }),
        };
    }
    return { width: window.innerWidth, scroll: document.documentElement.scrollWidth, charts };";

/// Checks the layout of every chart `seen` ([`CHART_TEXTS`]) and returns, by chart, its time
/// labels' seconds (near `near`) and the smallest font size drawn (CSS px).
fn chart_layout(seen: &serde_json::Value, near: i64, what: &str) -> Vec<(String, Vec<i64>, f64)> {
    let width = seen["width"].as_f64().unwrap();
    assert!(
        seen["scroll"].as_f64().unwrap() <= width,
        "{what}: no sideways scroll: {seen}"
    );
    let mut out = Vec::new();
    for (id, chart) in seen["charts"].as_object().unwrap() {
        assert_eq!(chart["shown"], 1, "{what} {id}: one drawing shown");
        let b = |v: &Value| -> [f64; 4] {
            let a = v.as_array().unwrap();
            [0, 1, 2, 3].map(|i| a[i].as_f64().unwrap())
        };
        let svg = b(&chart["box"]);
        assert!(
            svg[0] >= 0.0 && svg[2] <= width,
            "{what} {id}: {svg:?} in {width}"
        );
        let texts: Vec<(&str, [f64; 4], f64)> = chart["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["text"].as_str().unwrap(),
                    b(&t["box"]),
                    t["px"].as_f64().unwrap(),
                )
            })
            .collect();
        assert!(texts.len() >= 4, "{what} {id}: {texts:?}");
        for (text, r, px) in &texts {
            // Inside its drawing (an SVG cuts what passes its edge), so inside the page.
            let inside = r[0] >= svg[0] - 0.5
                && r[2] <= svg[2] + 0.5
                && r[1] >= svg[1] - 0.5
                && r[3] <= svg[3] + 0.5;
            assert!(inside, "{what} {id}: {text:?} {r:?} cut by {svg:?}");
            assert!(*px >= 9.0, "{what} {id}: {text:?} drawn {px:.1} px high");
        }
        for (i, (a, ra, _)) in texts.iter().enumerate() {
            for (c, rc, _) in &texts[i + 1..] {
                let w = ra[2].min(rc[2]) - ra[0].max(rc[0]);
                let h = ra[3].min(rc[3]) - ra[1].max(rc[1]);
                assert!(
                    w <= 0.5 || h <= 0.5,
                    "{what} {id}: {a:?} {ra:?} overlaps {c:?} {rc:?}"
                );
            }
        }
        let times: Vec<i64> = texts
            .iter()
            .filter(|(t, ..)| t.len() == 8 && t.as_bytes()[2] == b':' && t.as_bytes()[5] == b':')
            .map(|(t, ..)| label_second(t, near))
            .collect();
        let smallest = texts.iter().map(|t| t.2).fold(f64::MAX, f64::min);
        println!(
            "{what} {id}: drawn {:.0} px wide in a {width} px page, smallest text {smallest:.1} px",
            svg[2] - svg[0]
        );
        out.push((id.clone(), times, smallest));
    }
    out
}

/// Issue 48: a sneaker drop whose waiting room took tickets for 16 minutes before a sale of a
/// few seconds. The report's sale charts must span the sale, not the pre-queue; what came
/// before the start is drawn apart (its own strip) rather than cut; and every chart's texts
/// must be legible and apart on a phone (390 px) and a desk (1280 px), in English and Chinese.
///
/// The 16 minutes are the test's one fiction: the pre-queue's tickets are taken a few seconds
/// before the start, then the times Redis recorded for their calls (the queue hash's
/// `a:<number>`, which only the report reads) are moved back, to 16, 12, 8, 5, 2 minutes and
/// 30 seconds before the start, as if those buyers had come that early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_zooms_to_a_short_sale_and_draws_its_pre_queue_apart() {
    let starts_at = in_secs(4);
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gw = GatewayProc::start(drop_config_opening(
        &redis,
        &upstream,
        starts_at,
        in_secs(-20 * 60),
    ));
    let users: Vec<String> = (0..10).map(|i| format!("runner{i}")).collect();
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
    // Seven of the ten buy, a second apart (a sale of seconds, not of one): a's 3 units and
    // b's 4, the drop sold out.
    for i in 0..7 {
        if i > 0 {
            // The buyers' pace, not a wait for a fact.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let variant = if i < 3 { "a" } else { "b" };
        let r = buy_variant(&gw, &users[i], variant, &tickets[i]).await;
        assert_eq!(r.status, 200, "{}: {}", users[i], r.text());
    }
    wait_for_async("nothing pending", Duration::from_secs(10), || async {
        let v = gw.activity_view("2001").await;
        (v["pending"] == 0 && v["confirmed"] == 7).then_some(())
    })
    .await;
    // Every event of the sale happened by now.
    let sale_last_s = (redis.time_ms() / 1000) as i64;
    let start_ms = rfc3339_ms(starts_at);
    let start_s = (start_ms / 1000) as i64;
    let mut conn = redis.conn();
    let before_ms = [
        16 * 60_000,
        12 * 60_000,
        8 * 60_000,
        5 * 60_000,
        2 * 60_000,
        30_000,
    ];
    for (ticket, early) in tickets[..6].iter().zip(before_ms) {
        let field = format!("a:{}", number(ticket));
        let was: Option<u64> = redis::cmd("HGET")
            .arg("fg:{2001}:q")
            .arg(&field)
            .query(&mut conn)
            .unwrap();
        assert!(was.is_some_and(|at| at < start_ms), "{field}: {was:?}");
        let () = redis::cmd("HSET")
            .arg("fg:{2001}:q")
            .arg(&field)
            .arg(start_ms - early)
            .query(&mut conn)
            .unwrap();
    }
    let (code, out, err) = report(&gw, &["--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["units"]["sold"], 7, "{story}");
    assert_eq!(story["buyers"]["queued"], 10, "{story}");
    assert!(
        story["wait_ms"]["max"].as_u64().unwrap() >= 16 * 60_000,
        "the first buyer waited 16 minutes: {story}"
    );
    let first_s = start_s - 16 * 60;

    let dir = tempfile::tempdir().unwrap();
    let browser = Browser::start().await;
    for (lang, sixteen, from_start) in [
        ("en", "(16 min)", "From the start to the last event"),
        ("zh", "(16 分钟)", "从开售到最后一个事件"),
    ] {
        let page = dir.path().join(format!("report-{lang}.html"));
        let (code, out, err) = report(&gw, &["--html", page.to_str().unwrap(), "--lang", lang]);
        assert_eq!(code, 0, "{out}{err}");
        for (screen, width, height) in [("phone", 390, 844), ("desk", 1280, 900)] {
            let what = format!("{screen} {lang}");
            browser.viewport(width, height).await;
            browser.go(&format!("file://{}", page.display())).await;
            let seen = browser.script(CHART_TEXTS).await;
            let charts = seen["charts"].as_object().unwrap();
            // The pre-queue's strip: its range, and its labels within it.
            let strip = &charts["chart-before"];
            let caption = strip["caption"].as_str().unwrap();
            for says in [chrono_clock(first_s), chrono_clock(start_s), sixteen.into()] {
                assert!(caption.contains(&says), "{what}: {says} in {caption}");
            }
            let caption = charts["chart-events"]["caption"].as_str().unwrap();
            assert!(
                caption.contains(from_start) && caption.contains(&chrono_clock(start_s)),
                "{what}: {caption}"
            );
            for (id, times, smallest) in chart_layout(&seen, start_s, &what) {
                let clocks: Vec<String> = times.iter().map(|t| chrono_clock(*t)).collect();
                println!("{what} {id}: time labels {clocks:?}, smallest text {smallest:.1} px");
                let range = match id.as_str() {
                    "chart-before" => first_s..=start_s,
                    "chart-events" | "chart-stock" => start_s..=sale_last_s + 1,
                    _ => continue,
                };
                assert!(!times.is_empty(), "{what} {id}: labelled");
                assert!(
                    times.iter().all(|t| range.contains(t)),
                    "{what} {id}: labels {times:?} outside {range:?} (start {start_s})"
                );
                assert!(times.is_sorted(), "{what} {id}: {times:?}");
            }
            browser
                .script("document.getElementById('chart-before').scrollIntoView(); return null;")
                .await;
            browser
                .screenshot(&format!("report-zoom-{screen}-{lang}"))
                .await;
        }
    }
}

/// A unix second's time of day, as the report writes it (`22:46:05`, UTC).
fn chrono_clock(second: i64) -> String {
    chrono::DateTime::from_timestamp(second, 0)
        .unwrap()
        .format("%H:%M:%S")
        .to_string()
}
