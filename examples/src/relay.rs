//! `herald-relay`: the least a server can do and still carry Herald's v1 protocol — accept
//! `connect` with any `dev:<user>` token, acknowledge each `send` with ids from a counter,
//! push a `deliver` to the recipients' connections, answer `ping`. Nothing is stored, no
//! delivery is retried, `deliver_ack` is ignored.
//!
//! It exists as the baseline of the load generator: the same clients against the relay and
//! against Herald show what persistence, ordering and redelivery cost.
//!
//! Rooms are its broadcast baseline, for the load generator's room mode: `subscribe` to a
//! `room:` conversation, and a `send` to it (from a connection subscribed to it, as
//! PROTOCOL.md requires) goes to every other subscriber, one `deliver` each, encoded once
//! per encoding however many subscribers there are.
//!
//! Invariants: each connection has one writer task behind a bounded queue (a full queue
//! closes that connection with 4008, as PROTOCOL.md says, instead of growing memory or
//! stalling senders); the shared tables are only locked for map look-ups and non-blocking
//! queue pushes, never across an await.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        Arc, OnceLock, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures_util::{SinkExt as _, StreamExt as _, stream::SplitSink};
use herald_proto::{
    DecodeLimits, Encoding,
    v1::{self, Frame, frame::Body, send_ack::Status},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Notify, mpsc, oneshot},
};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        handshake::server::{ErrorResponse, Request, Response},
        http::{HeaderValue, StatusCode, header::SEC_WEBSOCKET_PROTOCOL},
        protocol::{CloseFrame, frame::coding::CloseCode},
    },
};

use crate::{
    connection::{Received, frame_to_message, message_to_frame, websocket_config},
    ids::{ConversationKind, is_valid_name, parse_conversation},
};

/// Close codes of PROTOCOL.md that the relay uses.
mod close {
    pub const NORMAL: u16 = 1000;
    pub const BAD_TOKEN: u16 = 4001;
    pub const NO_CONNECT: u16 = 4002;
    pub const SLOW_CONSUMER: u16 = 4008;
    pub const KICKED: u16 = 4009;
    pub const PROTOCOL_ERROR: u16 = 4010;
}

/// How the relay behaves; the defaults match PROTOCOL.md's.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Frames queued for one connection before it counts as a slow consumer (closed 4008).
    pub queue_capacity: usize,
    /// Largest accepted frame (close 1009 above it).
    pub max_frame_bytes: usize,
    /// How long a new connection has to send `connect` (close 4002 after).
    pub connect_timeout: Duration,
    /// The heartbeat interval announced in `connected`.
    pub heartbeat_ms: u32,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 4096,
            max_frame_bytes: DecodeLimits::DEFAULT_MAX_FRAME_BYTES,
            connect_timeout: Duration::from_secs(10),
            heartbeat_ms: 30_000,
        }
    }
}

/// A bound relay, ready to [`Relay::run`].
#[derive(Debug)]
pub struct Relay {
    /// Accepts WebSocket clients.
    listener: TcpListener,
    /// The routing tables and counters shared by every connection.
    hub: Arc<Hub>,
    /// Settings.
    config: RelayConfig,
}

impl Relay {
    /// Binds the listening socket (use port 0 for a free one).
    ///
    /// # Errors
    ///
    /// The bind error.
    pub async fn bind(address: SocketAddr, config: RelayConfig) -> std::io::Result<Self> {
        Ok(Self { listener: TcpListener::bind(address).await?, hub: Arc::new(Hub::default()), config })
    }

    /// The bound address.
    ///
    /// # Errors
    ///
    /// The socket's error, if it has none (practically never).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until `shutdown` completes; connections already open are left to
    /// end with the runtime.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let hub = Arc::clone(&self.hub);
                        let config = self.config.clone();
                        tokio::spawn(serve_connection(stream, hub, config));
                    }
                    // Out of descriptors or similar: back off instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                },
            }
        }
    }

    /// Binds 127.0.0.1 on a free port and runs in a background task: for tests.
    ///
    /// # Errors
    ///
    /// The bind error.
    pub async fn spawn_local(config: RelayConfig) -> std::io::Result<RelayHandle> {
        let relay = Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config).await?;
        let address = relay.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(relay.run(async {
            let _ = stopped.await;
        }));
        Ok(RelayHandle { address, _stop: stop })
    }
}

/// A relay running in the background; dropping it stops accepting connections.
#[derive(Debug)]
pub struct RelayHandle {
    /// Where it listens.
    pub address: SocketAddr,
    /// Dropped with the handle, which ends the accept loop.
    _stop: oneshot::Sender<()>,
}

