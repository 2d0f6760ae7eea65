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
        AnnounceDecision, Announcement, ConnectDecision, ConnectRequest, Delivery, Health, Message, MessageDecision,
        RouteRequest, Tier,
    },
};
use herald_plugin_bindings::exports::herald::plugin::{
    announce_policy, connect, degrade, deliver_filter, message_policy, route_key,
};
use herald_plugin_bindings::v0_1;
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

/// A plugin file's bytes and sidecar, read (and hashed) off the hot path.
pub(crate) struct Source {
    pub name: String,
    pub file: PathBuf,
    /// The component bytes; `None` when the file is the one the serving version was read
    /// from, unchanged (see [`FileStamp`]): its compiled code is reused, so the bytes are
    /// neither read nor hashed again.
    pub wasm: Option<Vec<u8>>,
    pub manifest: Option<(PathBuf, String)>,
    /// `sha256:<hex>` of the component bytes.
    pub content_hash: String,
    /// Identifies this exact source (component bytes and manifest text).
    pub fingerprint: String,
    /// The component file's identity when it was read.
    pub stamp: Option<FileStamp>,
}

/// What tells that a file is unchanged without reading it: its device and inode, size, and
/// modification and status-change times. Every write or rename changes the status-change
/// time, and nothing can set it back (unlike the modification time, which `cp -p` or
/// `touch -d` can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    #[cfg(unix)]
    fn of(meta: &std::fs::Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }

    /// Elsewhere there is no status-change time to trust: every read reads the bytes.
    #[cfg(not(unix))]
    fn of(_: &std::fs::Metadata) -> Option<Self> {
        None
    }
}

/// A version already read from a file: its stamp then, and its content hash.
pub(crate) type Known<'a> = Option<(&'a FileStamp, &'a str)>;

