//! Circuit breakers: a dependency that keeps failing is not called for a while, so callers
//! fail at once instead of each spending its whole deadline on it, and the dependency gets
//! room to recover instead of a queue of retries (docs/decisions/0001).
//!
//! A [`Breaker`] is closed while calls succeed. [`BreakerConfig::failures`] failed or
//! timed-out calls in a row, the run lasting at least [`BreakerConfig::span`], open it: for
//! [`BreakerConfig::open_for`] every call is refused without being tried. The span matters
//! because calls overlap: a dependency that stalls for one deadline fails every call in
//! flight at once, hundreds "in a row" under load, and that alone must not cut it off for
//! seconds; one that is down fails them all for as long as it is down. Then it half-opens: calls go through again, the first success
//! closes it and the first failure opens it for another period. The state machine is
//! `failsafe`'s; this module adds what the node needs around it: a name, the state as a
//! number for `/metrics` (`herald_breaker_state{breaker}`: 0 closed, 1 half-open, 2 open),
//! counts of openings and refused calls, and a log line at each change.
//!
//! Cluster mode puts one on the node's Redis connection and one on each peer link. The
//! membership lease's renewals go over a connection of their own with no breaker, on
//! purpose: a lease must be renewed while Redis answers at all, and an open breaker there
//! would fence a node that a few slow lookups had nothing to do with.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use failsafe::{FailurePolicy, Instrument, StateMachine};
use serde::Serialize;

/// When a breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failed calls in a row that open it.
    pub failures: u32,
    /// The least time from the first to the last of those failures.
    pub span: Duration,
    /// How long it stays open before it lets calls through to probe.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    /// 10 failures in a row over at least 1 s open it for 5 s (docs/decisions/0001).
    fn default() -> Self {
        Self { failures: 10, span: Duration::from_secs(1), open_for: Duration::from_secs(5) }
    }
}

/// `failsafe`'s policy for [`BreakerConfig`]: failures in a row, over a least span.
#[derive(Debug)]
struct SustainedFailures {
    config: BreakerConfig,
    /// Failures since the last success, and when the first of them came.
    run: u32,
    since: Option<Instant>,
}

impl FailurePolicy for SustainedFailures {
    fn record_success(&mut self) {
        self.revived();
    }

    fn mark_dead_on_failure(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        self.run = self.run.saturating_add(1);
        (self.run >= self.config.failures && now.duration_since(since) >= self.config.span)
            .then_some(self.config.open_for)
    }

    fn revived(&mut self) {
        self.run = 0;
        self.since = None;
    }
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Its open period ended: calls go through, and the next outcome decides.
    HalfOpen,
    /// Calls are refused at once.
    Open,
}

impl BreakerState {
    fn from_number(number: u8) -> Self {
        match number {
            0 => Self::Closed,
            1 => Self::HalfOpen,
            _ => Self::Open,
        }
    }

    /// The state as `/admin/health` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::HalfOpen => "half_open",
            Self::Open => "open",
        }
    }

    fn number(self) -> u8 {
        match self {
            Self::Closed => 0,
            Self::HalfOpen => 1,
            Self::Open => 2,
        }
    }
}

/// A circuit breaker on one dependency. Cloning shares it.
#[derive(Clone)]
pub struct Breaker {
    machine: StateMachine<SustainedFailures, Observer>,
    observer: Observer,
}

/// What `/admin/cluster` and `/readyz` show of a breaker.
#[derive(Debug, Clone, Serialize)]
pub struct BreakerStatus {
    pub name: String,
    pub state: BreakerState,
    /// How many times it opened since the node started.
    pub opened: u64,
    /// Calls it refused since the node started.
    pub refused: u64,
}

impl Breaker {
    /// A closed breaker named `name` (the `breaker` label of its metrics, and its logs).
    pub fn new(name: impl Into<String>, config: BreakerConfig) -> Self {
        let observer = Observer(Arc::new(Counts {
            name: name.into(),
            state: AtomicU8::new(BreakerState::Closed.number()),
            opened: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }));
        let policy = SustainedFailures { config, run: 0, since: None };
        Self { machine: StateMachine::new(policy, observer.clone()), observer }
    }

    /// Whether a call may be made now. Each call made must then be reported with
    /// [`success`](Self::success) or [`failure`](Self::failure).
    pub fn permits(&self) -> bool {
        self.machine.is_call_permitted()
    }

    /// The dependency answered.
    pub fn success(&self) {
        self.machine.on_success();
    }

