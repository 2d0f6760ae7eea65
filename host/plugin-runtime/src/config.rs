//! The runtime's configuration: hooks, failure policies, per-plugin limits and the host-wide
//! knobs (pool size, quarantine, epoch tick). Every knob has a default that suits a laptop
//! and is documented here; the host's `[plugin_runtime]` config section deserializes into
//! [`PluginHostConfig`].

use serde::{Deserialize, Serialize};
use std::{collections::BTreeMap, fmt, time::Duration};

/// A hook: one exported interface of the `herald:plugin` contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hook {
    /// `message-policy`: allow / reject / rewrite a message.
    MessagePolicy,
    /// `announce-policy`: accept / defer / duplicate an announcement, archive or not.
    AnnouncePolicy,
    /// `route-key`: the key the ring hashes for a command.
    RouteKey,
    /// `degrade`: the delivery tier for a health snapshot.
    Degrade,
    /// `connect`: authorize a connection.
    Connect,
    /// `deliver-filter`: drop recipients of a stored message (contract 0.2.0).
    DeliverFilter,
}

impl Hook {
    /// Every hook, in contract order.
    pub const ALL: [Hook; 6] =
        [Hook::MessagePolicy, Hook::AnnouncePolicy, Hook::RouteKey, Hook::Degrade, Hook::Connect, Hook::DeliverFilter];

    /// The WIT interface name, e.g. `message-policy`.
    pub fn wit_name(self) -> &'static str {
        match self {
            Hook::MessagePolicy => "message-policy",
            Hook::AnnouncePolicy => "announce-policy",
            Hook::RouteKey => "route-key",
            Hook::Degrade => "degrade",
            Hook::Connect => "connect",
            Hook::DeliverFilter => "deliver-filter",
        }
    }

    /// The hook whose WIT interface name is `name`.
    pub fn from_wit_name(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.wit_name() == name)
    }

    /// Index into per-hook arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wit_name())
    }
}

/// What a hook answers when its plugin fails (trap, timeout, limit) or is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// The permissive answer: message allowed, announcement accepted and archived, tier
    /// normal, connection allowed, no recipient dropped. For `route-key` the same as
    /// `default`.
    Allow,
    /// The restrictive answer: message rejected (`plugin-failed`), announcement deferred
    /// one second, tier pull-only, connection denied, every recipient dropped (the message
    /// stays stored; it reaches them once the filter answers again). For `route-key` the
    /// same as `default`.
    Deny,
    /// The host's built-in default ([`crate::Fallback`]), as if the plugin were absent.
    #[default]
    Default,
}

/// Sandbox limits of one plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall time one hook call may take before it is interrupted, ms.
    pub deadline_ms: u64,
    /// Linear memory an instance may grow to, MiB.
    pub memory_mib: u64,
    /// Elements one table may grow to.
    pub table_elements: u32,
    /// Host imports one hook call may make (a plugin calling the host in a tight loop is
    /// stopped here rather than at its deadline).
    pub max_host_calls: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self { deadline_ms: 50, memory_mib: 16, table_elements: 10_000, max_host_calls: 1_000 }
    }
}

impl Limits {
    /// The per-call deadline.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.max(1))
    }

    /// The memory cap in bytes.
    pub fn memory_bytes(&self) -> usize {
        usize::try_from(self.memory_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

/// When a failing plugin is taken out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuarantinePolicy {
    /// Failures within `window_ms` that quarantine the plugin.
    pub failures: u32,
    /// The sliding window, ms.
    pub window_ms: u64,
    /// How long a quarantine lasts before the plugin is tried again, ms. A reload of the
    /// plugin ends it at once.
    pub duration_ms: u64,
}

impl Default for QuarantinePolicy {
    fn default() -> Self {
        Self { failures: 5, window_ms: 60_000, duration_ms: 60_000 }
    }
}

/// Operator settings for one plugin, overriding its manifest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginOverride {
    /// Set false to skip the plugin's file.
    pub enabled: Option<bool>,
    /// Position in every hook chain it takes part in (lower first).
    pub order: Option<i32>,
    /// Failure policies by hook.
    pub failure: BTreeMap<Hook, FailurePolicy>,
    /// Limits, replacing the manifest's.
    pub limits: Option<Limits>,
    /// Merged over the manifest's `[config]` table, key by key.
    pub config: toml::Table,
}

/// What a shadow version is given: the same inputs as the active version, sampled and
/// budgeted so that it never delays a call (its calls run in tasks of their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShadowPolicy {
    /// The shadow gets one call in `every` of the active version's (1: all of them; a
    /// stateful plugin, such as a rate limiter, is only comparable at 1).
    pub every: u64,
    /// Shadow calls waiting at most (a shadow's calls run one at a time, in order); a call
    /// beyond is skipped (and counted).
    pub max_in_flight: usize,
    /// Examples kept per kind of difference.
    pub examples: usize,
}

