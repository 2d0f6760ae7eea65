//! The node's health: what it measures as it works, and the snapshot the `degrade` hook
//! turns into a delivery tier (ARCHITECTURE.md §4).
//!
//! Every `delivery.degrade_interval_ms` the node samples connections, send-queue depths,
//! store write latency, the share of pushes that were redeliveries, its own CPU load and
//! errors per second; the degrade hook (or the built-in default, `normal`) picks the tier,
//! which [`Delivery`](crate::delivery::Delivery) obeys until the next sample.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use herald_plugin_runtime::cpu;
use serde::Serialize;

use crate::clock::{SystemClock, WallClock};

use crate::store::latency::percentile_rank;
pub use crate::store::latency::{LatencyWindow, percentile};

/// Counts the node keeps as it works; the sampler reads them as rates.
#[derive(Default)]
pub struct Vitals {
    /// First pushes of a message to a device.
    pub pushes: AtomicU64,
    /// Pushes again after no ack.
    pub redeliveries: AtomicU64,
    /// Failures a client sees (RETRY for storage, reads that failed).
    pub errors: AtomicU64,
    /// Messages stored as new by this node (the owner of their conversation).
    pub stored: AtomicU64,
    /// send→deliver-ack latencies since the last sample.
    pub deliver_acks: LatencyWindow,
    /// The current tier (see [`Tier`]).
    tier: AtomicU8,
    /// The last sample, and why the tier in force was chosen.
    last: Mutex<(Health, String)>,
    /// The last [`TIMELINE_POINTS`] samples, oldest first: the admin page's charts.
    timeline: Mutex<VecDeque<Point>>,
}

/// How many samples [`Vitals::timeline`] keeps: five minutes at the default interval.
pub const TIMELINE_POINTS: usize = 300;

impl Vitals {
    /// Counts a push (`/metrics` shows the counts as `herald_delivery_pushes_total` and
    /// `herald_delivery_redeliveries_total`: the retry ratio is the one over the other).
    pub fn count_push(&self, attempt: u32) {
        let counter = if attempt > 1 { &self.redeliveries } else { &self.pushes };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a message stored as new.
    pub fn count_stored(&self) {
        self.stored.fetch_add(1, Ordering::Relaxed);
    }

    /// The delivery tier in force.
    pub fn tier(&self) -> Tier {
        Tier::from_u8(self.tier.load(Ordering::Relaxed))
    }

    /// The last health sample.
    pub fn last_sample(&self) -> Health {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// Why the tier in force was chosen (empty before the first sample).
    pub fn tier_reason(&self) -> String {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// The samples' chart points, oldest first.
    pub fn timeline(&self) -> Vec<Point> {
        self.timeline.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
    }

    /// Records a sample, the tier chosen from it and why.
    pub fn record(&self, sample: Sample, tier: Tier, why: String) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = (sample.health, why);
        let mut timeline = self.timeline.lock().unwrap_or_else(|p| p.into_inner());
        if timeline.len() == TIMELINE_POINTS {
            timeline.pop_front();
        }
        timeline.push_back(sample.point);
        drop(timeline);
        self.set_tier(tier);
    }

    fn set_tier(&self, tier: Tier) {
        let previous = Tier::from_u8(self.tier.swap(tier as u8, Ordering::Relaxed));
        if previous != tier {
            tracing::warn!(from = previous.name(), to = tier.name(), "delivery tier changed");
            metrics::gauge!("herald_delivery_tier").set(f64::from(tier as u8));
        }
    }
}

/// Delivery tiers, least degraded first; each sheds what the ones before it shed, and more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum Tier {
    /// Push to online devices, retry until acked, backfill on connect.
    Normal = 0,
    /// No redelivery: a device that does not ack catches up by sync.
    OfflineOnly = 1,
    /// Nor backfill on connect: devices catch up by sync.
    NoBackfill = 2,
    /// No message push at all: online devices get `sync_hint` and pull.
    PullOnly = 3,
}

impl Tier {
    fn from_u8(raw: u8) -> Self {
        match raw {
            0 => Self::Normal,
            1 => Self::OfflineOnly,
            2 => Self::NoBackfill,
            _ => Self::PullOnly,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::OfflineOnly => "offline-only",
            Self::NoBackfill => "no-backfill",
            Self::PullOnly => "pull-only",
        }
    }

