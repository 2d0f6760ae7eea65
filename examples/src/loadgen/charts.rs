//! The two charts of a run's report, drawn by plotters as SVG text: messages sent and
//! delivered per second, and send → deliver latency percentiles per second. Both span the
//! run from the start of sending, with the warm-up (load the figures leave out) shaded grey
//! and the drain (after the window: no new sends, in-flight messages still arriving) shaded
//! pale yellow. The legend has a strip of its own, right of the plot, so it never hides a
//! line.
//!
//! The SVG backend writes text as `<text>` elements and leaves the font to the viewer, so
//! nothing here needs a font file or a system library (plotters is built without its
//! font features).

use plotters::{
    coord::{
        Shift,
        ranged1d::{AsRangedCoord, ValueFormatter},
        types::RangedCoordf64,
    },
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{Report, Second, Timeline};

/// Width and height of each chart, in pixels.
const SIZE: (u32, u32) = (960, 440);
/// Width of the legend's strip, right of the plot.
const LEGEND_WIDTH: u32 = 190;
/// Above this ratio of the largest to the smallest latency drawn, the latency axis is
/// logarithmic: on a linear one the median would lie flat along the bottom under a spike.
const LOG_SCALE_RATIO: f64 = 20.0;
const FONT: &str = "sans-serif";

const WARMUP_SHADE: RGBAColor = RGBAColor(120, 120, 120, 0.18);
const DRAIN_SHADE: RGBAColor = RGBAColor(230, 170, 0, 0.15);
// Matplotlib's "tab10" colours: told apart by most people, on screen and on paper.
const TAB_BLUE: RGBColor = RGBColor(31, 119, 180);
const TAB_ORANGE: RGBColor = RGBColor(255, 127, 14);
const TAB_GREEN: RGBColor = RGBColor(44, 160, 44);
const TAB_RED: RGBColor = RGBColor(214, 39, 40);
const TAB_PURPLE: RGBColor = RGBColor(148, 103, 189);
const TAB_GREY: RGBColor = RGBColor(127, 127, 127);

/// Drawing a chart failed (plotters' error, as text: the SVG backend draws into a string,
/// so this is a bug rather than something a user can fix).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ChartError(String);

fn chart_error<E: std::error::Error + Send + Sync>(error: DrawingAreaErrorKind<E>) -> ChartError {
    ChartError(error.to_string())
}

/// Where a run's phases fall on the time axis, in seconds since the start of sending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Phases {
    /// End of the warm-up, start of the measurement window.
    pub warmup_end: f64,
    /// End of the window, start of the drain.
    pub window_end: f64,
}

impl Phases {
    pub(super) fn of(report: &Report) -> Self {
        let warmup_end = report.warmup.as_secs_f64();
        Self { warmup_end, window_end: warmup_end + report.duration.as_secs_f64() }
    }

    /// The phase second `second` starts in: `warmup`, `window` or `drain`.
    pub(super) fn name(&self, second: usize) -> &'static str {
        let start = second as f64;
        if start < self.warmup_end {
            "warmup"
        } else if start < self.window_end {
            "window"
        } else {
            "drain"
        }
    }

    /// The end of the time axis: the last second with data, or the window's end.
    fn axis_end(&self, seconds: usize) -> f64 {
        (seconds as f64).max(self.window_end.ceil()).max(1.0)
    }
}

/// One line of a chart: points at the middle of their seconds, broken where a second has
/// no value (a second in which nothing that arrived was sent has no latency).
#[derive(Debug)]
struct Line {
    label: &'static str,
    color: RGBColor,
    width: u32,
    dashed: bool,
    segments: Vec<Vec<(f64, f64)>>,
}

impl Line {
    /// Its legend entry, if it has anything to draw.
    fn legend(&self) -> Option<LegendEntry> {
        let swatch = Swatch::Line { color: self.color, width: self.width, dashed: self.dashed };
        (!self.segments.is_empty()).then_some(LegendEntry { label: self.label, swatch })
    }

    fn new(label: &'static str, color: RGBColor, seconds: &[Second], value: impl Fn(&Second) -> Option<f64>) -> Self {
        Self { label, color, width: 2, dashed: false, segments: segments(seconds, value) }
    }

    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.segments.iter().flatten().map(|(_, y)| *y)
    }
}

