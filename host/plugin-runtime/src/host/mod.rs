//! [`PluginHost`]: the set of loaded plugins, swapped atomically on reload.
//!
//! The registry (every plugin file and, per hook, the ordered chain of plugins) lives in an
//! `ArcSwap`. A call takes a snapshot and runs on it, so a reload never disturbs calls in
//! flight: they finish on the version they started with. Reloads are serialized; a version
//! that fails to load leaves the previous one serving and records the error in its status.
//!
//! Beside this file: the registry (`registry.rs`), loading and reloading (`reload.rs`),
//! promotion of a shadow with its canary watch (`promote.rs`), and versions handed in by
//! the plugin registry of the database rather than read from the folder (`deployed.rs`).

mod deployed;
mod promote;
mod registry;
mod reload;

use crate::{
    clock::{Clock, SystemClock},
    config::{Hook, PluginHostConfig},
    engine::Runtime,
    error::PluginError,
    fallback::{BuiltinDefaults, Fallback},
    kv::{MemoryKv, PluginKv},
    limiter::{MemoryLimiter, RateLimiter},
    plugin::{Deps, SHADOW},
    recording::{Header, Recorder, RecordingError, RecordingOptions, RecordingStatus},
    shadow::ShadowStatus,
    status::{PluginState, PluginStatus},
};
use arc_swap::ArcSwap;
use std::{
    path::PathBuf,
    sync::{Arc, atomic::Ordering::Relaxed},
};

pub use deployed::{Hold, Prepared};
pub(crate) use registry::{Registry, Slot};

pub(crate) struct Inner {
    pub runtime: Arc<Runtime>,
    pub deps: Deps,
    pub fallback: Arc<dyn Fallback>,
    pub registry: ArcSwap<Registry>,
    reload_lock: tokio::sync::Mutex<()>,
    dir: parking_lot::Mutex<Option<PathBuf>>,
    /// Plugins the registry deploys (`deployed.rs`): the folder's files of these names are
    /// not loaded, and a reload of the folder keeps their slots.
    managed: parking_lot::Mutex<std::collections::BTreeSet<String>>,
    /// Folder files passed over because the registry deploys their plugin, by file stem.
    overridden: parking_lot::Mutex<Vec<String>>,
    /// Per hook: every call of the hook holds it shared for its whole length; a cluster's
    /// switch of a plugin's versions holds the gates of that plugin's hooks exclusively
    /// (`deployed.rs`, [`PluginHost::hold`]), so the other hooks' calls go on.
    pub gates: [Arc<tokio::sync::RwLock<()>>; Hook::ALL.len()],
}

/// Herald's plugin runtime: loads plugin components, calls their hooks under the sandbox's
/// limits, applies failure policies and built-in defaults, and hot-reloads them.
///
/// Cheap to clone (a handle). Use one per process; the hook methods are safe to call from
/// many tasks at once.
#[derive(Clone)]
pub struct PluginHost {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost").field("plugins", &self.inner.registry.load().slots.len()).finish()
    }
}

impl PluginHost {
    /// A host with no plugins loaded, using the given KV, rate limiter and built-in defaults,
    /// and the system clock.
    ///
    /// # Errors
    /// [`PluginError::Engine`] when wasmtime cannot be configured (e.g. `max_memory_mib` too
    /// large for the address space).
    pub fn new(
        config: PluginHostConfig,
        kv: Arc<dyn PluginKv>,
        limiter: Arc<dyn RateLimiter>,
        fallback: Arc<dyn Fallback>,
    ) -> Result<Self, PluginError> {
        Self::with_clock(config, kv, limiter, fallback, Arc::new(SystemClock))
    }

