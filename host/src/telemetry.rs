//! Prometheus metrics: one recorder per process, rendered at `GET /metrics` (PROTOCOL.md).
//!
//! Counters, gauges and histograms are recorded with the `metrics` macros where things
//! happen (`herald_*` names); this module installs the recorder and renders it, and keeps
//! the [`Throttle`] that stops one failing dependency from flooding the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle) and
/// starts its upkeep. `None` when another recorder was installed first.
pub fn install() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| match latency_buckets(summary_window(PrometheusBuilder::new())).install_recorder() {
            Ok(handle) => {
                for name in FROM_THE_START {
                    metrics::counter!(name).increment(0);
                }
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

/// Counters the alert rules (`deploy/prometheus/alerts.yml`) read that would otherwise
/// appear only at their first event: `rate()` over a series that first shows up at 1 misses
/// that 1, and a node without `herald_pipeline_messages_stored_total` would drop out of the
/// count of nodes the load-share alert needs (it is quiet below two).
const FROM_THE_START: [&str; 2] = ["herald_gateway_slow_consumers_total", "herald_pipeline_messages_stored_total"];

/// How long a summary's quantiles look back: one window of [`SUMMARY_WINDOW`], started
/// afresh when a value arrives after it ended.
///
/// Each window is a DDSketch at 0.01 % relative error whose bins span the smallest to the
/// largest value it saw, up to 32,768 of 8 bytes, and it is dropped only when its summary
/// next records a value. With the exporter's default of three 20 s windows, a burst left up
/// to three full-range sketches per summary behind on an idle node: after 10,000 devices
/// left, the live heap a minute later was 6.4–7.3 MiB against 5.1–6.1 MiB with one window,
/// and the resident size 25–34 % above its size before they came against 17–19 %
/// (`scripts/loadtest.sh idle`; docs/ARCHITECTURE.md, "Memory after a crowd").
const SUMMARY_WINDOW: Duration = Duration::from_secs(60);

fn summary_window(builder: PrometheusBuilder) -> PrometheusBuilder {
    match builder.set_bucket_duration(SUMMARY_WINDOW) {
        Ok(builder) => builder.set_bucket_count(std::num::NonZeroU32::MIN),
        // Only a zero duration is refused, and this one is not.
        Err(error) => unreachable!("a summary window of {SUMMARY_WINDOW:?} refused: {error}"),
    }
}

/// Buckets (seconds) of the latency histograms alerts are computed from: a p99 across
/// nodes needs buckets (`histogram_quantile`), not each node's own quantiles. The other
/// histograms are rendered as summaries.
const LATENCY_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// The send→ack and send→deliver-ack histograms (`herald_send_ack_seconds`,
/// `herald_deliver_ack_seconds`) with [`LATENCY_BUCKETS`].
fn latency_buckets(builder: PrometheusBuilder) -> PrometheusBuilder {
    let matcher = Matcher::Suffix("_ack_seconds".to_owned());
    // Only an empty bucket list is refused, and this one is not.
    match builder.set_buckets_for_metric(matcher, LATENCY_BUCKETS) {
        Ok(builder) => builder,
        Err(error) => unreachable!("non-empty latency buckets refused: {error}"),
    }
}

/// `metrics::counter!("name")` or `metrics::histogram!("name")` for a hot path: the handle
/// is registered on first use and kept, where the macro alone builds its key and looks it
/// up (an allocation) on every call. A handle registered before [`install`] stays a no-op,
/// so only for code that runs once the node is up.
macro_rules! registered {
    (counter, $name:literal) => {{
        static HANDLE: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
        HANDLE.get_or_init(|| metrics::counter!($name))
    }};
    (histogram, $name:literal) => {{
        static HANDLE: std::sync::OnceLock<metrics::Histogram> = std::sync::OnceLock::new();
        HANDLE.get_or_init(|| metrics::histogram!($name))
    }};
}
pub(crate) use registered;

/// The metrics in Prometheus text format.
pub fn render() -> String {
    if let Some(allocations) = herald_alloc::allocations() {
        // Counted by the allocator itself (`herald serve --count-allocations`).
        metrics::counter!("herald_allocations_total").absolute(allocations.count);
        metrics::counter!("herald_allocated_bytes_total").absolute(allocations.bytes);
        // Rust's heap in use, for telling live data from memory the allocator keeps.
        metrics::gauge!("herald_heap_live_bytes").set(allocations.live_bytes() as f64);
    }
    RECORDER.get().and_then(Option::as_ref).map(PrometheusHandle::render).unwrap_or_default()
}

/// Lets a repeated warning through at most once per period (a second unless given),
/// counting the rest: a dependency that is down fails every message, and one log line per
/// message would bury the log (and cost the CPU the node needs). Shared state, so it can
/// live in a `static` beside the warning it guards:
///
/// ```ignore
/// static ROUTES_DOWN: Throttle = Throttle::new();
/// if let Some(suppressed) = ROUTES_DOWN.allow() {
///     tracing::warn!(%error, suppressed, "route table unavailable");
/// }
/// ```
///
/// Time is tokio's clock, so tests with paused time see it advance.
pub struct Throttle {
    /// The quiet time between two warnings, in ms.
    every_ms: u64,
    /// When the last warning went through, in ms since [`START`]; [`NEVER`]: not since
    /// the start or the last [`cleared`](Self::cleared).
    last_ms: AtomicU64,
    /// Warnings held back since then.
    suppressed: AtomicU64,
}

/// The time [`Throttle`]s count from.
static START: LazyLock<tokio::time::Instant> = LazyLock::new(tokio::time::Instant::now);

/// No warning went through yet.
const NEVER: u64 = u64::MAX;

impl Throttle {
    /// One warning per second.
    pub const fn new() -> Self {
        Self::every(Duration::from_secs(1))
    }

    /// One warning per `every`.
    pub const fn every(every: Duration) -> Self {
        // Saturates: a period beyond u64 milliseconds is "once".
        let every_ms = if every.as_millis() > u64::MAX as u128 { u64::MAX } else { every.as_millis() as u64 };
        Self { every_ms, last_ms: AtomicU64::new(NEVER), suppressed: AtomicU64::new(0) }
    }

    /// `Some(how many were held back since the last one)` when this warning may go through.
    pub fn allow(&self) -> Option<u64> {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(*START).as_millis();
        self.allow_at(u64::try_from(elapsed).unwrap_or(NEVER - 1))
    }

    /// The trouble is over: forgets the last warning (the next goes through at once);
    /// `true` if any went through since the last call.
    pub fn cleared(&self) -> bool {
        self.suppressed.store(0, Ordering::Relaxed);
        self.last_ms.swap(NEVER, Ordering::Relaxed) != NEVER
    }

    fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == NEVER || now_ms.saturating_sub(last) >= self.every_ms;
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

    #[tokio::test(start_paused = true)]
    async fn a_throttle_lets_one_complaint_through_per_period_and_counts_the_rest() {
        // Throttles count from a START the first one to ask sets, and another test may set
        // it from the real clock a moment after this paused one was read: the paused clock
        // would then stand before START, every reading would be 0, and 5 s on would not be
        // 5 s on. A minute on, it stands well past it.
        tokio::time::advance(Duration::from_secs(60)).await;
        let throttle = Throttle::every(Duration::from_secs(5));
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
        assert_eq!(throttle.allow(), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(throttle.allow(), Some(2));
        assert!(throttle.cleared());
        assert!(!throttle.cleared());
        assert_eq!(throttle.allow(), Some(0));
    }
}