/// One line of the legend.
#[derive(Debug, Clone, Copy)]
struct LegendEntry {
    label: &'static str,
    swatch: Swatch,
}

/// What a legend entry shows beside its label.
#[derive(Debug, Clone, Copy)]
enum Swatch {
    Line { color: RGBColor, width: u32, dashed: bool },
    Area(RGBAColor),
}

/// The runs of consecutive seconds that have a value, as (middle of the second, value).
fn segments(seconds: &[Second], value: impl Fn(&Second) -> Option<f64>) -> Vec<Vec<(f64, f64)>> {
    let mut segments = Vec::new();
    let mut current = Vec::new();
    for (index, second) in seconds.iter().enumerate() {
        match value(second) {
            Some(y) => current.push((index as f64 + 0.5, y)),
            None if current.is_empty() => {}
            None => segments.push(std::mem::take(&mut current)),
        }
    }
    if !current.is_empty() {
        segments.push(current);
    }
    segments
}

/// Messages sent and delivered per second, with the target rate if there was one.
///
/// # Errors
///
/// [`ChartError`] if plotters fails to draw (it draws into a string: not expected).
pub(super) fn throughput_svg(report: &Report, timeline: &Timeline) -> Result<String, ChartError> {
    let seconds = &timeline.seconds;
    let phases = Phases::of(report);
    let mut lines = vec![
        Line::new("sent", TAB_BLUE, seconds, |second| Some(second.sent as f64)),
        Line::new("delivered", TAB_ORANGE, seconds, |second| Some(second.delivered as f64)),
    ];
    let x_end = phases.axis_end(seconds.len());
    if report.rate > 0 {
        let rate = report.rate as f64;
        lines.push(Line {
            label: "target rate",
            color: TAB_GREY,
            width: 1,
            dashed: true,
            segments: vec![vec![(0.0, rate), (x_end, rate)]],
        });
    }
    let highest = lines.iter().flat_map(Line::values).fold(0.0, f64::max);
    let y_end = (highest * 1.15).max(1.0);
    let caption = format!("{}: messages per second (sends by send time, deliveries by arrival)", report.label);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw_chart(&root, &caption, phases, x_end, 0.0..y_end, (0.0, y_end), "messages / s", &lines)?;
        root.present().map_err(chart_error)?;
    }
    Ok(svg)
}

