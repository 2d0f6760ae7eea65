//! Every node follows the plugin registry: on each notice, and every
//! `plugin_registry.poll_ms` in case one was missed, it reads the deployments and
//!
//! * for a deploy pending (its first phase) that it has not answered yet, fetches the
//!   version (by SHA-256 from its disk cache, else from the database, then cached),
//!   compiles and warms it (`PluginHost::prepare`) and reports `ready` — or why not — in
//!   its report row, which the deploying node waits on;
//! * for a plugin whose generation moved past the one it applied, installs the versions
//!   the registry names (the prepared ones when it has them) in one swap.
//!
//! * for a pending deploy of a new active version in its switching phase, holds this
//!   node's calls of the plugin's hooks (`PluginHost::hold`: calls under way finish, none
//!   starts; the other hooks' calls go on) and says so; once the deployment switched (or the deploy was aborted) it installs what the
//!   registry names and lets the calls go. Every node holding before any serves the new
//!   version is what makes the switch one moment for the cluster. A node holding longer
//!   than `plugin_registry.deploy_timeout_ms` (the deploying node went quiet) aborts the
//!   deploy itself, by the same compare-and-set that switches it, so either every node
//!   switches or none does; if the database cannot be reached to do so, it lets its calls
//!   go on the old version rather than hold them for ever.
//!
//! It also writes, for each plugin it serves (from the registry or the folder), what it
//! serves and its call counts, shadow comparisons and p99, which `/admin/plugins` sums over
//! the nodes and a cluster canary judges. A node starting runs one pass before it accepts
//! connections (`Plugins::start`), so it serves the registry's versions from its first
//! connection on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::notices::DeployNotices;
use super::{Hold, Hook, PluginHost, Prepared};
use crate::clock::WallClock;
use crate::model::NodeId;
use crate::store::plugin_registry::{Audit, Deployment, NodeReport, PluginRegistryStore};

/// Reports are rewritten at least this often even when nothing changed, so a reader can
/// tell a live node's report from a stale one.
const REPORT_REFRESH_MS: u64 = 10_000;

/// How often a node holding its calls for a switch reads the registry, besides notices:
/// its calls wait meanwhile.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// A version of a plugin: (name, registry version, as shadow).
type Key = (String, String, bool);

/// What a pass remembers for the next one.
#[derive(Default)]
struct Memory {
    /// Per plugin, the generation installed here.
    applied: HashMap<String, u64>,
    /// Per plugin, the registry versions installed here: (active, shadow).
    serving: HashMap<String, (Option<String>, Option<String>)>,
    /// Per plugin, the pending deploy answered, and how.
    answered: HashMap<String, (String, Result<(), String>)>,
    /// Versions compiled and warmed, kept while a deployment names them.
    prepared: HashMap<Key, Prepared>,
    /// Per plugin, why the last install failed here.
    errors: HashMap<String, String>,
    /// Per plugin, the last report written and when.
    written: HashMap<String, (String, u64)>,
    /// Per plugin, the switching deploy this node holds its calls for.
    holding: HashMap<String, Holding>,
    /// This node's calls of the hooks of the plugins switching, held while `holding` is
    /// not empty.
    hold: Option<Hold>,
}

/// A switch this node holds calls for.
struct Holding {
    /// The pending deploy's id.
    id: String,
    /// Since when, ms.
    since: u64,
    /// The hooks of the plugin's version serving and of the version switched to.
    hooks: BTreeSet<Hook>,
}

/// Follows the registry for one node.
pub struct Follower {
    host: Arc<PluginHost>,
    store: Arc<dyn PluginRegistryStore>,
    node: NodeId,
    cache_dir: PathBuf,
    clock: Arc<dyn WallClock>,
    /// The longest this node holds its calls for a switch, ms.
    hold_limit_ms: u64,
    /// One pass at a time.
    memory: tokio::sync::Mutex<Memory>,
}

/// Why a version could not be made ready here.
fn failed(error: impl std::fmt::Display) -> String {
    error.to_string()
}

