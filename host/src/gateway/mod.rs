//! The WebSocket edge: `GET /v1/ws` (PROTOCOL.md).
//!
//! Per connection: a handshake (`connect` within the timeout, token checked), then a reader
//! loop that decodes frames and dispatches them ([`dispatch`]), and one writer task that
//! owns the socket's sending half and drains a bounded queue ([`writer`]). The server writes
//! at least every `heartbeat_ms` (a ping when nothing else goes, [`heartbeat`]); a connection
//! from which nothing came for `client_timeout_ms` is closed and its route removed. A second connection of the same user and device kicks the first (4009).
//!
//! The gateway is the only part that sees sockets: it hands the pipeline a
//! [`SendRequest`](crate::routing::bus::SendRequest) and writes the ack it gets back, and
//! gives delivery a [`Session`] whose outbox is the connection's queue.
//!
//! A dropped connection's session is parked for `reconnect_grace_ms`; its device, back
//! within that time (or reconnecting before the old connection was noticed dead, which
//! kicks it), resumes from it: see [`session`](crate::delivery::session).
//!
//! At shutdown every connection gets `go_away`, naming where to reconnect when the node
//! was given somewhere ([`redirect`]); the gateway knows URLs only, never clusters.

pub mod auth;
pub mod connection;
pub mod delay;
mod dispatch;
mod heartbeat;
pub mod homes;
pub mod intake;
pub mod redirect;
mod restore;
mod writer;

/// The `go_away` reason (and close reason) when the node shuts down.
pub const DRAINING: &str = "server shutting down; reconnect";

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Extension;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::StreamExt;
use futures_util::stream::{SplitSink, SplitStream};
use herald_proto::v1::{self, Frame, frame::Body};
use herald_proto::{DecodeLimits, Encoding, SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO};

use crate::clock::WallClock;
use crate::config::GatewayConfig;
use crate::delivery::Delivery;
use crate::delivery::backfill::Unfinished;
use crate::delivery::session::Session;
use crate::health::QueueDepths;
use crate::model::{ConnectionId, DeviceId, DeviceLedger, NodeId, UserId};
use crate::pipeline::Pipeline;
use crate::plugins::PluginHost;
use crate::routing::RouteTable;

use crate::routing::Route;
use crate::routing::router::Router;
use auth::{AuthError, Authenticator};
use connection::{CloseReason, Connection, Connections, close};
use dispatch::{next_frame, read_loop};
use heartbeat::Heartbeat;
use homes::{HomeCheck, PlacementStatus};
use intake::{ConnectionPermit, FrameBudget, Intake, Refused, SendBudget};
use redirect::Redirects;
use writer::{close_now, write_loop};

/// `GET /v1/ws`: upgrades and hands the socket to [`serve_socket`], unless the node holds
/// all the connections it may or the client's address has its share (503 / 429).
pub async fn upgrade(
    State(gateway): State<Arc<Gateway>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    if let (Some(homes), Some(digest)) = (gateway.homes.get(), headers.get(homes::UPSTREAM_HEADER)) {
        homes.upstream_seen(digest.to_str().unwrap_or("(not text)"), gateway.clock.now_ms());
    }
    let ip = peer.map(|Extension(ConnectInfo(addr))| addr.ip());
    let permit = match gateway.intake.open_connection(ip) {
        Ok(permit) => permit,
        Err(refused) => return refused.into_response(),
    };
    let max = gateway.config.max_frame_bytes;
    upgrade
        .protocols([SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON])
        .max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(gateway.config.read_buffer_bytes)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .on_upgrade(move |socket| serve_socket(gateway, socket, permit))
}

/// Frames written to a connection are gathered up to this many bytes before they go to the
/// socket (and at every flush). The buffer keeps what it grew to, so a burst leaves a busy
/// connection holding up to this much more.
const WRITE_BUFFER_BYTES: usize = 16 * 1024;

