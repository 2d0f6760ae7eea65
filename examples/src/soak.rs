//! The soak test behind `herald-soak`: mixed traffic against one running Herald (dev mode)
//! for a long time, with connection churn, reconnect storms and a plugin hot-reloaded every
//! so often, while the server's resident memory, open fds, live tasks and map sizes are
//! sampled. It fails when one of them keeps growing, and when connection-bound state does
//! not go back to where it started once every client has left.
//!
//! The parts: [`client`] (one churning client slot), [`api`] (groups, announcements and
//! history over HTTP), [`reload`] (the plugin hot reload, checked in `/admin/plugins`),
//! [`sample`] (what is measured, and the CSV), [`trend`] (the decision, pure arithmetic),
//! and [`world`] (what the tasks share).
//!
//! How it decides: samples of the first `warmup` and those within `storm_settle` of a storm
//! are left out; through the rest of each series a least-squares line is fitted, and the
//! growth it projects over that steady window must stay within the series' tolerance
//! (`relative × mean + absolute`). Then the drain check: with every client gone, the
//! connection-bound maps, and the maps the server forgets after an idle time, must come back
//! to their value before the soak within `drain_timeout` (a dropped connection's session
//! stays parked for the server's reconnect grace, an idle conversation is forgotten after
//! up to twice its idle time: the timeout must exceed both), and live tasks and open fds to
//! within `drain_slack` of it.

mod api;
mod client;
pub mod reload;
pub mod sample;
pub mod trend;
mod world;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    sync::{Semaphore, watch},
    time::Instant,
};

use crate::http;
use client::{Behaviour, Signals};
pub use reload::{ReloadError, Reloader};
pub use sample::{Sample, SampleError, Sampler};
pub use trend::{Tolerance, Trend};
pub use world::Counters;
use world::World;

/// Where progress lines go (one per sample, storms, reloads).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// The tolerance of each kind of series.
#[derive(Debug, Clone, Copy)]
pub struct Tolerances {
    /// Resident memory, in MiB.
    pub rss: Tolerance,
    /// Open file descriptors.
    pub fds: Tolerance,
    /// Live tasks.
    pub tasks: Tolerance,
    /// Map sizes and the gateway's connection gauges, in entries.
    pub maps: Tolerance,
}

impl Tolerances {
    /// The tolerance of series `name`.
    pub fn of(&self, name: &str) -> Tolerance {
        match name {
            sample::RSS => self.rss,
            sample::FDS => self.fds,
            sample::TASKS => self.tasks,
            _ => self.maps,
        }
    }
}

/// Everything a soak run needs to know.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The server's WebSocket URL (loopback; checked by the caller). Its HTTP API is at
    /// the same host and port.
    pub url: String,
    /// The server's process id, for `/proc/PID`.
    pub pid: u32,
    /// How long traffic runs.
    pub duration: Duration,
    /// Time between two samples.
    pub sample_every: Duration,
    /// Samples before this are left out of the trends.
    pub warmup: Duration,
    /// Client slots (each holds at most one connection at a time).
    pub users: usize,
    /// Messages per second over all clients.
    pub rate: f64,
    /// Mean lifetime of a connection before it churns.
    pub lifetime: Duration,
    /// Share of reconnects that come back as a new user.
    pub new_user_share: f64,
    /// Share of reconnects that come back as a new device of the same user.
    pub new_device_share: f64,
    /// A user this old comes back as a new user at its next churn (zero: no limit). What
    /// the server holds per user (conversations, group memberships, history a new device
    /// is backfilled) grows with the user's age: bounding it keeps the load steady after
    /// the warm-up, so that a trend is the server's and not the load's.
    pub max_user_age: Duration,
    /// Mean time between two pulls (`sync`, `history`, room change) of one client.
    pub pull_every: Duration,
    /// Rooms of one generation.
    pub rooms: usize,
    /// How long a generation of rooms lasts before new ones replace it.
    pub room_period: Duration,
    /// Announcements per second through the HTTP API.
    pub announce_rate: f64,
    /// Time between two rounds of group changes (create one, change one, read one).
    pub group_every: Duration,
    /// Time between two reconnect storms (zero: none).
    pub storm_every: Duration,
    /// Samples this long after a storm are left out of the trends.
    pub storm_settle: Duration,
    /// Time between two hot reloads (zero: none).
    pub reload_every: Duration,
    /// The server's plugins folder; without it, no hot reload.
    pub plugins_dir: Option<PathBuf>,
    /// The plugin to reload (default: `room-rate-limit`, else the first with a manifest).
    pub plugin: Option<String>,
    /// API key (`dev-key` in dev mode).
    pub api_key: String,
    /// Admin key (`dev-key` in dev mode).
    pub admin_key: String,
    /// Connections opened at once (a storm's reconnects queue behind it).
    pub connect_concurrency: usize,
    /// What growth each kind of series may show.
    pub tolerances: Tolerances,
    /// The maps (`herald_map_entries{map}` labels) that must come back to their value before
    /// the soak once every client has left: connection-bound ones, and those the server
    /// forgets after an idle time (dedup marks, idle conversations). The gateway's connection
    /// gauges always must.
    pub drain_maps: Vec<String>,
    /// How far above their value before the soak the server's live tasks and open fds may
    /// stay once every client has left (pools and background tasks started on first use).
    pub drain_slack: f64,
    /// How long the drain may take: more than the server's reconnect grace, and twice its
    /// idle times.
    pub drain_timeout: Duration,
    /// Where to write `soak.csv` (rewritten after every sample) and `summary.txt`.
    pub report: Option<PathBuf>,
}

