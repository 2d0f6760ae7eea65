//! The intake's delay gate: new sends are turned back while the node answers none of the
//! sends it took in quickly.
//!
//! A token bucket caps how fast a node takes sends in, but not how fast it can serve them
//! at the moment: Redis or the database slowed down, an owner node overloaded, the machine
//! shared. Past that point sends queue, and a queue long enough for the deadlines further in
//! to pass (a forwarded send's, a route lookup's, a delivery hop's) turns itself into more
//! work: RETRYs of sends already taken in and resent, fan-outs sent to every node,
//! deliveries left to sync. The gate watches what the sends it took in wait for their ack.
//! When, over a whole window, not one was answered within the target, a queue is standing
//! (CoDel's signal: the least wait says whether the queue ever drains, where a mean or a
//! percentile also moves with a burst that drains by itself), and new sends get RETRY until
//! one is answered within the target again. Sends already taken in go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a window of answers is: short beside the deadlines it protects (a forwarded
/// send's 2 s), long beside a commit (a few ms), so one window holds many answers.
pub const WINDOW: Duration = Duration::from_millis(100);

/// No answer in the window yet.
const NONE: u64 = u64::MAX;

/// Whether sends are answered quickly enough to take more in.
pub struct DelayGate {
    /// The wait a window's quickest answer must stay within, µs; 0: the gate is off.
    target_us: u64,
    started: Instant,
    /// When the current window began, µs after `started`.
    window_start_us: AtomicU64,
    /// The least wait answered in the current window, µs (`NONE`: none yet).
    least_us: AtomicU64,
    /// Whether new sends are turned back, as the last window ended.
    shut: AtomicBool,
}

impl DelayGate {
    /// A gate holding answers to `target` (zero: always open).
    pub fn new(target: Duration) -> Self {
        Self {
            target_us: u64::try_from(target.as_micros()).unwrap_or(u64::MAX),
            started: Instant::now(),
            window_start_us: AtomicU64::new(0),
            least_us: AtomicU64::new(NONE),
            shut: AtomicBool::new(false),
        }
    }

    /// A send taken in was answered after waiting `waited`.
    pub fn answered(&self, waited: Duration, waiting: bool) {
        self.answered_at(self.now_us(), waited, waiting);
    }

    /// Whether a new send is turned back now; `waiting`: whether any send taken in is still
    /// unanswered.
    pub fn is_shut(&self, waiting: bool) -> bool {
        self.is_shut_at(self.now_us(), waiting)
    }

    fn answered_at(&self, now_us: u64, waited: Duration, waiting: bool) {
        if self.target_us == 0 {
            return;
        }
        self.roll(now_us, waiting);
        self.least_us.fetch_min(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX - 1), Ordering::Relaxed);
    }

    fn is_shut_at(&self, now_us: u64, waiting: bool) -> bool {
        if self.target_us == 0 {
            return false;
        }
        self.roll(now_us, waiting);
        self.shut.load(Ordering::Relaxed)
    }

    /// Ends the window once it is over: shut when its quickest answer waited past the
    /// target; with no answer at all, shut stays shut only while sends are still waiting
    /// (a shut gate with nothing in flight would never see an answer to open it).
    fn roll(&self, now_us: u64, waiting: bool) {
        let start = self.window_start_us.load(Ordering::Relaxed);
        let window = u64::try_from(WINDOW.as_micros()).unwrap_or(u64::MAX);
        if now_us.saturating_sub(start) < window {
            return;
        }
        if self.window_start_us.compare_exchange(start, now_us, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return; // another caller ended it
        }
        let least = self.least_us.swap(NONE, Ordering::Relaxed);
        let shut = if least == NONE { self.shut.load(Ordering::Relaxed) && waiting } else { least > self.target_us };
        if self.shut.swap(shut, Ordering::Relaxed) != shut {
            metrics::gauge!("herald_intake_delay_shut").set(if shut { 1.0 } else { 0.0 });
            if shut {
                tracing::warn!(
                    quickest_ms = least / 1000,
                    "sends wait past intake.send_delay_target_ms; turning new sends back"
                );
            } else {
                tracing::info!("sends are answered within intake.send_delay_target_ms again; taking new sends in");
            }
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_window_with_no_quick_answer_shuts_the_gate_and_one_quick_answer_opens_it() {
        let gate = DelayGate::new(ms(200));
        // Window 1: every answer slow.
        for at in [110, 150, 190] {
            gate.answered_at(at * MS, ms(350), true);
        }
        assert!(!gate.is_shut_at(199 * MS, true), "judged when the window ends, not before");
        assert!(gate.is_shut_at(210 * MS, true), "not one answer within 200 ms in a whole window");
        // Window 2: one quick answer among slow ones.
        gate.answered_at(250 * MS, ms(500), true);
        gate.answered_at(260 * MS, ms(20), true);
        assert!(gate.is_shut_at(300 * MS, true), "still the last window's verdict");
        assert!(!gate.is_shut_at(320 * MS, true), "one answer within the target: the queue drains");
    }

    #[test]
    fn a_burst_that_drains_by_itself_never_shuts_it() {
        let gate = DelayGate::new(ms(200));
        for at in (100..1_000).step_by(10) {
            // Most answers slow, but some in every window quick: a queue that empties.
            let waited = if at % 50 == 0 { ms(5) } else { ms(900) };
            gate.answered_at(at * MS, waited, true);
            assert!(!gate.is_shut_at(at * MS, true), "shut at {at} ms");
        }
    }

    #[test]
    fn a_shut_gate_with_nothing_waiting_opens_and_with_sends_waiting_stays_shut() {
        let gate = DelayGate::new(ms(200));
        gate.answered_at(150 * MS, ms(400), true);
        assert!(gate.is_shut_at(260 * MS, true));
        assert!(gate.is_shut_at(400 * MS, true), "no answer, sends still waiting: still shut");
        assert!(!gate.is_shut_at(520 * MS, false), "nothing waiting: nothing left to answer it");
    }

    #[test]
    fn a_zero_target_turns_it_off() {
        let gate = DelayGate::new(Duration::ZERO);
        gate.answered_at(150 * MS, ms(10_000), true);
        assert!(!gate.is_shut_at(500 * MS, true));
    }
}
