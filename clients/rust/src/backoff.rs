//! Reconnect delays: exponential backoff with full jitter (a uniformly random wait between
//! 0 and the capped exponential), so that clients dropped together do not return together.

use std::time::Duration;

/// The reconnect backoff's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffOptions {
    /// The cap of the first wait (default 500 ms).
    pub initial_delay: Duration,
    /// The largest cap (default 30 s).
    pub max_delay: Duration,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        Self { initial_delay: Duration::from_millis(500), max_delay: Duration::from_secs(30) }
    }
}

/// Counts failed attempts since the last good connection and draws the next wait.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    attempt: u32,
    initial_ms: u64,
    max_ms: u64,
}

impl Backoff {
    pub(crate) fn new(options: BackoffOptions) -> Self {
        let initial_ms = u64::try_from(options.initial_delay.as_millis()).unwrap_or(u64::MAX).max(1);
        let max_ms = u64::try_from(options.max_delay.as_millis()).unwrap_or(u64::MAX).max(initial_ms);
        Self { attempt: 0, initial_ms, max_ms }
    }

    /// The cap of the next wait: initial × 2^attempt, at most max.
    pub(crate) fn cap_ms(&self) -> u64 {
        let factor = 1u64.checked_shl(self.attempt.min(63)).unwrap_or(u64::MAX);
        self.initial_ms.saturating_mul(factor).min(self.max_ms)
    }

    /// The wait before the next attempt, uniform in [0, cap); each call doubles the cap.
    pub(crate) fn next(&mut self, random: f64) -> Duration {
        let cap = self.cap_ms();
        // `random` is in [0, 1): the product stays below the cap.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let delay = ((random.clamp(0.0, 1.0) * cap as f64) as u64).min(cap.saturating_sub(1));
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(delay)
    }

    /// A connection held: start again from the initial cap.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_doubles_up_to_the_max_and_resets() {
        let mut backoff = Backoff::new(BackoffOptions {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1_000),
        });
        let caps: Vec<u64> = (0..6)
            .map(|_| {
                let cap = backoff.cap_ms();
                backoff.next(0.5);
                cap
            })
            .collect();
        assert_eq!(caps, [100, 200, 400, 800, 1_000, 1_000]);
        backoff.reset();
        assert_eq!(backoff.cap_ms(), 100);
    }

    #[test]
    fn full_jitter_stays_in_zero_to_cap() {
        let mut backoff = Backoff::new(BackoffOptions::default());
        assert_eq!(backoff.next(0.0), Duration::ZERO);
        backoff.reset();
        assert!(backoff.next(0.999_999) < Duration::from_millis(500));
        assert!(backoff.next(0.5) == Duration::from_millis(500));
    }
}
