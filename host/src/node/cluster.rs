//! Cluster mode's assembly: joining the cluster, the Redis seams and the node-to-node
//! links, and the loops that keep this node's view of the cluster current.
//!
//! Start-up order matters: the peer listener is bound first (the address this node
//! advertises must accept links as soon as others see its lease), then the node id is
//! leased (it names every snowflake id), then the seams are built on it; the peer server
//! starts once the services exist. At shutdown the lease is given up last, after the
//! writers have committed what was queued, so no other node takes a conversation over
//! while this one still commits for it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{NodeError, Seams};
use crate::breaker::{Breaker, BreakerState, BreakerStatus};
use crate::clock::{SystemClock, WallClock};
use crate::cluster::client_urls::{check_client_url, client_address, client_url};
use crate::cluster::membership::{MembershipSettings, RedisMembership};
use crate::cluster::peer::{PeerBus, PeerHandler, PeerSecret, PeerServer, PeerTimeouts};
use crate::cluster::plugin_notices::RedisNotices;
use crate::cluster::{
    ClientUrls, KeyPrefix, MarkLifetimes, RedisConnection, RedisDedup, RedisLedgers, RedisPluginKv, RedisRateLimiter,
    RedisRoomDirectory, RedisRouteTable, RedisTimeouts, RouteLifetimes,
};
use crate::config::Config;
use crate::delivery::sessions::Sessions;
use crate::ids::SeqAllocator;
use crate::model::{NodeId, UserId};
use crate::plugins::{Hook, LiveNodes, PluginHost, PluginKv, RateLimiter, RegistryWiring};
use crate::routing::cache::{CacheLifetimes, CachedRoutes};
use crate::routing::rooms::{RoomDirectory, Rooms};
use crate::routing::router::Router;
use crate::routing::topology::Topology;
use crate::routing::{Route, RouteTable};
use crate::store::PluginRegistryStore;
use crate::tls::Tls;
use herald_plugin_runtime::KvLimits;

/// Most users whose routes are cached (a few hundred bytes each).
const ROUTE_CACHE_USERS: u64 = 1_000_000;
/// How many times the routes and rooms Redis lost are written again before giving up (the
/// devices concerned still sync, and their next login writes their route).
const REASSERT_ATTEMPTS: u32 = 30;
/// The pause between those attempts.
const REASSERT_RETRY: Duration = Duration::from_secs(1);
/// How often the routes and rooms of this node are written again even when no data loss
/// was seen (only the missing ones are: `HSETNX`, `SADD`).
const REASSERT_EVERY: Duration = Duration::from_secs(30);

/// This node's part in a cluster: its lease, the shared Redis seams and its peer links.
pub struct Cluster {
    /// The lease, the members and the ring.
    pub membership: Arc<RedisMembership>,
    /// Kept to drop a dead node's routes.
    routes: Arc<RedisRouteTable>,
    /// The route table the services use: `routes` behind a short local cache.
    pub cached_routes: Arc<CachedRoutes>,
    /// The node-to-node links.
    bus: Arc<PeerBus>,
    /// Shared by every Redis seam of this node.
    redis: RedisConnection,
    keys: KeyPrefix,
    secret: PeerSecret,
    timeouts: PeerTimeouts,
    /// Node-to-node links over TLS when set (`[tls]`).
    tls: Option<Tls>,
    /// Bound at join, served once the services exist.
    listener: Mutex<Option<TcpListener>>,
    /// Where the listener is bound.
    pub peer_listen: SocketAddr,
    /// Where the other nodes find the URL clients reach each node at.
    client_urls: ClientUrls,
    /// The URL this node published for its clients: from the time it accepts connections
    /// until it starts draining (written again after Redis lost its data).
    published_url: Mutex<Option<String>>,
}

/// What this node holds that Redis must know: its connections and room subscriptions.
pub(super) struct HeldHere {
    pub sessions: Arc<Sessions>,
    pub rooms: Arc<Rooms>,
    pub room_directory: Arc<dyn RoomDirectory>,
    pub clock: Arc<dyn WallClock>,
}

