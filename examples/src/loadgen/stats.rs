//! What a load run counts and measures: event counters shared by every simulated user and
//! latency histograms, read out as [`CountSnapshot`]s and [`LatencySummary`]s; `report.rs`
//! adds them up to the run's [`Report`](super::Report).
//!
//! Counters are relaxed atomics (they are read for progress and once at the end, never to
//! synchronise); histograms are sharded behind mutexes so a thousand user tasks rarely
//! meet on one lock.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Highest latency a histogram records precisely, in microseconds (one minute); larger
/// values are clamped to it.
pub(super) const MAX_TRACKED_US: u64 = 60_000_000;

/// One event counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn incr(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Everything a run counts. "Window" counters only count events inside the measurement
/// window (after warm-up, before the end of the duration).
#[derive(Debug, Default)]
pub struct Counters {
    /// Users whose connect and login succeeded.
    pub connected: Counter,
    /// Users whose connect or login failed.
    pub connect_failures: Counter,
    /// Distinct messages sent (a resend after RETRY is not counted again).
    pub sent: Counter,
    /// Messages sent inside the window.
    pub window_sent: Counter,
    /// Resends after a RETRY `send_ack`.
    pub resent: Counter,
    /// `send_ack` OK.
    pub ack_ok: Counter,
    /// `send_ack` DUPLICATE.
    pub ack_duplicate: Counter,
    /// `send_ack` REJECTED.
    pub ack_rejected: Counter,
    /// `send_ack` RETRY.
    pub ack_retry: Counter,
    /// Sends abandoned after too many RETRYs.
    pub given_up: Counter,
    /// Distinct messages received by their recipient (deliver or sync).
    pub delivered: Counter,
    /// Distinct messages received inside the window.
    pub window_delivered: Counter,
    /// Messages received again (redelivery or overlap of deliver and sync).
    pub duplicates: Counter,
    /// Delivers with `attempt` > 1.
    pub redelivered: Counter,
    /// `deliver_ack`s sent.
    pub deliver_acks: Counter,
    /// Received messages whose body, ids, sender or conversation were wrong.
    pub corrupt: Counter,
    /// Frames that made no sense (unknown `client_msg_id`, a frame the client never asks
    /// for).
    pub unexpected: Counter,
    /// `error` frames from the server.
    pub server_errors: Counter,
    /// Connections lost during the run.
    pub disconnects: Counter,
    /// `sync_hint`s received (push degraded to pull).
    pub sync_hints: Counter,
    /// `go_away`s received.
    pub go_aways: Counter,
}

impl Counters {
    /// Every count that means something went wrong.
    pub fn errors(&self) -> u64 {
        self.connect_failures.get()
            + self.ack_rejected.get()
            + self.given_up.get()
            + self.corrupt.get()
            + self.unexpected.get()
            + self.server_errors.get()
            + self.disconnects.get()
    }

    /// Sends whose outcome is final: acknowledged OK, DUPLICATE or REJECTED, or given up.
    pub fn sends_settled(&self) -> u64 {
        self.ack_ok.get() + self.ack_duplicate.get() + self.ack_rejected.get() + self.given_up.get()
    }
}

/// A latency histogram split into shards, each behind its own lock.
#[derive(Debug)]
pub struct LatencyRecorder {
    /// Shard `i` serves the users whose index is `i` modulo the shard count.
    shards: Vec<Mutex<Histogram<u64>>>,
}

impl LatencyRecorder {
    /// A recorder with `shards` shards (at least one).
    ///
    /// # Panics
    ///
    /// Never in practice: the histogram bounds are constants that hdrhistogram accepts.
    pub fn new(shards: usize) -> Self {
        Self { shards: (0..shards.max(1)).map(|_| Mutex::new(new_histogram())).collect() }
    }

    /// Records one latency, in microseconds, on the shard of user `user`.
    pub fn record(&self, user: usize, micros: u64) {
        let shard = &self.shards[user % self.shards.len()];
        let mut histogram = shard.lock().unwrap_or_else(|poison| poison.into_inner());
        histogram.saturating_record(micros.clamp(1, MAX_TRACKED_US));
    }

    /// All shards merged.
    pub fn merged(&self) -> Histogram<u64> {
        let mut total = new_histogram();
        for shard in &self.shards {
            let histogram = shard.lock().unwrap_or_else(|poison| poison.into_inner());
            // Same bounds on both sides: adding cannot fail.
            let _ = total.add(&*histogram);
        }
        total
    }
}

#[allow(clippy::expect_used, reason = "constant bounds that hdrhistogram accepts")]
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_US, 3).expect("valid histogram bounds")
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest value.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
}

impl LatencySummary {
    /// Summarises a histogram (all zero if it is empty).
    pub fn of<T: hdrhistogram::Counter>(histogram: &Histogram<T>) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        Self {
            count: histogram.len(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
            mean_us: histogram.mean(),
        }
    }

