//! Node-to-node links over real TCP on 127.0.0.1: a [`PeerBus`] calling a [`PeerServer`]
//! whose [`PeerHandler`] records what it is asked, so each test sees exactly what crossed
//! the link. Some tests speak the link's raw frames, as a broken or hostile peer would.
//!
//! Nothing here waits for time to pass: slow handlers are held on gates the test opens, and
//! the only timing checked is that a failure came before its deadline.

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

/// Asserts `error` is a [`BusError::Failed`] for `node` whose reason contains `needle`:
/// the request never reached the peer.
fn assert_failed(error: &BusError, node: NodeId, needle: &str) {
    match error {
        BusError::Failed { node: failed, reason } => {
            assert_eq!(*failed, node, "{reason}");
            assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
        }
        other => panic!("expected a failure mentioning {needle:?}, got {other:?}"),
    }
    assert!(!error.may_have_landed());
}

/// Asserts `error` is a [`BusError::Late`] for `node` whose reason contains `needle`: the
/// request went out and its answer did not come in time.
fn assert_late(error: &BusError, node: NodeId, needle: &str) {
    match error {
        BusError::Late { node: late, reason } => {
            assert_eq!(*late, node, "{reason}");
            assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
        }
        other => panic!("expected a late answer mentioning {needle:?}, got {other:?}"),
    }
    assert!(error.may_have_landed());
}

#[tokio::test]
async fn every_bus_call_reaches_the_handler_with_exactly_what_was_given() {
    let pair = Pair::start().await;
    let message = Arc::new(message());
    let users = vec![user("bob"), user("carol.d@x-1")];
    let route = Route {
        user: user("bob"),
        device: device("laptop"),
        node: CALLED,
        connection: ConnectionId(u64::MAX),
        connected_at_ms: 5,
        parked: false,
    };
    let request = send_request(12, 0);

    let ack = pair.bus.forward_send(CALLED, request.clone(), queued()).await.expect("forwarded");
    assert_eq!((ack.to, ack.rid, ack.ack), (request.origin.clone(), 12, ack_for(&request)));
    pair.bus.deliver(CALLED, Arc::clone(&message), &users, Addressed::ByRoute).await.expect("delivered");
    pair.bus.publish_room(&[CALLED], Arc::clone(&message)).await.expect("published");
    let ledger = pair.bus.take_over(&route).await.expect("kicked");
    assert_eq!(ledger, Some(handed_ledger()), "the ledger survives its wire form");
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("dm:alice:bob")).await, Ok(Some(41)));
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("room:idle")).await, Ok(None));
    pair.bus.deliver(CALLED, Arc::clone(&message), &users, Addressed::Everywhere).await.expect("delivered");
    let announcement = SendRequest { announcement: true, ..send_request(13, 0) };
    pair.bus.forward_send(CALLED, announcement.clone(), queued()).await.expect("forwarded");

    let calls = pair.recorder.calls();
    assert_eq!(calls.len(), 8, "{calls:?}");
    let Recorded::Send(sent) = &calls[0] else { panic!("not a send: {calls:?}") };
    assert_eq!((&sent.origin, sent.rid, &sent.send), (&request.origin, request.rid, &request.send));
    assert!(!sent.announcement, "a client's send: {sent:?}");
    assert!(
        matches!(&calls[1], Recorded::Deliver(m, u, Addressed::ByRoute) if *m == *message && *u == users),
        "{calls:?}"
    );
    assert!(matches!(&calls[2], Recorded::PublishRoom(m) if *m == *message), "{calls:?}");
    assert!(matches!(&calls[3], Recorded::Kick(r, Some(to)) if *r == route && *to == CALLER), "{calls:?}");
    assert!(matches!(&calls[4], Recorded::LowestInFlight(c) if c.as_str() == "dm:alice:bob"), "{calls:?}");
    assert!(matches!(&calls[5], Recorded::LowestInFlight(c) if c.as_str() == "room:idle"), "{calls:?}");
    assert!(
        matches!(&calls[6], Recorded::Deliver(m, u, Addressed::Everywhere) if *m == *message && *u == users),
        "sent to every node, and said so: {calls:?}"
    );
    let Recorded::Send(sent) = &calls[7] else { panic!("not a send: {calls:?}") };
    assert_eq!((sent.rid, &sent.send), (announcement.rid, &announcement.send));
    assert!(sent.announcement, "an announcement arrives as one: {sent:?}");
}

