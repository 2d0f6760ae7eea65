//! The report directory of `herald-loadgen --report DIR`, so a run can be looked at, not
//! only read. DIR (created if needed) gets:
//!
//! - `throughput.svg`: messages sent and delivered per second, the target rate dashed;
//! - `latency.svg`: send → deliver p50, p99, p99.9 and max per send second, in ms (log
//!   scale when the range is wide), with several endpoints also p99 by kind of pair;
//! - `summary.json`: the run's `parameters`, its final `figures` (the keys of the JSON line
//!   `herald-loadgen` prints) and the `per_second` series the charts are drawn from;
//! - `index.html`: both charts above the summary tables, so `xdg-open DIR/index.html`
//!   shows the run.
//!
//! In both charts second 0 is the start of sending; the warm-up, which the final figures
//! leave out, is shaded grey, the drain after the window pale yellow. Everything is written
//! from a finished [`Report`] whose run kept its [`Timeline`]: nothing here runs during the
//! load.

use std::{
    fs,
    path::{Path, PathBuf},
};

use serde_json::{Map, Value, json};

use super::{
    LatencySummary, Report, Timeline,
    charts::{self, Phases},
    stats::format_us,
};

/// The throughput chart's file name.
pub const THROUGHPUT_SVG: &str = "throughput.svg";
/// The latency chart's file name.
pub const LATENCY_SVG: &str = "latency.svg";
/// The summary's file name.
pub const SUMMARY_JSON: &str = "summary.json";
/// The page's file name.
pub const INDEX_HTML: &str = "index.html";

/// The keys of [`Report::to_json`] that say how the run was set up; every other key is
/// something it measured.
const PARAMETER_KEYS: [&str; 12] = [
    "label",
    "url",
    "endpoints",
    "pairs",
    "cross_endpoint_pairs",
    "encoding",
    "users",
    "rate",
    "in_flight",
    "body_bytes",
    "warmup_s",
    "duration_s",
];

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The directory or a file in it could not be written.
    #[error("cannot write the report at {}: {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The run did not keep its per-second series.
    #[error("the run kept no per-second timeline; run it with LoadConfig::timeline set")]
    NoTimeline,
    /// plotters failed to draw a chart (into a string: a bug, not the user's doing).
    #[error("drawing {file} failed: {message}")]
    Chart {
        /// The chart's file name.
        file: &'static str,
        /// plotters' error.
        message: String,
    },
}

/// A relay run the main run was compared with (`--compare-relay`), for the main page.
#[derive(Debug, Clone, Copy)]
pub struct Comparison<'a> {
    /// Where the relay run's own report is, relative to the main one (e.g. `relay`).
    pub relay_dir: &'a str,
    /// The relay run.
    pub relay: &'a Report,
    /// Main run divided by relay run: `delivered_per_s`, `latency_p50`, `latency_p99`,
    /// `latency_p999`.
    pub ratio: &'a Value,
}

/// Writes the report of `report` into `dir`, creating it if needed; files already there
/// are replaced.
///
/// # Errors
///
/// [`ReportError::NoTimeline`] if the run was not asked to keep its per-second series,
/// [`ReportError::Io`] if the directory or a file cannot be written.
pub fn write(dir: &Path, report: &Report, comparison: Option<Comparison<'_>>) -> Result<(), ReportError> {
    let timeline = report.timeline.as_ref().ok_or(ReportError::NoTimeline)?;
    let chart_error =
        |file: &'static str| move |error: charts::ChartError| ReportError::Chart { file, message: error.to_string() };
    let throughput = charts::throughput_svg(report, timeline).map_err(chart_error(THROUGHPUT_SVG))?;
    let latency = charts::latency_svg(report, timeline).map_err(chart_error(LATENCY_SVG))?;
    let summary = summary_json(report, timeline, comparison);
    fs::create_dir_all(dir).map_err(|source| ReportError::Io { path: dir.to_owned(), source })?;
    let files = [
        (THROUGHPUT_SVG, throughput),
        (LATENCY_SVG, latency),
        (SUMMARY_JSON, format!("{summary:#}\n")),
        // Last: the page shows the files above.
        (INDEX_HTML, index_html(report, comparison)),
    ];
    for (name, contents) in files {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|source| ReportError::Io { path, source })?;
    }
    Ok(())
}