impl Follower {
    pub fn new(
        host: Arc<PluginHost>,
        store: Arc<dyn PluginRegistryStore>,
        node: NodeId,
        cache_dir: PathBuf,
        clock: Arc<dyn WallClock>,
        hold_limit_ms: u64,
    ) -> Self {
        let memory = tokio::sync::Mutex::new(Memory::default());
        Self { host, store, node, cache_dir, clock, hold_limit_ms, memory }
    }

    /// Runs passes until the task is dropped: at each notice, and every `poll` (more often
    /// while this node holds its calls for a switch). `holding`: whether the last pass
    /// left them held.
    pub async fn run(self: Arc<Self>, notices: Arc<dyn DeployNotices>, poll: Duration, mut holding: bool) {
        let mut heard = notices.subscribe();
        loop {
            let wait = if holding { HOLD_POLL.min(poll) } else { poll };
            tokio::select! {
                changed = heard.changed() => {
                    if changed.is_err() {
                        // The sender is gone: only the poll is left.
                        tokio::time::sleep(wait).await;
                    }
                }
                () = tokio::time::sleep(wait) => {}
            }
            holding = self.pass(&*notices).await;
        }
    }

    /// One pass: answers pending deploys, holds or lets go the calls for a switch, installs
    /// new generations, writes reports. A registry that cannot be read is logged and tried
    /// again at the next pass. Returns whether this node holds its calls.
    pub async fn pass(&self, notices: &dyn DeployNotices) -> bool {
        let deployments = match self.store.deployments().await {
            Ok(deployments) => deployments,
            Err(error) => {
                tracing::warn!(%error, "cannot read the plugin registry; trying again at the next poll");
                let mut memory = self.memory.lock().await;
                let now = self.clock.now_ms();
                if memory.holding.values().any(|held| now.saturating_sub(held.since) >= self.hold_limit_ms) {
                    tracing::error!(
                        "the plugin registry cannot be read to end a switch; letting the calls go on the versions serving"
                    );
                    memory.holding.clear();
                    memory.hold = None;
                }
                return memory.hold.is_some();
            }
        };
        let mut memory = self.memory.lock().await;
        let mut answered_any = false;
        let mut installed = Vec::new();
        for deployment in &deployments {
            answered_any |= self.answer_pending(&mut memory, deployment).await;
            if self.apply(&mut memory, deployment).await {
                installed.push(deployment);
            }
        }
        // Versions no deployment names any more are let go.
        memory.prepared.retain(|(name, version, shadow), _| {
            deployments.iter().any(|d| {
                d.name == *name
                    && (d.pending.as_ref().is_some_and(|p| p.version == *version)
                        || (!*shadow && d.active.as_deref() == Some(version.as_str()))
                        || (*shadow && d.shadow.as_deref() == Some(version.as_str())))
            })
        });
        answered_any |= self.let_go(&mut memory, &deployments).await;
        // A deploy's answer waits for every node's report of the new generation: written
        // before the notice that wakes the deploying node (after the calls were let go, so
        // the write does not lengthen a hold), or it would find none and sleep to its poll.
        for deployment in &installed {
            self.write_report(&mut memory, &deployment.name, deployment, true).await;
        }
        answered_any |= !installed.is_empty();
        if answered_any {
            // The deploying node waits on the reports written above: wake it (and every
            // other) now, before the other reports, since a switch holds calls meanwhile.
            notices.announce().await;
        }
        self.write_reports(&mut memory, &deployments).await;
        memory.hold.is_some()
    }

    /// Holds this node's calls of the hooks of plugin `name` for its switching deploy
    /// `pending_id` to `version`: the hooks of the version serving and of `version` (every
    /// hook when this node has not prepared `version`, having restarted meanwhile: holding
    /// too much is safe, too little is not).
    async fn hold_for(&self, memory: &mut Memory, name: &str, pending_id: &str, version: &str) {
        let mut hooks: BTreeSet<Hook> = self.host.hooks_of(name).into_iter().collect();
        match memory.prepared.get(&(name.to_owned(), version.to_owned(), false)) {
            Some(prepared) => hooks.extend(prepared.hooks()),
            None if version.is_empty() => {}
            None => hooks.extend(Hook::ALL),
        }
        // Waits for the calls of those hooks under way, each bounded by its plugin's deadline.
        match &mut memory.hold {
            Some(hold) => self.host.hold_more(hold, hooks.iter().copied()).await,
            None => memory.hold = Some(self.host.hold(hooks.iter().copied()).await),
        }
        tracing::info!(plugin = %name, ?hooks, "hook calls held for a cluster-wide switch of plugin versions");
        let since = self.clock.now_ms();
        memory.holding.insert(name.to_owned(), Holding { id: pending_id.to_owned(), since, hooks });
    }

