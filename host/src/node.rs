//! One Herald node: every part wired together, chosen once at start-up from the config.
//!
//! Embedded mode (the only one so far) uses SQLite or a SQL server for storage and keeps
//! routes, rooms and dedup marks in this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashSet;
use tokio::sync::Semaphore;

use crate::clock::{SystemClock, WallClock};
use crate::config::Config;
use crate::delivery::Delivery;
use crate::delivery::cursors::CursorBuffer;
use crate::gateway::auth::Authenticator;
use crate::gateway::connection::Connections;
use crate::health::{Sampler, Tier, Vitals};
use crate::ids::{SeqAllocator, SnowflakeGenerator};
use crate::pipeline::Pipeline;
use crate::pipeline::dedup::Dedup;
use crate::pipeline::lanes::Lanes;
use crate::pipeline::membership::Membership;
use crate::plugins::{Hook, Plugins, types};
use crate::routing::ring::{DEFAULT_VIRTUAL_NODES, Ring};
use crate::routing::rooms::Rooms;
use crate::routing::{MemoryRouteTable, RouteTable};
use crate::store::{Database, GroupCommitter, StoreError};

/// Why a node could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Everything a running node shares between its connections and its HTTP API.
pub struct Node {
    pub config: Config,
    pub database: Database,
    pub committer: GroupCommitter,
    pub auth: Authenticator,
    pub clock: Arc<dyn WallClock>,
    pub routes: Arc<dyn RouteTable>,
    pub rooms: Arc<Rooms>,
    pub connections: Arc<Connections>,
    pub membership: Arc<Membership>,
    pub delivery: Arc<Delivery>,
    pub pipeline: Arc<Pipeline>,
    /// The Wasm plugins and their hot reload.
    pub plugins: Arc<Plugins>,
    /// Health counters, the last health sample and the delivery tier.
    pub vitals: Arc<Vitals>,
    /// Next connection id.
    pub next_connection: AtomicU64,
    /// Shutdown has begun: not ready, and connections are sent away.
    draining: AtomicBool,
}

impl Node {
    /// Opens storage (migrating it) and assembles the node; starts its background tasks.
    ///
    /// # Errors
    /// [`NodeError`] when storage cannot be opened or the configuration is unusable.
    pub async fn open(config: Config) -> Result<Arc<Self>, NodeError> {
        if !config.dev && config.gateway.jwt_secret.as_deref().is_none_or(str::is_empty) {
            return Err(NodeError::Config(
                "gateway.jwt_secret is required outside dev mode (HERALD_GATEWAY__JWT_SECRET); clients authenticate with HS256 tokens signed by it".into(),
            ));
        }
        crate::telemetry::install();
        let database = Database::connect(&config.database_url(), &config.storage).await?;
        let migrations = database.migrate().await?;
        tracing::info!(backend = ?database.backend(), migrations, "storage ready");
        let committer = GroupCommitter::start(database.clone(), &config.storage.group_commit);
        let plugins = Arc::new(
            Plugins::start(config.plugin_runtime.clone(), &config.plugins_dir())
                .await
                .map_err(|error| NodeError::Config(format!("plugin runtime: {error}")))?,
        );
        let ids = Arc::new(SnowflakeGenerator::new(config.node_id).map_err(|e| NodeError::Config(e.to_string()))?);
        let seqs = Arc::new(SeqAllocator::new(Arc::new(database.clone()), config.seq.clone()));
        let clock: Arc<dyn WallClock> = Arc::new(SystemClock);
        let routes: Arc<dyn RouteTable> = Arc::new(MemoryRouteTable::default());
        let rooms = Arc::new(Rooms::default());
        let connections = Arc::new(Connections::default());
        let membership = Arc::new(Membership::new(database.clone(), Arc::clone(&rooms)));
        let lanes = Arc::new(Lanes::default());
        let dedup =
            Arc::new(Dedup::new(Duration::from_millis(config.delivery.dedup_ttl_ms), config.delivery.dedup_max_marks));
        let vitals = Arc::new(Vitals::default());
        let delivery = Arc::new(Delivery {
            config: config.delivery.clone(),
            node_id: config.node_id,
            connections: Arc::clone(&connections),
            routes: Arc::clone(&routes),
            rooms: Arc::clone(&rooms),
            membership: Arc::clone(&membership),
            database: database.clone(),
            lanes: Arc::clone(&lanes),
            cursors: CursorBuffer::default(),
            backfill_permits: Semaphore::new(config.delivery.backfill_concurrency),
            vitals: Arc::clone(&vitals),
        });
        let pipeline = Arc::new(Pipeline {
            database: database.clone(),
            committer: committer.clone(),
            seqs: Arc::clone(&seqs),
            ids,
            dedup: Arc::clone(&dedup),
            lanes: Arc::clone(&lanes),
            membership: Arc::clone(&membership),
            delivery: Arc::clone(&delivery),
            clock: Arc::clone(&clock),
            known_direct: DashSet::new(),
            plugins: Arc::clone(&plugins.host),
            // Embedded mode: this node is the whole ring.
            ring: Ring::new(&[config.node_id], DEFAULT_VIRTUAL_NODES),
            node_id: config.node_id,
            vitals: Arc::clone(&vitals),
        });
        tokio::spawn(Arc::clone(&delivery).flush_cursors_periodically());
        tokio::spawn(
            database
                .clone()
                .checkpoint_periodically(Duration::from_millis(config.storage.sqlite_checkpoint_ms.max(10))),
        );
        tokio::spawn(watch_health(
            Arc::clone(&vitals),
            Arc::clone(&connections),
            committer.clone(),
            Arc::clone(&plugins.host),
            Duration::from_millis(config.delivery.degrade_interval_ms),
        ));
        let evict_every = config.seq.evict_idle;
        if !evict_every.is_zero() {
            tokio::spawn(async move {
                let mut every = tokio::time::interval(evict_every);
                every.tick().await; // the first tick is immediate
                loop {
                    every.tick().await;
                    let (forgotten, lanes_forgotten) = (seqs.evict_idle(), lanes.evict_idle());
                    tracing::debug!(
                        forgotten,
                        lanes_forgotten,
                        in_memory = seqs.conversations(),
                        "idle conversations forgotten"
                    );
                }
            });
        }
        Ok(Arc::new(Self {
            auth: Authenticator::new(config.gateway.jwt_secret.as_deref(), config.dev)
                .map_err(|error| NodeError::Config(error.to_string()))?,
            config,
            database,
            committer,
            clock,
            routes,
            rooms,
            connections,
            membership,
            delivery,
            pipeline,
            plugins,
            vitals,
            next_connection: AtomicU64::new(1),
            draining: AtomicBool::new(false),
        }))
    }