/// What `/admin/cluster` shows of this node's membership.
#[derive(Debug, serde::Serialize)]
pub struct ClusterStatus {
    pub advertise: SocketAddr,
    pub peer_listen: SocketAddr,
    /// Whether this node's lease is certainly still its own.
    pub holds_lease: bool,
    /// The live members and the addresses they advertise.
    pub members: Vec<(NodeId, SocketAddr)>,
    /// The breaker on Redis, then one per peer called so far.
    pub breakers: Vec<BreakerStatus>,
}

impl Cluster {
    /// Connects to Redis, binds the peer listener and leases a node id, moving the ring's
    /// epoch above `epoch_floor` (the highest owner epoch the database holds). `listening`
    /// is where the gateway is bound: with `cluster.client_url` unset, the address nginx's
    /// upstream lists this node at.
    ///
    /// # Errors
    /// [`NodeError`] naming what failed: Redis unreachable ([`NodeError::Redis`]), the peer
    /// address taken ([`NodeError::PeerListen`]), a pinned node id held by a live node or
    /// shared settings (`cluster.virtual_nodes`, `cluster.placement`) other than the
    /// cluster's ([`NodeError::Membership`]), an unusable secret or client URL
    /// ([`NodeError::Config`]).
    pub async fn join(
        config: &Config,
        tls: Option<Tls>,
        epoch_floor: u64,
        listening: SocketAddr,
    ) -> Result<Self, NodeError> {
        let settings = &config.cluster;
        let refuse = |what: String| NodeError::Config(what);
        let url = settings.redis_url.as_deref().unwrap_or_default();
        let secret = settings
            .secret(config.dev)
            .ok_or_else(|| refuse("cluster.secret is required outside dev mode".into()))
            .and_then(|secret| PeerSecret::new(secret).map_err(|error| refuse(error.to_string())))?;
        let keys =
            KeyPrefix::new(&settings.key_prefix).map_err(|error| refuse(format!("cluster.key_prefix: {error}")))?;
        if let Some(url) = settings.client_url.as_deref() {
            check_client_url(url).map_err(|error| refuse(error.to_string()))?;
        }
        let redis = RedisConnection::connect(url, settings.lease_ttl())
            .await
            .map_err(|error| NodeError::Redis(Box::new(error)))?;
        let bind_failed = |source| NodeError::PeerListen { addr: settings.peer_listen, source };
        let listener = TcpListener::bind(settings.peer_listen).await.map_err(bind_failed)?;
        let peer_listen = listener.local_addr().map_err(bind_failed)?;
        // A port of 0 (tests) advertises the port it was given.
        let advertise = match settings.advertise {
            Some(advertise) => advertise,
            None => peer_listen,
        };
        let membership_settings = MembershipSettings {
            pinned: config.node_id.map(NodeId),
            virtual_nodes: settings.virtual_nodes,
            placement: settings.placement,
            client: client_url(settings.client_url.as_deref(), listening).as_deref().and_then(client_address),
            epoch_floor,
            ..MembershipSettings::new(advertise).with_lease_ttl(settings.lease_ttl())
        };
        // The lease has a connection of its own, without a breaker (crate::breaker): its
        // renewals must never queue behind the seams' traffic on a multiplexed socket (under
        // overload they ran late there and fenced healthy nodes), nor be refused by a breaker
        // a few slow lookups opened. Redis serves its clients in turn, so this one is heard.
        let lease_redis = RedisConnection::connect(url, settings.lease_ttl())
            .await
            .map_err(|error| NodeError::Redis(Box::new(error)))?;
        let membership = RedisMembership::join(lease_redis, keys.clone(), membership_settings)
            .await
            .map_err(|error| NodeError::Membership(Box::new(error)))?;
        let redis = redis.with_breaker(Breaker::new("redis", settings.breaker()));
        // A route lives as long as a silent connection may: its node's upkeep refreshes it
        // three times in that while, and a connection past it is closed (its logout removes
        // the route) or its node is gone.
        let lifetimes = RouteLifetimes { ttl: Duration::from_millis(config.gateway.client_timeout_ms) };
        let routes = Arc::new(
            RedisRouteTable::new(redis.clone(), keys.clone(), RedisTimeouts::default()).with_lifetimes(lifetimes),
        );
        let this_node = membership.this_node();
        // Routes an earlier process with this id left behind (it was killed) are ghosts.
        match routes.drop_node(this_node).await {
            Ok(0) => {}
            Ok(dropped) => tracing::info!(%this_node, dropped, "dropped the routes of this node id's previous life"),
            Err(error) => tracing::warn!(%this_node, %error, "could not drop old routes of this node id"),
        }
        let links = if tls.is_some() { "tls" } else { "plain text" };
        tracing::info!(%this_node, %advertise, %peer_listen, links, "cluster mode");
        if tls.is_none() && !settings.links_stay_on_loopback() {
            // Allowed by cluster.plaintext_peers only (Config::validate): say so where an
            // operator reading the start-up lines will see it.
            tracing::warn!("node-to-node links leave loopback in plain text (cluster.plaintext_peers = true)");
        }
        let timeouts = PeerTimeouts::default();
        let bus = Arc::new(
            PeerBus::new(this_node, secret.clone(), Arc::clone(&membership) as _, timeouts)
                .with_breakers(settings.breaker())
                .with_tls(tls.clone()),
        );
        let lifetimes = CacheLifetimes { fresh: settings.route_cache_ttl(), stale: settings.route_cache_stale() };
        let cached_routes = Arc::new(CachedRoutes::new(Arc::clone(&routes) as _, lifetimes, ROUTE_CACHE_USERS));
        cached_routes.announce_to(Arc::clone(&bus) as _);
        let client_urls = ClientUrls::new(redis.clone(), keys.clone(), RedisTimeouts::default());
        Ok(Self {
            membership,
            routes,
            cached_routes,
            bus,
            redis,
            keys,
            secret,
            timeouts,
            tls,
            listener: Mutex::new(Some(listener)),
            peer_listen,
            client_urls,
            published_url: Mutex::new(None),
        })
    }

