//! One Herald node: every part wired together, chosen once at start-up from the config.
//!
//! This is the one place that knows which implementation backs each seam. Embedded mode
//! keeps routes, room directory, dedup marks and the ring in this process and reaches no
//! other node ([`LocalBus`]); cluster mode ([`cluster`], on when `cluster.redis_url` is
//! set) puts them in Redis and links the nodes. Storage is whichever SQL backend the URL
//! names.

mod cluster;
mod ledgers;
mod peers;
mod requests;
mod sizes;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::breaker::{BreakerState, BreakerStatus};
use crate::clock::{SystemClock, WallClock};
use crate::cluster::connection::RedisFailure;
use crate::cluster::membership::JoinError;
use crate::config::{Config, ConfigError, DeliveryConfig};
use crate::delivery::ledgers::LedgerKeeper;
use crate::delivery::sessions::Sessions;
use crate::delivery::{Delivery, DeliveryStores, Reach};
use crate::gateway::Gateway;
use crate::gateway::auth::{AuthError, Authenticator};
use crate::gateway::intake::Intake;
use crate::gateway::redirect::Redirects;
use crate::health::{Sampler, Tier, Vitals};
use crate::ids::seq::SWEEPS_PER_IDLE;
use crate::ids::{ResumeError, SeqAllocator, SnowflakeGenerator};
use crate::membership::{CachePolicy, Membership};
use crate::model::NodeId;
use crate::pipeline::dedup::{DedupMarks, LocalDedup};
use crate::pipeline::lanes::{Lanes, OwnerFrontier};
use crate::pipeline::{Pipeline, PipelineParts};
use crate::plugins::{Hook, PluginError, PluginHost, Plugins, RegistryWiring, types};
use crate::routing::bus::{LocalBus, NodeBus};
use crate::routing::rooms::{MemoryRoomDirectory, RoomDirectory, Rooms};
use crate::routing::router::Router;
use crate::routing::topology::StaticTopology;
use crate::routing::{MemoryRouteTable, RouteTable};
use crate::tls::{Tls, TlsError};
pub use cluster::{Cluster, ClusterStatus};
use peers::NodePeers;
pub use requests::Presence;

use crate::store::{
    ConversationStore, CursorStore, Database, GroupCommitter, GroupStore, MessageStore, MessageWriter, StoreError,
    StoreProbe,
};

