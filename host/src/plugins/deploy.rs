//! Uploads and deploys through the plugin registry (`PUT /admin/plugins/{name}/versions/
//! {version}`, `POST /admin/plugins/{name}/deploy`, `/promote`, `/rollback`), driven by
//! whichever node the request reaches.
//!
//! An upload is checked before it is stored: a component of a contract this host serves,
//! its sample calls (those of `herald plugin check`) passing, within
//! `plugin_registry.max_component_bytes`; refused, nothing is written.
//!
//! A deploy has two phases. It begins by setting the plugin's pending deploy in the
//! database (only where none is), and every node — told by a notice, or at its next poll —
//! compiles and warms the version and reports ready or why not. Once every live node
//! reported ready, one statement switches the deployment (the generation goes up) and
//! every node installs the version; if any node cannot, the deploy is aborted everywhere:
//! the pending deploy is cleared, the old version never stopped serving, and the answer
//! names the node and its reason. Past `plugin_registry.deploy_timeout_ms` without every
//! answer, it is aborted too, naming the nodes that did not answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::follow::hash;
use super::notices::DeployNotices;
use crate::clock::WallClock;
use crate::config::PluginRegistryConfig;
use crate::model::NodeId;
use crate::store::StoreError;
use crate::store::plugin_registry::{Audit, Deployment, NewVersion, Pending, PluginRegistryStore, Put, Switch};

/// The nodes a deploy waits for: the live members (embedded mode: this node).
pub type LiveNodes = Arc<dyn Fn() -> Vec<NodeId> + Send + Sync>;

/// How often a deploy reads the nodes' reports while it waits (a notice wakes it sooner).
const WAIT_STEP: Duration = Duration::from_millis(50);

/// Why an upload or deploy did not happen; each maps to one HTTP status (`api/admin.rs`).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A name or version that is not valid (400).
    #[error("{0}")]
    Invalid(String),
    /// An upload that failed its checks (422).
    #[error("upload refused: {0}")]
    Refused(String),
    /// No such plugin, version, shadow or previous version (404).
    #[error("{0}")]
    NotFound(String),
    /// A version taken by other bytes, or a deploy of the plugin under way (409).
    #[error("{0}")]
    Conflict(String),
    /// A node could not make the version ready: nothing changed anywhere (409).
    #[error("deploy aborted, the previous version keeps serving: {0}")]
    Aborted(String),
    /// The database did not answer (503).
    #[error("the plugin registry is unavailable: {0}")]
    Store(#[from] StoreError),
}

/// As which role a version is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Active,
    Shadow,
}

/// An upload, as the HTTP API received it.
#[derive(Debug)]
pub struct Upload {
    pub name: String,
    pub version: String,
    pub component: Vec<u8>,
    /// The manifest's TOML text; empty when none was sent.
    pub manifest: String,
    /// The id of the admin key that sent it.
    pub key_id: String,
}

/// Plugin names: what the folder allows as a file stem, without dots (a dot would read as
/// a shadow's or a kept version's suffix).
pub fn check_name(name: &str) -> Result<(), RegistryError> {
    let fine =
        (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    fine.then_some(()).ok_or_else(|| {
        RegistryError::Invalid(format!("plugin name {name:?} must be 1 to 64 characters of A-Z, a-z, 0-9, - and _"))
    })
}

/// Versions: `1.2.0`, `2.0.0-rc.1+build` and the like.
pub fn check_version(version: &str) -> Result<(), RegistryError> {
    let fine = (1..=64).contains(&version.len())
        && version.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+'));
    fine.then_some(()).ok_or_else(|| {
        RegistryError::Invalid(format!("version {version:?} must be 1 to 64 characters of A-Z, a-z, 0-9, . - _ and +"))
    })
}

/// Drives uploads and deploys.
pub struct Deployer {
    pub(super) store: Arc<dyn PluginRegistryStore>,
    pub(super) notices: Arc<dyn DeployNotices>,
    pub(super) live: LiveNodes,
    pub(super) clock: Arc<dyn WallClock>,
    pub(super) settings: PluginRegistryConfig,
    pub(super) canary: herald_plugin_runtime::CanaryPolicy,
}

/// A deploy's first phase, as the deployer waits on it.
pub(super) struct Step<'a> {
    pub name: &'a str,
    /// The version the nodes prepare (empty: nothing to prepare).
    pub version: &'a str,
    pub role: &'a str,
    pub switch: Switch,
    pub audit: Audit,
}

