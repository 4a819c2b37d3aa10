//! The operator's console (`GET /ui` on the admin listener) in headless Chromium against a real
//! fleet (two gateways, one Redis): nothing without the token (and every action answers 401),
//! the drop's figures as the admin API gives them, halt from the console and both gateways
//! refuse within a second, resume, restock a size and see it sell; English and Chinese, desktop
//! and phone width, screenshots kept.

use crate::browser::Browser;
use crate::support::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SIZES: [(&str, u64); 3] = [("42", 5), ("43", 5), ("44", 5)];

/// A drop "2001" in three sizes, one unit per buyer across them.
fn drop_config(redis: &RedisServer, upstream: &Upstream) -> TestConfig {
    let mut config = TestConfig::new(
        redis,
        upstream,
        vec![TestActivity::open("2001", 0).limit(1)],
    );
    config.per_user = None;
    let sizes: Vec<Value> = SIZES
        .iter()
        .map(|(id, stock)| json!({"id": id, "stock": stock, "title": format!("EU {id}")}))
        .collect();
    config
        .set("/activities/0/stock", Value::Null)
        .set("/activities/0/variants", json!(sizes))
        .set("/sale_routes/0/variant_query", json!("variant"))
}

async fn buy(gw: &GatewayProc, user: &str, size: &str) -> HttpResponse {
    let path = format!("/api/seckill/2001/buy?variant={size}");
    request(gw.addr, "POST", &path, &[("X-User-Id", user)]).await
}

/// What the console shows: whether signed in, the status line, each size's figures, the
/// activity's state, and whether the page is wider than the window.
const READ: &str = "var a = document.querySelector('article[data-activity=\"2001\"]'); \
    var rows = {}; if (a) { a.querySelectorAll('tbody tr').forEach(function (r) { \
      var f = {}; r.querySelectorAll('td').forEach(function (c) { \
        f[c.dataset.figure] = c.textContent; }); rows[r.dataset.lane] = f; }); } \
    return {signed_in: document.getElementById('sign-in').hidden, \
      status: document.getElementById('status').textContent, \
      state: a ? a.querySelector('.state').dataset.state : null, rows: rows, \
      cards: document.querySelectorAll('article').length, \
      dialog: document.getElementById('confirm').open, \
      text: document.body.innerText, \
      overflow: document.documentElement.scrollWidth > window.innerWidth};";

/// Polls the console until `done` holds of what it shows.
async fn until(browser: &Browser, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    wait_for_async(what, Duration::from_secs(15), || async {
        let v = browser.script(READ).await;
        done(&v).then_some(v)
    })
    .await
}

/// Clicks an action of the drop's card and confirms it in the dialog.
async fn confirm(browser: &Browser, action: &str) -> Value {
    confirm_on(browser, "2001", action).await
}

/// Clicks an action of activity `act`'s card and confirms it in the dialog; what it asked.
async fn confirm_on(browser: &Browser, act: &str, action: &str) -> Value {
    browser
        .click(&format!(
            "article[data-activity=\"{act}\"] [data-action=\"{action}\"]"
        ))
        .await;
    let asked = until(browser, "the confirmation", |v| v["dialog"] == true).await;
    browser.click("#confirm-ok").await;
    asked
}

/// A desktop browser signed in to `gw`'s console.
async fn console_of(gw: &GatewayProc) -> Browser {
    let browser = Browser::start().await;
    browser.viewport(1280, 900).await;
    browser.go(&format!("http://{}/ui", gw.admin)).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#sign-in button[type=submit]").await;
    browser
}

/// What activity `act`'s card shows of a fence: its state, the panel's text and commands, and
/// the status line.
fn fence_card(act: &str) -> String {
    format!(
        "var a = document.querySelector('article[data-activity=\"{act}\"]'); \
         var f = a && a.querySelector('.fenced'); var pre = f && f.querySelector('pre'); \
         return {{state: a ? a.querySelector('.state').dataset.state : null, \
           fence: f ? f.innerText : '', commands: pre ? pre.textContent : '', \
           status: document.getElementById('status').textContent}};"
    )
}

