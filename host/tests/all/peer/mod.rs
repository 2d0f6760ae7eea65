//! Node-to-node links over real TCP on 127.0.0.1: a [`PeerBus`] calling a [`PeerServer`]
//! whose [`PeerHandler`] records what it is asked, so each test sees exactly what crossed
//! the link. Some tests speak the link's raw frames, as a broken or hostile peer would.
//!
//! Nothing here waits for time to pass: slow handlers are held on gates the test opens, and
//! the only timing checked is that a failure came before its deadline.

mod calls;
mod frames;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{BufMut as _, Bytes, BytesMut};
use herald_host::breaker::{BreakerConfig, BreakerState};
use herald_host::cluster::peer::{
    PROTOCOL_VERSION, PeerAddresses, PeerBus, PeerHandler, PeerSecret, PeerServer, PeerTimeouts,
};
use herald_host::model::{
    ClientMsgId, ConnectionId, ConversationId, DeviceId, DeviceLedger, GroupId, Message, NodeId, UserId,
};
use herald_host::pipeline::{Admission, Settled};
use herald_host::routing::Route;
use herald_host::routing::bus::{Addressed, BusError, NodeBus, Origin, Queued, SendAck, SendRequest};
use herald_host::routing::cache::RouteChanges;
use herald_proto::peer::v1 as wire;
use herald_proto::peer::v1::peer_frame::Body;
use herald_proto::v1;
use hmac::{Hmac, KeyInit as _, Mac as _};
use prost::Message as _;
use sha2::Sha256;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::poll::poll;

/// The calling node.
const CALLER: NodeId = NodeId(1);
/// The called node.
const CALLED: NodeId = NodeId(2);
/// The secret both share.
const SECRET: &str = "correct horse battery staple";
/// The longest anything that should happen promptly may take (the machine is shared).
const WAIT: Duration = Duration::from_secs(10);

/// Deadlines long enough for a busy machine; tests about deadlines check against these.
fn timeouts() -> PeerTimeouts {
    PeerTimeouts {
        forward_send: Duration::from_secs(5),
        request: Duration::from_secs(5),
        connect: Duration::from_secs(5),
        ..PeerTimeouts::default()
    }
}

fn secret(text: &str) -> PeerSecret {
    PeerSecret::new(text).expect("not empty")
}

fn user(name: &str) -> UserId {
    UserId::parse(name).expect("valid user")
}

fn device(name: &str) -> DeviceId {
    DeviceId::parse(name).expect("valid device")
}

fn conversation(name: &str) -> ConversationId {
    ConversationId::parse(name).expect("valid conversation")
}

fn message() -> Message {
    Message {
        id: (1 << 40) + 17,
        conversation: conversation("grp:team-7"),
        seq: 42,
        sender: user("alice"),
        sender_device: device("phone"),
        client_msg_id: ClientMsgId::parse("123e4567-e89b-12d3-a456-426614174000").expect("valid"),
        kind: 3,
        // Every byte value, so nothing in between may treat the body as text.
        body: (0..=255u8).collect::<Vec<_>>().into(),
        sent_at_ms: 1_700_000_000_000,
    }
}

/// A `queued` signal nobody waits for.
fn queued() -> Queued {
    tokio::sync::oneshot::channel().0
}

/// A send from alice's phone on the caller; `delay_ms` is how long the recording handler
/// takes over it.
fn send_request(rid: u32, delay_ms: u32) -> SendRequest {
    SendRequest {
        origin: Origin { user: user("alice"), device: device("phone"), node: CALLER, connection: ConnectionId(77) },
        rid,
        send: v1::Send {
            client_msg_id: format!("00000000-0000-4000-8000-{rid:012}"),
            conversation: "dm:alice:bob".to_owned(),
            kind: delay_ms,
            body: Bytes::from(format!("message {rid}")),
        },
        announcement: false,
    }
}

/// The ack the recording handler gives a send: its seq and id are made from its rid.
fn ack_for(request: &SendRequest) -> v1::SendAck {
    v1::SendAck {
        client_msg_id: request.send.client_msg_id.clone(),
        status: v1::send_ack::Status::Ok.into(),
        message_id: 9_000_000 + u64::from(request.rid),
        seq: 1_000 + u64::from(request.rid),
        conversation: request.send.conversation.clone(),
        reason: String::new(),
        retry_after_ms: 0,
    }
}