/// What `summary.json` holds: `parameters`, `figures`, `per_second`, `charts`, and with a
/// comparison `relay`.
fn summary_json(report: &Report, timeline: &Timeline, comparison: Option<Comparison<'_>>) -> Value {
    let mut parameters = Map::new();
    let mut figures = Map::new();
    if let Value::Object(all) = report.to_json() {
        for (key, value) in all {
            let into = if PARAMETER_KEYS.contains(&key.as_str()) { &mut parameters } else { &mut figures };
            into.insert(key, value);
        }
    }
    let phases = Phases::of(report);
    let per_second: Vec<Value> = timeline
        .seconds
        .iter()
        .enumerate()
        .map(|(index, second)| {
            let mut value = json!({
                "second": index,
                "phase": phases.name(index),
                "sent": second.sent,
                "delivered": second.delivered,
                "latency": second.latency.to_json(),
            });
            if report.endpoints > 1 {
                value["same_endpoint_latency"] = second.same_endpoint_latency.to_json();
                value["cross_endpoint_latency"] = second.cross_endpoint_latency.to_json();
            }
            value
        })
        .collect();
    let mut summary = json!({
        "parameters": parameters,
        "figures": figures,
        "per_second": per_second,
        "charts": { "throughput": THROUGHPUT_SVG, "latency": LATENCY_SVG },
    });
    if let Some(comparison) = comparison {
        summary["relay"] = json!({
            "summary": format!("{}/{SUMMARY_JSON}", comparison.relay_dir),
            "delivered_per_s": comparison.relay.delivered_per_second().round(),
            "ratio": comparison.ratio,
        });
    }
    summary
}

