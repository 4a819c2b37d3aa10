//! The report's charts, drawn server-side as SVG with plotters (no script, no font file, no
//! network to view them): events per second, stock remaining, what happened before the sale's
//! start (the pre-queue's strip), and the waits' distribution.
//!
//! Each chart is an `<svg>` with a viewBox, so it scales to its box's width; and each is drawn
//! twice, in a [`WIDE`] and a [`NARROW`] [`Layout`], the page showing one by its width (a media
//! query), so that its texts stay legible: one viewBox 800 units wide shrunk to a phone's 330
//! px would draw a 13-unit label 5.4 px high.
//!
//! The x axis's labels are placed here, not by plotters: times of day (`22:46:05`) at round
//! intervals, each label wholly inside the drawing (clear of the y axis's texts) and an em or
//! more from the next by an estimate of its width ([`text_width`]), at most
//! [`Layout::max_x_labels`] of them.

use super::timeline::{remaining_by_step, Count, Row};
use chrono::DateTime;
use hdrhistogram::Histogram;
use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::types::{RangedCoordi64, RangedCoordu64};
use plotters::prelude::*;

/// The most points a line has: longer sales are drawn in steps of several seconds.
pub const MAX_STEPS: usize = 400;
/// The most bars of the pre-queue's strip: a longer pre-queue is counted in wider steps (16
/// s each for 16 minutes), so that one arrival's bar stays a few units wide on a phone.
pub const STRIP_STEPS: usize = 60;
/// Bars of the waits' distribution.
const WAIT_BARS: u64 = 20;
/// Plotters writes a text's SVG `font-size` as the size it was given divided by 1.24.
const PLOTTERS_FONT: f64 = 1.24;
/// Blank around the drawing, SVG units (the top's is an em: see [`Frame`]).
const MARGIN: u32 = 8;
/// A y tick mark's length, SVG units; plotters sets a label twice that from its axis.
const Y_TICK: u32 = 4;
/// An x tick mark's length: its labels 16 units below the axis, clear of the y axis's lowest
/// label (centred on the axis), which a label at the axis's start reaches under.
const X_TICK: u32 = 8;

/// How a chart is drawn: its size and its texts' size, in SVG units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    /// The drawing's width and height (its viewBox).
    pub size: (u32, u32),
    /// Every text's font size, in SVG px, at least: drawn up to 0.81 px larger (see
    /// [`Layout::px`]).
    pub font: f64,
    /// The most labels of the x axis.
    pub max_x_labels: usize,
    /// The y axis's labels plotters aims at.
    pub max_y_labels: usize,
}

/// Shown on pages wider than 40 rem (the template's media query). Its texts, 13.7 SVG px
/// ([`Layout::font`]), are drawn from 10.2 CSS px high (a page of 641 px: a box of 596) to
/// 16.2 (the page's widest box, 947 px, measured in Chromium at 1280 px).
pub const WIDE: Layout = Layout {
    size: (800, 320),
    font: 13.0,
    max_x_labels: 6,
    max_y_labels: 6,
};

/// Shown on pages 40 rem wide or narrower: its texts are drawn 12.6 CSS px high on a 390-px
/// phone (a box of 330 px beside Chromium's scroll bar, measured), 10.5 on a 320-px one
/// (9.9 beside a scroll bar).
pub const NARROW: Layout = Layout {
    size: (360, 260),
    font: 13.0,
    max_x_labels: 3,
    max_y_labels: 5,
};

impl Layout {
    /// The pre-queue's strip: as wide, lower.
    pub fn strip(self) -> Layout {
        Layout {
            size: (self.size.0, 170),
            max_y_labels: 3,
            ..self
        }
    }

    /// The font as plotters takes it: it writes `font-size` as the size it was given, rounded
    /// to a whole number, divided by 1.24; rounded up here, texts are [`Layout::font`] px or up
    /// to 0.81 px larger (13.71 for 13).
    fn font(&self) -> (&'static str, f64) {
        ("sans-serif", (self.font * PLOTTERS_FONT).ceil())
    }