/// The ledger the recording handler hands over: acked and unacked conversations, one of
/// them with nothing to read.
fn handed_ledger() -> DeviceLedger {
    let conversation = |id: &str| ConversationId::parse(id).expect("valid");
    DeviceLedger {
        acked: [(conversation("dm:alice:bob"), 7), (conversation("grp:team"), 3)].into_iter().collect(),
        read_after: [(conversation("dm:alice:bob"), 7), (conversation("room:lobby"), 0)].into_iter().collect(),
        // A restored ledger's mark travels too.
        since_id: Some(1 << 40),
    }
}

/// One call the handler received.
#[derive(Debug, Clone)]
enum Recorded {
    Send(SendRequest),
    Deliver(Message, Vec<UserId>, Addressed),
    PublishRoom(Message),
    Kick(Route, Option<NodeId>),
    LowestInFlight(ConversationId),
    RoutesChanged(Vec<UserId>),
    GroupChanged(GroupId),
}

/// A [`PeerHandler`] that records every call. Sends wait while `sends` is closed and take
/// `send.kind` ms; their fan-outs wait while `fan_outs` is closed, then report their rid.
struct Recorder {
    calls: Mutex<Vec<Recorded>>,
    sends: watch::Sender<bool>,
    fan_outs: watch::Sender<bool>,
    /// The rid of each send as it starts.
    started: mpsc::UnboundedSender<u32>,
    /// The rid of each fan-out as it runs.
    fanned_out: mpsc::UnboundedSender<u32>,
}

/// What a test watches of its [`Recorder`].
struct Watch {
    started: mpsc::UnboundedReceiver<u32>,
    fanned_out: mpsc::UnboundedReceiver<u32>,
}

impl Recorder {
    fn new() -> (Arc<Self>, Watch) {
        let (started, started_rx) = mpsc::unbounded_channel();
        let (fanned_out, fanned_out_rx) = mpsc::unbounded_channel();
        let recorder = Self {
            calls: Mutex::new(Vec::new()),
            sends: watch::Sender::new(true),
            fan_outs: watch::Sender::new(true),
            started,
            fanned_out,
        };
        (Arc::new(recorder), Watch { started: started_rx, fanned_out: fanned_out_rx })
    }

    fn calls(&self) -> Vec<Recorded> {
        self.calls.lock().expect("not poisoned").clone()
    }

    fn record(&self, call: Recorded) {
        self.calls.lock().expect("not poisoned").push(call);
    }
}

#[async_trait]
impl PeerHandler for Recorder {
    /// Admitted at once (recorded in the order admitted); the rest waits while `sends` is
    /// shut, then takes `kind` ms.
    async fn admit_send(&self, request: SendRequest) -> Admission {
        self.record(Recorded::Send(request.clone()));
        let _ = self.started.send(request.rid);
        let mut sends = self.sends.subscribe();
        let (mut gate, ran, rid) = (self.fan_outs.subscribe(), self.fanned_out.clone(), request.rid);
        Admission::Wait(Box::pin(async move {
            let _ = sends.wait_for(|&open| open).await;
            tokio::time::sleep(Duration::from_millis(u64::from(request.send.kind))).await;
            let fan_out = async move {
                let _ = gate.wait_for(|&open| open).await;
                let _ = ran.send(rid);
            };
            let ack = SendAck { ack: ack_for(&request), to: request.origin, rid: request.rid };
            Settled { ack, fan_out: Some(Box::pin(fan_out)) }
        }))
    }

    async fn deliver(&self, message: Message, users: Vec<UserId>, addressed: Addressed) {
        self.record(Recorded::Deliver(message, users, addressed));
    }

    async fn publish_room(&self, message: Message) {
        self.record(Recorded::PublishRoom(message));
    }

    async fn kick(&self, route: Route, hand_over: Option<NodeId>) -> Option<DeviceLedger> {
        self.record(Recorded::Kick(route, hand_over));
        hand_over.map(|_| handed_ledger())
    }

    async fn lowest_in_flight(&self, conversation: ConversationId) -> Option<u64> {
        self.record(Recorded::LowestInFlight(conversation.clone()));
        (conversation.as_str() != "room:idle").then_some(41)
    }

    async fn group_changed(&self, group: GroupId) {
        self.record(Recorded::GroupChanged(group));
    }