impl Deployer {
    /// Checks and stores an upload. Returns whether it was new (`false`: the same bytes
    /// and manifest were there already).
    ///
    /// # Errors
    /// [`RegistryError::Invalid`], [`Refused`](RegistryError::Refused) (nothing stored),
    /// [`Conflict`](RegistryError::Conflict) when the version holds other bytes, or
    /// [`Store`](RegistryError::Store).
    pub async fn upload(&self, upload: Upload) -> Result<bool, RegistryError> {
        check_name(&upload.name)?;
        check_version(&upload.version)?;
        let refused = |why: String| {
            tracing::warn!(plugin = %upload.name, version = %upload.version, %why, "plugin upload refused");
            RegistryError::Refused(why)
        };
        let max = self.settings.max_component_bytes;
        if upload.component.len() > max {
            return Err(refused(format!(
                "the component is {} bytes, over plugin_registry.max_component_bytes ({max} bytes)",
                upload.component.len()
            )));
        }
        if !upload.manifest.is_empty() {
            let manifest = herald_plugin_runtime::Manifest::parse(&upload.manifest)
                .map_err(|error| refused(format!("the manifest is not valid: {error}")))?;
            if let Some(version) = manifest.version.as_ref().filter(|v| **v != upload.version) {
                return Err(refused(format!(
                    "the manifest says version {version}, the upload says {}; make them match",
                    upload.version
                )));
            }
        }
        let report = herald_plugin_runtime::check_bytes(&upload.name, upload.component.clone(), &upload.manifest)
            .await
            .map_err(|error| refused(error.to_string()))?;
        if let Some(sample) = report.samples.iter().find(|sample| sample.outcome.is_err()) {
            let why = sample.outcome.clone().err().unwrap_or_default();
            return Err(refused(format!(
                "its sample {} call (the one `herald plugin check` makes) failed: {why}",
                sample.hook
            )));
        }
        let at_ms = self.clock.now_ms();
        let sha256 = hash(&upload.component);
        let audit = Audit {
            name: upload.name.clone(),
            action: "upload".into(),
            from_version: None,
            to_version: Some(upload.version.clone()),
            key_id: upload.key_id.clone(),
            at_ms,
            detail: Some(sha256.clone()),
        };
        let version = NewVersion {
            name: upload.name.clone(),
            version: upload.version.clone(),
            sha256,
            manifest: upload.manifest,
            component: upload.component,
            contract: report.contract_version,
            uploaded_ms: at_ms,
            uploaded_by: upload.key_id,
        };
        match self.store.put_version(&version, &audit).await? {
            Put::Stored => Ok(true),
            Put::Same => Ok(false),
            Put::Taken { sha256 } => Err(RegistryError::Conflict(format!(
                "version {} of plugin {} is taken by another component or manifest ({sha256}); versions are written \
                 once: upload this one as a new version",
                version.version, version.name
            ))),
        }
    }

    /// The deployment of `name`.
    pub(super) async fn deployment(&self, name: &str) -> Result<Deployment, RegistryError> {
        check_name(name)?;
        self.store
            .deployments()
            .await?
            .into_iter()
            .find(|d| d.name == name)
            .ok_or_else(|| RegistryError::NotFound(format!("plugin {name} has no version in the registry; upload one")))
    }

