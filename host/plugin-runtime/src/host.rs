//! [`PluginHost`]: the set of loaded plugins, swapped atomically on reload.
//!
//! The registry (every plugin file and, per hook, the ordered chain of plugins) lives in an
//! `ArcSwap`. A call takes a snapshot and runs on it, so a reload never disturbs calls in
//! flight: they finish on the version they started with. Reloads are serialized; a version
//! that fails to load leaves the previous one serving and records the error in its status.

use crate::{
    clock::{Clock, SystemClock},
    config::{Hook, PluginHostConfig, ShadowPolicy},
    engine::Runtime,
    error::PluginError,
    fallback::{BuiltinDefaults, Fallback},
    kv::{MemoryKv, PluginKv},
    limiter::{MemoryLimiter, RateLimiter},
    plugin::{Deps, Plugin, Source},
    recording::{Header, Recorder, RecordingError, RecordingOptions, RecordingStatus},
    shadow::{CanaryState, CanaryStatus, PREVIOUS, PromoteError, REJECTED, SHADOW, Shadow, ShadowStatus, judge},
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
    /// By file stem: `NAME` for an active plugin, `NAME.shadow` for a shadow.
    pub slots: BTreeMap<String, Slot>,
    /// Per hook, the enabled active plugins exporting it, in (order, name) order.
    pub chains: [Vec<Arc<Plugin>>; 6],
    /// The loaded shadows, by the name of the plugin they shadow.
    pub shadows: BTreeMap<String, Arc<Shadow>>,
}

