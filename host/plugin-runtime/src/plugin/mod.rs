//! One loaded plugin version: compiled once, checked against the contract, pre-instantiated,
//! with a pool of ready instances.
//!
//! Invariants: an instance whose call failed (trap, timeout, limit) is dropped, never
//! returned to the pool; a call instantiates only when the pool is empty; every call runs
//! under an epoch deadline (wasm code) and a tokio timeout (host imports that hang).

mod calls;
mod contract;
mod source;

use crate::{
    canary::CanaryStatus,
    config::{Hook, PluginHostConfig, QuarantinePolicy},
    engine::{Runtime, Ticking},
    error::PluginError,
    manifest::{Manifest, Settings},
    recording::Recorder,
    state::{PluginContext, StoreState},
    stats::PluginStats,
};
use parking_lot::Mutex;
use std::{path::PathBuf, sync::Arc, time::Duration};
use wasmtime::component::{Component, InstancePre};

use calls::Instance;
pub(crate) use contract::Contract;
use contract::{Indices, Inspected, inspect};
pub(crate) use source::{FileStamp, PREVIOUS, REJECTED, SHADOW, Source};

/// What a plugin needs from the host to load: config and the shared back ends.
pub(crate) struct Deps {
    pub config: PluginHostConfig,
    pub kv: Arc<dyn crate::PluginKv>,
    pub limiter: Arc<dyn crate::RateLimiter>,
    pub clock: Arc<dyn crate::Clock>,
}

/// A loaded plugin version.
pub(crate) struct Plugin {
    pub name: Arc<str>,
    pub file: PathBuf,
    pub settings: Settings,
    pub hooks: Vec<Hook>,
    /// The contract version it was built for.
    pub contract: Contract,
    pub content_hash: String,
    pub fingerprint: String,
    /// The component file's identity when this version was read from it.
    pub stamp: Option<FileStamp>,
    pub imports: Vec<String>,
    /// The compiled code (shared with a later version whose bytes are the same).
    component: Component,
    pre: InstancePre<StoreState>,
    indices: Indices,
    ctx: Arc<PluginContext>,
    // Boxed on purpose (see `Instance`): checkout and give-back move a pointer.
    #[allow(clippy::vec_box)]
    pool: Mutex<Vec<Box<Instance>>>,
    pool_size: usize,
    epoch_ticks: u64,
    /// Keeps the engine's epoch ticking while this version's guest code runs.
    ticking: Arc<Ticking>,
    hard_timeout: Duration,
    pub stats: PluginStats,
    /// Set when a newer version of this plugin failed to load (this one keeps serving).
    pub last_load_error: Mutex<Option<String>>,
    /// How this version's promotion went, when it was promoted from shadow (or rolled back to).
    pub canary: Mutex<Option<CanaryStatus>>,
    /// The recording of this version's calls, while one runs.
    pub recorder: arc_swap::ArcSwapOption<Recorder>,
    quarantine: QuarantinePolicy,
}

fn list(hooks: &[Hook]) -> String {
    hooks.iter().map(|h| h.wit_name()).collect::<Vec<_>>().join(", ")
}

fn wasm_err(name: &str, e: &wasmtime::Error) -> PluginError {
    PluginError::Instantiate { name: name.to_owned(), message: chain(e) }
}

/// The error and its causes, one line.
pub(super) fn chain(e: &wasmtime::Error) -> String {
    e.chain().map(ToString::to_string).collect::<Vec<_>>().join(": ")
}