impl Default for ShadowPolicy {
    fn default() -> Self {
        Self { every: 1, max_in_flight: 64, examples: 3 }
    }
}

/// How a version promoted from shadow is watched: for `window_ms` after the promotion, once
/// it has served `min_calls` calls, a failure ratio above `max_failure_ratio` or a call p99
/// above the larger of `min_p99_us` and `p99_factor` × the previous version's p99 rolls it
/// back to the previous version, by itself, logging why.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CanaryPolicy {
    /// How long a promoted version is watched, ms.
    pub window_ms: u64,
    /// Calls it must have served before it is judged.
    pub min_calls: u64,
    /// Failed calls (traps, deadlines, limits) over all calls that roll it back.
    pub max_failure_ratio: f64,
    /// Its call p99 may be this many times the previous version's.
    pub p99_factor: f64,
    /// A p99 under this is never too slow, µs.
    pub min_p99_us: u64,
}

impl Default for CanaryPolicy {
    fn default() -> Self {
        Self { window_ms: 60_000, min_calls: 20, max_failure_ratio: 0.05, p99_factor: 3.0, min_p99_us: 5_000 }
    }
}

/// The plugin runtime's configuration (the host's `[plugin_runtime]` section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginHostConfig {
    /// Limits for plugins whose manifest gives none.
    pub default_limits: Limits,
    /// The largest memory cap any plugin may ask for, MiB. Also the address space each
    /// instance reserves, so it bounds the host's virtual memory per pooled instance.
    pub max_memory_mib: u64,
    /// Idle instances kept per plugin. A call takes one (or instantiates a fresh one when
    /// none is idle) and gives it back unless it failed.
    pub pool_size: usize,
    /// How often the epoch advances, ms: the granularity of call deadlines.
    pub epoch_tick_ms: u64,
    /// Pre-reserve instance slots (wasmtime's pooling allocator): a fresh instantiation
    /// reuses a slot instead of mapping memory, several times faster. Costs address space
    /// (`max_instances` × `max_memory_mib`), not resident memory.
    pub pooling: bool,
    /// With `pooling`: instances alive at once across all plugins (idle in pools and in
    /// flight). A call that needs one more fails and its failure policy answers.
    pub max_instances: u32,
    /// Machine code of compiled functions kept for the next compile, MiB (0: none). A new
    /// version of a plugin compiles only the functions that changed; the others are
    /// taken from here.
    pub compile_cache_mib: u64,
    /// Quarantine rule.
    pub quarantine: QuarantinePolicy,
    /// How much of the active version's traffic a shadow version (`NAME.shadow.wasm`) sees.
    pub shadow: ShadowPolicy,
    /// How a promoted version is watched, and when it is rolled back by itself.
    pub canary: CanaryPolicy,
    /// Debounce of the plugins-folder watcher, ms.
    pub watch_debounce_ms: u64,
    /// Per-plugin overrides, by plugin name.
    pub plugins: BTreeMap<String, PluginOverride>,
}

impl Default for PluginHostConfig {
    fn default() -> Self {
        Self {
            default_limits: Limits::default(),
            max_memory_mib: 64,
            pool_size: 16,
            epoch_tick_ms: 5,
            pooling: true,
            max_instances: 1_000,
            compile_cache_mib: 64,
            quarantine: QuarantinePolicy::default(),
            shadow: ShadowPolicy::default(),
            canary: CanaryPolicy::default(),
            watch_debounce_ms: 200,
            plugins: BTreeMap::new(),
        }
    }
}

impl PluginHostConfig {
    /// The epoch tick.
    pub fn epoch_tick(&self) -> Duration {
        Duration::from_millis(self.epoch_tick_ms.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_config_reads_from_toml_with_defaults() {
        let cfg: PluginHostConfig = toml::from_str(
            r#"
            pool_size = 4
            [default_limits]
            deadline_ms = 10
            [plugins.room-rate-limit]
            order = 1
            failure = { message-policy = "deny" }
            config = { rules = [] }
            "#,
        )
        .unwrap_or_default();
        assert_eq!(cfg.pool_size, 4);
        assert_eq!(cfg.default_limits.deadline_ms, 10);
        assert_eq!(cfg.default_limits.memory_mib, 16);
        let o = &cfg.plugins["room-rate-limit"];
        assert_eq!(o.failure.get(&Hook::MessagePolicy), Some(&FailurePolicy::Deny));
        assert!(o.config.contains_key("rules"));
    }

    #[test]
    fn hook_names_round_trip() {
        for h in Hook::ALL {
            assert_eq!(Hook::from_wit_name(h.wit_name()), Some(h));
        }
        assert_eq!(Hook::from_wit_name("nope"), None);
    }
}
