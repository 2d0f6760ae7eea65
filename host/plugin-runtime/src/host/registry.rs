//! The registry: an immutable snapshot of the loaded plugins (every plugin file's slot, the
//! chain of plugins per hook, the shadows), built anew on every change and swapped in whole.

use crate::{
    config::ShadowPolicy,
    plugin::{Plugin, SHADOW},
    shadow::Shadow,
};
use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

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
    pub(super) fn build(slots: BTreeMap<String, Slot>, previous: &Registry, policy: ShadowPolicy) -> Self {
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
