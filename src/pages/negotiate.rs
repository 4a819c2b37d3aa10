//! What a client asked for, read once per request: a page or JSON (`Accept`), and the language
//! (`Accept-Language`). Both fail closed: a header that cannot be read gets what a client
//! without one gets (JSON, English).

use crate::catalogue::Lang;
use http::header::{ACCEPT, ACCEPT_LANGUAGE};
use http::HeaderMap;
use std::borrow::Cow;

/// How the gateway's own answers are written for this client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Client {
    /// `Accept` prefers `text/html` over `application/json`: an HTML page.
    pub html: bool,
    pub lang: Lang,
}

impl Client {
    /// Reads `Accept` and `Accept-Language` (every line of each, joined as one list).
    pub fn of(headers: &HeaderMap) -> Client {
        Client {
            html: joined(headers, ACCEPT).is_some_and(|a| prefers_html(&a)),
            lang: joined(headers, ACCEPT_LANGUAGE)
                .and_then(|l| language(&l))
                .unwrap_or_default(),
        }
    }
}

/// A header's lines as one comma-separated list (borrowed when there is one line, as there
/// nearly always is); `None` when absent or not visible ASCII.
fn joined(headers: &HeaderMap, name: http::header::HeaderName) -> Option<Cow<'_, str>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?.to_str().ok()?;
    let mut out = Cow::Borrowed(first);
    for value in values {
        let joined = out.to_mut();
        joined.push(',');
        joined.push_str(value.to_str().ok()?);
    }
    Some(out)
}

/// One element of a list: its value and its `q` (1 when not given); `None` when malformed.
fn element(raw: &str) -> Option<(&str, u16)> {
    let mut parts = raw.split(';').map(str::trim);
    let value = parts.next()?;
    let mut q = 1000;
    for param in parts {
        let (name, v) = param.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("q") {
            q = qvalue(v.trim())?;
        }
    }
    Some((value, q))
}

/// A `q` value (RFC 9110: `0`, `1`, up to three decimals) in thousandths.
fn qvalue(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u16 = format!("{frac:0<3}").parse().ok()?;
    match int {
        "0" => Some(frac),
        "1" if frac == 0 => Some(1000),
        _ => None,
    }
}

/// Whether `Accept` gives `text/html` a higher `q` than `application/json`, each taking the
/// `q` of the most specific range that matches it (`text/html`, `text/*`, `*/*`). `*/*` alone
/// ties them: JSON. A malformed list: JSON.
pub fn prefers_html(accept: &str) -> bool {
    let mut html = (0u8, 0u16);
    let mut json = (0u8, 0u16);
    for raw in accept.split(',').filter(|e| !e.trim().is_empty()) {
        let Some((range, q)) = element(raw) else {
            return false;
        };
        let Some((kind, sub)) = range.split_once('/') else {
            return false;
        };
        let (kind, sub) = (kind.to_ascii_lowercase(), sub.to_ascii_lowercase());
        let fit = |target: &mut (u8, u16), t: &str, s: &str| {
            let specificity = match (kind.as_str(), sub.as_str()) {
                (k, x) if k == t && x == s => 3,
                (k, "*") if k == t => 2,
                ("*", "*") => 1,
                _ => return,
            };
            if specificity > target.0 {
                *target = (specificity, q);
            }
        };
        fit(&mut html, "text", "html");
        fit(&mut json, "application", "json");
    }
    html.1 > json.1
}

/// The spoken language `Accept-Language` prefers most (the first listed among equals); `*`
/// gives the default. `None` when none is spoken here, or the list is malformed.
pub fn language(accept_language: &str) -> Option<Lang> {
    let mut best: Option<(u16, Lang)> = None;
    for raw in accept_language.split(',').filter(|e| !e.trim().is_empty()) {
        let (range, q) = element(raw)?;
        if q == 0 {
            continue;
        }
        let primary = range.split('-').next().unwrap_or("");
        let lang = if primary == "*" {
            Some(Lang::default())
        } else {
            Lang::from_subtag(primary)
        };
        if let Some(lang) = lang {
            if best.is_none_or(|(b, _)| q > b) {
                best = Some((q, lang));
            }
        }
    }
    best.map(|(_, l)| l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_only_when_it_outranks_json() {
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert!(prefers_html(browser));
        assert!(prefers_html("text/html"));
        assert!(prefers_html("text/*, application/json;q=0.5"));
        assert!(prefers_html("TEXT/HTML; charset=utf-8"));
        assert!(prefers_html("application/json;q=0.4, text/html;q=0.5"));
        // Ties and JSON first go to JSON.
        assert!(!prefers_html("*/*"));
        assert!(!prefers_html("text/html, application/json"));
        assert!(!prefers_html("application/json"));
        assert!(!prefers_html("text/html;q=0.5, application/json"));
        assert!(!prefers_html("text/html;q=0, */*"));
        assert!(!prefers_html("text/plain"));
        assert!(!prefers_html(""));
        // A specific range outranks a wider one, whatever the order.
        assert!(prefers_html("*/*;q=0.1, text/html"));
        assert!(!prefers_html(
            "text/html;q=0.2, */*;q=0.9, application/json"
        ));
    }

    #[test]
    fn a_malformed_accept_gets_json() {
        for garbage in [
            "text/html;q=2",
            "text/html;q=abc",
            "text/html;q=0.1234",
            "text/html;q",
            "html",
            "text/html;q=-1",
        ] {
            assert!(!prefers_html(garbage), "{garbage}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            http::HeaderValue::from_bytes(b"text/html\xff").unwrap(),
        );
        assert!(!Client::of(&headers).html, "not visible ASCII");
    }

    #[test]
    fn every_accept_line_counts() {
        let mut headers = HeaderMap::new();
        headers.append(ACCEPT, "application/json;q=0.5".parse().unwrap());
        headers.append(ACCEPT, "text/html".parse().unwrap());
        headers.append(ACCEPT_LANGUAGE, "fr".parse().unwrap());
        headers.append(ACCEPT_LANGUAGE, "zh-CN;q=0.8".parse().unwrap());
        let c = Client::of(&headers);
        assert!(c.html);
        assert_eq!(c.lang, Lang::Zh);
        assert_eq!(Client::of(&HeaderMap::new()), Client::default());
        assert!(!Client::default().html);
    }

    #[test]
    fn the_language_most_preferred_that_is_spoken() {
        assert_eq!(language("zh-CN,zh;q=0.9,en;q=0.8"), Some(Lang::Zh));
        assert_eq!(language("en-GB,en;q=0.9,zh;q=0.8"), Some(Lang::En));
        assert_eq!(language("fr, zh;q=0.5"), Some(Lang::Zh));
        assert_eq!(language("fr, de"), None);
        assert_eq!(language("en;q=0.5, zh-Hans-CN;q=0.6"), Some(Lang::Zh));
        assert_eq!(language("zh;q=0, en"), Some(Lang::En));
        assert_eq!(language("zh, en"), Some(Lang::Zh), "first among equals");
        assert_eq!(language("*"), Some(Lang::En));
        assert_eq!(language("zh;q=nope"), None, "malformed: the default");
    }
}
