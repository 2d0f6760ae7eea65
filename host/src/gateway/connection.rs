//! One client connection's transport: a bounded queue of frames for its writer task, and a
//! way to close it with a code. What was pushed to the device and what it acked is
//! delivery's business ([`Session`](crate::delivery::session::Session)); this is the
//! [`Outbox`] that session writes to.
//!
//! Invariants: only the connection's writer task writes to its socket (everyone else
//! queues); a queue that overflows closes the connection with 4008 rather than growing or
//! blocking the caller, so one slow client can never stall delivery to others.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dashmap::DashMap;
use herald_proto::SharedFrame;
use herald_proto::v1::{self, Frame};
use tokio::sync::{mpsc, watch};

use crate::delivery::session::Outbox;
use crate::model::ConnectionId;

/// Close codes of PROTOCOL.md.
pub mod close {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    /// After `go_away`: the server is restarting; reconnect.
    pub const SERVICE_RESTART: u16 = 1012;
    pub const TOO_BIG: u16 = 1009;
    pub const BAD_TOKEN: u16 = 4001;
    pub const NO_CONNECT: u16 = 4002;
    pub const NOT_ALLOWED: u16 = 4003;
    pub const SLOW_CONSUMER: u16 = 4008;
    pub const KICKED: u16 = 4009;
    pub const PROTOCOL_ERROR: u16 = 4010;
    /// More frames per second than `gateway.frames_per_second` (and its burst) allow.
    pub const TOO_MANY_FRAMES: u16 = 4029;
}

/// Why a connection closes: a close code of PROTOCOL.md and words for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReason {
    pub code: u16,
    pub reason: String,
}

impl CloseReason {
    pub fn new(code: u16, reason: impl Into<String>) -> Self {
        Self { code, reason: reason.into() }
    }

    /// A normal close (1000) with no words: the peer went away or asked to close.
    pub fn normal() -> Self {
        Self::new(close::NORMAL, "")
    }
}

/// What the writer is given: a frame of this connection's own, or one shared with other
/// connections (a room message, encoded once for all of them).
///
/// Two words: tokio's bounded channel allocates its slots 32 at a time, the first 32 when
/// the channel is made, so a 152-byte frame inline cost every connection 5 KiB up front.
pub enum Outgoing {
    Own(Box<Frame>),
    Shared(Arc<SharedFrame>),
}

/// A live, authenticated connection's transport.
pub struct Connection {
    /// Unique on this node.
    pub id: ConnectionId,
    /// Frames for the writer task.
    outbox: mpsc::Sender<Outgoing>,
    /// A close requested by anyone; the writer sends it and stops.
    close_request: Mutex<Option<CloseReason>>,
    /// A last frame the writer sends before the close frame (`go_away`).
    farewell: Mutex<Option<Frame>>,
    /// Flips to true once the writer task has stopped (its close frame is out).
    writer_done: watch::Sender<bool>,
    /// Flips to true once the connection is closing: nothing more is queued.
    closed: watch::Sender<bool>,
}

impl Connection {
    /// A connection whose writer reads `outbox`.
    pub fn new(id: ConnectionId, outbox: mpsc::Sender<Outgoing>) -> Self {
        Self {
            id,
            outbox,
            close_request: Mutex::new(None),
            farewell: Mutex::new(None),
            writer_done: watch::Sender::new(false),
            closed: watch::Sender::new(false),
        }
    }

    /// Queues `frame` without waiting. A full queue closes the connection as a slow
    /// consumer (4008). Returns whether the frame was queued.
    pub fn push(&self, frame: Frame) -> bool {
        self.queue(Outgoing::Own(Box::new(frame)))
    }

    /// Queues a frame shared with other connections, as [`Connection::push`] does.
    pub fn push_shared(&self, frame: &Arc<SharedFrame>) -> bool {
        self.queue(Outgoing::Shared(Arc::clone(frame)))
    }