    /// Deploys `version` of `name` as its active version or its shadow.
    ///
    /// # Errors
    /// [`RegistryError`]: no such version, another deploy under way, aborted (naming the
    /// node and why), or the database failing.
    pub async fn deploy(&self, name: &str, version: &str, role: Role, key_id: &str) -> Result<Value, RegistryError> {
        check_version(version)?;
        let deployment = self.deployment(name).await?;
        if self.store.manifest(name, version).await?.is_none() {
            return Err(RegistryError::NotFound(format!("plugin {name} has no version {version}; upload it first")));
        }
        let (switch, action, from) = match role {
            Role::Active => (
                Switch {
                    active: Some(version.to_owned()),
                    shadow: deployment.shadow.clone().filter(|shadow| shadow != version),
                    previous: deployment
                        .active
                        .clone()
                        .filter(|active| active != version)
                        .or(deployment.previous.clone()),
                    canary: None,
                },
                "deploy",
                deployment.active.clone(),
            ),
            Role::Shadow => (
                Switch { shadow: Some(version.to_owned()), ..switch_of(&deployment) },
                "deploy-shadow",
                deployment.shadow.clone(),
            ),
        };
        let role = if role == Role::Active { "active" } else { "shadow" };
        let audit = self.audit(name, action, from, Some(version.to_owned()), key_id);
        self.run(Step { name, version, role, switch, audit }).await
    }

    /// Makes the shadow of `name` its active version across the cluster, then watches it
    /// as a canary (`canary.rs`).
    ///
    /// # Errors
    /// As [`deploy`](Self::deploy); [`RegistryError::NotFound`] without a shadow.
    pub async fn promote(self: &Arc<Self>, name: &str, key_id: &str) -> Result<Value, RegistryError> {
        let deployment = self.deployment(name).await?;
        let Some(shadow) = deployment.shadow.clone() else {
            return Err(RegistryError::NotFound(format!("plugin {name} has no shadow to promote; deploy one first")));
        };
        let before = self.p99_of(name, deployment.active.as_deref()).await;
        let canary = canary_watching(&shadow, deployment.active.as_deref(), self.clock.now_ms(), &self.canary);
        let switch = Switch {
            active: Some(shadow.clone()),
            shadow: None,
            previous: deployment.active.clone(),
            canary: Some(canary.to_string()),
        };
        let audit = self.audit(name, "promote", deployment.active.clone(), Some(shadow.clone()), key_id);
        let answer = self.run(Step { name, version: &shadow, role: "active", switch, audit }).await?;
        if let Some(previous) = deployment.active {
            let generation = answer["generation"].as_u64().unwrap_or(0);
            tokio::spawn(Arc::clone(self).watch_canary(name.to_owned(), shadow, previous, generation, before));
        }
        Ok(answer)
    }

    /// Puts the previous active version of `name` back, across the cluster.
    ///
    /// # Errors
    /// As [`deploy`](Self::deploy); [`RegistryError::NotFound`] without a previous version.
    pub async fn rollback(&self, name: &str, key_id: &str, why: Option<String>) -> Result<Value, RegistryError> {
        let deployment = self.deployment(name).await?;
        let Some(previous) = deployment.previous.clone() else {
            return Err(RegistryError::NotFound(format!("plugin {name} has no previous version to roll back to")));
        };
        let switch = Switch {
            active: Some(previous.clone()),
            shadow: deployment.shadow.clone(),
            previous: deployment.active.clone(),
            canary: why.as_ref().map(|why| canary_rolled_back(deployment.canary.as_deref(), why).to_string()),
        };
        let mut audit = self.audit(name, "rollback", deployment.active.clone(), Some(previous.clone()), key_id);
        audit.detail = why;
        self.run(Step { name, version: &previous, role: "active", switch, audit }).await
    }

    fn audit(&self, name: &str, action: &str, from: Option<String>, to: Option<String>, key_id: &str) -> Audit {
        Audit {
            name: name.to_owned(),
            action: action.to_owned(),
            from_version: from,
            to_version: to,
            key_id: key_id.to_owned(),
            at_ms: self.clock.now_ms(),
            detail: None,
        }
    }