/// Send → deliver latency p50, p99, p99.9 and max per send second, in milliseconds; with
/// several endpoints also p99 of same-endpoint and cross-endpoint pairs.
///
/// # Errors
///
/// [`ChartError`] if plotters fails to draw (it draws into a string: not expected).
pub(super) fn latency_svg(report: &Report, timeline: &Timeline) -> Result<String, ChartError> {
    let seconds = &timeline.seconds;
    let phases = Phases::of(report);
    let ms = |micros: u64| micros as f64 / 1_000.0;
    let mut lines = vec![
        Line {
            width: 1,
            ..Line::new("max", TAB_GREY, seconds, |s| (s.latency.count > 0).then(|| ms(s.latency.max_us)))
        },
        Line::new("p99.9", TAB_RED, seconds, |s| (s.latency.count > 0).then(|| ms(s.latency.p999_us))),
        Line::new("p99", TAB_ORANGE, seconds, |s| (s.latency.count > 0).then(|| ms(s.latency.p99_us))),
        Line::new("p50", TAB_BLUE, seconds, |s| (s.latency.count > 0).then(|| ms(s.latency.p50_us))),
    ];
    if report.endpoints > 1 {
        let same = |s: &Second| (s.same_endpoint_latency.count > 0).then(|| ms(s.same_endpoint_latency.p99_us));
        let cross = |s: &Second| (s.cross_endpoint_latency.count > 0).then(|| ms(s.cross_endpoint_latency.p99_us));
        let by_pair = [
            Line::new("p99 same-endpoint", TAB_GREEN, seconds, same),
            Line::new("p99 cross-endpoint", TAB_PURPLE, seconds, cross),
        ];
        for line in by_pair {
            if !line.segments.is_empty() {
                lines.push(Line { dashed: true, ..line });
            }
        }
    }
    let (lowest, highest) =
        lines.iter().flat_map(Line::values).fold((f64::INFINITY, 0.0_f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let x_end = phases.axis_end(seconds.len());
    let mut caption = format!("{}: send → deliver latency by send second", report.label);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        if highest <= 0.0 {
            caption.push_str(" (nothing delivered)");
            draw_chart(&root, &caption, phases, x_end, 0.0..1.0, (0.0, 1.0), "ms", &lines)?;
        } else if use_log_scale(lowest, highest) {
            caption.push_str(", log scale");
            let (y_start, y_end) = (lowest / 1.5, highest * 1.5);
            let (labelled, grid) = log_ticks(y_start, y_end);
            let y_spec = (y_start..y_end).log_scale().with_key_points(labelled).with_light_points(grid);
            draw_chart(&root, &caption, phases, x_end, y_spec, (y_start, y_end), "ms", &lines)?;
        } else {
            let y_end = highest * 1.15;
            draw_chart(&root, &caption, phases, x_end, 0.0..y_end, (0.0, y_end), "ms", &lines)?;
        }
        root.present().map_err(chart_error)?;
    }
    Ok(svg)
}

/// Whether latencies from `lowest` to `highest` read better on a logarithmic axis.
fn use_log_scale(lowest: f64, highest: f64) -> bool {
    lowest > 0.0 && highest / lowest > LOG_SCALE_RATIO
}

/// Ticks of a logarithmic axis from `start` to `end` (both above 0): labelled ones at 1, 2
/// and 5 times each power of ten (only the powers when the axis spans more than three
/// decades, lest labels crowd), and grid lines at every whole multiple of them.
fn log_ticks(start: f64, end: f64) -> (Vec<f64>, Vec<f64>) {
    let few = end / start > 1_000.0;
    let (mut labelled, mut grid) = (Vec::new(), Vec::new());
    let mut power = 10_f64.powf(start.log10().floor());
    while power <= end {
        for multiple in 1..10 {
            let value = power * f64::from(multiple);
            if (start..=end).contains(&value) {
                grid.push(value);
                if multiple == 1 || (!few && (multiple == 2 || multiple == 5)) {
                    labelled.push(value);
                }
            }
        }
        power *= 10.0;
    }
    (labelled, grid)
}

/// Draws one chart: axes, the phases shaded, the lines and their legend. `y_spec` is a
/// linear or a logarithmic range over `y_bounds`.
#[allow(clippy::too_many_arguments, reason = "one private helper for both charts; a struct would only rename them")]
fn draw_chart<Y>(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    phases: Phases,
    x_end: f64,
    y_spec: Y,
    (y_start, y_end): (f64, f64),
    y_desc: &str,
    lines: &[Line],
) -> Result<(), ChartError>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    root.fill(&WHITE).map_err(chart_error)?;
    let area = root.titled(caption, (FONT, 18)).map_err(chart_error)?;
    let (plot, legend_area) = area.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot)
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..x_end, y_spec)
        .map_err(chart_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since sending started")
        .y_desc(y_desc)
        .x_label_formatter(&|x| trim_number(*x))
        .y_label_formatter(&|y| trim_number(*y))
        .label_style((FONT, 13))
        .light_line_style(RGBAColor(0, 0, 0, 0.04))
        .draw()
        .map_err(chart_error)?;
    let mut legend = Vec::new();
    let shades = [
        (0.0, phases.warmup_end, WARMUP_SHADE, "warm-up (not in figures)"),
        (phases.window_end, x_end, DRAIN_SHADE, "drain (no new sends)"),
    ];
    for (start, end, color, label) in shades {
        if end > start {
            let area = Rectangle::new([(start, y_start), (end, y_end)], color.filled());
            chart.draw_series(std::iter::once(area)).map_err(chart_error)?;
            legend.push(LegendEntry { label, swatch: Swatch::Area(color) });
        }
    }
    for line in lines {
        draw_line(&mut chart, line)?;
    }
    legend.extend(lines.iter().filter_map(Line::legend));
    draw_legend(&legend_area, &legend)
}