    /// Stops holding for the deploys that switched (installed above) or were aborted, and
    /// aborts those held past the limit; lets the calls go when none is left. Whether it
    /// aborted one.
    async fn let_go(&self, memory: &mut Memory, deployments: &[Deployment]) -> bool {
        let now = self.clock.now_ms();
        let mut aborted = false;
        let mut over = Vec::new();
        for (name, Holding { id, since, .. }) in &memory.holding {
            let pending = deployments.iter().find(|d| d.name == *name).and_then(|d| d.pending.as_ref());
            let Some(pending) = pending.filter(|pending| pending.id == *id) else {
                over.push(name.clone());
                continue;
            };
            if now.saturating_sub(*since) < self.hold_limit_ms {
                continue;
            }
            let why = format!(
                "node {} held its calls {} ms (plugin_registry.deploy_timeout_ms) without the switch",
                self.node, self.hold_limit_ms
            );
            let audit = Audit {
                name: name.clone(),
                action: "switch-aborted".into(),
                from_version: None,
                to_version: Some(pending.version.clone()),
                key_id: format!("node:{}", self.node),
                at_ms: now,
                detail: Some(why.clone()),
            };
            match self.store.finish_deploy(name, id, None, &audit).await {
                Ok(true) => {
                    tracing::warn!(plugin = %name, %why, "plugin deploy aborted by this node");
                    aborted = true;
                    over.push(name.clone());
                }
                // Switched or aborted by another meanwhile: the next pass sees which.
                Ok(false) => {}
                Err(error) => {
                    tracing::error!(plugin = %name, %error, "cannot abort a switch held too long; letting the calls go");
                    over.push(name.clone());
                }
            }
        }
        for name in over {
            memory.holding.remove(&name);
            if memory.errors.contains_key(&name) {
                tracing::error!(plugin = %name, "calls let go without the switched version installed; see its error");
            }
        }
        if memory.holding.is_empty() && memory.hold.take().is_some() {
            tracing::info!("hook calls let go after a cluster-wide switch");
        } else if let Some(hold) = &mut memory.hold {
            // The hooks of the switches still under way stay held; the others go on.
            let kept: BTreeSet<Hook> = memory.holding.values().flat_map(|held| held.hooks.iter().copied()).collect();
            hold.keep_only(&kept);
        }
        aborted
    }

    /// Prepares the version of a pending deploy not answered yet, and holds the calls for
    /// one switching; whether it answered anything.
    async fn answer_pending(&self, memory: &mut Memory, deployment: &Deployment) -> bool {
        let Some(pending) = &deployment.pending else { return false };
        let held = memory.holding.get(&deployment.name).is_some_and(|held| held.id == pending.id);
        if pending.switching && pending.role == "active" && !held {
            self.hold_for(memory, &deployment.name, &pending.id, &pending.version).await;
            self.write_report(memory, &deployment.name, deployment, true).await;
            return true;
        }
        if memory.answered.get(&deployment.name).is_some_and(|(id, _)| *id == pending.id) {
            return false;
        }
        let shadow = pending.role == "shadow";
        let outcome = match pending.version.is_empty() {
            true => Ok(()), // a switch that only removes the shadow: nothing to prepare
            false => self.prepared(memory, &deployment.name, &pending.version, shadow).await.map(|_| ()),
        };
        match &outcome {
            Ok(()) => {
                tracing::info!(plugin = %deployment.name, version = %pending.version, "deployed plugin version ready")
            }
            Err(why) => {
                tracing::warn!(plugin = %deployment.name, version = %pending.version, %why, "cannot make a deployed plugin version ready")
            }
        }
        memory.answered.insert(deployment.name.clone(), (pending.id.clone(), outcome));
        // Written now rather than with the other reports: a deploy waits on it.
        self.write_report(memory, &deployment.name, deployment, true).await;
        true
    }

