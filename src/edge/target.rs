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
//! The edge fails closed: a target that cannot be read this way (its path does not decode to
//! UTF-8, holds a control character, or is deeper than [`MAX_SEGMENTS`]) is refused on every
//! route, and every other target that is not a sale route is forwarded in its normalised form
//! ([`Target::forwarded_path`]), so the backend never routes a spelling the gateway read
//! otherwise. Look-alikes of a sale route (see [`super::route::resembles`]) are refused too.

use http::Method;

/// Most segments considered, while resolving too (deeper targets are refused: this bounds the
/// work per request).
pub const MAX_SEGMENTS: usize = 32;

crate::label_enum! {
    /// Why a request target cannot be normalised (the `reason` label of
    /// `flashgate_edge_refusals_total`, with the look-alikes).
    pub enum Unreadable {
        /// The decoded path is not UTF-8.
        NotUtf8 => "not_utf8",
        /// The decoded path holds a control character (`%0a`, `%00`, a tab...).
        ControlCharacter => "control_character",
        /// More than [`MAX_SEGMENTS`] segments at some point while resolving `..`.
        TooDeep => "too_deep",
    }
}

/// A request target, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Upper-cased.
    pub method: Method,
    /// Decoded path segments, or why the path cannot be read (then it is refused).
    pub segments: Result<Vec<String>, Unreadable>,
    /// The path ended in `/` (kept when forwarded: many backends tell `/a/` from `/a`).
    pub trailing_slash: bool,
    /// The raw query string, if any (after `?`, before any `#`).
    pub query: Option<String>,
}