    /// Both phases of a deploy: begin, wait for every live node's answer, switch or abort.
    pub(super) async fn run(&self, step: Step<'_>) -> Result<Value, RegistryError> {
        let now = self.clock.now_ms();
        let began = tokio::time::Instant::now();
        let timeout = Duration::from_millis(self.settings.deploy_timeout_ms);
        let id = format!("{now:x}-{:016x}", rand::random::<u64>());
        let pending = Pending {
            id: id.clone(),
            version: step.version.to_owned(),
            role: step.role.to_owned(),
            since_ms: now,
            switching: false,
        };
        // A pending deploy twice the timeout old belongs to a node that died deploying.
        let stale_before = now.saturating_sub(2 * self.settings.deploy_timeout_ms);
        if !self.store.begin_deploy(step.name, &pending, stale_before).await? {
            return Err(RegistryError::Conflict(format!(
                "another deploy of plugin {} is under way; try again when it is over",
                step.name
            )));
        }
        self.notices.announce().await;
        let verdict = self.wait_for(step.name, timeout, |report| {
            let answer = &report["pending"];
            if answer["id"] != json!(id) {
                return None;
            }
            Some(match answer["ready"].as_bool() {
                Some(true) => Ok(()),
                _ => Err(answer["error"].as_str().unwrap_or("not ready").to_owned()),
            })
        });
        let verdict = verdict.await;
        let ready_at = began.elapsed();
        let verdict = match verdict {
            // A new active version: every node holds its calls before any serves it.
            Ok(()) if step.role == "active" => self.hold_everywhere(step.name, &id, timeout).await?,
            other => other,
        };
        let held_at = began.elapsed();
        let Step { name, switch, mut audit, .. } = step;
        if let Err(why) = verdict {
            audit.action = format!("{}-aborted", audit.action);
            audit.detail = Some(why.clone());
            self.store.finish_deploy(name, &id, None, &audit).await?;
            self.notices.announce().await;
            tracing::warn!(plugin = %name, %why, "plugin deploy aborted");
            return Err(RegistryError::Aborted(why));
        }
        if !self.store.finish_deploy(name, &id, Some(&switch), &audit).await? {
            return Err(RegistryError::Aborted(format!(
                "the deploy of plugin {name} was ended by another node meanwhile (one that held its calls past \
                 plugin_registry.deploy_timeout_ms, or found the deploy stale); GET /admin/plugins/{name}/history says \
                 which"
            )));
        }
        let switched_at = began.elapsed();
        self.notices.announce().await;
        let deployment = self.deployment(name).await?;
        let generation = deployment.generation;
        // Every node installs at its notice; the answer waits for them to say so.
        let applied = self
            .wait_for(name, timeout, |report| {
                (report["generation"].as_u64().unwrap_or(0) >= generation).then_some(Ok(()))
            })
            .await;
        if let Err(late) = &applied {
            tracing::warn!(plugin = %name, generation, %late, "not every node reported the new generation in time");
        }
        let ms =
            |since: Duration, to: Duration| u64::try_from(to.saturating_sub(since).as_millis()).unwrap_or(u64::MAX);
        let applied_at = began.elapsed();
        Ok(json!({
            "plugin": name,
            "generation": generation,
            "active": deployment.active,
            "shadow": deployment.shadow,
            "previous": deployment.previous,
            "applied_everywhere": applied.is_ok(),
            // How long each step took: an active version's hook calls are held on every
            // node from the hold through the switch until the node installs it.
            "phases_ms": {
                "ready": ms(Duration::ZERO, ready_at),
                "hold": ms(ready_at, held_at),
                "switch": ms(held_at, switched_at),
                "apply": ms(switched_at, applied_at),
            },
        }))
    }

