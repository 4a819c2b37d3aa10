//! The report as one HTML page: the figures, then the charts ([`super::charts`]) inline as
//! SVG. One self-contained file: no script, no stylesheet, font or image to fetch, so it opens
//! offline and can be mailed; laid out for a phone's width as for a desk's. In English or
//! Chinese (`--lang`), with the shop's name (`pages.shop_name`).

use super::charts::{self, Labels, Series, MAX_STEPS};
use super::timeline::Count;
use super::Report;
use chrono::{DateTime, SecondsFormat};
use minijinja::{context, Environment};
use plotters::style::RGBColor;
use std::collections::BTreeMap;

/// The page's language.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    #[default]
    En,
    Zh,
}

impl Lang {
    fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }
}

/// Every text of the page, by key, in `lang`.
fn texts(lang: Lang) -> BTreeMap<&'static str, &'static str> {
    const EN_ZH: &[(&str, &str, &str)] = &[
        ("title", "Drop report", "抢购报告"),
        ("as_of", "as of", "截至"),
        ("summary", "Summary", "概要"),
        ("opened", "opened", "开售"),
        ("first_sale", "first sale", "首单"),
        ("sold_out", "sold out", "售罄"),
        ("sold", "units sold", "已售件数"),
        ("released", "units released", "释放件数"),
        ("pending", "units pending", "待确认件数"),
        ("restocked", "units restocked", "补货件数"),
        ("queued", "buyers queued", "排队人数"),
        ("admitted", "buyers admitted", "放行人数"),
        ("bought", "buyers who bought", "购买人数"),
        ("no_shows", "admitted, never bought", "放行未购买"),
        ("waits", "wait p50 / p95 / max", "等待 p50 / p95 / 最长"),
        ("challenges", "challenges solved", "已解挑战"),
        ("draw", "the draw", "抽签"),
        ("draw_match", "verified", "已验证"),
        ("draw_differs", "DIFFERS", "不一致"),
        ("draw_none", "no draw", "无抽签"),
        ("per_second", "Per second", "每秒"),
        (
            "events_title",
            "What happened each second",
            "每秒发生了什么",
        ),
        ("arrivals", "arrivals", "到达"),
        ("admissions", "admissions", "放行"),
        ("reservations", "reservations", "预留"),
        ("confirmations", "confirmations", "确认"),
        ("releases", "releases", "释放"),
        ("time", "time (UTC)", "时间 (UTC)"),
        ("per_step", "per step", "每步"),
        ("stock", "Stock remaining", "剩余库存"),
        ("units", "units", "件"),
        (
            "wait_distribution",
            "Waits from ticket to turn",
            "从取号到轮到的等待",
        ),
        ("wait", "wait", "等待"),
        ("tickets", "tickets", "号"),
        ("variants", "Variants", "款式"),
        ("variant", "variant", "款式"),
        ("refusals", "Refusals by code", "按代码统计的拒绝"),
        ("code", "code", "代码"),
        ("requests", "requests", "请求"),
    ];
    EN_ZH
        .iter()
        .map(|(k, en, zh)| (*k, if lang == Lang::Zh { *zh } else { *en }))
        .collect()
}

/// The three charts of `report` (events per second, stock, waits), labelled from `t`.
fn charts_of(
    report: &Report,
    t: &BTreeMap<&'static str, &'static str>,
) -> (String, String, String) {
    let now_s = (report.now_ms / 1000) as i64;
    let (from, to) = report
        .timeline
        .span()
        .map_or((now_s, now_s), |(a, b)| (a, b.max(a)));
    let from = report
        .opened_ms
        .map_or(from, |o| from.min((o / 1000) as i64));
    let (step, steps) = report.timeline.steps(from, to, MAX_STEPS);
    let per = if step > 1 {
        format!("{} ({step} s)", t["per_step"])
    } else {
        t["per_second"].to_owned()
    };
    let series = [
        (Count::Arrivals, "arrivals", RGBColor(120, 120, 120)),
        (Count::Admissions, "admissions", RGBColor(230, 140, 20)),
        (Count::Reservations, "reservations", RGBColor(40, 100, 220)),
        (Count::Confirmations, "confirmations", RGBColor(30, 160, 80)),
        (Count::Releases, "releases", RGBColor(210, 50, 50)),
    ]
    .map(|(count, key, color)| Series {
        count,
        label: t[key],
        color,
    });
    let events = charts::events(
        &steps,
        step,
        &series,
        &Labels {
            title: t["events_title"],
            x: t["time"],
            y: &per,
        },
    );
    let stock = charts::stock(
        &steps,
        step,
        report.remaining,
        &Labels {
            title: t["stock"],
            x: t["time"],
            y: t["units"],
        },
    );
    let waits = charts::waits(
        &report.waits,
        &Labels {
            title: t["wait_distribution"],
            x: t["wait"],
            y: t["tickets"],
        },
    );
    (events, stock, waits)
}

/// The page of `report`, in `lang`, naming `shop` (empty: none).
pub fn page(report: &Report, lang: Lang, shop: &str) -> String {
    let t = texts(lang);
    let (events, stock, waits) = charts_of(report, &t);
    let mut env = Environment::new();
    env.add_template("report.html", include_str!("report.html"))
        .expect("the built-in template parses");
    // A time on a card: the clock's time to the ms, then its date (UTC), so that it fits.
    env.add_filter("clock", |v: Option<String>| match v {
        Some(t) => match t.split_once('T') {
            Some((date, time)) => format!("{} {date}", time.trim_end_matches('Z')),
            None => t,
        },
        None => "–".to_owned(),
    });
    env.add_function("ms", |v: Option<u64>| {
        v.map_or("–".to_owned(), |v| {
            if v < 10_000 {
                format!("{v} ms")
            } else {
                format!("{:.1} s", v as f64 / 1000.0)
            }
        })
    });
    let now = DateTime::from_timestamp_millis(report.now_ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true);
    env.get_template("report.html")
        .and_then(|tpl| {
            tpl.render(context! {
                lang => lang.code(),
                t => t,
                shop => shop,
                now => now,
                story => minijinja::value::Serde(&report.story),
                charts => context! { events => events, stock => stock, waits => waits },
            })
        })
        .expect("the built-in template renders")
}