#[tokio::test]
async fn forward_send_returns_the_owners_ack_before_its_fan_out_runs() {
    let mut pair = Pair::start().await;
    pair.recorder.fan_outs.send_replace(false);
    // The fan-out cannot run yet, so the ack did not wait for it.
    let ack = pair.bus.forward_send(CALLED, send_request(5, 0), queued()).await.expect("forwarded");
    assert_eq!(ack.ack.seq, 1_005);
    assert!(pair.watch.fanned_out.try_recv().is_err(), "the fan-out ran while held");
    pair.recorder.fan_outs.send_replace(true);
    let ran = tokio::time::timeout(WAIT, pair.watch.fanned_out.recv()).await.expect("the fan-out runs");
    assert_eq!(ran, Some(5));
}

#[tokio::test]
async fn a_hundred_concurrent_sends_share_one_link_and_each_gets_its_own_ack() {
    let pair = Pair::start().await;
    let relay = Relay::start(pair.served.address).await;
    pair.directory.set(CALLED, relay.address);
    // The first sent takes longest, so answers come back in the reverse order.
    let sends = (0..100u32).map(|rid| {
        let bus = &pair.bus;
        async move { (rid, bus.forward_send(CALLED, send_request(rid, 100 - rid), queued()).await) }
    });
    for (rid, answer) in futures_util::future::join_all(sends).await {
        let ack = answer.unwrap_or_else(|error| panic!("send {rid}: {error}"));
        assert_eq!(ack.rid, rid);
        assert_eq!(ack.ack, ack_for(&send_request(rid, 100 - rid)));
    }
    assert_eq!(relay.connections.load(Ordering::SeqCst), 1, "one link carried every request");
}

/// A connection's sends, each handed over once the one before it was queued (as the
/// pipeline does), are admitted by the called node in the order they were sent, however the
/// tasks answering them are scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_connections_sends_are_admitted_in_the_order_they_were_handed_over() {
    let pair = Pair::start().await;
    let bus = Arc::new(pair.bus);
    let mut answers = Vec::new();
    for rid in 0..200u32 {
        let (queued, on_queued) = tokio::sync::oneshot::channel();
        let bus = Arc::clone(&bus);
        answers.push(tokio::spawn(async move { bus.forward_send(CALLED, send_request(rid, 0), queued).await }));
        on_queued.await.expect("queued");
    }
    for answer in answers {
        answer.await.expect("no panic").expect("answered");
    }
    let admitted: Vec<u32> = pair
        .recorder
        .calls()
        .iter()
        .filter_map(|call| match call {
            Recorded::Send(request) => Some(request.rid),
            _ => None,
        })
        .collect();
    assert_eq!(admitted, (0..200).collect::<Vec<_>>(), "admitted in the order handed over");
}

#[tokio::test]
async fn a_slow_send_does_not_hold_up_a_delivery_on_the_same_link() {
    let mut pair = Pair::start().await;
    pair.recorder.sends.send_replace(false);
    let bus = Arc::new(pair.bus);
    let slow = tokio::spawn({
        let bus = Arc::clone(&bus);
        async move { bus.forward_send(CALLED, send_request(1, 0), queued()).await }
    });
    assert_eq!(tokio::time::timeout(WAIT, pair.watch.started.recv()).await.expect("the send starts"), Some(1));
    bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute)
        .await
        .expect("delivered while the send waits");
    assert!(!slow.is_finished(), "the send was held, yet answered");
    pair.recorder.sends.send_replace(true);
    let ack = slow.await.expect("no panic").expect("the send is answered once released");
    assert_eq!(ack.ack.seq, 1_001);
}

#[tokio::test]
async fn a_caller_with_the_wrong_secret_is_refused_and_the_handler_never_called() {
    let pair = Pair::start_with(secret("not the secret"), timeouts()).await;
    let error = pair.bus.forward_send(CALLED, send_request(1, 0), queued()).await.expect_err("refused");
    assert_failed(&error, CALLED, "cluster.secret");
    // Later calls are refused without another attempt, still saying why.
    let error =
        pair.bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute).await.expect_err("refused");
    assert_failed(&error, CALLED, "cluster.secret");
    assert!(pair.recorder.calls().is_empty(), "{:?}", pair.recorder.calls());
}