/// What stopped a soak before it could judge anything.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// The URL has no host and port.
    #[error("`{0}` has no host: use e.g. ws://127.0.0.1:7095/v1/ws")]
    Url(String),
    /// The server could not be sampled.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The plugin to hot-reload could not be set up.
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// The report could not be written.
    #[error("cannot write the report in {path}: {source}")]
    Report {
        /// The folder.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// One connection-bound series after the clients left.
#[derive(Debug, Clone)]
pub struct Drain {
    /// The series.
    pub series: String,
    /// Its value before the soak.
    pub baseline: f64,
    /// The most it may stay at: the baseline, plus the slack for tasks and fds.
    pub limit: f64,
    /// Its value right after the last client left.
    pub after: f64,
    /// Its last value read.
    pub last: f64,
    /// How long after the clients left it was back at the baseline; `None`: never.
    pub back_after: Option<Duration>,
}

/// One series' verdict.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The series.
    pub series: String,
    /// Its tolerance.
    pub tolerance: Tolerance,
    /// Its trend over the steady window; `None` with too few samples.
    pub trend: Option<Trend>,
}

/// Everything a finished soak saw.
#[derive(Debug)]
pub struct Outcome {
    /// The samples, in order.
    pub samples: Vec<Sample>,
    /// The series before the soak.
    pub baseline: BTreeMap<String, f64>,
    /// Each series' trend.
    pub judged: Vec<Judged>,
    /// The drain check.
    pub drains: Vec<Drain>,
    /// Every series once the drain check ended.
    pub after_drain: BTreeMap<String, f64>,
    /// Each hot reload: how long until it served, or why it failed.
    pub reloads: Vec<Result<Duration, String>>,
    /// Reconnect storms.
    pub storms: u64,
    /// The shared state, for its traffic counters.
    world: Arc<World>,
    /// The steady window's start.
    pub warmup: Duration,
}

