//! Cluster membership: which nodes are alive, which node id each holds, where peers reach
//! it, and the ring every node builds from that — the cluster implementation of
//! [`Topology`].
//!
//! # Leases
//!
//! A node id is *leased* in Redis: held for a TTL (`lease_ttl`, 3 s by default) and renewed
//! by a heartbeat (every `lease_ttl / 3`). A node joins with the id it was pinned to
//! (`HERALD_NODE_ID`), refused with [`JoinError::Clash`] while another live node holds it,
//! or with the lowest free id in `0..=MAX_NODE_ID`. Taking a lease is one Lua script that
//! writes only if no live lease holds the id (SET NX semantics) and records a random token
//! of this instance as the holder, so two processes never hold one id at once. Keys (all
//! tagged `{cluster}`, so every script runs in one Redis Cluster slot):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `node:{cluster}:leases` | sorted set | node id, scored by its lease's expiry (ms, Redis's clock) |
//! | `node:{cluster}:holders` | hash | node id → `<advertise>\|<instance token>\|<client address>` |
//! | `node:{cluster}:epoch` | string | the counter every membership change increments |
//! | `node:{cluster}:generation` | string | a random name of Redis's data set (see below) |
//! | `node:{cluster}:settings` | string | the settings every node must share (see below) |
//!
//! Expiry is measured by Redis's clock (`TIME` inside the scripts), so no node's clock can
//! expire another's lease early. Each node runs the view script every `poll` (250 ms):
//! it removes lapsed leases — incrementing the epoch when it removes any — and returns the
//! epoch with the live members. Every change of members (join, leave, lapse) increments the
//! epoch in the same atomic step, so an epoch names one member set; and every node builds
//! [`Ring::new`](crate::routing::ring::Ring::new) from the same set, so all nodes that are at an epoch agree on every owner.
//! A node sees a change within one `poll` plus one round trip.
//!
//! A join also compares the settings every node must share — `cluster.virtual_nodes` (else
//! nodes build different rings) and `cluster.placement` (else they name different homes) —
//! with those stored at `settings`, in the same script: a join that finds no live lease
//! stores its own; any other join with different values is refused
//! ([`JoinError::Mismatch`], naming both values of each).
//!
//! # Fencing
//!
//! A node must stop acting as the holder of its id (allocating seqs, committing as owner)
//! *before* any other node can see its lease expired — even when it cannot reach Redis and
//! hears from no one. It works this out alone, from its own monotonic clock:
//!
//! - Let `s` be when the node *sent* its last successful renew (or its join). Redis ran it
//!   at some later moment `r ≥ s` and set the expiry to its "now" at `r` plus `ttl`.
//! - No other node can take over before a script, run by Redis, finds Redis's clock past
//!   that expiry: not before `r + ttl ≥ s + ttl`.
//! - The node stops at `s + ttl − margin` (`fence_margin`, `ttl / 5` by default):
//!   [`RedisMembership::holds_lease`] is false from that instant, and
//!   [`RedisMembership::fenced`] turns true then (give or take a scheduling delay).
//!
//! So at least `margin` separates the old holder stopping from anyone else starting, however
//! the network, Redis or the renews fail. The margin absorbs the two clocks running at
//! slightly different rates, a forward step of Redis's wall clock smaller than it, and the
//! node's own time to stop. A renew that answers after the node fenced itself, while Redis
//! still held the lease, makes it valid again: the lease never lapsed, so no one took over.
//! A renew that finds the lease lapsed or held by another instance loses it for good; the
//! node must then stop and join again.
//!
//! # Failures
//!
//! Joining and leaving wait at most one lease TTL for Redis, a renew and a view read at most
//! one heartbeat. A join that fails is [`JoinError::Redis`]; a renew that fails is retried
//! at the next heartbeat until the lease's validity runs out (then the node is fenced); a
//! view read that fails keeps the last view. Lasting failures are logged once per 5 s.
//!
//! # Redis losing its data
//!
//! FLUSHALL, or a restart without persistence, forgets every lease. The `generation` key
//! names the data set; a renew that finds its lease *and* the
//! generation it was taken in gone knows Redis forgot the lease (a lapsed lease is removed
//! without touching the generation) and takes it again if the id is still free, raising
//! the epoch above any the node saw. So every node re-asserts itself within one heartbeat,
//! and epochs never go back while one node survives; views older than the ring in force
//! are ignored meanwhile. Nor when none survives: a join counts from the highest owner
//! epoch in the database at least ([`MembershipSettings::epoch_floor`]), so the first
//! ring after a full restart on an emptied Redis is newer than any owner the
//! `session_seq` rows name. A node that joined in between may hold the id: then the old
//! holder's lease is lost.
//!
//! # What leases cannot cover
//!
//! What the owner's commits must therefore check against the database (an owner epoch in
//! `session_seq`): a node stalled (SIGSTOP, a VM pause) in the middle of an operation it
//! began while it held the lease, which completes it after another owner took over; the
//! time between a ring change and every node installing it (one `poll`), when a new owner
//! may start before the old one has seen the change; and the window after Redis lost its
//! data, before the leases are re-asserted.

