//! The node's side of the plugin platform: loads the plugins folder at start through the
//! runtime (`host/plugin-runtime`, crate `herald-plugin-runtime`), keeps watching it for
//! changed `.wasm` files, and answers the admin API.
//!
//! Hook calls never fail from the node's point of view: a plugin that traps, overruns its
//! deadline or hits a limit costs only that call, and the hook's failure policy (or the
//! built-in default, ARCHITECTURE.md §4) answers instead.

use std::sync::{Arc, Mutex};

pub use herald_plugin_runtime::types;
pub use herald_plugin_runtime::{
    Hook, PluginError, PluginHost, PluginHostConfig, PluginKv, PluginStatus, PluginWatcher, PromoteError, RateLimiter,
    RecordingError, RecordingOptions,
};

/// The loaded plugins and the watcher that hot-reloads them.
pub struct Plugins {
    /// Runs the hooks.
    pub host: Arc<PluginHost>,
    /// Dropping it stops hot reload.
    _watcher: Mutex<Option<PluginWatcher>>,
}

impl Plugins {
    /// Loads every plugin in `dir` (creating the folder if needed) and watches it.
    /// A plugin that fails to load is reported in its status; the others serve.
    ///
    /// Embedded mode: the plugins' KV and rate limiter live in this process
    /// ([`PluginHost::embedded`]). Cluster mode uses [`Plugins::start_with`].
    ///
    /// # Errors
    /// [`PluginError`] when the runtime cannot start (e.g. a bad runtime config).
    pub async fn start(config: PluginHostConfig, dir: &std::path::Path) -> Result<Self, PluginError> {
        Self::serve(PluginHost::embedded(config)?, dir).await
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
    ) -> Result<Self, PluginError> {
        let host = PluginHost::new(config, kv, limiter, Arc::new(herald_plugin_runtime::BuiltinDefaults))?;
        Self::serve(host, dir).await
    }

    /// Loads `dir` into `host` and watches it.
    async fn serve(host: PluginHost, dir: &std::path::Path) -> Result<Self, PluginError> {
        if let Err(error) = std::fs::create_dir_all(dir) {
            tracing::warn!(%error, dir = %dir.display(), "cannot create the plugins folder");
        }
        let host = Arc::new(host);
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
        Ok(Self { host, _watcher: Mutex::new(watcher) })
    }
}