/// The page: both charts, then the run's setup and figures, then its text as printed.
fn index_html(report: &Report, comparison: Option<Comparison<'_>>) -> String {
    let label = escape(&report.label);
    let rate = if report.rate == 0 { "as fast as possible".to_owned() } else { format!("{} msg/s", report.rate) };
    let comparison = comparison.map(comparison_html).unwrap_or_default();
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>herald-loadgen: {label}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em auto; max-width: 1000px; padding: 0 1em; color: #222; }}
img {{ display: block; max-width: 100%; height: auto; border: 1px solid #ddd; margin: 0.5em 0 1.5em; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ padding: 0.25em 0.8em; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }}
td.number, th.number {{ text-align: right; font-variant-numeric: tabular-nums; }}
pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; }}
.note {{ color: #555; }}
</style>
</head>
<body>
<h1>herald-loadgen: {label}</h1>
<p>{users} users against {url}, {rate}: {warmup} s of warm-up, then a {window} s window.</p>
<p class="note">Time runs from the start of sending. Grey: the warm-up, left out of the
figures below; pale yellow: the drain after the window (no new sends). Sends count in the
second they were sent (in rate mode: scheduled), deliveries in the second they arrived,
latency in the second the message was sent.</p>
<h2>Throughput</h2>
<img src="{THROUGHPUT_SVG}" alt="messages sent and delivered per second">
<h2>Latency</h2>
<img src="{LATENCY_SVG}" alt="send to deliver latency percentiles per second">
<h2>Summary</h2>
{run_table}
{latency_table}
{comparison}<h2>As printed</h2>
<pre>{text}</pre>
<p class="note">The same figures and the per-second series: <a href="{SUMMARY_JSON}">{SUMMARY_JSON}</a>.</p>
</body>
</html>
"#,
        users = report.users,
        url = escape(&report.url),
        warmup = report.warmup.as_secs_f64(),
        window = report.duration.as_secs_f64(),
        run_table = run_table(report),
        latency_table = latency_table(report),
        text = escape(&report.to_text()),
    )
}

/// The run's setup and counts, one row each.
fn run_table(report: &Report) -> String {
    let c = &report.counts;
    let mut rows = vec![
        ("target", escape(&report.url)),
        (
            "users",
            format!("{} of {} connected in {:.2} s", c.connected, report.users, report.connect_time.as_secs_f64()),
        ),
    ];
    if report.endpoints > 1 {
        rows.push((
            "endpoints",
            format!(
                "{}, users round-robin; {} pairs, {} across endpoints",
                report.endpoints, report.pairs, report.cross_endpoint_pairs
            ),
        ));
    }
    rows.extend([
        (
            "load",
            match report.rate {
                0 => format!("as fast as possible, at most {} messages in flight per user", report.in_flight),
                rate => format!("{rate} msg/s (at most {} in flight per user)", report.in_flight),
            },
        ),
        ("messages", format!("{} B bodies, {} encoding", report.body_bytes, report.encoding)),
        (
            "phases",
            format!(
                "{} s warm-up, {} s window, drained in {:.2} s{}",
                report.warmup.as_secs_f64(),
                report.duration.as_secs_f64(),
                report.drain_time.as_secs_f64(),
                if report.drained { "" } else { " (not drained: the drain timed out)" }
            ),
        ),
        (
            "throughput (window)",
            format!("sent {:.0} msg/s, delivered {:.0} msg/s", report.sent_per_second(), report.delivered_per_second()),
        ),
        (
            "sends",
            format!(
                "{} sent; send_ack OK {}, duplicate {}, rejected {}, retry {}; given up {}",
                c.sent, c.ack_ok, c.ack_duplicate, c.ack_rejected, c.ack_retry, c.given_up
            ),
        ),
        (
            "deliveries",
            format!(
                "{} delivered, {} acknowledged, {} duplicates, {} redelivered",
                c.delivered, c.deliver_acks, c.duplicates, c.redelivered
            ),
        ),
        (
            "errors",
            format!(
                "{} (connect failures {}, disconnects {}, server errors {}, corrupt {}, unexpected {})",
                c.errors, c.connect_failures, c.disconnects, c.server_errors, c.corrupt, c.unexpected
            ),
        ),
    ]);
    if let Some(rooms) = &report.rooms {
        rows.push((
            "rooms",
            format!(
                "{} rooms; {} of {} subscribers and {} of {} publishers connected; deliveries expected {}, \
                 received {}, missing {}; {} publisher messages heard by other publishers; {} freed by timeout",
                rooms.rooms,
                rooms.subscribers_connected,
                rooms.subscribers,
                rooms.publishers_connected,
                rooms.publishers,
                rooms.expected,
                rooms.received,
                rooms.missing,
                rooms.publisher_received,
                rooms.expired
            ),
        ));
    }
    if let Some(verification) = report.verification {
        rows.push((
            "ids",
            format!(
                "{} acked, {} delivered, {} missing, {} unacknowledged: {}",
                verification.acked_ids,
                verification.delivered_ids,
                verification.missing,
                verification.unacknowledged,
                if verification.is_exact() { "exact" } else { "MISMATCH" }
            ),
        ));
    }
    if let Some(error) = &report.first_error {
        rows.push(("first error", escape(error)));
    }
    let rows: String = rows.iter().map(|(name, value)| format!("<tr><th>{name}</th><td>{value}</td></tr>\n")).collect();
    format!("<table>\n{rows}</table>")
}

/// Latency percentiles over the window, one row per measure.
fn latency_table(report: &Report) -> String {
    let mut rows = vec![("send → deliver", report.latency)];
    if report.endpoints > 1 {
        rows.push(("same-endpoint pairs", report.same_endpoint_latency));
        rows.push(("cross-endpoint pairs", report.cross_endpoint_latency));
    }
    rows.push(("send → send_ack", report.ack_latency));
    if let Some(lag) = report.send_lag {
        rows.push(("generator lag behind schedule", lag));
    }
    let row = |(name, latency): &(&str, LatencySummary)| {
        let cells: String = [latency.p50_us, latency.p90_us, latency.p99_us, latency.p999_us, latency.max_us]
            .into_iter()
            .map(|micros| format!("<td class=\"number\">{}</td>", format_us(micros)))
            .collect();
        format!("<tr><th>{name}</th>{cells}<td class=\"number\">{}</td></tr>\n", latency.count)
    };
    let rows: String = rows.iter().map(row).collect();
    format!(
        "<table>\n<tr><th>latency (window)</th><th class=\"number\">p50</th><th class=\"number\">p90</th>\
         <th class=\"number\">p99</th><th class=\"number\">p99.9</th><th class=\"number\">max</th>\
         <th class=\"number\">samples</th></tr>\n{rows}</table>"
    )
}

/// The section comparing the run with the relay's.
fn comparison_html(comparison: Comparison<'_>) -> String {
    let ratio = |key: &str| comparison.ratio[key].to_string();
    let relay_dir = escape(comparison.relay_dir);
    format!(
        "<h2>Compared with a trivial relay</h2>\n<table>\n\
         <tr><th>relay throughput</th><td>{relay_rate:.0} msg/s delivered (<a href=\"{relay_dir}/{INDEX_HTML}\">its report</a>)</td></tr>\n\
         <tr><th>this run / relay</th><td>throughput ×{throughput}, latency p50 ×{p50}, p99 ×{p99}, p99.9 ×{p999}</td></tr>\n\
         </table>\n",
        relay_rate = comparison.relay.delivered_per_second(),
        throughput = ratio("delivered_per_s"),
        p50 = ratio("latency_p50"),
        p99 = ratio("latency_p99"),
        p999 = ratio("latency_p999"),
    )
}

/// `text` safe inside HTML elements and quoted attributes.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::loadgen::{Second, stats::CountSnapshot};

    /// 2 s of warm-up, a 10 s window and 1 s of drain, at 1,000 msg/s over two endpoints,
    /// with a latency spike in second 6 (wide enough for a log axis).
    fn synthetic_report(label: &str) -> Report {
        let latency = |p50_us: u64, count: u64| LatencySummary {
            count,
            p50_us,
            p90_us: p50_us * 2,
            p99_us: p50_us * 4,
            p999_us: p50_us * 8,
            max_us: p50_us * 10,
            mean_us: p50_us as f64 * 1.2,
        };
        let seconds = (0..13)
            .map(|second| {
                let sent = if second < 12 { 1_000 } else { 0 };
                let delivered = if second == 0 {
                    990
                } else if second == 12 {
                    10
                } else {
                    1_000
                };
                let p50 = if second == 6 { 40_000 } else { 900 };
                Second {
                    sent,
                    delivered,
                    latency: latency(p50, sent),
                    same_endpoint_latency: latency(p50, sent / 2),
                    cross_endpoint_latency: latency(p50 + 200, sent / 2),
                }
            })
            .collect();
        Report {
            label: label.to_owned(),
            url: "ws://127.0.0.1:7400/v1/ws,ws://127.0.0.1:7410/v1/ws".to_owned(),
            endpoints: 2,
            pairs: 500,
            cross_endpoint_pairs: 250,
            encoding: "proto",
            users: 1000,
            rate: 1000,
            in_flight: 16,
            body_bytes: 64,
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            drain_time: Duration::from_millis(300),
            drained: true,
            counts: CountSnapshot {
                connected: 1000,
                sent: 12_000,
                window_sent: 10_000,
                delivered: 12_000,
                window_delivered: 10_000,
                ..CountSnapshot::default()
            },
            latency: latency(950, 10_000),
            ack_latency: latency(400, 10_000),
            send_lag: Some(latency(20, 10_000)),
            timeline: Some(Timeline { seconds }),
            ..Report::default()
        }
    }

    /// Every tag opened is closed, in order: the file parses as XML as far as tags go.
    fn assert_tags_balance(xml: &str) {
        let mut open = Vec::new();
        let mut rest = xml;
        while let Some(start) = rest.find('<') {
            let end = start + rest[start..].find('>').expect("every tag ends");
            let tag = &rest[start + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name.trim().to_owned()), "closing tag out of order");
            } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
                open.push(tag.split_whitespace().next().expect("tag name").to_owned());
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "tags left open: {open:?}");
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    #[test]
    fn report_dir_holds_two_charts_a_summary_and_a_page() {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = temp.path().join("runs").join("steady");
        let report = synthetic_report("herald <3 nodes>");
        write(&dir, &report, None).expect("report written");

        for chart in [THROUGHPUT_SVG, LATENCY_SVG] {
            let svg = read(&dir.join(chart));
            assert!(svg.starts_with("<svg"), "{chart}: {}", &svg[..svg.len().min(80)]);
            assert!(svg.trim_end().ends_with("</svg>"), "{chart}");
            assert!(svg.contains("<polyline"), "{chart} draws lines");
            assert!(svg.contains("<rect"), "{chart} shades the warm-up");
            assert!(svg.contains("warm-up"), "{chart} has a legend");
            assert_tags_balance(&svg);
        }
        let latency = read(&dir.join(LATENCY_SVG));
        assert!(latency.contains("log scale"), "0.9 ms to 400 ms is drawn on a log axis");
        assert!(latency.contains("p99 cross-endpoint"), "two endpoints: p99 by kind of pair");

        let summary: Value = serde_json::from_str(&read(&dir.join(SUMMARY_JSON))).expect("summary is JSON");
        let parameters = &summary["parameters"];
        assert_eq!(parameters["users"], 1000);
        assert_eq!(parameters["rate"], 1000);
        assert_eq!(parameters["warmup_s"], 2.0);
        assert_eq!(parameters["duration_s"], 10.0);
        assert_eq!(parameters["label"], "herald <3 nodes>");
        let figures = &summary["figures"];
        assert_eq!(figures["delivered_per_s"], 1000.0);
        assert_eq!(figures["latency"]["p99_us"], 3800);
        assert_eq!(figures["counts"]["errors"], 0);
        assert!(figures.get("users").is_none(), "parameters are not repeated among the figures");
        let per_second = summary["per_second"].as_array().expect("per_second");
        assert_eq!(per_second.len(), 13);
        assert_eq!(
            (per_second[1]["phase"].as_str(), per_second[2]["phase"].as_str()),
            (Some("warmup"), Some("window"))
        );
        assert_eq!(per_second[12]["phase"], "drain");
        assert_eq!(per_second[6]["latency"]["p50_us"], 40_000);
        assert_eq!(per_second[6]["cross_endpoint_latency"]["p50_us"], 40_200);
        assert!(summary.get("relay").is_none());

        let page = read(&dir.join(INDEX_HTML));
        assert!(page.contains(r#"<img src="throughput.svg""#) && page.contains(r#"<img src="latency.svg""#));
        assert!(page.contains("herald &lt;3 nodes&gt;") && !page.contains("herald <3"), "the label is escaped");
        assert!(page.contains("cross-endpoint pairs") && page.contains("generator lag"));
        assert!(page.starts_with("<!doctype html>") && page.trim_end().ends_with("</html>"));
    }

    #[test]
    fn a_comparison_links_the_relay_report() {
        let temp = tempfile::tempdir().expect("temp dir");
        let (report, relay) = (synthetic_report("herald"), synthetic_report("relay"));
        write(&temp.path().join("relay"), &relay, None).expect("relay report written");
        let ratio = json!({"delivered_per_s": 0.5, "latency_p50": 2.0, "latency_p99": 3.0, "latency_p999": 4.0});
        let comparison = Comparison { relay_dir: "relay", relay: &relay, ratio: &ratio };
        write(temp.path(), &report, Some(comparison)).expect("report written");
        let summary: Value = serde_json::from_str(&read(&temp.path().join(SUMMARY_JSON))).expect("JSON");
        assert_eq!(summary["relay"]["summary"], "relay/summary.json");
        assert_eq!(summary["relay"]["ratio"]["latency_p99"], 3.0);
        let page = read(&temp.path().join(INDEX_HTML));
        assert!(page.contains(r#"<a href="relay/index.html">"#), "{page}");
        assert!(page.contains("throughput ×0.5"), "{page}");
        assert!(temp.path().join("relay").join(INDEX_HTML).is_file());
    }

    #[test]
    fn a_run_without_its_timeline_has_no_report() {
        let temp = tempfile::tempdir().expect("temp dir");
        let report = Report { timeline: None, ..synthetic_report("herald") };
        assert!(matches!(write(temp.path(), &report, None), Err(ReportError::NoTimeline)));
    }

    #[test]
    fn an_empty_run_still_draws_its_axes() {
        let temp = tempfile::tempdir().expect("temp dir");
        let report = Report { timeline: Some(Timeline::default()), ..Report::default() };
        write(temp.path(), &report, None).expect("report written");
        let latency = read(&temp.path().join(LATENCY_SVG));
        assert!(latency.starts_with("<svg") && latency.contains("nothing delivered"));
        assert_tags_balance(&latency);
    }
}
