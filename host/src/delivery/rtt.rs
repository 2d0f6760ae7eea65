//! The ack timeout of one connection, from its measured round trips: RFC 6298's estimator
//! (a smoothed round trip and its variation; the timeout is the one plus four times the
//! other), kept within `delivery.ack_timeout_ms` and `delivery.ack_timeout_max_ms` (room for
//! a jittery mobile link, whose round trips can take seconds). A device on a slow or jittery link is not
//! pushed the same message again while its ack is still on the way; one on a fast link
//! keeps the configured timeout.
//!
//! Samples: the server's `ping` answered by `pong` (it echoes `time_ms`), and the time from
//! the first push of a conversation's newest message to the ack that covers it (a push
//! pushed again still counts from its first push: an overestimate, in the safe direction).

use std::sync::Mutex;
use std::time::Duration;

/// A smoothed round trip and its variation, in ms; none before the first sample.
#[derive(Debug, Default)]
pub struct RttEstimate(Mutex<Option<(f64, f64)>>);

impl RttEstimate {
    /// Takes in one measured round trip.
    pub fn sample(&self, rtt: Duration) {
        let r = rtt.as_secs_f64() * 1000.0;
        let mut estimate = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *estimate = Some(match *estimate {
            None => (r, r / 2.0),
            Some((srtt, rttvar)) => (0.875 * srtt + 0.125 * r, 0.75 * rttvar + 0.25 * (srtt - r).abs()),
        });
    }

    /// The ack timeout in ms: smoothed round trip + 4 × its variation, within
    /// `floor..=ceiling`; `floor` before any sample.
    pub fn ack_timeout_ms(&self, floor: u64, ceiling: u64) -> u64 {
        let estimate = *self.0.lock().unwrap_or_else(|p| p.into_inner());
        estimate.map_or(floor, |(srtt, rttvar)| ((srtt + 4.0 * rttvar) as u64).clamp(floor, ceiling.max(floor)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_fast_link_keeps_the_configured_timeout() {
        let rtt = RttEstimate::default();
        assert_eq!(rtt.ack_timeout_ms(2_000, 30_000), 2_000, "no sample yet");
        for _ in 0..20 {
            rtt.sample(ms(40));
        }
        assert_eq!(rtt.ack_timeout_ms(2_000, 30_000), 2_000);
    }

    #[test]
    fn a_slow_link_waits_longer_and_never_past_the_ceiling() {
        let rtt = RttEstimate::default();
        rtt.sample(ms(800));
        // First sample: 800 + 4 × 400.
        assert_eq!(rtt.ack_timeout_ms(300, 30_000), 2_400);
        for sample in [900, 5_000, 700, 9_000, 600, 12_000] {
            rtt.sample(ms(sample));
        }
        let jittery = rtt.ack_timeout_ms(300, 30_000);
        assert!(jittery > 12_000, "jitter widens the timeout: {jittery}");
        assert_eq!(rtt.ack_timeout_ms(300, 10_000), 10_000, "within the ceiling");
    }

    #[test]
    fn a_link_that_calms_down_comes_back_to_the_floor() {
        let rtt = RttEstimate::default();
        rtt.sample(ms(5_000));
        for _ in 0..60 {
            rtt.sample(ms(50));
        }
        assert_eq!(rtt.ack_timeout_ms(2_000, 30_000), 2_000);
    }
}
