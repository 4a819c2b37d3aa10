//! The operator's console: `GET /ui` on the admin listener, one page for the drop (each
//! activity's state, stock per variant, the runbook's actions as buttons). The page itself holds
//! no data and needs no token: it asks for the admin token, keeps it in the tab's
//! `sessionStorage` only, and sends it as `Authorization: Bearer` on the admin API's own calls,
//! so the console can do nothing the API would refuse, and without the token shows nothing.
//!
//! Served with its script and style sheet from the same listener (`/ui/console.js`,
//! `/ui/console.css`: no external assets, the admin listener is often on a private network),
//! under a policy that allows only those (`script-src 'self'`, no inline script), no framing,
//! no referrer, and no caching. English or Chinese from `Accept-Language`.

use crate::catalogue::Lang;
use crate::pages::negotiate::Client;
use http::{HeaderMap, Method, Response, StatusCode};

const PAGE: &str = include_str!("console.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// The console's policy: its own script, style and API calls, nothing else.
const POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's answer for `segments` (the path after `/ui`), or None when it is not one of its
/// addresses.
pub fn serve(method: &Method, segments: &[&str], headers: &HeaderMap) -> Option<Response<Vec<u8>>> {
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    let (content_type, body) = match segments {
        ["ui"] => (
            "text/html; charset=utf-8",
            page(Client::of(headers).lang).into_bytes(),
        ),
        ["ui", "console.js"] => ("text/javascript; charset=utf-8", SCRIPT.as_bytes().to_vec()),
        ["ui", "console.css"] => ("text/css; charset=utf-8", STYLE.as_bytes().to_vec()),
        _ => return None,
    };
    Some(
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::CONTENT_LENGTH, body.len())
            .header("content-security-policy", POLICY)
            .header("x-content-type-options", "nosniff")
            .header("referrer-policy", "no-referrer")
            .header(http::header::CACHE_CONTROL, "no-store")
            .body(body)
            .expect("static response parts"),
    )
}

/// The page in `lang`: its `{{key}}` slots filled from [`words`].
fn page(lang: Lang) -> String {
    let mut out = PAGE.to_owned();
    for (key, en, zh) in WORDS {
        let word = match lang {
            Lang::En => en,
            Lang::Zh => zh,
        };
        out = out.replace(&format!("{{{{{key}}}}}"), word);
    }
    out
}

/// The page's own words (the script's are in `console.js`): key, English, Chinese.
const WORDS: &[(&str, &str, &str)] = &[
    ("lang", "en", "zh"),
    ("title", "flashgate console", "flashgate 控制台"),
    ("token", "Admin token", "管理令牌"),
    ("sign_in", "Sign in", "登录"),
    ("sign_out", "Sign out", "退出"),
    (
        "token_help",
        "The token of admin.token_env. It is kept in this tab only and sent only to this gateway's admin API.",
        "admin.token_env 中的令牌。它只保存在此标签页中，只发送给本网关的管理接口。",
    ),
    ("activities", "Activities", "活动"),
    ("operator", "Your name (optional)", "您的名字（可选）"),
    (
        "operator_help",
        "Written beside each action in the gateway's log, to tell operators apart.",
        "会与每个操作一起写入网关日志，用于区分不同的操作员。",
    ),
    ("retry", "Try again (the same call)", "重试（同一请求）"),
    ("halt_all", "Halt every activity", "停售全部活动"),
    ("confirm", "Confirm", "确认"),
    ("cancel", "Cancel", "取消"),
    ("none_yet", "Sign in to see the drop.", "登录后查看活动。"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_filled_in_both_languages() {
        for lang in [Lang::En, Lang::Zh] {
            let html = page(lang);
            assert!(!html.contains("{{"), "{lang:?}: {html}");
        }
        assert!(page(Lang::Zh).contains("管理令牌"));
        assert!(page(Lang::En).contains("<html lang=\"en\">"));
    }

    #[test]
    fn no_inline_script_or_style_and_nothing_from_elsewhere() {
        let html = page(Lang::En);
        assert!(!html.contains("<script>") && !html.contains("<style"));
        assert!(!html.contains("http://") && !html.contains("https://"));
        let handler = html.split(" on").skip(1).any(|rest| {
            rest.split_once('=')
                .is_some_and(|(name, _)| name.bytes().all(|b| b.is_ascii_lowercase()))
        });
        assert!(!handler, "no event-handler attributes");
    }

    #[test]
    fn only_its_three_addresses_and_only_reads() {
        let h = HeaderMap::new();
        assert!(serve(&Method::GET, &["ui"], &h).is_some());
        assert!(serve(&Method::GET, &["ui", "console.js"], &h).is_some());
        assert!(serve(&Method::GET, &["ui", "x"], &h).is_none());
        assert!(serve(&Method::POST, &["ui"], &h).is_none());
    }
}
