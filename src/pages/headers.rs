//! The headers every buyer page is sent with (refusal, waiting, challenge, bought): a strict
//! `Content-Security-Policy` whose only scripts and styles are the page's own inline ones, each
//! allowed by its SHA-256 (computed from the page as rendered, so a `pages.dir` template is
//! covered too), `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` (a page's
//! address may hold a ticket), and `frame-ancestors 'none'` unless `pages.frame_ancestors`
//! names the shop's origins.
//!
//! Approximation: only inline `<script>` and `<style>` elements are hashed; a template that
//! loads a script or a style sheet (or an image) from elsewhere than the gateway's own origin
//! is blocked by the browser: templates are self-contained, or serve their assets through the
//! gateway (`'self'`). Event-handler attributes (`onclick=`) are never allowed.

use base64::Engine;
use sha2::{Digest, Sha256};

/// The policy's `frame-ancestors` source list for `origins` (`'none'` when empty).
pub fn frame_ancestors(origins: &[String]) -> String {
    match origins.is_empty() {
        true => "'none'".to_owned(),
        false => origins.join(" "),
    }
}

/// The headers of one rendered page (`frame_ancestors` from [`frame_ancestors`]).
pub fn for_page(html: &str, frame_ancestors: &str) -> [(&'static str, String); 3] {
    let scripts = hashes(html, "script");
    let styles = hashes(html, "style");
    let policy = format!(
        "default-src 'none'; script-src 'self'{scripts}; style-src 'self'{styles}; \
         img-src 'self' data:; connect-src 'self'; worker-src blob:; base-uri 'none'; \
         frame-ancestors {frame_ancestors}"
    );
    [
        ("content-security-policy", policy),
        ("x-content-type-options", "nosniff".to_owned()),
        ("referrer-policy", "no-referrer".to_owned()),
    ]
}

/// `' sha256-…'` for the content of every inline `<tag>` element of `html`.
fn hashes(html: &str, tag: &str) -> String {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut out = String::new();
    let mut rest = html;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at + open.len()..];
        // `<scripts>` or `<style-x>` is another element.
        if !after.starts_with(['>', ' ', '\t', '\n', '\r']) {
            rest = after;
            continue;
        }
        let Some(head_end) = after.find('>') else {
            break;
        };
        let body = &after[head_end + 1..];
        let Some(end) = body.find(&close) else {
            break;
        };
        let digest = Sha256::digest(&body.as_bytes()[..end]);
        let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
        out.push_str(&format!(" 'sha256-{b64}'"));
        rest = &body[end + close.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_inline_script_and_style_is_hashed_and_nothing_else_runs() {
        let html = "<html><style>p{color:red}</style><script type=\"application/json\">{}</script>\
                    <script>alert(1)</script><scripts>x</scripts></html>";
        let [(_, csp), (_, nosniff), (_, referrer)] = for_page(html, &frame_ancestors(&[]));
        let sha = |s: &str| {
            let d = Sha256::digest(s.as_bytes());
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(d)
            )
        };
        assert!(
            csp.contains(&format!(
                "script-src 'self' {} {};",
                sha("{}"),
                sha("alert(1)")
            )),
            "{csp}"
        );
        assert!(
            csp.contains(&format!("style-src 'self' {};", sha("p{color:red}"))),
            "{csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert!(csp.starts_with("default-src 'none';"), "{csp}");
        assert!(csp.ends_with("frame-ancestors 'none'"), "{csp}");
        assert_eq!(
            (nosniff.as_str(), referrer.as_str()),
            ("nosniff", "no-referrer")
        );
        let shop = frame_ancestors(&[
            "https://shop.example".into(),
            "https://m.shop.example".into(),
        ]);
        let [(_, csp), ..] = for_page("", &shop);
        assert!(csp.ends_with("frame-ancestors https://shop.example https://m.shop.example"));
    }
}
