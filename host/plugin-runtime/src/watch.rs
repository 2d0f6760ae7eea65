//! Hot reload from the plugins folder: a debounced watcher turns changes to `NAME.wasm` or
//! `NAME.toml` into [`PluginHost::reload_file`] calls on a tokio task, so compiling never
//! runs on the watcher's thread or on a call's path.

use crate::{error::PluginError, host::PluginHost};
use notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use std::{collections::BTreeSet, path::PathBuf, time::Duration};
use tokio::sync::mpsc;

/// Watches the plugins folder while alive; drop it to stop.
pub struct PluginWatcher {
    _debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for PluginWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PluginWatcher")
    }
}

impl Drop for PluginWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_plugin_file(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm" || e == "toml")
}

impl PluginHost {
    /// Starts hot reload of the folder given to [`load_dir`](Self::load_dir): changed files
    /// reload (debounced by `watch_debounce_ms`), deleted ones unload. Must be called
    /// inside a tokio runtime.
    ///
    /// # Errors
    /// [`PluginError::NoDirectory`] before `load_dir`; [`PluginError::Watch`] when the OS
    /// watcher cannot start.
    pub fn watch(&self) -> Result<PluginWatcher, PluginError> {
        let dir = self.dir().ok_or(PluginError::NoDirectory)?;
        let (tx, mut rx) = mpsc::unbounded_channel::<BTreeSet<PathBuf>>();
        let watch_err = |source: notify::Error| PluginError::Watch { path: dir.clone(), source };
        let debounce = Duration::from_millis(self.config().watch_debounce_ms.max(10));
        // The debouncer's thread wakes every tick whether or not anything changed, and its
        // default tick (a quarter of the debounce: 20 wake-ups a second at 200 ms) is paid
        // by every idle node. Half the debounce halves that and keeps a change's reload
        // within 1.5 × the debounce.
        let tick = Some(debounce / 2);
        let mut debouncer = new_debouncer(debounce, tick, move |result: DebounceEventResult| match result {
            Ok(events) => {
                let files: BTreeSet<PathBuf> = events
                    .iter()
                    .flat_map(|e| e.paths.iter())
                    .filter(|p| is_plugin_file(p))
                    .map(|p| p.with_extension("wasm"))
                    .collect();
                if !files.is_empty() {
                    let _ = tx.send(files);
                }
            }
            Err(errors) => {
                for e in errors {
                    tracing::warn!("plugin folder watcher: {e}");
                }
            }
        })
        .map_err(watch_err)?;
        debouncer.watch(&dir, RecursiveMode::NonRecursive).map_err(watch_err)?;
        let host = self.clone();
        let task = tokio::spawn(async move {
            while let Some(files) = rx.recv().await {
                for file in files {
                    // Errors are logged and shown in status by reload_file itself.
                    let _ = host.reload_file(&file).await;
                }
            }
        });
        Ok(PluginWatcher { _debouncer: debouncer, task })
    }
}