    /// Starts draining: `/readyz` answers 503, every connection (and any that finishes its
    /// handshake from now on) gets `go_away` and is closed with 1012; then writes pending
    /// cursors. Queued inserts are flushed by the caller, after the listener stopped.
    pub async fn shut_down(&self) {
        self.draining.store(true, Ordering::SeqCst);
        let sent_away = self.connections.go_away_all(crate::gateway::DRAINING, self.config.gateway.go_away_spread_ms);
        // Let the writers put `go_away` and the close frame on the wire before the process
        // ends; a client that stopped reading does not hold shutdown up for long.
        let written = futures_util::future::join_all(sent_away.iter().map(|c| c.writer_finished()));
        if tokio::time::timeout(Duration::from_secs(2), written).await.is_err() {
            tracing::warn!("some connections did not take their go_away within 2 s");
        }
        self.delivery.cursors.flush(&self.database).await;
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// Samples the node's health every `interval` and sets the delivery tier the degrade hook
/// chooses from it (the built-in default, when no plugin has the hook, is `normal`).
async fn watch_health(
    vitals: Arc<Vitals>,
    connections: Arc<Connections>,
    committer: GroupCommitter,
    plugins: Arc<crate::plugins::PluginHost>,
    interval: Duration,
) {
    let mut sampler = Sampler::new();
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let health = sampler.sample(&vitals, connections.queue_depths(), committer.write_latency());
        metrics::gauge!("herald_connections").set(health.connections as f64);
        metrics::gauge!("herald_store_latency_p99_ms").set(f64::from(health.store_latency_p99_ms));
        let tier = if plugins.has_hook(Hook::Degrade) {
            tier_of(plugins.degrade(&hook_health(&health)).await)
        } else {
            Tier::Normal
        };
        vitals.record(health, tier);
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

fn tier_of(tier: types::Tier) -> Tier {
    match tier {
        types::Tier::Normal => Tier::Normal,
        types::Tier::OfflineOnly => Tier::OfflineOnly,
        types::Tier::NoBackfill => Tier::NoBackfill,
        types::Tier::PullOnly => Tier::PullOnly,
    }
}