    /// Whether unacked pushes are pushed again.
    pub fn retries(self) -> bool {
        self < Self::OfflineOnly
    }

    /// Whether a connecting device is backfilled by push.
    pub fn backfills(self) -> bool {
        self < Self::NoBackfill
    }

    /// Whether live messages are pushed whole (else as `sync_hint`).
    pub fn pushes(self) -> bool {
        self < Self::PullOnly
    }
}

impl From<crate::plugins::types::Tier> for Tier {
    /// The tier a degrade hook chose.
    fn from(tier: crate::plugins::types::Tier) -> Self {
        use crate::plugins::types::Tier as Chosen;
        match tier {
            Chosen::Normal => Self::Normal,
            Chosen::OfflineOnly => Self::OfflineOnly,
            Chosen::NoBackfill => Self::NoBackfill,
            Chosen::PullOnly => Self::PullOnly,
        }
    }
}

/// One health sample, as the degrade hook sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Health {
    pub connections: u64,
    pub send_queue_depth_p99: u32,
    pub send_queue_depth_max: u32,
    pub store_latency_p99_ms: u32,
    pub redelivery_ratio: f32,
    pub cpu_load: f32,
    pub errors_per_second: f32,
}

/// One point of the admin page's charts: the node over one sample interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Point {
    /// When the interval ended, ms since the Unix epoch.
    pub at_ms: u64,
    /// Messages stored as new per second.
    pub messages_per_s: f32,
    /// p99 of send→deliver-ack over the interval, ms (0 when no ack came in).
    pub deliver_p99_ms: f32,
    /// Open client connections.
    pub connections: u64,
    /// Sends taken in and not yet done (`herald_send_backlog`).
    pub backlog: u64,
}

/// What one sample yields: the degrade hook's input and a chart point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub health: Health,
    pub point: Point,
}

/// The send queues as a sample reads them: how many connections are open, and the depths
/// of the queues that hold frames (every other queue holds none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueDepths {
    pub connections: u64,
    pub queued: Vec<u32>,
}

/// The `share` percentile (0..=1) of the depths of `connections` queues, of which those not
/// in `queued` (reordered) are empty; 0 for no connection.
fn depth_percentile(connections: u64, queued: &mut [u32], share: f64) -> u32 {
    let connections = usize::try_from(connections).unwrap_or(usize::MAX);
    let empty = connections.saturating_sub(queued.len());
    // The empty queues take the lowest ranks.
    match percentile_rank(connections, share).checked_sub(empty) {
        Some(at) if at < queued.len() => *queued.select_nth_unstable(at).1,
        _ => 0,
    }
}

/// The shortest window a CPU reading covers: a tick's error over it is at most 0.04 of
/// one core.
const MIN_CPU_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);

/// Turns the running counters into per-window rates.
pub struct Sampler {
    last_at: Instant,
    last_pushes: u64,
    last_redeliveries: u64,
    last_errors: u64,
    last_stored: u64,
    last_cpu_ticks: Option<u64>,
    /// When `last_cpu_ticks` was read.
    cpu_since: Instant,
    /// The load of the last reading.
    last_cpu_load: f32,
    cores: f32,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::new()
    }
}

