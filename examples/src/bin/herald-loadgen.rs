//! `herald-loadgen`: drives N users in pairs through a Herald server's WebSocket path and
//! reports throughput and send → deliver latency; with `--compare-relay`, runs the same
//! load against `herald-relay` and prints the ratio. Given several URLs (a cluster's
//! nodes), it spreads users over them round-robin and reports same-endpoint and
//! cross-endpoint pairs apart; with `--report DIR`, also writes charts and a page to look
//! at. With `--rooms R` it measures room fan-out instead: `--subscribers N` spread over R
//! rooms, publishers sending into them, deliveries per second over all subscribers and the
//! deliveries missing. See `herald_examples::loadgen`.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a command-line program reports on stdout")]

use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, ValueEnum};
use herald_examples::{
    duration::parse_duration,
    ids::random_tag,
    loadgen::{
        self, LoadConfig, Report, RoomLoad, TokenMode,
        relay_process::RelayProcess,
        report_dir::{self, Comparison},
    },
    target::check_target,
};
use herald_proto::Encoding;
use serde_json::json;

/// Load generator for Herald: N users in pairs over the real WebSocket path, or (--rooms)
/// subscribers in rooms and publishers sending into them.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The server's WebSocket URL. Several (comma-separated, or the flag repeated) are the
    /// nodes of a cluster: user i connects to URL i mod N.
    #[arg(long, value_delimiter = ',', default_value = "ws://127.0.0.1:7070/v1/ws")]
    url: Vec<String>,
    /// Simulated users (even: they pair up).
    #[arg(long, default_value_t = 1000)]
    users: usize,
    /// With several URLs: the least share (0 to 1) of pairs whose two users connect to
    /// different URLs, the rest on one. Default: user 2k pairs with 2k+1, so with
    /// round-robin every pair crosses.
    #[arg(long, value_parser = parse_share)]
    cross_node_share: Option<f64>,
    /// Room fan-out mode: --subscribers connections spread evenly over this many rooms
    /// (`room:` conversations) and --publishers sending into them; every delivery is timed
    /// and the expected ones (published × subscribers of the room) checked. --users and
    /// --cross-node-share are then not used.
    #[arg(long, value_name = "R")]
    rooms: Option<usize>,
    /// Room mode: subscriber connections over all rooms (subscriber i joins room i mod R).
    #[arg(long, value_name = "N", default_value_t = 1000, requires = "rooms")]
    subscribers: usize,
    /// Room mode: publisher connections (publisher j sends into room j mod R); default one
    /// per room.
    #[arg(long, value_name = "P", requires = "rooms")]
    publishers: Option<usize>,
    /// Total messages per second across all users (room mode: all publishers); 0 = as fast
    /// as possible with at most --in-flight undelivered messages per user (room mode: per
    /// publisher, a message being in flight until every subscriber of its room has it).
    #[arg(long, visible_alias = "publish-rate", default_value_t = 0)]
    rate: u64,
    /// Length of the measurement window (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before the window that is not measured.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Size of each message body in bytes (at least 16).
    #[arg(long, default_value_t = 64)]
    body_bytes: usize,
    /// Messages a user may have in flight (sent, not yet delivered to its partner; room
    /// mode: per publisher, not yet acknowledged and delivered to its whole room).
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Connections opened at once while users connect.
    #[arg(long, default_value_t = 64)]
    connect_concurrency: usize,
    /// Wire encoding (subprotocol herald.v1.proto or herald.v1.json).
    #[arg(long, value_enum, default_value_t = EncodingArg::Proto)]
    encoding: EncodingArg,
    /// How users get tokens: `dev` sends `dev:<user>` (server in --dev mode).
    #[arg(long, value_enum, default_value_t = TokenModeArg::Dev)]
    token_mode: TokenModeArg,
    /// User ids are <prefix>-<n>; random per run by default.
    #[arg(long)]
    user_prefix: Option<String>,
    /// Device id of every user.
    #[arg(long, default_value = "loadgen")]
    device: String,
    /// Longest wait for in-flight messages after the window.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    drain: Duration,
    /// Keep every message id and check that each one acknowledged OK was delivered, once.
    #[arg(long)]
    verify: bool,
    /// No progress display (it is also off when stderr is not a terminal).
    #[arg(long, short)]
    quiet: bool,
    /// Allow a URL that is not a loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// Also run the same load against a trivial relay and print the ratio.
    #[arg(long)]
    compare_relay: bool,
    /// Use this running relay for --compare-relay instead of starting herald-relay.
    #[arg(long)]
    relay_url: Option<String>,
    /// The herald-relay executable to start (default: next to this program).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Name of the main run in the report.
    #[arg(long, default_value = "herald")]
    label: String,
    /// Also write a report into DIR (created if needed): throughput.svg and latency.svg
    /// (per second, warm-up shaded), summary.json, and index.html showing them — open it
    /// with `xdg-open DIR/index.html`. With --compare-relay the relay's run goes to
    /// DIR/relay.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EncodingArg {
    Proto,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TokenModeArg {
    Dev,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("herald-loadgen: {message}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    for url in &args.url {
        check_target(url, args.allow_remote).map_err(|e| e.to_string())?;
    }
    if let Some(url) = &args.relay_url {
        check_target(url, args.allow_remote).map_err(|e| e.to_string())?;
    }
    let config = LoadConfig {
        label: args.label.clone(),
        urls: args.url.clone(),
        users: args.users,
        rooms: args.rooms.map(|rooms| RoomLoad {
            rooms,
            subscribers: args.subscribers,
            publishers: args.publishers.unwrap_or(rooms),
        }),
        cross_node_share: args.cross_node_share,
        rate: args.rate,
        duration: args.duration,
        warmup: args.warmup,
        body_bytes: args.body_bytes,
        in_flight: args.in_flight,
        connect_concurrency: args.connect_concurrency,
        encoding: match args.encoding {
            EncodingArg::Proto => Encoding::Proto,
            EncodingArg::Json => Encoding::Json,
        },
        token_mode: match args.token_mode {
            TokenModeArg::Dev => TokenMode::Dev,
        },
        user_prefix: args.user_prefix.clone().unwrap_or_else(|| format!("lg-{}", random_tag(6))),
        device: args.device.clone(),
        drain_timeout: args.drain,
        verify: args.verify,
        progress: !args.quiet && std::io::stderr().is_terminal(),
        timeline: args.report.is_some(),
        ..LoadConfig::default()
    };
    // Fail before a long run if the report could not be written.
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the report directory {}: {e}", dir.display()))?;
    }

    // Start the relay first, so a missing binary fails before a long run.
    let relay = if args.compare_relay && args.relay_url.is_none() {
        let path = match &args.relay_bin {
            Some(path) => path.clone(),
            None => RelayProcess::sibling_path().ok_or("cannot locate herald-relay; pass --relay-bin")?,
        };
        Some(RelayProcess::start(&path).await.map_err(|e| e.to_string())?)
    } else {
        None
    };

    let main_report = loadgen::run(config.clone()).await.map_err(|e| e.to_string())?;
    println!("{}", main_report.to_text());
    // Written now, so it is there even if the relay's run fails; again below with the ratio.
    if let Some(dir) = &args.report {
        write_report(dir, &main_report, None)?;
    }

    let relay_url = args.relay_url.clone().or_else(|| relay.as_ref().map(|relay| relay.url.clone()));
    let Some(relay_url) = relay_url.filter(|_| args.compare_relay) else {
        println!("{}", main_report.to_json());
        return Ok(exit_code(&[&main_report]));
    };

    // The relay is one process: every user connects to it, paired as with one server.
    let relay_config = LoadConfig {
        label: "relay".to_owned(),
        urls: vec![relay_url],
        cross_node_share: None,
        user_prefix: format!("lg-{}", random_tag(6)),
        ..config
    };
    let relay_report = loadgen::run(relay_config).await.map_err(|e| format!("relay run: {e}"))?;
    drop(relay);
    println!("{}", relay_report.to_text());
    let comparison = compare(&main_report, &relay_report);
    println!("{}", comparison_text(&comparison, &main_report.label));
    if let Some(dir) = &args.report {
        write_report(&dir.join(RELAY_DIR), &relay_report, None)?;
        let comparison = Comparison { relay_dir: RELAY_DIR, relay: &relay_report, ratio: &comparison };
        write_report(dir, &main_report, Some(comparison))?;
    }
    println!(
        "{}",
        json!({
            main_report.label.clone(): main_report.to_json(),
            "relay": relay_report.to_json(),
            "ratio": comparison,
        })
    );
    Ok(exit_code(&[&main_report, &relay_report]))
}

