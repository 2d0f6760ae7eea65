//! One loaded plugin version: compiled once, checked against the contract, pre-instantiated,
//! with a pool of ready instances.
//!
//! Invariants: an instance whose call failed (trap, timeout, limit) is dropped, never
//! returned to the pool; a call instantiates only when the pool is empty; every call runs
//! under an epoch deadline (wasm code) and a tokio timeout (host imports that hang).

use crate::{
    CONTRACT_VERSION,
    config::{Hook, PluginHostConfig},
    engine::Runtime,
    error::PluginError,
    manifest::{Manifest, Settings},
    state::{LimitHit, PluginContext, StoreState},
    stats::PluginStats,
    types::{
        AnnounceDecision, Announcement, ConnectDecision, ConnectRequest, Health, Message, MessageDecision,
        RouteRequest, Tier,
    },
};
use herald_plugin_bindings::exports::herald::plugin::{announce_policy, connect, degrade, message_policy, route_key};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::{path::PathBuf, sync::Arc, time::Duration};
use tokio::time::Instant;
use wasmtime::{
    Store, Trap,
    component::{Component, InstancePre},
};

/// What a plugin needs from the host to load: config and the shared back ends.
pub(crate) struct Deps {
    pub config: PluginHostConfig,
    pub kv: Arc<dyn crate::PluginKv>,
    pub limiter: Arc<dyn crate::RateLimiter>,
    pub clock: Arc<dyn crate::Clock>,
}

/// A plugin file's bytes and sidecar, read off the hot path.
pub(crate) struct Source {
    pub name: String,
    pub file: PathBuf,
    pub wasm: Vec<u8>,
    pub manifest: Option<(PathBuf, String)>,
}