impl Sampler {
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f32;
        Self {
            last_at: Instant::now(),
            last_pushes: 0,
            last_redeliveries: 0,
            last_errors: 0,
            last_stored: 0,
            last_cpu_ticks: cpu_ticks(),
            cpu_since: Instant::now(),
            last_cpu_load: 0.0,
            cores,
        }
    }

    /// A snapshot from `vitals`, the send queues, the store's write latencies and the send
    /// backlog.
    pub fn sample(
        &mut self,
        vitals: &Vitals,
        queues: QueueDepths,
        store_writes: &LatencyWindow,
        backlog: usize,
    ) -> Sample {
        let now = Instant::now();
        let seconds = now.duration_since(self.last_at).as_secs_f32().max(1e-3);
        self.last_at = now;
        let delta = |counter: &AtomicU64, last: &mut u64| {
            let value = counter.load(Ordering::Relaxed);
            let delta = value.saturating_sub(*last);
            *last = value;
            delta
        };
        let pushes = delta(&vitals.pushes, &mut self.last_pushes);
        let redeliveries = delta(&vitals.redeliveries, &mut self.last_redeliveries);
        let errors = delta(&vitals.errors, &mut self.last_errors);
        let stored = delta(&vitals.stored, &mut self.last_stored);
        let cpu_load = self.cpu_load(now);
        let QueueDepths { connections, queued: mut depths } = queues;
        let point = Point {
            at_ms: SystemClock.now_ms(),
            messages_per_s: stored as f32 / seconds,
            deliver_p99_ms: vitals.deliver_acks.take_p99_micros() as f32 / 1000.0,
            connections,
            backlog: backlog as u64,
        };
        let health = Health {
            connections,
            send_queue_depth_max: depths.iter().copied().max().unwrap_or(0),
            send_queue_depth_p99: depth_percentile(connections, &mut depths, 0.99),
            store_latency_p99_ms: store_writes.take_p99_ms(),
            redelivery_ratio: if pushes + redeliveries == 0 {
                0.0
            } else {
                redeliveries as f32 / (pushes + redeliveries) as f32
            },
            cpu_load,
            errors_per_second: errors as f32 / seconds,
        };
        Sample { health, point }
    }
}

impl Sampler {
    /// The share of the machine's cores this process used since the last reading, less
    /// its plugin compiles. While a compile is under way the reading waits (the last load
    /// stands): the process's time already holds part of the compile, which is subtracted
    /// only once it ends, so the next reading spans it whole.
    ///
    /// A reading also waits until [`MIN_CPU_WINDOW`] has passed since the last: CPU time
    /// comes in clock ticks (10 ms), and one tick over the first sample's window, which
    /// began microseconds earlier at the node's start, read as the machine flat out.
    fn cpu_load(&mut self, now: Instant) -> f32 {
        let window = now.duration_since(self.cpu_since);
        if cpu::compiling() || window < MIN_CPU_WINDOW {
            return self.last_cpu_load;
        }
        let ticks = cpu_ticks();
        let seconds = window.as_secs_f32();
        let load = match (ticks, self.last_cpu_ticks) {
            (Some(now), Some(before)) => {
                now.saturating_sub(before) as f32 / cpu::TICKS_PER_SECOND as f32 / seconds / self.cores
            }
            _ => 0.0,
        };
        (self.last_cpu_ticks, self.cpu_since, self.last_cpu_load) = (ticks, now, load);
        load
    }
}

