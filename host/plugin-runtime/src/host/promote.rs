//! Promotion of a shadow, the canary watch that follows it, the rollback a failed canary
//! gets, and discarding a shadow: each moves the plugin's files, then swaps the registry.

use super::{PluginHost, Slot};
use crate::{
    canary::{CanaryState, CanaryStatus, PromoteError, judge},
    error::PluginError,
    plugin::{PREVIOUS, Plugin, REJECTED, SHADOW, Source},
    status::PluginStatus,
};
use std::{path::Path, sync::Arc};

/// Moves `from.wasm`/`from.toml` to `to.*` for each pair, in order, in `dir`: a `to` file
/// in the way is replaced, a `from` file that does not exist is skipped (a plugin need not
/// have a manifest) after removing a stale `to` manifest, so a version never picks up
/// another version's manifest.
async fn move_files(dir: &Path, moves: &[(String, String)]) -> Result<(), PromoteError> {
    let (dir, moves) = (dir.to_path_buf(), moves.to_vec());
    tokio::task::spawn_blocking(move || move_files_now(&dir, &moves))
        .await
        .map_err(|e| PromoteError::Load(PluginError::Task(e)))?
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

impl PluginHost {
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
            if let Some(why) = judge(&policy, &promoted.stats, &previous.stats) {
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
        .map_err(|e| PromoteError::Load(PluginError::Task(e)))??;
        let mut slots = current.slots.clone();
        slots.remove(&stem);
        drop(current);
        self.swap(slots);
        Ok(true)
    }
}