impl RelayHandle {
    /// The WebSocket URL of the relay's `/v1/ws`.
    pub fn url(&self) -> String {
        format!("ws://{}/v1/ws", self.address)
    }
}

/// What the writer task of a connection is asked to do.
#[derive(Debug)]
enum Outbound {
    /// Write a frame.
    Frame(Frame),
    /// Write a frame that many connections get.
    Broadcast(Arc<Broadcast>),
    /// Close the WebSocket with this code and reason, then stop.
    Close(u16, &'static str),
}

/// A frame pushed to many connections (a room message): encoded at most once per
/// encoding, by the first writer that needs it, however many subscribers get it.
#[derive(Debug)]
struct Broadcast {
    /// The frame.
    frame: Frame,
    /// Its protobuf message, once encoded (`None` if it could not be).
    proto: OnceLock<Option<Message>>,
    /// Its JSON message, once encoded.
    json: OnceLock<Option<Message>>,
}

impl Broadcast {
    fn new(frame: Frame) -> Arc<Self> {
        Arc::new(Self { frame, proto: OnceLock::new(), json: OnceLock::new() })
    }

    /// The WebSocket message for a connection using `encoding`.
    fn message(&self, encoding: Encoding) -> Option<Message> {
        let cell = match encoding {
            Encoding::Proto => &self.proto,
            Encoding::Json => &self.json,
        };
        cell.get_or_init(|| frame_to_message(&self.frame, encoding).ok()).clone()
    }
}

/// One open connection as seen by others: how to push it frames.
#[derive(Debug, Clone)]
struct Peer {
    /// Unique per connection, to find it again on disconnect.
    connection: u64,
    /// The device it logged in as, to kick a second login of the same device.
    device: String,
    /// Its writer's queue.
    queue: mpsc::Sender<Outbound>,
    /// Signalled when the queue overflowed: the writer then closes with 4008.
    overflow: Arc<Notify>,
}

impl Peer {
    /// Queues a frame without waiting; a full queue marks the peer as a slow consumer.
    fn push(&self, frame: Frame) {
        self.push_outbound(Outbound::Frame(frame));
    }

    /// Queues a frame shared with other connections, as [`Peer::push`].
    fn push_broadcast(&self, broadcast: &Arc<Broadcast>) {
        self.push_outbound(Outbound::Broadcast(Arc::clone(broadcast)));
    }

    fn push_outbound(&self, outbound: Outbound) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.queue.try_send(outbound) {
            self.overflow.notify_one();
        }
    }
}

/// The relay's shared state: who is connected, who listens to which room, and the
/// counter that hands out message ids.
#[derive(Debug, Default)]
struct Hub {
    /// Source of connection numbers.
    next_connection: AtomicU64,
    /// Source of message ids and seqs (one counter for both: gaps in seq are allowed).
    last_message_id: AtomicU64,
    /// Connections by user id.
    users: RwLock<HashMap<String, Vec<Peer>>>,
    /// Subscribed connections by room conversation id.
    rooms: RwLock<HashMap<String, Vec<Peer>>>,
}

impl Hub {
    /// Registers a logged-in connection, kicking an earlier one of the same user and device.
    fn login(&self, user: &str, peer: Peer) {
        let mut users = self.users.write().unwrap_or_else(|poison| poison.into_inner());
        let peers = users.entry(user.to_owned()).or_default();
        peers.retain(|other| {
            if other.device == peer.device {
                let _ =
                    other.queue.try_send(Outbound::Close(close::KICKED, "the same user and device connected again"));
                false
            } else {
                true
            }
        });
        peers.push(peer);
    }

    /// Forgets a connection everywhere.
    fn logout(&self, user: &str, connection: u64, rooms: &HashSet<String>) {
        let mut users = self.users.write().unwrap_or_else(|poison| poison.into_inner());
        if let Some(peers) = users.get_mut(user) {
            peers.retain(|peer| peer.connection != connection);
            if peers.is_empty() {
                users.remove(user);
            }
        }
        drop(users);
        let mut all_rooms = self.rooms.write().unwrap_or_else(|poison| poison.into_inner());
        for room in rooms {
            if let Some(peers) = all_rooms.get_mut(room) {
                peers.retain(|peer| peer.connection != connection);
                if peers.is_empty() {
                    all_rooms.remove(room);
                }
            }
        }
    }