    /// Installs the versions of `deployment` when its generation is not the one applied;
    /// whether it installed them.
    async fn apply(&self, memory: &mut Memory, deployment: &Deployment) -> bool {
        let name = &deployment.name;
        if memory.applied.get(name) == Some(&deployment.generation) {
            return false;
        }
        if deployment.generation == 0 {
            // Uploaded, never deployed: the folder's file of that name (if any) serves.
            memory.applied.insert(name.clone(), 0);
            return false;
        }
        let active = match &deployment.active {
            Some(version) => match self.prepared(memory, name, version, false).await {
                Ok(prepared) => Some(prepared),
                Err(why) => {
                    self.install_failed(memory, name, why);
                    return false;
                }
            },
            None => None,
        };
        let shadow = match &deployment.shadow {
            Some(version) => match self.prepared(memory, name, version, true).await {
                Ok(prepared) => Some(prepared),
                Err(why) => {
                    self.install_failed(memory, name, why);
                    return false;
                }
            },
            None => None,
        };
        self.host.install(name, active.as_ref(), shadow.as_ref()).await;
        tracing::info!(
            plugin = %name,
            generation = deployment.generation,
            active = ?deployment.active,
            shadow = ?deployment.shadow,
            "plugin registry version installed"
        );
        memory.applied.insert(name.clone(), deployment.generation);
        memory.serving.insert(name.clone(), (deployment.active.clone(), deployment.shadow.clone()));
        memory.errors.remove(name);
        true
    }

    fn install_failed(&self, memory: &mut Memory, name: &str, why: String) {
        tracing::error!(plugin = %name, %why, "cannot install the plugin registry's version; the previous one keeps serving");
        memory.errors.insert(name.to_owned(), why);
    }

    /// The prepared version, preparing it if need be.
    async fn prepared(&self, memory: &mut Memory, name: &str, version: &str, shadow: bool) -> Result<Prepared, String> {
        let key = (name.to_owned(), version.to_owned(), shadow);
        if let Some(prepared) = memory.prepared.get(&key) {
            return Ok(prepared.clone());
        }
        let (bytes, manifest) = self.fetch(name, version).await?;
        let prepared = self.host.prepare(name, shadow, bytes, &manifest).await.map_err(failed)?;
        memory.prepared.insert(key, prepared.clone());
        Ok(prepared)
    }

