//! Per-plugin call statistics and the quarantine rule.
//!
//! The hot path writes one atomic: a bucket of a log-linear latency histogram (4 buckets
//! per power of two, so a reported percentile is within 25 % of the truth). The call count
//! is the histogram's total, read only by status queries. Failure counts and timestamps
//! (the latter kept for the quarantine window, behind a mutex) are touched only by
//! failing calls.

use crate::config::QuarantinePolicy;
use parking_lot::Mutex;
use std::{
    collections::VecDeque,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};
use tokio::time::Instant;

const BUCKETS: usize = 64 * 4;

fn bucket_of(ns: u64) -> usize {
    if ns < 4 {
        return usize::try_from(ns).unwrap_or(0);
    }
    let log = 63 - u64::from(ns.leading_zeros());
    let sub = (ns >> (log - 2)) & 3;
    usize::try_from(log * 4 + sub).unwrap_or(BUCKETS - 1).min(BUCKETS - 1)
}

/// The largest value that falls in bucket `i`.
fn bucket_upper(i: usize) -> u64 {
    if i < 8 {
        // 0..=3 hold themselves; 4..8 are unused (values from 4 start at bucket 8).
        return i.min(3) as u64;
    }
    let (log, sub) = ((i / 4) as u32, (i % 4) as u64);
    ((4 + sub + 1) << (log - 2)).saturating_sub(1)
}

/// Counters and the quarantine state of one loaded plugin version.
pub(crate) struct PluginStats {
    pub failures: AtomicU64,
    pub timeouts: AtomicU64,
    histogram: Box<[AtomicU64; BUCKETS]>,
    /// When the current quarantine ends, as nanoseconds since `origin` (0 = not quarantined).
    quarantined_until: AtomicU64,
    origin: Instant,
    recent_failures: Mutex<VecDeque<Instant>>,
    pub last_error: Mutex<Option<String>>,
    pub quarantines: AtomicU64,
}

impl PluginStats {
    pub fn new() -> Self {
        Self {
            failures: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            histogram: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            quarantined_until: AtomicU64::new(0),
            origin: Instant::now(),
            recent_failures: Mutex::new(VecDeque::new()),
            last_error: Mutex::new(None),
            quarantines: AtomicU64::new(0),
        }
    }

    fn since_origin(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX).max(1)
    }

    /// Records a call's duration (and so counts the call).
    pub fn record_call(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.histogram[bucket_of(ns)].fetch_add(1, Relaxed);
    }

    /// Records a failure; `true` when it starts a quarantine.
    pub fn record_failure(&self, error: String, timeout: bool, rule: &QuarantinePolicy) -> bool {
        self.failures.fetch_add(1, Relaxed);
        if timeout {
            self.timeouts.fetch_add(1, Relaxed);
        }
        *self.last_error.lock() = Some(error);
        let now = Instant::now();
        let window = Duration::from_millis(rule.window_ms);
        let mut recent = self.recent_failures.lock();
        recent.push_back(now);
        while recent.front().is_some_and(|t| now.saturating_duration_since(*t) > window) {
            recent.pop_front();
        }
        if rule.failures > 0 && recent.len() >= rule.failures as usize && !self.is_quarantined() {
            recent.clear();
            let until = now + Duration::from_millis(rule.duration_ms);
            self.quarantined_until.store(self.since_origin(until), Relaxed);
            self.quarantines.fetch_add(1, Relaxed);
            return true;
        }
        false
    }

    /// Whether calls skip the plugin now.
    pub fn is_quarantined(&self) -> bool {
        self.quarantine_left().is_some()
    }

    /// Time left in the current quarantine.
    pub fn quarantine_left(&self) -> Option<Duration> {
        let until = self.quarantined_until.load(Relaxed);
        if until == 0 {
            return None;
        }
        let now = self.since_origin(Instant::now());
        (now < until).then(|| Duration::from_nanos(until - now))
    }

    /// Calls recorded so far.
    pub fn calls(&self) -> u64 {
        self.histogram.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// The `q` quantile (0..=1) of call durations, `None` before the first call.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let counts: Vec<u64> = self.histogram.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Duration::from_nanos(bucket_upper(i)));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_values() {
        for ns in [0u64, 3, 4, 5, 7, 8, 100, 999, 1_000, 123_456, 10_000_000_000] {
            let b = bucket_of(ns);
            assert!(bucket_upper(b) >= ns, "{ns} in bucket {b} with upper {}", bucket_upper(b));
            if b > 0 {
                assert!(bucket_upper(b - 1) < ns, "{ns}");
            }
        }
    }

    #[test]
    fn p99_reflects_the_slow_tail() {
        let s = PluginStats::new();
        for _ in 0..98 {
            s.record_call(Duration::from_micros(1));
        }
        s.record_call(Duration::from_millis(10));
        s.record_call(Duration::from_millis(10));
        let p99 = s.quantile(0.99).unwrap_or_default();
        assert!(p99 >= Duration::from_millis(10) && p99 < Duration::from_millis(13), "{p99:?}");
        let p50 = s.quantile(0.5).unwrap_or_default();
        assert!(p50 < Duration::from_micros(2), "{p50:?}");
    }

    #[test]
    fn n_failures_in_the_window_quarantine() {
        let rule = QuarantinePolicy { failures: 3, window_ms: 60_000, duration_ms: 60_000 };
        let s = PluginStats::new();
        assert!(!s.record_failure("a".into(), false, &rule));
        assert!(!s.record_failure("b".into(), true, &rule));
        assert!(s.record_failure("c".into(), false, &rule));
        assert!(s.is_quarantined());
        assert_eq!(s.timeouts.load(Relaxed), 1);
        assert_eq!(s.last_error.lock().as_deref(), Some("c"));
    }
}
