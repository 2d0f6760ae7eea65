//! Canaries: a version promoted from shadow is watched for `canary.window_ms`, and judged
//! against the canary bounds (failure ratio, p99 against the version it replaced): past one,
//! the previous version serves again. The watch itself is the host's (`host/promote.rs`);
//! here are what it finds and why it acts.

use crate::{config::CanaryPolicy, stats::PluginStats};
use serde::Serialize;
use std::sync::atomic::Ordering::Relaxed;

/// Where a canary stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryState {
    /// Within its window: watched.
    Watching,
    /// Its window passed within bounds: it stays.
    Passed,
    /// It passed a bound: the previous version serves again.
    RolledBack,
}

/// A promotion and how it went, as `/admin/plugins` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CanaryStatus {
    /// Where it stands.
    pub state: CanaryState,
    /// The version promoted.
    pub promoted_version: String,
    /// The version it replaced.
    pub previous_version: String,
    /// When it was promoted, ms since the Unix epoch.
    pub promoted_ms: u64,
    /// The watch window, ms.
    pub window_ms: u64,
    /// Why it was rolled back.
    pub why: Option<String>,
}

/// Why a promotion did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// The plugin has no shadow loaded.
    #[error("plugin `{0}` has no shadow to promote (install NAME.shadow.wasm beside NAME.wasm first)")]
    NoShadow(String),
    /// The plugins folder is unknown (no `load_dir`).
    #[error("the plugin runtime has no plugins folder")]
    NoDirectory,
    /// Moving the files failed.
    #[error("moving {file}: {source}")]
    Io {
        /// The file.
        file: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The promoted version failed to load as the active one.
    #[error(transparent)]
    Load(#[from] crate::PluginError),
}

/// Judges a promoted version against the canary bounds: `Some(why)` when it must go.
pub(crate) fn judge(policy: &CanaryPolicy, promoted: &PluginStats, previous: &PluginStats) -> Option<String> {
    if promoted.is_quarantined() {
        return Some(format!(
            "it was quarantined after repeated failures; last failure: {}",
            promoted.last_error.lock().clone().unwrap_or_default()
        ));
    }
    let calls = promoted.calls();
    if calls < policy.min_calls.max(1) {
        return None;
    }
    let failures = promoted.failures.load(Relaxed);
    let ratio = failures as f64 / calls as f64;
    if ratio > policy.max_failure_ratio {
        return Some(format!(
            "{failures} of its {calls} calls failed ({:.1} %, above canary.max_failure_ratio {:.1} %); last failure: {}",
            ratio * 100.0,
            policy.max_failure_ratio * 100.0,
            promoted.last_error.lock().clone().unwrap_or_default()
        ));
    }
    let p99 = promoted.quantile(0.99).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let before = previous.quantile(0.99).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let bound = ((before as f64 * policy.p99_factor) as u64).max(policy.min_p99_us);
    (p99 > bound).then(|| {
        format!(
            "its call p99 is {p99} µs, above {bound} µs (canary.p99_factor {} × the previous version's {before} µs, \
             at least canary.min_p99_us)",
            policy.p99_factor
        )
    })
}