/// The edge of one node: what the gateway needs to admit a connection and serve it.
pub struct Gateway {
    config: GatewayConfig,
    /// Checks the token of a `connect` (and of the HTTP API's user requests).
    auth: Authenticator,
    clock: Arc<dyn WallClock>,
    /// Where each device is connected: written at attach, detach and kick.
    routes: Arc<dyn RouteTable>,
    /// Open connections' transports (their sessions are delivery's).
    connections: Connections,
    /// Where a client's sends go.
    pipeline: Arc<Pipeline>,
    /// Sessions, acks and pulls.
    delivery: Arc<Delivery>,
    /// The connect hook.
    plugins: Arc<PluginHost>,
    /// Intake protection: send and HTTP buckets, the backlog, connection caps.
    intake: Arc<Intake>,
    next_connection: AtomicU64,
    /// Shutdown has begun: connections are sent away as soon as they are made.
    draining: AtomicBool,
    /// Connections closed by the drain are parked, for their ledgers to be saved.
    park_at_drain: AtomicBool,
    /// Where the connections are sent at shutdown; set once, by [`drain`](Self::drain).
    redirects: OnceLock<Redirects>,
    /// Counts connections away from their home node; set once, where the node is
    /// assembled ([`check_homes`](Self::check_homes)).
    homes: OnceLock<HomeCheck>,
}