/// Where `--report DIR` puts the relay's run with `--compare-relay`.
const RELAY_DIR: &str = "relay";

/// Writes `report` into `dir` and says where on stderr: stdout's last line is the JSON
/// scripts read.
fn write_report(dir: &Path, report: &Report, comparison: Option<Comparison<'_>>) -> Result<(), String> {
    report_dir::write(dir, report, comparison).map_err(|e| e.to_string())?;
    eprintln!("herald-loadgen: {} report: {}", report.label, dir.join(report_dir::INDEX_HTML).display());
    Ok(())
}

/// A share between 0 and 1 (`0.5`, or `50%`).
fn parse_share(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.strip_suffix('%') {
        Some(percent) => (percent, 100.0),
        None => (text, 1.0),
    };
    let share = number.trim().parse::<f64>().map_err(|_| format!("`{text}` is not a number like 0.5 or 50%"))? / scale;
    if (0.0..=1.0).contains(&share) { Ok(share) } else { Err(format!("`{text}` is not between 0 and 1 (0% and 100%)")) }
}

/// Non-zero when a run delivered nothing: the figures would be meaningless.
fn exit_code(reports: &[&Report]) -> ExitCode {
    if reports.iter().any(|report| report.counts.delivered == 0) {
        eprintln!("herald-loadgen: nothing was delivered");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Main run divided by relay run, for throughput and latency percentiles.
fn compare(main: &Report, relay: &Report) -> serde_json::Value {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 { ((a / b) * 1000.0).round() / 1000.0 } else { 0.0 }
    };
    json!({
        "delivered_per_s": ratio(main.delivered_per_second(), relay.delivered_per_second()),
        "latency_p50": ratio(main.latency.p50_us as f64, relay.latency.p50_us as f64),
        "latency_p99": ratio(main.latency.p99_us as f64, relay.latency.p99_us as f64),
        "latency_p999": ratio(main.latency.p999_us as f64, relay.latency.p999_us as f64),
    })
}

fn comparison_text(comparison: &serde_json::Value, label: &str) -> String {
    format!(
        "{label}/relay: throughput x{} | latency p50 x{} p99 x{} p999 x{}",
        comparison["delivered_per_s"], comparison["latency_p50"], comparison["latency_p99"], comparison["latency_p999"],
    )
}
