//! `flashgate report`: the story of one activity's sale, from what Redis holds of it (during
//! the sale, a snapshot; after it, until its keys expire). The units come from the ledgers (the
//! figures `reconcile` and the admin view show); the buyers, the waits and the charts from the
//! reservation records and the waiting room's tickets, read a page at a time ([`sales`],
//! [`queue`]); refusals, from Prometheus if asked ([`prometheus`]). `--json` prints the
//! contract's object, `--html` writes a page with charts ([`html`]).
//!
//! Memory is bounded by the sale's length (a row per second) and its buyers (8 bytes each), not
//! by its records; time is one pass over the records and the tickets (BENCHMARKS.md: a sale of
//! 1,000,000 reservations).

mod charts;
pub mod html;
pub mod prometheus;
mod queue;
mod sales;
mod timeline;

pub use sales::Units;
pub use timeline::{Count, Timeline};

use crate::config::{Activity, Settings};
use crate::reconcile::ReconcileError;
use crate::stock::{StockStore, StoreError, StoreOp};
use chrono::{DateTime, SecondsFormat, Utc};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;

/// The story as `--json` prints it (names fixed by the contract).
#[derive(Debug, Clone, Serialize)]
pub struct Story {
    pub activity: String,
    pub opened_at: Option<String>,
    pub first_sale_at: Option<String>,
    pub sold_out_at: Option<String>,
    pub units: Units,
    pub buyers: BuyerFigures,
    pub wait_ms: Waits,
    pub challenges_solved: u64,
    /// `"match"`, `"differs"`, or null (no draw, or not drawn yet).
    pub draw: Option<&'static str>,
    pub variants: Vec<VariantStory>,
    /// A sale in phases: each phase's start and the units taken in it (as the admin view
    /// shows them); absent for a sale without phases.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseStory>,
    /// A sale in phases: the public sale's start and units (`id: "public"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public: Option<PhaseStory>,
    /// The second-chance line (`activities[].second_chance`): buyers waiting, units held for
    /// them, units sold through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub second_chance: Option<LineStory>,
    /// Refusals by code over the sale, from Prometheus (only with `--prometheus`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusals: Option<BTreeMap<String, u64>>,
}

/// The buyers' figures. `bought`: distinct buyers holding a confirmed unit; `no_shows`:
/// admitted buyers holding no unit, confirmed or pending.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BuyerFigures {
    pub queued: u64,
    pub admitted: u64,
    pub bought: u64,
    pub no_shows: u64,
}

/// Waits from ticket to turn (ms), null without a waiting room or an admitted ticket.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Waits {
    pub p50: Option<u64>,
    pub p95: Option<u64>,
    pub max: Option<u64>,
}

/// The second-chance line's figures, over the activity's lanes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LineStory {
    pub waiting: u64,
    pub held: u64,
    pub sold: u64,
}

/// The second-chance line over `activity`'s lanes, if it has one.
async fn line_story(
    settings: &Settings,
    store: &StockStore,
    activity: &crate::config::Activity,
) -> Result<Option<LineStory>, StoreError> {
    if activity.second_chance.is_none() {
        return Ok(None);
    }
    let mut line = LineStory::default();
    for lane in settings.activities.lanes_of(&activity.id) {
        let (waiting, held, sold) = store.line_figures(lane).await?;
        line.waiting += waiting;
        line.held += held;
        line.sold += sold;
    }
    Ok(Some(line))
}

/// One phase's figures (units taken in it: a unit given back later stays counted here).
#[derive(Debug, Clone, Serialize)]
pub struct PhaseStory {
    pub id: String,
    pub starts_at: String,
    pub sold: u64,
}

/// One variant's figures.
#[derive(Debug, Clone, Serialize)]
pub struct VariantStory {
    pub id: String,
    pub units: Units,
    pub sold_out_at: Option<String>,
}

/// The story and what the charts draw.
#[derive(Debug)]
pub struct Report {
    pub story: Story,
    pub timeline: Timeline,
    pub waits: Histogram<u64>,
    /// Units left of the versions on sale now, over the lanes.
    pub remaining: i64,
    /// Redis's clock when it was read (unix ms).
    pub now_ms: u64,
    /// When the sale opened (unix ms).
    pub opened_ms: Option<u64>,
}