    fn queue(&self, outgoing: Outgoing) -> bool {
        if self.is_closed() {
            return false;
        }
        match self.outbox.try_send(outgoing) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::counter!("herald_gateway_slow_consumers_total").increment(1);
                self.close(CloseReason::new(close::SLOW_CONSUMER, "send queue overflowed; reconnect and sync"));
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Frames queued for the writer and not yet written.
    pub fn queue_depth(&self) -> u32 {
        u32::try_from(self.outbox.max_capacity() - self.outbox.capacity()).unwrap_or(u32::MAX)
    }

    /// Queues `frame`, waiting for room (used by backfill, which paces itself to the client).
    pub async fn push_waiting(&self, frame: Frame) -> bool {
        !self.is_closed() && self.outbox.send(Outgoing::Own(Box::new(frame))).await.is_ok()
    }

    /// Asks the writer to close the connection; the first request wins.
    pub fn close(&self, why: CloseReason) {
        {
            let mut request = self.close_request.lock().unwrap_or_else(|p| p.into_inner());
            if request.is_some() || *self.closed.borrow() {
                return;
            }
            *request = Some(why);
        }
        self.closed.send_replace(true);
    }

    /// Tells the client the server is going away, then closes with 1012: the writer sends
    /// `go_away` (after nothing else: frames still queued are dropped, the client pulls them
    /// again after reconnecting) and the close frame. The client is told to wait a random
    /// 0..=`spread_ms` before reconnecting, so a node's clients do not all return at once,
    /// and where to reconnect: `reconnect_url`, or (`None`) the same address.
    pub fn go_away(&self, reason: &str, spread_ms: u32, reconnect_url: Option<String>) {
        let go_away = v1::GoAway {
            reason: reason.to_owned(),
            reconnect_after_ms: rand::random_range(0..=spread_ms),
            reconnect_url: reconnect_url.unwrap_or_default(),
        };
        *self.farewell.lock().unwrap_or_else(|p| p.into_inner()) = Some(Frame::new(0, go_away));
        self.close(CloseReason::new(close::SERVICE_RESTART, reason));
    }

    /// The frame to send before the close frame, if any (taken once).
    pub fn take_farewell(&self) -> Option<Frame> {
        self.farewell.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Marks the writer task stopped.
    pub fn writer_stopped(&self) {
        self.writer_done.send_replace(true);
    }

    /// Resolves once the writer task has stopped.
    pub async fn writer_finished(&self) {
        let mut done = self.writer_done.subscribe();
        let _ = done.wait_for(|done| *done).await;
    }

    /// Whether a close was requested.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Resolves once a close is requested.
    pub async fn closing(&self) {
        let mut closed = self.closed.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// Waits for a close request and returns it (for the writer, which sends it).
    pub async fn close_requested(&self) -> CloseReason {
        self.closing().await;
        self.close_request.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_else(CloseReason::normal)
    }
}

#[async_trait]
impl Outbox for Connection {
    fn push(&self, frame: Frame) -> bool {
        Connection::push(self, frame)
    }

    fn push_shared(&self, frame: &Arc<SharedFrame>) -> bool {
        Connection::push_shared(self, frame)
    }

    async fn push_waiting(&self, frame: Frame) -> bool {
        Connection::push_waiting(self, frame).await
    }

    fn is_closed(&self) -> bool {
        Connection::is_closed(self)
    }
}

/// The open connections of this node, by id.
#[derive(Default)]
pub struct Connections {
    by_id: DashMap<ConnectionId, Arc<Connection>>,
}

impl Connections {
    pub fn insert(&self, connection: Arc<Connection>) {
        self.by_id.insert(connection.id, connection);
    }

    pub fn remove(&self, id: ConnectionId) {
        self.by_id.remove(&id);
    }

    pub fn get(&self, id: ConnectionId) -> Option<Arc<Connection>> {
        self.by_id.get(&id).map(|c| Arc::clone(&c))
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The send-queue depth of every open connection.
    pub fn queue_depths(&self) -> Vec<u32> {
        self.by_id.iter().map(|connection| connection.queue_depth()).collect()
    }

    /// Sends every connection `go_away` (see [`Connection::go_away`]), naming the URL
    /// `reconnect_url` gives for its id, and closes it (server shutdown). Returns the
    /// connections sent away.
    pub fn go_away_all(
        &self,
        reason: &str,
        spread_ms: u32,
        reconnect_url: impl Fn(ConnectionId) -> Option<String>,
    ) -> Vec<Arc<Connection>> {
        let all: Vec<Arc<Connection>> = self.by_id.iter().map(|connection| Arc::clone(&connection)).collect();
        for connection in &all {
            connection.go_away(reason, spread_ms, reconnect_url(connection.id));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_closes_the_connection_as_a_slow_consumer_and_the_first_close_wins() {
        let (outbox, _writer) = mpsc::channel(2);
        let connection = Connection::new(ConnectionId(1), outbox);
        let frame = || Frame::new(0, v1::Pong { time_ms: 0 });
        assert!(connection.push(frame()) && connection.push(frame()));
        assert_eq!(connection.queue_depth(), 2);
        assert!(!connection.push(frame()), "no room: not queued");
        assert!(connection.is_closed());
        connection.close(CloseReason::new(close::KICKED, "later"));
        let why = connection.close_request.lock().expect("lock").clone();
        assert_eq!(why.map(|why| why.code), Some(close::SLOW_CONSUMER));
        assert!(!connection.push(frame()), "nothing is queued once closing");
    }
}