    /// How this node follows the plugin registry: notices over Redis pub/sub, and the
    /// live members as the nodes a deploy waits for.
    pub(super) fn plugin_registry(&self, config: &Config, store: Arc<dyn PluginRegistryStore>) -> RegistryWiring {
        let url = config.cluster.redis_url.as_deref().unwrap_or_default();
        let notices = RedisNotices::start(self.redis.clone(), &self.keys, url, config.plugin_registry.notices);
        let membership = Arc::clone(&self.membership);
        let live: LiveNodes = Arc::new(move || membership.members().into_iter().map(|(node, _)| node).collect());
        RegistryWiring::new(config, store, notices, live, self.this_node())
    }

    /// The plugin KV and rate limiter every node shares.
    pub(super) fn plugin_state(&self) -> (Arc<dyn PluginKv>, Arc<dyn RateLimiter>) {
        let timeouts = RedisTimeouts::default();
        let kv = RedisPluginKv::new(self.redis.clone(), self.keys.clone(), timeouts, KvLimits::default());
        (Arc::new(kv), Arc::new(RedisRateLimiter::new(self.redis.clone(), self.keys.clone(), timeouts)))
    }

    /// The node id this node leased.
    pub fn this_node(&self) -> NodeId {
        self.membership.this_node()
    }

    /// The seams of a cluster node: Redis for routes, rooms and dedup marks, the
    /// membership's ring, node-to-node links for the bus.
    pub(super) fn seams(&self, config: &Config, plugins: &Arc<PluginHost>) -> Seams {
        let this_node = self.this_node();
        let timeouts = RedisTimeouts::default();
        let (redis, keys) = (&self.redis, &self.keys);
        let lifetimes = MarkLifetimes::with_ttl(Duration::from_millis(config.delivery.dedup_ttl_ms));
        let topology: Arc<RedisMembership> = Arc::clone(&self.membership);
        Seams {
            this_node,
            clock: Arc::new(SystemClock),
            routes: Arc::clone(&self.cached_routes) as _,
            rooms: Arc::new(Rooms::default()),
            room_directory: Arc::new(RedisRoomDirectory::new(redis.clone(), keys.clone(), timeouts)),
            sessions: Arc::new(Sessions::default()),
            dedup: Arc::new(RedisDedup::new(redis.clone(), keys.clone(), timeouts, lifetimes)),
            bus: Arc::clone(&self.bus) as _,
            router: Arc::new(Router::new(Arc::clone(plugins), topology, this_node)),
        }
    }