impl Target {
    pub fn of(method: &Method, raw: &[u8]) -> Target {
        let method = if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
            Method::from_bytes(method.as_str().to_ascii_uppercase().as_bytes())
                .unwrap_or_else(|_| method.clone())
        } else {
            method.clone()
        };
        let raw = raw.split(|&b| b == b'#').next().unwrap_or_default();
        let (path, query) = match raw.iter().position(|&b| b == b'?') {
            Some(i) => (&raw[..i], Some(&raw[i + 1..])),
            None => (raw, None),
        };
        let path = strip_origin(path);
        Target {
            method,
            segments: segments(path),
            trailing_slash: path.len() > 1 && matches!(path.last(), Some(b'/' | b'\\')),
            query: query.map(|q| String::from_utf8_lossy(q).into_owned()),
        }
    }

    /// The target as a backend behind one more decoding proxy reads it: its path (as read here)
    /// percent-decoded once more and normalised again; `None` when there is nothing left to
    /// decode (or it cannot be read).
    pub fn decoded_again(&self) -> Option<Target> {
        let segments = self.segments.as_ref().ok()?;
        if !segments.iter().any(|s| s.contains('%')) {
            return None;
        }
        let path = format!("/{}", segments.join("/"));
        let again = Target::of(&self.method, path.as_bytes());
        again.segments.is_ok().then_some(again)
    }

    /// The target as a proxy that decodes its path and then parses it reads it: the decoded
    /// path, Unicode NFKC-normalised (fullwidth `／ ？ ＃ ％` as `/ ? # %`), read again as a
    /// request target (a `?` or `#` in it ends the path). `None` when that changes nothing or
    /// cannot be read.
    pub fn read_as_structure(&self) -> Option<Target> {
        use unicode_normalization::UnicodeNormalization;
        let segments = self.segments.as_ref().ok()?;
        let path = format!("/{}", segments.join("/"));
        // IIS-style `%uXXXX` escapes read as the character they name.
        let normal: String = percent_u_decode(&path).nfkc().collect();
        if normal == path && !path.contains(['?', '#']) {
            return None;
        }
        let again = Target::of(&self.method, normal.as_bytes());
        (again.segments.is_ok() && again.segments != self.segments).then_some(again)
    }

    /// The paths a front controller routes by instead of this one, read from the query:
    /// all of it when it starts with `/` (CodeIgniter's `index.php?/a/b`), and the values of
    /// the parameters routers read a path from (`_url` Phalcon, `q` Drupal, `rest_route`
    /// WordPress, `r` Yii, `route` OpenCart), each read as a request target with this method.
    ///
    /// Approximation: other parameters holding a path (`next=`, `redirect=`: a login's way back
    /// to the purchase page) are not read as routes: they are links, not routing.
    pub fn routed_by_query(&self) -> Vec<Target> {
        const ROUTER_PARAMS: [&str; 5] = ["_url", "q", "rest_route", "r", "route"];
        let Some(query) = self.query.as_deref() else {
            return Vec::new();
        };
        let decode = |v: &str| {
            String::from_utf8_lossy(&percent_decode(v.replace('+', " ").as_bytes())).into_owned()
        };
        let mut paths = Vec::new();
        let whole = decode(query);
        if whole.starts_with('/') {
            paths.push(whole.split('&').next().unwrap_or_default().to_owned());
        }
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if ROUTER_PARAMS.contains(&lenient_name(name).as_str()) {
                let value = decode(value);
                if value.contains('/') {
                    paths.push(format!("/{}", value.trim_start_matches('/')));
                }
            }
        }
        paths
            .iter()
            .take(4)
            .map(|p| Target::of(&self.method, p.as_bytes()))
            .filter(|t| t.segments.is_ok())
            .collect()
    }

    /// The path a target that is no sale route is forwarded with: its segments, each
    /// percent-encoded again where a router could read a byte otherwise (`/`, `%`, `?`, `#`,
    /// `;`, `\`, spaces, non-ASCII...), joined by `/`, the trailing slash kept. `None` when
    /// the target could not be read (it is refused).
    ///
    /// Approximation: `;params` (matrix parameters, servlet `;jsessionid`) are not forwarded:
    /// they were cut before routing, and a backend reading them could route otherwise.
    pub fn forwarded_path(&self) -> Option<String> {
        use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
        /// Everything but RFC 3986's unreserved characters and a few sub-delimiters that no
        /// router reads as structure inside a segment.
        const SEGMENT: &AsciiSet = &CONTROLS
            .add(b' ')
            .add(b'"')
            .add(b'#')
            .add(b'%')
            .add(b'/')
            .add(b';')
            .add(b'<')
            .add(b'>')
            .add(b'?')
            .add(b'[')
            .add(b'\\')
            .add(b']')
            .add(b'^')
            .add(b'`')
            .add(b'{')
            .add(b'|')
            .add(b'}');
        let segments = self.segments.as_ref().ok()?;
        let mut path = String::with_capacity(64);
        for s in segments {
            path.push('/');
            path.extend(utf8_percent_encode(s, SEGMENT));
        }
        if path.is_empty() || self.trailing_slash {
            path.push('/');
        }
        Some(path)
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

fn segments(path: &[u8]) -> Result<Vec<String>, Unreadable> {
    let decoded = percent_decode(path);
    let decoded = String::from_utf8(decoded).map_err(|_| Unreadable::NotUtf8)?;
    if decoded.chars().any(char::is_control) {
        return Err(Unreadable::ControlCharacter);
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
                    return Err(Unreadable::TooDeep);
                }
                out.push(p.to_owned());
            }
        }
    }
    Ok(out)
}

/// Every `%uXXXX` (IIS's non-standard escape) replaced by the character it names; the rest
/// unchanged.
fn percent_u_decode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find("%u").or_else(|| rest.find("%U")) {
        out.push_str(&rest[..at]);
        let hex = rest.get(at + 2..at + 6);
        match hex
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| char::from_u32(u32::from_str_radix(h, 16).ok()?))
        {
            Some(c) => {
                out.push(c);
                rest = &rest[at + 6..];
            }
            None => {
                out.push_str(&rest[at..at + 2]);
                rest = &rest[at + 2..];
            }
        }
    }
    out.push_str(rest);
    out
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