impl Plugin {
    /// Compiles and checks `source`, then instantiates it once (the instance seeds the pool).
    /// Compilation runs on a blocking thread.
    ///
    /// With `previous` (the version this one replaces), the new version's pool is filled to
    /// as many idle instances as the previous one has, so the calls that follow the swap
    /// find instances ready instead of instantiating on the paths that serve messages. When
    /// `previous` or one of `compiled` (say, the shadow being promoted) has the same
    /// component bytes — only a manifest changed — its compiled code is reused instead of
    /// compiled again.
    pub async fn load(
        runtime: &Arc<Runtime>,
        source: Source,
        deps: &Deps,
        previous: Option<&Plugin>,
        compiled: &[&Plugin],
    ) -> Result<Arc<Plugin>, PluginError> {
        let name = source.name.clone();
        // A shadow (`NAME.shadow`) is NAME's: its manifest names NAME, and the host's
        // overrides of NAME apply to it too.
        let base = name.strip_suffix(SHADOW).unwrap_or(&name).to_owned();
        let manifest = match &source.manifest {
            Some((path, text)) => Manifest::parse(text)
                .map_err(|e| PluginError::Manifest { path: path.clone(), message: e.to_string() })?,
            None => Manifest::default(),
        };
        if let Some(manifest_name) = manifest.name.as_ref().filter(|n| **n != base) {
            return Err(PluginError::NameMismatch { name: base, manifest_name: manifest_name.clone() });
        }
        let settings = Settings::resolve(&base, &manifest, &deps.config);
        if settings.limits.memory_mib > deps.config.max_memory_mib {
            return Err(PluginError::MemoryCap {
                name,
                asked: settings.limits.memory_mib,
                max: deps.config.max_memory_mib,
            });
        }
        let Source { wasm, content_hash, fingerprint, file, stamp, .. } = source;
        let same_bytes = previous.into_iter().chain(compiled.iter().copied()).find(|p| p.content_hash == content_hash);
        let component = match same_bytes {
            Some(previous) => previous.component.clone(),
            None => {
                runtime.compilations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!("herald_plugin_compilations_total").increment(1);
                let engine = runtime.engine.clone();
                let path = file.clone();
                tokio::task::spawn_blocking(move || {
                    // Unread only when a version with these bytes serves, which is found
                    // above; read them anyway rather than trust that.
                    let wasm = match wasm {
                        Some(wasm) => wasm,
                        None => std::fs::read(&path).map_err(wasmtime::Error::from)?,
                    };
                    crate::cpu::counted_as_compile(|| Component::new(&engine, &wasm))
                })
                .await
                .map_err(PluginError::Task)?
                .map_err(|e| PluginError::Compile { name: name.clone(), message: chain(&e) })?
            }
        };
        let Inspected { hooks, imports, contract } = inspect(&name, &component, runtime)?;
        if let Some(claimed) = &settings.claimed_hooks {
            let mut claimed = claimed.clone();
            claimed.sort();
            claimed.dedup();
            if claimed != hooks {
                return Err(PluginError::HooksMismatch { name, claimed: list(&claimed), exported: list(&hooks) });
            }
        }
        let pre = runtime.linker.instantiate_pre(&component).map_err(|e| wasm_err(&name, &e))?;
        let indices = Indices::of(&pre, contract, &hooks).map_err(|e| wasm_err(&name, &e))?;
        let tick = deps.config.epoch_tick();
        let deadline = settings.limits.deadline();
        let epoch_ticks =
            u64::try_from(deadline.as_nanos().div_ceil(tick.as_nanos())).unwrap_or(u64::MAX).saturating_add(1);
        let ctx = Arc::new(PluginContext {
            name: Arc::from(name.as_str()),
            config_text: settings.config_text.clone(),
            kv: deps.kv.clone(),
            limiter: deps.limiter.clone(),
            clock: deps.clock.clone(),
            limits: settings.limits,
            metric_prefix: "herald_plugin_".to_owned(),
        });
        let plugin = Plugin {
            name: ctx.name.clone(),
            file,
            settings,
            hooks,
            contract,
            content_hash,
            fingerprint,
            stamp,
            imports,
            component,
            pre,
            indices,
            ctx,
            pool: Mutex::new(Vec::new()),
            pool_size: deps.config.pool_size,
            epoch_ticks,
            ticking: runtime.ticker.ticking(),
            hard_timeout: deadline * 2 + tick * 2,
            stats: PluginStats::new(),
            last_load_error: Mutex::new(None),
            recorder: arc_swap::ArcSwapOption::empty(),
            canary: Mutex::new(None),
            quarantine: deps.config.quarantine,
        };
        // A trial instantiation catches start-up traps and oversized memories at load time,
        // and the instance makes the first call as fast as the rest.
        plugin.warm(previous.map_or(1, Plugin::idle_instances)).await?;
        Ok(Arc::new(plugin))
    }
}