mod lease;
mod registry;
mod tasks;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use self::lease::LeaseClock;
use self::registry::{Joined, Member, Registry};
use self::tasks::snapshot;
use super::peer::PeerAddresses;
use super::{KeyPrefix, RedisConnection, RedisFailure};
use crate::config::Placement;
use crate::model::{MAX_NODE_ID, NodeId};
use crate::routing::ring::DEFAULT_VIRTUAL_NODES;
use crate::routing::topology::{RingView, Topology};

/// How often a lasting failure (Redis unreachable) is logged at most.
const COMPLAIN_EVERY: Duration = Duration::from_secs(5);

/// How a node takes part in membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipSettings {
    /// What other nodes connect to for node-to-node links (`cluster.advertise`).
    pub advertise: SocketAddr,
    /// How long a lease lives without a renew: the longest a dead node's conversations
    /// wait for a new owner. 3 s by default; the issue asks for at most 5 s.
    pub lease_ttl: Duration,
    /// How often the lease is renewed (`lease_ttl / 3` by default).
    pub heartbeat: Duration,
    /// How long before the lease's TTL since the last renew the node stops acting as its
    /// holder (`lease_ttl / 5` by default; see the module doc).
    pub fence_margin: Duration,
    /// How often the member list is read from Redis (250 ms by default).
    pub poll: Duration,
    /// The node id to lease (`HERALD_NODE_ID`); `None` leases the lowest free one.
    pub pinned: Option<NodeId>,
    /// Points per node on the ring; every node of a cluster must use the same count
    /// (checked at join).
    pub virtual_nodes: u32,
    /// How users get home nodes (`cluster.placement`); the same on every node (checked at
    /// join).
    pub placement: Placement,
    /// Where clients reach this node (`host:port`), listed in nginx's upstream; `None`
    /// when clients cannot dial it directly (then it is no user's home).
    pub client: Option<String>,
    /// The epoch a join counts from at least: the highest owner epoch the database holds
    /// ([`Database::highest_owner_epoch`](crate::store::Database::highest_owner_epoch)), so
    /// epochs never go back after Redis lost its data while no node ran. 0 by default.
    pub epoch_floor: u64,
}

impl MembershipSettings {
    /// The defaults, advertising `advertise`.
    pub fn new(advertise: SocketAddr) -> Self {
        Self {
            advertise,
            lease_ttl: Duration::ZERO,
            heartbeat: Duration::ZERO,
            fence_margin: Duration::ZERO,
            poll: Duration::from_millis(250),
            pinned: None,
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
            placement: Placement::None,
            client: None,
            epoch_floor: 0,
        }
        .with_lease_ttl(Duration::from_secs(3))
    }

