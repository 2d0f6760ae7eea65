//! One client connection as the rest of the server sees it: who it is, a bounded queue of
//! frames for its writer task, and a way to close it with a code.
//!
//! Invariants: only the connection's writer task writes to its socket (everyone else
//! queues); a queue that overflows closes the connection with 4008 rather than growing or
//! blocking the caller, so one slow client can never stall delivery to others.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};

use dashmap::DashMap;
use herald_proto::v1::{self, Frame};
use tokio::sync::{mpsc, watch};

use crate::model::{ConversationId, DeviceId, UserId};
use crate::routing::ConnectionId;

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
    /// A last frame the writer sends before the close frame (`go_away`).
    farewell: Mutex<Option<Frame>>,
    /// Flips to true once the writer task has stopped (its close frame is out).
    writer_done: watch::Sender<bool>,
    /// Flips to true once the connection is closing: nothing more is queued.
    closed: watch::Sender<bool>,
    /// False while the device is being backfilled; live pushes skip it until then.
    live: AtomicBool,
    /// Highest seq the device acked, per conversation (acks are cumulative).
    acked: Mutex<HashMap<ConversationId, u64>>,
    /// What backfill and live fan-out pushed, so neither pushes a message the other did.
    claims: Mutex<Claims>,
}

/// Who pushed what while backfill and live fan-out overlap, and after.
#[derive(Default)]
struct Claims {
    /// Per conversation, the seqs pushed and not yet matched or acked.
    pushed: HashMap<ConversationId, BTreeSet<u64>>,
    /// Backfill is over: a seq still in `pushed` is one backfill pushed (or read) before its
    /// live fan-out came — which happens when backfill reads a message between its commit
    /// and its fan-out — so that fan-out is skipped once.
    backfill_done: bool,
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
            farewell: Mutex::new(None),
            writer_done: watch::Sender::new(false),
            closed: watch::Sender::new(false),
            live: AtomicBool::new(false),
            acked: Mutex::new(HashMap::new()),
            claims: Mutex::new(Claims::default()),
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

    /// Frames queued for the writer and not yet written.
    pub fn queue_depth(&self) -> u32 {
        u32::try_from(self.outbox.max_capacity() - self.outbox.capacity()).unwrap_or(u32::MAX)
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

    /// Tells the client the server is going away, then closes with 1012: the writer sends
    /// `go_away` (after nothing else: frames still queued are dropped, the client pulls them
    /// again after reconnecting) and the close frame. The client is told to wait a random
    /// 0..=`spread_ms` before reconnecting, so a node's clients do not all return at once.
    pub fn go_away(&self, reason: &str, spread_ms: u32) {
        let reconnect_after_ms = rand::random_range(0..=spread_ms);
        *self.farewell.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Frame::new(0, v1::GoAway { reason: reason.to_owned(), reconnect_after_ms }));
        self.close(close::SERVICE_RESTART, reason);
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
        drop(acked);
        self.forget_claims_through(conversation, seq);
        moved
    }

    /// Claims the first push of `seq` of `conversation`: false if backfill or live push
    /// already pushed it, or the device acked it already.
    pub fn claim_push(&self, conversation: &ConversationId, seq: u64) -> bool {
        if seq <= self.acked_through(conversation) {
            return false;
        }
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if !claims.backfill_done {
            return claims.pushed.entry(conversation.clone()).or_default().insert(seq);
        }
        let Some(pushed) = claims.pushed.get_mut(conversation) else { return true };
        let first = !pushed.remove(&seq);
        if pushed.is_empty() {
            claims.pushed.remove(conversation);
        }
        first
    }

    /// No backfill for this connection: live pushes go through now, and what the device
    /// lacks it pulls with `sync`.
    pub fn skip_backfill(&self) {
        self.set_live();
        self.end_claims();
    }

    /// Backfill is over: from now on a live push is skipped only if backfill pushed it.
    pub fn end_claims(&self) {
        self.claims.lock().unwrap_or_else(|p| p.into_inner()).backfill_done = true;
    }

    /// Once backfill is over, claims up to an acked seq are no longer needed (live fan-out
    /// of those has come, or the device has them); dropping them keeps the set small.
    fn forget_claims_through(&self, conversation: &ConversationId, seq: u64) {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if !claims.backfill_done {
            return;
        }
        if let Some(pushed) = claims.pushed.get_mut(conversation) {
            *pushed = pushed.split_off(&seq.saturating_add(1));
            if pushed.is_empty() {
                claims.pushed.remove(conversation);
            }
        }
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

    /// The send-queue depth of every open connection.
    pub fn queue_depths(&self) -> Vec<u32> {
        self.by_id.iter().map(|connection| connection.queue_depth()).collect()
    }

    /// Sends every connection `go_away` (see [`Connection::go_away`]) and closes it (server
    /// shutdown). Returns the connections sent away.
    pub fn go_away_all(&self, reason: &str, spread_ms: u32) -> Vec<Arc<Connection>> {
        let all: Vec<Arc<Connection>> = self.by_id.iter().map(|connection| Arc::clone(&connection)).collect();
        for connection in &all {
            connection.go_away(reason, spread_ms);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> Connection {
        let (outbox, _) = mpsc::channel(8);
        let user = UserId::parse("bob").expect("user");
        let device = DeviceId::parse("phone").expect("device");
        Connection::new(1, user, device, outbox)
    }

    #[test]
    fn a_message_backfill_pushed_is_not_pushed_again_by_a_late_fan_out() {
        let connection = connection();
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        // Backfill reads seq 5 between its commit and its fan-out, and pushes it.
        assert!(connection.claim_push(&dm, 5));
        connection.end_claims();
        // The fan-out of 5 comes after backfill ended: skipped, once.
        assert!(!connection.claim_push(&dm, 5));
        assert!(connection.claim_push(&dm, 6), "a later message goes out");
    }

    #[test]
    fn while_backfilling_the_first_push_wins() {
        let connection = connection();
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        assert!(connection.claim_push(&dm, 3), "live pushes first");
        assert!(!connection.claim_push(&dm, 3), "backfill then skips it");
        connection.end_claims();
        assert!(connection.claim_push(&dm, 4));
    }

    #[test]
    fn an_acked_message_is_never_pushed_by_a_late_fan_out() {
        let connection = connection();
        let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
        assert!(connection.claim_push(&dm, 5));
        connection.end_claims();
        // The device acks 5 (dropping the claim) before the fan-out of 5 arrives.
        connection.record_ack(&dm, 5);
        assert!(!connection.claim_push(&dm, 5));
        assert!(connection.claim_push(&dm, 6));
    }
}
