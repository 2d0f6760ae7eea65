//! The load generator behind `herald-loadgen`: N users in pairs, each connected over the
//! real WebSocket path, sending to its partner in their `dm:` conversation while the
//! partner acknowledges every `deliver`.
//!
//! Against a cluster the run takes several endpoints: users are spread over them
//! round-robin and pairs may join users on different endpoints ([`pairing`]), so latency
//! is also reported separately for same-endpoint and cross-endpoint pairs.
//!
//! A run has four phases, broadcast to every user task: connect (at most
//! `connect_concurrency` handshakes at once), run (warm-up, then the measurement window),
//! drain (no new sends; wait for what is in flight to be acknowledged and delivered) and
//! stop. Every phase is bounded in time, so a run ends even if the server stops answering.
//!
//! What is measured: send → deliver latency from a timestamp inside each body (so the
//! receiver needs no shared table), send → `send_ack` latency (of the attempt the server
//! took in: a send answered RETRY is timed again from its resend), and throughput as distinct
//! messages delivered inside the window per second. In rate mode the timestamp is the
//! *scheduled* send time, so a backlog in the client or server shows up as latency instead
//! of silently lowering the rate (no coordinated omission). Asked for, the run also keeps
//! per-second series ([`timeline`]), from which [`report_dir`] draws charts.
//!
//! With [`LoadConfig::rooms`] set, the run measures room fan-out instead ([`room`]):
//! subscribers spread over `room:` conversations, publishers sending into them, the same
//! phases, counters, histograms and [`Report`].

mod charts;
pub mod pairing;
mod payload;
mod progress;
pub mod relay_process;
pub mod report;
pub mod report_dir;
pub mod room;
pub mod stats;
pub mod timeline;
mod user;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use herald_proto::Encoding;
use tokio::{
    sync::{Semaphore, watch},
    time::Instant,
};

pub use pairing::{Pairing, PairingError, endpoint_of};
pub use payload::{MIN_BODY_BYTES, Payload, SeenCounters};
pub use report::{Report, RoomFigures, Verification};
pub use room::RoomLoad;
pub use stats::LatencySummary;
pub use timeline::{Second, Timeline};

use crate::ids::{dm_conversation, is_valid_name};
use stats::{CountSnapshot, Counters, LatencyRecorder};
use timeline::TimelineRecorder;

/// How users get their tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenMode {
    /// `dev:<user>`, accepted by `herald serve --dev` and by `herald-relay`.
    #[default]
    Dev,
}

impl TokenMode {
    /// The token for `user`.
    pub fn token(self, user: &str) -> String {
        match self {
            Self::Dev => format!("dev:{user}"),
        }
    }
}

/// Everything a load run needs to know.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Names the run in reports (`herald`, `relay`).
    pub label: String,
    /// The WebSocket URLs, e.g. `ws://127.0.0.1:7070/v1/ws`: one server, or several
    /// nodes of a cluster, user `i` connecting to URL `i mod N`. The caller checks they
    /// are loopback (see [`crate::target`]).
    pub urls: Vec<String>,
    /// Simulated users; even, since they pair up. Not used in room mode.
    pub users: usize,
    /// Room fan-out mode instead of pairs: subscribers spread over rooms and publishers
    /// sending into them ([`room`]); `rate` and `in_flight` then apply to the publishers.
    pub rooms: Option<RoomLoad>,
    /// With several URLs, the least share (0..=1) of pairs whose two users connect to
    /// different URLs; `None` pairs user `2k` with `2k + 1` (all pairs cross when there
    /// are several URLs). See [`Pairing::with_cross_share`].
    pub cross_node_share: Option<f64>,
    /// Total send rate in messages per second across all users; 0 sends as fast as the
    /// in-flight limit allows.
    pub rate: u64,
    /// Length of the measurement window.
    pub duration: Duration,
    /// Load before the window that is not measured (connections and caches warm up).
    pub warmup: Duration,
    /// Size of each message body (at least [`MIN_BODY_BYTES`]).
    pub body_bytes: usize,
    /// Messages a user may have sent but not yet seen delivered to its partner.
    pub in_flight: usize,
    /// Connections opened at once during the connect phase.
    pub connect_concurrency: usize,
    /// Protobuf or JSON subprotocol.
    pub encoding: Encoding,
    /// How users get their tokens.
    pub token_mode: TokenMode,
    /// User ids are `<prefix>-<n>`; a fresh prefix per run keeps runs against a persistent
    /// server from seeing each other's messages.
    pub user_prefix: String,
    /// The device id every user connects with.
    pub device: String,
    /// Longest wait for in-flight messages after the window.
    pub drain_timeout: Duration,
    /// Longest wait for one user's handshake and login.
    pub connect_timeout: Duration,
    /// Keep every message id and cross-check sends against deliveries at the end.
    pub verify: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Keep per-second counts and latency histograms for [`Report::timeline`] (the charts
    /// of `--report`); off, the run does no per-second work.
    pub timeline: bool,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            label: "herald".to_owned(),
            urls: vec!["ws://127.0.0.1:7070/v1/ws".to_owned()],
            users: 1000,
            rooms: None,
            cross_node_share: None,
            rate: 0,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            body_bytes: 64,
            in_flight: 16,
            connect_concurrency: 64,
            encoding: Encoding::Proto,
            token_mode: TokenMode::Dev,
            user_prefix: format!("lg-{}", crate::ids::random_tag(6)),
            device: "loadgen".to_owned(),
            drain_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            verify: false,
            progress: false,
            timeline: false,
        }
    }
}

