//! Reconnect backoff: exponential with a cap and jitter, so a restarted server is not met
//! by every client at the same instant.

use std::time::Duration;

/// Exponential backoff state. [`Backoff::next_delay`] grows the delay, [`Backoff::reset`]
/// starts over after a connection that worked.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// The first delay.
    base: Duration,
    /// No delay exceeds this.
    max: Duration,
    /// Consecutive failures so far.
    attempt: u32,
}

impl Backoff {
    /// Backoff starting at `base`, doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max, attempt: 0 }
    }

    /// Consecutive failures recorded since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The delay before the next attempt, given `jitter` in `[0, 1)` (a random draw):
    /// `base · 2^attempt`, capped at `max`, then shortened by up to 30 % of itself.
    pub fn next_delay(&mut self, jitter: f64) -> Duration {
        let doubled = self.base.saturating_mul(1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX));
        let capped = doubled.min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        capped.mul_f64(1.0 - 0.3 * jitter.clamp(0.0, 1.0))
    }

    /// Forgets past failures.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
        let delays: Vec<u128> = (0..6).map(|_| backoff.next_delay(0.0).as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 2000, 2000]);
        assert_eq!(backoff.attempts(), 6);
        backoff.reset();
        assert_eq!(backoff.next_delay(0.0), Duration::from_millis(250));
    }

    #[test]
    fn jitter_shortens_by_at_most_thirty_percent() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(backoff.next_delay(1.0), Duration::from_millis(700));
        let delay = backoff.next_delay(0.5);
        assert_eq!(delay, Duration::from_millis(1700));
    }

    #[test]
    fn survives_many_attempts() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..100 {
            assert!(backoff.next_delay(0.0) <= Duration::from_secs(60));
        }
    }
}