/// Why a node could not be assembled. A variant with a source names the step in its
/// message and keeps the cause as its source, so a report of the chain (`herald serve`
/// prints `{error:#}`) reads "step: cause" and a caller can still ask what failed; the
/// larger causes are boxed, so a node that opens pays for none of them.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid configuration")]
    Settings(#[source] Box<ConfigError>),
    #[error("invalid configuration")]
    Auth(#[source] AuthError),
    #[error("invalid configuration")]
    Tls(#[source] Box<TlsError>),
    #[error("invalid configuration: plugin runtime")]
    Plugins(#[source] Box<PluginError>),
    #[error("invalid configuration: cluster mode")]
    Redis(#[source] Box<RedisFailure>),
    #[error("invalid configuration: cannot accept node-to-node links on cluster.peer_listen {addr}")]
    PeerListen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration")]
    Membership(#[source] Box<JoinError>),
    /// Message ids cannot resume above the ones this node id committed before.
    #[error(transparent)]
    Ids(#[from] ResumeError),
}

/// Everything a running node shares between its connections and its HTTP API. The HTTP
/// API and the server ask it for what they want through its methods (most in
/// `node/requests.rs`); its parts are its own.
pub struct Node {
    config: Config,
    database: Database,
    /// Group commit in front of `database`: flushed and closed last at shutdown.
    committer: GroupCommitter,
    clock: Arc<dyn WallClock>,
    /// Where connected devices are (presence).
    routes: Arc<dyn RouteTable>,
    /// The WebSocket edge.
    gateway: Arc<Gateway>,
    /// Groups (their API) and who may send and read.
    membership: Arc<Membership>,
    delivery: Arc<Delivery>,
    /// The uplink; announcements come in through it.
    pipeline: Arc<Pipeline>,
    /// The owner of each key, and this node's id.
    router: Arc<Router>,
    /// The Wasm plugins and their hot reload.
    plugins: Arc<Plugins>,
    /// Health counters, the last health sample and the delivery tier.
    vitals: Arc<Vitals>,
    /// This node's lease, peers and Redis seams; `None` in embedded mode.
    cluster: Option<Arc<Cluster>>,
    /// Saves the devices' ledgers for a restart (placement mode only).
    ledgers: Option<Arc<LedgerKeeper>>,
    /// TLS for the client listener and node-to-node links; `None` when `[tls]` is off.
    tls: Option<Tls>,
    /// Turns true at shutdown; every background loop stops on it.
    stop: watch::Sender<bool>,
    /// Shutdown was announced (`gateway.shutdown_delay_ms`): `/readyz` answers 503 while
    /// the node still serves.
    leaving: AtomicBool,
}

impl Node {
    /// Opens storage (migrating it) and assembles the node; starts its background tasks.
    /// `listening` is the address the gateway is bound to (cluster mode lists it as this
    /// node's client address unless `cluster.client_url` says otherwise).
    ///
    /// # Errors
    /// [`NodeError`] when storage cannot be opened, the configuration is unusable, or the
    /// clock is too far behind the newest message id this node id committed before.
    pub async fn open(config: Config, listening: SocketAddr) -> Result<Arc<Self>, NodeError> {
        config.validate().map_err(|error| NodeError::Settings(Box::new(error)))?;
        let gateway = &config.gateway;
        let auth = Authenticator::new(required_secret(&config)?, config.dev).map_err(NodeError::Auth)?.expecting(
            gateway.jwt_issuer.as_deref(),
            gateway.jwt_audience.as_deref(),
            gateway.max_token_bytes,
        );
        crate::telemetry::install();
        let tls = Tls::from_config(&config.tls).map_err(|error| NodeError::Tls(Box::new(error)))?;
        let database = open_storage(&config).await?;
        let committer = GroupCommitter::start(database.clone(), &config.storage.group_commit);
        let cluster = match config.cluster.enabled() {
            true => {
                // Counted in Redis, which may have lost the count while no node ran.
                let epoch_floor = database.highest_owner_epoch().await?;
                Some(Arc::new(Cluster::join(&config, tls.clone(), epoch_floor, listening).await?))
            }
            false => None,
        };
        // Cluster mode keeps plugin KV and rate limits in Redis, so they hold on every node.
        let (runtime, dir) = (config.plugin_runtime.clone(), config.plugins_dir());
        let this_node = cluster.as_ref().map_or(NodeId(config.node_id.unwrap_or(0)), |cluster| cluster.this_node());
        let registry_store = Arc::new(database.clone());
        let plugins = async {
            match &cluster {
                Some(cluster) => {
                    let (kv, limiter) = cluster.plugin_state();
                    let registry = cluster.plugin_registry(&config, registry_store);
                    Plugins::start_with(runtime, &dir, kv, limiter, registry).await
                }
                None => {
                    Plugins::start(runtime, &dir, RegistryWiring::embedded(&config, registry_store, this_node)).await
                }
            }
        };
        // Any wait for the clock to pass this node id's newest committed id overlaps
        // loading the plugins.
        let ids = crate::ids::resume(&database, this_node, SystemClock, config.ids.max_clock_wait);
        let (plugins, ids) = tokio::join!(plugins, ids);
        let ids: Arc<SnowflakeGenerator> = Arc::new(ids?);
        let plugins = Arc::new(plugins.map_err(|error| NodeError::Plugins(Box::new(error)))?);
        let seams = match &cluster {
            Some(cluster) => cluster.seams(&config, &plugins.host),
            None => Seams::embedded(&config, &plugins.host),
        };
        let storage = Storage {
            messages: Arc::new(database.clone()),
            writer: Arc::new(committer.clone()),
            cursors: Arc::new(database.clone()),
            conversations: Arc::new(database.clone()),
            groups: Arc::new(database.clone()),
            seqs: Arc::new(SeqAllocator::new(Arc::new(database.clone()), config.seq.clone())),
        };
        let vitals = Arc::new(Vitals::default());
        let settings = Settings {
            delivery: config.delivery.clone(),
            known_direct_idle: config.seq.evict_idle,
            // A node that missed a change's announcement trusts its list no longer than a
            // dead node's lease lasts.
            group_cache_ttl: config.cluster.enabled().then(|| config.cluster.lease_ttl()),
            max_group_members: config.api.max_group_members,
        };
        let Services { membership, delivery, pipeline, seqs, lanes } =
            seams.services(storage, settings, ids, &plugins.host, &vitals);
        let held_here = cluster::HeldHere {
            sessions: Arc::clone(&seams.sessions),
            rooms: Arc::clone(&seams.rooms),
            room_directory: Arc::clone(&seams.room_directory),
            clock: Arc::clone(&seams.clock),
        };
        let intake = Arc::new(Intake::new(config.intake.clone()));
        intake.start_upkeep();
        let gateway = Arc::new(Gateway::new(
            config.gateway.clone(),
            auth,
            Arc::clone(&seams.clock),
            Arc::clone(&seams.routes),
            Arc::clone(&pipeline),
            Arc::clone(&delivery),
            Arc::clone(&plugins.host),
            intake,
        ));
        gateway.check_homes(Arc::clone(&seams.router));
        let ledgers = match &cluster {
            Some(cluster) => {
                let (sessions, clock) = (Arc::clone(&seams.sessions), Arc::clone(&seams.clock));
                let (placement, restore) = (config.cluster.placement, config.cluster.restore_devices);
                ledgers::take_back(cluster, placement, restore, &gateway, sessions, clock, &seams.router).await
            }
            None => None,
        };
        let maps = sizes::Maps {
            gateway: Arc::clone(&gateway),
            delivery: Arc::clone(&delivery),
            routes: Arc::clone(&seams.routes),
            rooms: Arc::clone(&seams.rooms),
            dedup: Arc::clone(&seams.dedup),
            membership: Arc::clone(&membership),
            pipeline: Arc::clone(&pipeline),
            seqs: Arc::clone(&seqs),
            lanes: Arc::clone(&lanes),
        };
        let node = Arc::new(Self {
            database,
            committer,
            clock: seams.clock,
            routes: seams.routes,
            gateway,
            membership,
            delivery,
            pipeline,
            router: seams.router,
            plugins,
            vitals,
            cluster,
            ledgers,
            tls,
            stop: watch::Sender::new(false),
            leaving: AtomicBool::new(false),
            config,
        });
        node.start_background(Arc::clone(&seqs), Arc::clone(&lanes), maps);
        if let Some(cluster) = &node.cluster {
            let peers = NodePeers {
                pipeline: Arc::clone(&node.pipeline),
                delivery: Arc::clone(&node.delivery),
                gateway: Arc::clone(&node.gateway),
                lanes,
                routes: Arc::clone(&cluster.cached_routes),
                membership: Arc::clone(&node.membership),
            };
            cluster.serve_peers(Arc::new(peers), node.stop.subscribe());
            let lease_ttl = node.config.cluster.lease_ttl();
            node.spawn_until_stopped(Arc::clone(cluster).follow_ring(Arc::clone(&node.plugins.host), seqs, lease_ttl));
            let upkeep = Duration::from_millis(node.config.gateway.client_timeout_ms / 3);
            node.spawn_until_stopped(Arc::clone(cluster).keep_routes(Arc::clone(&held_here.sessions), upkeep));
            node.spawn_until_stopped(Arc::clone(cluster).reassert_after_data_loss(held_here));
        }
        if let Some(keeper) = &node.ledgers {
            node.spawn_until_stopped(Arc::clone(keeper).keep_saving(ledgers::SAVE_EVERY));
        }
        Ok(node)
    }

    /// This node's id.
    pub fn this_node(&self) -> NodeId {
        self.router.this_node()
    }

    /// Starts the loops that keep the node tidy; each stops at shutdown.
    fn start_background(self: &Arc<Self>, seqs: Arc<SeqAllocator>, lanes: Arc<Lanes>, maps: sizes::Maps) {
        self.spawn_until_stopped(Arc::clone(&self.delivery).flush_cursors_periodically());
        self.spawn_until_stopped(maps.report_every(Duration::from_secs(1)));
        let checkpoints = Duration::from_millis(self.config.storage.sqlite_checkpoint_ms.max(10));
        self.spawn_until_stopped(self.database.clone().checkpoint_periodically(checkpoints));
        let committer = self.committer.clone();
        self.spawn_until_stopped(self.database.clone().release_caches_when_idle(
            move || committer.totals().batches.load(std::sync::atomic::Ordering::Relaxed),
            Duration::from_millis(self.config.storage.sqlite_idle_release_ms),
        ));
        self.spawn_until_stopped(watch_health(
            Arc::clone(&self.vitals),
            Arc::clone(&self.gateway),
            self.committer.clone(),
            Arc::clone(&self.plugins.host),
            Duration::from_millis(self.config.delivery.degrade_interval_ms),
        ));
        let idle = self.config.seq.evict_idle;
        if !idle.is_zero() {
            self.spawn_until_stopped(forget_idle(seqs, lanes, idle / u32::from(SWEEPS_PER_IDLE)));
        }
    }

    /// Runs `work` until it ends or the node stops.
    fn spawn_until_stopped(&self, work: impl Future<Output = ()> + Send + 'static) {
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = work => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
        });
    }

    /// The gateway accepts connections at `listening`: in cluster mode, the URL clients
    /// reach this node at (`cluster.client_url`, or built from `listening`) is published,
    /// so that draining nodes can send their clients here. Does nothing in embedded mode.
    pub async fn serve_clients_at(&self, listening: SocketAddr) {
        if let Some(cluster) = &self.cluster {
            cluster.serve_clients_at(self.config.cluster.client_url.as_deref(), listening).await;
        }
    }

    /// Starts draining: `/readyz` answers 503, every connection (and any that finishes its
    /// handshake from now on) gets `go_away` and is closed with 1012; then writes pending
    /// cursors and stops the background loops. Queued inserts are flushed by the caller,
    /// after the listener stopped. In cluster mode each `go_away` names another live node
    /// to reconnect to (picked by user, so a user's devices stay together), when the
    /// others' client URLs can be read in time; this runs before the lease is given up.
    pub async fn shut_down(&self) {
        let redirects = async {
            match &self.cluster {
                // Devices have a home: they come back to this node through nginx once it
                // is up again, and resume from the ledgers it saves now.
                Some(cluster) if self.ledgers.is_some() => {
                    cluster.redirect_targets().await;
                    Redirects::none()
                }
                Some(cluster) => Redirects::new(cluster.redirect_targets().await),
                None => Redirects::none(),
            }
        };
        self.gateway.drain(redirects).await;
        self.stop.send_replace(true);
        self.delivery.flush_cursors().await;
        if let Some(keeper) = &self.ledgers {
            match keeper.save().await {
                Ok(()) => tracing::info!("devices' ledgers saved for this node's return"),
                Err(error) => tracing::warn!(%error, "could not save the devices' ledgers; they backfill in full"),
            }
        }
    }

    /// Announces shutdown: from now on `/readyz` answers 503 `draining`, while everything
    /// else goes on as before until [`shut_down`](Self::shut_down).
    pub fn announce_shutdown(&self) {
        self.leaving.store(true, Ordering::SeqCst);
    }

    /// Whether shutdown has begun (or was announced).
    pub fn is_draining(&self) -> bool {
        self.leaving.load(Ordering::SeqCst) || self.gateway.is_draining()
    }

    /// Whether storage answers (for `/readyz`).
    pub async fn storage_ready(&self) -> bool {
        self.database.ping().await
    }

    /// Cluster mode: whether this node's lease is certainly its own, so it may act for
    /// the conversations it owns (for `/readyz`). Always true in embedded mode.
    pub fn holds_lease(&self) -> bool {
        self.cluster.as_ref().is_none_or(|cluster| cluster.holds_lease())
    }

    /// Every circuit breaker of this node: the store's, and in cluster mode Redis' and each
    /// peer link's.
    pub fn breakers(&self) -> Vec<BreakerStatus> {
        let mut breakers = vec![self.committer.breaker().status()];
        if let Some(cluster) = &self.cluster {
            breakers.extend(cluster.status().breakers);
        }
        breakers
    }

    /// Cluster mode: whether Redis answers as far as this node knows (its breaker is not
    /// open), for `/readyz`. Always true in embedded mode.
    pub fn redis_available(&self) -> bool {
        self.cluster.as_ref().is_none_or(|cluster| cluster.redis_available())
    }

    /// Resolves when this node cannot go on and must stop: in cluster mode, once its lease
    /// is lost for good (it was paused or cut off from Redis past the lease TTL, and its id
    /// may be another node's now). Never resolves in embedded mode.
    pub async fn must_stop(&self) {
        match &self.cluster {
            Some(cluster) => cluster.membership.lost().await,
            None => std::future::pending().await,
        }
    }

    /// The last step of shutdown, once the listener has stopped and
    /// [`shut_down`](Self::shut_down) ran: commits the queued inserts; then, in cluster
    /// mode, gives the lease up and removes this node's routes; then closes the database.
    pub async fn close(&self) {
        self.committer.clone().close().await;
        if let Some(cluster) = &self.cluster {
            cluster.leave().await;
        }
        self.database.close().await;
    }
}

/// The implementations a node's services are built on: [`Seams::embedded`] for a node of
/// its own, and the unit tests' kit picks its own the same way.
pub(crate) struct Seams {
    pub this_node: NodeId,
    pub clock: Arc<dyn WallClock>,
    pub routes: Arc<dyn RouteTable>,
    pub rooms: Arc<Rooms>,
    pub room_directory: Arc<dyn RoomDirectory>,
    pub sessions: Arc<Sessions>,
    pub dedup: Arc<dyn DedupMarks>,
    pub bus: Arc<dyn NodeBus>,
    pub router: Arc<Router>,
}

/// Storage as the services see it.
pub(crate) struct Storage {
    pub messages: Arc<dyn MessageStore>,
    pub writer: Arc<dyn MessageWriter>,
    pub cursors: Arc<dyn CursorStore>,
    pub conversations: Arc<dyn ConversationStore>,
    pub groups: Arc<dyn GroupStore>,
    pub seqs: Arc<SeqAllocator>,
}

/// The settings the services take from the config.
pub(crate) struct Settings {
    pub delivery: DeliveryConfig,
    /// How long a direct conversation is remembered as recorded, and a group's member list
    /// cached, once idle.
    pub known_direct_idle: Duration,
    /// How long a group's member list is cached (`None`: until it changes).
    pub group_cache_ttl: Option<Duration>,
    /// Most members a group may hold.
    pub max_group_members: usize,
}

/// A node's services, built on its seams.
pub(crate) struct Services {
    pub membership: Arc<Membership>,
    pub delivery: Arc<Delivery>,
    pub pipeline: Arc<Pipeline>,
    /// For the loop that forgets idle conversations.
    pub seqs: Arc<SeqAllocator>,
    pub lanes: Arc<Lanes>,
}

impl Seams {
    /// Embedded mode: everything in this process, this node the whole ring.
    fn embedded(config: &Config, plugins: &Arc<PluginHost>) -> Self {
        let this_node = NodeId(config.node_id.unwrap_or(0));
        let topology = Arc::new(StaticTopology::new(&[this_node]));
        Self {
            this_node,
            clock: Arc::new(SystemClock),
            routes: Arc::new(MemoryRouteTable::default()),
            rooms: Arc::new(Rooms::default()),
            room_directory: Arc::new(MemoryRoomDirectory::default()),
            sessions: Arc::new(Sessions::default()),
            dedup: Arc::new(LocalDedup::new(
                Duration::from_millis(config.delivery.dedup_ttl_ms),
                config.delivery.dedup_max_marks,
            )),
            bus: Arc::new(LocalBus),
            router: Arc::new(Router::new(Arc::clone(plugins), topology, this_node)),
        }
    }

    /// Builds membership, delivery and the pipeline on these seams.
    pub(crate) fn services(
        &self,
        storage: Storage,
        settings: Settings,
        ids: Arc<SnowflakeGenerator>,
        plugins: &Arc<PluginHost>,
        vitals: &Arc<Vitals>,
    ) -> Services {
        let membership = Arc::new(Membership::new(
            Arc::clone(&storage.groups),
            Arc::clone(&self.rooms),
            Arc::clone(&self.bus),
            CachePolicy { ttl: settings.group_cache_ttl, idle: settings.known_direct_idle },
            settings.max_group_members,
        ));
        let lanes = Arc::new(Lanes::default());
        let reach = Reach {
            this_node: self.this_node,
            sessions: Arc::clone(&self.sessions),
            rooms: Arc::clone(&self.rooms),
            routes: Arc::clone(&self.routes),
            room_directory: Arc::clone(&self.room_directory),
            bus: Arc::clone(&self.bus),
        };
        let stores = DeliveryStores {
            messages: Arc::clone(&storage.messages),
            cursors: storage.cursors,
            conversations: Arc::clone(&storage.conversations),
            groups: storage.groups,
        };
        let frontier =
            OwnerFrontier { lanes: Arc::clone(&lanes), router: Arc::clone(&self.router), bus: Arc::clone(&self.bus) };
        let delivery = Arc::new(Delivery::new(
            settings.delivery,
            reach,
            Arc::clone(&membership),
            stores,
            Arc::new(frontier),
            Arc::clone(vitals),
            Arc::clone(plugins) as Arc<dyn crate::delivery::filter::RecipientFilter>,
        ));
        let pipeline = Arc::new(Pipeline::new(PipelineParts {
            writer: storage.writer,
            messages: storage.messages,
            conversations: storage.conversations,
            seqs: Arc::clone(&storage.seqs),
            ids,
            dedup: Arc::clone(&self.dedup),
            lanes: Arc::clone(&lanes),
            membership: Arc::clone(&membership),
            delivery: Arc::clone(&delivery),
            router: Arc::clone(&self.router),
            bus: Arc::clone(&self.bus),
            clock: Arc::clone(&self.clock),
            plugins: Arc::clone(plugins),
            vitals: Arc::clone(vitals),
            known_direct_idle: settings.known_direct_idle,
        }));
        Services { membership, delivery, pipeline, seqs: storage.seqs, lanes }
    }
}

/// The JWT secret, which only dev mode may go without.
fn required_secret(config: &Config) -> Result<Option<&str>, NodeError> {
    let secret = config.gateway.jwt_secret.as_deref().filter(|secret| !secret.is_empty());
    if secret.is_none() && !config.dev {
        return Err(NodeError::Config(
            "gateway.jwt_secret is required outside dev mode (HERALD_GATEWAY__JWT_SECRET); clients authenticate with HS256 tokens signed by it".into(),
        ));
    }
    Ok(config.gateway.jwt_secret.as_deref())
}

/// Connects to the configured database and brings its schema up to date.
async fn open_storage(config: &Config) -> Result<Database, NodeError> {
    let database = Database::connect(&config.database_url(), &config.storage).await?;
    let migrations = database.migrate().await?;
    tracing::info!(backend = ?database.backend(), migrations, "storage ready");
    Ok(database)
}

/// Sweeps idle conversations' seq segments (each goes at its [`SWEEPS_PER_IDLE`]th idle
/// sweep) and lanes left behind every `every`.
async fn forget_idle(seqs: Arc<SeqAllocator>, lanes: Arc<Lanes>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await; // the first tick is immediate
    loop {
        ticks.tick().await;
        let (forgotten, lanes_forgotten) = (seqs.evict_idle(), lanes.evict_idle());
        tracing::debug!(forgotten, lanes_forgotten, in_memory = seqs.conversations(), "idle conversations forgotten");
    }
}

/// Samples the node's health every `interval` and sets the delivery tier the degrade hook
/// chooses from it (the built-in default, when no plugin has the hook, is `normal`), at
/// least `offline-only` while the store's circuit breaker is not closed.
async fn watch_health(
    vitals: Arc<Vitals>,
    gateway: Arc<Gateway>,
    committer: GroupCommitter,
    plugins: Arc<PluginHost>,
    interval: Duration,
) {
    let mut sampler = Sampler::new();
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Beside the depths below, so an alert can put them over the limit whatever it is set to.
    metrics::gauge!("herald_gateway_send_queue_limit_frames").set(gateway.send_queue_limit() as f64);
    loop {
        every.tick().await;
        let depths = gateway.queue_depths();
        let sample = sampler.sample(&vitals, depths, committer.write_latency(), gateway.backlog());
        metrics::gauge!("herald_store_latency_p99_ms").set(f64::from(sample.health.store_latency_p99_ms));
        // The depths this sample already read: exported as the node's
        // deepest queue and its p99, so the writers pay nothing more and no series is kept
        // per connection.
        metrics::gauge!("herald_gateway_send_queue_max_frames").set(f64::from(sample.health.send_queue_depth_max));
        metrics::gauge!("herald_gateway_send_queue_p99_frames").set(f64::from(sample.health.send_queue_depth_p99));
        let (chosen, mut why) = if plugins.has_hook(Hook::Degrade) {
            let chosen = Tier::from(plugins.degrade(&hook_health(&sample.health)).await);
            (chosen, format!("the degrade hook chose {} from the last health sample", chosen.name()))
        } else {
            (Tier::Normal, "no plugin has the degrade hook".to_owned())
        };
        // A breaker is a health input of its own: while the database does not answer, no
        // retries (nothing new can be stored to push, and retries would only queue up).
        let breaker = committer.breaker().state();
        let tier = if breaker == BreakerState::Closed { chosen } else { chosen.max(Tier::OfflineOnly) };
        if tier != chosen {
            why = format!("the store's circuit breaker is {} (at least offline-only); {why}", breaker.name());
        }
        vitals.record(sample, tier, why);
    }
}

fn hook_health(health: &crate::health::Health) -> types::Health {
    types::Health {
        connections: health.connections,
        send_queue_depth_p99: health.send_queue_depth_p99,
        send_queue_depth_max: health.send_queue_depth_max,
        store_latency_p99_ms: health.store_latency_p99_ms,
        redelivery_ratio: health.redelivery_ratio,
        cpu_load: health.cpu_load,
        errors_per_second: health.errors_per_second,
    }
}