fn rfc3339(ms: u64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Redis's clock (unix ms): the report's "now".
async fn redis_now_ms(store: &StockStore) -> Result<u64, StoreError> {
    let (secs, micros): (u64, u64) = store
        .redis()
        .query(StoreOp::Read, &redis::cmd("TIME"))
        .await?;
    Ok(secs * 1000 + micros / 1000)
}

/// Reads the story of `id` (one configured activity).
pub async fn read(
    settings: &Settings,
    store: &StockStore,
    id: &str,
) -> Result<Report, ReconcileError> {
    let activity = settings
        .activities
        .get(id)
        .ok_or_else(|| ReconcileError::UnknownActivity(id.to_owned()))?;
    let now_ms = redis_now_ms(store).await?;
    let mut timeline = Timeline::default();
    let mut buyers = sales::Buyers::default();
    let mut units = Units::default();
    let mut variants = Vec::new();
    let (mut remaining, mut on_record) = (0, false);
    let mut sold_out: Option<Option<u64>> = None;
    let mut phase_sold = BTreeMap::<String, u64>::new();
    for lane in settings.activities.lanes_of(id) {
        let read = sales::read_lane(store, lane, &mut timeline, &mut buyers).await?;
        for (phase, units) in &read.phase_sold {
            *phase_sold.entry(phase.clone()).or_insert(0) += units;
        }
        units = units.plus(read.units);
        remaining += read.remaining.unwrap_or(0);
        on_record |= read.on_record;
        // The activity sold out when its last lane did.
        sold_out = Some(match sold_out {
            None => read.sold_out_ms,
            Some(before) => before.zip(read.sold_out_ms).map(|(a, b)| a.max(b)),
        });
        if let Some(variant) = &lane.variant {
            variants.push(VariantStory {
                id: variant.to_string(),
                units: read.units,
                sold_out_at: read.sold_out_ms.map(rfc3339),
            });
        }
    }
    let queue = queue::read(store, activity, now_ms, &buyers, &mut timeline).await?;
    let opened = opened_ms(activity, queue.as_ref(), on_record, now_ms);
    let story = Story {
        activity: id.to_owned(),
        opened_at: opened.map(rfc3339),
        first_sale_at: buyers.first_sale_ms.map(rfc3339),
        sold_out_at: sold_out.flatten().map(rfc3339),
        units,
        buyers: BuyerFigures {
            queued: queue.as_ref().map_or(0, |q| q.queued),
            admitted: queue.as_ref().map_or(0, |q| q.admitted),
            bought: buyers.bought(),
            no_shows: queue.as_ref().map_or(0, |q| q.no_shows),
        },
        wait_ms: queue
            .as_ref()
            .map_or_else(Waits::default, |q| waits(&q.waits)),
        challenges_solved: queue.as_ref().map_or(0, |q| q.challenges_solved),
        draw: queue
            .as_ref()
            .and_then(|q| q.draw)
            .map(|ok| if ok { "match" } else { "differs" }),
        variants,
        phases: phases(activity, &phase_sold),
        public: public(activity, &phase_sold),
        second_chance: line_story(settings, store, activity).await?,
        refusals: None,
    };
    let waits = queue.map_or_else(
        || Histogram::new(3).expect("3 significant digits"),
        |q| q.waits,
    );
    Ok(Report {
        story,
        timeline,
        waits,
        remaining,
        now_ms,
        opened_ms: opened,
    })
}

/// A sale in phases: the public sale's start and the units taken in it.
fn public(activity: &crate::config::Activity, sold: &BTreeMap<String, u64>) -> Option<PhaseStory> {
    let id = crate::config::phases::PUBLIC;
    activity.has_phases().then(|| PhaseStory {
        id: id.to_owned(),
        starts_at: activity
            .starts_at
            .to_rfc3339_opts(SecondsFormat::Secs, true),
        sold: sold.get(id).copied().unwrap_or(0),
    })
}

/// A sale in phases: each configured phase, with the units taken in it.
fn phases(activity: &crate::config::Activity, sold: &BTreeMap<String, u64>) -> Vec<PhaseStory> {
    (activity.phases.iter().map(|p| (&*p.id, p.starts_at)))
        .map(|(id, at)| PhaseStory {
            id: id.to_owned(),
            starts_at: at.to_rfc3339_opts(SecondsFormat::Secs, true),
            sold: sold.get(id).copied().unwrap_or(0),
        })
        .collect()
}

/// When the sale opened: its start (the waiting room's record of it, which a postponement
/// moved, else the configured one), once passed by Redis's clock; `None` before, or when Redis
/// holds nothing of the sale.
fn opened_ms(
    activity: &Activity,
    queue: Option<&queue::Queue>,
    on_record: bool,
    now_ms: u64,
) -> Option<u64> {
    let start = match queue.and_then(|q| q.start_ms) {
        Some(start) => start,
        None if on_record => activity.opens().timestamp_millis().max(0) as u64,
        None => return None,
    };
    (start <= now_ms).then_some(start)
}

fn waits(h: &Histogram<u64>) -> Waits {
    if h.is_empty() {
        return Waits::default();
    }
    Waits {
        p50: Some(h.value_at_quantile(0.5)),
        p95: Some(h.value_at_quantile(0.95)),
        max: Some(h.max()),
    }
}

/// What `flashgate report` was asked for.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    pub activity: String,
    pub prometheus: Option<String>,
}

