//! The WebSocket edge: `GET /v1/ws` (PROTOCOL.md).
//!
//! Per connection: a handshake (`connect` within the timeout, token checked), then a reader
//! loop that decodes frames and dispatches them, and one writer task that owns the socket's
//! sending half and drains a bounded queue. The server pings every `heartbeat_ms`; a
//! connection silent for three intervals is closed and its routes removed. A second
//! connection of the same user and device kicks the first (4009).
//!
//! A dropped connection is parked for `reconnect_grace_ms`; its device, back within that
//! time (or reconnecting before the old connection was noticed dead, which kicks it), resumes
//! from it: see [`connection`].

pub mod auth;
pub mod connection;

/// The `go_away` reason (and close reason) when the node shuts down.
pub const DRAINING: &str = "server shutting down; reconnect";

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use herald_proto::v1::{self, Frame, frame::Body};
use herald_proto::{DecodeLimits, Encoding, SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, decode_frame, encode_frame};
use tokio::sync::mpsc;

use crate::clock::{SystemClock, WallClock};
use crate::model::DeviceId;
use crate::node::Node;
use crate::pipeline::Admission;
use crate::routing::Route;
use connection::{Connection, close};

/// `GET /v1/ws`: upgrades and hands the socket to [`serve_socket`].
pub async fn upgrade(State(node): State<Arc<Node>>, upgrade: WebSocketUpgrade) -> Response {
    let max = node.config.gateway.max_frame_bytes;
    upgrade
        .protocols([SUBPROTOCOL_PROTO, SUBPROTOCOL_JSON])
        .max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(4096)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |socket| serve_socket(node, socket))
}

/// A reason to stop reading: the close code and what to tell the client.
type Stop = (u16, String);

async fn serve_socket(node: Arc<Node>, socket: WebSocket) {
    let encoding = socket
        .protocol()
        .and_then(|protocol| protocol.to_str().ok())
        .and_then(Encoding::from_subprotocol)
        .unwrap_or(Encoding::Proto);
    let limits = DecodeLimits { max_frame_bytes: node.config.gateway.max_frame_bytes, ..DecodeLimits::default() };
    let (mut sink, mut stream) = socket.split();

    let (rid, connect) = match handshake(&node, &mut stream, &limits).await {
        Ok(connect) => connect,
        Err(Some((code, reason))) => return close_now(&mut sink, code, reason).await,
        Err(None) => return,
    };
    let (user, device) = match authenticate(&node, &connect) {
        Ok(identity) => identity,
        Err((code, reason)) => return close_now(&mut sink, code, reason).await,
    };
    let user = match authorize(&node, user, &device).await {
        Ok(user) => user,
        Err((code, reason)) => return close_now(&mut sink, code, reason).await,
    };
    let (outbox, queued) = mpsc::channel(node.config.gateway.send_queue);
    let id = node.next_connection.fetch_add(1, Ordering::Relaxed);
    let connection = Arc::new(Connection::new(id, user, device, outbox));
    attach(&node, &connection, rid, queued, sink, encoding).await;
    let stop = read_loop(&node, &connection, &mut stream, &limits).await;
    connection.close(stop.0, &stop.1);
    detach(&node, &connection).await;
}

/// Waits for the first frame, which must be `connect`.
async fn handshake(
    node: &Node,
    stream: &mut SplitStream<WebSocket>,
    limits: &DecodeLimits,
) -> Result<(u32, v1::Connect), Option<Stop>> {
    let timeout = Duration::from_millis(node.config.gateway.connect_timeout_ms);
    let first = match tokio::time::timeout(timeout, next_frame(stream, limits)).await {
        Err(_) => return Err(Some((close::NO_CONNECT, format!("no connect within {} ms", timeout.as_millis())))),
        Ok(first) => first?,
    };
    match first.body {
        Some(Body::Connect(connect)) => Ok((first.rid, connect)),
        Some(other) => Err(Some((close::PROTOCOL_ERROR, format!("expected connect first, got {}", other.name())))),
        None => Err(Some((close::PROTOCOL_ERROR, "frame without a body".into()))),
    }
}