#[tokio::test]
async fn a_node_without_an_address_is_unreachable() {
    let pair = Pair::start().await;
    let nowhere = NodeId(9);
    let message = Arc::new(message());
    assert_eq!(
        pair.bus.forward_send(nowhere, send_request(1, 0), queued()).await.map(|_| ()),
        Err(BusError::Unreachable(nowhere))
    );
    assert_eq!(
        pair.bus.deliver(nowhere, Arc::clone(&message), &[user("bob")], Addressed::ByRoute).await,
        Err(BusError::Unreachable(nowhere))
    );
    let route = Route {
        user: user("bob"),
        device: device("laptop"),
        node: nowhere,
        connection: ConnectionId(1),
        connected_at_ms: 0,
        parked: false,
    };
    assert_eq!(pair.bus.take_over(&route).await, Err(BusError::Unreachable(nowhere)));
    assert_eq!(pair.bus.lowest_in_flight(nowhere, &conversation("grp:x")).await, Err(BusError::Unreachable(nowhere)));
    // The nodes that can be reached still get a room message; the error names only the
    // one that could not be.
    assert_eq!(pair.bus.publish_room(&[nowhere, CALLED], message).await, Err(vec![BusError::Unreachable(nowhere)]));
    assert!(matches!(pair.recorder.calls().as_slice(), [Recorded::PublishRoom(_)]), "{:?}", pair.recorder.calls());
}

#[tokio::test]
async fn publish_room_reaches_every_node_named() {
    let pair = Pair::start().await;
    let (other, _watch) = Recorder::new();
    let third = NodeId(3);
    let served = Served::start(third, secret(SECRET), Arc::clone(&other) as _, timeouts()).await;
    pair.directory.set(third, served.address);
    pair.bus.publish_room(&[CALLED, third], Arc::new(message())).await.expect("published to both");
    for recorder in [&pair.recorder, &other] {
        assert!(matches!(recorder.calls().as_slice(), [Recorded::PublishRoom(m)] if *m == message()));
    }
}

#[tokio::test]
async fn route_and_group_changes_are_announced_to_every_other_live_node_and_waited_for() {
    let pair = Pair::start().await;
    let (other, _watch) = Recorder::new();
    let third = NodeId(3);
    let served = Served::start(third, secret(SECRET), Arc::clone(&other) as _, timeouts()).await;
    pair.directory.set(third, served.address);
    // The caller itself is listed too (as membership lists every member): it is skipped.
    pair.directory.set(CALLER, "127.0.0.1:9".parse().expect("an address"));
    let mut peers = pair.bus.peers();
    peers.sort();
    assert_eq!(peers, vec![CALLED, third], "the other live nodes, not this one");
    let users = vec![user("bob"), user("carol")];
    pair.bus.routes_changed(&users).await;
    let group = GroupId::parse("team").expect("valid");
    pair.bus.group_changed(&group).await;
    for recorder in [&pair.recorder, &other] {
        assert!(
            matches!(recorder.calls().as_slice(), [Recorded::RoutesChanged(u), Recorded::GroupChanged(g)] if *u == users && *g == group),
            "{:?}",
            recorder.calls()
        );
    }
}

/// Holds a send in flight on `pair`'s link, stops the server under it, and checks that the
/// send fails at once — before its deadline — because the link closed.
async fn go_away_mid_request(pair: Pair) -> (PeerBus, Arc<Directory>) {
    let Pair { recorder, mut watch, directory, bus, served } = pair;
    recorder.sends.send_replace(false);
    let bus = Arc::new(bus);
    let started_at = Instant::now();
    let in_flight = tokio::spawn({
        let bus = Arc::clone(&bus);
        async move { bus.forward_send(CALLED, send_request(1, 0), queued()).await }
    });
    assert_eq!(tokio::time::timeout(WAIT, watch.started.recv()).await.expect("the send starts"), Some(1));
    served.stop().await;
    let error = in_flight.await.expect("no panic").expect_err("its peer went away");
    assert!(matches!(&error, BusError::Broken { node: CALLED, .. }), "not failed by the broken link: {error:?}");
    assert!(error.may_have_landed(), "it went out before the link broke");
    assert!(started_at.elapsed() < timeouts().forward_send, "failed only at its deadline");
    recorder.sends.send_replace(true);
    (Arc::into_inner(bus).expect("the call ended"), directory)
}