/// This process's CPU time in clock ticks, less what went into compiling plugins: the load
/// the node carries, not its own warm-up (at start, or on a reload).
fn cpu_ticks() -> Option<u64> {
    Some(cpu::process_ticks()?.saturating_sub(cpu::compile_ticks()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_depth_percentile_counts_the_empty_queues() {
        let p99 = |connections, queued: &[u32]| depth_percentile(connections, &mut queued.to_vec(), 0.99);
        assert_eq!(p99(0, &[]), 0, "no connection");
        assert_eq!(p99(19_000, &[]), 0, "every queue empty");
        assert_eq!(p99(200, &[5]), 0, "one busy queue in 200 is below the 99th");
        assert_eq!(p99(100, &[7, 5]), 5, "two in 100: the 99th is the lesser");
        assert_eq!(p99(3, &[10, 3]), 10);
        assert_eq!(p99(1, &[4]), 4);
        // As the percentile of every depth, the empty ones written out.
        let mut all = vec![0; 97];
        all.extend([9, 2, 6]);
        assert_eq!(p99(100, &[9, 2, 6]), percentile(&mut all, 0.99));
    }

    #[test]
    fn sampler_turns_counts_into_ratios_and_rates() {
        let vitals = Vitals::default();
        let mut sampler = Sampler::new();
        for attempt in [1, 1, 1, 2] {
            vitals.count_push(attempt);
        }
        vitals.count_error();
        let writes = LatencyWindow::default();
        writes.record(Duration::from_millis(12));
        vitals.count_stored();
        vitals.count_stored();
        vitals.deliver_acks.record(Duration::from_micros(4_500));
        let Sample { health, point } =
            sampler.sample(&vitals, QueueDepths { connections: 3, queued: vec![10, 3] }, &writes, 7);
        assert_eq!((health.connections, health.send_queue_depth_max, health.send_queue_depth_p99), (3, 10, 10));
        assert!((health.redelivery_ratio - 0.25).abs() < 1e-6, "{health:?}");
        assert_eq!(health.store_latency_p99_ms, 12);
        assert!(health.errors_per_second > 0.0);
        assert!(point.messages_per_s > 0.0, "{point:?}");
        assert_eq!((point.deliver_p99_ms, point.connections, point.backlog), (4.5, 3, 7));
        let Sample { health: quiet, point: still } = sampler.sample(&vitals, QueueDepths::default(), &writes, 0);
        assert_eq!((still.messages_per_s, still.deliver_p99_ms, still.backlog), (0.0, 0.0, 0));
        assert_eq!(
            (quiet.redelivery_ratio, quiet.errors_per_second, quiet.connections, quiet.store_latency_p99_ms),
            (0.0, 0.0, 0, 0)
        );
    }

    /// The first sample comes at once after the sampler starts: CPU time spent meanwhile
    /// is no load reading (a tick over microseconds read as every core busy).
    #[test]
    fn a_window_too_short_for_the_clock_ticks_reads_no_load() {
        let (vitals, writes) = (Vitals::default(), LatencyWindow::default());
        let mut sampler = Sampler::new();
        let start = Instant::now();
        let mut x = 0_u64;
        while start.elapsed() < Duration::from_millis(40) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        std::hint::black_box(x);
        let Sample { health, .. } = sampler.sample(&vitals, QueueDepths::default(), &writes, 0);
        assert_eq!(health.cpu_load, 0.0, "40 ms is no window to read a load over");
    }

    #[test]
    fn tiers_shed_cumulatively() {
        let shed: Vec<(bool, bool, bool)> = [Tier::Normal, Tier::OfflineOnly, Tier::NoBackfill, Tier::PullOnly]
            .iter()
            .map(|t| (t.retries(), t.backfills(), t.pushes()))
            .collect();
        assert_eq!(shed, vec![(true, true, true), (false, true, true), (false, false, true), (false, false, false)]);
        let vitals = Vitals::default();
        assert_eq!(vitals.tier(), Tier::Normal);
        vitals.set_tier(Tier::NoBackfill);
        assert_eq!(vitals.tier(), Tier::NoBackfill);
    }

    #[test]
    fn the_timeline_keeps_the_last_points_oldest_first_and_the_reason_for_the_tier() {
        let vitals = Vitals::default();
        for at_ms in 0..(TIMELINE_POINTS as u64 + 5) {
            let sample = Sample { health: Health::default(), point: Point { at_ms, ..Point::default() } };
            vitals.record(sample, Tier::OfflineOnly, format!("sample {at_ms}"));
        }
        let timeline = vitals.timeline();
        assert_eq!(timeline.len(), TIMELINE_POINTS);
        assert_eq!((timeline[0].at_ms, timeline[TIMELINE_POINTS - 1].at_ms), (5, TIMELINE_POINTS as u64 + 4));
        assert_eq!(vitals.tier(), Tier::OfflineOnly);
        assert_eq!(vitals.tier_reason(), format!("sample {}", TIMELINE_POINTS + 4));
    }
}
