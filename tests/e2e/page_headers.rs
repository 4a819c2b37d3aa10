//! The headers of the buyer's pages, over raw sockets: every page (a refusal, the waiting page)
//! carries a strict Content-Security-Policy whose hashes are exactly its inline scripts and
//! styles, `nosniff`, `Referrer-Policy: no-referrer`, and `frame-ancestors` as configured.

use crate::support::*;
use base64::Engine;
use serde_json::json;
use sha2::{Digest, Sha256};

/// `'sha256-…'` of every inline `<tag>` of `html`, in order.
fn inline_hashes(html: &str, tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in html.split(&format!("<{tag}")).skip(1) {
        let Some((_, body)) = part.split_once('>') else {
            continue;
        };
        let Some((inner, _)) = body.split_once(&format!("</{tag}>")) else {
            continue;
        };
        let digest = Sha256::digest(inner.as_bytes());
        let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
        out.push(format!("'sha256-{b64}'"));
    }
    out
}

fn assert_page_headers(resp: &HttpResponse, ancestors: &str) {
    let html = resp.text();
    assert!(html.contains("<html"), "a page: {html}");
    let csp = resp.header("content-security-policy").expect("a CSP");
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    for hash in inline_hashes(&html, "script") {
        assert!(csp.contains(&hash), "script {hash} allowed: {csp}");
    }
    for hash in inline_hashes(&html, "style") {
        assert!(csp.contains(&hash), "style {hash} allowed: {csp}");
    }
    assert!(
        csp.ends_with(&format!("frame-ancestors {ancestors}")),
        "{csp}"
    );
    assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(resp.header("referrer-policy"), Some("no-referrer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_buyer_page_sends_a_strict_policy() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let queued = TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("2002", 5)
    };
    let activities = vec![TestActivity::open("1001", 5).ended(), queued];
    let framed = TestConfig::new(&redis, &upstream, activities.clone()).set(
        "/pages",
        json!({ "frame_ancestors": ["https://shop.example"] }),
    );
    let html = [("Accept", "text/html"), ("X-User-Id", "alice")];
    for (config, ancestors) in [
        (TestConfig::new(&redis, &upstream, activities), "'none'"),
        (framed, "https://shop.example"),
    ] {
        let gw = GatewayProc::start(config);
        let refusal = request(gw.addr, "POST", "/api/seckill/1001/buy", &html).await;
        assert_eq!(refusal.status, 410);
        assert_page_headers(&refusal, ancestors);
        assert_eq!(
            gw.admin_post("/v1/activities/2002/queue/pause")
                .await
                .status,
            200
        );
        let waiting = request(gw.addr, "POST", "/api/seckill/2002/buy", &html).await;
        assert_eq!(waiting.status, 202, "{}", waiting.text());
        assert_page_headers(&waiting, ancestors);
        // A JSON client's answer is no page.
        let json = request(
            gw.addr,
            "POST",
            "/api/seckill/1001/buy",
            &[("X-User-Id", "a")],
        )
        .await;
        assert!(json.header("content-security-policy").is_none());
    }
}
