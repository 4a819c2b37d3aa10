use super::*;

fn axis(from: i64, end: i64, layout: Layout) -> Axis {
    Axis::new(from, end, &Frame::new(layout, "100", "00:00:00"), layout)
}

/// Every label inside the plot and an em from the next, by the width estimate.
fn apart(a: &Axis, at: &[i64], label: &dyn Fn(i64) -> String) {
    let span = (a.end - a.from) as f64;
    let x = |v: i64| a.plot.0 + (v - a.from) as f64 / span * (a.plot.1 - a.plot.0);
    let boxes: Vec<(f64, f64)> = at
        .iter()
        .map(|&t| {
            let w = text_width(&label(t), a.font) / 2.0;
            (x(t) - w, x(t) + w)
        })
        .collect();
    for (l, r) in &boxes {
        assert!(
            *l >= a.labels.0 && *r <= a.labels.1,
            "{boxes:?} in {:?}",
            a.labels
        );
    }
    for w in boxes.windows(2) {
        assert!(w[1].0 - w[0].1 >= a.font, "{boxes:?}");
    }
}

#[test]
fn a_short_sale_gets_a_few_labels_at_round_seconds() {
    // 22:46:05 to 22:46:13: 8 seconds.
    let from = 1_700_000_000 - 1_700_000_000 % 86400 + 22 * 3600 + 46 * 60 + 5;
    for layout in [WIDE, NARROW] {
        let a = axis(from, from + 8, layout);
        let at = ticks(&a, &CLOCK_STEPS, &clock);
        assert!(!at.is_empty() && at.len() <= layout.max_x_labels, "{at:?}");
        assert!(at.iter().all(|t| (from..=from + 8).contains(t)));
        apart(&a, &at, &clock);
    }
    let at = ticks(&axis(from, from + 8, WIDE), &CLOCK_STEPS, &clock);
    assert!(at.len() >= 3, "a desk's chart shows several: {at:?}");
}

#[test]
fn a_long_pre_queue_is_labelled_in_round_minutes() {
    let from = 1_700_000_000 - 1_700_000_000 % 3600 + 30 * 60 + 5;
    for layout in [WIDE.strip(), NARROW.strip()] {
        let a = axis(from, from + 16 * 60, layout);
        let at = ticks(&a, &CLOCK_STEPS, &clock);
        assert!(at.len() >= 2, "{at:?}");
        assert!(at.iter().all(|t| t % 60 == 0), "{at:?}");
        apart(&a, &at, &clock);
    }
}

#[test]
fn a_sale_of_seconds_is_labelled_at_its_ends_too() {
    let at = |from, end| ticks(&axis(from, end, NARROW), &CLOCK_STEPS, &clock);
    assert_eq!(at(100, 102), [100, 101, 102]);
    assert_eq!(at(100, 101), [100, 101]);
    // A month has no round interval a phone's axis shows apart: its middle alone.
    assert_eq!(at(0, 30 * 86400), [15 * 86400]);
}

#[test]
fn labels_are_short() {
    assert_eq!(compact(9999), "9999");
    assert_eq!(compact(12_500), "12.5k");
    assert_eq!(compact(2_000_000), "2M");
    assert_eq!(wait_label(500), "500 ms");
    assert_eq!(wait_label(2500), "2.5 s");
    assert_eq!(wait_label(300_000), "5 min");
    assert_eq!(clock(22 * 3600 + 46 * 60 + 5), "22:46:05");
}

#[test]
fn waits_axis_labels_fit_a_phone() {
    for max in [900, 16 * 60_000] {
        let a = axis(0, max, NARROW);
        let at = ticks(&a, &WAIT_STEPS, &wait_label);
        assert!(!at.is_empty(), "{max}");
        apart(&a, &at, &wait_label);
    }
}