    /// The dependency failed or did not answer in time.
    pub fn failure(&self) {
        self.machine.on_error();
    }

    /// Closes it now: the dependency is known to answer again (another path to it just
    /// succeeded), so callers need not wait out the open period.
    pub fn reset(&self) {
        self.machine.reset();
    }

    /// Where it stands now. An open breaker whose period ended reads as open until the
    /// next call asks ([`permits`](Self::permits)) and half-opens it.
    pub fn state(&self) -> BreakerState {
        BreakerState::from_number(self.observer.0.state.load(Ordering::Relaxed))
    }

    /// Its name and counts.
    pub fn status(&self) -> BreakerStatus {
        let counts = &self.observer.0;
        BreakerStatus {
            name: counts.name.clone(),
            state: self.state(),
            opened: counts.opened.load(Ordering::Relaxed),
            refused: counts.refused.load(Ordering::Relaxed),
        }
    }
}

/// Receives the state machine's events: keeps the state readable without its lock, and
/// reports each change to metrics and the log.
#[derive(Clone)]
struct Observer(Arc<Counts>);

struct Counts {
    name: String,
    state: AtomicU8,
    opened: AtomicU64,
    refused: AtomicU64,
}

impl Observer {
    fn enter(&self, state: BreakerState) {
        let counts = &self.0;
        let previous = BreakerState::from_number(counts.state.swap(state.number(), Ordering::Relaxed));
        metrics::gauge!("herald_breaker_state", "breaker" => counts.name.clone()).set(f64::from(state.number()));
        match (previous, state) {
            (_, BreakerState::Open) => {
                counts.opened.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("herald_breaker_opened_total", "breaker" => counts.name.clone()).increment(1);
                tracing::warn!(breaker = %counts.name, "circuit breaker open: calls are refused at once for a while");
            }
            (BreakerState::HalfOpen, BreakerState::Closed) => {
                tracing::info!(breaker = %counts.name, "circuit breaker closed again: the dependency answers");
            }
            _ => {}
        }
    }
}

impl Instrument for Observer {
    fn on_call_rejected(&self) {
        self.0.refused.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("herald_breaker_refused_total", "breaker" => self.0.name.clone()).increment(1);
    }

    fn on_open(&self) {
        self.enter(BreakerState::Open);
    }

    fn on_half_open(&self) {
        self.enter(BreakerState::HalfOpen);
    }

    fn on_closed(&self) {
        self.enter(BreakerState::Closed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u32, open_for_ms: u64) -> Breaker {
        let open_for = Duration::from_millis(open_for_ms);
        Breaker::new("test", BreakerConfig { failures, span: Duration::ZERO, open_for })
    }

    #[test]
    fn opens_after_the_configured_failures_in_a_row_only() {
        let breaker = breaker(3, 60_000);
        for _ in 0..2 {
            assert!(breaker.permits());
            breaker.failure();
        }
        breaker.success();
        for _ in 0..2 {
            breaker.failure();
        }
        assert_eq!(breaker.state(), BreakerState::Closed, "a success in between starts the count again");
        breaker.failure();
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(!breaker.permits() && !breaker.permits());
        let status = breaker.status();
        assert_eq!((status.opened, status.refused), (1, 2));
    }

    #[test]
    fn failures_in_a_row_open_it_only_once_they_span_the_configured_time() {
        let config = BreakerConfig { failures: 3, span: Duration::from_millis(50), open_for: Duration::from_secs(60) };
        let breaker = Breaker::new("test", config);
        for _ in 0..100 {
            breaker.failure();
        }
        assert_eq!(breaker.state(), BreakerState::Closed, "a burst of calls failing together is one stall");
        std::thread::sleep(Duration::from_millis(60));
        breaker.failure();
        assert_eq!(breaker.state(), BreakerState::Open, "still failing after the span");
    }

    #[test]
    fn half_opens_after_its_period_then_a_success_closes_it_and_a_failure_reopens_it() {
        let breaker = breaker(1, 30);
        breaker.failure();
        assert!(!breaker.permits());
        std::thread::sleep(Duration::from_millis(60));
        assert!(breaker.permits(), "the period ended: a probe goes through");
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        breaker.failure();
        assert_eq!(breaker.state(), BreakerState::Open, "the probe failed");
        assert!(!breaker.permits());
        std::thread::sleep(Duration::from_millis(60));
        assert!(breaker.permits());
        breaker.success();
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.status().opened, 2);
    }
}