    async fn routes_changed(&self, users: Vec<UserId>) {
        self.record(Recorded::RoutesChanged(users));
    }
}

/// Where each node listens, changeable while the bus runs (a node restarted elsewhere).
#[derive(Default)]
struct Directory(Mutex<HashMap<NodeId, SocketAddr>>);

impl Directory {
    fn set(&self, node: NodeId, address: SocketAddr) {
        self.0.lock().expect("not poisoned").insert(node, address);
    }
}

impl PeerAddresses for Directory {
    fn address_of(&self, node: NodeId) -> Option<SocketAddr> {
        self.0.lock().expect("not poisoned").get(&node).copied()
    }

    fn nodes(&self) -> Vec<NodeId> {
        self.0.lock().expect("not poisoned").keys().copied().collect()
    }
}

/// A running [`PeerServer`] on a port of its own.
struct Served {
    address: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Served {
    async fn start(node: NodeId, secret: PeerSecret, handler: Arc<dyn PeerHandler>, timeouts: PeerTimeouts) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let address = listener.local_addr().expect("bound");
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(PeerServer::new(node, secret, handler, timeouts).serve(listener, stopped));
        Self { address, stop, task }
    }

    /// Stops the server and waits until it has closed its links.
    async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(WAIT, self.task).await.expect("the server stops promptly").expect("no panic");
    }
}

/// A node serving with a [`Recorder`], and a bus on another node that knows where it is.
struct Pair {
    recorder: Arc<Recorder>,
    watch: Watch,
    directory: Arc<Directory>,
    bus: PeerBus,
    served: Served,
}

impl Pair {
    async fn start() -> Self {
        Self::start_with(secret(SECRET), timeouts()).await
    }

    /// The bus proves itself with `caller_secret`; the server expects [`SECRET`].
    async fn start_with(caller_secret: PeerSecret, timeouts: PeerTimeouts) -> Self {
        let (recorder, watch) = Recorder::new();
        let served = Served::start(CALLED, secret(SECRET), Arc::clone(&recorder) as _, timeouts).await;
        let directory = Arc::new(Directory::default());
        directory.set(CALLED, served.address);
        let bus = PeerBus::new(CALLER, caller_secret, Arc::clone(&directory) as _, timeouts);
        Self { recorder, watch, directory, bus, served }
    }
}

/// Asserts `error` is a [`BusError::Failed`] for `node` whose cause contains `needle`:
/// the request never reached the peer.
fn assert_failed(error: &BusError, node: NodeId, needle: &str) {
    match error {
        BusError::Failed { node: failed, cause } => {
            assert_eq!(*failed, node, "{cause}");
            assert!(cause.to_string().contains(needle), "{needle:?} not in {cause:?}");
        }
        other => panic!("expected a failure mentioning {needle:?}, got {other:?}"),
    }
    assert!(!error.may_have_landed());
}

/// Asserts `error` is a [`BusError::Late`] for `node` whose cause contains `needle`: the
/// request went out and its answer did not come in time.
fn assert_late(error: &BusError, node: NodeId, needle: &str) {
    match error {
        BusError::Late { node: late, cause } => {
            assert_eq!(*late, node, "{cause}");
            assert!(cause.to_string().contains(needle), "{needle:?} not in {cause:?}");
        }
        other => panic!("expected a late answer mentioning {needle:?}, got {other:?}"),
    }
    assert!(error.may_have_landed());
}

/// Writes one raw frame, as a peer would.
async fn write_frame(stream: &mut TcpStream, body: Body) {
    let frame = wire::PeerFrame { body: Some(body) };
    let mut bytes = BytesMut::new();
    bytes.put_u32(u32::try_from(frame.encoded_len()).expect("small"));
    frame.encode(&mut bytes).expect("encodes");
    stream.write_all(&bytes).await.expect("written");
}

/// The next frame's body, or `None` once the other side closed the link.
async fn read_frame(stream: &mut TcpStream) -> Option<Body> {
    let read = async {
        let len = stream.read_u32().await.ok()?;
        let mut buffer = vec![0; usize::try_from(len).ok()?];
        stream.read_exact(&mut buffer).await.ok()?;
        Some(wire::PeerFrame::decode(buffer.as_slice()).expect("a valid frame").body.expect("a body"))
    };
    tokio::time::timeout(WAIT, read).await.expect("a frame or the end of the link in time")
}
