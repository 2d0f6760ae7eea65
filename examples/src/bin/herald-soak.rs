//! `herald-soak`: the soak test. Drives a running Herald (`--dev`, on this machine) with
//! mixed traffic, connection churn, reconnect storms and plugin hot reloads for a while,
//! samples the server's memory, fds, tasks and map sizes, and fails when one keeps growing
//! or connection-bound state does not drain once every client has left. See
//! `herald_examples::soak`; `scripts/soak.sh` starts a server and runs it.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a command-line program reports on stdout")]

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use clap::Parser;
use herald_examples::{
    duration::parse_duration,
    soak::{self, SoakConfig, Tolerance, Tolerances},
    target::check_target,
};

/// Soak test of a Herald server in --dev mode: hours-long mixed traffic with churn, storms
/// and hot reloads; fails on a growing trend.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The server's WebSocket URL (loopback, ws://); its HTTP API is on the same port.
    #[arg(long, default_value = "ws://127.0.0.1:7095/v1/ws")]
    url: String,
    /// The server's process id (its /proc/PID is sampled).
    #[arg(long)]
    pid: u32,
    /// How long traffic runs (e.g. 30m, 2m, 90s).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    duration: Duration,
    /// Time between two samples.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    sample_every: Duration,
    /// Samples before this are left out of the trends (default: the first 20 % of the run,
    /// and at least twice --max-user-age, by when the load is steady).
    #[arg(long, value_parser = parse_duration)]
    warmup: Option<Duration>,
    /// Client slots; each holds one connection at a time.
    #[arg(long, default_value_t = 200)]
    users: usize,
    /// Messages per second over all clients.
    #[arg(long, default_value_t = 300.0)]
    rate: f64,
    /// Mean lifetime of a connection before it churns (each lasts 0.25–1.75× it).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    lifetime: Duration,
    /// Share of reconnects that come back as a brand-new user.
    #[arg(long, default_value_t = 0.2)]
    new_user_share: f64,
    /// Share of reconnects that come back as a new device of the same user.
    #[arg(long, default_value_t = 0.1)]
    new_device_share: f64,
    /// A user this old comes back as a new user at its next churn; 0 for no limit. The
    /// server's state per user grows with its age (conversations, groups, the history a
    /// new device is backfilled): the limit keeps the load steady once the warm-up is over.
    #[arg(long, default_value = "4m", value_parser = parse_duration)]
    max_user_age: Duration,
    /// Mean time between two pulls (sync, history, room change) of one client.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pull_every: Duration,
    /// Rooms at any one time; a new set replaces them every --room-period.
    #[arg(long, default_value_t = 8)]
    rooms: usize,
    /// How long one set of rooms lasts.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    room_period: Duration,
    /// Announcements per second through the HTTP API.
    #[arg(long, default_value_t = 5.0)]
    announce_rate: f64,
    /// Time between two rounds of group changes (create one, change a member, read one).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    group_every: Duration,
    /// Time between two reconnect storms (every connection dropped at once); 0 for none.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    storm_every: Duration,
    /// Samples this long after a storm are left out of the trends.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    storm_settle: Duration,
    /// The server's plugins folder: a plugin's manifest there is rewritten every
    /// --reload-every so the server hot-reloads it.
    #[arg(long)]
    plugins_dir: Option<PathBuf>,
    /// The plugin to reload (default: room-rate-limit, else the first with a manifest).
    #[arg(long)]
    plugin: Option<String>,
    /// Time between two hot reloads; 0 for none.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    reload_every: Duration,
    /// API key.
    #[arg(long, default_value = "dev-key")]
    api_key: String,
    /// Admin key.
    #[arg(long, default_value = "dev-key")]
    admin_key: String,
    /// Connections opened at once.
    #[arg(long, default_value_t = 64)]
    connect_concurrency: usize,
    /// Allowed growth of the server's RSS over the steady window: REL%+MiB.
    #[arg(long, default_value = "10%+8")]
    rss_tolerance: Tolerance,
    /// Allowed growth of its open fds: REL%+fds.
    #[arg(long, default_value = "5%+16")]
    fd_tolerance: Tolerance,
    /// Allowed growth of its live tasks: REL%+tasks.
    #[arg(long, default_value = "10%+64")]
    task_tolerance: Tolerance,
    /// Allowed growth of each map and connection gauge: REL%+entries.
    #[arg(long, default_value = "10%+32")]
    map_tolerance: Tolerance,
    /// Maps (herald_map_entries labels) that must come back to their value before the soak
    /// once every client has left: connection-bound ones, those forgotten after an idle
    /// time, and the pushes waiting for an ack (each settles at the end of its wait).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "connections,sessions,parked_sessions,routes,rooms,room_subscriptions,\
                         dedup_marks,seq_conversations,lanes,known_direct,group_lists,retry_timers"
    )]
    drain_maps: Vec<String>,
    /// How far above their value before the soak live tasks and open fds may stay.
    #[arg(long, default_value_t = 32.0)]
    drain_slack: f64,
    /// How long the drain may take: more than the server's reconnect grace and twice its
    /// dedup TTL and idle eviction time.
    #[arg(long, default_value = "150s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Folder for soak.csv (one column per series, rewritten after every sample) and
    /// summary.txt.
    #[arg(long)]
    report: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = check_target(&args.url, false) {
        eprintln!("herald-soak: {error}");
        return ExitCode::from(2);
    }
    if !args.url.starts_with("ws://") {
        eprintln!("herald-soak: the soak speaks plain HTTP to the server's API: use a ws:// URL");
        return ExitCode::from(2);
    }
    if args.rate <= 0.0 || args.users < 2 || args.sample_every.is_zero() {
        eprintln!("herald-soak: --rate must be positive, --users at least 2, --sample-every more than 0");
        return ExitCode::from(2);
    }
    let config = SoakConfig {
        url: args.url,
        pid: args.pid,
        duration: args.duration,
        sample_every: args.sample_every,
        warmup: args.warmup.unwrap_or((args.duration / 5).max(args.max_user_age * 2)),
        users: args.users,
        rate: args.rate,
        lifetime: args.lifetime,
        new_user_share: args.new_user_share,
        new_device_share: args.new_device_share,
        max_user_age: args.max_user_age,
        pull_every: args.pull_every,
        rooms: args.rooms,
        room_period: args.room_period,
        announce_rate: args.announce_rate,
        group_every: args.group_every,
        storm_every: args.storm_every,
        storm_settle: args.storm_settle,
        reload_every: args.reload_every,
        plugins_dir: args.plugins_dir,
        plugin: args.plugin,
        api_key: args.api_key,
        admin_key: args.admin_key,
        connect_concurrency: args.connect_concurrency,
        tolerances: Tolerances {
            rss: args.rss_tolerance,
            fds: args.fd_tolerance,
            tasks: args.task_tolerance,
            maps: args.map_tolerance,
        },
        drain_maps: args.drain_maps,
        drain_slack: args.drain_slack,
        drain_timeout: args.drain_timeout,
        report: args.report,
    };
    let outcome = match soak::run(config, Arc::new(|line: &str| println!("{line}"))).await {
        Ok(outcome) => outcome,
        Err(error) => {
            eprintln!("herald-soak: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!();
    print!("{}", outcome.render());
    let failures = outcome.failures();
    if failures.is_empty() {
        println!("\nherald-soak: PASSED: nothing grew beyond its tolerance and connection state drained");
        ExitCode::SUCCESS
    } else {
        println!();
        for failure in &failures {
            println!("herald-soak: FAILED: {failure}");
        }
        ExitCode::FAILURE
    }
}
