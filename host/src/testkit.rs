//! A node's uplink and downlink assembled from real parts, for the unit tests of the
//! pipeline and of delivery.
//!
//! [`Kit`] wires what `node.rs` wires in embedded mode — storage on a temporary SQLite file
//! behind the group committer, the seq allocator, dedup marks, lanes, membership, the
//! in-process route table, rooms, room directory and sessions, a router over a
//! [`KitTopology`] (a [`StaticTopology`] whose lease a test may take away), the plugin host
//! with no plugins — leaving out only the edges (the gateway, HTTP) and the background
//! loops. A test may hand in its own route table, node bus or ring ([`Options`]): those are
//! the seams the pipeline and delivery are tested through.
//!
//! Beside it: [`RecordingOutbox`], an [`Outbox`] that keeps every frame it is given (what a
//! device would have been sent); [`RecordingBus`], a [`NodeBus`] that keeps every send,
//! delivery and room message it is given (what other nodes would have been asked); and
//! [`ReadLog`], which passes message reads through to the database and notes which
//! conversations were read.

#[path = "../tests/poll/mod.rs"]
pub mod poll;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use herald_proto::SharedFrame;
use herald_proto::v1::{self, Frame, frame::Body};

use crate::clock::SystemClock;
use crate::config::{DeliveryConfig, SeqConfig, StorageConfig};
use crate::delivery::Delivery;
use crate::delivery::session::{Outbox, Session};
use crate::delivery::sessions::Sessions;
use crate::health::Vitals;
use crate::ids::{SeqAllocator, SnowflakeGenerator};
use crate::maps::HashMap;
use crate::membership::Membership;
use crate::model::{ClientMsgId, ConnectionId, ConversationId, DeviceId, Message, NodeId, UserId};
use crate::node::{Seams, Settings, Storage};
use crate::pipeline::dedup::LocalDedup;
use crate::pipeline::{Admission, Pipeline};
use crate::plugins::{PluginHost, PluginHostConfig};
use crate::routing::bus::{
    Addressed, BusError, LocalBus, NodeBus, Origin, Queued, SendAck, SendRequest, cause, each_asked,
};
use crate::routing::rooms::{MemoryRoomDirectory, Rooms};
use crate::routing::router::Router;
use crate::routing::topology::{RingView, StaticTopology, Topology};
use crate::routing::{MemoryRouteTable, Route, RouteTable};
use crate::store::{Database, GroupCommitter, MessageStore, SeqSpan, StoreError};

/// The node the kit plays.
pub const THIS_NODE: NodeId = NodeId(1);

/// How long any one step of a test may take before it counts as hung.
pub const WAIT: Duration = Duration::from_secs(10);

/// What a test may swap in; the rest is always the embedded implementation.
pub struct Options {
    /// Where connected devices are (a counting wrapper, say).
    pub routes: Arc<dyn RouteTable>,
    /// How other nodes are reached.
    pub bus: Arc<dyn NodeBus>,
    /// The nodes on the ring; a ring without [`THIS_NODE`] makes another node own everything.
    pub ring: Vec<NodeId>,
    /// Delivery's settings. By default one push per message and device: what a test sees is
    /// what fan-out or backfill pushed, never a redelivery that a slow run let through.
    pub delivery: DeliveryConfig,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            routes: Arc::new(MemoryRouteTable::default()),
            bus: Arc::new(LocalBus),
            ring: vec![THIS_NODE],
            delivery: DeliveryConfig { max_attempts: 1, ..DeliveryConfig::default() },
        }
    }
}

/// The parts of one node, on a temporary SQLite file.
pub struct Kit {
    pub database: Database,
    pub topology: Arc<KitTopology>,
    pub routes: Arc<dyn RouteTable>,
    pub rooms: Arc<Rooms>,
    pub room_directory: Arc<MemoryRoomDirectory>,
    pub sessions: Arc<Sessions>,
    pub membership: Arc<Membership>,
    pub delivery: Arc<Delivery>,
    pub pipeline: Arc<Pipeline>,
    /// Every `messages_after` delivery made, in order.
    pub reads: Arc<ReadLog>,
    next_connection: AtomicU64,
    /// Holds the database file; removed when the kit is dropped.
    _dir: tempfile::TempDir,
}

impl Kit {
    /// A node of its own ring, with the in-process route table and bus.
    pub async fn new() -> Self {
        Self::with(Options::default()).await
    }

