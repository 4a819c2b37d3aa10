//! Dashboards and alerts against a real Prometheus (Debian's package): a gateway under load is
//! scraped, then every Grafana panel query and every alert expression must parse and return
//! series; the rule file must pass `promtool check rules` and load without errors. And what
//! Prometheus holds of a drop's stock (a series per size) and of an activity a reload removed
//! (nothing from the next scrape on).

#[path = "support/mod.rs"]
mod support;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;

/// A private Prometheus scraping `targets` every second, with the repository's alert rules.
struct Prometheus {
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = repo_path("prometheus/flashgate-alerts.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - \"{}\"\nscrape_configs:\n  - job_name: flashgate\n    static_configs:\n      - targets: [\"{target}\"]\n",
            rules.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "prometheus starts (Debian package `prometheus`; scripts/ensure-deps installs it)",
            );
        // Prometheus listens before its storage is open and answers 503 until then:
        // ready means `/-/ready` answers 200.
        wait_for("prometheus to be ready", Duration::from_secs(30), || {
            blocking_get(addr, "/-/ready")
                .ok()
                .filter(|r| r.status == 200)
        });
        Prometheus {
            addr,
            child,
            _dir: dir,
        }
    }

    /// `/api/v1/query`: the `data.result` array, or the error Prometheus gave.
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let resp = get(
            self.addr,
            &format!("/api/v1/query?query={}", percent_encode(expr)),
            &[],
        )
        .await;
        if !resp.body.starts_with(b"{") {
            return Err(format!(
                "{expr}: {} {}",
                resp.status,
                String::from_utf8_lossy(&resp.body)
            ));
        }
        let body = resp.json();
        if body["status"] != "success" {
            return Err(format!("{expr}: {body}"));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Waits until Prometheus holds a scrape of the gateway taken after `after`: the newest
    /// sample's timestamp (when its scrape began) is later.
    async fn wait_scraped_after(&self, after: std::time::SystemTime) {
        let after = after
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        wait_for_async(
            "a scrape begun after the given moment",
            Duration::from_secs(30),
            || async {
                let r = self
                    .query("timestamp(flashgate_config_generation)")
                    .await
                    .ok()?;
                let at: f64 = r.first()?["value"][1].as_str()?.parse().ok()?;
                (at > after).then_some(())
            },
        )
        .await;
    }

    /// The value of each series `expr` selects now, by the value of its label `label` (`""`
    /// where the series has none); panics if Prometheus refuses the query.
    async fn values_by(&self, expr: &str, label: &str) -> BTreeMap<String, f64> {
        self.query(expr)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|s| {
                let key = s["metric"][label].as_str().unwrap_or_default().to_owned();
                let value = s["value"][1].as_str().and_then(|v| v.parse().ok());
                (key, value.unwrap_or_else(|| panic!("{expr}: {s}")))
            })
            .collect()
    }

    /// Polls until the series `expr` selects, by `label`, are `want`; their last values are in
    /// the panic after 30 s.
    async fn wait_values(&self, expr: &str, label: &str, want: &BTreeMap<String, f64>) {
        let end = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.values_by(expr, label).await;
            if &now == want {
                return;
            }
            assert!(
                std::time::Instant::now() < end,
                "{expr} by {label}: wanted {want:?}, Prometheus has {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether `expr` selects no series now; panics (naming `what`) if Prometheus refuses it.
    async fn no_series(&self, what: &str, expr: &str) -> bool {
        self.query(expr)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .is_empty()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every panel query of the dashboard, with its variables as "All" would set them.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("grafana/flashgate-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap().replace("$activity", ".*");
            out.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

/// Every alert: (name, full expression, the expression without its threshold).
fn alert_expressions() -> Vec<(String, String, String)> {
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_path("prometheus/flashgate-alerts.yml")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap().to_owned();
            let expr = rule["expr"].as_str().unwrap().trim().to_owned();
            let (signal, threshold) = [" > ", " == ", " < ", " != "]
                .iter()
                .filter_map(|op| expr.rsplit_once(op))
                .max_by_key(|(left, _)| left.len())
                .unwrap_or_else(|| panic!("alert {name} has no threshold: {expr}"));
            assert!(
                threshold.trim().parse::<f64>().is_ok(),
                "alert {name} should end in a numeric threshold: {expr}"
            );
            out.push((name, expr.clone(), signal.trim().to_owned()));
        }
    }
    out
}

#[test]
fn promtool_checks_the_rules_and_the_example_config() {
    for args in [
        vec!["check", "rules", "prometheus/flashgate-alerts.yml"],
        vec!["check", "config", "prometheus/prometheus.yml"],
        // The rules' own unit tests: each alert fires (and resolves) on the series it watches.
        vec!["test", "rules", "prometheus/flashgate-alerts.test.yml"],
    ] {
        let out = run_bounded(
            "promtool (Debian package `prometheus`)",
            Command::new("promtool")
                .args(&args)
                .current_dir(repo_path(".")),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn grafana_provisioning_points_at_the_dashboard_variable_not_import_inputs() {
    let dashboard = std::fs::read_to_string(repo_path("grafana/flashgate-dashboard.json")).unwrap();
    assert!(
        !dashboard.contains("DS_PROMETHEUS"),
        "provisioning cannot fill import inputs"
    );
    assert!(dashboard.contains(r#""uid": "${datasource}""#));
    for file in [
        "grafana/provisioning/datasources/flashgate.yaml",
        "grafana/provisioning/dashboards/flashgate.yaml",
    ] {
        let yaml: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(repo_path(file)).unwrap()).unwrap();
        assert_eq!(yaml["apiVersion"], 1, "{file}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_alert_returns_series_from_a_real_prometheus() {
    let mut explicit = TestActivity::open("2002", 3);
    explicit.per_user_limit = 1;
    let (_redis, _upstream, mut config) = backends(vec![
        TestActivity::open("1001", 5),
        explicit,
        TestActivity {
            queue: Some(Queue::admit(2)),
            ..TestActivity::open("3003", 5)
        },
    ]);
    config = config.max_inflight(4).max_queue_wait_ms(500);
    let gw = GatewayProc::start(config);
    let prometheus = Prometheus::start(gw.admin);

    // Load: winners, sold out, limits, rate limits, unknown activities, pass-through routes.
    let load = async {
        for _ in 0..3 {
            let requests = (0..40)
                .map(|i| {
                    let user = format!("u{}", i % 12);
                    let activity = ["1001", "2002", "9999", "3003"][i % 4];
                    raw_request(
                        "POST",
                        &format!("/api/seckill/{activity}/buy"),
                        &[("X-User-Id", &user)],
                    )
                })
                .chain((0..5).map(|_| raw_request("GET", "/catalog", &[])))
                .collect();
            burst(gw.addr, requests).await;
            // Each round in a scrape of its own (counters that move from scrape to scrape):
            // the next round once Prometheus scraped this one.
            prometheus
                .wait_scraped_after(std::time::SystemTime::now())
                .await;
        }
    };
    load.await;

    // Enough scrapes for rate() over every window the queries use.
    wait_for_async("three scrapes", Duration::from_secs(30), || async {
        let r = prometheus
            .query("count_over_time(flashgate_config_generation[1m])")
            .await
            .ok()?;
        let n: f64 = r.first()?["value"][1].as_str()?.parse().ok()?;
        (n >= 3.0).then_some(())
    })
    .await;

    let mut empty = Vec::new();
    let panels = dashboard_queries();
    assert!(panels.len() >= 20);
    for (title, expr) in &panels {
        if prometheus
            .no_series(&format!("panel {title:?}"), expr)
            .await
        {
            empty.push(format!("panel {title:?}: {expr}"));
        }
    }
    let alerts = alert_expressions();
    assert!(alerts.len() >= 8);
    for (name, expr, signal) in &alerts {
        prometheus.no_series(&format!("alert {name}"), expr).await;
        if prometheus.no_series(&format!("alert {name}"), signal).await {
            empty.push(format!("alert {name}: {signal}"));
        }
    }
    assert!(
        empty.is_empty(),
        "queries without series:\n{}",
        empty.join("\n")
    );

    // Prometheus loaded the rules and evaluates them without errors.
    let rules = get(prometheus.addr, "/api/v1/rules", &[]).await.json();
    let loaded: Vec<&Value> = rules["data"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(loaded.len(), alerts.len());
    for rule in loaded {
        assert_ne!(rule["health"], "err", "{rule}");
    }
    // Healthy gateway: nothing that pages is firing.
    let firing = prometheus
        .query("ALERTS{alertstate=\"firing\"}")
        .await
        .unwrap();
    assert!(firing.is_empty(), "{firing:?}");
}

/// `flashgate report --prometheus`: refusals by code over the sale, as the gateway counted them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_counts_refusals_by_code_from_a_real_prometheus() {
    let mut sale = TestActivity::open("1001", 2);
    sale.per_user_limit = 1;
    let (_redis, _upstream, config) = backends(vec![sale, TestActivity::open("4004", 5)]);
    let gw = GatewayProc::start(config);
    let prometheus = Prometheus::start(gw.admin);
    prometheus
        .wait_scraped_after(std::time::SystemTime::now())
        .await;
    // Two win, eight are told sold out; another activity's refusals are not this one's.
    let requests = (0..10)
        .map(|i| {
            raw_request(
                "POST",
                "/api/seckill/1001/buy",
                &[("X-User-Id", &format!("u{i}"))],
            )
        })
        .chain((0..3).map(|_| raw_request("POST", "/api/seckill/4004/buy", &[])))
        .collect();
    burst(gw.addr, requests).await;
    prometheus
        .wait_scraped_after(std::time::SystemTime::now())
        .await;
    let metrics = gw.metrics().await;
    let mut counted = serde_json::Map::new();
    for line in metrics.lines() {
        let Some(rest) =
            line.strip_prefix(r#"flashgate_admission_decisions_total{activity="1001",decision=""#)
        else {
            continue;
        };
        let (code, value) = rest.split_once(r#""} "#).unwrap();
        let n: u64 = value.trim().parse().unwrap();
        if code != "admitted" && n > 0 {
            counted.insert(code.to_owned(), n.into());
        }
    }
    assert_eq!(counted.get("sold_out"), Some(&Value::from(8)), "{metrics}");
    let url = format!("http://{}", prometheus.addr);
    let config = gw.config_path();
    let (code, out, err) = run_cli(
        &[
            "report",
            "--config",
            config.to_str().unwrap(),
            "--activity",
            "1001",
            "--json",
            "--prometheus",
            &url,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["refusals"], Value::Object(counted), "{story}");
    assert_eq!(story["units"]["sold"], 2);
}

/// `(label value, value)` pairs as [`Prometheus::values_by`] gives them.
fn series<const N: usize>(pairs: [(&str, f64); N]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// A drop (issue 48): Prometheus scrapes one `flashgate_stock_remaining{activity, variant}`
/// series per size and none for the drop as a whole (a lone activity-wide series would read 0,
/// "sold out", on every dashboard); a purchase of one size lowers that size's series only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drops_stock_is_one_series_per_size_in_a_real_prometheus() {
    let (_redis, _upstream, config) = backends(vec![
        TestActivity::open("1001", 7),
        TestActivity::open("2001", 0),
    ]);
    let config = config
        .set("/activities/1/stock", Value::Null)
        .set(
            "/activities/1/variants",
            json!([{"id": "40", "stock": 5}, {"id": "40.5", "stock": 3}]),
        )
        .set("/sale_routes/0/variant_query", json!("size"));
    let gw = GatewayProc::start(config);
    let prometheus = Prometheus::start(gw.admin);

    // Each size its own series, at its stock (prewarmed at the start).
    let drop = r#"flashgate_stock_remaining{activity="2001"}"#;
    prometheus
        .wait_values(drop, "variant", &series([("40", 5.0), ("40.5", 3.0)]))
        .await;
    // An activity without variants keeps its one series, without a `variant` label...
    assert_eq!(
        prometheus
            .values_by(
                r#"flashgate_stock_remaining{activity="1001",variant=""}"#,
                "activity"
            )
            .await,
        series([("1001", 7.0)])
    );
    // ...and the drop never had one, in any scrape since Prometheus started.
    let whole = r#"count_over_time(flashgate_stock_remaining{activity="2001",variant=""}[10m])"#;
    assert!(
        prometheus.no_series("the drop as a whole", whole).await,
        "{:?}",
        prometheus.query(whole).await
    );

    // One pair of 40.5: that size's series goes down, the other size's stays.
    let bought = request(
        gw.addr,
        "POST",
        "/api/seckill/2001/buy?size=40.5",
        &[("X-User-Id", "alice")],
    )
    .await;
    assert_eq!(bought.status, 200, "{}", bought.text());
    prometheus
        .wait_values(drop, "variant", &series([("40", 5.0), ("40.5", 2.0)]))
        .await;
    assert!(prometheus.no_series("the drop as a whole", whole).await);
}

/// A reload that removes an activity (issue 48): the next scrape has none of its series, so
/// Prometheus marks them stale and an instant query after that scrape finds none (without the
/// stale marks they would be found for five minutes, the query's lookback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_activitys_series_leave_a_real_prometheus_at_the_next_scrape() {
    // Removed: a sale with a waiting room (its queue series) and a drop (its per-size stock).
    let (_redis, _upstream, config) = backends(vec![
        TestActivity::open("1001", 5),
        TestActivity::open("2002", 5).queue(Queue::admit(2)),
        TestActivity::open("3003", 0),
    ]);
    let config = config
        .set("/activities/2/stock", Value::Null)
        .set(
            "/activities/2/variants",
            json!([{"id": "40", "stock": 4}, {"id": "41", "stock": 4}]),
        )
        .set("/sale_routes/0/variant_query", json!("size"));
    let mut gw = GatewayProc::start(config.clone());
    let prometheus = Prometheus::start(gw.admin);
    // Traffic on each, so that their counters are not only the preset zeros.
    for (path, user) in [
        ("/api/seckill/1001/buy", "u1"),
        ("/api/seckill/2002/buy", "u2"),
        ("/api/seckill/3003/buy?size=41", "u3"),
    ] {
        let r = request(gw.addr, "POST", path, &[("X-User-Id", user)]).await;
        assert!(matches!(r.status, 200 | 202), "{path}: {}", r.text());
    }

    // Before: Prometheus holds each activity's series (the queue's and both sizes' among them).
    let of = |activity: &str| format!(r#"{{__name__=~"flashgate_.+",activity="{activity}"}}"#);
    let count = |activity: &str| format!("count({})", of(activity));
    for activity in ["1001", "2002", "3003"] {
        wait_for_async(
            "the activity's series in Prometheus",
            Duration::from_secs(30),
            || async {
                let n = prometheus.values_by(&count(activity), "").await;
                n.get("").is_some_and(|n| *n >= 5.0).then_some(())
            },
        )
        .await;
    }
    assert!(
        !prometheus
            .no_series("the queue's", r#"flashgate_queue_length{activity="2002"}"#)
            .await
    );
    prometheus
        .wait_values(
            r#"flashgate_stock_remaining{activity="3003"}"#,
            "variant",
            &series([("40", 4.0), ("41", 3.0)]),
        )
        .await;

    let mut kept = config.clone();
    kept.activities.retain(|a| a.id == "1001");
    kept.patches
        .retain(|(pointer, _)| !pointer.starts_with("/activities/"));
    gw.rewrite_config(kept);
    let reload = gw.admin_post("/v1/config/reload").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    let reloaded = std::time::SystemTime::now();

    // The first scrape begun after the reload answered: the gateway's new generation (2, or 3
    // if the file watch applied the file first), and nothing of the removed activities at the
    // query's time (just after that scrape).
    prometheus.wait_scraped_after(reloaded).await;
    let generation = prometheus
        .values_by("flashgate_config_generation", "")
        .await;
    assert!(
        generation.get("").is_some_and(|g| *g >= 2.0),
        "the scrape after the reload: {generation:?}"
    );
    for removed in ["2002", "3003"] {
        let left: Vec<String> = prometheus
            .query(&of(removed))
            .await
            .unwrap()
            .iter()
            .map(|s| s["metric"].to_string())
            .collect();
        assert!(
            left.is_empty(),
            "{removed}'s series after the reload ({}):\n{}",
            left.len(),
            left.join("\n")
        );
    }
    // The kept activity's series stay, and so does the target: its series went, not the scrape.
    assert_eq!(
        prometheus.values_by(r#"up{job="flashgate"}"#, "").await,
        series([("", 1.0)])
    );
    let n = prometheus.values_by(&count("1001"), "").await;
    assert!(n.get("").is_some_and(|n| *n >= 5.0), "{n:?}");
}