/// `flashgate report` on a store of its own: the report, with refusals from Prometheus if
/// asked (an unreachable Prometheus is an error: the figures asked for cannot be given).
pub fn run_cli(settings: Settings, ask: &Ask) -> Result<Report, ReconcileError> {
    let mut report = crate::reconcile::with_store(&settings, async |store| {
        read(&settings, store, &ask.activity).await
    })?;
    if let Some(url) = &ask.prometheus {
        // Over the sale: from its opening, or its first recorded second if earlier (a
        // pre-queue's arrivals).
        let first = report.timeline.span().map(|(from, _)| from as u64 * 1000);
        let since = match (report.opened_ms, first) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(report.now_ms),
        };
        let refusals = prometheus::refusals(url, &ask.activity, since, report.now_ms)
            .map_err(ReconcileError::Prometheus)?;
        report.story.refusals = Some(refusals);
    }
    Ok(report)
}

/// `s` safe to print to a terminal: every control character (an escape sequence's ESC, a
/// carriage return that would overwrite the line) written as its `\u{..}` escape. What the
/// report prints comes partly from Prometheus, whose label values anyone able to push series
/// may have chosen.
fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    s.chars()
        .map(|c| match c.is_control() {
            true => c.escape_unicode().to_string(),
            false => c.to_string(),
        })
        .collect::<String>()
        .into()
}

/// The story as text, for a terminal.
pub fn text(story: &Story) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    let _ = writeln!(out, "activity       {}", terminal_safe(&story.activity));
    let _ = writeln!(out, "opened at      {}", or_dash(&story.opened_at));
    let _ = writeln!(out, "first sale at  {}", or_dash(&story.first_sale_at));
    let _ = writeln!(out, "sold out at    {}", or_dash(&story.sold_out_at));
    let u = &story.units;
    let _ = writeln!(
        out,
        "units          sold {} released {} pending {} (held in doubt {}) restocked {}",
        u.sold, u.released, u.pending, u.held_in_doubt, u.restocked
    );
    let b = &story.buyers;
    let _ = writeln!(
        out,
        "buyers         queued {} admitted {} bought {} no-shows {}",
        b.queued, b.admitted, b.bought, b.no_shows
    );
    let ms = |v: Option<u64>| v.map_or("-".to_owned(), |v| format!("{v} ms"));
    let w = &story.wait_ms;
    let _ = writeln!(
        out,
        "wait           p50 {} p95 {} max {}",
        ms(w.p50),
        ms(w.p95),
        ms(w.max)
    );
    let _ = writeln!(out, "challenges     {} solved", story.challenges_solved);
    let draw = terminal_safe(story.draw.unwrap_or("-"));
    let _ = writeln!(out, "draw           {draw}");
    for v in &story.variants {
        let u = &v.units;
        let _ = writeln!(
            out,
            "variant {:<8} sold {} released {} pending {} restocked {} sold out at {}",
            terminal_safe(&v.id),
            u.sold,
            u.released,
            u.pending,
            u.restocked,
            or_dash(&v.sold_out_at)
        );
    }
    if let Some(l) = &story.second_chance {
        let _ = writeln!(
            out,
            "second chance  waiting {} held {} sold {}",
            l.waiting, l.held, l.sold
        );
    }
    for p in story.phases.iter().chain(&story.public) {
        let _ = writeln!(
            out,
            "phase {:<10} from {} took {}",
            terminal_safe(&p.id),
            p.starts_at,
            p.sold
        );
    }
    if let Some(refusals) = &story.refusals {
        for (code, n) in refusals {
            let _ = writeln!(out, "refused        {} {n}", terminal_safe(code));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_report_prints_no_control_character_it_was_given() {
        let story = Story {
            activity: "1001".into(),
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
            refusals: Some(BTreeMap::from([("sold_out\u{1b}[2J\r".to_owned(), 3)])),
        };
        let text = text(&story);
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        assert!(
            text.contains(r"refused        sold_out\u{1b}[2J\u{d} 3"),
            "{text}"
        );
    }
}