/// The size's figures in the admin API's view, as the console writes them.
fn figures(view: &Value, size: &str) -> Value {
    let row = view["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == size)
        .unwrap();
    json!({
        "remaining": row["remaining"].to_string(),
        "pending": row["pending"].to_string(),
        "confirmed": row["confirmed"].to_string(),
    })
}

/// Buys on `gw` as `holder` (who holds their one unit already: probing takes no stock, each
/// answer 409) until the answer is 503 `unavailable`; the time it took from `from`.
async fn refused_after(gw: &GatewayProc, from: Instant, holder: &str) -> Duration {
    loop {
        let r = buy(gw, holder, "44").await;
        match r.status {
            503 => {
                assert_eq!(r.json()["code"], "unavailable", "{}", r.text());
                return from.elapsed();
            }
            409 => {}
            other => panic!("{holder}: {other} {}", r.text()),
        }
        assert!(
            from.elapsed() < Duration::from_secs(5),
            "{holder}: never refused"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_shows_the_drop_and_runs_the_fleets_actions() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = drop_config(&redis, &upstream);
    let a = GatewayProc::start(config.clone());
    let b = GatewayProc::start(config.on_new_ports());
    for (i, gw) in [&a, &b].iter().enumerate() {
        let r = buy(gw, &format!("early-{i}"), "42").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Without the token: the API refuses every call the console makes.
    for (method, path) in [
        ("GET", "/v1/activities"),
        ("POST", "/v1/activities/2001/halt"),
        ("POST", "/v1/activities/2001/resume"),
        ("POST", "/v1/activities/2001/restock"),
    ] {
        let r = request(a.admin, method, path, &[]).await;
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text());
    }
    let browser = Browser::start().await;
    browser.viewport(1280, 900).await;
    let ui = format!("http://{}/ui", a.admin);
    browser.go(&ui).await;
    let shown = until(&browser, "the sign-in", |v| v["signed_in"] == false).await;
    assert_eq!(shown["cards"], 0, "nothing before the token: {shown}");
    assert!(shown["text"].as_str().unwrap().contains("Admin token"));
    // A wrong token: refused, nothing shown, asked again.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#sign-in button[type=submit]").await;
    let shown = until(&browser, "the refusal", |v| {
        v["status"].as_str().unwrap().contains("401") && v["signed_in"] == false
    })
    .await;
    assert_eq!(shown["cards"], 0, "{shown}");
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.type_into("#operator", "Ana 李").await;
    browser.click("#sign-in button[type=submit]").await;
    // The fleet: both gateways, as each one's roll in Redis says.
    let roll = wait_for_async(
        "both gateways on the roll",
        Duration::from_secs(10),
        || async {
            let r = a.admin_get("/v1/fleet").await;
            let roll = r.json();
            (roll["gateways"].as_array()?.len() == 2).then_some(roll)
        },
    )
    .await;
    let admins: Vec<&str> = roll["gateways"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["admin"].as_str().unwrap())
        .collect();
    assert!(
        admins.contains(&a.admin.to_string().as_str())
            && admins.contains(&b.admin.to_string().as_str()),
        "{roll}"
    );
    let own: Vec<&Value> = roll["gateways"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["self"] == true)
        .collect();
    assert_eq!(own.len(), 1, "{roll}");
    assert_eq!(own[0]["admin"], a.admin.to_string(), "{roll}");
    wait_for_async(
        "the fleet on the console",
        Duration::from_secs(10),
        || async {
            let n = browser
                .script("return document.querySelectorAll('#fleet li').length;")
                .await;
            (n == 2).then_some(())
        },
    )
    .await;
    // The figures are the admin API's.
    let view = a.activity_view("2001").await;
    let shown = until(&browser, "the drop's figures", |v| {
        v["rows"]["42"] == figures(&view, "42") && v["rows"]["43"] == figures(&view, "43")
    })
    .await;
    assert_eq!(shown["state"], "selling", "{shown}");
    assert_eq!(shown["rows"]["42"]["confirmed"], "2", "{shown}");
    browser.screenshot("console-desktop-en").await;

    // Cancel changes nothing.
    browser
        .click("article[data-activity=\"2001\"] [data-action=\"halt\"]")
        .await;
    let asked = until(&browser, "the confirmation", |v| v["dialog"] == true).await;
    assert!(asked["text"].as_str().unwrap().contains("every gateway"));
    browser.click("#confirm-cancel").await;
    until(&browser, "the dialog closed", |v| v["dialog"] == false).await;
    assert_eq!(a.activity_view("2001").await["halted"], false);

    // Halt: both gateways refuse within a second of the API's answer.
    confirm(&browser, "halt").await;
    let shown = until(&browser, "the halt's answer", |v| {
        v["status"].as_str().unwrap().contains("Halt: done")
    })
    .await;
    let answered = Instant::now();
    for (gw, holder) in [(&a, "early-0"), (&b, "early-1")] {
        let took = refused_after(gw, answered, holder).await;
        assert!(took < Duration::from_secs(1), "{holder}: {took:?} {shown}");
    }
    until(&browser, "the halted state", |v| v["state"] == "halted").await;
    // The refusals of the last minute, by code (this gateway's: its prober's 503).
    let refusals = wait_for_async("the refusals by code", Duration::from_secs(15), || async {
        let text = browser
            .script("return document.querySelector('article[data-activity=\"2001\"] .refusals').textContent;")
            .await;
        let text = text.as_str()?.to_owned();
        text.contains("unavailable 1").then_some(text)
    })
    .await;
    assert!(refusals.contains("on this gateway"), "{refusals}");
    // In the gateway's log: the call, its answer, and who made it (the console, from where).
    let logged = wait_for("the halt in the log", Duration::from_secs(5), || {
        a.logs()
            .lines()
            .find(|l| {
                l.contains("admin call")
                    && l.contains("/v1/activities/2001/halt")
                    && l.contains("status=200")
            })
            .map(str::to_owned)
    });
    assert!(
        logged.contains("via=\"console\"") || logged.contains("via=console"),
        "{logged}"
    );
    assert!(logged.contains("peer=\"127.0.0.1:"), "{logged}");
    assert!(logged.contains("Ana 李"), "the operator's name: {logged}");
    // The refused calls without the token are there too, as the API's.
    assert!(a.logs().contains("status=401"), "the 401s logged");

    // Halted, Halt is not offered again.
    let disabled = browser
        .script("return document.querySelector('article[data-activity=\"2001\"] [data-action=\"halt\"]').disabled;")
        .await;
    assert_eq!(disabled, true);
    // A count above what size 42 ever had is refused on the form, before any call.
    browser.type_into("#count-2001", "99").await;
    browser
        .click("#resume-variant-2001 option[value=\"42\"]")
        .await;
    browser
        .click("article[data-activity=\"2001\"] [data-action=\"resume\"]")
        .await;
    let shown = until(&browser, "the count refused on the form", |v| {
        v["status"]
            .as_str()
            .unwrap()
            .contains("more than this stock ever had (5")
    })
    .await;
    assert_eq!(shown["dialog"], false, "{shown}");
    browser
        .script("document.getElementById('count-2001').value = ''; return true;")
        .await;
    // A count the API refuses (nothing of size 42 was lost) is the API's refusal, shown as
    // such, and changes nothing.
    browser.type_into("#count-2001", "4").await;
    browser
        .click("#resume-variant-2001 option[value=\"42\"]")
        .await;
    let asked = confirm(&browser, "resume").await;
    assert!(
        asked["text"].as_str().unwrap().contains("count of 4"),
        "{asked}"
    );
    let shown = until(&browser, "the count refused", |v| {
        v["status"].as_str().unwrap().contains("answered 409")
    })
    .await;
    assert_eq!(shown["state"], "halted", "{shown}");
    let view = a.activity_view("2001").await;
    assert_eq!(view["variants"][0]["remaining"], 3, "unchanged: {view}");

    // Resume (no count): both sell again.
    browser
        .script("document.getElementById('count-2001').value = ''; return true;")
        .await;
    confirm(&browser, "resume").await;
    until(&browser, "selling again", |v| v["state"] == "selling").await;
    for (i, gw) in [&a, &b].iter().enumerate() {
        let sold = wait_for_async(
            "a sale after the resume",
            Duration::from_secs(5),
            || async {
                let r = buy(gw, &format!("after-{i}"), "44").await;
                (r.status == 200).then_some(())
            },
        )
        .await;
        let _: () = sold;
    }

    // Resume is not offered while it sells.
    let disabled = browser
        .script("return document.querySelector('article[data-activity=\"2001\"] [data-action=\"resume\"]').disabled;")
        .await;
    assert_eq!(disabled, true);

    // Restock size 43 by 3 from the form, its first answer lost on the way back (the page is
    // told 502): the console offers the same call again, sent with the same Idempotency-Key,
    // and the units are added once. Then it sells.
    browser
        .script(
            "window.sentKeys = []; var real = window.fetch; \
             window.fetch = async function (u, o) { var r = await real(u, o); \
               if (o && o.method === 'POST' && String(u).endsWith('/restock')) { \
                 window.sentKeys.push(o.headers['Idempotency-Key']); \
                 if (window.sentKeys.length === 1) return new Response('{\"message\": \"lost\"}', {status: 502}); } \
               return r; }; return true;",
        )
        .await;
    let before = a.activity_view("2001").await;
    browser.type_into("#units-2001", "3").await;
    browser
        .click("#restock-variant-2001 option[value=\"43\"]")
        .await;
    let asked = confirm(&browser, "restock").await;
    assert!(
        asked["text"].as_str().unwrap().contains("2001 / 43"),
        "{asked}"
    );
    until(&browser, "the unsure answer", |v| {
        v["status"]
            .as_str()
            .unwrap()
            .contains("may have been applied")
    })
    .await;
    browser.click("#retry").await;
    until(&browser, "the retry's answer", |v| {
        v["status"].as_str().unwrap().contains("Restock: done")
    })
    .await;
    let keys = browser.script("return window.sentKeys;").await;
    assert_eq!(keys.as_array().unwrap().len(), 2, "{keys}");
    assert_eq!(keys[0], keys[1], "the same call: {keys}");
    assert!(keys[0].as_str().unwrap().starts_with("console-"), "{keys}");
    let after = a.activity_view("2001").await;
    let r = |v: &Value| v["variants"][1]["remaining"].as_i64().unwrap();
    assert_eq!(r(&after), r(&before) + 3, "added once: {after}");
    // The log names the size, and says the second call added nothing.
    let logs = a.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains(" restocked") && l.contains("variant=\"43\"")),
        "the restock's size in the log"
    );
    assert!(logs.contains("restock repeated under its Idempotency-Key"));
    assert_eq!(after["variants"][1]["id"], "43");
    let r = buy(&b, "restocked-buyer", "43").await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chinese_at_phone_width() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gw = GatewayProc::start(drop_config(&redis, &upstream));
    for (lang, languages, name) in [
        ("zh", "zh-CN,zh", "console-phone-zh"),
        ("en", "en-US,en", "console-phone-en"),
    ] {
        let browser = Browser::start_with(true, languages).await;
        browser.viewport(390, 844).await;
        browser.go(&format!("http://{}/ui", gw.admin)).await;
        let shown = until(&browser, "the sign-in", |v| v["signed_in"] == false).await;
        let label = if lang == "zh" {
            "管理令牌"
        } else {
            "Admin token"
        };
        assert!(shown["text"].as_str().unwrap().contains(label), "{shown}");
        browser.type_into("#token", ADMIN_TOKEN).await;
        browser.click("#sign-in button[type=submit]").await;
        let shown = until(&browser, "the drop", |v| v["cards"] == 1).await;
        let (halt, selling) = if lang == "zh" {
            ("停售", "销售中")
        } else {
            ("Halt", "selling")
        };
        let text = shown["text"].as_str().unwrap();
        assert!(text.contains(halt) && text.contains(selling), "{shown}");
        if shown["overflow"] == true {
            let widest = browser
                .script(
                    "var w = []; document.querySelectorAll('*').forEach(function (e) { \
                     var r = e.getBoundingClientRect(); if (r.right > window.innerWidth) \
                     w.push(e.tagName + '#' + e.id + '.' + e.className + ' ' + r.right); }); return w;",
                )
                .await;
            panic!("{name}: wider than a phone: {widest}");
        }
        browser.screenshot(name).await;
        browser.viewport(1280, 900).await;
        browser.screenshot(&name.replace("phone", "desktop")).await;
    }
}

/// A store emptied under a selling drop: the console shows it fenced, why, and the next step
/// with its commands; a plain Resume is the API's refusal; a Resume with the count from the form
/// sells exactly that many again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_drop_is_resumed_with_a_count_from_the_form() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(&redis, &upstream, vec![TestActivity::open("1001", 10)]);
    config.per_user = None;
    let gw = GatewayProc::start(config);
    let mut orders = Vec::new();
    for i in 0..4 {
        let r = gw.buy("1001", &format!("before-{i}"), None).await;
        assert_eq!(r.status, 200, "{}", r.text());
        orders.push(r.reservation_id());
    }
    redis.kill();
    redis.restart();
    let browser = console_of(&gw).await;
    let card = &fence_card("1001");
    let shown = wait_for_async("the fence shown", Duration::from_secs(15), || async {
        let v = browser.script(card).await;
        (v["state"] == "fenced").then_some(v)
    })
    .await;
    let fence = shown["fence"].as_str().unwrap();
    assert!(
        fence.contains("lost sales") && fence.contains("Next step"),
        "{shown}"
    );
    assert!(
        fence.contains(
            "flashgate reconcile --config gateway.yaml --activity 1001 --orders orders.txt"
        ),
        "{shown}"
    );
    assert!(fence.contains("/v1/activities/1001/resume"), "{shown}");
    assert!(fence.contains("No reconcile --orders"), "{shown}");
    // The reconcile the panel asks for: what it found shows on the panel, for the count.
    let (code, report) = gw.reconcile_orders("1001", &orders, false);
    assert_eq!(code, 1, "the store forgot the orders: {report}");
    let shown = wait_for_async(
        "the reconcile on the panel",
        Duration::from_secs(10),
        || async {
            let v = browser.script(card).await;
            v["fence"]
                .as_str()?
                .contains("4 unknown to Redis")
                .then_some(v)
        },
    )
    .await;
    assert!(
        shown["fence"].as_str().unwrap().contains("0 confirmed"),
        "{shown}"
    );
    let view = gw.activity_view("1001").await;
    assert_eq!(view["orders_check"]["unknown"], 4, "{view}");
    browser.screenshot("console-fenced-en").await;
    // A plain resume: the API refuses it (the store lost sales), and the console says so.
    confirm_on(&browser, "1001", "resume").await;
    wait_for_async("the refusal", Duration::from_secs(10), || async {
        let v = browser.script(card).await;
        v["status"].as_str().unwrap().contains("409").then_some(())
    })
    .await;
    assert_eq!(gw.buy("1001", "during", None).await.status, 503);
    // The count from the form: exactly 6 more sell.
    browser.type_into("#count-1001", "6").await;
    confirm_on(&browser, "1001", "resume").await;
    wait_for_async("selling again", Duration::from_secs(10), || async {
        let v = browser.script(card).await;
        (v["state"] == "selling").then_some(())
    })
    .await;
    // Each buyer retries what may be retried (503 `unavailable`) until answered.
    let mut sold = 0;
    for i in 0..12 {
        let user = format!("after-{i}");
        let status = wait_for_async("an answer", Duration::from_secs(10), || async {
            let r = gw.buy("1001", &user, None).await;
            (r.status != 503).then_some(r.status)
        })
        .await;
        match status {
            200 => sold += 1,
            409 | 410 => {}
            other => panic!("{user}: {other}"),
        }
    }
    assert_eq!(sold, 6, "the count, exactly");
}