    /// Like [`PluginHost::new`] with an explicit clock for `now-ms` and WASI clocks. Give KV
    /// and limiter the same clock.
    ///
    /// # Errors
    /// As [`PluginHost::new`].
    pub fn with_clock(
        config: PluginHostConfig,
        kv: Arc<dyn PluginKv>,
        limiter: Arc<dyn RateLimiter>,
        fallback: Arc<dyn Fallback>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, PluginError> {
        let runtime = Arc::new(Runtime::new(&config)?);
        Ok(Self {
            inner: Arc::new(Inner {
                runtime,
                deps: Deps { config, kv, limiter, clock },
                fallback,
                registry: ArcSwap::from_pointee(Registry::default()),
                reload_lock: tokio::sync::Mutex::new(()),
                dir: parking_lot::Mutex::new(None),
                managed: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
                overridden: parking_lot::Mutex::new(Vec::new()),
                gates: Default::default(),
            }),
        })
    }

    /// Embedded mode: in-memory KV and limiter, [`BuiltinDefaults`], the system clock.
    ///
    /// # Errors
    /// As [`PluginHost::new`].
    pub fn embedded(config: PluginHostConfig) -> Result<Self, PluginError> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        Self::with_clock(
            config,
            Arc::new(MemoryKv::new(clock.clone())),
            Arc::new(MemoryLimiter::new(clock.clone())),
            Arc::new(BuiltinDefaults),
            clock,
        )
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &PluginHostConfig {
        &self.inner.deps.config
    }

    /// The folder given to [`PluginHost::load_dir`], if any.
    pub fn dir(&self) -> Option<PathBuf> {
        self.inner.dir.lock().clone()
    }

    /// Every plugin file's status, by name.
    pub fn status(&self) -> Vec<PluginStatus> {
        let registry = self.inner.registry.load();
        let shadow_of = |name: &str| -> Option<ShadowStatus> {
            if let Some(shadow) = registry.shadows.get(name) {
                return Some(shadow.status());
            }
            match registry.slots.get(&format!("{name}{SHADOW}")) {
                Some(Slot::Failed { error, .. }) => Some(ShadowStatus::failed(error.clone())),
                _ => None,
            }
        };
        registry
            .slots
            .iter()
            // A shadow shows under the plugin it shadows.
            .filter(|(name, _)| name.strip_suffix(SHADOW).is_none_or(|base| !registry.slots.contains_key(base)))
            .map(|(name, slot)| match slot {
                Slot::Loaded(p) => {
                    let state = if !p.settings.enabled {
                        PluginState::Disabled
                    } else if let Some(left) = p.stats.quarantine_left() {
                        PluginState::Quarantined { remaining_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX) }
                    } else {
                        PluginState::Active
                    };
                    PluginStatus {
                        name: name.clone(),
                        file: p.file.clone(),
                        version: Some(p.settings.version.clone()),
                        content_hash: Some(p.content_hash.clone()),
                        contract: Some(p.contract.version().to_owned()),
                        hooks: p.hooks.clone(),
                        order: Some(p.settings.order),
                        calls: p.stats.calls(),
                        failures: p.stats.failures.load(Relaxed),
                        timeouts: p.stats.timeouts.load(Relaxed),
                        quarantines: p.stats.quarantines.load(Relaxed),
                        p99_call_us: p.stats.quantile(0.99).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
                        state,
                        last_error: p.stats.last_error.lock().clone(),
                        last_load_error: p.last_load_error.lock().clone(),
                        recording: p.recorder.load().as_ref().map(|r| r.status()),
                        shadow: shadow_of(name),
                        canary: p.canary.lock().clone(),
                    }
                }
                Slot::Failed { file, error } => PluginStatus {
                    name: name.clone(),
                    file: file.clone(),
                    version: None,
                    content_hash: None,
                    contract: None,
                    hooks: Vec::new(),
                    order: None,
                    calls: 0,
                    failures: 0,
                    timeouts: 0,
                    quarantines: 0,
                    p99_call_us: None,
                    state: PluginState::Failed,
                    last_error: None,
                    last_load_error: Some(error.clone()),
                    recording: None,
                    shadow: shadow_of(name),
                    canary: None,
                },
            })
            .collect()
    }

    /// The status of plugin `name`.
    pub fn plugin_status(&self, name: &str) -> Option<PluginStatus> {
        self.status().into_iter().find(|s| s.name == name)
    }

