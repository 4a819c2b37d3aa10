//! What a request's target means, read the way backends read it, once, before routing: the
//! method upper-cased (Werkzeug and others upper-case it), the path taken from the request-target
//! as it arrived (origin-form, absolute-form or a missing leading slash alike), every
//! percent-encoding decoded (`%2F` too: WSGI servers hand the decoded path to the router), `\`
//! read as `/` (as some servers do), `;params` cut from each segment (as servlet containers do),
//! empty and `.` segments dropped and `..` resolved. Sale routes are matched on that form, their
//! literal segments case-insensitively, so no spelling of a purchase reaches the backend without
//! admission; an admitted one is forwarded in its canonical form (the route's method, the route's
//! path with the activity id), so the backend sees exactly what was admitted.
//!
//! Approximation: a backend that reads paths some other way still (say, case-folding the
//! activity id) could route a variant flashgate passes through; the reservation header is then
//! absent, which such a backend must treat as "not a winner" (see SECURITY.md).

use http::Method;

/// Most segments considered (longer paths are no sale route; this bounds the work per request).
const MAX_SEGMENTS: usize = 32;

/// A request target, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Upper-cased.
    pub method: Method,
    /// Decoded path segments; `None` when the path does not decode to UTF-8, holds a control
    /// character, or has more than [`MAX_SEGMENTS`] segments (it can match no sale route).
    pub segments: Option<Vec<String>>,
    /// The raw query string, if any (after `?`, before any `#`).
    pub query: Option<String>,
}

impl Target {
    pub fn of(method: &Method, raw: &[u8]) -> Target {
        let method = Method::from_bytes(method.as_str().to_ascii_uppercase().as_bytes())
            .unwrap_or_else(|_| method.clone());
        let raw = raw.split(|&b| b == b'#').next().unwrap_or_default();
        let (path, query) = match raw.iter().position(|&b| b == b'?') {
            Some(i) => (&raw[..i], Some(&raw[i + 1..])),
            None => (raw, None),
        };
        Target {
            method,
            segments: segments(strip_origin(path)),
            query: query.map(|q| String::from_utf8_lossy(q).into_owned()),
        }
    }
}

/// The path of an absolute-form target (`http://host/path`); others unchanged.
fn strip_origin(path: &[u8]) -> &[u8] {
    for scheme in [&b"http://"[..], b"https://"] {
        if path.len() >= scheme.len() && path[..scheme.len()].eq_ignore_ascii_case(scheme) {
            let rest = &path[scheme.len()..];
            return match rest.iter().position(|&b| b == b'/') {
                Some(i) => &rest[i..],
                None => b"/",
            };
        }
    }
    path
}

fn segments(path: &[u8]) -> Option<Vec<String>> {
    let decoded = percent_decode(path);
    let decoded = String::from_utf8(decoded).ok()?;
    if decoded.chars().any(char::is_control) {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    for part in decoded.split(['/', '\\']) {
        let part = part.split(';').next().unwrap_or_default();
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => {
                if out.len() == MAX_SEGMENTS {
                    return None;
                }
                out.push(p.to_owned());
            }
        }
    }
    Some(out)
}

/// Every `%XX` decoded (a malformed one stays as it is, as lenient servers leave it).
pub fn percent_decode(input: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' && i + 2 < input.len() {
            if let (Some(h), Some(l)) = (hex(input[i + 1]), hex(input[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

/// How a query parameter's name reads to a lenient backend: decoded, lower-case, without a
/// trailing `[]` (PHP- and Rack-style arrays).
pub fn lenient_name(raw: &str) -> String {
    let decoded = String::from_utf8_lossy(&percent_decode(raw.replace('+', " ").as_bytes()))
        .to_ascii_lowercase();
    decoded
        .strip_suffix("[]")
        .map(str::to_owned)
        .unwrap_or(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(method: &str, raw: &str) -> (String, Option<Vec<String>>) {
        let t = Target::of(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            raw.as_bytes(),
        );
        (t.method.to_string(), t.segments)
    }

    fn segs(s: &[&str]) -> Option<Vec<String>> {
        Some(s.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn every_spelling_of_a_path_reads_the_same() {
        let want = segs(&["api", "seckill", "1001", "buy"]);
        for raw in [
            "/api/seckill/1001/buy",
            "//api//seckill/1001/buy/",
            "/api/seckill/10%301/buy",
            "/%61pi/seckill/1001/buy",
            "/api%2Fseckill%2f1001/buy",
            "http://shop.example/api/seckill/1001/buy",
            "HTTPS://shop.example/api/seckill/1001/buy?x=1",
            "api/seckill/1001/buy",
            "/api/seckill/./1001/buy",
            "/api/x/../seckill/1001/buy",
            "/api\\seckill\\1001\\buy",
            "/api/seckill/1001/buy;jsessionid=1",
            "/api/seckill/1001/buy#frag",
        ] {
            assert_eq!(path("POST", raw).1, want, "{raw}");
        }
        assert_eq!(path("post", "/a").0, "POST");
        assert_eq!(path("Post", "/a").0, "POST");
        assert_eq!(path("POST", "/a/%ff").1, None, "not UTF-8");
        assert_eq!(path("POST", "/a/%00").1, None, "a control character");
        assert_eq!(path("POST", "/%zz").1, segs(&["%zz"]), "malformed stays");
        assert_eq!(path("POST", "/../../a").1, segs(&["a"]));
        let long = "/a".repeat(40);
        assert_eq!(path("POST", &long).1, None);
        let t = Target::of(&Method::POST, b"/a?qty=2#x");
        assert_eq!(t.query.as_deref(), Some("qty=2"));
    }

    #[test]
    fn parameter_names_read_leniently() {
        for raw in ["qty", "QTY", "%71ty", "Qty[]", "%51TY%5B%5D"] {
            assert_eq!(lenient_name(raw), "qty", "{raw}");
        }
        assert_eq!(lenient_name("qtyx"), "qtyx");
    }
}