/// A drop in sizes whose store was emptied: each size's fence on the card with its why, the
/// runbook's commands with the size named (each runs as written: the API's answer), and the
/// count the sizes' shared buyers' units make impossible shown as the API says it: sell under
/// a new activity id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_drop_in_sizes_says_what_a_count_cannot_do() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let gw = GatewayProc::start(drop_config(&redis, &upstream));
    for (user, size) in [("s-1", "42"), ("s-2", "42"), ("s-3", "43")] {
        let r = buy(&gw, user, size).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    redis.kill();
    redis.restart();
    let browser = console_of(&gw).await;
    let card = &fence_card("2001");
    let shown = wait_for_async("both sizes' fences", Duration::from_secs(20), || async {
        let v = browser.script(card).await;
        let fence = v["fence"].as_str()?;
        (fence.contains("EU 42 (42): Fenced") && fence.contains("EU 43 (43): Fenced")).then_some(v)
    })
    .await;
    let fence = shown["fence"].as_str().unwrap();
    assert!(fence.contains("new activity id"), "{shown}");
    browser.screenshot("console-fenced-sizes-en").await;
    // Each command as the card writes it, N filled in: the API's own answer.
    let commands = shown["commands"].as_str().unwrap();
    let resume = commands
        .lines()
        .find(|l| l.contains("\"variant\":\"42\""))
        .unwrap_or_else(|| panic!("no resume of size 42: {commands}"));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(resume.replace("\"remaining\":N", "\"remaining\":3"))
        .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.contains("new activity id"), "{resume}: {answer}");
    // The form: size 42, a count of 3: the API's refusal, in its words.
    browser.type_into("#count-2001", "3").await;
    browser
        .click("#resume-variant-2001 option[value=\"42\"]")
        .await;
    confirm(&browser, "resume").await;
    let shown = wait_for_async("the count refused", Duration::from_secs(10), || async {
        let v = browser.script(card).await;
        v["status"].as_str()?.contains("409").then_some(v)
    })
    .await;
    assert!(
        shown["status"]
            .as_str()
            .unwrap()
            .contains("new activity id"),
        "{shown}"
    );
    assert_eq!(buy(&gw, "during", "44").await.status, 503);
}

