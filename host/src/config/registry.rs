//! `[plugin_registry]`: the plugin registry in the database (uploads, deploys, and how each
//! node follows it; docs/OPERATIONS.md, "Plugins across a cluster"). Checked with the rest
//! in [`Config::validate`](super::Config::validate).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The largest `max_component_bytes` may be: every node holds each version it serves in
/// memory, and the database stores every upload whole.
pub const MAX_COMPONENT_BYTES: usize = 256 << 20;

/// `[plugin_registry]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginRegistryConfig {
    /// The largest component `PUT /admin/plugins/{name}/versions/{version}` accepts, bytes
    /// (8 MiB by default; the example plugins are 60–200 KiB).
    pub max_component_bytes: usize,
    /// How often a node reads the registry's generations, ms: the backstop for a missed
    /// notice (Redis pub/sub in cluster mode; a notice in the process in embedded mode).
    pub poll_ms: u64,
    /// Whether this node subscribes to the deploy notices (cluster mode: Redis pub/sub).
    /// Off, it follows the registry at its poll alone, as on a Redis Cluster: for a Redis
    /// that does not allow `SUBSCRIBE`. It still publishes its own notices, so the other
    /// nodes hear its deploys at once; every deploy then waits up to a poll for it.
    pub notices: bool,
    /// How long a deploy waits for every live node to report the version ready (compiled
    /// and warmed), then for every node to serve it, ms. Past it the deploy is aborted,
    /// naming the nodes that did not answer.
    pub deploy_timeout_ms: u64,
    /// Where a node caches the components it fetched, by SHA-256; `<data_dir>/plugin-cache`
    /// when unset.
    pub cache_dir: Option<PathBuf>,
}

impl Default for PluginRegistryConfig {
    fn default() -> Self {
        Self { max_component_bytes: 8 << 20, poll_ms: 2_000, notices: true, deploy_timeout_ms: 30_000, cache_dir: None }
    }
}

impl PluginRegistryConfig {
    /// Checks the bounds.
    ///
    /// # Errors
    /// A message naming the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_COMPONENT_BYTES).contains(&self.max_component_bytes) {
            return Err(format!(
                "plugin_registry.max_component_bytes {} must be 1..={MAX_COMPONENT_BYTES}",
                self.max_component_bytes
            ));
        }
        if !(50..=60_000).contains(&self.poll_ms) {
            return Err(format!("plugin_registry.poll_ms {} must be 50..=60000", self.poll_ms));
        }
        if !(1_000..=600_000).contains(&self.deploy_timeout_ms) {
            return Err(format!("plugin_registry.deploy_timeout_ms {} must be 1000..=600000", self.deploy_timeout_ms));
        }
        Ok(())
    }
}
