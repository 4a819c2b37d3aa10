//! The report's charts, drawn server-side as SVG with plotters (no script, no font file, no
//! network to view them): events per second, stock remaining, and the waits' distribution.
//! Each chart is an `<svg>` with a viewBox, so it scales to the page's width (a phone's too).

use super::timeline::{remaining_by_step, Count, Row};
use chrono::DateTime;
use hdrhistogram::Histogram;
use plotters::prelude::*;

/// The drawing's size in SVG units (scaled to the page's width when shown).
const SIZE: (u32, u32) = (800, 340);
/// The most points a line has: longer sales are drawn in steps of several seconds.
pub const MAX_STEPS: usize = 400;
/// Bars of the waits' distribution.
const WAIT_BARS: u64 = 20;

/// A series of the events chart: what it counts, its label and colour.
pub struct Series<'a> {
    pub count: Count,
    pub label: &'a str,
    pub color: RGBColor,
}

/// Texts a chart shows (in the page's language).
pub struct Labels<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

/// Makes the SVG scale to its container: a viewBox instead of a fixed size.
fn scalable(svg: String) -> String {
    let fixed = format!("width=\"{}\" height=\"{}\"", SIZE.0, SIZE.1);
    let view = format!(
        "viewBox=\"0 0 {} {}\" preserveAspectRatio=\"xMidYMid meet\" role=\"img\"",
        SIZE.0, SIZE.1
    );
    svg.replacen(&fixed, &view, 1)
}

fn clock(second: i64) -> String {
    DateTime::from_timestamp(second, 0)
        .map(|t| t.format("%H:%M:%S").to_string())
        .unwrap_or_default()
}

/// Lines of `series` over `steps` (each `step` seconds long).
pub fn events(steps: &[(i64, Row)], step: i64, series: &[Series<'_>], l: &Labels<'_>) -> String {
    let top = steps
        .iter()
        .flat_map(|(_, row)| series.iter().map(move |s| row[s.count as usize]))
        .max()
        .unwrap_or(0)
        .max(1);
    lines(steps, step, l, top, |area| {
        for s in series {
            let color = s.color;
            area.draw_series(LineSeries::new(
                steps.iter().map(|(at, row)| (*at, row[s.count as usize])),
                color.stroke_width(2),
            ))?
            .label(s.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
        Ok(())
    })
}

/// Units remaining at the end of each step, walked back from `now_remaining`.
pub fn stock(steps: &[(i64, Row)], step: i64, now_remaining: i64, l: &Labels<'_>) -> String {
    let left: Vec<u64> = remaining_by_step(steps, now_remaining)
        .into_iter()
        .map(|v| v.max(0) as u64)
        .collect();
    let top = left.iter().copied().max().unwrap_or(0).max(1);
    lines(steps, step, l, top, |area| {
        area.draw_series(
            AreaSeries::new(
                steps.iter().zip(&left).map(|((at, _), v)| (*at, *v)),
                0,
                BLUE.mix(0.25),
            )
            .border_style(BLUE.stroke_width(2)),
        )?;
        Ok(())
    })
}

type Area<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordi64, plotters::coord::types::RangedCoordu64>,
>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// A time chart: x the steps' seconds, y from 0 to `top`, the series `draw` adds.
fn lines(
    steps: &[(i64, Row)],
    step: i64,
    l: &Labels<'_>,
    top: u64,
    draw: impl FnOnce(&mut Area<'_, '_>) -> Drawn,
) -> String {
    let from = steps.first().map_or(0, |s| s.0);
    let to = steps.last().map_or(1, |s| s.0 + step).max(from + 1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let drawn = (|| -> Drawn {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(l.title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(from..to, 0..top + top / 10 + 1)?;
            chart
                .configure_mesh()
                .x_desc(l.x)
                .y_desc(l.y)
                .x_labels(6)
                .x_label_formatter(&|s| clock(*s))
                .draw()?;
            draw(&mut chart)?;
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .draw()?;
            root.present()
        })();
        // Drawing into a string fails only on a degenerate range: the page shows what drew.
        let _ = drawn;
    }
    scalable(svg)
}

/// Bars of how many admitted tickets waited how long (ms).
pub fn waits(h: &Histogram<u64>, l: &Labels<'_>) -> String {
    let width = (h.max() / WAIT_BARS + 1).max(1);
    let mut bars = vec![0u64; WAIT_BARS as usize + 1];
    for v in h.iter_recorded() {
        let i = (v.value_iterated_to() / width).min(WAIT_BARS) as usize;
        bars[i] += v.count_at_value();
    }
    let top = bars.iter().copied().max().unwrap_or(0).max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let drawn = (|| -> Drawn {
            root.fill(&WHITE)?;
            let end = width * (WAIT_BARS + 1);
            let mut chart = ChartBuilder::on(&root)
                .caption(l.title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(0..end, 0..top + top / 10 + 1)?;
            chart
                .configure_mesh()
                .x_desc(l.x)
                .y_desc(l.y)
                .x_labels(6)
                .x_label_formatter(&|ms| format!("{:.1} s", *ms as f64 / 1000.0))
                .draw()?;
            chart.draw_series(bars.iter().enumerate().map(|(i, n)| {
                let x = i as u64 * width;
                Rectangle::new([(x, 0), (x + width, *n)], GREEN.mix(0.7).filled())
            }))?;
            root.present()
        })();
        let _ = drawn;
    }
    scalable(svg)
}