/// Why a run could not happen at all.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A setting is out of range.
    #[error("invalid load configuration: {0}")]
    Config(String),
    /// Not one user could connect.
    #[error("no user could connect to {url}: {first_error}")]
    NoConnections {
        /// The target URLs, comma-separated.
        url: String,
        /// What the first failure said.
        first_error: String,
    },
}

impl LoadConfig {
    fn validate(&self) -> Result<(), LoadError> {
        let fail = |message: String| Err(LoadError::Config(message));
        if self.urls.is_empty() {
            return fail("--url needs at least one WebSocket URL".to_owned());
        }
        if self.duration.is_zero() {
            return fail("--duration must be more than 0".to_owned());
        }
        if self.in_flight == 0 || self.connect_concurrency == 0 {
            return fail("--in-flight and --connect-concurrency must be at least 1".to_owned());
        }
        if self.body_bytes < MIN_BODY_BYTES {
            return fail(format!("--body-bytes must be at least {MIN_BODY_BYTES} (the timestamp and counter)"));
        }
        if let Some(rooms) = &self.rooms {
            if self.cross_node_share.is_some() {
                return fail("--cross-node-share is for pairs, not rooms".to_owned());
            }
            if !is_valid_name(&self.device) {
                return fail(format!("device `{}` must be 1-128 characters of A-Z a-z 0-9 . _ @ -", self.device));
            }
            return room::validate(self, rooms);
        }
        if self.users < 2 || !self.users.is_multiple_of(2) {
            return fail(format!("--users must be an even number of at least 2 (they pair up), not {}", self.users));
        }
        let last_user = user_id(&self.user_prefix, self.users - 1);
        if !is_valid_name(&last_user) || !is_valid_name(&self.device) {
            return fail(format!(
                "user ids like `{last_user}` and device `{}` must be 1-128 characters of \
                 A-Z a-z 0-9 . _ @ -",
                self.device
            ));
        }
        self.pairing().map(drop)
    }

    /// Who pairs with whom over this run's URLs.
    fn pairing(&self) -> Result<Pairing, LoadError> {
        let endpoints = self.urls.len();
        match self.cross_node_share {
            None => Pairing::neighbours(self.users, endpoints),
            Some(share) => Pairing::with_cross_share(self.users, endpoints, share),
        }
        .map_err(|error| LoadError::Config(error.to_string()))
    }

    /// The target URLs as given on the command line: comma-separated.
    pub fn url_list(&self) -> String {
        self.urls.join(",")
    }
}

/// The id of user number `index`.
pub fn user_id(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index:05}")
}

/// Where the run is; user tasks watch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Users connect and log in.
    Connecting,
    /// Users send and receive.
    Running,
    /// Users only receive.
    Draining,
    /// Users close their connections.
    Stopped,
}