/// How a parameter's name reads to a lenient backend: decoded (`+` as a space), cut at the first
/// NUL or control character (C-string parsers), trimmed, lower-case, without bracketed or
/// indexed suffixes (`qty[]`, `qty[0]`, `qty[a][b]`: PHP-, Rack- and qs-style arrays and maps).
pub fn lenient_name(raw: &str) -> String {
    let decoded = String::from_utf8_lossy(&percent_decode(raw.replace('+', " ").as_bytes()))
        .to_ascii_lowercase();
    let cut = decoded
        .split(|c: char| c.is_control())
        .next()
        .unwrap_or_default();
    let name = cut.split('[').next().unwrap_or_default();
    name.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(method: &str, raw: &str) -> (String, Result<Vec<String>, Unreadable>) {
        let t = Target::of(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            raw.as_bytes(),
        );
        (t.method.to_string(), t.segments)
    }

    fn segs(s: &[&str]) -> Result<Vec<String>, Unreadable> {
        Ok(s.iter().map(|s| s.to_string()).collect())
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
        assert_eq!(path("POST", "/a/%ff").1, Err(Unreadable::NotUtf8));
        assert_eq!(path("POST", "/a/%00").1, Err(Unreadable::ControlCharacter));
        assert_eq!(
            path("POST", "/x%0a/../api").1,
            Err(Unreadable::ControlCharacter)
        );
        assert_eq!(path("POST", "/%zz").1, segs(&["%zz"]), "malformed stays");
        assert_eq!(path("POST", "/../../a").1, segs(&["a"]));
        let long = "/a".repeat(40);
        assert_eq!(path("POST", &long).1, Err(Unreadable::TooDeep));
        let climbing = format!("{}{}/api", "/a".repeat(33), "/..".repeat(33));
        assert_eq!(path("POST", &climbing).1, Err(Unreadable::TooDeep));
        let t = Target::of(&Method::POST, b"/a?qty=2#x");
        assert_eq!(t.query.as_deref(), Some("qty=2"));
    }

    #[test]
    fn a_target_is_forwarded_in_its_normalised_form() {
        let fwd = |raw: &str| Target::of(&Method::GET, raw.as_bytes()).forwarded_path();
        assert_eq!(fwd("/static/a.png").as_deref(), Some("/static/a.png"));
        assert_eq!(fwd("/x/../static//a.png").as_deref(), Some("/static/a.png"));
        assert_eq!(
            fwd("/admin/").as_deref(),
            Some("/admin/"),
            "trailing slash kept"
        );
        assert_eq!(fwd("").as_deref(), Some("/"));
        assert_eq!(fwd("/").as_deref(), Some("/"));
        assert_eq!(fwd("/a%20b/%C3%BC").as_deref(), Some("/a%20b/%C3%BC"));
        assert_eq!(fwd("/a%2Fb").as_deref(), Some("/a/b"), "as routers read it");
        assert_eq!(
            fwd("/a%252F").as_deref(),
            Some("/a%252F"),
            "decoded once, encoded again"
        );
        assert_eq!(fwd("/a;jsessionid=1/b").as_deref(), Some("/a/b"));
        assert_eq!(fwd("/a%3F/b").as_deref(), Some("/a%3F/b"));
        assert_eq!(fwd("/a/%ff"), None);
        // Forwarding a forwarded path changes nothing (a fixed point).
        for raw in ["/a%20b/c/", "/%25/x", "/a%5C/b", "/ü/%7Bx%7D"] {
            let once = fwd(raw).unwrap();
            assert_eq!(fwd(&once).unwrap(), once, "{raw}");
        }
    }

    #[test]
    fn parameter_names_read_leniently() {
        for raw in [
            "qty",
            "QTY",
            "%71ty",
            "Qty[]",
            "%51TY%5B%5D",
            "qty[0]",
            "qty%5B0%5D",
            "qty%00",
            "qty%00x",
            "qty[a][b]",
            "+qty",
            "qty%20",
        ] {
            assert_eq!(lenient_name(raw), "qty", "{raw}");
        }
        assert_eq!(lenient_name("qtyx"), "qtyx");
    }
}