    /// A node with the route table, bus and ring of `options`.
    pub async fn with(options: Options) -> Self {
        let dir = tempfile::tempdir().expect("a temporary folder for the database");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("herald.db").display());
        let storage = StorageConfig::default();
        let database = Database::connect(&url, &storage).await.expect("open the SQLite file");
        database.migrate().await.expect("migrate");
        let committer = GroupCommitter::start(database.clone(), &storage.group_commit);
        // No plugins, so no instance is ever made: skip reserving a pool of them.
        let plugins = Arc::new(
            PluginHost::embedded(PluginHostConfig { pooling: false, ..PluginHostConfig::default() })
                .expect("the plugin host"),
        );
        let topology = Arc::new(KitTopology::new(&options.ring));
        let room_directory = Arc::new(MemoryRoomDirectory::default());
        let seams = Seams {
            this_node: THIS_NODE,
            clock: Arc::new(SystemClock),
            routes: Arc::clone(&options.routes),
            rooms: Arc::new(Rooms::default()),
            room_directory: Arc::clone(&room_directory) as _,
            sessions: Arc::new(Sessions::default()),
            dedup: Arc::new(LocalDedup::new(Duration::from_secs(600), 10_000)),
            bus: options.bus,
            router: Arc::new(Router::new(Arc::clone(&plugins), Arc::clone(&topology) as _, THIS_NODE)),
        };
        let reads =
            Arc::new(ReadLog { database: database.clone(), reads: Mutex::default(), after_read: Mutex::default() });
        let storage = Storage {
            messages: Arc::clone(&reads) as _,
            writer: Arc::new(committer),
            cursors: Arc::new(database.clone()),
            conversations: Arc::new(database.clone()),
            groups: Arc::new(database.clone()),
            seqs: Arc::new(SeqAllocator::new(Arc::new(database.clone()), SeqConfig::default())),
        };
        let settings = Settings {
            delivery: options.delivery,
            known_direct_idle: Duration::ZERO,
            group_cache_ttl: None,
            max_group_members: 10_000,
        };
        let ids = Arc::new(SnowflakeGenerator::new(THIS_NODE.0).expect("node id in range"));
        let services = seams.services(storage, settings, ids, &plugins, &Arc::new(Vitals::default()));
        Self {
            database,
            topology,
            routes: seams.routes,
            rooms: seams.rooms,
            room_directory,
            sessions: seams.sessions,
            membership: services.membership,
            delivery: services.delivery,
            pipeline: services.pipeline,
            reads,
            next_connection: AtomicU64::new(1),
            _dir: dir,
        }
    }

    /// A connection id not used before on this node.
    pub fn connection_id(&self) -> ConnectionId {
        ConnectionId(self.next_connection.fetch_add(1, Ordering::Relaxed))
    }

    /// A session of `user`'s `device` on this node whose frames go to `outbox`, registered
    /// and logged in as the gateway's attach does, but not live: its backfill is to come.
    pub async fn attach(&self, user: &str, device: &str, outbox: Arc<RecordingOutbox>) -> Arc<Session> {
        let session = Arc::new(Session::new(self.connection_id(), user_id(user), device_id(device), outbox as _));
        self.sessions.insert(Arc::clone(&session));
        let route = Route {
            user: session.user.clone(),
            device: session.device.clone(),
            node: THIS_NODE,
            connection: session.id,
            connected_at_ms: 0,
            parked: false,
        };
        self.routes.login(route).await.expect("log the device in");
        session
    }

    /// A session of `user`'s `device` on this node, live (as after its backfill), with an
    /// outbox that records what it is pushed.
    pub async fn connect(&self, user: &str, device: &str) -> (Arc<Session>, Arc<RecordingOutbox>) {
        let outbox = RecordingOutbox::new();
        let session = self.attach(user, device, Arc::clone(&outbox)).await;
        session.skip_backfill();
        (session, outbox)
    }

    /// The connection dropped within the reconnect grace: parked, route and session gone,
    /// as the gateway's detach does.
    pub async fn drop_within_grace(&self, session: &Arc<Session>) {
        assert!(session.park(), "a live session whose backfill ended can be parked");
        self.sessions.park(Arc::clone(session));
        self.routes.logout(&session.user, &session.device, THIS_NODE, session.id).await.expect("log out");
        self.sessions.remove(session.id);
        self.delivery.connection_closed(session);
    }

    /// Runs a send through the pipeline to the end — the ack, then the fan-out — and
    /// returns the ack.
    pub async fn send(&self, request: SendRequest) -> SendAck {
        let admitted = tokio::time::timeout(WAIT, self.pipeline.admit(request)).await.expect("admit hung");
        settle(admitted).await
    }

    /// `user`'s `device` (connection 1 of this node) sends `body` to `conversation`; returns
    /// the ack, which must be OK.
    pub async fn send_ok(&self, user: &str, device: &str, conversation: &str, body: &str) -> v1::SendAck {
        let ack = self.send(request(user, device, conversation, &uuid(), body)).await.ack;
        assert_eq!(ack.status(), v1::send_ack::Status::Ok, "{user} could not send to {conversation}: {ack:?}");
        ack
    }

    /// Every stored message of `conversation`, ascending.
    pub async fn stored(&self, conversation: &str) -> Vec<Message> {
        self.database.messages_after(&conversation_id(conversation), 0, 1_000).await.expect("read messages")
    }
}

