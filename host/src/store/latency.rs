//! A window of recent durations, for a p99: how long the store's batch writes take, read by
//! the health sampler.
//!
//! The window holds a bounded reservoir of samples, so recording stays cheap and its memory
//! fixed however many writes a sample interval sees.

use std::sync::Mutex;
use std::time::Duration;

/// How many latency samples a window keeps; beyond it, new samples replace random old ones
/// (so the p99 stays representative without growing).
const WINDOW_SAMPLES: usize = 4096;

/// Durations recorded since the last [`take_p99_ms`](Self::take_p99_ms), for a p99.
#[derive(Default)]
pub struct LatencyWindow {
    /// The kept samples in µs, and how many durations were recorded into this window (kept
    /// or not), which reservoir sampling needs to keep each with equal chance.
    micros: Mutex<(Vec<u32>, u64)>,
}

impl LatencyWindow {
    /// Records one duration.
    pub fn record(&self, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let mut guard = self.micros.lock().unwrap_or_else(|p| p.into_inner());
        let (samples, seen) = &mut *guard;
        *seen += 1;
        if samples.len() < WINDOW_SAMPLES {
            samples.push(micros);
        } else {
            // Reservoir sampling: each of the `seen` durations is kept with equal chance.
            let slot = rand::random_range(0..*seen);
            if let Some(kept) = usize::try_from(slot).ok().and_then(|slot| samples.get_mut(slot)) {
                *kept = micros;
            }
        }
    }

    /// The 99th percentile of what was recorded since the last call, in whole ms (rounded
    /// up, so any latency shows), and starts a new window. 0 when nothing was recorded.
    pub fn take_p99_ms(&self) -> u32 {
        self.take_p99_micros().div_ceil(1000)
    }

    /// The 99th percentile of what was recorded since the last call, in µs, and starts a
    /// new window. 0 when nothing was recorded.
    pub fn take_p99_micros(&self) -> u32 {
        let mut samples = {
            let mut guard = self.micros.lock().unwrap_or_else(|p| p.into_inner());
            guard.1 = 0;
            std::mem::take(&mut guard.0)
        };
        percentile(&mut samples, 0.99)
    }
}

/// The `share` percentile (0..=1) of `values` (reordered), 0 for none.
pub fn percentile(values: &mut [u32], share: f64) -> u32 {
    if values.is_empty() {
        return 0;
    }
    *values.select_nth_unstable(percentile_rank(values.len(), share)).1
}

/// Where the `share` percentile (0..=1) of `count` values sits among them in ascending
/// order (0 for none).
pub fn percentile_rank(count: usize, share: f64) -> usize {
    ((count as f64 * share).ceil() as usize).clamp(1, count.max(1)) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_picks_the_rank() {
        let mut values: Vec<u32> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut values, 0.99), 99);
        assert_eq!(percentile(&mut values, 0.5), 50);
        assert_eq!(percentile(&mut [7], 0.99), 7);
        assert_eq!(percentile(&mut [], 0.99), 0);
    }

    #[test]
    fn latency_window_reports_p99_in_ms_and_restarts() {
        let window = LatencyWindow::default();
        for _ in 0..98 {
            window.record(Duration::from_micros(200));
        }
        window.record(Duration::from_millis(40));
        window.record(Duration::from_millis(90));
        assert_eq!(window.take_p99_ms(), 40);
        assert_eq!(window.take_p99_ms(), 0, "a new window is empty");
        for _ in 0..10_000 {
            window.record(Duration::from_millis(3));
        }
        assert_eq!(window.take_p99_ms(), 3, "a full window keeps sampling");
    }
}
