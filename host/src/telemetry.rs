//! Prometheus metrics: one recorder per process, rendered at `GET /metrics` (PROTOCOL.md).
//!
//! Counters, gauges and histograms are recorded with the `metrics` macros where things
//! happen (`herald_*` names); this module only installs the recorder and renders it.

use std::sync::OnceLock;
use std::time::Duration;

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