/// The kit's ring: a [`StaticTopology`], and whether this node holds its cluster lease —
/// always, unless a test says otherwise (as a node whose lease may have lapsed).
pub struct KitTopology {
    ring: StaticTopology,
    lease: AtomicBool,
}

impl KitTopology {
    fn new(nodes: &[NodeId]) -> Self {
        Self { ring: StaticTopology::new(nodes), lease: AtomicBool::new(true) }
    }

    /// Replaces the ring with one of `nodes`; returns the new epoch.
    pub fn replace(&self, nodes: &[NodeId]) -> u64 {
        self.ring.replace(nodes)
    }

    /// Whether [`Topology::holds_lease`] says this node holds its lease.
    pub fn set_holds_lease(&self, held: bool) {
        self.lease.store(held, Ordering::SeqCst);
    }
}

impl Topology for KitTopology {
    fn view(&self) -> Arc<RingView> {
        self.ring.view()
    }

    fn holds_lease(&self) -> bool {
        self.lease.load(Ordering::SeqCst)
    }
}

/// Runs an admission to its end: its ack, after the fan-out has run.
pub async fn settle(admission: Admission) -> SendAck {
    match admission {
        Admission::Done(ack) => ack,
        Admission::Wait(wait) => {
            let settled = tokio::time::timeout(WAIT, wait).await.expect("a send never settled");
            if let Some(fan_out) = settled.fan_out {
                tokio::time::timeout(WAIT, fan_out).await.expect("fan-out hung");
            }
            settled.ack
        }
    }
}

/// A send of `body` by `user`'s `device` through connection 1 of this node.
pub fn request(user: &str, device: &str, conversation: &str, client_msg_id: &str, body: &str) -> SendRequest {
    SendRequest {
        origin: Origin { user: user_id(user), device: device_id(device), node: THIS_NODE, connection: ConnectionId(1) },
        rid: 7,
        send: v1::Send {
            client_msg_id: client_msg_id.to_owned(),
            conversation: conversation.to_owned(),
            kind: 3,
            body: body.to_owned().into_bytes().into(),
        },
        announcement: false,
    }
}

/// A fresh random UUID (version 4), as clients use for `client_msg_id`.
pub fn uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

pub fn user_id(name: &str) -> UserId {
    UserId::parse(name).expect("a valid user id")
}

pub fn device_id(name: &str) -> DeviceId {
    DeviceId::parse(name).expect("a valid device id")
}

pub fn conversation_id(name: &str) -> ConversationId {
    ConversationId::parse(name).expect("a valid conversation id")
}

/// A message as the pipeline would hand it to fan-out: `seq` of `conversation`, sent by
/// `user`'s `device`.
pub fn message(conversation: &str, seq: u64, user: &str, device: &str) -> Arc<Message> {
    Arc::new(Message {
        id: 1_000 + seq,
        conversation: conversation_id(conversation),
        seq,
        sender: user_id(user),
        sender_device: device_id(device),
        client_msg_id: ClientMsgId::parse(&uuid()).expect("a valid uuid"),
        kind: 0,
        body: bytes::Bytes::from_static(b"hello"),
        sent_at_ms: 0,
    })
}