    fn subscribe(&self, room: &str, peer: Peer) {
        let mut rooms = self.rooms.write().unwrap_or_else(|poison| poison.into_inner());
        let peers = rooms.entry(room.to_owned()).or_default();
        if !peers.iter().any(|other| other.connection == peer.connection) {
            peers.push(peer);
        }
    }

    fn unsubscribe(&self, room: &str, connection: u64) {
        let mut rooms = self.rooms.write().unwrap_or_else(|poison| poison.into_inner());
        if let Some(peers) = rooms.get_mut(room) {
            peers.retain(|peer| peer.connection != connection);
            if peers.is_empty() {
                rooms.remove(room);
            }
        }
    }

    /// Pushes `frame` to every connection of `users` except `skip`.
    fn push_to_users(&self, users: &[&str], skip: u64, frame: &Frame) {
        let table = self.users.read().unwrap_or_else(|poison| poison.into_inner());
        for user in users {
            for peer in table.get(*user).into_iter().flatten() {
                if peer.connection != skip {
                    peer.push(frame.clone());
                }
            }
        }
    }

    /// Pushes `frame` to every subscriber of `room` except `skip`: one `deliver` each,
    /// encoded once.
    fn push_to_room(&self, room: &str, skip: u64, frame: Frame) {
        let broadcast = Broadcast::new(frame);
        let rooms = self.rooms.read().unwrap_or_else(|poison| poison.into_inner());
        for peer in rooms.get(room).into_iter().flatten() {
            if peer.connection != skip {
                peer.push_broadcast(&broadcast);
            }
        }
    }
}

/// A logged-in connection's own state.
#[derive(Debug)]
struct Session {
    /// The authenticated user.
    user: String,
    /// Its device id.
    device: String,
    /// This connection as others see it.
    peer: Peer,
    /// Rooms this connection subscribed to, to clean up on disconnect.
    rooms: HashSet<String>,
}

/// Serves one TCP connection from handshake to close.
async fn serve_connection(stream: TcpStream, hub: Arc<Hub>, config: RelayConfig) {
    let _ = stream.set_nodelay(true);
    let mut encoding = Encoding::Proto;
    #[allow(clippy::result_large_err, reason = "the signature tungstenite's callback requires")]
    let negotiate = |request: &Request, response: Response| negotiate_subprotocol(request, response, &mut encoding);
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(
        stream,
        negotiate,
        Some(websocket_config(config.max_frame_bytes)),
    );
    let Ok(Ok(ws)) = tokio::time::timeout(config.connect_timeout, handshake).await else {
        return;
    };
    let (sink, mut stream) = ws.split();
    let (queue, outbound) = mpsc::channel(config.queue_capacity);
    let overflow = Arc::new(Notify::new());
    let writer = tokio::spawn(write_loop(sink, outbound, encoding, Arc::clone(&overflow)));
    let limits = DecodeLimits { max_frame_bytes: config.max_frame_bytes, ..DecodeLimits::default() };
    let reply = |frame: Frame| {
        if let Err(mpsc::error::TrySendError::Full(_)) = queue.try_send(Outbound::Frame(frame)) {
            overflow.notify_one();
        }
    };
    let close = |code, reason| {
        let _ = queue.try_send(Outbound::Close(code, reason));
    };

    // Before login: exactly one `connect`, within the timeout.
    let first = tokio::time::timeout(config.connect_timeout, stream.next()).await;
    let message = match first {
        Err(_) => {
            close(close::NO_CONNECT, "no connect within the connect timeout");
            let _ = writer.await;
            return;
        }
        Ok(None | Some(Err(_))) => return,
        Ok(Some(Ok(message))) => message,
    };
    let (rid, connect) = match message_to_frame(message, encoding, &limits) {
        Ok(Received::Frame(Frame { rid, body: Some(Body::Connect(connect)) })) => (rid, connect),
        Ok(Received::Frame(_)) => {
            close(close::PROTOCOL_ERROR, "the first frame must be connect");
            let _ = writer.await;
            return;
        }
        Ok(Received::Closed { .. } | Received::Control) => return,
        Err(_) => {
            close(close::PROTOCOL_ERROR, "undecodable frame");
            let _ = writer.await;
            return;
        }
    };
    let user = match connect.token.strip_prefix("dev:") {
        Some(user) if is_valid_name(user) => user.to_owned(),
        _ => {
            close(close::BAD_TOKEN, "the relay accepts only dev:<user> tokens");
            let _ = writer.await;
            return;
        }
    };
    if !is_valid_name(&connect.device_id) {
        close(close::PROTOCOL_ERROR, "invalid device_id");
        let _ = writer.await;
        return;
    }
    let connection = hub.next_connection.fetch_add(1, Ordering::Relaxed) + 1;
    let mut session = Session {
        user: user.clone(),
        device: connect.device_id.clone(),
        peer: Peer {
            connection,
            device: connect.device_id.clone(),
            queue: queue.clone(),
            overflow: Arc::clone(&overflow),
        },
        rooms: HashSet::new(),
    };
    hub.login(&user, session.peer.clone());
    reply(Frame::new(
        rid,
        v1::Connected {
            user_id: user.clone(),
            device_id: connect.device_id,
            node_id: 0,
            session_id: format!("relay-{connection}"),
            heartbeat_ms: config.heartbeat_ms,
            server_time_ms: now_ms(),
            // The relay never closes a silent client.
            client_timeout_ms: 0,
        },
    ));

    // Logged in: relay until the client leaves or the writer gives up.
    while let Some(Ok(message)) = stream.next().await {
        match message_to_frame(message, encoding, &limits) {
            Ok(Received::Frame(frame)) => {
                if let Err(reason) = handle_frame(&hub, &mut session, frame, &reply) {
                    close(close::PROTOCOL_ERROR, reason);
                    break;
                }
            }
            Ok(Received::Control) => {}
            Ok(Received::Closed { .. }) => {
                close(close::NORMAL, "bye");
                break;
            }
            Err(error) => {
                let code = match &error {
                    crate::ConnectionError::Decode(decode) => decode.close_code(),
                    _ => close::PROTOCOL_ERROR,
                };
                close(code, "undecodable frame");
                break;
            }
        }
    }
    hub.logout(&session.user, connection, &session.rooms);
    drop(session);
    drop(queue);
    let _ = writer.await;
}