/// Runs a soak: traffic, samples and the drain check. Progress goes to `log`.
///
/// # Errors
///
/// [`SoakError`] when the soak could not run or measure (the server is unreachable or its
/// process gone, the plugin cannot be reloaded, the report cannot be written). A soak that
/// ran and found growth returns `Ok`: see [`Outcome::failures`].
pub async fn run(config: SoakConfig, log: Log) -> Result<Outcome, SoakError> {
    let authority = http::authority_of(&config.url).ok_or_else(|| SoakError::Url(config.url.clone()))?;
    let sampler = Sampler { pid: config.pid, authority: authority.clone() };
    if let Some(dir) = &config.report {
        std::fs::create_dir_all(dir).map_err(|source| SoakError::Report { path: dir.clone(), source })?;
    }
    let baseline = sampler.read().await?;
    let reloader = match &config.plugins_dir {
        Some(dir) if !config.reload_every.is_zero() => {
            Some(Reloader::new(dir, config.plugin.as_deref(), &authority, &config.admin_key)?)
        }
        _ => None,
    };
    log(&format!(
        "soak: {} clients, {} msgs/s, {:?}; churn ~{:?} per connection, {}; storms every {:?}; {}; samples every {:?}, warm-up {:?}",
        config.users,
        config.rate,
        config.duration,
        config.lifetime,
        if config.max_user_age.is_zero() {
            "users never retired".to_owned()
        } else {
            format!("users retired at {:?} old", config.max_user_age)
        },
        config.storm_every,
        match &reloader {
            Some(reloader) => format!("plugin {} reloaded every {:?}", reloader.plugin, config.reload_every),
            None => "no hot reload".to_owned(),
        },
        config.sample_every,
        config.warmup,
    ));

    let started = Instant::now();
    let world = Arc::new(World::new(config.users.max(2), config.rooms, config.room_period));
    let (stop, stop_rx) = watch::channel(false);
    let (storms, storms_rx) = watch::channel(0_u64);
    let behaviour = Arc::new(Behaviour {
        url: config.url.clone(),
        send_every: Duration::from_secs_f64(config.users.max(2) as f64 / config.rate.max(0.001)),
        pull_every: config.pull_every,
        lifetime: config.lifetime,
        new_user_share: config.new_user_share,
        new_device_share: config.new_device_share,
        max_user_age: config.max_user_age,
    });
    let permits = Arc::new(Semaphore::new(config.connect_concurrency.max(1)));
    let slots: Vec<_> = (0..config.users.max(2))
        .map(|slot| {
            let signals = Signals { stop: stop_rx.clone(), storms: storms_rx.clone() };
            let task = client::run_slot(
                Arc::clone(&world),
                slot,
                Arc::clone(&behaviour),
                Arc::clone(&permits),
                signals,
                started,
            );
            tokio::spawn(task)
        })
        .collect();
    let api = api::Api { authority: authority.clone(), api_key: config.api_key.clone() };
    let http_tasks = [
        tokio::spawn(api::run_groups(api.clone(), Arc::clone(&world), config.group_every, stop_rx.clone())),
        tokio::spawn(api::run_announcements(api, Arc::clone(&world), config.announce_rate, started, stop_rx.clone())),
    ];
    let reloads = Arc::new(Mutex::new(Vec::new()));
    let reload_task = reloader.map(|reloader| {
        let results = Arc::clone(&reloads);
        tokio::spawn(run_reloads(reloader, config.reload_every, results, stop_rx.clone(), Arc::clone(&log), started))
    });

    // Samples, storms, and the end.
    let end = started + config.duration;
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = started + config.sample_every;
    let mut next_storm = (!config.storm_every.is_zero()).then(|| started + config.storm_every);
    let mut storm_until = started;
    let mut metric_failures = 0;
    let mut last_sent = 0;
    while Instant::now() < end {
        let storm_at = next_storm.unwrap_or(end);
        tokio::time::sleep_until(next_sample.min(storm_at).min(end)).await;
        let now = Instant::now();
        if next_storm.is_some_and(|at| at <= now) && now < end {
            storms.send_modify(|count| *count += 1);
            storm_until = now + config.storm_settle;
            next_storm = Some(now + config.storm_every);
            log(&format!("[{}] reconnect storm: {} connections dropped at once", clock(now - started), world.online()));
        }
        if next_sample > now {
            continue;
        }
        next_sample += config.sample_every;
        let values = match sampler.read().await {
            Ok(values) => values,
            Err(error @ SampleError::Proc { .. }) => return Err(error.into()),
            Err(error) => {
                metric_failures += 1;
                log(&format!("[{}] sample skipped: {error}", clock(now - started)));
                if metric_failures >= 3 {
                    return Err(error.into());
                }
                continue;
            }
        };
        metric_failures = 0;
        let sample = Sample {
            at: now - started,
            storm: now < storm_until,
            clients: world.online(),
            delivered: Counters::get(&world.counters.delivered),
            values,
        };
        let sent = Counters::get(&world.counters.sent);
        log(&progress_line(&sample, sent - last_sent, config.users));
        last_sent = sent;
        samples.push(sample);
        if let Some(dir) = &config.report {
            sample::write_csv(&dir.join("soak.csv"), &samples)
                .await
                .map_err(|source| SoakError::Report { path: dir.clone(), source })?;
        }
    }

    // Traffic stops; every client leaves.
    log(&format!("[{}] traffic stops; every client closes", clock(started.elapsed())));
    stop.send_replace(true);
    for task in slots.into_iter().chain(http_tasks) {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }
    if let Some(task) = reload_task {
        let _ = task.await;
    }
    drop(storms);
    let left = Instant::now();
    let drains = drain(&sampler, &baseline, &config, &log).await?;
    let after_drain = sampler.read().await?;
    log(&format!("drain check done {:.1} s after the clients left", left.elapsed().as_secs_f64()));

    let judged = judge(&samples, config.warmup, &config.tolerances);
    let reloads = reloads.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    let outcome = Outcome {
        samples,
        baseline,
        judged,
        drains,
        after_drain,
        reloads,
        storms: *storms_rx.borrow(),
        world,
        warmup: config.warmup,
    };
    if let Some(dir) = &config.report {
        sample::write_csv(&dir.join("soak.csv"), &outcome.samples)
            .await
            .map_err(|source| SoakError::Report { path: dir.clone(), source })?;
        std::fs::write(dir.join("summary.txt"), outcome.render())
            .map_err(|source| SoakError::Report { path: dir.clone(), source })?;
    }
    Ok(outcome)
}