    /// Serves node-to-node links with `handler` until `stop` turns true.
    pub(super) fn serve_peers(&self, handler: Arc<dyn PeerHandler>, stop: watch::Receiver<bool>) {
        let Some(listener) = self.listener.lock().unwrap_or_else(PoisonError::into_inner).take() else { return };
        let server =
            PeerServer::new(self.this_node(), self.secret.clone(), handler, self.timeouts).with_tls(self.tls.clone());
        tokio::spawn(server.serve(listener, stop));
    }

    /// What `/admin/cluster` shows.
    pub fn status(&self) -> ClusterStatus {
        ClusterStatus {
            advertise: self.membership.address_of(self.this_node()).unwrap_or(self.peer_listen),
            peer_listen: self.peer_listen,
            holds_lease: self.membership.holds_lease(),
            members: self.membership.members(),
            breakers: self.redis.breaker().map(Breaker::status).into_iter().chain(self.bus.breakers()).collect(),
        }
    }

    /// Whether Redis is answering as far as this node knows: false while its breaker is
    /// open (`/readyz`).
    pub fn redis_available(&self) -> bool {
        self.redis.breaker().is_none_or(|breaker| breaker.state() != BreakerState::Open)
    }

    /// Whether this node may act for its conversations (`/readyz`).
    pub fn holds_lease(&self) -> bool {
        self.membership.holds_lease()
    }

    /// Publishes the URL clients reach this node at, once it accepts connections (never
    /// earlier: a draining node must not send clients to a node that would refuse them):
    /// `configured` (`cluster.client_url`), or one built from `listening`, the address the
    /// gateway is bound to. A failure is logged and the node serves all the same; draining
    /// nodes just send it no clients until the URL is written again.
    pub async fn serve_clients_at(&self, configured: Option<&str>, listening: SocketAddr) {
        let Some(url) = client_url(configured, listening) else {
            tracing::warn!(
                %listening,
                "listen is a wildcard address, which clients cannot dial: set cluster.client_url \
                 (HERALD_CLUSTER__CLIENT_URL) so that draining nodes can send their clients here"
            );
            return;
        };
        *self.published_url.lock().unwrap_or_else(PoisonError::into_inner) = Some(url.clone());
        match self.client_urls.publish(self.this_node(), &url).await {
            Ok(()) => tracing::info!(%url, "clients reach this node at this URL"),
            Err(error) => tracing::warn!(%url, %error, "could not publish this node's client URL"),
        }
    }

    /// Where this node saves its devices' ledgers, to take them back after a restart: in
    /// Redis under the address its clients reach it at. `None` without one (then it is no
    /// user's home, and nobody's devices come back to it by design).
    pub fn ledger_store(&self) -> Option<RedisLedgers> {
        let this_node = self.this_node();
        let client = self.membership.client_addresses().into_iter().find(|(node, _)| *node == this_node)?.1?;
        Some(RedisLedgers::new(self.redis.clone(), self.keys.clone(), RedisTimeouts::default(), client))
    }

    /// At the start of a drain: withdraws this node's client URL (so that no other node
    /// draining at the same time sends clients here) and returns the client URLs of the
    /// other live members, for this node's `go_away`s. Empty when Redis does not answer in
    /// time (each step waits at most its write deadline) or no other member published one.
    pub async fn redirect_targets(&self) -> Vec<String> {
        if !self.withdraw_client_url().await {
            return Vec::new(); // Redis did not answer: reading it would only wait as long again.
        }
        let this_node = self.this_node();
        let others: BTreeSet<NodeId> =
            self.membership.members().into_iter().map(|(node, _)| node).filter(|node| *node != this_node).collect();
        match self.client_urls.all().await {
            // An entry of a node without a live lease is left over from a killed process.
            Ok(urls) => {
                let targets: Vec<String> =
                    urls.into_iter().filter(|(node, _)| others.contains(node)).map(|(_, url)| url).collect();
                tracing::info!(nodes = targets.len(), "draining: clients are sent to the other nodes");
                targets
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the other nodes' client URLs; clients reconnect to this address");
                Vec::new()
            }
        }
    }