/// Picks our subprotocol from the client's offer: the first one we know, `herald.v1.proto`
/// if the client offered none, and a 400 if it offered only others.
#[allow(clippy::result_large_err, reason = "the signature tungstenite's callback requires")]
fn negotiate_subprotocol(
    request: &Request,
    mut response: Response,
    chosen: &mut Encoding,
) -> Result<Response, ErrorResponse> {
    if request.uri().path() != "/v1/ws" {
        return Err(error_response(StatusCode::NOT_FOUND, "the relay serves /v1/ws only"));
    }
    let offered: Vec<&str> = request
        .headers()
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .collect();
    if offered.is_empty() {
        *chosen = Encoding::Proto;
        return Ok(response);
    }
    let Some(encoding) = offered.iter().find_map(|name| Encoding::from_subprotocol(name)) else {
        return Err(error_response(StatusCode::BAD_REQUEST, "offer subprotocol herald.v1.proto or herald.v1.json"));
    };
    *chosen = encoding;
    response.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(encoding.subprotocol()));
    Ok(response)
}

fn error_response(status: StatusCode, message: &str) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(message.to_owned()));
    *response.status_mut() = status;
    response
}

/// Handles one frame of a logged-in connection.
///
/// # Errors
///
/// The close reason if the frame is a protocol error (a second `connect`, or a frame only
/// servers send).
fn handle_frame(hub: &Hub, session: &mut Session, frame: Frame, reply: &impl Fn(Frame)) -> Result<(), &'static str> {
    let rid = frame.rid;
    match frame.body {
        Some(Body::Send(send)) => reply(Frame::new(rid, relay_send(hub, session, send))),
        Some(Body::DeliverAck(_)) | Some(Body::Pong(_)) | None => {}
        Some(Body::Ping(ping)) => reply(Frame::new(rid, v1::Pong { time_ms: ping.time_ms })),
        Some(Body::Subscribe(subscribe)) => {
            if matches!(parse_conversation(&subscribe.room), Some(ConversationKind::Room(_))) {
                hub.subscribe(&subscribe.room, session.peer.clone());
                let latest_seq = hub.last_message_id.load(Ordering::Relaxed);
                session.rooms.insert(subscribe.room.clone());
                reply(Frame::new(rid, v1::Subscribed { room: subscribe.room, latest_seq, messages: Vec::new() }));
            } else {
                reply(error_frame(rid, "invalid_room", "rooms are named room:<name>"));
            }
        }
        Some(Body::Unsubscribe(unsubscribe)) => {
            hub.unsubscribe(&unsubscribe.room, session.peer.connection);
            session.rooms.remove(&unsubscribe.room);
        }
        // Nothing is stored: history and sync are always empty.
        Some(Body::History(history)) => reply(Frame::new(
            rid,
            v1::HistoryReply { conversation: history.conversation, messages: Vec::new(), has_more: false },
        )),
        Some(Body::Sync(_)) => reply(Frame::new(rid, v1::SyncReply { conversations: Vec::new() })),
        Some(Body::Connect(_)) => return Err("connect was already received"),
        Some(_) => return Err("that frame only travels from server to client"),
    }
    Ok(())
}

