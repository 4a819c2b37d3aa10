//! The buyer's pages: every answer the gateway makes on a sale route, written as HTML for a
//! client that prefers it ([`negotiate`]), from minijinja templates — the built-in
//! `waiting.html` and `refusal.html`, or the ones `pages.dir` holds — in the client's language
//! (`crate::catalogue`). Rendering only: what to say is decided elsewhere.
//!
//! Every page's `<html>` carries `lang` and `data-flashgate-code`; the variables each template
//! is given are listed in docs/buyers-and-frontends.md ("Buyers in a browser").

pub mod headers;
pub mod negotiate;

use crate::catalogue::{Label, Lang};
use crate::config::{ActivityPage, PagesSettings};
use crate::decision::Reply as DecisionReply;
use crate::waiting::page::{self as queue_page, Landing, POLL_PREFIX, VARIANT_SLOT};
use crate::waiting::view::Status;
use crate::waiting::Answer;
use minijinja::{context, Environment};
use std::sync::LazyLock;

pub use negotiate::Client;

/// The built-in templates, by name.
const BUILT_IN: [(&str, &str); 3] = [
    ("waiting.html", include_str!("waiting.html")),
    ("refusal.html", include_str!("refusal.html")),
    // The second-chance line's page (not replaceable by `pages.dir` yet).
    ("line.html", include_str!("line.html")),
];

/// The built-in templates alone: what a replacement that fails to render falls back to.
static BUILT_IN_ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    environment(&PagesSettings::default()).expect("the built-in templates parse (unit-tested)")
});

/// The templates of one configuration, and what every page shows.
pub struct Pages {
    env: Environment<'static>,
    shop_name: String,
    shop_url: String,
    /// The `frame-ancestors` source list (see [`headers::frame_ancestors`]).
    frame_ancestors: String,
}

/// The templates: `pages.dir`'s where given, else the built-in ones. HTML-escaped output.
fn environment(settings: &PagesSettings) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    for (name, built_in) in BUILT_IN {
        let source = settings
            .templates
            .get(name)
            .cloned()
            .unwrap_or_else(|| built_in.to_owned());
        env.add_template_owned(name, source)?;
    }
    Ok(env)
}

/// A buyer's place in a second-chance line, as its page shows it.
pub struct LinePage<'a> {
    pub sale: Option<Sale<'a>>,
    pub message: &'a str,
    pub place: u64,
    pub waiting: u64,
    /// What is left of the unit held for the buyer, while one is.
    pub hold_left_ms: Option<u64>,
    /// Where to buy it.
    pub buy: Option<&'a str>,
}

/// A sale of the page: its id and its page keys (`title`, `success_url`).
#[derive(Debug, Clone, Copy)]
pub struct Sale<'a> {
    pub id: &'a str,
    pub page: &'a ActivityPage,
}

/// A purchase as asked, to send again: its method and target; for a size sold out under the
/// buyer's click, that size's title and the other sizes to buy instead.
#[derive(Debug, Clone, Copy)]
pub struct Again<'a> {
    pub method: &'a str,
    pub target: &'a str,
    /// The size that sold out, by its title (its id without one).
    pub sold_out: Option<&'a str>,
    /// The drop's other sizes, each to buy with the same ticket.
    pub choices: &'a [Choice],
}

/// One size a page offers to buy: its title, the purchase's target for it, and whether this
/// gateway knows it sold out.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Choice {
    pub title: String,
    pub action: String,
    pub available: bool,
}

/// A waiting page to write: where the buyer stands and where their turn takes them.
pub struct Waiting<'a> {
    pub answer: &'a Answer,
    pub sale: Sale<'a>,
    pub landing: &'a Landing,
    /// The reservation a won purchase holds (the "bought" page).
    pub reservation: Option<&'a str>,
}

impl Pages {
    /// The pages of a configuration. The templates parsed when it was validated; should one
    /// fail here anyway, the built-in ones are used (and it is logged).
    pub fn new(settings: &PagesSettings) -> Pages {
        let env = environment(settings).unwrap_or_else(|e| {
            tracing::error!(error = %e, "pages.dir templates refused; using the built-in ones");
            BUILT_IN_ENV.clone()
        });
        Pages {
            env,
            shop_name: settings.shop_name.clone(),
            shop_url: settings.shop_url.clone(),
            frame_ancestors: headers::frame_ancestors(&settings.frame_ancestors),
        }
    }

