//! The report as one HTML page: the figures, then the charts ([`super::charts`]) inline as
//! SVG. One self-contained file: no script, no stylesheet, font or image to fetch, so it opens
//! offline and can be mailed; laid out for a phone's width as for a desk's. In English or
//! Chinese (`--lang`), with the shop's name (`pages.shop_name`).
//!
//! The events and stock charts span the sale, from its start to its last recorded second;
//! what was recorded before the start (a pre-queue's tickets, maybe for many minutes) is drawn
//! apart, above them, so that a sale of seconds is not a sliver at the edge of its axis.

use super::charts::{self, Labels, Layout, Series, Span, MAX_STEPS};
use super::timeline::Count;
use super::Report;
use chrono::{DateTime, SecondsFormat};
use minijinja::{context, Environment};
use plotters::style::RGBColor;
use serde::Serialize;
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

/// Every text of the page: its key, in English, in Chinese.
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
    ("colon", ": ", "："),
    ("sec", "s", "秒"),
    ("min", "min", "分钟"),
    ("hour", "h", "小时"),
    (
        "sale_range",
        "From the start to the last event",
        "从开售到最后一个事件",
    ),
    (
        "span_range",
        "From the first to the last event",
        "从第一个到最后一个事件",
    ),
    (
        "earlier",
        "what came before the start: see “Before the start”",
        "开售前的情况见“开售前”",
    ),
    ("before", "Before the start", "开售前"),
    (
        "before_title",
        "What happened before the start",
        "开售前发生了什么",
    ),
    (
        "before_range",
        "Before the start (the pre-queue), not in the charts below",
        "开售前（预排队），不在下方图表中",
    ),
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
    ("per", "per", "每"),
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

/// Every text of the page, by key, in `lang`.
fn texts(lang: Lang) -> BTreeMap<&'static str, &'static str> {
    EN_ZH
        .iter()
        .map(|(k, en, zh)| (*k, if lang == Lang::Zh { *zh } else { *en }))
        .collect()
}

/// A chart drawn in both layouts: the page shows `wide` or `narrow` by its width.
#[derive(Debug, Serialize)]
struct Drawn {
    wide: String,
    narrow: String,
}

impl Drawn {
    fn of(draw: impl Fn(Layout) -> String) -> Drawn {
        Drawn {
            wide: draw(charts::WIDE),
            narrow: draw(charts::NARROW),
        }
    }
}

/// An entry of a chart's legend (drawn by the page, under the chart, where it wraps).
#[derive(Debug, Serialize)]
struct Key {
    label: &'static str,
    /// CSS colour (`#rrggbb`).
    color: String,
}

/// What happened before the sale's start, drawn apart so that it does not stretch the sale's
/// time axis.
#[derive(Debug, Serialize)]
struct Before {
    chart: Drawn,
    /// Its range and what it counted, in words.
    caption: String,
    legend: Vec<Key>,
}

/// The page's charts.
#[derive(Debug, Serialize)]
struct Charts {
    events: Drawn,
    stock: Drawn,
    waits: Drawn,
    /// The events and stock charts' range, in words.
    range: String,
    legend: Vec<Key>,
    before: Option<Before>,
}

/// The time ranges the charts show (unix seconds, both ends included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ranges {
    /// The sale's: from its start (its first recorded second when no start is known: before
    /// the start, or a store without one) to its last recorded second (the start's, when
    /// nothing was recorded since).
    sale: (i64, i64),
    /// The seconds before the start with anything recorded (a pre-queue's tickets, mostly),
    /// from the first to the start's previous second; `None` if none.
    before: Option<(i64, i64)>,
}

