//! Pacing of what the client writes, so that it stays within the server's limits by itself.
//!
//! [`FrameBudget`]: frames per second, a token bucket holding one second of frames. The
//! server closes a connection sending more than `gateway.frames_per_second` (2,000 by
//! default, a burst on top) with 4029, resends and all; staying under it is cheaper.
//!
//! [`SendWindow`]: how many sends may await their `send_ack` at once, as TCP sizes its window: halved after a
//! RETRY (at most once per round: a RETRY of a send written before the last cut does not cut
//! again), then grown back by one per stored send up to where the last cut came from, and
//! more slowly after that (one per window's worth). A server that turns sends back is sent
//! fewer, not the same again.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub(crate) struct FrameBudget {
    /// Frames per second; 0: no limit.
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl FrameBudget {
    pub(crate) fn new(rate: u32) -> Self {
        let rate = f64::from(rate);
        Self { rate, tokens: rate, at: Instant::now() }
    }

    /// How long until a frame may go (zero: now).
    pub(crate) fn wait(&mut self, now: Instant) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        self.refill(now);
        if self.tokens >= 1.0 { Duration::ZERO } else { Duration::from_secs_f64((1.0 - self.tokens) / self.rate) }
    }

    /// Counts a frame written. Frames that cannot wait (acks, pongs) may take it below zero.
    pub(crate) fn spend(&mut self, now: Instant) {
        if self.rate > 0.0 {
            self.refill(now);
            self.tokens -= 1.0;
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.at = now;
    }
}

#[derive(Debug, Clone)]
pub(crate) struct SendWindow {
    max: f64,
    window: f64,
    threshold: f64,
    cut_at: Option<Instant>,
}

impl SendWindow {
    pub(crate) fn new(max: usize) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let max = max.max(1) as f64;
        Self { max, window: max, threshold: max, cut_at: None }
    }

    /// Sends allowed on the wire now.
    pub(crate) fn size(&self) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let size = self.window.floor() as usize;
        size.max(1)
    }

    /// A send was stored.
    pub(crate) fn stored(&mut self) {
        let step = if self.window < self.threshold { 1.0 } else { 1.0 / self.window };
        self.window = (self.window + step).min(self.max);
    }

    /// A send written at `sent_at` was answered RETRY at `now`.
    pub(crate) fn retried(&mut self, sent_at: Instant, now: Instant) {
        if self.cut_at.is_some_and(|cut| sent_at < cut) {
            return;
        }
        self.window = (self.window / 2.0).floor().max(1.0);
        self.threshold = self.window;
        self.cut_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_a_second_of_frames_then_paces() {
        let start = Instant::now();
        let mut budget = FrameBudget::new(10);
        for _ in 0..10 {
            assert_eq!(budget.wait(start), Duration::ZERO);
            budget.spend(start);
        }
        assert_eq!(budget.wait(start), Duration::from_millis(100));
        assert_eq!(budget.wait(start + Duration::from_millis(100)), Duration::ZERO);
        assert_eq!(FrameBudget::new(0).wait(start), Duration::ZERO, "0: no limit");
    }

    #[test]
    fn halves_once_per_round_and_grows_back() {
        let mut window = SendWindow::new(8);
        let start = Instant::now();
        window.retried(start, start + Duration::from_millis(10));
        assert_eq!(window.size(), 4);
        // Written before the cut: the same round, no second cut.
        window.retried(start, start + Duration::from_millis(11));
        assert_eq!(window.size(), 4);
        window.stored();
        window.stored();
        assert_eq!(window.size(), 4);
        for _ in 0..20 {
            window.stored();
        }
        assert!(window.size() > 4 && window.size() <= 8);
    }
}