    /// The texts' font size as drawn, SVG px (see [`Layout::font`]).
    fn px(&self) -> f64 {
        (self.font * PLOTTERS_FONT).ceil() / PLOTTERS_FONT
    }
}

/// A series of the events chart: what it counts, its label and colour.
pub struct Series<'a> {
    pub count: Count,
    pub label: &'a str,
    pub color: RGBColor,
}

/// Texts a chart shows (in the page's language): `title` names it to a screen reader.
pub struct Labels<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

/// The x axis of a time chart: from `from` to `end` (unix seconds, `end` excluded).
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub from: i64,
    pub end: i64,
}

/// Estimated width of `text` drawn at `font` px, by DejaVu Sans's advances (Chromium's
/// `sans-serif` on Linux, wider than Arial's or Helvetica's on other systems): a digit 0.64
/// em, `.`, `:` or a space 0.34, `m`, `M`, `w` or `W` 1 em, any other ASCII character 0.65
/// (most are narrower: `s` 0.52, `i` 0.28), and anything else 1 em (a CJK character). An
/// estimate, as the server has no font to measure with (the browser picks it).
fn text_width(text: &str, font: f64) -> f64 {
    text.chars()
        .map(|c| match c {
            '0'..='9' => 0.64,
            '.' | ':' | ' ' => 0.34,
            'm' | 'M' | 'w' | 'W' => 1.0,
            c if c.is_ascii() => 0.65,
            _ => 1.0,
        })
        .sum::<f64>()
        * font
}

/// Where a chart's plot goes in its drawing, SVG units: the areas of its axes' labels, sized
/// for their texts.
struct Frame {
    /// Above the plot: an em, so that a y label centred on the plot's top is not cut.
    top: u32,
    /// Right of the plot: half the widest x label, so that a label at the axis's end fits.
    right: u32,
    /// Below the plot: the tick marks, a row of labels and the x axis's description.
    x_area: u32,
    /// Left of the plot: the y axis's description (turned) and its labels; and half the
    /// widest x label, so that a label at the axis's start fits beside the description.
    y_area: u32,
    /// The plot's left and right edges.
    plot: (f64, f64),
    /// How far left and right the x axis's labels may reach: from past the y axis's
    /// description to the drawing's edge.
    labels: (f64, f64),
}

impl Frame {
    /// The frame of `layout` whose widest y label is `widest_y`, and x label `widest_x`.
    /// Text boxes are taken as 1.3 em high (DejaVu Sans's ascent and descent are 1.17 em).
    fn new(layout: Layout, widest_y: &str, widest_x: &str) -> Frame {
        let em = layout.px();
        let row = 1.3 * em;
        let half_x = text_width(widest_x, em) / 2.0;
        let y_labels = row + 0.5 * em + text_width(widest_y, em) + 2.0 * Y_TICK as f64;
        let y_area = y_labels.max(row + 0.2 * em + half_x + 2.0).ceil() as u32;
        let x_area = 2.0 * X_TICK as f64 + row + 0.4 * em + row;
        let right = MARGIN.max(half_x.ceil() as u32 + 4);
        let width = layout.size.0 as f64;
        Frame {
            top: em.ceil() as u32,
            right,
            x_area: x_area.ceil() as u32,
            y_area,
            plot: ((MARGIN + y_area) as f64, width - right as f64),
            labels: (MARGIN as f64 + row + 0.2 * em, width - 2.0),
        }
    }
}

/// An axis the labels of which are placed by [`ticks`].
struct Axis {
    from: i64,
    end: i64,
    /// The plot's left and right edges, SVG units.
    plot: (f64, f64),
    /// How far left and right labels may reach, SVG units.
    labels: (f64, f64),
    font: f64,
    max: usize,
}

impl Axis {
    fn new(from: i64, end: i64, frame: &Frame, layout: Layout) -> Axis {
        Axis {
            from,
            end,
            plot: frame.plot,
            labels: frame.labels,
            font: layout.px(),
            max: layout.max_x_labels,
        }
    }
}

