//! One Herald node: every part wired together, chosen once at start-up from the config.
//!
//! Embedded mode (the only one so far) uses SQLite or a SQL server for storage and keeps
//! routes, rooms and dedup marks in this process.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dashmap::DashSet;
use tokio::sync::Semaphore;

use crate::clock::{SystemClock, WallClock};
use crate::config::Config;
use crate::delivery::Delivery;
use crate::delivery::cursors::CursorBuffer;
use crate::gateway::auth::Authenticator;
use crate::gateway::connection::Connections;
use crate::ids::{SeqAllocator, SnowflakeGenerator};
use crate::pipeline::Pipeline;
use crate::pipeline::dedup::Dedup;
use crate::pipeline::lanes::Lanes;
use crate::pipeline::membership::Membership;
use crate::plugins::Plugins;
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
    /// Next connection id.
    pub next_connection: AtomicU64,
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
        let dedup = Arc::new(Dedup::new(Duration::from_millis(config.delivery.dedup_ttl_ms)));
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
        });
        let pipeline = Arc::new(Pipeline {
            database: database.clone(),
            committer: committer.clone(),
            seqs,
            ids,
            dedup: Arc::clone(&dedup),
            lanes,
            membership: Arc::clone(&membership),
            delivery: Arc::clone(&delivery),
            clock: Arc::clone(&clock),
            known_direct: DashSet::new(),
            plugins: Arc::clone(&plugins.host),
        });
        tokio::spawn(Arc::clone(&delivery).flush_cursors_periodically());
        tokio::spawn(database.clone().checkpoint_periodically(Duration::from_millis(config.storage.sqlite_checkpoint_ms.max(10))));
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            loop {
                every.tick().await;
                dedup.sweep();
            }
        });
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
            next_connection: AtomicU64::new(1),
        }))
    }

    /// Closes every connection (1001), writes pending cursors and flushes queued inserts.
    pub async fn shut_down(&self) {
        self.connections.close_all(crate::gateway::connection::close::GOING_AWAY, "server shutting down");
        self.delivery.cursors.flush(&self.database).await;
    }
}