impl Gateway {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: GatewayConfig,
        auth: Authenticator,
        clock: Arc<dyn WallClock>,
        routes: Arc<dyn RouteTable>,
        pipeline: Arc<Pipeline>,
        delivery: Arc<Delivery>,
        plugins: Arc<PluginHost>,
        intake: Arc<Intake>,
    ) -> Self {
        Self {
            config,
            auth,
            routes,
            connections: Connections::default(),
            pipeline,
            delivery,
            plugins,
            intake,
            // Numbered from the start time up, so no two lives of a node id reuse one: a route
            // left behind by an earlier process can never be taken for one of this process's.
            next_connection: AtomicU64::new(clock.now_ms() << 20 | 1),
            clock,
            draining: AtomicBool::new(false),
            park_at_drain: AtomicBool::new(false),
            redirects: OnceLock::new(),
            homes: OnceLock::new(),
        }
    }

    /// Counts the connections that land away from the home `router`'s topology gives
    /// them, and the upgrades routed by a stale nginx upstream.
    pub fn check_homes(&self, router: Arc<Router>) {
        let _ = self.homes.set(HomeCheck::new(router));
    }

    /// This node.
    pub fn this_node(&self) -> NodeId {
        self.delivery.this_node()
    }

    /// The user a token was issued to, checked as a `connect`'s token is.
    ///
    /// # Errors
    /// [`AuthError`] when the token is malformed, expired, or not signed by this node's
    /// secret.
    pub fn authenticate(&self, token: &str) -> Result<UserId, AuthError> {
        self.auth.authenticate(token)
    }

    /// A token for `user`, valid for `ttl_secs` from now (dev mode's tokens).
    ///
    /// # Errors
    /// [`AuthError`] when this node cannot sign tokens.
    pub fn issue_token(&self, user: &UserId, ttl_secs: u64) -> Result<String, AuthError> {
        self.auth.issue(user, self.clock.now_ms() / 1000, ttl_secs)
    }

    /// `intake.http_requests_per_ip`: whether an HTTP request from `client` may go on.
    ///
    /// # Errors
    /// [`Refused`] when the address is over its rate; answer it as is.
    pub fn admit_http(&self, client: IpAddr) -> Result<(), Refused> {
        self.intake.admit_http(client)
    }

    /// Connections away from their home node and the upgrades a stale nginx routed
    /// (`None` until [`check_homes`](Self::check_homes)).
    pub fn placement(&self) -> Option<PlacementStatus> {
        self.homes.get().map(HomeCheck::status)
    }

    /// The most frames a connection's send queue holds (`gateway.send_queue`).
    pub fn send_queue_limit(&self) -> usize {
        self.config.send_queue
    }

    /// How many connections are open and how many frames wait in the send queues that hold
    /// any, for the health sample.
    pub fn queue_depths(&self) -> QueueDepths {
        self.connections.queue_depths()
    }

    /// Sends taken in and not yet done, on every connection (the intake's backlog).
    pub fn backlog(&self) -> usize {
        self.intake.backlog()
    }

    /// Open connections, and the intake's rate buckets: the gateway's in-memory maps, for
    /// their size gauges.
    pub fn map_sizes(&self) -> (usize, usize) {
        (self.connections.len(), self.intake.buckets())
    }

    /// Gives back the room the connections map grew to for a crowd that has left.
    pub fn shrink_if_sparse(&self) {
        self.connections.shrink_if_sparse();
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Closes the connection of `route` with 4009 (its device connected again on another
    /// node), if it is still here and still that device's. Returns whether it was.
    pub fn kick(&self, route: &Route) -> bool {
        let Some(session) = self.delivery.sessions().get(route.connection) else { return false };
        if session.user != route.user || session.device != route.device {
            return false;
        }
        let Some(connection) = self.connections.get(route.connection) else { return false };
        connection.close(CloseReason::new(close::KICKED, "the same user and device connected again"));
        true
    }

    /// The device of `route` connected again on `node`: closes its connection here, if it
    /// is still open, and hands the connection's ledger over (see
    /// [`Session::hand_over`]); from now on what is offered to it here is passed on to
    /// `node`. `None` when the connection is not here (any more), or its ledger is not
    /// complete: the new connection then backfills in full.
    pub fn hand_over(&self, route: &Route, node: NodeId) -> Option<DeviceLedger> {
        let session = self.delivery.sessions().find(&route.user, route.connection)?;
        if session.device != route.device {
            return None;
        }
        // Before the close: the connection's detach then keeps the session, to pass on
        // the offers that still reach it.
        let ledger = session.hand_over(node);
        self.kick(route);
        ledger
    }

    /// Sends every connection (and any that finishes its handshake from now on) `go_away`,
    /// then closes it with 1012; waits up to 2 s for the writers to put that on the wire.
    /// Each `go_away` names the URL `redirects` picks for the connection's user. The node is
    /// marked draining (`/readyz` answers 503) before `redirects` is awaited, so finding the
    /// other nodes never delays that; a connection completing its handshake meanwhile is
    /// sent to the same address.
    pub async fn drain(&self, redirects: impl Future<Output = Redirects>) {
        self.draining.store(true, Ordering::SeqCst);
        // A second drain finds the first one's redirects in place and keeps them.
        let _ = self.redirects.set(redirects.await);
        let sessions = self.delivery.sessions();
        let reconnect_url = |id| sessions.get(id).and_then(|session| self.reconnect_url(&session.user));
        let sent_away = self.connections.go_away_all(DRAINING, self.config.go_away_spread_ms, reconnect_url);
        // A client that stopped reading does not hold shutdown up for long.
        let written = futures_util::future::join_all(sent_away.iter().map(|c| c.writer_finished()));
        if tokio::time::timeout(Duration::from_secs(2), written).await.is_err() {
            tracing::warn!("some connections did not take their go_away within 2 s");
        }
    }

    /// Where `user`'s connections go at shutdown: `None` before the drain, and when there
    /// is nowhere else to send them.
    fn reconnect_url(&self, user: &UserId) -> Option<String> {
        self.redirects.get().and_then(|redirects| redirects.pick(user)).map(str::to_owned)
    }
}

/// One authenticated client: its transport, its session as delivery sees it, and its own
/// bucket of sends.
pub(crate) struct Client {
    pub connection: Arc<Connection>,
    pub session: Arc<Session>,
    pub budget: SendBudget,
}

/// Serves one upgraded socket to its end; `_permit` counts it against the connection caps
/// until then.
async fn serve_socket(gateway: Arc<Gateway>, socket: WebSocket, _permit: ConnectionPermit) {
    let encoding = socket
        .protocol()
        .and_then(|protocol| protocol.to_str().ok())
        .and_then(Encoding::from_subprotocol)
        .unwrap_or(Encoding::Proto);
    let limits = DecodeLimits { max_frame_bytes: gateway.config.max_frame_bytes, ..DecodeLimits::default() };
    let (mut sink, mut stream) = socket.split();
    // One bucket for the connection's whole life: the handshake's frames count too.
    let budget = FrameBudget::new(gateway.config.frames_per_second, gateway.config.frame_burst);
    // The handshake, attach and detach are boxed, as a frame's dispatch is: each runs once,
    // and inline each would make the connection's task as large as its deepest state for
    // the connection's whole life.
    let (rid, user, device) = match Box::pin(admit(&gateway, &mut stream, &limits, &budget)).await {
        Ok(admitted) => admitted,
        Err(Some(why)) => {
            close_now(&mut sink, why).await;
            return linger(&mut stream).await;
        }
        Err(None) => return,
    };
    let id = ConnectionId(gateway.next_connection.fetch_add(1, Ordering::Relaxed));
    let connection = Arc::new(gateway.connections.connection(id, gateway.config.send_queue));
    let session = Arc::new(Session::new(id, user, device, Arc::clone(&connection) as _));
    let client = Client { connection, session, budget: gateway.intake.send_budget() };
    Box::pin(attach(&gateway, &client, rid, sink, encoding)).await;
    let why = read_loop(&gateway, &client, &mut stream, &limits, &budget).await;
    client.connection.close(why);
    Box::pin(detach(&gateway, &client)).await;
    linger(&mut stream).await;
}

/// How long a closed connection's socket is read after the close, at most.
const LINGER: Duration = Duration::from_secs(1);

/// Reads (and drops) what the client still sends after this side closed, until it answers
/// the close, goes away or [`LINGER`] passes. A socket closed with unread data in it is
/// reset by the kernel, and the reset can destroy the close frame before the client reads
/// it: a client closed while sending (a flood, an oversized frame) would never learn why.
async fn linger(stream: &mut SplitStream<WebSocket>) {
    let drain = async {
        while let Some(Ok(message)) = stream.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// The handshake: a `connect` frame in time, a valid token, and the connect hook's yes.
/// Returns the request id of `connect` and who connected, or the close to send.
async fn admit(
    gateway: &Gateway,
    stream: &mut SplitStream<WebSocket>,
    limits: &DecodeLimits,
    budget: &FrameBudget,
) -> Result<(u32, UserId, DeviceId), Option<CloseReason>> {
    let (rid, connect) = handshake(gateway, stream, limits, budget).await?;
    let (user, device) = authenticate(gateway, &connect)?;
    let user = authorize(gateway, user, &device).await?;
    Ok((rid, user, device))
}

/// Waits for the first frame, which must be `connect`.
async fn handshake(
    gateway: &Gateway,
    stream: &mut SplitStream<WebSocket>,
    limits: &DecodeLimits,
    budget: &FrameBudget,
) -> Result<(u32, v1::Connect), Option<CloseReason>> {
    let timeout = Duration::from_millis(gateway.config.connect_timeout_ms);
    let first = match tokio::time::timeout(timeout, next_frame(stream, limits, budget)).await {
        Err(_) => {
            return Err(Some(CloseReason::new(
                close::NO_CONNECT,
                format!("no connect within {} ms", timeout.as_millis()),
            )));
        }
        Ok(first) => first?,
    };
    match first.body {
        Some(Body::Connect(connect)) => Ok((first.rid, connect)),
        Some(other) => {
            Err(Some(CloseReason::new(close::PROTOCOL_ERROR, format!("expected connect first, got {}", other.name()))))
        }
        None => Err(Some(CloseReason::new(close::PROTOCOL_ERROR, "frame without a body"))),
    }
}

/// The user and device a `connect` proves, or the close to send.
fn authenticate(gateway: &Gateway, connect: &v1::Connect) -> Result<(UserId, DeviceId), Option<CloseReason>> {
    let user = gateway
        .auth
        .authenticate(&connect.token)
        .map_err(|error| CloseReason::new(close::BAD_TOKEN, error.to_string()))?;
    let device = DeviceId::parse(&connect.device_id)
        .map_err(|error| CloseReason::new(close::PROTOCOL_ERROR, error.to_string()))?;
    Ok((user, device))
}

/// The connect hook: may refuse the connection (4003) or replace its user id.
async fn authorize(gateway: &Gateway, user: UserId, device: &DeviceId) -> Result<UserId, Option<CloseReason>> {
    use crate::plugins::types::{ConnectDecision, ConnectRequest};
    let request = ConnectRequest { user: user.to_string(), device: device.to_string(), claims: Vec::new() };
    match gateway.plugins.connect(&request).await {
        ConnectDecision::Allow(None) => Ok(user),
        ConnectDecision::Allow(Some(replacement)) => UserId::parse(&replacement).map_err(|error| {
            Some(CloseReason::new(close::NOT_ALLOWED, format!("the connect hook gave an invalid user id: {error}")))
        }),
        ConnectDecision::Deny(reason) => Err(Some(CloseReason::new(close::NOT_ALLOWED, reason))),
    }
}

/// Registers the connection, starts its writer, sends `connected`, kicks an older
/// connection of the same device and starts the backfill.
async fn attach(
    gateway: &Arc<Gateway>,
    client: &Client,
    rid: u32,
    sink: SplitSink<WebSocket, Message>,
    encoding: Encoding,
) {
    let (connection, session) = (&client.connection, &client.session);
    gateway.connections.insert(Arc::clone(connection));
    gateway.delivery.sessions().insert(Arc::clone(session));
    if gateway.is_draining() {
        // Shutdown began after this connection was accepted: it gets what the others got.
        connection.go_away(DRAINING, gateway.config.go_away_spread_ms, gateway.reconnect_url(&session.user));
    }
    let heartbeat = Heartbeat::new(
        Duration::from_millis(gateway.config.heartbeat_ms),
        Duration::from_millis(gateway.config.client_timeout_ms),
        tokio::time::Instant::now(),
    );
    tokio::spawn(write_loop(sink, Arc::clone(connection), heartbeat, encoding, Arc::clone(&gateway.clock)));
    let this_node = gateway.this_node();
    if let Some(homes) = gateway.homes.get() {
        homes.logged_in(&session.user, this_node);
    }
    let unfinished = Unfinished::count();
    connection.push(Frame::new(
        rid,
        v1::Connected {
            user_id: session.user.to_string(),
            device_id: session.device.to_string(),
            node_id: this_node.0,
            session_id: format!("{this_node}-{}", connection.id),
            heartbeat_ms: u32::try_from(gateway.config.heartbeat_ms).unwrap_or(u32::MAX),
            server_time_ms: gateway.clock.now_ms(),
            client_timeout_ms: u32::try_from(gateway.config.client_timeout_ms).unwrap_or(u32::MAX),
        },
    ));
    let previous = kick_previous(gateway, session).await;
    // After the login, so that every offer reaches the old session or this one.
    let parked = gateway.delivery.sessions().unpark(&session.user, &session.device);
    let resumed = match (previous, parked) {
        (Previous::Here(previous), _) | (Previous::Nowhere, Some(previous)) => Some(session.resume_from(&previous)),
        (Previous::Elsewhere(ledger), parked) => {
            // A session of an earlier visit here passes what still reaches it on too, and
            // what it owes counts as well.
            let complete_here = parked.is_none_or(|parked| session.resume_from(&parked));
            let resumed = match ledger {
                Some(ledger) if complete_here => {
                    session.resume_with(ledger);
                    true
                }
                // A ledger restored here after a restart also reads whatever changed since it
                // was saved: it misses nothing the other node (gone, or unable to say) knew.
                None if complete_here && session.since().is_some() => true,
                _ => {
                    session.backfill_in_full();
                    false
                }
            };
            metrics::counter!("herald_gateway_handovers_total", "resumed" => if resumed { "yes" } else { "no" })
                .increment(1);
            Some(resumed)
        }
        (Previous::Nowhere, None) => None,
    };
    if let Some(resumed) = resumed {
        metrics::counter!("herald_gateway_reconnects_total", "resumed" => if resumed { "yes" } else { "no" })
            .increment(1);
    }
    count_connections(gateway);
    tokio::spawn({
        let (delivery, session) = (Arc::clone(&gateway.delivery), Arc::clone(session));
        async move { delivery.backfill(session, unfinished).await }
    });
}

/// The connection a login replaced.
enum Previous {
    /// None was.
    Nowhere,
    /// One of this node: its session.
    Here(Arc<Session>),
    /// One of another node, which handed its ledger over if it could.
    Elsewhere(Option<DeviceLedger>),
}

/// Logs the device in; closes the connection it replaces (4009), here or on its node, and
/// returns that connection's session when it was here, or its ledger from its node.
async fn kick_previous(gateway: &Gateway, session: &Session) -> Previous {
    let route = Route {
        user: session.user.clone(),
        device: session.device.clone(),
        node: gateway.this_node(),
        connection: session.id,
        connected_at_ms: gateway.clock.now_ms(),
        parked: false,
    };
    let replaced = match gateway.routes.login(route).await {
        Ok(Some(replaced)) if replaced.node != gateway.this_node() || replaced.connection != session.id => replaced,
        Ok(_) => return Previous::Nowhere,
        Err(error) => {
            tracing::warn!(%error, "route table unavailable at login");
            return Previous::Nowhere;
        }
    };
    if replaced.node != gateway.this_node() {
        return match gateway.delivery.bus().take_over(&replaced).await {
            Ok(ledger) => Previous::Elsewhere(ledger),
            Err(error) => {
                tracing::warn!(%error, "the node holding the replaced connection could not hand it over");
                Previous::Elsewhere(None)
            }
        };
    }
    gateway.kick(&replaced);
    gateway.delivery.sessions().get(replaced.connection).map_or(Previous::Nowhere, Previous::Here)
}

/// Removes a closed connection: its route and room subscriptions go; its session is parked
/// for `reconnect_grace_ms` (not while draining), so that its device, back within that
/// time, resumes from it instead of being backfilled in full.
async fn detach(gateway: &Arc<Gateway>, client: &Client) {
    let session = &client.session;
    gateway.delivery.drop_subscriptions(session).await;
    gateway.delivery.connection_closed(session);
    let grace = gateway.config.reconnect_grace_ms;
    let sessions = &gateway.delivery.sessions();
    // Parked before its route changes, so fan-out always finds one or the other. The route
    // of a parked session stays, marked parked, so that the fan-out of every node keeps
    // offering it messages (noted as owed for its device's return) until the grace is over.
    let (user, device, this_node) = (&session.user, &session.device, gateway.this_node());
    let draining = gateway.is_draining();
    let routed = if grace > 0 && !draining && session.park() {
        sessions.park(Arc::clone(session));
        let (gateway, session) = (Arc::clone(gateway), Arc::clone(session));
        let routed = gateway.routes.park(user, device, this_node, session.id).await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(grace)).await;
            if gateway.delivery.sessions().expire(&session) {
                let (user, device) = (&session.user, &session.device);
                if let Err(error) = gateway.routes.logout(user, device, gateway.this_node(), session.id).await {
                    tracing::warn!(%error, "route table unavailable when a parked session expired");
                }
            }
            count_connections(&gateway);
        });
        routed
    } else {
        if draining && gateway.park_at_drain.load(Ordering::SeqCst) && session.park() {
            sessions.park(Arc::clone(session)); // its ledger is saved at shutdown
        }
        gateway.routes.logout(user, device, this_node, session.id).await
    };
    if let Err(error) = routed {
        tracing::warn!(%error, "route table unavailable at logout");
    }
    gateway.connections.remove(client.connection.id);
    sessions.remove(session.id);
    count_connections(gateway);
}

/// Sets the gauges of open and parked connections.
fn count_connections(gateway: &Gateway) {
    metrics::gauge!("herald_gateway_connections").set(gateway.connections.len() as f64);
    metrics::gauge!("herald_gateway_parked").set(gateway.delivery.sessions().parked_len() as f64);
}
