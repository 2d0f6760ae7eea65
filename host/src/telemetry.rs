//! Prometheus metrics: one recorder per process, rendered at `GET /metrics` (PROTOCOL.md).
//!
//! Counters, gauges and histograms are recorded with the `metrics` macros where things
//! happen (`herald_*` names); this module installs the recorder and renders it, and keeps
//! the [`Throttle`] that stops one failing dependency from flooding the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle) and
/// starts its upkeep. `None` when another recorder was installed first.
pub fn install() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(handle) => {
                let upkeep = handle.clone();
                tokio::spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_secs(5));
                    loop {
                        every.tick().await;
                        upkeep.run_upkeep();
                    }
                });
                Some(handle)
            }
            Err(error) => {
                tracing::warn!(%error, "metrics recorder not installed; /metrics will be empty");
                None
            }
        })
        .as_ref()
}

/// The metrics in Prometheus text format.
pub fn render() -> String {
    RECORDER.get().and_then(Option::as_ref).map(PrometheusHandle::render).unwrap_or_default()
}

/// Lets a warning through at most once per second: a dependency that is down fails every
/// message, and one log line per message would bury the log (and cost the CPU the node
/// needs). Put one in a `static` beside each such warning:
///
/// ```ignore
/// static ROUTES_DOWN: Throttle = Throttle::new();
/// if let Some(suppressed) = ROUTES_DOWN.allow() {
///     tracing::warn!(%error, suppressed, "route table unavailable");
/// }
/// ```
pub struct Throttle {
    /// When the last warning went through, in ms since [`START`]; `u64::MAX`: never.
    last_ms: AtomicU64,
    /// Warnings held back since then.
    suppressed: AtomicU64,
}

/// The time [`Throttle`]s count from.
static START: LazyLock<Instant> = LazyLock::new(Instant::now);

impl Throttle {
    /// How long after one warning the next may go through.
    const EVERY_MS: u64 = 1_000;

    pub const fn new() -> Self {
        Self { last_ms: AtomicU64::new(u64::MAX), suppressed: AtomicU64::new(0) }
    }

    /// `Some(how many were held back since the last one)` when this warning may go through.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(u64::try_from(START.elapsed().as_millis()).unwrap_or(u64::MAX - 1))
    }

    fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == u64::MAX || now_ms.saturating_sub(last) >= Self::EVERY_MS;
        if due && self.last_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_lets_one_warning_through_per_second_and_counts_the_rest() {
        let throttle = Throttle::new();
        assert_eq!(throttle.allow_at(5_000), Some(0), "the first goes through");
        assert_eq!((throttle.allow_at(5_001), throttle.allow_at(5_999)), (None, None), "held back within the second");
        assert_eq!(throttle.allow_at(6_000), Some(2), "the next one a second later says how many were held back");
        assert_eq!(throttle.allow_at(6_500), None);
        assert!(Throttle::new().allow().is_some(), "a new one lets the first through at any time");
    }
}
