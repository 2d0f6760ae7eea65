//! Versions handed in by the plugin registry (the database, followed by the node) rather
//! than read from the plugins folder, in two steps so that a cluster can switch together:
//! [`PluginHost::prepare`] compiles a version and warms it — instances in its pool and the
//! sample call `herald plugin check` makes, run with this node's settings — without
//! serving it; [`PluginHost::install`] swaps prepared versions in at once.
//!
//! A plugin installed this way is *managed*: from then on the folder's files of that name
//! (`NAME.wasm`, `NAME.shadow.wasm`) are passed over, and a reload of the folder keeps the
//! registry's versions. The registry wins because it is what every node of a cluster
//! agrees on; the folder is for development.

use super::{PluginHost, Slot};
use crate::{
    config::Hook,
    error::PluginError,
    kv::MemoryKv,
    limiter::MemoryLimiter,
    plugin::{Deps, Plugin, SHADOW, Source},
    samples::run_samples,
};
use std::collections::{BTreeMap, BTreeSet, btree_map::Entry};
use std::sync::Arc;

/// The calls of some hooks held on this node while it lives ([`PluginHost::hold`]).
#[derive(Default)]
pub struct Hold {
    gates: BTreeMap<Hook, tokio::sync::OwnedRwLockWriteGuard<()>>,
}

impl Hold {
    /// The hooks whose calls are held.
    pub fn hooks(&self) -> impl Iterator<Item = Hook> + '_ {
        self.gates.keys().copied()
    }

    /// Lets the calls of every hook but `kept` go on.
    pub fn keep_only(&mut self, kept: &BTreeSet<Hook>) {
        self.gates.retain(|hook, _| kept.contains(hook));
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Hold").field(&self.gates.keys().collect::<Vec<_>>()).finish()
    }
}

/// A version compiled and warmed on this node, not serving yet.
#[derive(Clone)]
pub struct Prepared {
    plugin: Arc<Plugin>,
}

impl Prepared {
    /// The hooks this version takes part in.
    pub fn hooks(&self) -> &[Hook] {
        &self.plugin.hooks
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("name", &self.plugin.name).field("hash", &self.plugin.content_hash).finish()
    }
}

impl Prepared {
    /// `sha256:<hex>` of its component.
    pub fn content_hash(&self) -> &str {
        &self.plugin.content_hash
    }

    /// The version its manifest names.
    pub fn version(&self) -> &str {
        &self.plugin.settings.version
    }
}

impl PluginHost {
    /// Compiles `wasm` (with its manifest text, none when empty) as plugin `name`'s active
    /// version, or its shadow with `shadow`, and warms it: its pool filled to the size of
    /// the version it would replace, and each of its hooks called once on sample input with
    /// this node's settings for the plugin (on a throwaway KV and limiter, so the call
    /// leaves nothing behind). Nothing serves it until [`install`](Self::install).
    ///
    /// Compiled code is reused from any loaded version with the same bytes (a shadow being
    /// promoted compiles nothing).
    ///
    /// # Errors
    /// The load error (not a component, a contract this host does not serve, a manifest
    /// that does not fit, a trap while instantiating), or [`PluginError::Warm`] when a
    /// sample call failed.
    pub async fn prepare(
        &self,
        name: &str,
        shadow: bool,
        wasm: Vec<u8>,
        manifest: &str,
    ) -> Result<Prepared, PluginError> {
        let stem = if shadow { format!("{name}{SHADOW}") } else { name.to_owned() };
        let current = self.inner.registry.load_full();
        let loaded: Vec<Arc<Plugin>> = current
            .slots
            .values()
            .filter_map(|slot| match slot {
                Slot::Loaded(plugin) => Some(Arc::clone(plugin)),
                Slot::Failed { .. } => None,
            })
            .collect();
        let previous = match current.slots.get(&stem) {
            Some(Slot::Loaded(plugin)) => Some(Arc::clone(plugin)),
            _ => None,
        };
        drop(current);
        let compiled: Vec<&Plugin> = loaded.iter().map(AsRef::as_ref).collect();
        let source = Source::from_bytes(&stem, wasm.clone(), manifest);
        let plugin =
            Plugin::load(&self.inner.runtime, source, &self.inner.deps, previous.as_deref(), &compiled).await?;
        let deps = &self.inner.deps;
        let probe_deps = Deps {
            config: deps.config.clone(),
            kv: Arc::new(MemoryKv::new(Arc::clone(&deps.clock))),
            limiter: Arc::new(MemoryLimiter::new(Arc::clone(&deps.clock))),
            clock: Arc::clone(&deps.clock),
        };
        let probe = Plugin::load(
            &self.inner.runtime,
            Source::from_bytes(&stem, wasm, manifest),
            &probe_deps,
            None,
            &[plugin.as_ref()],
        )
        .await?;
        for sample in run_samples(&probe).await {
            if let Err(message) = sample.outcome {
                return Err(PluginError::Warm { name: stem, hook: sample.hook.to_string(), message });
            }
        }
        Ok(Prepared { plugin })
    }