    /// Removes this node's client URL from Redis; returns whether Redis answered.
    async fn withdraw_client_url(&self) -> bool {
        self.published_url.lock().unwrap_or_else(PoisonError::into_inner).take();
        match self.client_urls.withdraw(self.this_node()).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "could not withdraw this node's client URL");
                false
            }
        }
    }

    /// Gives the lease up (the others take this node's conversations over at once) and
    /// removes this node's client URL and routes.
    pub async fn leave(&self) {
        // A lease lost for good may be another process's now: its routes are not ours to drop.
        let held = self.membership.holds_lease();
        if held {
            self.withdraw_client_url().await;
        }
        if let Err(error) = self.membership.leave().await {
            tracing::warn!(%error, "could not give the lease up; it lapses by itself");
        }
        if held && let Err(error) = self.routes.drop_node(self.this_node()).await {
            tracing::warn!(%error, "could not remove this node's routes");
        }
    }

    /// Every `every` (a third of a route's lifetime), refreshes the routes of this node's connections in
    /// Redis and removes those it left behind ([`RedisRouteTable::keep_alive`]). Runs until
    /// the node stops.
    pub(super) async fn keep_routes(self: Arc<Self>, sessions: Arc<Sessions>, every: Duration) {
        let this_node = self.this_node();
        let mut suspects = HashSet::new();
        let mut rounds = tokio::time::interval_at(Instant::now() + every, every);
        rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            rounds.tick().await;
            let mut live: Vec<NodeId> = self.membership.members().into_iter().map(|(node, _)| node).collect();
            live.push(this_node);
            let holds = |user: &UserId, connection| sessions.holds(user, connection);
            match self.routes.keep_alive(this_node, &live, holds, &mut suspects).await {
                Ok(upkeep) if upkeep.left_behind > 0 || upkeep.of_departed_nodes > 0 => {
                    tracing::info!(?upkeep, "removed routes whose connections are gone");
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "could not refresh this node's routes in Redis"),
            }
        }
    }

    /// Each time Redis is found to have lost its data (FLUSHALL, a restart without
    /// persistence), writes again what this node keeps there: the route of every open
    /// connection (unless a newer connection of the device wrote one meanwhile), this
    /// node's entry for every room it has subscribers of, and its client URL. The lease
    /// itself is re-taken by the membership's heartbeat, which is what signals the loss.
    /// Also every [`REASSERT_EVERY`], quietly, for a loss no one signalled (a master of a
    /// Redis Cluster failing over without the generation key). Runs until the node stops.
    pub(super) async fn reassert_after_data_loss(self: Arc<Self>, held: HeldHere) {
        let mut losses = self.membership.data_lost();
        let this_node = self.this_node();
        let mut rounds = tokio::time::interval_at(Instant::now() + REASSERT_EVERY, REASSERT_EVERY);
        rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                lost = losses.changed() => {
                    if lost.is_err() {
                        return;
                    }
                    // The lease's call just got through, so Redis answers again: no need to
                    // wait out a breaker its outage opened before writing back what it lost.
                    if let Some(breaker) = self.redis.breaker() {
                        breaker.reset();
                    }
                }
                _ = rounds.tick() => {
                    // A Redis Cluster master that lost writes without holding the generation
                    // key goes unnoticed by the lease: a quiet round finds what it lost.
                    let (routes, rooms, failed) = self.write_again(&held, this_node).await;
                    if routes > 0 || failed > 0 {
                        tracing::warn!(routes, failed, rooms, "routes were missing from Redis and are written again");
                    }
                    continue;
                }
            }
            for attempt in 1..=REASSERT_ATTEMPTS {
                let (routes, rooms, failed) = self.write_again(&held, this_node).await;
                tracing::warn!(
                    routes,
                    rooms,
                    failed,
                    attempt,
                    "Redis had lost its data; this node's routes and rooms are written again"
                );
                if failed == 0 {
                    break;
                }
                tokio::time::sleep(REASSERT_RETRY).await;
            }
        }
    }

    /// Writes this node's routes, room entries and client URL again; returns how many routes it wrote
    /// (those a newer connection had not replaced), rooms it wrote, and writes that failed.
    async fn write_again(&self, held: &HeldHere, this_node: NodeId) -> (usize, usize, usize) {
        let (mut routes, mut rooms, mut failed) = (0, 0, 0);
        let mut users = Vec::new();
        for session in held.sessions.all() {
            let route = Route {
                user: session.user.clone(),
                device: session.device.clone(),
                node: this_node,
                connection: session.id,
                connected_at_ms: held.clock.now_ms(),
                parked: false,
            };
            match self.cached_routes.restore(route.clone()).await {
                Ok(false) => {}
                Ok(true) if held.sessions.get(session.id).is_none() => {
                    // It closed meanwhile, and its logout may have run before the restore.
                    let _ = self.cached_routes.forget_stale(&route).await;
                }
                Ok(true) => {
                    routes += 1;
                    users.push(session.user.clone());
                }
                Err(_) => failed += 1,
            }
        }
        // Other nodes may have cached "no device" while these routes were missing.
        if !users.is_empty() {
            self.cached_routes.announce(&users).await;
        }
        for room in held.rooms.rooms() {
            match held.room_directory.joined(&room, this_node).await {
                Ok(()) => rooms += 1,
                Err(_) => failed += 1,
            }
        }
        let published = self.published_url.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(url) = published
            && self.client_urls.publish(this_node, &url).await.is_err()
        {
            failed += 1;
        }
        (routes, rooms, failed)
    }

    /// Follows ring changes: forgets the seq segments of conversations this node no longer
    /// owns and the cached routes (they may name a node that left). The routes of a node
    /// that left are removed once it has been gone for two lease TTLs — not at once: while
    /// the leases are re-asserted after Redis lost its data, views briefly lack live nodes,
    /// whose routes must not be dropped. Its devices reconnect elsewhere meanwhile. Runs
    /// until the node stops.
    pub(super) async fn follow_ring(
        self: Arc<Self>,
        plugins: Arc<PluginHost>,
        seqs: Arc<SeqAllocator>,
        lease_ttl: Duration,
    ) {
        let this_node = self.this_node();
        let mut epochs = self.membership.subscribe();
        let members_now = || self.membership.members().into_iter().map(|(node, _)| node).collect::<BTreeSet<NodeId>>();
        let mut known = members_now();
        let mut departed: HashMap<NodeId, Instant> = HashMap::new();
        let mut sweep = tokio::time::interval(lease_ttl / 2);
        loop {
            tokio::select! {
                changed = epochs.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let members = members_now();
                    if members != known {
                        self.cached_routes.clear();
                    }
                    // With a route-key hook the owner is the hook's to say: segments are kept,
                    // and a stale one is refused at commit by the fence in `session_seq`.
                    let forgotten = if plugins.has_hook(Hook::RouteKey) {
                        0
                    } else {
                        let view = self.membership.view();
                        seqs.retain(|conversation| view.owner(conversation.as_str()) == Some(this_node))
                    };
                    tracing::info!(epoch = *epochs.borrow(), members = ?members, forgotten, "the ring changed");
                    for gone in known.difference(&members) {
                        departed.entry(*gone).or_insert_with(Instant::now);
                    }
                    departed.retain(|node, _| !members.contains(node));
                    known = members;
                }
                _ = sweep.tick() => {
                    let due: Vec<NodeId> =
                        departed.iter().filter(|(_, since)| since.elapsed() >= lease_ttl * 2).map(|(node, _)| *node).collect();
                    for gone in due {
                        departed.remove(&gone);
                        match self.routes.drop_node(gone).await {
                            Ok(dropped) => tracing::info!(node = %gone, dropped, "a node left; its routes are removed"),
                            Err(error) => tracing::warn!(node = %gone, %error, "could not remove a departed node's routes"),
                        }
                    }
                }
            }
        }
    }
}