/// An outbox that keeps every frame, as the device would receive them.
#[derive(Default)]
pub struct RecordingOutbox {
    frames: Mutex<Vec<Frame>>,
    /// The shared frames taken (their frames are in `frames` too).
    shared: Mutex<Vec<Arc<SharedFrame>>>,
    closed: AtomicBool,
    /// Takes this many frames, then closes (a device that went away).
    room: Option<usize>,
}

impl RecordingOutbox {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// An outbox that takes `frames` frames and then closes, refusing the rest.
    pub fn closing_after(frames: usize) -> Arc<Self> {
        Arc::new(Self { room: Some(frames), ..Self::default() })
    }

    /// Every frame taken, in order.
    pub fn frames(&self) -> Vec<Frame> {
        self.frames.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The messages of the `deliver` frames taken, in order.
    pub fn delivered(&self) -> Vec<v1::Message> {
        self.frames()
            .into_iter()
            .filter_map(|frame| match frame.body {
                Some(Body::Deliver(deliver)) => deliver.message,
                _ => None,
            })
            .collect()
    }

    /// The shared frames taken, in order.
    pub fn shared(&self) -> Vec<Arc<SharedFrame>> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// (conversation, seq) of each `deliver` frame taken, in order.
    pub fn delivered_seqs(&self) -> Vec<(String, u64)> {
        self.delivered().into_iter().map(|message| (message.conversation, message.seq)).collect()
    }

    fn take(&self, frame: Frame) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let mut frames = self.frames.lock().unwrap_or_else(|p| p.into_inner());
        frames.push(frame);
        if self.room.is_some_and(|room| frames.len() >= room) {
            self.closed.store(true, Ordering::SeqCst);
        }
        true
    }
}

#[async_trait]
impl Outbox for RecordingOutbox {
    fn push(&self, frame: Frame) -> bool {
        self.take(frame)
    }

    fn push_shared(&self, frame: &Arc<SharedFrame>) -> bool {
        let taken = self.take(frame.frame().clone());
        if taken {
            self.shared.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::clone(frame));
        }
        taken
    }

    async fn push_waiting(&self, frame: Frame) -> bool {
        self.take(frame)
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// One call a node made to another.
#[derive(Debug, Clone)]
pub enum BusCall {
    ForwardSend { owner: NodeId, request: SendRequest },
    Deliver { node: NodeId, message: Arc<Message>, users: Vec<UserId>, addressed: Addressed },
    PublishRoom { nodes: Vec<NodeId>, message: Arc<Message> },
}

/// A node bus that records the sends, deliveries and room messages it is given; a forwarded
/// send is answered by [`RecordingBus::answer`], as if the owner had stored it.
#[derive(Default)]
pub struct RecordingBus {
    calls: Mutex<Vec<BusCall>>,
    /// What [`NodeBus::peers`] answers.
    peers: Mutex<Vec<NodeId>>,
    /// How many more `deliver`s and room publishes to each node fail (unrecorded), and how.
    failing: Mutex<HashMap<NodeId, (u32, Fault)>>,
}

/// How a call a [`RecordingBus`] is told to fail fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Never sent: the link could not be opened ([`BusError::Failed`]).
    NotSent,
    /// Sent, then the link broke before the answer ([`BusError::Broken`]).
    Broken,
    /// Sent, and not answered in time ([`BusError::Late`]).
    Late,
}

impl Fault {
    fn error(self, node: NodeId) -> BusError {
        match self {
            Self::NotSent => BusError::Failed { node, cause: cause("cannot connect") },
            Self::Broken => BusError::Broken { node, cause: cause("the link broke") },
            Self::Late => BusError::Late { node, cause: cause("no answer within 500ms") },
        }
    }
}

impl RecordingBus {
    /// A bus whose cluster has `peers` besides this node.
    pub fn with_peers(peers: &[NodeId]) -> Self {
        Self { peers: Mutex::new(peers.to_vec()), ..Self::default() }
    }

    /// The cluster now has `peers` besides this node (one left, say).
    pub fn set_peers(&self, peers: &[NodeId]) {
        *self.peers.lock().unwrap_or_else(|p| p.into_inner()) = peers.to_vec();
    }

    /// The next `times` `deliver`s and room publishes to `node` fail as `fault` says, and
    /// are not recorded.
    pub fn fail_calls(&self, node: NodeId, times: u32, fault: Fault) {
        self.failing.lock().unwrap_or_else(|p| p.into_inner()).insert(node, (times, fault));
    }

