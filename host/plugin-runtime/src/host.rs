//! [`PluginHost`]: the set of loaded plugins, swapped atomically on reload.
//!
//! The registry (every plugin file and, per hook, the ordered chain of plugins) lives in an
//! `ArcSwap`. A call takes a snapshot and runs on it, so a reload never disturbs calls in
//! flight: they finish on the version they started with. Reloads are serialized; a version
//! that fails to load leaves the previous one serving and records the error in its status.

use crate::{
    clock::{Clock, SystemClock},
    config::{Hook, PluginHostConfig},
    engine::Runtime,
    error::PluginError,
    fallback::{BuiltinDefaults, Fallback},
    kv::{MemoryKv, PluginKv},
    limiter::{MemoryLimiter, RateLimiter},
    plugin::{Deps, Plugin, Source},
    status::{PluginState, PluginStatus},
};
use arc_swap::ArcSwap;
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, atomic::Ordering::Relaxed},
};

/// A plugin file's entry in the registry.
#[derive(Clone)]
pub(crate) enum Slot {
    /// A version serves (possibly with a newer version's load error recorded on it).
    Loaded(Arc<Plugin>),
    /// No version ever loaded from this file.
    Failed { file: PathBuf, error: String },
}

/// An immutable snapshot of the loaded plugins.
#[derive(Default)]
pub(crate) struct Registry {
    pub slots: BTreeMap<String, Slot>,
    /// Per hook, the enabled plugins exporting it, in (order, name) order.
    pub chains: [Vec<Arc<Plugin>>; 5],
}

impl Registry {
    fn build(slots: BTreeMap<String, Slot>) -> Self {
        let mut chains: [Vec<Arc<Plugin>>; 5] = Default::default();
        for slot in slots.values() {
            if let Slot::Loaded(p) = slot {
                if !p.settings.enabled {
                    continue;
                }
                for hook in &p.hooks {
                    chains[hook.index()].push(p.clone());
                }
            }
        }
        for chain in &mut chains {
            chain.sort_by(|a, b| (a.settings.order, &a.name).cmp(&(b.settings.order, &b.name)));
        }
        Self { slots, chains }
    }
}

pub(crate) struct Inner {
    pub runtime: Arc<Runtime>,
    pub deps: Deps,
    pub fallback: Arc<dyn Fallback>,
    pub registry: ArcSwap<Registry>,
    reload_lock: tokio::sync::Mutex<()>,
    dir: parking_lot::Mutex<Option<PathBuf>>,
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

fn is_wasm(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm")
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

    /// Loads every `NAME.wasm` in `dir` (with its `NAME.toml` manifest) and makes `dir` the
    /// folder that [`reload`](Self::reload) and [`watch`](Self::watch) use. A plugin that
    /// fails to load does not stop the others: its error shows in the returned status.
    ///
    /// # Errors
    /// [`PluginError::Io`] when the folder cannot be read.
    pub async fn load_dir(&self, dir: impl AsRef<Path>) -> Result<Vec<PluginStatus>, PluginError> {
        *self.inner.dir.lock() = Some(dir.as_ref().to_path_buf());
        self.reload().await
    }

    /// Re-reads the plugins folder: new and changed files load (off the hot path), removed
    /// ones unload, unchanged ones keep serving untouched.
    ///
    /// # Errors
    /// [`PluginError::NoDirectory`] before `load_dir`; [`PluginError::Io`] when the folder
    /// cannot be read. Per-plugin load errors are in the returned status instead.
    pub async fn reload(&self) -> Result<Vec<PluginStatus>, PluginError> {
        let dir = self.dir().ok_or(PluginError::NoDirectory)?;
        let read_dir = |dir: PathBuf| -> Result<Vec<PathBuf>, PluginError> {
            let entries = std::fs::read_dir(&dir).map_err(|source| PluginError::Io { path: dir.clone(), source })?;
            let mut files: Vec<PathBuf> =
                entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| is_wasm(p)).collect();
            files.sort();
            Ok(files)
        };
        let files = tokio::task::spawn_blocking(move || read_dir(dir))
            .await
            .map_err(|e| PluginError::Task(e.to_string()))??;
        let _guard = self.inner.reload_lock.lock().await;
        let current = self.inner.registry.load_full();
        let mut slots = BTreeMap::new();
        for file in files {
            let (name, slot, _error) = self.load_slot(&current, file).await;
            slots.insert(name, slot);
        }
        self.inner.registry.store(Arc::new(Registry::build(slots)));
        Ok(self.status())
    }