/// The user and device a `connect` proves, or the close to send.
fn authenticate(node: &Node, connect: &v1::Connect) -> Result<(crate::model::UserId, DeviceId), Stop> {
    let user = node.auth.authenticate(&connect.token).map_err(|error| (close::BAD_TOKEN, error.to_string()))?;
    let device = DeviceId::parse(&connect.device_id).map_err(|error| (close::PROTOCOL_ERROR, error.to_string()))?;
    Ok((user, device))
}

/// The connect hook: may refuse the connection (4003) or replace its user id.
async fn authorize(node: &Node, user: crate::model::UserId, device: &DeviceId) -> Result<crate::model::UserId, Stop> {
    use crate::plugins::types::{ConnectDecision, ConnectRequest};
    let request = ConnectRequest { user: user.to_string(), device: device.to_string(), claims: Vec::new() };
    match node.plugins.host.connect(&request).await {
        ConnectDecision::Allow(None) => Ok(user),
        ConnectDecision::Allow(Some(replacement)) => crate::model::UserId::parse(&replacement)
            .map_err(|error| (close::NOT_ALLOWED, format!("the connect hook gave an invalid user id: {error}"))),
        ConnectDecision::Deny(reason) => Err((close::NOT_ALLOWED, reason)),
    }
}

/// Registers the connection, starts its writer, sends `connected`, kicks an older
/// connection of the same device and starts the backfill.
async fn attach(
    node: &Arc<Node>,
    connection: &Arc<Connection>,
    rid: u32,
    queued: mpsc::Receiver<Frame>,
    sink: SplitSink<WebSocket, Message>,
    encoding: Encoding,
) {
    node.connections.insert(Arc::clone(connection));
    if node.is_draining() {
        // Shutdown began after this connection was accepted: it gets what the others got.
        connection.go_away(DRAINING, node.config.gateway.go_away_spread_ms);
    }
    let heartbeat = Duration::from_millis(node.config.gateway.heartbeat_ms);
    tokio::spawn(write_loop(sink, queued, Arc::clone(connection), heartbeat, encoding));
    connection.push(Frame::new(
        rid,
        v1::Connected {
            user_id: connection.user.to_string(),
            device_id: connection.device.to_string(),
            node_id: node.config.node_id,
            session_id: format!("{}-{}", node.config.node_id, connection.id),
            heartbeat_ms: u32::try_from(node.config.gateway.heartbeat_ms).unwrap_or(u32::MAX),
            server_time_ms: node.clock.now_ms(),
        },
    ));
    let route = Route {
        user: connection.user.clone(),
        device: connection.device.clone(),
        node: node.config.node_id,
        connection: connection.id,
        connected_at_ms: node.clock.now_ms(),
    };
    let kicked = match node.routes.login(route).await {
        Ok(Some(replaced)) if replaced.connection != connection.id && replaced.node == node.config.node_id => {
            node.connections.get(replaced.connection)
        }
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(%error, "route table unavailable at login");
            None
        }
    };
    if let Some(old) = &kicked {
        old.close(close::KICKED, "the same user and device connected again");
    }
    // After the login, so that every offer reaches the old connection or this one.
    let parked = node.connections.unpark(&connection.user, &connection.device);
    if let Some(previous) = kicked.or(parked) {
        let resumed = connection.resume_from(&previous);
        metrics::counter!("herald_gateway_reconnects_total", "resumed" => if resumed { "yes" } else { "no" })
            .increment(1);
    }
    count_connections(node);
    tokio::spawn({
        let delivery = Arc::clone(&node.delivery);
        let connection = Arc::clone(connection);
        async move { delivery.backfill(connection).await }
    });
}