    /// Whether any loaded plugin implements `hook` (lets callers skip building its input).
    pub fn has_hook(&self, hook: Hook) -> bool {
        !self.inner.registry.load().chains[hook.index()].is_empty()
    }

    /// Components compiled since the host started. A reload whose component bytes did not
    /// change (only its manifest did) reuses the compiled code and adds nothing here.
    pub fn compilations(&self) -> u64 {
        self.inner.runtime.compilations.load(Relaxed)
    }

    /// Of the functions the compiles since the host started looked up in the compile cache
    /// (`compile_cache_mib`), those found there and those compiled; `(0, 0)` without one.
    pub fn compile_cache(&self) -> (u64, u64) {
        self.inner.runtime.compiled.as_ref().map_or((0, 0), |compiled| compiled.counts())
    }

    /// Names of the plugins serving `hook`, in chain order.
    pub fn chain(&self, hook: Hook) -> Vec<String> {
        self.inner.registry.load().chains[hook.index()].iter().map(|p| p.name.to_string()).collect()
    }

    /// Drops the idle instances of plugin `name`, so its next call instantiates afresh.
    /// For benchmarks and tests of the cold path; returns whether the plugin is loaded.
    pub fn drain_pool(&self, name: &str) -> bool {
        match self.inner.registry.load().slots.get(name) {
            Some(Slot::Loaded(p)) => {
                p.drain_pool();
                true
            }
            _ => false,
        }
    }

    /// Starts recording plugin `name`'s calls to `file` (a new file; its folder is created),
    /// within `options`' bounds. The recording ends at a bound, at
    /// [`stop_recording`](Self::stop_recording), or when the plugin is reloaded.
    ///
    /// # Errors
    /// [`RecordingError`]: no such plugin, one running already, bad options, or the file
    /// cannot be created (it exists, or the folder is not writable).
    pub fn start_recording(
        &self,
        name: &str,
        file: PathBuf,
        options: RecordingOptions,
    ) -> Result<RecordingStatus, RecordingError> {
        options.validate().map_err(RecordingError::BadOptions)?;
        let registry = self.inner.registry.load();
        let Some(Slot::Loaded(plugin)) = registry.slots.get(name) else {
            return Err(RecordingError::NotLoaded(name.to_owned()));
        };
        if let Some(running) = plugin.recorder.load().as_ref().filter(|r| r.status().active) {
            return Err(RecordingError::AlreadyRecording { name: name.to_owned(), file: running.status().file });
        }
        let header = Header {
            recording: crate::recording::FORMAT_VERSION,
            plugin: name.to_owned(),
            version: plugin.settings.version.clone(),
            contract: plugin.contract.version().to_owned(),
            content_hash: plugin.content_hash.clone(),
            started_ms: self.inner.deps.clock.now_ms(),
            every: options.every,
            redacted_bodies: options.redact_bodies,
        };
        let recorder =
            Recorder::start(file.clone(), &header, options).map_err(|source| RecordingError::Io { file, source })?;
        let status = recorder.status();
        plugin.recorder.store(Some(recorder));
        tracing::info!(plugin = %name, file = %status.file.display(), "plugin recording started");
        Ok(status)
    }

    /// Stops plugin `name`'s recording; its final status, or `None` when none was running.
    pub fn stop_recording(&self, name: &str) -> Option<RecordingStatus> {
        let registry = self.inner.registry.load();
        let Some(Slot::Loaded(plugin)) = registry.slots.get(name) else { return None };
        let recorder = plugin.recorder.load_full()?;
        if !recorder.status().active {
            return None;
        }
        recorder.stop("stopped by request".to_owned());
        Some(recorder.status())
    }

    /// Idle instances of plugin `name` (0 when not loaded).
    pub fn idle_instances(&self, name: &str) -> usize {
        match self.inner.registry.load().slots.get(name) {
            Some(Slot::Loaded(p)) => p.idle_instances(),
            _ => 0,
        }
    }
}
