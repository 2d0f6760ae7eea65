//! What `GET /admin/plugins` shows: one [`PluginStatus`] per plugin file.

use crate::config::Hook;
use serde::Serialize;
use std::path::PathBuf;

/// Whether a plugin is serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum PluginState {
    /// Loaded and called.
    Active,
    /// Failed too often: not called until `remaining_ms` elapse or it is reloaded; its
    /// hooks answer by failure policy meanwhile.
    Quarantined {
        /// Time left, ms.
        remaining_ms: u64,
    },
    /// Disabled by the host config.
    Disabled,
    /// Never loaded: see `last_load_error`.
    Failed,
}

/// One plugin's status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginStatus {
    /// The plugin's name (its file stem).
    pub name: String,
    /// The `.wasm` file.
    pub file: PathBuf,
    /// The serving version (manifest `version`), if one loaded.
    pub version: Option<String>,
    /// `sha256:<hex>` of the serving component.
    pub content_hash: Option<String>,
    /// The `herald:plugin` contract version the serving component was built for.
    pub contract: Option<String>,
    /// The hooks it exports.
    pub hooks: Vec<Hook>,
    /// Position in hook chains.
    pub order: Option<i32>,
    /// Calls of the serving version.
    pub calls: u64,
    /// Failed calls (traps, timeouts, limits) of the serving version.
    pub failures: u64,
    /// Of which timeouts.
    pub timeouts: u64,
    /// Times it was quarantined.
    pub quarantines: u64,
    /// 99th percentile call time, microseconds (within 25 %).
    pub p99_call_us: Option<u64>,
    /// Serving state.
    #[serde(flatten)]
    pub state: PluginState,
    /// The last call failure.
    pub last_error: Option<String>,
    /// Why the last (re)load of this file failed; the previous version, if any, serves.
    pub last_load_error: Option<String>,
    /// The serving version's recording, running or ended, if one was started.
    pub recording: Option<crate::recording::RecordingStatus>,
    /// Its shadow (`NAME.shadow.wasm`), if one is installed: how its decisions compare.
    pub shadow: Option<crate::shadow::ShadowStatus>,
    /// How its promotion from shadow went (or, after a rollback, why it serves again).
    pub canary: Option<crate::canary::CanaryStatus>,
}
