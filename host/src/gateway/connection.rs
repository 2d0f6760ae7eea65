//! One client connection as the rest of the server sees it: who it is, a bounded queue of
//! frames for its writer task, and a way to close it with a code.
//!
//! Invariants: only the connection's writer task writes to its socket (everyone else
//! queues); a queue that overflows closes the connection with 4008 rather than growing or
//! blocking the caller, so one slow client can never stall delivery to others.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};


use dashmap::DashMap;
use herald_proto::v1::Frame;
use tokio::sync::{mpsc, watch};

use crate::model::{ConversationId, DeviceId, UserId};
use crate::routing::ConnectionId;

/// Close codes of PROTOCOL.md.
pub mod close {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const TOO_BIG: u16 = 1009;
    pub const BAD_TOKEN: u16 = 4001;
    pub const NO_CONNECT: u16 = 4002;
    pub const NOT_ALLOWED: u16 = 4003;
    pub const SLOW_CONSUMER: u16 = 4008;
    pub const KICKED: u16 = 4009;
    pub const PROTOCOL_ERROR: u16 = 4010;
}

/// A live, authenticated connection.
pub struct Connection {
    /// Unique on this node.
    pub id: ConnectionId,
    pub user: UserId,
    pub device: DeviceId,
    /// Frames for the writer task.
    outbox: mpsc::Sender<Frame>,
    /// A close requested by anyone; the writer sends it and stops.
    close_request: Mutex<Option<(u16, String)>>,
    /// Flips to true once the connection is closing: nothing more is queued.
    closed: watch::Sender<bool>,
    /// False while the device is being backfilled; live pushes skip it until then.
    live: AtomicBool,
    /// Highest seq the device acked, per conversation (acks are cumulative).
    acked: Mutex<HashMap<ConversationId, u64>>,
    /// While backfill and live pushes overlap: what was pushed, so neither pushes a
    /// message the other already did. `None` outside that window.
    claimed: Mutex<Option<HashSet<(ConversationId, u64)>>>,
}

impl Connection {
    /// A connection whose writer reads `outbox`.
    pub fn new(id: ConnectionId, user: UserId, device: DeviceId, outbox: mpsc::Sender<Frame>) -> Self {
        Self {
            id,
            user,
            device,
            outbox,
            close_request: Mutex::new(None),
            closed: watch::Sender::new(false),
            live: AtomicBool::new(false),
            acked: Mutex::new(HashMap::new()),
            claimed: Mutex::new(Some(HashSet::new())),
        }
    }

    /// Queues `frame` without waiting. A full queue closes the connection as a slow
    /// consumer (4008). Returns whether the frame was queued.
    pub fn push(&self, frame: Frame) -> bool {
        if self.is_closed() {
            return false;
        }
        match self.outbox.try_send(frame) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::counter!("herald_gateway_slow_consumers_total").increment(1);
                self.close(close::SLOW_CONSUMER, "send queue overflowed; reconnect and sync");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Queues `frame`, waiting for room (used by backfill, which paces itself to the client).
    pub async fn push_waiting(&self, frame: Frame) -> bool {
        !self.is_closed() && self.outbox.send(frame).await.is_ok()
    }

    /// Asks the writer to close the connection with `code`; the first request wins.
    pub fn close(&self, code: u16, reason: &str) {
        {
            let mut request = self.close_request.lock().unwrap_or_else(|p| p.into_inner());
            if request.is_some() || *self.closed.borrow() {
                return;
            }
            *request = Some((code, reason.to_owned()));
        }
        self.closed.send_replace(true);
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
    pub async fn close_requested(&self) -> (u16, String) {
        self.closing().await;
        self.close_request.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or((close::NORMAL, String::new()))
    }

    /// Whether live pushes may go to this connection (its backfill is done).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    /// Lets live pushes through.
    pub fn set_live(&self) {
        self.live.store(true, Ordering::SeqCst);
    }

    /// Records a cumulative ack; returns whether it moved the device's position forward.
    pub fn record_ack(&self, conversation: &ConversationId, seq: u64) -> bool {
        let mut acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        let position = acked.entry(conversation.clone()).or_default();
        let moved = seq > *position;
        *position = (*position).max(seq);
        moved
    }

    /// Claims the first push of `seq` of `conversation`: false if backfill or live push
    /// already pushed it while the two overlap.
    pub fn claim_push(&self, conversation: &ConversationId, seq: u64) -> bool {
        match self.claimed.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(claimed) => claimed.insert((conversation.clone(), seq)),
            None => true,
        }
    }

    /// Backfill is over: live pushes no longer need claiming.
    pub fn end_claims(&self) {
        *self.claimed.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The highest seq of `conversation` this connection acked.
    pub fn acked_through(&self, conversation: &ConversationId) -> u64 {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).get(conversation).copied().unwrap_or(0)
    }
}

/// The connections on this node, by id.
#[derive(Default)]
pub struct Connections {
    by_id: DashMap<ConnectionId, std::sync::Arc<Connection>>,
}

impl Connections {
    pub fn insert(&self, connection: std::sync::Arc<Connection>) {
        self.by_id.insert(connection.id, connection);
    }

    pub fn remove(&self, id: ConnectionId) {
        self.by_id.remove(&id);
    }

    pub fn get(&self, id: ConnectionId) -> Option<std::sync::Arc<Connection>> {
        self.by_id.get(&id).map(|c| std::sync::Arc::clone(&c))
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Closes every connection (server shutdown).
    pub fn close_all(&self, code: u16, reason: &str) {
        for connection in &self.by_id {
            connection.close(code, reason);
        }
    }
}