impl Source {
    /// Reads `NAME.wasm` and, if present, `NAME.toml` beside it — skipping the component's
    /// bytes when the file still has the stamp of `known` (a version read from it before):
    /// a reload after a manifest change reads and hashes only the manifest.
    fn read_known(file: PathBuf, known: Known<'_>) -> Result<Self, PluginError> {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| PluginError::NotAPluginFile(file.clone()))?
            .to_owned();
        let io = |source| PluginError::Io { path: file.clone(), source };
        let stamp = FileStamp::of(&std::fs::metadata(&file).map_err(io)?);
        let (wasm, content_hash) = match known {
            Some((then, hash)) if stamp.as_ref() == Some(then) => (None, hash.to_owned()),
            _ => {
                let wasm = std::fs::read(&file).map_err(io)?;
                let hash = format!("sha256:{}", hex(&Sha256::digest(&wasm)));
                (Some(wasm), hash)
            }
        };
        let sidecar = file.with_extension("toml");
        let manifest = match std::fs::read_to_string(&sidecar) {
            Ok(text) => Some((sidecar, text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(PluginError::Io { path: sidecar, source }),
        };
        let mut h = Sha256::new();
        h.update(content_hash.as_bytes());
        if let Some((_, text)) = &manifest {
            h.update([0]);
            h.update(text.as_bytes());
        }
        let fingerprint = hex(&h.finalize());
        Ok(Self { name, file, wasm, manifest, content_hash, fingerprint, stamp })
    }

    /// [`Source::read_known`] on a blocking thread, knowing no earlier version.
    pub async fn read_off_thread(file: PathBuf) -> Result<Self, PluginError> {
        Self::read_known_off_thread(file, None).await
    }

    /// [`Source::read_known`] on a blocking thread.
    pub async fn read_known_off_thread(file: PathBuf, known: Known<'_>) -> Result<Self, PluginError> {
        let known = known.map(|(stamp, hash)| (stamp.clone(), hash.to_owned()));
        tokio::task::spawn_blocking(move || Self::read_known(file, known.as_ref().map(|(s, h)| (s, h.as_str()))))
            .await
            .map_err(|e| PluginError::Task(e.to_string()))?
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A hook call's input.
#[derive(Clone, Copy)]
pub(crate) enum Input<'a> {
    Message(&'a Message),
    Announcement(&'a Announcement),
    Route(&'a RouteRequest),
    Health(&'a Health),
    Connect(&'a ConnectRequest),
    Delivery(&'a Delivery),
}

/// A hook call's answer.
pub(crate) enum Output {
    Message(MessageDecision),
    Announcement(AnnounceDecision),
    Route(Option<String>),
    Tier(Tier),
    Connect(ConnectDecision),
    /// The recipients to drop.
    Dropped(Vec<String>),
}

/// Why a call produced no answer.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub message: String,
}

/// A contract version this host serves. Later versions only add to earlier ones, so every
/// version's hooks take and return the same data types; what differs is the names a
/// component's imports and exports carry (`herald:plugin/<interface>@<version>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contract {
    V0_1,
    V0_2,
}

impl Contract {
    /// Every version served, oldest first.
    const ALL: [Contract; 2] = [Contract::V0_1, Contract::V0_2];

    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => v0_1::CONTRACT_VERSION,
            Contract::V0_2 => CONTRACT_VERSION,
        }
    }

    fn parse(version: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.version() == version)
    }

    /// Whether this version defines `hook`.
    fn defines(self, hook: Hook) -> bool {
        hook != Hook::DeliverFilter || self != Contract::V0_1
    }
}

/// A hook's export handles under each contract version that defines it: `$indices` (found
/// once per loaded version) and `$guest` (looked up once per instance).
macro_rules! versioned_hook {
    ($indices:ident, $guest:ident, $module:ident) => {
        enum $indices {
            V0_1(v0_1::exports::herald::plugin::$module::GuestIndices),
            V0_2($module::GuestIndices),
        }

        enum $guest {
            V0_1(v0_1::exports::herald::plugin::$module::Guest),
            V0_2($module::Guest),
        }

        impl $indices {
            fn new(pre: &InstancePre<StoreState>, contract: Contract) -> wasmtime::Result<Self> {
                Ok(match contract {
                    Contract::V0_1 => Self::V0_1(v0_1::exports::herald::plugin::$module::GuestIndices::new(pre)?),
                    Contract::V0_2 => Self::V0_2($module::GuestIndices::new(pre)?),
                })
            }

            fn load(
                &self,
                store: &mut Store<StoreState>,
                instance: &wasmtime::component::Instance,
            ) -> wasmtime::Result<$guest> {
                Ok(match self {
                    Self::V0_1(i) => $guest::V0_1(i.load(store, instance)?),
                    Self::V0_2(i) => $guest::V0_2(i.load(store, instance)?),
                })
            }
        }
    };
}

versioned_hook!(MessagePolicyIndices, MessagePolicyGuest, message_policy);
versioned_hook!(AnnouncePolicyIndices, AnnouncePolicyGuest, announce_policy);
versioned_hook!(RouteKeyIndices, RouteKeyGuest, route_key);
versioned_hook!(DegradeIndices, DegradeGuest, degrade);
versioned_hook!(ConnectIndices, ConnectGuest, connect);

/// Calls `$method` on a versioned guest, whichever version it is.
macro_rules! call_versioned {
    ($kind:ident, $guest:expr, $method:ident, $store:expr, $arg:expr) => {
        match $guest {
            Some(g) => match g {
                $kind::V0_1(g) => g.$method($store, $arg).await,
                $kind::V0_2(g) => g.$method($store, $arg).await,
            },
            None => Err(wasmtime::format_err!("the plugin does not export this hook")),
        }
    };
}

#[derive(Default)]
struct Indices {
    message_policy: Option<MessagePolicyIndices>,
    announce_policy: Option<AnnouncePolicyIndices>,
    route_key: Option<RouteKeyIndices>,
    degrade: Option<DegradeIndices>,
    connect: Option<ConnectIndices>,
    // Only contract 0.2.0 on defines it: no older variant.
    deliver_filter: Option<deliver_filter::GuestIndices>,
}

struct Guests {
    message_policy: Option<MessagePolicyGuest>,
    announce_policy: Option<AnnouncePolicyGuest>,
    route_key: Option<RouteKeyGuest>,
    degrade: Option<DegradeGuest>,
    connect: Option<ConnectGuest>,
    deliver_filter: Option<deliver_filter::Guest>,
}

/// An instance and its hooks' export handles, looked up once at instantiation. Boxed in
/// the pool: a call checks one out and gives it back, and moving a pointer in and out
/// of the pool is cheaper than moving the handles of all six hooks.
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
    hard_timeout: Duration,
    pub stats: PluginStats,
    /// Set when a newer version of this plugin failed to load (this one keeps serving).
    pub last_load_error: Mutex<Option<String>>,
    /// How this version's promotion went, when it was promoted from shadow (or rolled back to).
    pub canary: Mutex<Option<crate::shadow::CanaryStatus>>,
    /// The recording of this version's calls, while one runs.
    pub recorder: arc_swap::ArcSwapOption<crate::recording::Recorder>,
    quarantine: crate::config::QuarantinePolicy,
}

/// Splits `herald:plugin/<interface>@<version>`.
fn contract_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("herald:plugin/")?.split_once('@')
}

/// What [`inspect`] found in a component.
struct Inspected {
    hooks: Vec<Hook>,
    imports: Vec<String>,
    contract: Contract,
}

/// Checks imports and exports against the contract: every `herald:plugin` name must carry
/// one version, and one this host serves. Returns the exported hooks, the imports and the
/// version.
fn inspect(name: &str, component: &Component, runtime: &Runtime) -> Result<Inspected, PluginError> {
    let ty = component.component_type();
    let engine = &runtime.engine;
    let refuse_version = |found: &str| PluginError::UnsupportedContract {
        name: name.to_owned(),
        found: found.to_owned(),
        supported: CONTRACT_VERSION,
    };
    // The first version named decides; any other version named after it is refused.
    let mut contract = None;
    let mut version_of = |found: &str| -> Result<Contract, PluginError> {
        let this = Contract::parse(found).ok_or_else(|| refuse_version(found))?;
        match contract {
            Some(first) if first != this => Err(PluginError::MixedContracts {
                name: name.to_owned(),
                first: Contract::version(first),
                second: this.version(),
            }),
            _ => {
                contract = Some(this);
                Ok(this)
            }
        }
    };
    let mut imports = Vec::new();
    for (import, _) in ty.imports(engine) {
        if let Some((interface, version)) = contract_name(import) {
            version_of(version)?;
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
            let this = version_of(version)?;
            if let Some(hook) = Hook::from_wit_name(interface).filter(|&hook| this.defines(hook)) {
                hooks.push(hook);
            }
        }
    }
    hooks.sort();
    if hooks.is_empty() {
        return Err(PluginError::NoHooks { name: name.to_owned() });
    }
    Ok(Inspected { hooks, imports, contract: contract.unwrap_or(Contract::V0_2) })
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
        let base = name.strip_suffix(crate::shadow::SHADOW).unwrap_or(&name).to_owned();
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
                .map_err(|e| PluginError::Task(e.to_string()))?
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
        let mut indices = Indices::default();
        for hook in &hooks {
            let e = |e: wasmtime::Error| wasm_err(&name, &e);
            match hook {
                Hook::MessagePolicy => {
                    indices.message_policy = Some(MessagePolicyIndices::new(&pre, contract).map_err(e)?);
                }
                Hook::AnnouncePolicy => {
                    indices.announce_policy = Some(AnnouncePolicyIndices::new(&pre, contract).map_err(e)?);
                }
                Hook::RouteKey => indices.route_key = Some(RouteKeyIndices::new(&pre, contract).map_err(e)?),
                Hook::Degrade => indices.degrade = Some(DegradeIndices::new(&pre, contract).map_err(e)?),
                Hook::Connect => indices.connect = Some(ConnectIndices::new(&pre, contract).map_err(e)?),
                // `inspect` finds it only in a 0.2.0 component or later.
                Hook::DeliverFilter => {
                    indices.deliver_filter = Some(deliver_filter::GuestIndices::new(&pre).map_err(e)?);
                }
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
                deliver_filter: i.deliver_filter.as_ref().map(|x| x.load(&mut store, &instance)).transpose()?,
            })
        })();
        match guests {
            Ok(guests) => Ok(Box::new(Instance { store, guests })),
            Err(e) => Err(fail(e, &mut store)),
        }
    }

    /// Fills the pool to `n` idle instances (at least one, at most the pool's size).
    pub async fn warm(&self, n: usize) -> Result<(), PluginError> {
        let want = n.clamp(1, self.pool_size.max(1));
        while self.idle_instances() < want {
            let instance = self
                .instantiate(Instant::now() + self.hard_timeout)
                .await
                .map_err(|f| PluginError::Instantiate { name: self.name.to_string(), message: f.message })?;
            self.give_back(instance);
        }
        Ok(())
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
        let call = async {
            match input {
                Input::Message(m) => {
                    call_versioned!(MessagePolicyGuest, &guests.message_policy, call_check, &mut *store, m)
                        .map(Output::Message)
                }
                Input::Announcement(a) => {
                    call_versioned!(AnnouncePolicyGuest, &guests.announce_policy, call_check, &mut *store, a)
                        .map(Output::Announcement)
                }
                Input::Route(r) => {
                    call_versioned!(RouteKeyGuest, &guests.route_key, call_route_key, &mut *store, r).map(Output::Route)
                }
                Input::Health(h) => {
                    call_versioned!(DegradeGuest, &guests.degrade, call_choose_tier, &mut *store, *h).map(Output::Tier)
                }
                Input::Connect(c) => {
                    call_versioned!(ConnectGuest, &guests.connect, call_authorize, &mut *store, c).map(Output::Connect)
                }
                Input::Delivery(d) => match &guests.deliver_filter {
                    Some(g) => g.call_filter(&mut *store, d).await.map(Output::Dropped),
                    None => Err(wasmtime::format_err!("the plugin does not export this hook")),
                },
            }
        };
        let result = call.await;
        self.stats.record_call(started.elapsed());
        let recorder = self.recorder.load();
        match result {
            Ok(output) => {
                self.give_back(instance);
                if let Some(recorder) = recorder.as_ref() {
                    recorder.record(self.ctx.clock.now_ms(), input, Ok(&output));
                }
                Ok(output)
            }
            Err(e) => {
                let timeout = matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt))
                    || matches!(e.downcast_ref::<LimitHit>(), Some(LimitHit::HostTimeout(_)));
                let message = self.describe(&e, &mut instance.store);
                if let Some(recorder) = recorder.as_ref() {
                    recorder.record(self.ctx.clock.now_ms(), input, Err(&message));
                }
                Err(self.fail(message, timeout))
            }
        }
    }
}