/// Hot-reloads every `every` until `stop`, recording each outcome; restores the original
/// manifest at the end.
async fn run_reloads(
    mut reloader: Reloader,
    every: Duration,
    results: Arc<Mutex<Vec<Result<Duration, String>>>>,
    mut stop: watch::Receiver<bool>,
    log: Log,
    started: Instant,
) {
    let record = |result: Result<Duration, String>| {
        results.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(result);
    };
    loop {
        tokio::select! {
            _ = until_stopped(&mut stop) => break,
            _ = tokio::time::sleep(every) => {}
        }
        match reloader.reload().await {
            Ok(took) => {
                log(&format!(
                    "[{}] plugin {} hot-reloaded: the new version served after {} ms",
                    clock(started.elapsed()),
                    reloader.plugin,
                    took.as_millis()
                ));
                record(Ok(took));
            }
            Err(error) => {
                log(&format!("[{}] hot reload FAILED: {error}", clock(started.elapsed())));
                record(Err(error.to_string()));
            }
        }
    }
    match reloader.restore().await {
        Ok(took) if !took.is_zero() => {
            log(&format!("plugin {} back to its original manifest after {} ms", reloader.plugin, took.as_millis()));
        }
        Ok(_) => {}
        Err(error) => {
            log(&format!("putting the original manifest back did not reload: {error}"));
            record(Err(format!("restoring the original manifest: {error}")));
        }
    }
}

/// Returns once `stop` is true (or its sender is gone). Unlike `wait_for`, holds no borrow
/// of the value across an await, so a task waiting on it stays `Send`.
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// How far above its baseline series `name` may stay once the clients left: `Some(0)` for
/// the gateway's gauges and the maps named in `drain_maps`, `Some(slack)` for tasks and
/// fds, `None` for series the drain does not check.
fn drain_slack(name: &str, drain_maps: &[String], slack: f64) -> Option<f64> {
    if name == sample::GATEWAY_CONNECTIONS
        || name == sample::GATEWAY_PARKED
        || name.strip_prefix(sample::MAP_PREFIX).is_some_and(|map| drain_maps.iter().any(|m| m == map))
    {
        Some(0.0)
    } else if name == sample::TASKS || name == sample::FDS {
        Some(slack)
    } else {
        None
    }
}