    /// Leases of `lease_ttl`, with the heartbeat (a third of it) and the fence margin (a
    /// fifth) that go with it.
    #[must_use]
    pub fn with_lease_ttl(self, lease_ttl: Duration) -> Self {
        Self { lease_ttl, heartbeat: lease_ttl / 3, fence_margin: lease_ttl / 5, ..self }
    }

    fn check(&self) -> Result<(), JoinError> {
        let (lease_ttl, heartbeat, fence_margin, poll) = (self.lease_ttl, self.heartbeat, self.fence_margin, self.poll);
        let refuse = |reason: String| Err(JoinError::Settings(reason));
        if heartbeat.is_zero() || poll.is_zero() {
            return refuse(format!("heartbeat ({heartbeat:?}) and poll ({poll:?}) must be longer than zero"));
        }
        if heartbeat + fence_margin >= lease_ttl {
            return refuse(format!(
                "heartbeat ({heartbeat:?}) plus fence_margin ({fence_margin:?}) must be shorter than lease_ttl \
                 ({lease_ttl:?}), or the node fences itself between two renews; shorten the heartbeat"
            ));
        }
        if let Some(node) = self.pinned.filter(|node| node.0 > u32::from(MAX_NODE_ID)) {
            return refuse(format!("node id {node} is out of range; it must be 0..={MAX_NODE_ID}"));
        }
        Ok(())
    }

    /// The settings every node of a cluster must share, as compared at join.
    fn shared(&self) -> String {
        format!("virtual_nodes={} placement={}", self.virtual_nodes, self.placement)
    }
}

/// Joining the cluster failed; the node must not start.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(
        "node id {node} is held by the live node at {holder}; it becomes free when that node leaves, or once its \
         lease lapses (one lease TTL after it stops renewing). Pin another HERALD_NODE_ID, or unset it to lease a \
         free id"
    )]
    Clash { node: NodeId, holder: String },
    #[error("every node id (0..={MAX_NODE_ID}) is leased by a live node; no node can join until one leaves")]
    Full,
    #[error("cannot join the cluster: {0}")]
    Redis(#[from] RedisFailure),
    #[error("invalid cluster membership settings: {0}")]
    Settings(String),
    #[error(
        "this node's settings differ from the cluster's: {differences}. Every node of a cluster must use the same \
         ones (the cluster took them from its first node); set this node's to the cluster's, or stop every node to \
         change them for all"
    )]
    Mismatch { differences: String },
}

/// What differs between this node's shared settings and the cluster's, naming both values
/// of each (`cluster.placement is "nginx-hash" here but "nginx-consistent" in the cluster`).
fn differences(ours: &str, theirs: &str) -> String {
    let value = |settings: &str, key: &str| {
        settings.split(' ').find_map(|pair| pair.strip_prefix(key)?.strip_prefix('=')).unwrap_or("unset").to_owned()
    };
    let described: Vec<String> = ["virtual_nodes", "placement"]
        .iter()
        .filter(|key| value(ours, key) != value(theirs, key))
        .map(|key| format!("cluster.{key} is {:?} here but {:?} in the cluster", value(ours, key), value(theirs, key)))
        .collect();
    if described.is_empty() { format!("{ours:?} here but {theirs:?} in the cluster") } else { described.join("; ") }
}

/// Cluster membership on Redis: this node's lease, kept by a heartbeat, and the ring of the
/// live members, refreshed by polling. Dropping it stops both (the lease then lapses);
/// [`leave`](Self::leave) gives the lease up at once.
pub struct RedisMembership {
    /// What the background tasks share with the handle.
    shared: Arc<Shared>,
    /// The heartbeat task, taken and awaited by `leave` so no renew follows the leave.
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    /// The view task.
    view: AbortHandle,
}