/// The legend, one entry a row from the top of its strip.
fn draw_legend(area: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[LegendEntry]) -> Result<(), ChartError> {
    let text = TextStyle::from((FONT, 13)).pos(Pos::new(HPos::Left, VPos::Center));
    for (row, entry) in (0_i32..).zip(entries) {
        let y = 30 + 22 * row;
        match entry.swatch {
            Swatch::Area(color) => area.draw(&Rectangle::new([(4, y - 7), (28, y + 7)], color.filled())),
            Swatch::Line { color, width, dashed: false } => {
                area.draw(&PathElement::new(vec![(4, y), (28, y)], color.stroke_width(width)))
            }
            Swatch::Line { color, width, dashed: true } => {
                [(4, 10), (15, 21), (26, 28)].into_iter().try_for_each(|(x0, x1)| {
                    area.draw(&PathElement::new(vec![(x0, y), (x1, y)], color.stroke_width(width)))
                })
            }
        }
        .map_err(chart_error)?;
        area.draw(&Text::new(entry.label, (36, y), text.clone())).map_err(chart_error)?;
    }
    Ok(())
}

type Chart<'a, 'b, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, Y>>;

fn draw_line<'a, 'b: 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'a, 'b, Y>,
    line: &Line,
) -> Result<(), ChartError> {
    let style = line.color.stroke_width(line.width);
    for segment in &line.segments {
        let points = segment.iter().copied();
        if line.dashed {
            chart.draw_series(DashedLineSeries::new(points, 7, 5, style))
        } else {
            chart.draw_series(LineSeries::new(points, style))
        }
        .map_err(chart_error)?;
    }
    Ok(())
}

/// A number for an axis label: three significant digits, trailing zeros dropped (`0.25`,
/// `0.0007`, `4`, `12.5`, `1500`).
fn trim_number(value: f64) -> String {
    let magnitude = if value == 0.0 { 0.0 } else { value.abs().log10().floor() };
    let decimals = (2.0 - magnitude).clamp(0.0, 6.0) as usize;
    let text = format!("{value:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    if text == "-0" { "0".to_owned() } else { text.to_owned() }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::loadgen::LatencySummary;

    #[test]
    fn lines_break_where_a_second_has_no_value() {
        let second =
            |count| Second { latency: LatencySummary { count, ..LatencySummary::default() }, ..Second::default() };
        let seconds = [second(1), second(2), second(0), second(0), second(3), second(0)];
        let value = |s: &Second| (s.latency.count > 0).then_some(s.latency.count as f64);
        assert_eq!(segments(&seconds, value), vec![vec![(0.5, 1.0), (1.5, 2.0)], vec![(4.5, 3.0)]]);
        assert!(segments(&[], value).is_empty());
    }

    #[test]
    fn a_wide_latency_range_gets_a_log_axis() {
        assert!(!use_log_scale(1.0, 15.0));
        assert!(use_log_scale(0.8, 120.0));
        assert!(!use_log_scale(0.0, 0.0));
    }

    #[test]
    fn phases_follow_the_warmup_and_the_window() {
        let report =
            Report { warmup: Duration::from_secs(2), duration: Duration::from_millis(2_500), ..Report::default() };
        let phases = Phases::of(&report);
        let names: Vec<_> = (0..6).map(|second| phases.name(second)).collect();
        assert_eq!(names, ["warmup", "warmup", "window", "window", "window", "drain"]);
        assert_eq!(phases.axis_end(3), 5.0, "the axis spans the window even if data ends early");
        assert_eq!(phases.axis_end(7), 7.0);
    }

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(trim_number(0.25), "0.25");
        assert_eq!(trim_number(0.30000000000000004), "0.3");
        assert_eq!(trim_number(0.0007), "0.0007");
        assert_eq!(trim_number(4.0), "4");
        assert_eq!(trim_number(12.5), "12.5");
        assert_eq!(trim_number(1500.0), "1500");
        assert_eq!(trim_number(0.0), "0");
    }

    #[test]
    fn log_axes_are_labelled_at_one_two_five() {
        let (labelled, grid) = log_ticks(0.15, 30.0);
        let labels: Vec<_> = labelled.iter().map(|value| trim_number(*value)).collect();
        assert_eq!(labels, ["0.2", "0.5", "1", "2", "5", "10", "20"]);
        assert_eq!(grid.len(), 8 + 9 + 3, "0.2..0.9, 1..9, 10..30");
        let (labelled, _) = log_ticks(0.009, 60_000.0);
        let labels: Vec<_> = labelled.iter().map(|value| trim_number(*value)).collect();
        assert_eq!(labels, ["0.01", "0.1", "1", "10", "100", "1000", "10000"], "powers only over many decades");
    }
}