/// Polls until every series the drain checks is back at its baseline (plus its slack), or
/// the timeout.
async fn drain(
    sampler: &Sampler,
    baseline: &BTreeMap<String, f64>,
    config: &SoakConfig,
    log: &Log,
) -> Result<Vec<Drain>, SoakError> {
    let left = Instant::now();
    let first = sampler.read().await?;
    let mut drains: Vec<Drain> = first
        .iter()
        .filter_map(|(name, &value)| {
            let slack = drain_slack(name, &config.drain_maps, config.drain_slack)?;
            let baseline = baseline.get(name).copied().unwrap_or(0.0);
            Some(Drain {
                series: name.clone(),
                baseline,
                limit: baseline + slack,
                after: value,
                last: value,
                back_after: None,
            })
        })
        .collect();
    loop {
        let now = sampler.read().await?;
        for drain in &mut drains {
            drain.last = now.get(&drain.series).copied().unwrap_or(0.0);
            if drain.last > drain.limit {
                drain.back_after = None;
            } else if drain.back_after.is_none() {
                drain.back_after = Some(left.elapsed());
            }
        }
        if drains.iter().all(|drain| drain.back_after.is_some()) || left.elapsed() >= config.drain_timeout {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let waiting: Vec<String> = drains
        .iter()
        .filter(|drain| drain.back_after.is_none())
        .map(|drain| format!("{}={}", drain.series, drain.last))
        .collect();
    if !waiting.is_empty() {
        log(&format!("drain: still above their limit after {:?}: {}", config.drain_timeout, waiting.join(" ")));
    }
    Ok(drains)
}

/// Each series' trend over the steady samples (after `warmup`, outside storms).
fn judge(samples: &[Sample], warmup: Duration, tolerances: &Tolerances) -> Vec<Judged> {
    sample::series_names(samples)
        .into_iter()
        .map(|series| {
            let points: Vec<(f64, f64)> = samples
                .iter()
                .filter(|sample| sample.at >= warmup && !sample.storm)
                .filter_map(|sample| Some((sample.at.as_secs_f64() / 60.0, *sample.values.get(&series)?)))
                .collect();
            let tolerance = tolerances.of(&series);
            Judged { trend: Trend::of(&points, tolerance), tolerance, series }
        })
        .collect()
}

impl Outcome {
    /// The traffic counters of the run.
    pub fn counters(&self) -> &Counters {
        &self.world.counters
    }

    /// What failed, one sentence each; empty when the soak passed.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for judged in &self.judged {
            if let Some(trend) = judged.trend.as_ref().filter(|trend| trend.grows()) {
                failures.push(format!(
                    "{} grows: {:+.3}/min, {:+.2} over the {:.1}-minute steady window ({:+.1} % of its mean {:.1}); allowed {:.2} ({})",
                    judged.series,
                    trend.slope_per_minute,
                    trend.growth,
                    trend.window_minutes,
                    trend.growth_percent(),
                    trend.mean,
                    trend.allowed,
                    judged.tolerance
                ));
            }
        }
        for drain in self.drains.iter().filter(|drain| drain.back_after.is_none()) {
            failures.push(format!(
                "{} did not come back to its value before the soak once every client had left: {} before (at most {} allowed), {} right after, still {}",
                drain.series, drain.baseline, drain.limit, drain.after, drain.last
            ));
        }
        let failed_reloads: Vec<&String> = self.reloads.iter().filter_map(|reload| reload.as_ref().err()).collect();
        if let Some(first) = failed_reloads.first() {
            failures.push(format!(
                "{} of {} hot reloads failed; first: {first}",
                failed_reloads.len(),
                self.reloads.len()
            ));
        }
        if self.samples.is_empty() {
            failures.push("no sample was taken: make the run longer than --sample-every".to_owned());
        }
        failures
    }

    /// The summary: traffic, reloads, each series' trend, the drain check.
    pub fn render(&self) -> String {
        let counters = self.counters();
        let get = Counters::get;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "traffic: {} sends ({} ok, {} rejected, {} retry), {} delivered, {} pulls answered, {} error frames",
            get(&counters.sent),
            get(&counters.acked),
            get(&counters.rejected),
            get(&counters.retried),
            get(&counters.delivered),
            get(&counters.pulls),
            get(&counters.errors)
        );
        let _ = writeln!(
            out,
            "churn: {} logins ({} failed), {} churned, {} dropped by {} storms, {} lost; {} new users, {} new devices",
            get(&counters.connects),
            get(&counters.connect_failures),
            get(&counters.churned),
            get(&counters.storm_drops),
            self.storms,
            get(&counters.lost),
            get(&counters.new_users),
            get(&counters.new_devices)
        );
        let _ = writeln!(
            out,
            "http: {} groups created, {} member changes, {} announcements ({} paced), {} failed calls",
            get(&counters.groups),
            get(&counters.member_changes),
            get(&counters.announced),
            get(&counters.announce_paced),
            get(&counters.http_failures)
        );
        let served: Vec<u128> =
            self.reloads.iter().filter_map(|reload| reload.as_ref().ok()).map(Duration::as_millis).collect();
        let _ = writeln!(
            out,
            "hot reloads: {} of {} served{}",
            served.len(),
            self.reloads.len(),
            served.iter().max().map(|max| format!(" (slowest {max} ms)")).unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "\ntrends over the steady window (after {:.0} s of warm-up, storms left out):",
            self.warmup.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "  {:<26} {:>7} {:>10} {:>10} {:>10} {:>11} {:>10} {:>9} {:>10}  verdict",
            "series", "samples", "first", "last", "mean", "slope/min", "growth", "% of mean", "allowed"
        );
        for judged in &self.judged {
            match &judged.trend {
                Some(trend) => {
                    let _ = writeln!(
                        out,
                        "  {:<26} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>+11.3} {:>+10.2} {:>+8.1}% {:>10.2}  {}",
                        judged.series,
                        trend.samples,
                        trend.first,
                        trend.last,
                        trend.mean,
                        trend.slope_per_minute,
                        trend.growth,
                        trend.growth_percent(),
                        trend.allowed,
                        if trend.grows() { "GROWS" } else { "flat" }
                    );
                }
                None => {
                    let _ = writeln!(out, "  {:<26} too few steady samples to judge", judged.series);
                }
            }
        }
        let _ = writeln!(out, "\ndrain check (every client gone):");
        for drain in &self.drains {
            let _ = writeln!(
                out,
                "  {:<26} before {:>8} (limit {:>8}) right after {:>8} now {:>8}  {}",
                drain.series,
                round(drain.baseline),
                round(drain.limit),
                round(drain.after),
                round(drain.last),
                match drain.back_after {
                    Some(took) => format!("back after {:.1} s", took.as_secs_f64()),
                    None => "NOT BACK".to_owned(),
                }
            );
        }
        let others: Vec<String> = self
            .after_drain
            .iter()
            .filter(|(name, _)| !self.drains.iter().any(|drain| &drain.series == *name))
            .map(|(name, value)| {
                format!("{name} {} → {}", self.baseline.get(name).map_or("-".to_owned(), |v| round(*v)), round(*value))
            })
            .collect();
        if !others.is_empty() {
            let _ = writeln!(out, "  other series, before the soak → after the drain: {}", others.join(", "));
        }
        out
    }
}