    /// The summary as a JSON object (`count`, `p50_us`, … `max_us`, `mean_us`).
    pub fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "p50_us": self.p50_us,
            "p90_us": self.p90_us,
            "p99_us": self.p99_us,
            "p999_us": self.p999_us,
            "max_us": self.max_us,
            "mean_us": (self.mean_us * 10.0).round() / 10.0,
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs, reason = "one field per Counters field, documented there")]
pub struct CountSnapshot {
    pub connected: u64,
    pub connect_failures: u64,
    pub sent: u64,
    pub window_sent: u64,
    pub resent: u64,
    pub ack_ok: u64,
    pub ack_duplicate: u64,
    pub ack_rejected: u64,
    pub ack_retry: u64,
    pub given_up: u64,
    pub delivered: u64,
    pub window_delivered: u64,
    pub duplicates: u64,
    pub redelivered: u64,
    pub deliver_acks: u64,
    pub corrupt: u64,
    pub unexpected: u64,
    pub server_errors: u64,
    pub disconnects: u64,
    pub sync_hints: u64,
    pub go_aways: u64,
    pub errors: u64,
}

impl CountSnapshot {
    /// What the drain still waited for: sends without a final answer (neither accepted,
    /// rejected nor given up after RETRYs), and accepted ones not yet delivered.
    pub fn not_drained(&self) -> (u64, u64) {
        let accepted = self.ack_ok + self.ack_duplicate;
        let answered = accepted + self.ack_rejected + self.given_up;
        (self.sent.saturating_sub(answered), accepted.saturating_sub(self.delivered))
    }

    /// Reads every counter.
    pub fn of(counters: &Counters) -> Self {
        Self {
            connected: counters.connected.get(),
            connect_failures: counters.connect_failures.get(),
            sent: counters.sent.get(),
            window_sent: counters.window_sent.get(),
            resent: counters.resent.get(),
            ack_ok: counters.ack_ok.get(),
            ack_duplicate: counters.ack_duplicate.get(),
            ack_rejected: counters.ack_rejected.get(),
            ack_retry: counters.ack_retry.get(),
            given_up: counters.given_up.get(),
            delivered: counters.delivered.get(),
            window_delivered: counters.window_delivered.get(),
            duplicates: counters.duplicates.get(),
            redelivered: counters.redelivered.get(),
            deliver_acks: counters.deliver_acks.get(),
            corrupt: counters.corrupt.get(),
            unexpected: counters.unexpected.get(),
            server_errors: counters.server_errors.get(),
            disconnects: counters.disconnects.get(),
            sync_hints: counters.sync_hints.get(),
            go_aways: counters.go_aways.get(),
            errors: counters.errors(),
        }
    }
}

/// `count / duration` in events per second (0 for an empty duration).
pub fn per_second(count: u64, duration: Duration) -> f64 {
    let seconds = duration.as_secs_f64();
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

/// Microseconds as a short human string: `850us`, `3.20ms`, `1.50s`.
pub fn format_us(micros: u64) -> String {
    if micros < 1_000 {
        format!("{micros}us")
    } else if micros < 1_000_000 {
        format!("{:.2}ms", micros as f64 / 1_000.0)
    } else {
        format!("{:.2}s", micros as f64 / 1_000_000.0)
    }
}

pub(super) fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A send given up after RETRYs, or rejected, is settled: only sends still waiting
    /// for an answer, and accepted ones still on their way, kept the drain waiting.
    #[test]
    fn the_drain_waits_for_unanswered_sends_and_undelivered_accepted_ones_only() {
        let counts = CountSnapshot {
            sent: 10,
            ack_ok: 6,
            ack_duplicate: 1,
            ack_rejected: 1,
            given_up: 1,
            delivered: 5,
            ..CountSnapshot::default()
        };
        assert_eq!(counts.not_drained(), (1, 2));
    }

    #[test]
    fn microseconds_read_well() {
        assert_eq!(format_us(850), "850us");
        assert_eq!(format_us(3_200), "3.20ms");
        assert_eq!(format_us(1_500_000), "1.50s");
    }

    #[test]
    fn rates_divide_by_the_window() {
        assert_eq!(per_second(500, Duration::from_millis(500)), 1000.0);
        assert_eq!(per_second(5, Duration::ZERO), 0.0);
    }

    #[test]
    fn sharded_latencies_merge() {
        let recorder = LatencyRecorder::new(4);
        for user in 0..100 {
            recorder.record(user, 1_000);
        }
        recorder.record(7, 0);
        recorder.record(7, u64::MAX);
        let summary = LatencySummary::of(&recorder.merged());
        assert_eq!(summary.count, 102);
        assert!((995..=1005).contains(&summary.p50_us));
        assert!(summary.max_us >= MAX_TRACKED_US);
    }

    #[test]
    fn empty_histograms_summarise_to_zero() {
        assert_eq!(LatencySummary::of(&LatencyRecorder::new(1).merged()), LatencySummary::default());
    }
}
