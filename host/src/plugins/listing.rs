//! What `GET /admin/plugins` adds under `registry` (every version's state on every live
//! node, shadow comparisons summed over the nodes, folder plugins some nodes lack) and
//! `GET /admin/plugins/{name}/history` (the audit trail).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::deploy::{Deployer, RegistryError, check_name};
use crate::model::NodeId;
use crate::store::plugin_registry::Audit;

/// The newest audit rows `history` returns.
const HISTORY_ROWS: u32 = 500;

/// Shadow comparisons of many nodes, added up (`differences` by kind).
fn sum_shadows<'a>(statuses: impl Iterator<Item = &'a Value>) -> Value {
    let (mut compared, mut agreed, mut differed) = (0, 0, 0);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut any = false;
    for status in statuses.filter(|s| s.is_object()) {
        any = true;
        compared += status["compared"].as_u64().unwrap_or(0);
        agreed += status["agreed"].as_u64().unwrap_or(0);
        differed += status["differed"].as_u64().unwrap_or(0);
        for kind in status["differences"].as_array().into_iter().flatten() {
            let name = kind["kind"].as_str().unwrap_or_default().to_owned();
            *kinds.entry(name).or_default() += kind["count"].as_u64().unwrap_or(0);
        }
    }
    if !any {
        return Value::Null;
    }
    let mut differences: Vec<(String, u64)> = kinds.into_iter().collect();
    differences.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let differences: Vec<Value> =
        differences.into_iter().map(|(kind, count)| json!({ "kind": kind, "count": count })).collect();
    json!({ "compared": compared, "agreed": agreed, "differed": differed, "differences": differences })
}

impl Deployer {
    /// The registry as `/admin/plugins` shows it.
    ///
    /// # Errors
    /// [`RegistryError::Store`] when the database does not answer.
    pub async fn listing(&self) -> Result<Value, RegistryError> {
        let live: BTreeSet<NodeId> = (self.live)().into_iter().collect();
        let deployments = self.store.deployments().await?;
        let versions = self.store.versions(None).await?;
        let reports: Vec<(NodeId, String, Value, u64)> = self
            .store
            .reports()
            .await?
            .into_iter()
            .filter(|r| live.contains(&r.node))
            .map(|r| (r.node, r.name, serde_json::from_str(&r.report).unwrap_or(Value::Null), r.updated_ms))
            .collect();
        let mut plugins = Vec::new();
        for deployment in &deployments {
            let of_plugin: Vec<&(NodeId, String, Value, u64)> =
                reports.iter().filter(|(_, name, _, _)| *name == deployment.name).collect();
            let listed: Vec<Value> = versions
                .iter()
                .filter(|v| v.name == deployment.name)
                .map(|v| {
                    let nodes: BTreeMap<String, String> = live
                        .iter()
                        .map(|node| {
                            let report = of_plugin.iter().find(|(n, ..)| n == node).map(|(_, _, r, _)| r);
                            (node.to_string(), state_on(report, &v.version))
                        })
                        .collect();
                    json!({
                        "version": v.version, "sha256": v.sha256, "size": v.size, "contract": v.contract,
                        "uploaded_ms": v.uploaded_ms, "uploaded_by": v.uploaded_by, "nodes": nodes,
                    })
                })
                .collect();
            let nodes: Vec<Value> = of_plugin
                .iter()
                .map(|(node, _, report, updated_ms)| {
                    json!({
                        "node": node, "updated_ms": updated_ms, "source": report["source"],
                        "generation": report["generation"], "active": report["active"], "shadow": report["shadow"],
                        "error": report["error"], "calls": report["calls"], "failures": report["failures"],
                        "p99_call_us": report["p99_call_us"], "shadow_status": report["shadow_status"],
                    })
                })
                .collect();
            let canary: Value =
                deployment.canary.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or(Value::Null);
            plugins.push(json!({
                "name": deployment.name,
                "active": deployment.active,
                "shadow": deployment.shadow,
                "previous": deployment.previous,
                "generation": deployment.generation,
                "pending": deployment.pending,
                "canary": canary,
                "shadow_summed": sum_shadows(of_plugin.iter().map(|(_, _, r, _)| &r["shadow_status"])),
                "versions": listed,
                "nodes": nodes,
            }));
        }
        // Folder plugins (not deployed through the registry) some live nodes lack: a policy
        // that holds on some nodes only.
        let mut folder: BTreeMap<&str, BTreeSet<NodeId>> = BTreeMap::new();
        for (node, name, report, _) in &reports {
            if report["source"] == "folder" {
                folder.entry(name.as_str()).or_default().insert(*node);
            }
        }
        let folder: Vec<Value> = folder
            .into_iter()
            .map(|(name, on)| {
                let missing: Vec<NodeId> = live.difference(&on).copied().collect();
                let warning = (!missing.is_empty()).then(|| {
                    format!("plugin {name} is in the plugins folder of some nodes only: missing on {missing:?}")
                });
                json!({ "name": name, "nodes": on, "missing_on": missing, "warning": warning })
            })
            .collect();
        Ok(json!({ "live_nodes": live, "plugins": plugins, "folder": folder }))
    }

    /// The audit trail of `name`, oldest first (the newest 500 rows).
    ///
    /// # Errors
    /// [`RegistryError::Invalid`] for a bad name; [`RegistryError::Store`].
    pub async fn history(&self, name: &str) -> Result<Vec<Audit>, RegistryError> {
        check_name(name)?;
        Ok(self.store.history(name, HISTORY_ROWS).await?)
    }
}

/// A version's state on one node, from that node's report.
fn state_on(report: Option<&Value>, version: &str) -> String {
    let Some(report) = report else { return "no report".into() };
    let pending = &report["pending"];
    if report["source"] == "registry" && report["active"] == json!(version) {
        "active".into()
    } else if report["source"] == "registry" && report["shadow"] == json!(version) {
        "shadow".into()
    } else if pending["version"] == json!(version) {
        match pending["ready"].as_bool() {
            Some(true) => "ready".into(),
            _ => format!("failed: {}", pending["error"].as_str().unwrap_or_default()),
        }
    } else {
        "stored".into()
    }
}