/// The ticks of `axis`: the multiples of the first interval of `nice` (units of the axis)
/// whose labels (`label` of a tick) lie wholly within `axis.labels`, an em or more apart, and
/// are `axis.max` or fewer; else the middle of the range alone, if its label fits. Positions
/// are plotters' mapping to within a unit (it rounds to whole units), widths
/// [`text_width`]'s estimates.
fn ticks(axis: &Axis, nice: &[i64], label: &dyn Fn(i64) -> String) -> Vec<i64> {
    let span = (axis.end - axis.from).max(1) as f64;
    let width = axis.plot.1 - axis.plot.0;
    let x = |v: i64| axis.plot.0 + (v - axis.from) as f64 / span * width;
    let fits = |t: i64, w: f64| {
        x(t) - w / 2.0 >= axis.labels.0 + 1.0 && x(t) + w / 2.0 <= axis.labels.1 - 1.0
    };
    let sample = text_width(&label(axis.from), axis.font);
    for &every in nice {
        let apart = every as f64 / span * width;
        if apart < sample + axis.font {
            continue;
        }
        let first = axis.from.div_euclid(every) * every;
        let at: Vec<(i64, f64)> = (0..)
            .map(|i| first + i * every)
            .skip_while(|t| *t < axis.from)
            .take_while(|t| *t <= axis.end)
            .map(|t| (t, text_width(&label(t), axis.font)))
            .filter(|&(t, w)| fits(t, w))
            .collect();
        let widest = at.iter().map(|a| a.1).fold(0.0, f64::max);
        if apart < widest + axis.font || at.len() > axis.max {
            continue;
        }
        if at.is_empty() {
            break;
        }
        return at.into_iter().map(|a| a.0).collect();
    }
    let middle = axis.from + (axis.end - axis.from) / 2;
    let fits = fits(middle, text_width(&label(middle), axis.font));
    fits.then_some(middle).into_iter().collect()
}

/// Intervals of a time axis's labels, seconds: round ones of a clock.
const CLOCK_STEPS: [i64; 18] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
];

/// Intervals of the waits' axis, ms.
const WAIT_STEPS: [i64; 22] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 120_000,
    300_000, 600_000, 900_000, 1_800_000, 3_600_000,
];

/// The time of day of a unix second, UTC (`22:46:05`): the date is the page's to say.
pub fn clock(second: i64) -> String {
    DateTime::from_timestamp(second, 0)
        .map(|t| t.format("%H:%M:%S").to_string())
        .unwrap_or_default()
}

/// A count as a short label: `12500` is `12.5k`, `2000000` is `2M`.
fn compact(v: u64) -> String {
    let short = |v: u64, unit: u64, suffix: &str| match v % unit {
        0 => format!("{}{suffix}", v / unit),
        _ => format!("{:.1}{suffix}", v as f64 / unit as f64),
    };
    match v {
        0..10_000 => v.to_string(),
        10_000..1_000_000 => short(v, 1000, "k"),
        _ => short(v, 1_000_000, "M"),
    }
}

