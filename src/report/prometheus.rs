//! Refusals by code over a sale, from Prometheus: how much
//! `flashgate_admission_decisions_total{activity, decision}` (every decision but `admitted`)
//! grew over the sale, per gateway Prometheus scrapes, summed.
//!
//! Growth is the series' largest value in the window less its smallest (not `increase`, which
//! extrapolates to the window's edges and would count a short sale's 8 refusals as 9). The
//! window starts [`MARGIN_SECS`] before the sale (its first sample then predates the sale's
//! first refusal; the gateway creates every activity's series at zero when it starts).
//!
//! Approximations: refusals since Prometheus's last scrape are not counted yet; a gateway
//! restarted during the sale is undercounted (its counters begin again at zero: only the larger
//! of its counts before and after the restart is seen).

use std::collections::BTreeMap;
use std::time::Duration;

/// Seconds before the sale the window starts.
pub const MARGIN_SECS: u64 = 60;

/// How long Prometheus may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The PromQL asked: refusals of `activity` by code over the `secs` before the query's time.
pub fn query(activity: &str, secs: u64) -> String {
    let quoted = activity.replace('\\', "\\\\").replace('"', "\\\"");
    let series = format!(
        "flashgate_admission_decisions_total{{activity=\"{quoted}\",decision!=\"admitted\"}}[{secs}s]"
    );
    format!("sum by (decision) (max_over_time({series}) - min_over_time({series}))")
}

/// Refusals by code of `activity` from `since_ms` to `now_ms` (unix ms), from the Prometheus
/// at `url` (`http://host:port`).
pub fn refusals(
    url: &str,
    activity: &str,
    since_ms: u64,
    now_ms: u64,
) -> Result<BTreeMap<String, u64>, String> {
    let secs = now_ms.saturating_sub(since_ms).div_ceil(1000) + MARGIN_SECS;
    let endpoint = format!("{}/api/v1/query", url.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(&endpoint)
        .query("query", query(activity, secs))
        .query("time", format!("{:.3}", now_ms as f64 / 1000.0))
        .call()
        .map_err(|e| format!("{endpoint}: {e}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{endpoint}: {e}"))?;
    parse(&body).map_err(|e| format!("{endpoint} answered {status}: {e}"))
}

/// The codes and counts in a `/api/v1/query` answer (a vector of `{decision}` samples).
pub fn parse(body: &str) -> Result<BTreeMap<String, u64>, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|_| format!("not JSON: {:.200}", body))?;
    if v["status"] != "success" {
        return Err(format!("{:.300}", v.to_string()));
    }
    let mut out = BTreeMap::new();
    for sample in v["data"]["result"].as_array().into_iter().flatten() {
        let code = sample["metric"]["decision"].as_str().unwrap_or_default();
        let value = sample["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
        let n = value.round().max(0.0) as u64;
        if !code.is_empty() && n > 0 {
            out.insert(code.to_owned(), n);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_becomes_counts_by_code_rounded() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"decision":"sold_out"},"value":[1.0,"1203.9"]},
            {"metric":{"decision":"rate_limited"},"value":[1.0,"4.2"]},
            {"metric":{"decision":"not_started"},"value":[1.0,"0"]}]}}"#;
        let got = parse(body).unwrap();
        assert_eq!(got.get("sold_out"), Some(&1204));
        assert_eq!(got.get("rate_limited"), Some(&4));
        assert_eq!(got.get("not_started"), None);
        assert!(parse("<html>503</html>").unwrap_err().contains("not JSON"));
        assert!(parse(r#"{"status":"error","error":"bad"}"#).is_err());
    }

    #[test]
    fn the_query_quotes_the_activity() {
        let series =
            "flashgate_admission_decisions_total{activity=\"a\\\"b\",decision!=\"admitted\"}[60s]";
        assert_eq!(
            query("a\"b", 60),
            format!("sum by (decision) (max_over_time({series}) - min_over_time({series}))")
        );
    }
}
