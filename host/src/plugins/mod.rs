//! The node's side of the plugin platform: loads the plugins folder at start through the
//! runtime (`host/plugin-runtime`, crate `herald-plugin-runtime`), keeps watching it for
//! changed `.wasm` files, follows the plugin registry in the database (`follow.rs`),
//! drives uploads and deploys through it (`deploy.rs`, with the cluster's canary in
//! `canary.rs` and the admin listing in `listing.rs`), and answers the admin API.
//!
//! Hook calls never fail from the node's point of view: a plugin that traps, overruns its
//! deadline or hits a limit costs only that call, and the hook's failure policy (or the
//! built-in default, ARCHITECTURE.md §4) answers instead.
//!
//! Folder and registry: a plugin the registry has deployed is served from the registry on
//! every node, and the folder's files of that name are passed over (and reported); a
//! plugin the registry never deployed is served from the folder, as before.

mod canary;
pub mod deploy;
pub mod follow;
mod listing;
pub mod notices;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use herald_plugin_runtime::types;
pub use herald_plugin_runtime::{
    Hold, Hook, PluginError, PluginHost, PluginHostConfig, PluginKv, PluginStatus, PluginWatcher, Prepared,
    PromoteError, RateLimiter, RecordingError, RecordingOptions,
};

use crate::clock::WallClock;
use crate::config::PluginRegistryConfig;
use crate::model::NodeId;
use crate::store::plugin_registry::PluginRegistryStore;
pub use deploy::{Deployer, LiveNodes, RegistryError, Role, Upload};
use follow::Follower;
use notices::DeployNotices;

/// What a node follows the plugin registry with.
pub struct RegistryWiring {
    /// The registry's tables.
    pub store: Arc<dyn PluginRegistryStore>,
    /// The notice that deployments changed (in the process, or Redis pub/sub).
    pub notices: Arc<dyn DeployNotices>,
    /// The nodes a deploy waits for.
    pub live: LiveNodes,
    /// This node, in its reports.
    pub node: NodeId,
    pub settings: PluginRegistryConfig,
    /// Where fetched components are cached by SHA-256.
    pub cache_dir: PathBuf,
    pub clock: Arc<dyn WallClock>,
}

impl RegistryWiring {
    /// The wiring `config` asks for, on `store`, with the mode's notices and live nodes.
    pub fn new(
        config: &crate::config::Config,
        store: Arc<dyn PluginRegistryStore>,
        notices: Arc<dyn DeployNotices>,
        live: LiveNodes,
        node: NodeId,
    ) -> Self {
        let settings = config.plugin_registry.clone();
        let cache_dir = settings.cache_dir.clone().unwrap_or_else(|| config.data_dir.join("plugin-cache"));
        Self { store, notices, live, node, settings, cache_dir, clock: Arc::new(crate::clock::SystemClock) }
    }

    /// Embedded mode: notices within the process, and this node the only one.
    pub fn embedded(config: &crate::config::Config, store: Arc<dyn PluginRegistryStore>, node: NodeId) -> Self {
        let notices = Arc::new(notices::LocalNotices::default());
        Self::new(config, store, notices, Arc::new(move || vec![node]), node)
    }
}

/// The loaded plugins, the watcher that hot-reloads them, and the registry's follower.
pub struct Plugins {
    /// Runs the hooks.
    pub host: Arc<PluginHost>,
    /// Uploads and deploys through the registry.
    pub deployer: Arc<Deployer>,
    /// Dropping it stops hot reload.
    _watcher: Mutex<Option<PluginWatcher>>,
    /// The follower's loop, stopped when the plugins are dropped.
    following: tokio::task::JoinHandle<()>,
}

impl Drop for Plugins {
    fn drop(&mut self) {
        self.following.abort();
    }
}

impl Plugins {
    /// Loads every plugin in `dir` (creating the folder if needed) and watches it; installs
    /// the registry's versions (before returning, so before the node accepts connections)
    /// and follows the registry. A plugin that fails to load is reported in its status; the
    /// others serve.
    ///
    /// Embedded mode: the plugins' KV and rate limiter live in this process
    /// ([`PluginHost::embedded`]). Cluster mode uses [`Plugins::start_with`].
    ///
    /// # Errors
    /// [`PluginError`] when the runtime cannot start (e.g. a bad runtime config).
    pub async fn start(
        config: PluginHostConfig,
        dir: &std::path::Path,
        registry: RegistryWiring,
    ) -> Result<Self, PluginError> {
        Self::serve(PluginHost::embedded(config)?, dir, registry).await
    }

    /// As [`Plugins::start`], with the plugins' KV and rate limiter given: cluster mode
    /// passes the Redis ones (`cluster::RedisPluginKv`, `cluster::RedisRateLimiter`), so
    /// what plugins store and the limits they keep hold across every node. Built-in
    /// defaults and the system clock as in embedded mode.
    ///
    /// # Errors
    /// As [`Plugins::start`].
    pub async fn start_with(
        config: PluginHostConfig,
        dir: &std::path::Path,
        kv: Arc<dyn PluginKv>,
        limiter: Arc<dyn RateLimiter>,
        registry: RegistryWiring,
    ) -> Result<Self, PluginError> {
        let host = PluginHost::new(config, kv, limiter, Arc::new(herald_plugin_runtime::BuiltinDefaults))?;
        Self::serve(host, dir, registry).await
    }

    /// Loads `dir` into `host` and watches it; installs the registry's versions.
    async fn serve(host: PluginHost, dir: &std::path::Path, registry: RegistryWiring) -> Result<Self, PluginError> {
        if let Err(error) = std::fs::create_dir_all(dir) {
            tracing::warn!(%error, dir = %dir.display(), "cannot create the plugins folder");
        }
        let host = Arc::new(host);
        // The registry's plugins first, so the folder's files of those names are passed over.
        match registry.store.deployments().await {
            Ok(deployments) => host.manage(deployments.into_iter().filter(|d| d.generation > 0).map(|d| d.name)),
            Err(error) => tracing::warn!(%error, "cannot read the plugin registry at start; following it by its poll"),
        }
        let loaded = host.load_dir(dir).await?;
        for status in &loaded {
            match &status.last_load_error {
                Some(error) => tracing::warn!(plugin = %status.name, %error, "plugin failed to load"),
                None => {
                    tracing::info!(plugin = %status.name, version = ?status.version, hooks = ?status.hooks, "plugin loaded")
                }
            }
        }
        let watcher = match host.watch() {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!(%error, "hot reload is off: cannot watch the plugins folder");
                None
            }
        };
        let RegistryWiring { store, notices, live, node, settings, cache_dir, clock } = registry;
        let hold_limit_ms = settings.deploy_timeout_ms;
        let follower =
            Follower::new(Arc::clone(&host), Arc::clone(&store), node, cache_dir, Arc::clone(&clock), hold_limit_ms);
        let follower = Arc::new(follower);
        // Before the node accepts connections: it serves the registry's versions from its
        // first connection on.
        let holding = follower.pass(&*notices).await;
        let poll = Duration::from_millis(settings.poll_ms);
        let following = tokio::spawn(Arc::clone(&follower).run(Arc::clone(&notices), poll, holding));
        let canary = host.config().canary;
        let deployer = Arc::new(Deployer { store, notices, live, clock, settings, canary });
        Ok(Self { host, deployer, _watcher: Mutex::new(watcher), following })
    }
}