/// Removes a closed connection: its route and room subscriptions go; the connection itself
/// is parked for `reconnect_grace_ms` (not while draining), so that its device, back within
/// that time, resumes from it instead of being backfilled from scratch.
async fn detach(node: &Arc<Node>, connection: &Arc<Connection>) {
    node.rooms.drop_connection(connection.id);
    let grace = node.config.gateway.reconnect_grace_ms;
    // Parked before the route goes, so fan-out always finds one or the other.
    if grace > 0 && !node.is_draining() && connection.park() {
        node.connections.park(Arc::clone(connection));
        let (node, connection) = (Arc::clone(node), Arc::clone(connection));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(grace)).await;
            node.connections.expire(&connection);
            count_connections(&node);
        });
    }
    if let Err(error) = node.routes.logout(&connection.user, &connection.device, connection.id).await {
        tracing::warn!(%error, "route table unavailable at logout");
    }
    node.connections.remove(connection.id);
    count_connections(node);
}

/// Sets the gauges of open and parked connections.
fn count_connections(node: &Node) {
    metrics::gauge!("herald_gateway_connections").set(node.connections.len() as f64);
    metrics::gauge!("herald_gateway_parked").set(node.connections.parked_len() as f64);
}

/// Reads and dispatches frames until the connection should close; returns why.
async fn read_loop(
    node: &Arc<Node>,
    connection: &Arc<Connection>,
    stream: &mut SplitStream<WebSocket>,
    limits: &DecodeLimits,
) -> Stop {
    let silence = Duration::from_millis(node.config.gateway.heartbeat_ms.saturating_mul(3));
    loop {
        let frame = tokio::select! {
            next = tokio::time::timeout(silence, next_frame(stream, limits)) => match next {
                Err(_) => return (close::NORMAL, "no traffic for 3 heartbeat intervals".into()),
                Ok(Ok(frame)) => frame,
                Ok(Err(Some(stop))) => return stop,
                Ok(Err(None)) => return (close::NORMAL, String::new()),
            },
            () = connection.closing() => return (close::NORMAL, String::new()),
        };
        if let Err(stop) = dispatch(node, connection, frame).await {
            return stop;
        }
    }
}

/// Reads the next frame: `Err(None)` when the peer went away, `Err(Some(close))` for a
/// frame that must close the connection.
/// Binary messages are protobuf and text messages JSON, whichever subprotocol was chosen.
async fn next_frame(stream: &mut SplitStream<WebSocket>, limits: &DecodeLimits) -> Result<Frame, Option<Stop>> {
    loop {
        let message = match stream.next().await {
            None => return Err(None),
            Some(Ok(message)) => message,
            Some(Err(error)) => {
                let text = error.to_string();
                return Err(if text.contains("too long") || text.contains("too big") || text.contains("Space limit") {
                    Some((close::TOO_BIG, format!("frame larger than {} bytes", limits.max_frame_bytes)))
                } else {
                    None
                });
            }
        };
        let (bytes, encoding) = match message {
            Message::Binary(bytes) => (bytes, Encoding::Proto),
            Message::Text(text) => (Bytes::copy_from_slice(text.as_str().as_bytes()), Encoding::Json),
            Message::Ping(_) | Message::Pong(_) => continue,
            Message::Close(_) => return Err(None),
        };
        return decode_frame(bytes, encoding, limits).map_err(|error| Some((error.close_code(), error.to_string())));
    }
}

fn error_frame(rid: u32, code: &str, message: String) -> Frame {
    Frame::new(rid, v1::Error { code: code.to_owned(), message, rid })
}