impl Ranges {
    fn of(report: &Report) -> Ranges {
        let now_s = (report.now_ms / 1000) as i64;
        let start = report.opened_ms.map(|o| (o / 1000) as i64);
        match (report.timeline.span(), start) {
            (None, start) => {
                let s = start.unwrap_or(now_s);
                Ranges {
                    sale: (s, s),
                    before: None,
                }
            }
            (Some((first, last)), None) => Ranges {
                sale: (first, last),
                before: None,
            },
            (Some((first, last)), Some(start)) => Ranges {
                sale: (start, last.max(start)),
                before: (first < start).then_some((first, start - 1)),
            },
        }
    }
}

/// `from` to `end` (unix seconds) in words: `22:46:05 – 22:46:13 UTC (8 s)`, dates shown
/// when the two differ.
fn range_words(from: i64, end: i64, t: &BTreeMap<&'static str, &'static str>) -> String {
    let at = |s: i64| DateTime::from_timestamp(s, 0).unwrap_or_default();
    let (a, b) = (at(from), at(end));
    let (a, b) = if a.date_naive() == b.date_naive() {
        (charts::clock(from), charts::clock(end))
    } else {
        let f = |d: DateTime<chrono::Utc>| d.format("%Y-%m-%d %H:%M:%S").to_string();
        (f(a), f(b))
    };
    format!("{a} – {b} UTC ({})", duration(end - from, t))
}

/// A length of time in words: `8 s`, `16 min`, `15 min 59 s`, `2 h 5 min` (the seconds of
/// lengths over 2 hours left out).
fn duration(secs: i64, t: &BTreeMap<&'static str, &'static str>) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let (sec, min, hour) = (t["sec"], t["min"], t["hour"]);
    if secs < 120 {
        format!("{secs} {sec}")
    } else if secs >= 7200 {
        format!("{h} {hour} {m} {min}")
    } else if s == 0 {
        format!("{} {min}", secs / 60)
    } else {
        format!("{} {min} {s} {sec}", secs / 60)
    }
}

/// The series of the events charts, labelled from `t`.
fn series(t: &BTreeMap<&'static str, &'static str>) -> [Series<'static>; 5] {
    [
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
    })
}

fn key(s: &Series<'static>) -> Key {
    let RGBColor(r, g, b) = s.color;
    Key {
        label: s.label,
        color: format!("#{r:02x}{g:02x}{b:02x}"),
    }
}

/// "Per second", or "per N s" (a step's length: short, as it labels an axis).
fn per(step: i64, t: &BTreeMap<&'static str, &'static str>) -> String {
    if step > 1 {
        format!("{} {step} {}", t["per"], t["sec"])
    } else {
        t["per_second"].to_owned()
    }
}

/// The charts of `report` (events per second and stock over the sale, what came before its
/// start apart, waits), labelled from `t`.
fn charts_of(report: &Report, t: &BTreeMap<&'static str, &'static str>) -> Charts {
    let ranges = Ranges::of(report);
    let (from, to) = ranges.sale;
    let (step, steps) = report.timeline.steps(from, to, MAX_STEPS);
    let span = Span {
        from,
        end: steps.last().map_or(to + 1, |s| s.0 + step),
    };
    let per = per(step, t);
    let series = series(t);
    let events = Drawn::of(|layout| {
        charts::events(
            &steps,
            span,
            &series,
            &Labels {
                title: t["events_title"],
                x: t["time"],
                y: &per,
            },
            layout,
        )
    });
    let stock = Drawn::of(|layout| {
        charts::stock(
            &steps,
            span,
            report.remaining,
            &Labels {
                title: t["stock"],
                x: t["time"],
                y: t["units"],
            },
            layout,
        )
    });
    let waits = Drawn::of(|layout| {
        charts::waits(
            &report.waits,
            &Labels {
                title: t["wait_distribution"],
                x: t["wait"],
                y: t["tickets"],
            },
            layout,
        )
    });
    let before = ranges
        .before
        .map(|(first, last)| before(report, first, last, t));
    let mut range = format!(
        "{}{}{}",
        t[if report.opened_ms.is_some() {
            "sale_range"
        } else {
            "span_range"
        }],
        t["colon"],
        range_words(span.from, span.end, t)
    );
    if before.is_some() {
        range = format!("{range} · {}", t["earlier"]);
    }
    Charts {
        events,
        stock,
        waits,
        range,
        legend: series.iter().map(key).collect(),
        before,
    }
}