/// Acknowledges a send and pushes it to the recipients: the other member of a dm (and the
/// sender's other devices), or the room's other subscribers.
fn relay_send(hub: &Hub, session: &Session, send: v1::Send) -> v1::SendAck {
    let v1::Send { client_msg_id, conversation, kind, body } = send;
    let rejected = |reason: &str| v1::SendAck {
        client_msg_id: client_msg_id.clone(),
        status: Status::Rejected.into(),
        conversation: conversation.clone(),
        reason: reason.to_owned(),
        ..v1::SendAck::default()
    };
    if client_msg_id.is_empty() {
        return rejected("client_msg_id is required");
    }
    let user = session.user.as_str();
    let recipients: Vec<&str> = match parse_conversation(&conversation) {
        Some(ConversationKind::Direct(low, high)) if user == low || user == high => {
            vec![low, high]
        }
        Some(ConversationKind::Direct(..)) => {
            return rejected("not a member of this dm conversation");
        }
        Some(ConversationKind::Room(_)) if session.rooms.contains(&conversation) => Vec::new(),
        Some(ConversationKind::Room(_)) => return rejected("subscribe to the room first"),
        Some(ConversationKind::Group(_)) => return rejected("the relay has no groups"),
        None => {
            return rejected("invalid conversation: use dm:<a>:<b> (a < b), grp:<id> or room:<name>");
        }
    };
    let id = hub.last_message_id.fetch_add(1, Ordering::Relaxed) + 1;
    let deliver = Frame::new(
        0,
        v1::Deliver {
            message: Some(v1::Message {
                id,
                conversation: conversation.clone(),
                seq: id,
                sender: session.user.clone(),
                sender_device: session.device.clone(),
                kind,
                body,
                sent_at_ms: now_ms(),
            }),
            attempt: 1,
        },
    );
    let connection = session.peer.connection;
    if recipients.is_empty() {
        hub.push_to_room(&conversation, connection, deliver);
    } else {
        hub.push_to_users(&recipients, connection, &deliver);
    }
    drop(recipients);
    v1::SendAck {
        client_msg_id,
        status: Status::Ok.into(),
        message_id: id,
        seq: id,
        conversation,
        ..v1::SendAck::default()
    }
}

fn error_frame(rid: u32, code: &str, message: &str) -> Frame {
    Frame::new(0, v1::Error { code: code.to_owned(), message: message.to_owned(), rid })
}

/// Writes queued frames, batching whatever is queued into one flush; closes with 4008
/// when the queue overflowed.
async fn write_loop(
    mut sink: SplitSink<WebSocketStream<TcpStream>, Message>,
    mut outbound: mpsc::Receiver<Outbound>,
    encoding: Encoding,
    overflow: Arc<Notify>,
) {
    const BATCH: usize = 64;
    let close_with = |code: u16, reason: &'static str| {
        Message::Close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() }))
    };
    loop {
        let first = tokio::select! {
            biased;
            () = overflow.notified() => {
                let reason = "send queue overflowed; reconnect and sync";
                let _ = sink.send(close_with(close::SLOW_CONSUMER, reason)).await;
                return;
            }
            next = outbound.recv() => next,
        };
        let Some(mut item) = first else {
            let _ = sink.close().await;
            return;
        };
        let mut fed = 0;
        loop {
            match item {
                Outbound::Close(code, reason) => {
                    let _ = sink.send(close_with(code, reason)).await;
                    return;
                }
                Outbound::Frame(frame) => {
                    if let Ok(message) = frame_to_message(&frame, encoding) {
                        if sink.feed(message).await.is_err() {
                            return;
                        }
                        fed += 1;
                    }
                }
                Outbound::Broadcast(broadcast) => {
                    if let Some(message) = broadcast.message(encoding) {
                        if sink.feed(message).await.is_err() {
                            return;
                        }
                        fed += 1;
                    }
                }
            }
            if fed >= BATCH {
                break;
            }
            match outbound.try_recv() {
                Ok(more) => item = more,
                Err(_) => break,
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}
