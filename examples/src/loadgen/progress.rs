//! The progress display of a load run: a bar on stderr while users connect, then live
//! counters while the load runs. Hidden entirely when not wanted (no TTY, `--quiet`).

use std::{sync::Mutex, time::Duration};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::stats::CountSnapshot;

/// The bar and what it needs to compute a current rate.
#[derive(Debug)]
pub(super) struct Progress {
    /// The bar (hidden when progress is off).
    bar: ProgressBar,
    /// Delivered count and time at the previous tick, for the current rate.
    last: Mutex<Option<(u64, Duration)>>,
}

impl Progress {
    pub(super) fn new(visible: bool, label: &str, users: u64) -> Self {
        let bar = if visible {
            ProgressBar::with_draw_target(Some(users), ProgressDrawTarget::stderr_with_hz(8))
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) =
            ProgressStyle::with_template("{prefix:.bold} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}")
        {
            bar.set_style(style);
        }
        bar.set_prefix(label.to_owned());
        bar.set_message("connecting");
        Self { bar, last: Mutex::new(None) }
    }

    pub(super) fn connecting(&self, done: u64, failed: u64) {
        self.bar.set_position(done);
        if failed > 0 {
            self.bar.set_message(format!("connecting ({failed} failed)"));
        }
    }

    pub(super) fn running(&self, total: Duration) {
        if let Ok(style) = ProgressStyle::with_template("{prefix:.bold} [{elapsed_precise}] {bar:30.green/blue} {msg}")
        {
            self.bar.set_style(style);
        }
        self.bar.set_length(u64::try_from(total.as_millis()).unwrap_or(u64::MAX));
        self.bar.set_position(0);
        self.bar.set_message("warming up");
    }

    pub(super) fn tick(&self, counts: &CountSnapshot, elapsed: Duration) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let rate = match *last {
            Some((delivered, at)) if elapsed > at => {
                (counts.delivered.saturating_sub(delivered)) as f64 / (elapsed - at).as_secs_f64()
            }
            _ => 0.0,
        };
        *last = Some((counts.delivered, elapsed));
        self.bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        self.bar.set_message(format!(
            "sent {} ok {} delivered {} ({rate:.0}/s) errors {}",
            counts.sent, counts.ack_ok, counts.delivered, counts.errors
        ));
    }

    pub(super) fn draining(&self) {
        self.bar.set_message("draining in-flight messages");
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