    /// Makes `active` plugin `name`'s version and `shadow` its shadow (`None`: it has
    /// none), at once, and marks `name` as managed by the registry. Calls in flight finish
    /// on the versions they started with.
    pub async fn install(&self, name: &str, active: Option<&Prepared>, shadow: Option<&Prepared>) {
        let _guard = self.inner.reload_lock.lock().await;
        self.inner.managed.lock().insert(name.to_owned());
        let current = self.inner.registry.load_full();
        let mut slots = current.slots.clone();
        let shadow_stem = format!("{name}{SHADOW}");
        match active {
            Some(prepared) => slots.insert(name.to_owned(), Slot::Loaded(Arc::clone(&prepared.plugin))),
            None => slots.remove(name),
        };
        match shadow {
            Some(prepared) => slots.insert(shadow_stem, Slot::Loaded(Arc::clone(&prepared.plugin))),
            None => slots.remove(&shadow_stem),
        };
        drop(current);
        self.swap(slots);
    }

    /// Holds this node's calls of `hooks`: waits until every call of them under way is
    /// answered, then no call of them starts until the [`Hold`] is dropped (they wait, they
    /// do not fail); calls of the other hooks go on. A cluster switching a plugin's versions
    /// holds the plugin's hooks (old version's and new one's) on every node before any node
    /// serves the new version, so no call is answered by the old version after one was
    /// answered by the new, on any node.
    pub async fn hold(&self, hooks: impl IntoIterator<Item = Hook>) -> Hold {
        let mut hold = Hold::default();
        self.hold_more(&mut hold, hooks).await;
        hold
    }

    /// Adds `hooks` to `hold`, as [`hold`](Self::hold) does. Take one hold at a time on a
    /// host (the node's follower does): a call passes one gate only, so nothing then waits
    /// in a cycle.
    pub async fn hold_more(&self, hold: &mut Hold, hooks: impl IntoIterator<Item = Hook>) {
        let wanted: BTreeSet<Hook> = hooks.into_iter().collect();
        for hook in wanted {
            if let Entry::Vacant(slot) = hold.gates.entry(hook) {
                slot.insert(Arc::clone(&self.inner.gates[hook.index()]).write_owned().await);
            }
        }
    }

    /// The hooks of the version of plugin `name` serving now (none when none does).
    pub fn hooks_of(&self, name: &str) -> Vec<Hook> {
        match self.inner.registry.load().slots.get(name) {
            Some(Slot::Loaded(plugin)) => plugin.hooks.clone(),
            _ => Vec::new(),
        }
    }

    /// Marks `names` as managed by the registry before anything of theirs is installed, so
    /// that loading the folder at start passes over their files.
    pub fn manage(&self, names: impl IntoIterator<Item = String>) {
        self.inner.managed.lock().extend(names);
    }

    /// The plugins the registry manages.
    pub fn managed(&self) -> Vec<String> {
        self.inner.managed.lock().iter().cloned().collect()
    }

    /// Whether `stem` (`NAME` or `NAME.shadow`) belongs to a plugin the registry manages.
    pub(crate) fn is_managed(&self, stem: &str) -> bool {
        let base = stem.strip_suffix(SHADOW).unwrap_or(stem);
        self.inner.managed.lock().contains(base)
    }

    /// The folder's files (by stem) the last reload passed over because the registry
    /// deploys their plugin.
    pub fn overridden_files(&self) -> Vec<String> {
        self.inner.overridden.lock().clone()
    }
}