impl Source {
    /// Reads `NAME.wasm` and, if present, `NAME.toml` beside it.
    pub fn read(file: PathBuf) -> Result<Self, PluginError> {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| PluginError::NotAPluginFile(file.clone()))?
            .to_owned();
        let wasm = std::fs::read(&file).map_err(|source| PluginError::Io { path: file.clone(), source })?;
        let sidecar = file.with_extension("toml");
        let manifest = match std::fs::read_to_string(&sidecar) {
            Ok(text) => Some((sidecar, text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(PluginError::Io { path: sidecar, source }),
        };
        Ok(Self { name, file, wasm, manifest })
    }

    /// Identifies this exact source (component bytes and manifest text).
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        h.update(&self.wasm);
        if let Some((_, text)) = &self.manifest {
            h.update(text.as_bytes());
        }
        hex(&h.finalize())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A hook call's input.
pub(crate) enum Input<'a> {
    Message(&'a Message),
    Announcement(&'a Announcement),
    Route(&'a RouteRequest),
    Health(&'a Health),
    Connect(&'a ConnectRequest),
}

/// A hook call's answer.
pub(crate) enum Output {
    Message(MessageDecision),
    Announcement(AnnounceDecision),
    Route(Option<String>),
    Tier(Tier),
    Connect(ConnectDecision),
}

/// Why a call produced no answer.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub message: String,
}

#[derive(Default)]
struct Indices {
    message_policy: Option<message_policy::GuestIndices>,
    announce_policy: Option<announce_policy::GuestIndices>,
    route_key: Option<route_key::GuestIndices>,
    degrade: Option<degrade::GuestIndices>,
    connect: Option<connect::GuestIndices>,
}

struct Guests {
    message_policy: Option<message_policy::Guest>,
    announce_policy: Option<announce_policy::Guest>,
    route_key: Option<route_key::Guest>,
    degrade: Option<degrade::Guest>,
    connect: Option<connect::Guest>,
}

/// An instance and its hooks' export handles, looked up once at instantiation. Boxed in
/// the pool: a call checks one out and gives it back, and moving a pointer in and out
/// of the pool is cheaper than moving the handles of all five hooks.
struct Instance {
    store: Store<StoreState>,
    guests: Guests,
}

/// A loaded plugin version.
pub(crate) struct Plugin {
    pub name: Arc<str>,
    pub file: PathBuf,
    pub settings: Settings,
    pub hooks: Vec<Hook>,
    pub content_hash: String,
    pub fingerprint: String,
    pub imports: Vec<String>,
    pre: InstancePre<StoreState>,
    indices: Indices,
    ctx: Arc<PluginContext>,
    // Boxed on purpose (see `Instance`): checkout and give-back move a pointer.
    #[allow(clippy::vec_box)]
    pool: Mutex<Vec<Box<Instance>>>,
    pool_size: usize,
    epoch_ticks: u64,
    hard_timeout: Duration,
    pub stats: PluginStats,
    /// Set when a newer version of this plugin failed to load (this one keeps serving).
    pub last_load_error: Mutex<Option<String>>,
    quarantine: crate::config::QuarantinePolicy,
}

/// Splits `herald:plugin/<interface>@<version>`.
fn contract_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("herald:plugin/")?.split_once('@')
}

/// Checks imports and exports against the contract; returns the exported hooks and imports.
fn inspect(name: &str, component: &Component, runtime: &Runtime) -> Result<(Vec<Hook>, Vec<String>), PluginError> {
    let ty = component.component_type();
    let engine = &runtime.engine;
    let refuse_version = |found: &str| PluginError::UnsupportedContract {
        name: name.to_owned(),
        found: found.to_owned(),
        supported: CONTRACT_VERSION,
    };
    let mut imports = Vec::new();
    for (import, _) in ty.imports(engine) {
        if let Some((interface, version)) = contract_name(import) {
            if version != CONTRACT_VERSION {
                return Err(refuse_version(version));
            }
            if interface != "host" && interface != "types" {
                return Err(PluginError::ImportNotProvided { name: name.to_owned(), import: import.to_owned() });
            }
        } else if !import.starts_with("wasi:") {
            return Err(PluginError::ImportNotProvided { name: name.to_owned(), import: import.to_owned() });
        }
        imports.push(import.to_owned());
    }
    let mut hooks = Vec::new();
    for (export, _) in ty.exports(engine) {
        if let Some((interface, version)) = contract_name(export) {
            if version != CONTRACT_VERSION {
                return Err(refuse_version(version));
            }
            if let Some(hook) = Hook::from_wit_name(interface) {
                hooks.push(hook);
            }
        }
    }
    hooks.sort();
    if hooks.is_empty() {
        return Err(PluginError::NoHooks { name: name.to_owned() });
    }
    Ok((hooks, imports))
}

fn list(hooks: &[Hook]) -> String {
    hooks.iter().map(|h| h.wit_name()).collect::<Vec<_>>().join(", ")
}

fn wasm_err(name: &str, e: &wasmtime::Error) -> PluginError {
    PluginError::Instantiate { name: name.to_owned(), message: chain(e) }
}

/// The error and its causes, one line.
fn chain(e: &wasmtime::Error) -> String {
    e.chain().map(ToString::to_string).collect::<Vec<_>>().join(": ")
}

impl Plugin {
    /// Compiles and checks `source`, then instantiates it once (the instance seeds the pool).
    /// Compilation runs on a blocking thread.
    pub async fn load(runtime: &Arc<Runtime>, source: Source, deps: &Deps) -> Result<Arc<Plugin>, PluginError> {
        let name = source.name.clone();
        let manifest = match &source.manifest {
            Some((path, text)) => Manifest::parse(text)
                .map_err(|e| PluginError::Manifest { path: path.clone(), message: e.to_string() })?,
            None => Manifest::default(),
        };
        if let Some(manifest_name) = manifest.name.as_ref().filter(|n| **n != name) {
            return Err(PluginError::NameMismatch { name, manifest_name: manifest_name.clone() });
        }
        let settings = Settings::resolve(&name, &manifest, &deps.config);
        if settings.limits.memory_mib > deps.config.max_memory_mib {
            return Err(PluginError::MemoryCap {
                name,
                asked: settings.limits.memory_mib,
                max: deps.config.max_memory_mib,
            });
        }
        let fingerprint = source.fingerprint();
        let content_hash = format!("sha256:{}", hex(&Sha256::digest(&source.wasm)));
        let engine = runtime.engine.clone();
        let wasm = source.wasm;
        let component = tokio::task::spawn_blocking(move || Component::new(&engine, &wasm))
            .await
            .map_err(|e| PluginError::Task(e.to_string()))?
            .map_err(|e| PluginError::Compile { name: name.clone(), message: chain(&e) })?;
        let (hooks, imports) = inspect(&name, &component, runtime)?;
        if let Some(claimed) = &settings.claimed_hooks {
            let mut claimed = claimed.clone();
            claimed.sort();
            claimed.dedup();
            if claimed != hooks {
                return Err(PluginError::HooksMismatch { name, claimed: list(&claimed), exported: list(&hooks) });
            }
        }
        let pre = runtime.linker.instantiate_pre(&component).map_err(|e| wasm_err(&name, &e))?;
        let mut indices = Indices::default();
        for hook in &hooks {
            let e = |e: wasmtime::Error| wasm_err(&name, &e);
            match hook {
                Hook::MessagePolicy => {
                    indices.message_policy = Some(message_policy::GuestIndices::new(&pre).map_err(e)?)
                }
                Hook::AnnouncePolicy => {
                    indices.announce_policy = Some(announce_policy::GuestIndices::new(&pre).map_err(e)?);
                }
                Hook::RouteKey => indices.route_key = Some(route_key::GuestIndices::new(&pre).map_err(e)?),
                Hook::Degrade => indices.degrade = Some(degrade::GuestIndices::new(&pre).map_err(e)?),
                Hook::Connect => indices.connect = Some(connect::GuestIndices::new(&pre).map_err(e)?),
            }
        }
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
            file: source.file,
            settings,
            hooks,
            content_hash,
            fingerprint,
            imports,
            pre,
            indices,
            ctx,
            pool: Mutex::new(Vec::new()),
            pool_size: deps.config.pool_size,
            epoch_ticks,
            hard_timeout: deadline * 2 + tick * 2,
            stats: PluginStats::new(),
            last_load_error: Mutex::new(None),
            quarantine: deps.config.quarantine,
        };
        // A trial instantiation catches start-up traps and oversized memories at load time,
        // and the instance makes the first call as fast as the rest.
        let first = plugin
            .instantiate(Instant::now() + plugin.hard_timeout)
            .await
            .map_err(|f| PluginError::Instantiate { name: plugin.name.to_string(), message: f.message })?;
        plugin.give_back(first);
        Ok(Arc::new(plugin))
    }

    /// A fresh instance; host calls made while instantiating stop at `deadline`.
    async fn instantiate(&self, deadline: Instant) -> Result<Box<Instance>, Failure> {
        let mut store = Store::new(self.pre.engine(), StoreState::new(self.ctx.clone(), deadline, self.hard_timeout));
        store.limiter(|s| &mut s.sandbox);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.epoch_ticks);
        let fail = |e: wasmtime::Error, store: &mut Store<StoreState>| Failure {
            message: format!("instantiation failed: {}", self.describe(&e, store)),
        };
        let instance = match self.pre.instantiate_async(&mut store).await {
            Ok(i) => i,
            Err(e) => return Err(fail(e, &mut store)),
        };
        let i = &self.indices;
        let guests = (|| -> wasmtime::Result<Guests> {
            Ok(Guests {
                message_policy: i.message_policy.as_ref().map(|x| x.load(&mut store, &instance)).transpose()?,
                announce_policy: i.announce_policy.as_ref().map(|x| x.load(&mut store, &instance)).transpose()?,
                route_key: i.route_key.as_ref().map(|x| x.load(&mut store, &instance)).transpose()?,
                degrade: i.degrade.as_ref().map(|x| x.load(&mut store, &instance)).transpose()?,
                connect: i.connect.as_ref().map(|x| x.load(&mut store, &instance)).transpose()?,
            })
        })();
        match guests {
            Ok(guests) => Ok(Box::new(Instance { store, guests })),
            Err(e) => Err(fail(e, &mut store)),
        }
    }

    fn give_back(&self, instance: Box<Instance>) {
        let mut pool = self.pool.lock();
        if pool.len() < self.pool_size.max(1) {
            pool.push(instance);
        }
        // Otherwise the surplus instance is dropped here, after the guard (locals drop
        // before parameters), so freeing its slot never holds up other calls.
    }

    /// Idle instances in the pool.
    pub fn idle_instances(&self) -> usize {
        self.pool.lock().len()
    }

    /// Drops every idle instance (tests and benchmarks measure fresh instantiation this way).
    pub fn drain_pool(&self) {
        // Freed outside the lock: resetting instance slots takes a while.
        let idle = std::mem::take(&mut *self.pool.lock());
        drop(idle);
    }

    /// Says why a call failed, naming the limit that was hit where there is one.
    fn describe(&self, e: &wasmtime::Error, store: &mut Store<StoreState>) -> String {
        if let Some(hit) = e.downcast_ref::<LimitHit>() {
            return hit.to_string();
        }
        if let Some(Trap::Interrupt) = e.downcast_ref::<Trap>() {
            return format!("deadline of {} ms exceeded: the call was interrupted", self.settings.limits.deadline_ms);
        }
        let mut message = format!("trap: {}", chain(e));
        if let Some(log) = store.data_mut().last_error_log.take() {
            message.push_str(&format!(" (last error logged by the plugin: {log})"));
        }
        message
    }

    fn fail(&self, message: String, timeout: bool) -> Failure {
        tracing::warn!(plugin = %self.name, version = %self.settings.version, "plugin call failed: {message}");
        if self.stats.record_failure(message.clone(), timeout, &self.quarantine) {
            tracing::error!(
                plugin = %self.name,
                failures = self.quarantine.failures,
                window_ms = self.quarantine.window_ms,
                "plugin quarantined for {} ms after repeated failures; its hooks answer by failure policy",
                self.quarantine.duration_ms
            );
        }
        Failure { message }
    }

    /// Calls the hook `input` is for. A quarantined plugin is not called.
    pub async fn invoke(&self, input: Input<'_>) -> Result<Output, Failure> {
        if let Some(left) = self.stats.quarantine_left() {
            return Err(Failure { message: format!("quarantined for another {} ms", left.as_millis()) });
        }
        // A call reads the clock twice (a read costs ~25 ns on a VM): here, and when it
        // ends, to time it for the stats. The host calls' deadline derives from this one.
        let started = Instant::now();
        let deadline = started + self.hard_timeout;
        let pooled = self.pool.lock().pop();
        let mut instance = match pooled {
            Some(i) => i,
            None => match self.instantiate(deadline).await {
                Ok(i) => i,
                Err(f) => {
                    self.stats.record_call(started.elapsed());
                    return Err(self.fail(f.message, false));
                }
            },
        };
        let Instance { store, guests } = &mut *instance;
        store.set_epoch_deadline(self.epoch_ticks);
        let data = store.data_mut();
        data.host_calls = 0;
        data.last_error_log = None;
        data.deadline = deadline;
        let missing = || wasmtime::format_err!("the plugin does not export this hook");
        let call = async {
            match input {
                Input::Message(m) => guests
                    .message_policy
                    .as_ref()
                    .ok_or_else(missing)?
                    .call_check(&mut *store, m)
                    .await
                    .map(Output::Message),
                Input::Announcement(a) => guests
                    .announce_policy
                    .as_ref()
                    .ok_or_else(missing)?
                    .call_check(&mut *store, a)
                    .await
                    .map(Output::Announcement),
                Input::Route(r) => guests
                    .route_key
                    .as_ref()
                    .ok_or_else(missing)?
                    .call_route_key(&mut *store, r)
                    .await
                    .map(Output::Route),
                Input::Health(h) => guests
                    .degrade
                    .as_ref()
                    .ok_or_else(missing)?
                    .call_choose_tier(&mut *store, *h)
                    .await
                    .map(Output::Tier),
                Input::Connect(c) => guests
                    .connect
                    .as_ref()
                    .ok_or_else(missing)?
                    .call_authorize(&mut *store, c)
                    .await
                    .map(Output::Connect),
            }
        };
        let result = call.await;
        self.stats.record_call(started.elapsed());
        match result {
            Ok(output) => {
                self.give_back(instance);
                Ok(output)
            }
            Err(e) => {
                let timeout = matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt))
                    || matches!(e.downcast_ref::<LimitHit>(), Some(LimitHit::HostTimeout(_)));
                let message = self.describe(&e, &mut instance.store);
                Err(self.fail(message, timeout))
            }
        }
    }
}