/// One simulated user's place in the run.
#[derive(Debug, Clone)]
struct UserPlan {
    /// Its number, from 0.
    index: usize,
    /// Its user id.
    user: String,
    /// The URL it connects to (`urls[index mod N]`).
    url: String,
    /// Its partner's number (`index ^ 1` unless a cross share is asked for).
    partner_index: usize,
    /// Its partner's user id.
    partner: String,
    /// Their `dm:` conversation.
    conversation: String,
    /// Whether the partner connects to a different URL.
    crosses: bool,
    /// Time between its sends in rate mode.
    interval: Option<Duration>,
    /// When its first send is due in rate mode, after the start: spreads users evenly
    /// over one interval instead of sending in lockstep.
    offset: Duration,
}

/// State shared by every user task of a run.
#[derive(Debug)]
struct Shared {
    /// The run's settings.
    config: LoadConfig,
    /// Time zero of body timestamps.
    epoch: Instant,
    /// When sending starts, microseconds after `epoch`.
    start_us: AtomicU64,
    /// The measurement window, microseconds after `epoch`.
    window_start_us: AtomicU64,
    window_end_us: AtomicU64,
    /// Event counters.
    counters: Counters,
    /// Send → deliver latency of messages sent inside the window.
    latency: LatencyRecorder,
    /// The same, of pairs on one URL only.
    same_endpoint_latency: LatencyRecorder,
    /// The same, of pairs on different URLs only.
    cross_endpoint_latency: LatencyRecorder,
    /// Send → `send_ack` latency of messages sent inside the window.
    ack_latency: LatencyRecorder,
    /// In rate mode, how far behind schedule sends were written: the generator's own lag,
    /// reported so it is not mistaken for the server's.
    send_lag: LatencyRecorder,
    /// Sends, deliveries and latency second by second, if the run keeps them.
    timeline: Option<TimelineRecorder>,
    /// Per user: how many more messages it may send before earlier ones are delivered.
    /// The partner's task returns a credit for each delivery.
    credits: Vec<Semaphore>,
    /// The first failure any user saw, for the report.
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn micros_since_epoch(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    fn instant_at(&self, micros: u64) -> Instant {
        self.epoch + Duration::from_micros(micros)
    }

    /// Microseconds after the start of sending (0 before it).
    fn since_start(&self, micros: u64) -> u64 {
        micros.saturating_sub(self.start_us.load(Ordering::Relaxed))
    }

    fn in_window(&self, micros: u64) -> bool {
        micros >= self.window_start_us.load(Ordering::Relaxed) && micros < self.window_end_us.load(Ordering::Relaxed)
    }

    /// The recorder of send → deliver latency split by where the pair's users are.
    fn pair_latency(&self, crosses: bool) -> &LatencyRecorder {
        if crosses { &self.cross_endpoint_latency } else { &self.same_endpoint_latency }
    }

    fn note_error(&self, error: impl FnOnce() -> String) {
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(error());
        }
    }
}