    /// The switch's barrier: asks every node to hold its hook calls (`follow.rs`) and waits
    /// until every live node says it holds them — no call under way, none starting — so
    /// that once the deployment switches, no node answers a call with the old version
    /// after any node answered one with the new. `Err` names a node that did not hold in
    /// time; the deploy is then aborted and the nodes let their calls go on the old
    /// version.
    async fn hold_everywhere(
        &self,
        name: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<Result<(), String>, RegistryError> {
        if !self.store.switching(name, id, self.clock.now_ms()).await? {
            return Ok(Err("the deploy was ended by another node meanwhile".to_owned()));
        }
        self.notices.announce().await;
        let held = self.wait_for(name, timeout, |report| {
            let answer = &report["pending"];
            (answer["id"] == json!(id) && answer["holding"] == json!(true)).then_some(Ok(()))
        });
        Ok(held.await.map_err(|why| format!("while holding the nodes' calls for the switch: {why}")))
    }

    /// Waits until `answer` gives a verdict for every live node's report of `name`:
    /// `Ok` once all are `Ok`, the first `Err` (naming its node) otherwise, or an `Err`
    /// naming the nodes still silent at `timeout`.
    async fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        answer: impl Fn(&Value) -> Option<Result<(), String>>,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut heard = self.notices.subscribe();
        // Per node still silent, what its last report said: named in the answer at the
        // timeout, so an operator can tell a node that stopped reporting from one that
        // reports without answering.
        let mut last_seen: BTreeMap<NodeId, String> = BTreeMap::new();
        loop {
            let live: BTreeSet<NodeId> = (self.live)().into_iter().collect();
            let mut silent = live.clone();
            match self.store.reports().await {
                Ok(reports) => {
                    for report in reports.iter().filter(|r| r.name == name && live.contains(&r.node)) {
                        let parsed: Value = serde_json::from_str(&report.report).unwrap_or(Value::Null);
                        match answer(&parsed) {
                            Some(Ok(())) => {
                                silent.remove(&report.node);
                            }
                            Some(Err(why)) => return Err(format!("node {}: {why}", report.node)),
                            None => {
                                let age = self.clock.now_ms().saturating_sub(report.updated_ms);
                                let said = format!("its report of {age} ms ago: pending {}", parsed["pending"]);
                                last_seen.insert(report.node, said);
                            }
                        }
                    }
                    if silent.is_empty() {
                        return Ok(());
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot read the nodes' plugin reports; trying again"),
            }
            if tokio::time::Instant::now() >= deadline {
                let nodes: Vec<String> = silent
                    .iter()
                    .map(|node| match last_seen.get(node) {
                        Some(said) => format!("{node} ({said})"),
                        None => format!("{node} (no report of plugin {name})"),
                    })
                    .collect();
                return Err(format!("node {} did not answer within {} ms", nodes.join(", node "), timeout.as_millis()));
            }
            let _ = tokio::time::timeout(WAIT_STEP, heard.changed()).await;
        }
    }

    /// The largest call p99 the live nodes report for `name` serving `version`, µs.
    pub(super) async fn p99_of(&self, name: &str, version: Option<&str>) -> u64 {
        let Some(version) = version else { return 0 };
        let live: BTreeSet<NodeId> = (self.live)().into_iter().collect();
        let reports = self.store.reports().await.unwrap_or_default();
        reports
            .iter()
            .filter(|r| r.name == name && live.contains(&r.node))
            .filter_map(|r| serde_json::from_str::<Value>(&r.report).ok())
            .filter(|r| r["active"] == json!(version))
            .filter_map(|r| r["p99_call_us"].as_u64())
            .max()
            .unwrap_or(0)
    }
}

/// The switch that leaves `deployment` as it is.
fn switch_of(deployment: &Deployment) -> Switch {
    Switch {
        active: deployment.active.clone(),
        shadow: deployment.shadow.clone(),
        previous: deployment.previous.clone(),
        canary: deployment.canary.clone(),
    }
}

/// The canary JSON of a promotion just made (the watch itself is `canary.rs`).
fn canary_watching(
    promoted: &str,
    previous: Option<&str>,
    now_ms: u64,
    policy: &herald_plugin_runtime::CanaryPolicy,
) -> Value {
    json!({
        "state": if previous.is_some() { "watching" } else { "passed" },
        "promoted_version": promoted,
        "previous_version": previous.unwrap_or_default(),
        "promoted_ms": now_ms,
        "window_ms": policy.window_ms,
        "why": null,
    })
}

/// The canary JSON `canary` becomes when rolled back for `why`.
fn canary_rolled_back(canary: Option<&str>, why: &str) -> Value {
    let mut canary = canary.and_then(|text| serde_json::from_str(text).ok()).unwrap_or_else(|| json!({}));
    canary["state"] = json!("rolled_back");
    canary["why"] = json!(why);
    canary
}