impl Registry {
    /// `previous` keeps its shadows' comparisons when their versions are unchanged.
    fn build(slots: BTreeMap<String, Slot>, previous: &Registry, policy: ShadowPolicy) -> Self {
        let mut chains: [Vec<Arc<Plugin>>; 6] = Default::default();
        let mut shadows = BTreeMap::new();
        for (stem, slot) in &slots {
            if let Slot::Loaded(p) = slot {
                if let Some(base) = stem.strip_suffix(SHADOW) {
                    let shadow = match previous.shadows.get(base) {
                        Some(kept) if Arc::ptr_eq(&kept.plugin, p) => Arc::clone(kept),
                        _ => Shadow::new(Arc::clone(p), policy),
                    };
                    shadows.insert(base.to_owned(), shadow);
                    continue;
                }
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
        Self { slots, chains, shadows }
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
    path.extension().is_some_and(|e| e == "wasm") && !is_kept(path)
}

/// Moves `from.wasm`/`from.toml` to `to.*` for each pair, in order, in `dir`: a `to` file
/// in the way is replaced, a `from` file that does not exist is skipped (a plugin need not
/// have a manifest) after removing a stale `to` manifest, so a version never picks up
/// another version's manifest.
async fn move_files(dir: &Path, moves: &[(String, String)]) -> Result<(), PromoteError> {
    let (dir, moves) = (dir.to_path_buf(), moves.to_vec());
    tokio::task::spawn_blocking(move || move_files_now(&dir, &moves))
        .await
        .map_err(|e| PromoteError::Load(PluginError::Task(e.to_string())))?
}

fn move_files_now(dir: &Path, moves: &[(String, String)]) -> Result<(), PromoteError> {
    for (from, to) in moves {
        for ext in ["wasm", "toml"] {
            let (source, target) = (dir.join(format!("{from}.{ext}")), dir.join(format!("{to}.{ext}")));
            match std::fs::rename(&source, &target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::remove_file(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(PromoteError::Io { file: target, source }),
                },
                Err(e) => return Err(PromoteError::Io { file: source, source: e }),
            }
        }
    }
    Ok(())
}

/// A version kept beside the plugins for a rollback (`NAME.previous.*`) or after one
/// (`NAME.rejected.*`): never loaded.
pub(crate) fn is_kept(path: &Path) -> bool {
    path.file_stem().and_then(|s| s.to_str()).is_some_and(|stem| stem.ends_with(PREVIOUS) || stem.ends_with(REJECTED))
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
        self.swap(slots);
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
        if is_kept(&wasm) {
            return Ok(()); // a version kept for a rollback, or a rejected one: never loaded
        }
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
        self.swap(slots);
        outcome.map_or(Ok(()), Err)
    }

    /// Makes `slots` the registry. The idle instances of versions no longer serving are
    /// freed on a blocking thread rather than by whichever call lets go of them last, on a
    /// path that serves messages (calls still running on them finish as before).
    fn swap(&self, slots: BTreeMap<String, Slot>) {
        let current = self.inner.registry.load_full();
        let next = Registry::build(slots, &current, self.inner.deps.config.shadow);
        drop(current);
        let old = self.inner.registry.swap(Arc::new(next));
        let new = self.inner.registry.load();
        let retired: Vec<Arc<Plugin>> = old
            .slots
            .iter()
            .filter_map(|(name, slot)| match (slot, new.slots.get(name)) {
                (Slot::Loaded(old), Some(Slot::Loaded(new))) if Arc::ptr_eq(old, new) => None,
                (Slot::Loaded(old), _) => Some(Arc::clone(old)),
                _ => None,
            })
            .collect();
        if !retired.is_empty() {
            tokio::task::spawn_blocking(move || retired.iter().for_each(|plugin| plugin.drain_pool()));
        }
    }

    /// Loads `file` unless the serving version has the same bytes and manifest.
    /// Returns the plugin's name, its new slot and, when the file was refused, why.
    async fn load_slot(&self, current: &Registry, file: PathBuf) -> (String, Slot, Option<PluginError>) {
        let started = std::time::Instant::now();
        // The serving version read from this same file: unless the file changed since, its
        // bytes need not be read and hashed again (a manifest change reads the manifest).
        let known = match current.slots.get(file.file_stem().and_then(|s| s.to_str()).unwrap_or_default()) {
            Some(Slot::Loaded(old)) if old.file == file => old.stamp.as_ref().map(|s| (s, old.content_hash.as_str())),
            _ => None,
        };
        let source = match Source::read_known_off_thread(file.clone(), known).await {
            Ok(s) => s,
            Err(e) => return Self::keep_old(current, &file, e),
        };
        let name = source.name.clone();
        if let Some(Slot::Loaded(old)) = current.slots.get(&name)
            && old.fingerprint == source.fingerprint
        {
            *old.last_load_error.lock() = None;
            return (name, Slot::Loaded(old.clone()), None);
        }
        let previous = match current.slots.get(&name) {
            Some(Slot::Loaded(old)) => Some(old.as_ref()),
            _ => None,
        };
        match Plugin::load(&self.inner.runtime, source, &self.inner.deps, previous, &[]).await {
            Ok(plugin) => {
                tracing::info!(
                    plugin = %name,
                    version = %plugin.settings.version,
                    hooks = ?plugin.hooks,
                    instances = plugin.idle_instances(),
                    took_us = started.elapsed().as_micros(),
                    "plugin loaded"
                );
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

    /// Makes plugin `name`'s shadow its active version: the shadow's files become
    /// `NAME.wasm`/`NAME.toml` (the active ones are kept as `NAME.previous.*`), the new
    /// version serves at once (the shadow's compiled code reused, its pool warmed first),
    /// and for `canary.window_ms` it is watched: a failure ratio or p99 past the canary
    /// bounds rolls it back to the previous version by itself (see [`CanaryPolicy`]).
    ///
    /// # Errors
    /// [`PromoteError`]: no shadow loaded, no plugins folder, files that cannot be moved
    /// (nothing changed then), or the version failing to load as the active one (the files
    /// are moved back and the previous version keeps serving).
    ///
    /// [`CanaryPolicy`]: crate::CanaryPolicy
    pub async fn promote(&self, name: &str) -> Result<PluginStatus, PromoteError> {
        let dir = self.dir().ok_or(PromoteError::NoDirectory)?;
        let _guard = self.inner.reload_lock.lock().await;
        let current = self.inner.registry.load_full();
        let shadow = current.shadows.get(name).cloned().ok_or_else(|| PromoteError::NoShadow(name.to_owned()))?;
        let previous = match current.slots.get(name) {
            Some(Slot::Loaded(p)) => Some(Arc::clone(p)),
            _ => None,
        };
        let moves = [(name.to_owned(), format!("{name}{PREVIOUS}")), (format!("{name}{SHADOW}"), name.to_owned())];
        move_files(&dir, &moves).await?;
        let loaded = async {
            let source = Source::read_off_thread(dir.join(format!("{name}.wasm"))).await?;
            Plugin::load(&self.inner.runtime, source, &self.inner.deps, previous.as_deref(), &[&shadow.plugin]).await
        };
        let promoted = match loaded.await {
            Ok(plugin) => plugin,
            Err(error) => {
                let back =
                    [(name.to_owned(), format!("{name}{SHADOW}")), (format!("{name}{PREVIOUS}"), name.to_owned())];
                if let Err(undo) = move_files(&dir, &back).await {
                    tracing::error!(plugin = %name, %undo, "moving the files back after a failed promotion failed");
                }
                return Err(error.into());
            }
        };
        let window_ms = self.inner.deps.config.canary.window_ms;
        *promoted.canary.lock() = Some(CanaryStatus {
            state: if previous.is_some() { CanaryState::Watching } else { CanaryState::Passed },
            promoted_version: promoted.settings.version.clone(),
            previous_version: previous.as_ref().map_or_else(String::new, |p| p.settings.version.clone()),
            promoted_ms: self.inner.deps.clock.now_ms(),
            window_ms,
            why: None,
        });
        let mut slots = current.slots.clone();
        slots.insert(name.to_owned(), Slot::Loaded(Arc::clone(&promoted)));
        slots.remove(&format!("{name}{SHADOW}"));
        drop(current);
        self.swap(slots);
        tracing::info!(plugin = %name, version = %promoted.settings.version, "shadow promoted; watching it for {window_ms} ms");
        if let Some(previous) = previous {
            tokio::spawn(self.clone().watch_canary(name.to_owned(), promoted, previous));
        }
        self.plugin_status(name).ok_or_else(|| PromoteError::NoShadow(name.to_owned()))
    }

    /// Watches a promoted version for the canary window; rolls it back past a bound.
    async fn watch_canary(self, name: String, promoted: Arc<Plugin>, previous: Arc<Plugin>) {
        let policy = self.inner.deps.config.canary;
        let end = tokio::time::Instant::now() + std::time::Duration::from_millis(policy.window_ms);
        let mut every = tokio::time::interval(std::time::Duration::from_millis(250));
        loop {
            every.tick().await;
            let serving = matches!(self.inner.registry.load().slots.get(&name), Some(Slot::Loaded(p)) if Arc::ptr_eq(p, &promoted));
            if !serving {
                return; // replaced by a reload meanwhile: nothing to watch
            }
            if let Some(why) = judge(&policy, &promoted, &previous) {
                self.roll_back(&name, &promoted, previous, why).await;
                return;
            }
            if tokio::time::Instant::now() >= end {
                if let Some(canary) = promoted.canary.lock().as_mut() {
                    canary.state = CanaryState::Passed;
                }
                tracing::info!(plugin = %name, version = %promoted.settings.version, "promoted plugin passed its canary window");
                return;
            }
        }
    }

    /// Puts `previous` back in `promoted`'s place (files too: the rejected ones are kept as
    /// `NAME.rejected.*`), unless `promoted` no longer serves.
    async fn roll_back(&self, name: &str, promoted: &Arc<Plugin>, previous: Arc<Plugin>, why: String) {
        let _guard = self.inner.reload_lock.lock().await;
        let current = self.inner.registry.load_full();
        if !matches!(current.slots.get(name), Some(Slot::Loaded(p)) if Arc::ptr_eq(p, promoted)) {
            return;
        }
        tracing::error!(
            plugin = %name,
            version = %promoted.settings.version,
            previous = %previous.settings.version,
            "promoted plugin version rolled back: {why}"
        );
        if let Some(dir) = self.dir() {
            let moves =
                [(name.to_owned(), format!("{name}{REJECTED}")), (format!("{name}{PREVIOUS}"), name.to_owned())];
            if let Err(error) = move_files(&dir, &moves).await {
                tracing::error!(plugin = %name, %error, "moving the files back failed; the previous version serves from memory");
            }
        }
        if let Err(error) = previous.warm(promoted.idle_instances()).await {
            tracing::warn!(plugin = %name, %error, "warming the previous version failed; its calls instantiate");
        }
        let status = promoted.canary.lock().as_ref().map(|canary| CanaryStatus {
            state: CanaryState::RolledBack,
            why: Some(why.clone()),
            ..canary.clone()
        });
        *promoted.canary.lock() = status.clone();
        *previous.canary.lock() = status;
        let mut slots = current.slots.clone();
        slots.insert(name.to_owned(), Slot::Loaded(previous));
        drop(current);
        self.swap(slots);
    }

    /// Removes plugin `name`'s shadow (its files too); false when it had none.
    ///
    /// # Errors
    /// The files could not be removed.
    pub async fn discard_shadow(&self, name: &str) -> Result<bool, PromoteError> {
        let dir = self.dir().ok_or(PromoteError::NoDirectory)?;
        let _guard = self.inner.reload_lock.lock().await;
        let current = self.inner.registry.load_full();
        let stem = format!("{name}{SHADOW}");
        if !current.slots.contains_key(&stem) {
            return Ok(false);
        }
        let files = ["wasm", "toml"].map(|ext| dir.join(format!("{stem}.{ext}")));
        tokio::task::spawn_blocking(move || {
            for file in files {
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(PromoteError::Io { file, source }),
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| PromoteError::Load(PluginError::Task(e.to_string())))??;
        let mut slots = current.slots.clone();
        slots.remove(&stem);
        drop(current);
        self.swap(slots);
        Ok(true)
    }

    /// Idle instances of plugin `name` (0 when not loaded).
    pub fn idle_instances(&self, name: &str) -> usize {
        match self.inner.registry.load().slots.get(name) {
            Some(Slot::Loaded(p)) => p.idle_instances(),
            _ => 0,
        }
    }
}