/// The state behind a [`RedisMembership`], shared with its two tasks.
struct Shared {
    /// The keys and scripts.
    registry: Registry,
    /// The leased id.
    node: NodeId,
    /// This instance's holder value, `<advertise>|<instance token>`.
    holder: String,
    /// As joined.
    settings: MembershipSettings,
    /// Until when this node may act as the holder.
    lease: LeaseClock,
    /// The ring in force and the members it was built from.
    current: ArcSwap<Snapshot>,
    /// The epoch of `current`, for subscribers.
    epoch: watch::Sender<u64>,
    /// Whether the lease may have lapsed.
    fenced: watch::Sender<bool>,
    /// How often Redis was found to have lost its data (the lease taken again).
    data_lost: watch::Sender<u64>,
    /// The lease is lost for good (another instance may hold the id).
    lost: watch::Sender<bool>,
    /// The last address each node advertised and when it was last a member, so a peer
    /// missing from one view (the leases being re-asserted after Redis lost its data) is
    /// still reached; a node gone for good fails at connect.
    last_seen: Mutex<std::collections::HashMap<NodeId, (SocketAddr, Instant)>>,
    /// Tests stop the heartbeat with it, to watch the lease lapse.
    paused: AtomicBool,
}

/// One view of the cluster.
struct Snapshot {
    /// What [`Topology::view`] hands out.
    view: Arc<RingView>,
    /// The members the ring was built from, sorted by node.
    members: Vec<Member>,
}

impl RedisMembership {
    /// Leases a node id (the pinned one, or the lowest free), reads the members, and
    /// starts the heartbeat and view tasks on the current tokio runtime.
    ///
    /// # Errors
    /// [`JoinError::Clash`] when the pinned id is held by a live node (the message names
    /// it); [`JoinError::Full`] when every id is; [`JoinError::Redis`] when Redis fails or
    /// does not answer within one lease TTL; [`JoinError::Settings`] for settings that
    /// cannot work (a heartbeat too slow for the TTL, a pinned id out of range).
    pub async fn join(
        redis: RedisConnection,
        prefix: KeyPrefix,
        settings: MembershipSettings,
    ) -> Result<Arc<Self>, JoinError> {
        settings.check()?;
        let registry = Registry::new(redis, &prefix);
        let instance = format!("{:032x}", rand::random::<u128>());
        let holder = registry::holder_value(settings.advertise, &instance, settings.client.as_deref());
        let shared_settings = settings.shared();
        let sent = Instant::now();
        let max_node = u32::from(MAX_NODE_ID);
        let (node, generation, listing) = match registry
            .join(settings.pinned, max_node, &holder, settings.epoch_floor, settings.lease_ttl, &shared_settings)
            .await?
        {
            Joined::Took { node, generation, listing } => (node, generation, listing),
            Joined::Clash { node, holder } => {
                let holder =
                    registry::address(&holder).map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
                return Err(JoinError::Clash { node, holder });
            }
            Joined::Full => return Err(JoinError::Full),
            Joined::Mismatch { settings: theirs } => {
                return Err(JoinError::Mismatch { differences: differences(&shared_settings, &theirs) });
            }
        };
        let lease = LeaseClock::new(sent, settings.lease_ttl - settings.fence_margin);
        tracing::info!(%node, epoch = listing.epoch, members = listing.members.len(), "joined the cluster");
        let shared = Arc::new(Shared {
            registry,
            node,
            holder,
            current: ArcSwap::from_pointee(snapshot(&listing, settings.virtual_nodes, settings.placement)),
            epoch: watch::Sender::new(listing.epoch),
            fenced: watch::Sender::new(!lease.holds()),
            data_lost: watch::Sender::new(0),
            lost: watch::Sender::new(false),
            last_seen: Mutex::new(std::collections::HashMap::new()),
            lease,
            settings,
            paused: AtomicBool::new(false),
        });
        let heartbeat = tokio::spawn(Arc::clone(&shared).keep_lease(generation));
        let view = tokio::spawn(Arc::clone(&shared).follow_members()).abort_handle();
        Ok(Arc::new(Self { shared, heartbeat: Mutex::new(Some(heartbeat)), view }))
    }

    /// The node id this node leased.
    pub fn this_node(&self) -> NodeId {
        self.shared.node
    }