/// A drop with a waiting room: the console shows who waits, who was admitted and the rate as the
/// queue's admin view says, and sets the rate, pauses and resumes the queue for the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_room_on_the_console_and_its_controls() {
    use crate::queue_support::{in_secs, queued, take_ticket};
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // And a drop whose waiting room opened before its sale: the pre-queue.
    let early = TestActivity {
        starts_at: in_secs(3600),
        ..queued("3002", 50, Queue::admit(1).opens_at(in_secs(-60)))
    };
    let mut config = TestConfig::new(
        &redis,
        &upstream,
        vec![queued("3001", 50, Queue::admit(1)), early],
    );
    config.per_user = None;
    let mut gw = GatewayProc::start(config.clone());
    for i in 0..6 {
        take_ticket(&gw, "3001", &format!("waiting-{i}")).await;
    }
    // 3002's room is open and has issued a ticket: a start moved earlier now is not applied,
    // and the console shows the start that stays, naming the configured one.
    take_ticket(&gw, "3002", "early-bird").await;
    config.activities[1].starts_at = in_secs(1800);
    gw.rewrite_config(config.clone());
    let r = gw.admin_post("/v1/config/reload").await;
    assert_eq!(r.status, 200, "{}", r.text());
    gw.wait_generation(2).await;
    let queue = || async {
        let r = gw.admin_get("/v1/activities/3001/queue").await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let browser = console_of(&gw).await;
    let read = "var q = {}; document.querySelectorAll('article[data-activity=\"3001\"] dd') \
        .forEach(function (d) { q[d.dataset.queue] = d.textContent; }); \
        return {q: q, dialog: document.getElementById('confirm').open, \
          status: document.getElementById('status').textContent};";
    // The figures are the queue view's (read on both sides until they agree: admissions move).
    wait_for_async("the queue's figures", Duration::from_secs(15), || async {
        let v = browser.script(read).await;
        let api = queue().await;
        // `length`: the tickets issued and not yet reached.
        let want =
            json!({"waiting": api["length"].to_string(), "admitted": api["cursor"].to_string()});
        (v["q"]["waiting"] == want["waiting"]
            && v["q"]["admitted"] == want["admitted"]
            && v["q"]["rate"] == "1")
            .then_some(())
    })
    .await;
    let state = browser
        .script(
            "return document.querySelector('article[data-activity=\"3002\"] .state').textContent;",
        )
        .await;
    assert_eq!(state, "pre-queue");
    let times = wait_for_async("the start that stays", Duration::from_secs(10), || async {
        let t = browser
            .script("return document.querySelector('article[data-activity=\"3002\"] .times').textContent;")
            .await;
        let t = t.as_str()?.to_owned();
        t.contains("the waiting room keeps this start").then_some(t)
    })
    .await;
    assert!(times.contains("is not applied"), "{times}");
    let clears = browser
        .script("return document.querySelector('article[data-activity=\"3002\"] dd[data-queue=\"clear\"]').textContent;")
        .await;
    assert!(
        clears.as_str().unwrap().ends_with("min"),
        "counted from the start, an hour away: {clears}"
    );
    browser.screenshot("console-queue-en").await;
    browser.type_into("#rate-3001", "7").await;
    confirm_on(&browser, "3001", "queue-rate").await;
    wait_for_async("the new rate", Duration::from_secs(5), || async {
        (queue().await["admit_per_second"] == 7).then_some(())
    })
    .await;
    confirm_on(&browser, "3001", "queue-pause").await;
    wait_for_async("the pause", Duration::from_secs(5), || async {
        (queue().await["paused"] == true).then_some(())
    })
    .await;
    wait_for_async("paused on the console", Duration::from_secs(5), || async {
        let v = browser.script(read).await;
        v["q"]["rate"].as_str()?.contains("paused").then_some(())
    })
    .await;
    confirm_on(&browser, "3001", "queue-resume").await;
    wait_for_async("the resume", Duration::from_secs(5), || async {
        (queue().await["paused"] == false).then_some(())
    })
    .await;
    // The emergency stop: every activity halted, for the fleet.
    browser.click("#halt-all").await;
    let asked = wait_for_async("the confirmation", Duration::from_secs(5), || async {
        let v = browser.script(read).await;
        (v["dialog"] == true).then_some(())
    });
    asked.await;
    browser.click("#confirm-ok").await;
    for id in ["3001", "3002"] {
        wait_for_async("halted", Duration::from_secs(5), || async {
            (gw.activity_view(id).await["halted"] == true).then_some(())
        })
        .await;
    }
    wait_for_async("nothing left to halt", Duration::from_secs(5), || async {
        let off = browser
            .script("return document.getElementById('halt-all').disabled;")
            .await;
        (off == true).then_some(())
    })
    .await;
}