    /// Reloads one plugin: `path` is its `.wasm` or its `.toml` manifest. A missing `.wasm`
    /// unloads the plugin.
    ///
    /// # Errors
    /// The load error when the new version was refused (the old version, if any, keeps
    /// serving, and the error shows in its status); [`PluginError::NotAPluginFile`] for
    /// other files.
    pub async fn reload_file(&self, path: impl AsRef<Path>) -> Result<(), PluginError> {
        let path = path.as_ref();
        let wasm = match path.extension().and_then(|e| e.to_str()) {
            Some("wasm") => path.to_path_buf(),
            Some("toml") => path.with_extension("wasm"),
            _ => return Err(PluginError::NotAPluginFile(path.to_path_buf())),
        };
        let name = wasm
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| PluginError::NotAPluginFile(path.to_path_buf()))?
            .to_owned();
        let _guard = self.inner.reload_lock.lock().await;
        let current = self.inner.registry.load_full();
        let mut slots = current.slots.clone();
        let exists = {
            let wasm = wasm.clone();
            tokio::task::spawn_blocking(move || wasm.exists()).await.unwrap_or(false)
        };
        let outcome = if exists {
            let (name, slot, error) = self.load_slot(&current, wasm).await;
            slots.insert(name, slot);
            error
        } else {
            slots.remove(&name);
            None
        };
        self.inner.registry.store(Arc::new(Registry::build(slots)));
        outcome.map_or(Ok(()), Err)
    }

    /// Loads `file` unless the serving version has the same bytes and manifest.
    /// Returns the plugin's name, its new slot and, when the file was refused, why.
    async fn load_slot(&self, current: &Registry, file: PathBuf) -> (String, Slot, Option<PluginError>) {
        let read = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || Source::read(file)).await
        };
        let source = match read {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Self::keep_old(current, &file, e),
            Err(e) => return Self::keep_old(current, &file, PluginError::Task(e.to_string())),
        };
        let name = source.name.clone();
        if let Some(Slot::Loaded(old)) = current.slots.get(&name)
            && old.fingerprint == source.fingerprint()
        {
            *old.last_load_error.lock() = None;
            return (name, Slot::Loaded(old.clone()), None);
        }
        match Plugin::load(&self.inner.runtime, source, &self.inner.deps).await {
            Ok(plugin) => {
                tracing::info!(plugin = %name, version = %plugin.settings.version, hooks = ?plugin.hooks, "plugin loaded");
                (name, Slot::Loaded(plugin), None)
            }
            Err(e) => Self::keep_old(current, &file, e),
        }
    }

    fn keep_old(current: &Registry, file: &Path, error: PluginError) -> (String, Slot, Option<PluginError>) {
        let name = file.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        let message = error.to_string();
        tracing::error!(plugin = %name, file = %file.display(), "plugin load failed: {message}");
        let slot = match current.slots.get(&name) {
            Some(Slot::Loaded(old)) => {
                *old.last_load_error.lock() = Some(message);
                Slot::Loaded(old.clone())
            }
            _ => Slot::Failed { file: file.to_path_buf(), error: message },
        };
        (name, slot, Some(error))
    }

    /// Every plugin file's status, by name.
    pub fn status(&self) -> Vec<PluginStatus> {
        let registry = self.inner.registry.load();
        registry
            .slots
            .iter()
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
                    }
                }
                Slot::Failed { file, error } => PluginStatus {
                    name: name.clone(),
                    file: file.clone(),
                    version: None,
                    content_hash: None,
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

    /// Idle instances of plugin `name` (0 when not loaded).
    pub fn idle_instances(&self, name: &str) -> usize {
        match self.inner.registry.load().slots.get(name) {
            Some(Slot::Loaded(p)) => p.idle_instances(),
            _ => 0,
        }
    }
}