/// Runs one load test and reports what it measured: pairs, or rooms when
/// [`LoadConfig::rooms`] is set.
///
/// # Errors
///
/// [`LoadError::Config`] for settings out of range, [`LoadError::NoConnections`] if not
/// one user could connect. Failures of some users, rejected sends and lost connections
/// are counted in the report, not returned as errors.
pub async fn run(config: LoadConfig) -> Result<Report, LoadError> {
    config.validate()?;
    if let Some(rooms) = config.rooms {
        return room::run(config, rooms).await;
    }
    let pairing = config.pairing()?;
    let users = config.users;
    let shards = users.clamp(1, 64);
    let interval = (config.rate > 0).then(|| Duration::from_secs_f64(users as f64 / config.rate as f64));
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        start_us: AtomicU64::new(u64::MAX),
        window_start_us: AtomicU64::new(u64::MAX),
        window_end_us: AtomicU64::new(u64::MAX),
        counters: Counters::default(),
        latency: LatencyRecorder::new(shards),
        same_endpoint_latency: LatencyRecorder::new(shards),
        cross_endpoint_latency: LatencyRecorder::new(shards),
        ack_latency: LatencyRecorder::new(shards),
        send_lag: LatencyRecorder::new(shards),
        // Every sample falls within the warm-up, the window and the drain; a second more
        // for the last drain poll and the close.
        timeline: config.timeline.then(|| {
            let seconds = config.warmup.saturating_add(config.duration).saturating_add(config.drain_timeout);
            let seconds = seconds.as_secs_f64().ceil();
            TimelineRecorder::new(seconds as usize + 2)
        }),
        credits: (0..users).map(|_| Semaphore::new(config.in_flight)).collect(),
        first_error: Mutex::new(None),
        config,
    });
    let config = &shared.config;
    let (phase_tx, phase_rx) = watch::channel(Phase::Connecting);
    let gate = Arc::new(Semaphore::new(config.connect_concurrency));
    let progress = progress::Progress::new(config.progress, &config.label, users as u64);

    let tasks: Vec<_> = (0..users)
        .map(|index| {
            let partner_index = pairing.partner(index);
            let user = user_id(&config.user_prefix, index);
            let partner = user_id(&config.user_prefix, partner_index);
            let plan = UserPlan {
                index,
                url: config.urls[endpoint_of(index, config.urls.len())].clone(),
                conversation: dm_conversation(&user, &partner),
                crosses: pairing.crosses(index),
                user,
                partner_index,
                partner,
                interval,
                offset: interval.map_or(Duration::ZERO, |interval| interval.mul_f64(index as f64 / users as f64)),
            };
            tokio::spawn(user::run_user(plan, Arc::clone(&shared), phase_rx.clone(), Arc::clone(&gate)))
        })
        .collect();
    drop(phase_rx);

    // Connect phase: every user either logs in or fails within its own timeout; the
    // overall bound only guards against a stuck task.
    let connect_started = Instant::now();
    let waves = users.div_ceil(config.connect_concurrency) as u32;
    let connect_deadline = connect_started + config.connect_timeout * 2 * (waves + 1);
    loop {
        let done = shared.counters.connected.get() + shared.counters.connect_failures.get();
        progress.connecting(done, shared.counters.connect_failures.get());
        if done >= users as u64 || Instant::now() >= connect_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_time = connect_started.elapsed();
    if shared.counters.connected.get() == 0 {
        let _ = phase_tx.send(Phase::Stopped);
        progress.finish();
        for task in tasks {
            task.abort();
        }
        let first_error = shared
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "connect timed out".to_owned());
        return Err(LoadError::NoConnections { url: config.url_list(), first_error });
    }

    // Run phase: warm-up, then the window.
    let start_us = shared.now_us() + 20_000;
    let window_start_us = start_us + micros(config.warmup);
    let window_end_us = window_start_us + micros(config.duration);
    shared.start_us.store(start_us, Ordering::Relaxed);
    shared.window_start_us.store(window_start_us, Ordering::Relaxed);
    shared.window_end_us.store(window_end_us, Ordering::Relaxed);
    let _ = phase_tx.send(Phase::Running);
    let run_end = shared.instant_at(window_end_us);
    progress.running(config.warmup + config.duration);
    loop {
        let now = Instant::now();
        progress.tick(&CountSnapshot::of(&shared.counters), now.saturating_duration_since(shared.instant_at(start_us)));
        if now >= run_end {
            break;
        }
        tokio::time::sleep((run_end - now).min(Duration::from_millis(200))).await;
    }

    // Drain phase: no new sends; wait until every send settled and every accepted one
    // arrived, or the timeout.
    let _ = phase_tx.send(Phase::Draining);
    progress.draining();
    let drain_started = Instant::now();
    let drained = loop {
        let counters = &shared.counters;
        let sent = counters.sent.get();
        let settled = counters.sends_settled() >= sent;
        let accepted = counters.ack_ok.get() + counters.ack_duplicate.get();
        let arrived = counters.delivered.get() >= accepted;
        if settled && arrived {
            break true;
        }
        if drain_started.elapsed() >= config.drain_timeout {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let drain_time = drain_started.elapsed();

    let _ = phase_tx.send(Phase::Stopped);
    let mut acked_ids = Vec::new();
    let mut delivered_ids = Vec::new();
    for task in tasks {
        // Closing takes at most about a second per user, all in parallel.
        if let Ok(Ok(outcome)) = tokio::time::timeout(Duration::from_secs(5), task).await {
            acked_ids.extend(outcome.acked_ids);
            delivered_ids.extend(outcome.delivered_ids);
        }
    }
    progress.finish();

    let verification = config.verify.then(|| verify_ids(acked_ids, delivered_ids));
    Ok(Report {
        label: config.label.clone(),
        url: config.url_list(),
        endpoints: config.urls.len() as u64,
        pairs: pairing.pairs() as u64,
        cross_endpoint_pairs: pairing.cross_pairs() as u64,
        encoding: match config.encoding {
            Encoding::Proto => "proto",
            Encoding::Json => "json",
        },
        users: users as u64,
        rate: config.rate,
        in_flight: config.in_flight as u64,
        body_bytes: config.body_bytes as u64,
        warmup: config.warmup,
        duration: config.duration,
        connect_time,
        drain_time,
        drained,
        counts: CountSnapshot::of(&shared.counters),
        latency: LatencySummary::of(&shared.latency.merged()),
        same_endpoint_latency: LatencySummary::of(&shared.same_endpoint_latency.merged()),
        cross_endpoint_latency: LatencySummary::of(&shared.cross_endpoint_latency.merged()),
        ack_latency: LatencySummary::of(&shared.ack_latency.merged()),
        send_lag: (config.rate > 0).then(|| LatencySummary::of(&shared.send_lag.merged())),
        verification,
        first_error: shared.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        timeline: shared.timeline.as_ref().map(TimelineRecorder::timeline),
        rooms: None,
    })
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Compares the ids acknowledged to senders with those that reached recipients.
fn verify_ids(mut acked: Vec<u64>, mut delivered: Vec<u64>) -> Verification {
    acked.sort_unstable();
    acked.dedup();
    delivered.sort_unstable();
    delivered.dedup();
    let missing = acked.iter().filter(|id| delivered.binary_search(id).is_err()).count() as u64;
    let unacknowledged = delivered.iter().filter(|id| acked.binary_search(id).is_err()).count() as u64;
    Verification { acked_ids: acked.len() as u64, delivered_ids: delivered.len() as u64, missing, unacknowledged }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_pair_up_and_sort_by_index() {
        assert_eq!(user_id("lg-abc", 7), "lg-abc-00007");
        assert!(user_id("p", 2) < user_id("p", 3));
        assert_eq!(dm_conversation(&user_id("p", 3), &user_id("p", 2)), "dm:p-00002:p-00003");
    }

    #[test]
    fn config_is_checked() {
        let config = |change: fn(&mut LoadConfig)| {
            let mut config = LoadConfig::default();
            change(&mut config);
            config.validate()
        };
        assert!(config(|_| {}).is_ok());
        assert!(config(|c| c.users = 3).is_err());
        assert!(config(|c| c.users = 0).is_err());
        assert!(config(|c| c.body_bytes = 8).is_err());
        assert!(config(|c| c.in_flight = 0).is_err());
        assert!(config(|c| c.duration = Duration::ZERO).is_err());
        assert!(config(|c| c.user_prefix = "no spaces".to_owned()).is_err());
        assert!(config(|c| c.urls.clear()).is_err());
        assert!(config(|c| c.cross_node_share = Some(0.5)).is_err(), "one URL: no pair can cross");
        assert!(config(|c| c.cross_node_share = Some(0.0)).is_ok());
        let two_urls = |share: f64| {
            let urls = vec!["ws://127.0.0.1:1/v1/ws".to_owned(), "ws://127.0.0.1:2/v1/ws".to_owned()];
            LoadConfig { urls, cross_node_share: Some(share), ..LoadConfig::default() }.validate()
        };
        assert!(two_urls(0.5).is_ok());
        assert!(two_urls(1.5).is_err());
    }

    #[test]
    fn verification_finds_missing_and_extra_ids() {
        let exact = verify_ids(vec![3, 1, 2], vec![1, 2, 3, 3]);
        assert!(exact.is_exact());
        assert_eq!(exact.acked_ids, 3);
        let off = verify_ids(vec![1, 2, 3], vec![2, 3, 4]);
        assert_eq!((off.missing, off.unacknowledged), (1, 1));
        assert!(!off.is_exact());
    }
}
