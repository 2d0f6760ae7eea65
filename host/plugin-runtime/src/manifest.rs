//! A plugin's manifest: the sidecar `NAME.toml` next to `NAME.wasm`.
//!
//! ```toml
//! name = "room-rate-limit"     # must equal the file stem (optional)
//! version = "0.1.0"            # shown in status (optional; default "0.0.0")
//! hooks = ["message-policy", "announce-policy"]   # checked against the exports (optional)
//! order = 10                   # position in hook chains, lower first (default 100)
//!
//! [failure]                    # per hook: "allow" | "deny" | "default" (default "default")
//! message-policy = "allow"
//!
//! [limits]                     # see `Limits`; unset fields take the host's defaults
//! deadline_ms = 20
//! memory_mib = 8
//!
//! [config]                     # the plugin's own TOML table, returned by `config()`
//! ```
//!
//! A sidecar keeps the manifest editable without rebuilding the component and lets an
//! operator read it; a `.wasm` without one loads with defaults and the hooks it exports.
//! The host config's `[plugins.NAME]` overrides any of it (see [`crate::PluginOverride`]).

use crate::config::{FailurePolicy, Hook, Limits, PluginHostConfig};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Limits as a manifest gives them: every field optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitsPatch {
    /// See [`Limits::deadline_ms`].
    pub deadline_ms: Option<u64>,
    /// See [`Limits::memory_mib`].
    pub memory_mib: Option<u64>,
    /// See [`Limits::table_elements`].
    pub table_elements: Option<u32>,
    /// See [`Limits::max_host_calls`].
    pub max_host_calls: Option<u32>,
}

impl LimitsPatch {
    /// `base` with the fields this patch sets replaced.
    pub fn apply(&self, base: Limits) -> Limits {
        Limits {
            deadline_ms: self.deadline_ms.unwrap_or(base.deadline_ms),
            memory_mib: self.memory_mib.unwrap_or(base.memory_mib),
            table_elements: self.table_elements.unwrap_or(base.table_elements),
            max_host_calls: self.max_host_calls.unwrap_or(base.max_host_calls),
        }
    }
}

/// The parsed sidecar.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The plugin's name; must equal the file stem when given.
    pub name: Option<String>,
    /// The plugin's version, for status.
    pub version: Option<String>,
    /// The hooks the component must export, exactly.
    pub hooks: Option<Vec<Hook>>,
    /// Position in hook chains.
    pub order: Option<i32>,
    /// Failure policies by hook.
    #[serde(default)]
    pub failure: BTreeMap<Hook, FailurePolicy>,
    /// Sandbox limits.
    #[serde(default)]
    pub limits: LimitsPatch,
    /// The plugin's configuration table.
    #[serde(default)]
    pub config: toml::Table,
}

impl Manifest {
    /// Parses manifest text.
    ///
    /// # Errors
    /// The TOML error, which names the line and the offending key.
    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

/// Everything the runtime needs about one plugin, after the host config's override.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub version: String,
    pub claimed_hooks: Option<Vec<Hook>>,
    pub order: i32,
    pub failure: BTreeMap<Hook, FailurePolicy>,
    pub limits: Limits,
    /// The config table as TOML text.
    pub config_text: String,
    pub enabled: bool,
}

impl Settings {
    pub(crate) fn resolve(name: &str, manifest: &Manifest, host: &PluginHostConfig) -> Self {
        let over = host.plugins.get(name).cloned().unwrap_or_default();
        let mut failure = manifest.failure.clone();
        failure.extend(over.failure);
        let mut config = manifest.config.clone();
        config.extend(over.config);
        Settings {
            version: manifest.version.clone().unwrap_or_else(|| "0.0.0".to_owned()),
            claimed_hooks: manifest.hooks.clone(),
            order: over.order.or(manifest.order).unwrap_or(100),
            failure,
            limits: over.limits.unwrap_or_else(|| manifest.limits.apply(host.default_limits)),
            config_text: if config.is_empty() { String::new() } else { config.to_string() },
            enabled: over.enabled.unwrap_or(true),
        }
    }

    pub(crate) fn failure(&self, hook: Hook) -> FailurePolicy {
        self.failure.get(&hook).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_overrides_win_key_by_key() {
        let m = Manifest::parse(
            r#"
            version = "1.2.0"
            hooks = ["message-policy"]
            [failure]
            message-policy = "allow"
            [limits]
            deadline_ms = 7
            [config]
            a = 1
            b = 2
            "#,
        )
        .unwrap_or_default();
        let mut host = PluginHostConfig::default();
        let mut over = crate::config::PluginOverride { order: Some(3), ..Default::default() };
        over.config.insert("b".into(), toml::Value::Integer(9));
        host.plugins.insert("p".into(), over);
        let s = Settings::resolve("p", &m, &host);
        assert_eq!(s.version, "1.2.0");
        assert_eq!(s.order, 3);
        assert_eq!(s.limits.deadline_ms, 7);
        assert_eq!(s.limits.memory_mib, host.default_limits.memory_mib);
        assert_eq!(s.failure(Hook::MessagePolicy), FailurePolicy::Allow);
        assert_eq!(s.failure(Hook::Degrade), FailurePolicy::Default);
        let cfg: toml::Table = toml::from_str(&s.config_text).unwrap_or_default();
        assert_eq!(cfg.get("b"), Some(&toml::Value::Integer(9)));
        assert_eq!(cfg.get("a"), Some(&toml::Value::Integer(1)));
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let err = Manifest::parse("nmae = \"x\"").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("nmae"), "{err}");
    }
}
