//! How many sends may await their `send_ack` at once, as TCP sizes its window: halved after a
//! RETRY (at most once per round: a RETRY of a send written before the last cut does not cut
//! again), then grown back by one per stored send up to where the last cut came from, and
//! more slowly after that (one per window's worth). A server that turns sends back is sent
//! fewer, not the same again.

use tokio::time::Instant;

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
    use std::time::Duration;

    use super::*;

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