#[tokio::test]
async fn a_peer_going_away_fails_its_requests_at_once_and_a_restarted_peer_is_reached_again() {
    let (bus, directory) = go_away_mid_request(Pair::start().await).await;
    // The node comes back on another port, and the next call reaches it there.
    let (recorder, _watch) = Recorder::new();
    let restarted = Served::start(CALLED, secret(SECRET), Arc::clone(&recorder) as _, timeouts()).await;
    directory.set(CALLED, restarted.address);
    bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute)
        .await
        .expect("the restarted node answers");
    assert!(matches!(recorder.calls().as_slice(), [Recorded::Deliver(..)]), "{:?}", recorder.calls());
}

#[tokio::test]
async fn a_peer_restarted_on_the_same_address_is_reached_again() {
    let pair = Pair::start().await;
    let address = pair.served.address;
    let (bus, _directory) = go_away_mid_request(pair).await;
    let (recorder, _watch) = Recorder::new();
    // The port was released by this test's own server a moment ago; take it again.
    let listener = TcpListener::bind(address).await.expect("the port is free again");
    let (_stop, stopped) = watch::channel(false);
    tokio::spawn(
        PeerServer::new(CALLED, secret(SECRET), Arc::clone(&recorder) as _, timeouts()).serve(listener, stopped),
    );
    bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute).await.expect("reconnected");
    assert!(matches!(recorder.calls().as_slice(), [Recorded::Deliver(..)]), "{:?}", recorder.calls());
}

#[tokio::test]
async fn failed_connects_back_off_and_a_new_address_is_tried_at_once() {
    let slow_retries =
        PeerTimeouts { reconnect_min: Duration::from_secs(600), reconnect_max: Duration::from_secs(600), ..timeouts() };
    let pair = Pair::start_with(secret(SECRET), slow_retries).await;
    let vacant = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        listener.local_addr().expect("bound")
    };
    pair.directory.set(CALLED, vacant);
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("nobody listens");
    assert_failed(&error, CALLED, "cannot connect");
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("backing off");
    assert_failed(&error, CALLED, "next attempt in");
    pair.directory.set(CALLED, pair.served.address);
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await, Ok(Some(41)));
}

#[tokio::test]
async fn a_silent_peer_costs_one_deadline_then_calls_fail_at_once() {
    // Accepts TCP (the kernel's backlog does) but never says a word.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
    let quick = PeerTimeouts {
        request: Duration::from_millis(300),
        reconnect_min: Duration::from_secs(600),
        reconnect_max: Duration::from_secs(600),
        ..timeouts()
    };
    let pair = Pair::start_with(secret(SECRET), quick).await;
    pair.directory.set(CALLED, silent.local_addr().expect("bound"));
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("no challenge comes");
    assert_failed(&error, CALLED, "did not answer lowest_in_flight within 300ms");
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("backing off");
    assert_failed(&error, CALLED, "did not finish in time; next attempt in");
    pair.directory.set(CALLED, pair.served.address);
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await, Ok(Some(41)));
}

#[tokio::test]
async fn a_peer_that_keeps_timing_out_opens_its_breaker_then_calls_fail_at_once_until_it_answers_again() {
    let quick = PeerTimeouts { forward_send: Duration::from_millis(200), ..timeouts() };
    let mut pair = Pair::start_with(secret(SECRET), quick).await;
    pair.bus = PeerBus::new(CALLER, secret(SECRET), Arc::clone(&pair.directory) as _, quick)
        .with_breakers(BreakerConfig { failures: 3, span: Duration::ZERO, open_for: Duration::from_millis(300) });
    let breaker_of = |bus: &PeerBus| {
        let breakers = bus.breakers();
        assert_eq!(breakers.len(), 1, "one peer called: {breakers:?}");
        assert_eq!(breakers[0].name, format!("peer:{CALLED}"));
        breakers[0].clone()
    };
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await, Ok(Some(41)), "the link is open");
    // The peer reads each send, but never answers (an overloaded or stuck node).
    pair.recorder.sends.send_replace(false);
    for rid in 1..=3 {
        let error = pair.bus.forward_send(CALLED, send_request(rid, 0), queued()).await.expect_err("no answer");
        assert_late(&error, CALLED, "did not answer forward_send within 200ms");
    }
    assert_eq!(breaker_of(&pair.bus).state, BreakerState::Open);
    let error = pair.bus.forward_send(CALLED, send_request(4, 0), queued()).await.expect_err("not even sent");
    assert_failed(&error, CALLED, "circuit breaker is open");
    let sends = pair.recorder.calls().iter().filter(|call| matches!(call, Recorded::Send(_))).count();
    assert_eq!(sends, 3, "the refused call never reached the peer");

    // The peer answers again: the first call after the open period goes through (over a
    // fresh link) and closes the breaker.
    pair.recorder.sends.send_replace(true);
    let ack = poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .until("the peer to be asked again", async || {
            pair.bus.forward_send(CALLED, send_request(5, 0), queued()).await.map_err(|error| format!("{error:?}"))
        })
        .await;
    assert_eq!(ack.ack, ack_for(&send_request(5, 0)));
    let status = breaker_of(&pair.bus);
    assert_eq!((status.state, status.opened), (BreakerState::Closed, 1));
    assert!(status.refused >= 1, "{status:?}");
}