    /// The security headers a rendered page is sent with (see [`headers`]).
    pub fn headers_for(&self, html: &str) -> [(&'static str, String); 3] {
        headers::for_page(html, &self.frame_ancestors)
    }

    /// The page for a refusal (any decision the gateway answers itself). `again`: the purchase
    /// as asked (its method and target), which a page before the opening sends again at the
    /// opening by itself.
    pub fn refusal(
        &self,
        lang: Lang,
        reply: &DecisionReply,
        sale: Option<Sale<'_>>,
        again: Option<Again<'_>>,
        line: Option<&str>,
    ) -> String {
        let heading = match reply.code {
            "sold_out" => Label::TitleSoldOut,
            "ticket_expired" => Label::TitleExpired,
            "not_started" => Label::TitleNotOpen,
            "not_eligible" => Label::TitleNotYourPhase,
            _ => Label::TitleRefused,
        };
        let retry = reply
            .retry_after_secs
            .map(|n| Label::RetryAfter.text(lang).replace("{n}", &n.to_string()));
        let message = match again.and_then(|a| a.sold_out) {
            Some(size) if reply.code == "sold_out" => {
                crate::catalogue::variant_sold_out(lang, size).into()
            }
            _ => reply.message.text(lang),
        };
        let ctx = context! {
            lang => lang.as_str(),
            code => reply.code,
            status => reply.status.as_u16(),
            message => message,
            choices => minijinja::value::Serde(again.map_or(&[][..], |a| a.choices)),
            heading => heading.text(lang),
            retry_after_secs => reply.retry_after_secs,
            retry_text => retry,
            activity => sale.map(|s| s.id),
            title => sale.and_then(|s| s.page.title.as_deref()),
            shop_name => &self.shop_name,
            shop_url => &self.shop_url,
            text => Label::all(lang),
            opens_at => reply.opens_at_rfc3339(),
            again_method => again.map(|a| a.method),
            line => line.filter(|_| reply.code == "sold_out"),
            again_target => again.map(|a| a.target),
            opening => reply.opens_at_rfc3339().map(|at| script_json(&serde_json::json!({
                "opens_at": at,
                "lang": lang.as_str(),
                "opens_in": Label::OpensIn.text(lang),
                "again": again.is_some(),
            }))),
        };
        self.render("refusal.html", ctx)
    }

    /// The waiting page (also the "bought" page).
    pub fn waiting(&self, lang: Lang, page: &Waiting<'_>) -> String {
        let json = queue_page::json(page.answer, lang);
        let status = &page.answer.status;
        let paused = matches!(status, Status::Waiting { paused: true, .. });
        let poll = format!("{POLL_PREFIX}{}", page.sale.id);
        let (purchase, landing_url, landing) = match page.landing {
            Landing::Url(url) => (None, Some(url), serde_json::json!({ "url": url })),
            Landing::Purchase { method, target } => {
                let form = if method == "GET" { "get" } else { "post" };
                (
                    Some(context! { method => form, action => target }),
                    None,
                    serde_json::json!({ "method": method, "target": target }),
                )
            }
        };
        let choices = choices(page.landing, &json);
        let eta_text = match *status {
            Status::Waiting { paused: true, .. } => Some(Label::Paused.text(lang).to_owned()),
            Status::Waiting {
                estimated_wait_ms, ..
            } => Some(format!(
                "{} {}",
                Label::EstimatedWait.text(lang),
                about(estimated_wait_ms, lang)
            )),
            _ => None,
        };
        let text = Label::all(lang);
        let script = serde_json::json!({
            "poll": poll,
            "answer": json,
            "landing": landing,
            "text": text,
            "shop_name": self.shop_name,
        });
        let refresh_secs = json["refresh_after_ms"]
            .as_u64()
            .map(|ms| ms.div_ceil(1000).max(1));
        let ctx = context! {
            lang => lang.as_str(),
            code => json["code"].as_str(),
            state => status.state(),
            paused => paused,
            is_final => status.is_final(),
            message => match (status, page.answer.turn_left_ms) {
                // Under the heading "It is your turn": the time left, not the heading again.
                (Status::YourTurn, Some(ms)) => Label::TurnLeft.text(lang).replace("{n}", &clock(ms)),
                // The place is shown above, and the estimate in the note below: said once.
                (Status::Waiting { likely_too_late: true, .. }, _) => String::new(),
                _ => json["message"].as_str().unwrap_or_default().to_owned(),
            },
            page_title => state_title(status).text(lang),
            eta_text => eta_text,
            answer => minijinja::value::Serde(&json),
            poll_url => poll,
            refresh_secs => refresh_secs,
            purchase => purchase,
            choices => minijinja::value::Serde(&choices),
            landing_url => landing_url,
            reservation => page.reservation,
            activity => page.sale.id,
            title => page.sale.page.title.as_deref(),
            shop_name => &self.shop_name,
            shop_url => &self.shop_url,
            text => text,
            config => script_json(&script),
        };
        self.render("waiting.html", ctx)
    }

    /// The second-chance line's page: the buyer's place (refreshing itself every few
    /// seconds), or, while a unit is held for them, what is left of it and the purchase.
    pub fn line(&self, lang: Lang, page: &LinePage<'_>) -> String {
        let turn = page.hold_left_ms.is_some();
        let heading = match turn {
            true => Label::TitleYourTurn,
            false => Label::TitleLine,
        };
        let turn_left = page
            .hold_left_ms
            .map(|ms| Label::TurnLeft.text(lang).replace("{n}", &clock(ms)));
        let ctx = context! {
            lang => lang.as_str(),
            code => if turn { "your_turn" } else { "queued" },
            heading => heading.text(lang),
            message => page.message,
            place => page.place,
            waiting => Label::Waiting.text(lang).replace("{n}", &page.waiting.to_string()),
            buy => page.buy.filter(|_| turn),
            turn_left => turn_left,
            refresh_secs => (!turn).then_some(3),
            title => page.sale.and_then(|s| s.page.title.as_deref()),
            shop_name => &self.shop_name,
            shop_url => &self.shop_url,
            text => Label::all(lang),
        };
        self.render("line.html", ctx)
    }

    /// Renders `name`; a replacement that fails at render time is logged and the built-in
    /// template answers instead (a buyer always gets a page).
    fn render(&self, name: &str, ctx: minijinja::Value) -> String {
        let rendered = self
            .env
            .get_template(name)
            .and_then(|t| t.render(ctx.clone()));
        rendered.unwrap_or_else(|e| {
            tracing::error!(template = name, error = %e, "a page template failed; the built-in one answered");
            BUILT_IN_ENV
                .get_template(name)
                .and_then(|t| t.render(ctx))
                .unwrap_or_else(|e| format!("<!doctype html><p>{}</p>", escape(&e.to_string())))
        })
    }
}

/// A time left as the page's countdown shows it: `m:ss` (the script counts it down).
fn clock(ms: u64) -> String {
    let secs = ms.div_ceil(1000);
    format!("{}:{:02}", secs / 60, secs % 60)
}

/// The heading and `<title>` of a waiting page in `status`.
fn state_title(status: &Status) -> Label {
    match status {
        Status::Waiting { paused: true, .. } => Label::TitlePaused,
        // A challenge's page is its own (`waiting::page::challenge_page`).
        Status::Waiting { .. } | Status::Challenge => Label::TitleWaiting,
        Status::YourTurn => Label::TitleYourTurn,
        Status::SoldOut => Label::TitleSoldOut,
        Status::Expired | Status::GivenAway => Label::TitleExpired,
        Status::Bought => Label::TitleBought,
    }
}

/// A wait in words: "about 12 s", "about 3 min" (as the page's script says it).
fn about(ms: u64, lang: Lang) -> String {
    let secs = ms.div_ceil(1000);
    let (label, n) = if secs < 90 {
        (Label::AboutSeconds, secs)
    } else {
        (Label::AboutMinutes, secs.div_ceil(60))
    };
    label.text(lang).replace("{n}", &n.to_string())
}

/// JSON safe inside a `<script>` element.
fn script_json(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A drop: one purchase form per variant, the buyer's choice at their turn (the landing's
/// target holds the variant's slot); none otherwise.
fn choices(landing: &Landing, json: &serde_json::Value) -> Vec<serde_json::Value> {
    let Landing::Purchase { target, .. } = landing else {
        return Vec::new();
    };
    if !target.contains(VARIANT_SLOT) {
        return Vec::new();
    }
    json["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let id = v["id"].as_str().unwrap_or_default();
            serde_json::json!({
                "id": id,
                "title": v["title"],
                "available": v["available"],
                "action": target.replace(VARIANT_SLOT, id),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