/// What was recorded from `first` to `last` (unix seconds), before the start: bars of each
/// series that counted anything, to the start. The stock's units taken or given back then (a
/// restock before the sale) are not drawn here: the stock chart begins with what was left at
/// the start, which counts them.
fn before(
    report: &Report,
    first: i64,
    last: i64,
    t: &BTreeMap<&'static str, &'static str>,
) -> Before {
    let (step, steps) = report.timeline.steps(first, last, charts::STRIP_STEPS);
    let span = Span {
        from: first,
        end: last + 1,
    };
    let series: Vec<Series<'static>> = series(t)
        .into_iter()
        .filter(|s| steps.iter().any(|(_, row)| row[s.count as usize] > 0))
        .collect();
    let per = per(step, t);
    let chart = Drawn::of(|layout| {
        charts::strip(
            &steps,
            step,
            span,
            &series,
            &Labels {
                title: t["before_title"],
                x: t["time"],
                y: &per,
            },
            layout.strip(),
        )
    });
    let counted: Vec<String> = series
        .iter()
        .map(|s| {
            let n: u64 = steps.iter().map(|(_, row)| row[s.count as usize]).sum();
            format!("{} {n}", s.label)
        })
        .collect();
    Before {
        chart,
        caption: format!(
            "{}{}{} · {}",
            t["before_range"],
            t["colon"],
            range_words(span.from, span.end, t),
            counted.join(", ")
        ),
        legend: series.iter().map(key).collect(),
    }
}