#[tokio::test]
async fn a_peer_that_cannot_prove_the_secret_or_is_another_node_is_not_used() {
    for (answering, proof, expected) in [
        (CALLED, Bytes::from_static(&[0; 32]), "could not prove it knows cluster.secret"),
        (NodeId(5), Bytes::new(), "is node 5, not node 2"),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let directory = Arc::new(Directory::default());
        directory.set(CALLED, listener.local_addr().expect("bound"));
        let impostor = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("a caller");
            let nonce = Bytes::from_static(&[1; 32]);
            let challenge = wire::Challenge { protocol_version: PROTOCOL_VERSION, node_id: answering.0, nonce };
            write_frame(&mut stream, Body::Challenge(challenge)).await;
            if let Some(Body::Hello(_)) = read_frame(&mut stream).await {
                write_frame(&mut stream, Body::Welcome(wire::Welcome { proof })).await;
            }
            stream
        });
        let bus = PeerBus::new(CALLER, secret(SECRET), directory as _, timeouts());
        let error =
            bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute).await.expect_err("not used");
        assert_failed(&error, CALLED, expected);
        drop(impostor.await);
    }
}

// Raw frames: the link as a broken or hostile peer speaks it.

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

/// Opens a link to `address` as node `node` with `secret`, speaking `version`; returns the
/// stream and the called node's answer to the hello.
async fn raw_link(address: SocketAddr, node: NodeId, secret: &str, version: u32) -> (TcpStream, Option<Body>) {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let Some(Body::Challenge(challenge)) = read_frame(&mut stream).await else { panic!("no challenge") };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(b"herald-peer client");
    mac.update(&challenge.nonce);
    mac.update(&node.0.to_be_bytes());
    let proof = Bytes::copy_from_slice(&mac.finalize().into_bytes());
    let hello = wire::Hello { protocol_version: version, node_id: node.0, proof, nonce: Bytes::from_static(&[2; 32]) };
    write_frame(&mut stream, Body::Hello(hello)).await;
    let answer = read_frame(&mut stream).await;
    (stream, answer)
}

fn request(id: u64, kind: Option<wire::request::Kind>) -> Body {
    Body::Request(wire::Request { id, kind })
}

#[tokio::test]
async fn malformed_requests_are_answered_with_a_failure_and_the_link_stays_open() {
    let pair = Pair::start().await;
    let (mut stream, welcome) = raw_link(pair.served.address, CALLER, SECRET, PROTOCOL_VERSION).await;
    assert!(matches!(welcome, Some(Body::Welcome(_))), "{welcome:?}");

    let stored = wire::StoredMessage {
        message: Some(v1::Message {
            id: 1,
            conversation: "grp:x".to_owned(),
            seq: 1,
            sender: "alice".to_owned(),
            sender_device: "phone".to_owned(),
            ..v1::Message::default()
        }),
        client_msg_id: "123e4567-e89b-12d3-a456-426614174000".to_owned(),
    };
    let bad_user = wire::Deliver {
        message: Some(stored),
        users: vec!["bob".to_owned(), "not a user".to_owned()],
        unrouted: false,
    };
    let bad_conversation = wire::LowestInFlight { conversation: "chan:general".to_owned() };
    let no_route = wire::Kick { route: None, hand_over: true };
    // A send claiming to come from a connection on another node than the caller.
    let mut foreign = send_request(1, 0);
    foreign.origin.node = NodeId(7);
    let foreign = wire::ForwardSend {
        origin: Some(wire::Origin {
            user: foreign.origin.user.to_string(),
            device: foreign.origin.device.to_string(),
            node: foreign.origin.node.0,
            connection: foreign.origin.connection.0,
        }),
        rid: foreign.rid,
        send: Some(foreign.send),
        announcement: false,
    };
    for (id, kind) in [
        (1, Some(wire::request::Kind::Deliver(bad_user))),
        (2, Some(wire::request::Kind::LowestInFlight(bad_conversation))),
        (3, Some(wire::request::Kind::Kick(no_route))),
        (4, None),
        (5, Some(wire::request::Kind::ForwardSend(foreign))),
    ] {
        write_frame(&mut stream, request(id, kind)).await;
        let Some(Body::Response(response)) = read_frame(&mut stream).await else { panic!("no response to {id}") };
        assert_eq!(response.id, id);
        let Some(wire::response::Outcome::Failure(failure)) = response.outcome else { panic!("{id} was accepted") };
        assert_eq!(failure.code(), wire::failure::Code::BadRequest, "{}", failure.message);
        if id == 1 {
            assert!(failure.message.contains("user id contains ' '"), "{}", failure.message);
        }
    }
    let good = wire::LowestInFlight { conversation: "room:lobby".to_owned() };
    write_frame(&mut stream, request(6, Some(wire::request::Kind::LowestInFlight(good)))).await;
    let Some(Body::Response(response)) = read_frame(&mut stream).await else { panic!("the link closed") };
    assert_eq!(response.outcome, Some(wire::response::Outcome::InFlight(wire::InFlight { seq: Some(41) })));
    assert!(matches!(pair.recorder.calls().as_slice(), [Recorded::LowestInFlight(_)]), "{:?}", pair.recorder.calls());
}