    /// Where peers reach `node`, as of the last view, or where it was if it left the view
    /// less than two lease TTLs ago; `None` otherwise.
    pub fn address_of(&self, node: NodeId) -> Option<SocketAddr> {
        let current = self.shared.current.load();
        if let Ok(at) = current.members.binary_search_by_key(&node, |member| member.node) {
            return current.members[at].address;
        }
        // Not in this view: reached where it last was, for two lease TTLs.
        let remembered = self.shared.last_seen.lock().unwrap_or_else(PoisonError::into_inner).get(&node).copied();
        remembered.filter(|(_, seen)| seen.elapsed() < self.shared.settings.lease_ttl * 2).map(|(address, _)| address)
    }

    /// The live members and their addresses as of the last view, by node id (for
    /// `/admin/cluster`).
    pub fn members(&self) -> Vec<(NodeId, SocketAddr)> {
        self.shared.current.load().members.iter().filter_map(|m| Some((m.node, m.address?))).collect()
    }

    /// The live members and where clients reach them (`host:port`, `None` for none), as of
    /// the last view, by node id.
    pub fn client_addresses(&self) -> Vec<(NodeId, Option<String>)> {
        self.shared.current.load().members.iter().map(|m| (m.node, m.client.clone())).collect()
    }

    /// The epoch in force, updated whenever a new ring replaces the last.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.epoch.subscribe()
    }

    /// `true` once the lease may have lapsed (missed renews, lost to another instance, or
    /// given up by [`leave`](Self::leave)): the node must stop allocating seqs and
    /// committing as an owner. It may turn false again if a late renew finds the lease
    /// still held (see the module doc).
    pub fn fenced(&self) -> watch::Receiver<bool> {
        self.shared.fenced.subscribe()
    }

    /// Counts the times Redis was found to have lost its data (FLUSHALL, a restart without
    /// persistence) and this node's lease was taken again: each time, what else this node
    /// keeps in Redis (its connections' routes, its rooms) must be written again.
    pub fn data_lost(&self) -> watch::Receiver<u64> {
        self.shared.data_lost.subscribe()
    }

    /// Resolves once the lease is lost for good: a renew found it lapsed in Redis (the
    /// node was paused or cut off past its TTL) and the id may be another node's now. The
    /// node cannot act under this id again and must stop; started again, it joins anew.
    pub async fn lost(&self) {
        let _ = self.shared.lost.subscribe().wait_for(|&lost| lost).await;
    }

    /// Whether the lease is certainly still this node's at this instant; exact, where
    /// [`fenced`](Self::fenced) is a notification that may come a scheduling delay later.
    pub fn holds_lease(&self) -> bool {
        self.shared.lease.holds()
    }

    /// Gives the lease up: stops the heartbeat, fences this node, removes its lease and
    /// increments the epoch, and installs the ring without this node. The view keeps
    /// following the others until the membership is dropped. Calling it again does nothing.
    ///
    /// # Errors
    /// [`RedisFailure`] when Redis fails or does not answer within one lease TTL; the
    /// node is fenced all the same, and its lease lapses by itself.
    pub async fn leave(&self) -> Result<(), RedisFailure> {
        let heartbeat = self.heartbeat.lock().unwrap_or_else(PoisonError::into_inner).take();
        let Some(heartbeat) = heartbeat else { return Ok(()) };
        heartbeat.abort();
        // Once the task is gone no renew can follow the leave on the connection (commands
        // on it run in the order sent).
        let _ = heartbeat.await;
        let shared = &self.shared;
        shared.lease.give_up();
        // Fenced from now on, as a lapsed lease is, but nothing went wrong: no error logged.
        shared.fenced.send_replace(true);
        let known = shared.current.load().view.epoch;
        let (removed, listing) =
            shared.registry.leave(shared.node, &shared.holder, known, shared.settings.lease_ttl).await?;
        if !removed {
            tracing::warn!(node = %shared.node, "left the cluster, but the lease was no longer this node's");
        }
        tracing::info!(node = %shared.node, epoch = listing.epoch, "left the cluster");
        shared.install(&listing);
        Ok(())
    }

    /// Stops renewing the lease while keeping everything else running, so that a test can
    /// watch it lapse.
    #[doc(hidden)]
    pub fn pause_heartbeats(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
    }
}