/// The page of `report`, in `lang`, naming `shop` (empty: none).
pub fn page(report: &Report, lang: Lang, shop: &str) -> String {
    let t = texts(lang);
    let charts = charts_of(report, &t);
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
                charts => minijinja::value::Serde(&charts),
            })
        })
        .expect("the built-in template renders")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{BuyerFigures, Story, Timeline, Units, Waits};
    use hdrhistogram::Histogram;

    /// 22:46:05 UTC on a day of 2023.
    const START: i64 = 1_700_000_000 - 1_700_000_000 % 86400 + 22 * 3600 + 46 * 60 + 5;

    /// A sale that opened at [`START`] and ran 7 seconds, after a pre-queue of 16 minutes.
    fn drop_report() -> Report {
        let mut timeline = Timeline::default();
        let ms = |s: i64| (s * 1000) as u64;
        for minutes in [16, 12, 8, 5, 2, 1] {
            timeline.add(Count::Arrivals, ms(START - minutes * 60), 1);
        }
        timeline.add(Count::Admissions, ms(START), 6);
        for s in 0..7 {
            timeline.add(Count::Reservations, ms(START + s) + 300, 1);
            timeline.add(Count::UnitsTaken, ms(START + s) + 300, 1);
            timeline.add(Count::Confirmations, ms(START + s) + 600, 1);
        }
        let mut waits = Histogram::new(3).unwrap();
        waits.record(16 * 60_000).unwrap();
        waits.record(1_000).unwrap();
        Report {
            story: Story {
                activity: "2001".into(),
                opened_at: None,
                first_sale_at: None,
                sold_out_at: None,
                units: Units::default(),
                buyers: BuyerFigures::default(),
                wait_ms: Waits::default(),
                challenges_solved: 0,
                draw: None,
                variants: Vec::new(),
                phases: Vec::new(),
                public: None,
                second_chance: None,
                refusals: None,
            },
            timeline,
            waits,
            remaining: 0,
            now_ms: ms(START + 60),
            opened_ms: Some(ms(START)),
        }
    }

    #[test]
    fn the_sale_is_charted_apart_from_its_pre_queue() {
        let report = drop_report();
        let ranges = Ranges::of(&report);
        assert_eq!(ranges.sale, (START, START + 6));
        assert_eq!(ranges.before, Some((START - 16 * 60, START - 1)));
        let t = texts(Lang::En);
        let charts = charts_of(&report, &t);
        assert_eq!(
            charts.range,
            "From the start to the last event: 22:46:05 – 22:46:12 UTC (7 s) · \
             what came before the start: see “Before the start”"
        );
        let before = charts.before.expect("the pre-queue's strip");
        assert_eq!(
            before.caption,
            "Before the start (the pre-queue), not in the charts below: \
             22:30:05 – 22:46:05 UTC (16 min) · arrivals 6"
        );
        // The sale's axis is labelled within the sale, the strip's within the pre-queue.
        let labels = |svg: &str| -> Vec<String> {
            svg.split('>')
                .filter_map(|s| s.strip_suffix("</text"))
                .map(str::trim)
                .filter(|s| s.len() == 8 && s.as_bytes()[2] == b':')
                .map(str::to_owned)
                .collect()
        };
        for svg in [
            &charts.events.wide,
            &charts.events.narrow,
            &charts.stock.narrow,
        ] {
            let at = labels(svg);
            assert!(!at.is_empty(), "{svg}");
            assert!(
                at.iter()
                    .all(|l| ("22:46:05"..="22:46:12").contains(&l.as_str())),
                "{at:?}"
            );
        }
        for svg in [&before.chart.wide, &before.chart.narrow] {
            let at = labels(svg);
            assert!(at.len() >= 2, "{at:?}");
            assert!(
                at.iter()
                    .all(|l| ("22:30:05"..="22:46:05").contains(&l.as_str())),
                "{at:?}"
            );
        }
        let zh = texts(Lang::Zh);
        let charts = charts_of(&report, &zh);
        assert_eq!(
            charts.before.unwrap().caption,
            "开售前（预排队），不在下方图表中：22:30:05 – 22:46:05 UTC (16 分钟) · 到达 6"
        );
    }

    #[test]
    fn without_a_start_the_charts_span_what_was_recorded() {
        let mut report = drop_report();
        report.opened_ms = None;
        let ranges = Ranges::of(&report);
        assert_eq!(ranges.sale, (START - 16 * 60, START + 6));
        assert_eq!(ranges.before, None);
        let charts = charts_of(&report, &texts(Lang::En));
        assert!(charts.before.is_none());
        // In steps of 3 s (969 s over 400 steps at most): the axis ends with the last step's.
        assert_eq!(
            charts.range,
            "From the first to the last event: 22:30:05 – 22:46:14 UTC (16 min 9 s)"
        );
        // Nothing recorded, the sale open: its start's second.
        report.opened_ms = Some((START * 1000) as u64);
        report.timeline = Timeline::default();
        let ranges = Ranges::of(&report);
        assert_eq!((ranges.sale, ranges.before), ((START, START), None));
    }

    #[test]
    fn lengths_and_ranges_read_as_words() {
        let t = texts(Lang::En);
        let words: Vec<String> = [8, 960, 959, 7500].map(|s| duration(s, &t)).into();
        assert_eq!(words, ["8 s", "16 min", "15 min 59 s", "2 h 5 min"]);
        assert_eq!(
            range_words(START - 60, START + 60, &t),
            "22:45:05 – 22:47:05 UTC (2 min)"
        );
        // Over midnight, the dates are said.
        let midnight = START + 86400 - (22 * 3600 + 46 * 60 + 5);
        assert_eq!(
            range_words(midnight - 5, midnight + 5, &t),
            "2023-11-14 23:59:55 – 2023-11-15 00:00:05 UTC (10 s)"
        );
        assert_eq!(duration(960, &texts(Lang::Zh)), "16 分钟");
    }
}