#[tokio::test]
async fn an_oversized_or_garbled_frame_closes_the_link() {
    let pair = Pair::start().await;
    let oversized = 5u32 * 1024 * 1024;
    for bytes in [oversized.to_be_bytes().to_vec(), vec![0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]] {
        let (mut stream, welcome) = raw_link(pair.served.address, CALLER, SECRET, PROTOCOL_VERSION).await;
        assert!(matches!(welcome, Some(Body::Welcome(_))), "{welcome:?}");
        stream.write_all(&bytes).await.expect("written");
        assert_eq!(read_frame(&mut stream).await, None, "the link stayed open after {bytes:?}");
    }
    // A frame that is not a request, on an open link.
    let (mut stream, _) = raw_link(pair.served.address, CALLER, SECRET, PROTOCOL_VERSION).await;
    write_frame(&mut stream, Body::Welcome(wire::Welcome { proof: Bytes::new() })).await;
    assert_eq!(read_frame(&mut stream).await, None);
    assert!(pair.recorder.calls().is_empty());
}

#[tokio::test]
async fn a_caller_speaking_another_protocol_version_is_refused_naming_both() {
    let pair = Pair::start().await;
    let (mut stream, answer) = raw_link(pair.served.address, CALLER, SECRET, 99).await;
    let Some(Body::Refused(refused)) = answer else { panic!("accepted: {answer:?}") };
    assert_eq!(refused.reason(), wire::refused::Reason::Version);
    assert!(refused.message.contains("version 99") && refused.message.contains(&format!("version {PROTOCOL_VERSION}")));
    assert_eq!(read_frame(&mut stream).await, None, "the link is closed after a refusal");
}

#[tokio::test]
async fn a_wrong_proof_is_refused_on_the_wire() {
    let pair = Pair::start().await;
    let (mut stream, answer) = raw_link(pair.served.address, CALLER, "guessed", PROTOCOL_VERSION).await;
    let Some(Body::Refused(refused)) = answer else { panic!("accepted: {answer:?}") };
    assert_eq!(refused.reason(), wire::refused::Reason::Secret);
    assert!(!refused.message.contains(SECRET));
    assert_eq!(read_frame(&mut stream).await, None);
}

#[tokio::test]
async fn a_caller_that_sends_no_hello_is_dropped() {
    let quick_hello = PeerTimeouts { hello: Duration::from_millis(200), ..timeouts() };
    let pair = Pair::start_with(secret(SECRET), quick_hello).await;
    let mut stream = TcpStream::connect(pair.served.address).await.expect("connect");
    assert!(matches!(read_frame(&mut stream).await, Some(Body::Challenge(_))));
    assert_eq!(read_frame(&mut stream).await, None, "the silent link was kept");
}

/// A TCP relay in front of a server that counts the connections passing through it.
struct Relay {
    address: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let address = listener.local_addr().expect("bound");
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut outbound = TcpStream::connect(target).await.expect("the target listens");
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Self { address, connections }
    }
}
