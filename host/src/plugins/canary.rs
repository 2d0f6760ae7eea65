//! The cluster's canary: a version promoted through the registry is watched for
//! `plugin_runtime.canary.window_ms` by the node that promoted it, on what every live
//! node reports of it — its calls and failures summed over the nodes, and each node's on
//! its own, its call p99 on each node against the largest p99 the previous version had —
//! and past a bound (`plugin_runtime.canary`, the same bounds as a single node's canary)
//! it is rolled back on every node, the audit trail saying which node crossed which bound.
//!
//! The watch lives in the promoting node: if that node stops within the window, the
//! version stays without a watch (the history shows the promotion still `watching`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use herald_plugin_runtime::CanaryPolicy;
use serde_json::{Value, json};

use super::deploy::Deployer;
use crate::model::NodeId;

/// How often the watch reads the reports.
const EVERY: Duration = Duration::from_millis(250);

/// One node's figures for the promoted version.
struct Figures {
    calls: u64,
    failures: u64,
    p99_us: u64,
    quarantined: bool,
    last_error: String,
}

/// Why `figures` cross a bound of `policy` (`before_p99_us`: the previous version's).
fn judge(policy: &CanaryPolicy, figures: &Figures, before_p99_us: u64) -> Option<String> {
    if figures.quarantined {
        return Some(format!("it was quarantined after repeated failures; last failure: {}", figures.last_error));
    }
    if figures.calls < policy.min_calls.max(1) {
        return None;
    }
    let ratio = figures.failures as f64 / figures.calls as f64;
    if ratio > policy.max_failure_ratio {
        return Some(format!(
            "{} of its {} calls failed ({:.1} %, above canary.max_failure_ratio {:.1} %); last failure: {}",
            figures.failures,
            figures.calls,
            ratio * 100.0,
            policy.max_failure_ratio * 100.0,
            figures.last_error
        ));
    }
    let bound = ((before_p99_us as f64 * policy.p99_factor) as u64).max(policy.min_p99_us);
    (figures.p99_us > bound).then(|| {
        format!(
            "its call p99 is {} µs, above {bound} µs (canary.p99_factor {} × the previous version's {before_p99_us} \
             µs, at least canary.min_p99_us)",
            figures.p99_us, policy.p99_factor
        )
    })
}

impl Deployer {
    /// Watches `promoted` (which replaced `previous` at `generation`) for the canary
    /// window; rolls it back on every node past a bound.
    pub(super) async fn watch_canary(
        self: Arc<Self>,
        name: String,
        promoted: String,
        previous: String,
        generation: u64,
        before_p99_us: u64,
    ) {
        let policy = self.canary;
        let end = tokio::time::Instant::now() + Duration::from_millis(policy.window_ms);
        let mut ticks = tokio::time::interval(EVERY);
        loop {
            ticks.tick().await;
            let Ok(deployment) = self.deployment(&name).await else { continue };
            if deployment.generation != generation {
                return; // deployed over, or rolled back, meanwhile: nothing to watch
            }
            if let Some(why) = self.crossed(&name, &promoted, &policy, before_p99_us).await {
                tracing::error!(plugin = %name, version = %promoted, %previous, %why, "promoted plugin version rolled back on every node");
                if let Err(error) = self.rollback(&name, "canary", Some(format!("canary: {why}"))).await {
                    tracing::error!(plugin = %name, %error, "the canary's rollback failed; roll back by hand");
                }
                return;
            }
            if tokio::time::Instant::now() >= end {
                let mut canary =
                    deployment.canary.as_deref().and_then(|t| serde_json::from_str(t).ok()).unwrap_or(json!({}));
                canary["state"] = json!("passed");
                if let Err(error) = self.store.set_canary(&name, generation, &canary.to_string()).await {
                    tracing::warn!(plugin = %name, %error, "cannot record that the canary passed");
                }
                tracing::info!(plugin = %name, version = %promoted, "promoted plugin passed its canary window on every node");
                return;
            }
        }
    }

    /// The first bound the promoted version crosses, on one node or summed over them.
    async fn crossed(&self, name: &str, promoted: &str, policy: &CanaryPolicy, before_p99_us: u64) -> Option<String> {
        let live: BTreeSet<NodeId> = (self.live)().into_iter().collect();
        let reports = self.store.reports().await.ok()?;
        let mut total = Figures { calls: 0, failures: 0, p99_us: 0, quarantined: false, last_error: String::new() };
        for report in reports.iter().filter(|r| r.name == name && live.contains(&r.node)) {
            let Ok(parsed) = serde_json::from_str::<Value>(&report.report) else { continue };
            if parsed["active"] != json!(promoted) {
                continue;
            }
            let figures = Figures {
                calls: parsed["calls"].as_u64().unwrap_or(0),
                failures: parsed["failures"].as_u64().unwrap_or(0),
                p99_us: parsed["p99_call_us"].as_u64().unwrap_or(0),
                quarantined: parsed["quarantined"].as_bool().unwrap_or(false),
                last_error: parsed["last_error"].as_str().unwrap_or_default().to_owned(),
            };
            if let Some(why) = judge(policy, &figures, before_p99_us) {
                return Some(format!("node {}: {why}", report.node));
            }
            total.calls += figures.calls;
            total.failures += figures.failures;
            total.p99_us = total.p99_us.max(figures.p99_us);
            if total.last_error.is_empty() {
                total.last_error = figures.last_error;
            }
        }
        judge(policy, &total, before_p99_us).map(|why| format!("summed over the nodes: {why}"))
    }
}