    /// A version's bytes and manifest: the bytes from the disk cache when it holds them
    /// (checked against the SHA-256), else from the database (then cached).
    async fn fetch(&self, name: &str, version: &str) -> Result<(Vec<u8>, String), String> {
        let missing = || format!("version {version} of plugin {name} is not in the registry");
        let (sha256, manifest) = self.store.manifest(name, version).await.map_err(failed)?.ok_or_else(missing)?;
        let file = self.cache_dir.join(format!("{}.wasm", sha256.trim_start_matches("sha256:")));
        let cached = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || std::fs::read(file).ok()).await.ok().flatten()
        };
        if let Some(bytes) = cached.filter(|bytes| hash(bytes) == sha256) {
            return Ok((bytes, manifest));
        }
        let (sha256, bytes, manifest) =
            self.store.component(name, version).await.map_err(failed)?.ok_or_else(missing)?;
        if hash(&bytes) != sha256 {
            return Err(format!("the registry's bytes of {name} {version} do not match their SHA-256 {sha256}"));
        }
        let (dir, copy) = (self.cache_dir.clone(), bytes.clone());
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let partial = file.with_extension("partial");
            std::fs::write(&partial, &copy)?;
            std::fs::rename(&partial, &file)
        })
        .await;
        if let Ok(Err(error)) = written {
            tracing::warn!(%error, dir = %self.cache_dir.display(), "cannot cache a plugin component; it is fetched again next time");
        }
        Ok((bytes, manifest))
    }

    /// Writes this node's report of every plugin it serves or the registry names.
    async fn write_reports(&self, memory: &mut Memory, deployments: &[Deployment]) {
        let by_name: BTreeMap<&str, &Deployment> = deployments.iter().map(|d| (d.name.as_str(), d)).collect();
        let mut names: Vec<String> = self.host.status().into_iter().map(|status| status.name).collect();
        // A plugin with a deploy pending too, even before its first: the deploy waits on
        // this node's answer, and an answer whose write failed is written again here.
        names.extend(deployments.iter().filter(|d| d.generation > 0 || d.pending.is_some()).map(|d| d.name.clone()));
        names.extend(memory.written.keys().cloned());
        names.sort();
        names.dedup();
        for name in names {
            match by_name.get(name.as_str()) {
                Some(deployment) => self.write_report(memory, &name, deployment, false).await,
                None => {
                    let empty = Deployment {
                        name: name.clone(),
                        active: None,
                        shadow: None,
                        previous: None,
                        canary: None,
                        generation: 0,
                        pending: None,
                    };
                    self.write_report(memory, &name, &empty, false).await;
                }
            }
        }
    }

    /// Writes this node's report of `name` when it changed (or `now`, or it is old).
    async fn write_report(&self, memory: &mut Memory, name: &str, deployment: &Deployment, now: bool) {
        let report = self.report_of(memory, name, deployment).to_string();
        let at = self.clock.now_ms();
        let fresh = memory
            .written
            .get(name)
            .is_some_and(|(last, when)| *last == report && at.saturating_sub(*when) < REPORT_REFRESH_MS);
        if fresh && !now {
            return;
        }
        let row = NodeReport { node: self.node, name: name.to_owned(), report: report.clone(), updated_ms: at };
        match self.store.report(&row).await {
            Ok(()) => {
                memory.written.insert(name.to_owned(), (report, at));
            }
            Err(error) => tracing::warn!(plugin = %name, %error, "cannot write this node's plugin report"),
        }
    }

    /// What this node says of plugin `name` (docs/PROTOCOL.md, `GET /admin/plugins`).
    fn report_of(&self, memory: &Memory, name: &str, deployment: &Deployment) -> Value {
        let status = self.host.plugin_status(name);
        let registry = self.host.managed().iter().any(|managed| managed == name);
        let (active, shadow) = memory.serving.get(name).cloned().unwrap_or_default();
        let pending = deployment.pending.as_ref().and_then(|pending| {
            let outcome = memory.answered.get(name).filter(|(id, _)| *id == pending.id).map(|(_, outcome)| outcome);
            // A node that started while the deploy was switching holds without having
            // prepared it (it prepares at the switch).
            let holding = memory.holding.get(name).is_some_and(|held| held.id == pending.id);
            (outcome.is_some() || holding).then(|| {
                json!({
                    "id": pending.id,
                    "version": pending.version,
                    "as": pending.role,
                    "ready": outcome.is_some_and(Result::is_ok),
                    "error": outcome.and_then(|outcome| outcome.as_ref().err()),
                    "holding": holding,
                })
            })
        });
        let source = match (&status, registry) {
            (_, true) => "registry",
            (Some(_), false) => "folder",
            (None, false) => "none",
        };
        json!({
            "source": source,
            "generation": memory.applied.get(name).copied().unwrap_or(0),
            "active": if registry { active } else { status.as_ref().and_then(|s| s.version.clone()) },
            "shadow": if registry { shadow } else { status.as_ref().and_then(|s| s.shadow.as_ref()?.version.clone()) },
            "content_hash": status.as_ref().and_then(|s| s.content_hash.clone()),
            "pending": pending,
            "error": memory.errors.get(name),
            "calls": status.as_ref().map_or(0, |s| s.calls),
            "failures": status.as_ref().map_or(0, |s| s.failures),
            "quarantined": status.as_ref().is_some_and(|s| matches!(s.state, herald_plugin_runtime::PluginState::Quarantined { .. })),
            "last_error": status.as_ref().and_then(|s| s.last_error.clone()),
            "p99_call_us": status.as_ref().and_then(|s| s.p99_call_us),
            "shadow_status": status.as_ref().and_then(|s| s.shadow.clone()),
        })
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