/// `1m05s`-style time into the soak.
fn clock(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    format!("{:>3}m{:02}s", seconds / 60, seconds % 60)
}

/// A value with at most one decimal.
fn round(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.0}") } else { format!("{value:.1}") }
}

/// One sample as a progress line.
fn progress_line(sample: &Sample, sent: u64, users: usize) -> String {
    let mut line = format!("[{}] clients {:>4}/{users}  sent +{sent:<6}", clock(sample.at), sample.clients);
    for (name, value) in &sample.values {
        let name = name.strip_prefix(sample::MAP_PREFIX).unwrap_or(name);
        let _ = write!(line, " {name}={}", round(*value));
    }
    if sample.storm {
        line.push_str("  (storm)");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seconds: u64, storm: bool, rss: f64) -> Sample {
        Sample {
            at: Duration::from_secs(seconds),
            storm,
            clients: 0,
            delivered: 0,
            values: [(sample::RSS.to_owned(), rss)].into(),
        }
    }

    #[test]
    fn warm_up_and_storm_samples_are_left_out_of_the_trend() {
        let tolerances = Tolerances {
            rss: Tolerance { relative: 0.0, absolute: 1.0 },
            fds: Tolerance { relative: 0.0, absolute: 0.0 },
            tasks: Tolerance { relative: 0.0, absolute: 0.0 },
            maps: Tolerance { relative: 0.0, absolute: 0.0 },
        };
        // Memory climbs during the warm-up, spikes in a storm, and is flat otherwise.
        let mut samples: Vec<Sample> = (0..6).map(|i| sample(i * 10, false, 50.0 + 10.0 * i as f64)).collect();
        samples.extend((6..30).map(|i| sample(i * 10, i == 20, if i == 20 { 500.0 } else { 100.0 })));
        let judged = judge(&samples, Duration::from_secs(60), &tolerances);
        let trend = judged[0].trend.as_ref().expect("judged");
        assert_eq!(trend.samples, 23);
        assert!(!trend.grows(), "{trend:?}");
        assert!(judge(&samples, Duration::ZERO, &tolerances)[0].trend.as_ref().expect("judged").grows());
    }

    #[test]
    fn the_drain_checks_the_listed_maps_exactly_and_tasks_and_fds_with_slack() {
        let maps = vec!["routes".to_owned(), "dedup_marks".to_owned()];
        assert_eq!(drain_slack("map_routes", &maps, 32.0), Some(0.0));
        assert_eq!(drain_slack("map_dedup_marks", &maps, 32.0), Some(0.0));
        assert_eq!(drain_slack("gateway_connections", &maps, 32.0), Some(0.0));
        assert_eq!(drain_slack(sample::TASKS, &maps, 32.0), Some(32.0));
        assert_eq!(drain_slack(sample::FDS, &maps, 32.0), Some(32.0));
        assert_eq!(drain_slack("map_intake_buckets", &maps, 32.0), None);
        assert_eq!(drain_slack(sample::RSS, &maps, 32.0), None);
    }
}