/// A wait (ms) as a label: `0`, `500 ms`, `2 s`, `2.5 s`, `5 min`.
fn wait_label(ms: i64) -> String {
    match ms {
        0 => "0".to_owned(),
        ..1000 => format!("{ms} ms"),
        _ if ms % 60_000 == 0 => format!("{} min", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{} s", ms / 1000),
        _ => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

/// Escapes `&`, `<`, `>` and `"` for an attribute's value.
fn attribute(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Makes the SVG scale to its container (its viewBox without a fixed size), named `title`.
fn scalable(svg: String, layout: Layout, title: &str) -> String {
    let (w, h) = layout.size;
    let fixed = format!("width=\"{w}\" height=\"{h}\"");
    let mut named = format!(
        "preserveAspectRatio=\"xMidYMid meet\" role=\"img\" aria-label=\"{}\"",
        attribute(title)
    );
    // plotters writes a viewBox beside the fixed size; one drawing's without it gets one.
    if !svg.contains("viewBox=") {
        named = format!("viewBox=\"0 0 {w} {h}\" {named}");
    }
    svg.replacen(&fixed, &named, 1)
}

/// Each step's start, end (the next step's start; the last's, `span.end`) and counts.
fn spans(steps: &[(i64, Row)], span: Span) -> impl Iterator<Item = (i64, i64, &Row)> {
    steps.iter().enumerate().map(move |(i, (at, row))| {
        let end = steps.get(i + 1).map_or(span.end, |next| next.0);
        (*at, end.max(*at), row)
    })
}

/// Lines of `series` over `steps`, on `span`: a step's count held from its start to its end
/// (a staircase), so that the last step is drawn too and a sale of two seconds fills its axis.
pub fn events(
    steps: &[(i64, Row)],
    span: Span,
    series: &[Series<'_>],
    l: &Labels<'_>,
    layout: Layout,
) -> String {
    let top = steps
        .iter()
        .flat_map(|(_, row)| series.iter().map(move |s| row[s.count as usize]))
        .max()
        .unwrap_or(0)
        .max(1);
    time_chart(span, l, layout, top, |area| {
        for s in series {
            let i = s.count as usize;
            area.draw_series(LineSeries::new(
                spans(steps, span).flat_map(|(at, end, row)| [(at, row[i]), (end, row[i])]),
                s.color.stroke_width(2),
            ))?;
        }
        Ok(())
    })
}

/// Units remaining over `steps`, on `span`, walked back from `now_remaining`: what was left
/// at the start, then at the end of each step, joined by straight lines (within a step, when
/// each unit went is not drawn).
pub fn stock(
    steps: &[(i64, Row)],
    span: Span,
    now_remaining: i64,
    l: &Labels<'_>,
    layout: Layout,
) -> String {
    let ends = remaining_by_step(steps, now_remaining);
    let start = match (steps.first(), ends.first()) {
        (Some((_, row)), Some(end)) => {
            end + row[Count::UnitsTaken as usize] as i64 - row[Count::UnitsBack as usize] as i64
        }
        _ => now_remaining,
    };
    let left: Vec<(i64, u64)> = std::iter::once((span.from, start))
        .chain(
            spans(steps, span)
                .zip(&ends)
                .map(|((_, end, _), v)| (end, *v)),
        )
        .map(|(at, v)| (at, v.max(0) as u64))
        .collect();
    let top = left.iter().map(|p| p.1).max().unwrap_or(0).max(1);
    time_chart(span, l, layout, top, |area| {
        area.draw_series(
            AreaSeries::new(left.iter().copied(), 0, BLUE.mix(0.25))
                .border_style(BLUE.stroke_width(2)),
        )?;
        Ok(())
    })
}

/// Bars of `series` over `steps` (each `step` seconds long), on `span` (a bar reaching past
/// its end is cut at it): the pre-queue's strip. Series overlap, each drawn over the one
/// before it, a little transparent.
pub fn strip(
    steps: &[(i64, Row)],
    step: i64,
    span: Span,
    series: &[Series<'_>],
    l: &Labels<'_>,
    layout: Layout,
) -> String {
    let top = steps
        .iter()
        .flat_map(|(_, row)| series.iter().map(move |s| row[s.count as usize]))
        .max()
        .unwrap_or(0)
        .max(1);
    time_chart(span, l, layout, top, |area| {
        for s in series {
            let color = s.color.mix(0.8).filled();
            area.draw_series(steps.iter().filter_map(|(at, row)| {
                let n = row[s.count as usize];
                (n > 0).then(|| Rectangle::new([(*at, 0), ((at + step).min(span.end), n)], color))
            }))?;
        }
        Ok(())
    })
}

type Area<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<WithKeyPoints<RangedCoordi64>, RangedCoordu64>>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// The y axis's top for counts up to `top`: a tenth above it.
fn y_top(top: u64) -> u64 {
    top + top / 10 + 1
}

/// A time chart on `span`: y from 0 to `top`, the series `draw` adds, in `layout`.
fn time_chart(
    span: Span,
    l: &Labels<'_>,
    layout: Layout,
    top: u64,
    draw: impl FnOnce(&mut Area<'_, '_>) -> Drawn,
) -> String {
    let end = span.end.max(span.from + 1);
    let y_end = y_top(top);
    let frame = Frame::new(layout, &compact(y_end), "00:00:00");
    let x_ticks = ticks(
        &Axis::new(span.from, end, &frame, layout),
        &CLOCK_STEPS,
        &clock,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, layout.size).into_drawing_area();
        let drawn = (|| -> Drawn {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .margin(MARGIN)
                .margin_top(frame.top)
                .margin_right(frame.right)
                .x_label_area_size(frame.x_area)
                .y_label_area_size(frame.y_area)
                .build_cartesian_2d((span.from..end).with_key_points(x_ticks), 0..y_end)?;
            chart
                .configure_mesh()
                .x_desc(l.x)
                .y_desc(l.y)
                .label_style(layout.font())
                .axis_desc_style(layout.font())
                .set_all_tick_mark_size(Y_TICK)
                .set_tick_mark_size(LabelAreaPosition::Bottom, X_TICK)
                .y_labels(layout.max_y_labels)
                .x_label_formatter(&|s| clock(*s))
                .y_label_formatter(&|v| compact(*v))
                .draw()?;
            draw(&mut chart)?;
            root.present()
        })();
        // Drawing into a string fails only on a degenerate range: the page shows what drew.
        let _ = drawn;
    }
    scalable(svg, layout, l.title)
}

/// Bars of how many admitted tickets waited how long (ms).
pub fn waits(h: &Histogram<u64>, l: &Labels<'_>, layout: Layout) -> String {
    let width = (h.max() / WAIT_BARS + 1).max(1);
    let mut bars = vec![0u64; WAIT_BARS as usize + 1];
    for v in h.iter_recorded() {
        let i = (v.value_iterated_to() / width).min(WAIT_BARS) as usize;
        bars[i] += v.count_at_value();
    }
    let top = bars.iter().copied().max().unwrap_or(0).max(1);
    let y_end = y_top(top);
    let end = width * (WAIT_BARS + 1);
    let frame = Frame::new(layout, &compact(y_end), &wait_label(end as i64));
    let axis = Axis::new(0, end as i64, &frame, layout);
    let x_ticks: Vec<u64> = ticks(&axis, &WAIT_STEPS, &wait_label)
        .into_iter()
        .map(|t| t as u64)
        .collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, layout.size).into_drawing_area();
        let drawn = (|| -> Drawn {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .margin(MARGIN)
                .margin_top(frame.top)
                .margin_right(frame.right)
                .x_label_area_size(frame.x_area)
                .y_label_area_size(frame.y_area)
                .build_cartesian_2d((0..end).with_key_points(x_ticks), 0..y_end)?;
            chart
                .configure_mesh()
                .x_desc(l.x)
                .y_desc(l.y)
                .label_style(layout.font())
                .axis_desc_style(layout.font())
                .set_all_tick_mark_size(Y_TICK)
                .set_tick_mark_size(LabelAreaPosition::Bottom, X_TICK)
                .y_labels(layout.max_y_labels)
                .x_label_formatter(&|ms| wait_label(*ms as i64))
                .y_label_formatter(&|v| compact(*v))
                .draw()?;
            chart.draw_series(bars.iter().enumerate().map(|(i, n)| {
                let x = i as u64 * width;
                Rectangle::new([(x, 0), (x + width, *n)], GREEN.mix(0.7).filled())
            }))?;
            root.present()
        })();
        let _ = drawn;
    }
    scalable(svg, layout, l.title)
}

#[cfg(test)]
mod tests;