    /// The error of the next call to `node`, if it is to fail.
    fn fault(&self, node: NodeId) -> Option<BusError> {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let (left @ 1.., fault) = failing.get_mut(&node)? else { return None };
        *left -= 1;
        Some(fault.error(node))
    }

    /// Every call, in order.
    pub fn calls(&self) -> Vec<BusCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn record(&self, call: BusCall) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }

    /// What the owner answers a forwarded send with: stored, with ids no local send gets.
    pub fn answer(request: &SendRequest) -> SendAck {
        SendAck {
            to: request.origin.clone(),
            rid: request.rid,
            ack: v1::SendAck {
                client_msg_id: request.send.client_msg_id.clone(),
                status: v1::send_ack::Status::Ok as i32,
                message_id: u64::MAX - 1,
                seq: 4_242,
                conversation: request.send.conversation.clone(),
                ..v1::SendAck::default()
            },
        }
    }
}

#[async_trait]
impl NodeBus for RecordingBus {
    async fn forward_send(&self, owner: NodeId, request: SendRequest, _queued: Queued) -> Result<SendAck, BusError> {
        let answer = Self::answer(&request);
        self.record(BusCall::ForwardSend { owner, request });
        Ok(answer)
    }

    async fn deliver(
        &self,
        node: NodeId,
        message: Arc<Message>,
        users: &[UserId],
        addressed: Addressed,
    ) -> Result<(), BusError> {
        if let Some(error) = self.fault(node) {
            return Err(error);
        }
        self.record(BusCall::Deliver { node, message, users: users.to_vec(), addressed });
        Ok(())
    }

    async fn publish_room(&self, nodes: &[NodeId], message: Arc<Message>) -> Result<(), Vec<BusError>> {
        let (mut failed, mut asked) = (Vec::new(), Vec::new());
        for &node in nodes {
            match self.fault(node) {
                Some(error) => failed.push(error),
                None => asked.push(node),
            }
        }
        if !asked.is_empty() {
            self.record(BusCall::PublishRoom { nodes: asked, message });
        }
        each_asked(failed)
    }

    async fn take_over(&self, route: &Route) -> Result<Option<crate::model::DeviceLedger>, BusError> {
        Err(BusError::Unreachable(route.node))
    }

    async fn lowest_in_flight(&self, owner: NodeId, _conversation: &ConversationId) -> Result<Option<u64>, BusError> {
        Err(BusError::Unreachable(owner))
    }

    async fn group_changed(&self, _group: &crate::model::GroupId) {}

    fn peers(&self) -> Vec<NodeId> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Something a test makes happen after a read, before the reader sees its result.
pub type AfterRead = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Message reads, passed through to the database, with each `messages_after` noted.
pub struct ReadLog {
    database: Database,
    reads: Mutex<Vec<(ConversationId, u64)>>,
    after_read: Mutex<Option<AfterRead>>,
}

impl ReadLog {
    /// (conversation, after_seq) of each `messages_after`, in order.
    pub fn reads(&self) -> Vec<(ConversationId, u64)> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forgets the reads so far.
    pub fn clear(&self) {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Runs `hook` after every `messages_after` has read and before its reader gets the
    /// result: a test's way to make something happen between a read and what follows it.
    pub fn after_each_read(&self, hook: AfterRead) {
        *self.after_read.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }
}

#[async_trait]
impl MessageStore for ReadLog {
    async fn messages_after(
        &self,
        conversation: &ConversationId,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<Message>, StoreError> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).push((conversation.clone(), after_seq));
        let read = self.database.messages_after(conversation, after_seq, limit).await;
        let hook = self.after_read.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(hook) = hook {
            hook().await;
        }
        read
    }

    async fn messages_before(
        &self,
        conversation: &ConversationId,
        before_seq: u64,
        limit: u32,
    ) -> Result<Vec<Message>, StoreError> {
        self.database.messages_before(conversation, before_seq, limit).await
    }

    async fn latest_seq(&self, conversation: &ConversationId) -> Result<u64, StoreError> {
        self.database.latest_seq(conversation).await
    }

    async fn changed_since(&self, since_id: u64) -> Result<Vec<(ConversationId, SeqSpan)>, StoreError> {
        self.database.changed_since(since_id).await
    }

    async fn message_by_client_id(
        &self,
        sender: &UserId,
        client_msg_id: &ClientMsgId,
    ) -> Result<Option<Message>, StoreError> {
        self.database.message_by_client_id(sender, client_msg_id).await
    }
}