/// Handles one frame from an authenticated client.
async fn dispatch(node: &Arc<Node>, connection: &Arc<Connection>, frame: Frame) -> Result<(), Stop> {
    let rid = frame.rid;
    let Some(body) = frame.body else { return Err((close::PROTOCOL_ERROR, "frame without a body".into())) };
    match body {
        Body::Send(send) => match node.pipeline.admit(connection, rid, send).await {
            Admission::Done(ack) => {
                connection.push(Frame::new(rid, ack));
            }
            Admission::Wait(rest) => {
                tokio::spawn(rest);
            }
        },
        Body::DeliverAck(ack) => match crate::model::ConversationId::parse(&ack.conversation) {
            Ok(conversation) => node.delivery.ack(connection, &conversation, ack.seq).await,
            Err(error) => {
                connection.push(error_frame(rid, "invalid", error.to_string()));
            }
        },
        Body::Sync(sync) => {
            let (delivery, connection) = (Arc::clone(&node.delivery), Arc::clone(connection));
            tokio::spawn(async move {
                let reply = match delivery.sync(&connection, sync).await {
                    Ok(reply) => Frame::new(rid, reply),
                    Err(error) => error_frame(rid, error.code(), error.to_string()),
                };
                connection.push(reply);
            });
        }
        Body::History(history) => {
            let (delivery, connection) = (Arc::clone(&node.delivery), Arc::clone(connection));
            tokio::spawn(async move {
                let reply = match delivery.history(&connection.user, history).await {
                    Ok(reply) => Frame::new(rid, reply),
                    Err(error) => error_frame(rid, error.code(), error.to_string()),
                };
                connection.push(reply);
            });
        }
        // In order with the sends that follow: a send right after subscribe must pass.
        Body::Subscribe(subscribe) => {
            let reply = match node.delivery.subscribe(connection, subscribe).await {
                Ok(reply) => Frame::new(rid, reply),
                Err(error) => error_frame(rid, error.code(), error.to_string()),
            };
            connection.push(reply);
        }
        Body::Unsubscribe(unsubscribe) => {
            if let Err(error) = node.delivery.unsubscribe(connection, &unsubscribe) {
                connection.push(error_frame(rid, error.code(), error.to_string()));
            }
        }
        Body::Ping(ping) => {
            connection.push(Frame::new(rid, v1::Pong { time_ms: ping.time_ms }));
        }
        Body::Pong(_) => {}
        other => return Err((close::PROTOCOL_ERROR, format!("{} is not a frame a client sends here", other.name()))),
    }
    Ok(())
}

/// The only task that writes to the socket: queued frames, pings, and the final close.
async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    mut queued: mpsc::Receiver<Frame>,
    connection: Arc<Connection>,
    heartbeat: Duration,
    encoding: Encoding,
) {
    /// Tells the connection its writer stopped, however the loop ends.
    struct Stopped<'a>(&'a Connection);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.writer_stopped();
        }
    }
    let _stopped = Stopped(&connection);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    loop {
        let outgoing = tokio::select! {
            biased;
            (code, reason) = connection.close_requested() => {
                if let Some(message) = connection.take_farewell().and_then(|frame| to_message(&frame, encoding)) {
                    let _ = sink.send(message).await;
                }
                let _ = sink.send(close_message(code, &reason)).await;
                let _ = sink.close().await;
                return;
            }
            frame = queued.recv() => match frame {
                Some(frame) => frame,
                None => return,
            },
            _ = ping.tick() => Frame::new(0, v1::Ping { time_ms: SystemClock.now_ms() }),
        };
        let Some(message) = to_message(&outgoing, encoding) else { continue };
        if sink.send(message).await.is_err() {
            connection.close(close::NORMAL, "");
            return;
        }
    }
}

/// `frame` as a WebSocket message in the connection's encoding (`None`, logged, if it
/// cannot be encoded).
fn to_message(frame: &Frame, encoding: Encoding) -> Option<Message> {
    match encode_frame(frame, encoding) {
        Ok(bytes) if encoding == Encoding::Json => String::from_utf8(bytes).ok().map(|text| Message::Text(text.into())),
        Ok(bytes) => Some(Message::Binary(bytes.into())),
        Err(error) => {
            tracing::error!(%error, "a frame could not be encoded");
            None
        }
    }
}

async fn close_now(sink: &mut SplitSink<WebSocket, Message>, code: u16, reason: String) {
    let _ = sink.send(close_message(code, &reason)).await;
    let _ = sink.close().await;
}

/// A close frame; the reason is cut to fit a control frame (125 bytes, 2 of them the code).
fn close_message(code: u16, reason: &str) -> Message {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Message::Close(Some(CloseFrame { code, reason: reason[..end].into() }))
}
