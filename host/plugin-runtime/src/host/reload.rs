//! Loading and reloading: the plugins folder read again (or one file of it), each changed
//! file loaded off the paths that serve messages, and the new registry swapped in; a version
//! that fails to load leaves the previous one serving, its error recorded.

use super::{PluginHost, Registry, Slot};
use crate::{
    error::PluginError,
    plugin::{PREVIOUS, Plugin, REJECTED, Source},
    status::PluginStatus,
};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

fn is_wasm(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm") && !is_kept(path)
}

/// A version kept beside the plugins for a rollback (`NAME.previous.*`) or after one
/// (`NAME.rejected.*`): never loaded.
pub(crate) fn is_kept(path: &Path) -> bool {
    path.file_stem().and_then(|s| s.to_str()).is_some_and(|stem| stem.ends_with(PREVIOUS) || stem.ends_with(REJECTED))
}

impl PluginHost {
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
        let files = tokio::task::spawn_blocking(move || read_dir(dir)).await.map_err(PluginError::Task)??;
        let _guard = self.inner.reload_lock.lock().await;
        let current = self.inner.registry.load_full();
        let mut slots = BTreeMap::new();
        let mut overridden = Vec::new();
        for file in files {
            let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
            if self.is_managed(&stem) {
                // The registry deploys this plugin: its version wins over the folder's.
                overridden.push(stem);
                continue;
            }
            let (name, slot, _error) = self.load_slot(&current, file).await;
            slots.insert(name, slot);
        }
        for (stem, slot) in &current.slots {
            if self.is_managed(stem) {
                slots.insert(stem.clone(), slot.clone());
            }
        }
        if !overridden.is_empty() {
            tracing::warn!(files = ?overridden, "plugin files passed over: the plugin registry deploys these plugins");
        }
        *self.inner.overridden.lock() = overridden;
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
        if self.is_managed(&name) {
            return Ok(()); // the registry deploys this plugin: the folder's file waits
        }
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
    pub(super) fn swap(&self, slots: BTreeMap<String, Slot>) {
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
}