impl Topology for RedisMembership {
    fn view(&self) -> Arc<RingView> {
        Arc::clone(&self.shared.current.load().view)
    }

    fn holds_lease(&self) -> bool {
        RedisMembership::holds_lease(self)
    }
}

/// The node-to-node links find peers through the last view.
impl PeerAddresses for RedisMembership {
    fn address_of(&self, node: NodeId) -> Option<SocketAddr> {
        RedisMembership::address_of(self, node)
    }

    /// The members, and the nodes that left the view less than two lease TTLs ago (see
    /// [`RedisMembership::address_of`]): an announcement must reach a live node that one view
    /// lacked while the leases were being re-asserted.
    fn nodes(&self) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self.shared.current.load().members.iter().map(|member| member.node).collect();
        let recent = self.shared.settings.lease_ttl * 2;
        let last_seen = self.shared.last_seen.lock().unwrap_or_else(PoisonError::into_inner);
        nodes.extend(last_seen.iter().filter(|(_, (_, seen))| seen.elapsed() < recent).map(|(node, _)| *node));
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }
}

impl Drop for RedisMembership {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            heartbeat.abort();
        }
        self.view.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> MembershipSettings {
        MembershipSettings::new("127.0.0.1:7071".parse().expect("valid"))
    }

    #[test]
    fn the_defaults_renew_three_times_per_ttl_and_fence_a_fifth_early() {
        let defaults = settings();
        assert_eq!(defaults.lease_ttl, Duration::from_secs(3));
        assert_eq!(defaults.heartbeat, Duration::from_secs(1));
        assert_eq!(defaults.fence_margin, Duration::from_millis(600));
        assert_eq!((defaults.poll, defaults.pinned, defaults.virtual_nodes), (Duration::from_millis(250), None, 160));
        assert!(defaults.check().is_ok());
    }

    #[test]
    fn settings_that_cannot_work_are_refused_with_the_reason() {
        let slow = MembershipSettings { heartbeat: Duration::from_millis(2500), ..settings() };
        let error = slow.check().expect_err("a heartbeat that lets the lease lapse").to_string();
        assert!(error.contains("shorten the heartbeat"), "{error}");
        let pinned = MembershipSettings { pinned: Some(NodeId(1024)), ..settings() };
        assert!(pinned.check().expect_err("out of range").to_string().contains("0..=1023"));
        let still = MembershipSettings { poll: Duration::ZERO, ..settings() };
        assert!(still.check().is_err());
    }

    #[test]
    fn a_mismatch_names_both_values_of_each_setting_that_differs() {
        let ours = MembershipSettings { placement: Placement::NginxHash, ..settings() }.shared();
        let theirs = MembershipSettings { placement: Placement::NginxConsistent, ..settings() }.shared();
        let error = JoinError::Mismatch { differences: differences(&ours, &theirs) }.to_string();
        assert!(
            error.contains(r#"cluster.placement is "nginx-hash" here but "nginx-consistent" in the cluster"#),
            "{error}"
        );
        assert!(!error.contains("virtual_nodes"), "{error}");
        let theirs = MembershipSettings { virtual_nodes: 100, ..settings() }.shared();
        let error = differences(&settings().shared(), &theirs);
        assert_eq!(error, r#"cluster.virtual_nodes is "160" here but "100" in the cluster"#);
    }

    #[test]
    fn a_clash_says_who_holds_the_id_and_when_it_frees() {
        let error = JoinError::Clash { node: NodeId(3), holder: "10.0.0.2:7071".to_owned() }.to_string();
        assert!(error.starts_with("node id 3 is held by the live node at 10.0.0.2:7071"), "{error}");
        assert!(error.contains("lease lapses"), "{error}");
    }
}
