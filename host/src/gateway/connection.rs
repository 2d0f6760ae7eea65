//! One client connection's transport: a bounded queue of frames for its writer task, and a
//! way to close it with a code. What was pushed to the device and what it acked is
//! delivery's business ([`Session`](crate::delivery::session::Session)); this is the
//! [`Outbox`] that session writes to.
//!
//! Invariants: only the connection's writer task writes to its socket (everyone else
//! queues); a queue that overflows closes the connection with 4008 rather than growing or
//! blocking the caller, so one slow client can never stall delivery to others.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use herald_proto::SharedFrame;
use herald_proto::v1::{self, Frame};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::delivery::session::Outbox;
use crate::health::QueueDepths;
use crate::maps::DashMap;
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
/// connections (a room message, encoded once for all of them). Two words, so that a queue
/// of them is small.
pub enum Outgoing {
    Own(Box<Frame>),
    Shared(Arc<SharedFrame>),
}

/// A live, authenticated connection's transport.
///
/// Its queue is a `VecDeque` under a lock rather than a channel: a tokio channel costs
/// every connection about 1 KiB up front (its shared state and a first block of 32 slots),
/// where an empty `VecDeque` costs nothing, and the two `watch` channels that said "closing"
/// and "writer stopped" cost 340 bytes each (docs/ARCHITECTURE.md, "Memory per
/// connection"). The lock is held for a push or a pop, never across an await.
pub struct Connection {
    /// Unique on this node.
    pub id: ConnectionId,
    /// Most frames queued at once; one more closes the connection as a slow consumer.
    capacity: usize,
    state: Mutex<State>,
    /// A close was requested: nothing more is queued (read without the lock).
    closed: AtomicBool,
    /// Wakes the writer: a frame was queued or a close requested. `notify_one` keeps a
    /// permit when the writer is busy, so no wake-up is lost.
    wake_writer: Notify,
    /// Wakes everyone else who waits on this connection: for a close (the reader), for
    /// room in the queue (backfill), for the writer's end (a drain). Each re-checks.
    changed: Notify,
    /// When the connection opened: the origin of `heard_ms`.
    opened: Instant,
    /// When a frame last came from the client, in ms after `opened`: the writer asks for a
    /// `pong` only after a long enough silence.
    heard_ms: AtomicU64,
    /// How many connections of the node hold queued frames ([`Connections`]' count): this
    /// one adds itself while its queue is not empty.
    queued: Arc<AtomicUsize>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Outgoing>,
    /// The close requested first; the writer sends it.
    close: Option<CloseReason>,
    /// A last frame the writer sends before the close frame (`go_away`).
    farewell: Option<Box<Frame>>,
    /// The writer task stopped: nothing queued will be written.
    writer_done: bool,
    /// Someone waits for room in the queue (backfill), so a pop tells `changed`.
    room_wanted: bool,
}

/// A queue that grew past this many slots is given back when it empties, so one burst does
/// not hold memory for the connection's whole life.
const KEEP_QUEUE_SLOTS: usize = 64;

impl Connection {
    /// A connection whose queue holds at most `capacity` frames, counted by no registry.
    #[cfg(test)]
    pub fn new(id: ConnectionId, capacity: usize) -> Self {
        Self::counted(id, capacity, Arc::default())
    }

    /// As [`Connection::new`], adding itself to `queued` while frames wait in its queue.
    fn counted(id: ConnectionId, capacity: usize, queued: Arc<AtomicUsize>) -> Self {
        Self {
            id,
            capacity: capacity.max(1),
            state: Mutex::new(State::default()),
            closed: AtomicBool::new(false),
            wake_writer: Notify::new(),
            changed: Notify::new(),
            opened: Instant::now(),
            heard_ms: AtomicU64::new(0),
            queued,
        }
    }

    /// Queues `outgoing` in `state` (its lock held), counting the connection as one with
    /// frames queued when the queue was empty.
    fn enqueue(&self, state: &mut State, outgoing: Outgoing) {
        if state.queue.is_empty() {
            self.queued.fetch_add(1, Ordering::Relaxed);
        }
        state.queue.push_back(outgoing);
    }

    /// A frame came from the client just now.
    pub fn heard(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heard_ms.store(ms, Ordering::Relaxed);
    }

    /// When a frame last came from the client (the connection's opening, before any did).
    pub fn heard_at(&self) -> Instant {
        self.opened + std::time::Duration::from_millis(self.heard_ms.load(Ordering::Relaxed))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
        let mut state = self.state();
        if state.writer_done {
            return false;
        }
        if state.queue.len() >= self.capacity {
            drop(state);
            metrics::counter!("herald_gateway_slow_consumers_total").increment(1);
            self.close(CloseReason::new(close::SLOW_CONSUMER, "send queue overflowed; reconnect and sync"));
            return false;
        }
        self.enqueue(&mut state, outgoing);
        drop(state);
        self.wake_writer.notify_one();
        true
    }

    /// Frames queued for the writer and not yet written.
    pub fn queue_depth(&self) -> u32 {
        u32::try_from(self.state().queue.len()).unwrap_or(u32::MAX)
    }

    /// Queues `frame`, waiting for room (used by backfill, which paces itself to the client).
    /// It fills the queue only halfway: the other half is for the live traffic and the
    /// replies to the client's requests, which do not wait, so a client that asks something
    /// while a long backfill is queued is answered, not closed as a slow consumer.
    /// Returns false, without queueing, once the connection is closing.
    pub async fn push_waiting(&self, frame: Frame) -> bool {
        let mut frame = Some(Box::new(frame));
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state();
                if state.writer_done || self.is_closed() {
                    return false;
                }
                if state.queue.len() < self.waiting_room() {
                    let frame = frame.take().expect("queued once");
                    self.enqueue(&mut state, Outgoing::Own(frame));
                    drop(state);
                    self.wake_writer.notify_one();
                    return true;
                }
                state.room_wanted = true;
            }
            changed.await;
        }
    }

    /// How many frames [`Connection::push_waiting`] fills the queue to.
    fn waiting_room(&self) -> usize {
        (self.capacity / 2).max(1)
    }

    /// The next frame for the writer, if one is queued. An emptied queue that had grown
    /// gives its memory back.
    pub(super) fn pop(&self) -> Option<Outgoing> {
        let mut state = self.state();
        let next = state.queue.pop_front();
        if next.is_some() && state.queue.is_empty() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        if state.queue.is_empty() && state.queue.capacity() > KEEP_QUEUE_SLOTS {
            state.queue = VecDeque::new();
        }
        let room_wanted = std::mem::take(&mut state.room_wanted) && next.is_some();
        drop(state);
        if room_wanted {
            self.changed.notify_waiters();
        }
        next
    }

    /// Resolves when the writer may have work: a frame queued or a close requested since
    /// it last looked (it may also resolve with nothing to do).
    pub(super) async fn work(&self) {
        self.wake_writer.notified().await;
    }

    /// Asks the writer to close the connection; the first request wins.
    pub fn close(&self, why: CloseReason) {
        {
            let mut state = self.state();
            if state.close.is_some() {
                return;
            }
            state.close = Some(why);
            self.closed.store(true, Ordering::Release);
        }
        self.wake_writer.notify_one();
        self.changed.notify_waiters();
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
        self.state().farewell = Some(Box::new(Frame::new(0, go_away)));
        self.close(CloseReason::new(close::SERVICE_RESTART, reason));
    }

    /// For the writer: the close requested, if any, with the frame to send before it
    /// (`go_away`, taken once).
    pub(super) fn close_request(&self) -> Option<(CloseReason, Option<Box<Frame>>)> {
        if !self.is_closed() {
            return None;
        }
        let mut state = self.state();
        let why = state.close.clone()?;
        Some((why, state.farewell.take()))
    }

    /// Marks the writer task stopped: what is still queued is dropped, and nothing more is
    /// queued.
    pub fn writer_stopped(&self) {
        let dropped = {
            let mut state = self.state();
            state.writer_done = true;
            if !state.queue.is_empty() {
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
            std::mem::take(&mut state.queue)
        };
        drop(dropped);
        self.changed.notify_waiters();
    }

    /// Resolves once the writer task has stopped.
    pub async fn writer_finished(&self) {
        self.wait_until(|connection| connection.state().writer_done).await;
    }

    /// Resolves once `done` holds, checking it again whenever `changed` is told. The
    /// wake-up is armed before each check, so a change between the check and the wait is
    /// not missed.
    async fn wait_until(&self, done: impl Fn(&Self) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(self) {
                return;
            }
            changed.await;
        }
    }

    /// Whether a close was requested.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Resolves once a close is requested.
    pub async fn closing(&self) {
        self.wait_until(Self::is_closed).await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Dropped with frames still queued (its writer never ran): no longer one that holds any.
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !state.queue.is_empty() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
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
    /// How many connections made by [`Connections::connection`] hold queued frames: while
    /// none does, the health sample reads no queue (an idle node's many connections cost it
    /// a lock each, every sample, otherwise).
    queued: Arc<AtomicUsize>,
}

impl Connections {
    /// A connection whose queue holds at most `capacity` frames, counted among those with
    /// frames queued while it has some.
    pub fn connection(&self, id: ConnectionId, capacity: usize) -> Connection {
        Connection::counted(id, capacity, Arc::clone(&self.queued))
    }

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

    /// Gives back the room the map grew to for a crowd that has left.
    pub fn shrink_if_sparse(&self) {
        crate::maps::shrink_if_sparse(&self.by_id);
    }

    /// How many connections are open, and the send-queue depths of those with frames
    /// queued.
    pub fn queue_depths(&self) -> QueueDepths {
        let connections = self.by_id.len() as u64;
        let queued = if self.queued.load(Ordering::Relaxed) == 0 {
            Vec::new()
        } else {
            self.by_id.iter().map(|connection| connection.queue_depth()).filter(|&depth| depth > 0).collect()
        };
        QueueDepths { connections, queued }
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

    fn frame() -> Frame {
        Frame::new(0, v1::Pong { time_ms: 0 })
    }

    #[tokio::test]
    async fn the_registry_reads_only_the_queues_that_hold_frames() {
        let connections = Connections::default();
        let (one, two) =
            (Arc::new(connections.connection(ConnectionId(1), 8)), connections.connection(ConnectionId(2), 8));
        connections.insert(Arc::clone(&one));
        assert_eq!(connections.queue_depths(), QueueDepths { connections: 1, queued: vec![] });

        assert!(one.push(frame()) && one.push(frame()));
        assert!(one.push_waiting(frame()).await);
        assert_eq!(connections.queue_depths(), QueueDepths { connections: 1, queued: vec![3] });
        while one.pop().is_some() {}
        assert_eq!(connections.queue_depths(), QueueDepths { connections: 1, queued: vec![] }, "emptied by the writer");

        assert!(one.push(frame()));
        one.writer_stopped();
        assert_eq!(
            connections.queue_depths(),
            QueueDepths { connections: 1, queued: vec![] },
            "dropped with the writer"
        );

        // Never registered, dropped with a frame queued: counted while it lived, not after.
        assert!(two.push(frame()));
        assert_eq!(connections.queued.load(Ordering::Relaxed), 1);
        drop(two);
        assert_eq!(connections.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_queue_closes_the_connection_as_a_slow_consumer_and_the_first_close_wins() {
        let connection = Connection::new(ConnectionId(1), 2);
        assert!(connection.push(frame()) && connection.push(frame()));
        assert_eq!(connection.queue_depth(), 2);
        assert!(!connection.push(frame()), "no room: not queued");
        assert!(connection.is_closed());
        connection.close(CloseReason::new(close::KICKED, "later"));
        let (why, farewell) = connection.close_request().expect("a close was requested");
        assert_eq!((why.code, farewell.is_none()), (close::SLOW_CONSUMER, true));
        assert!(!connection.push(frame()), "nothing is queued once closing");
    }

    #[test]
    fn frames_come_out_in_the_order_they_went_in_and_a_grown_queue_is_given_back_once_empty() {
        let connection = Connection::new(ConnectionId(1), 1000);
        for time_ms in 0..200 {
            assert!(connection.push(Frame::new(0, v1::Pong { time_ms })));
        }
        let mut popped = Vec::new();
        while let Some(Outgoing::Own(frame)) = connection.pop() {
            popped.push(match frame.body {
                Some(v1::frame::Body::Pong(pong)) => pong.time_ms,
                _ => panic!("a pong went in"),
            });
        }
        assert_eq!(popped, (0..200).collect::<Vec<_>>());
        assert_eq!(connection.state().queue.capacity(), 0, "the burst's slots were handed back");
    }

    #[tokio::test]
    async fn a_waiting_push_gets_room_when_the_writer_pops_and_gives_up_when_the_connection_closes() {
        let connection = Arc::new(Connection::new(ConnectionId(1), 1));
        assert!(connection.push(frame()));
        let waiting = tokio::spawn({
            let connection = Arc::clone(&connection);
            async move { connection.push_waiting(frame()).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the queue is full: the push waits");
        assert!(connection.pop().is_some());
        assert!(waiting.await.expect("no panic"), "queued once there was room");
        assert_eq!(connection.queue_depth(), 1);

        let waiting = tokio::spawn({
            let connection = Arc::clone(&connection);
            async move { connection.push_waiting(frame()).await }
        });
        tokio::task::yield_now().await;
        connection.close(CloseReason::normal());
        assert!(!waiting.await.expect("no panic"), "a closing connection takes nothing more");
    }

    #[tokio::test]
    async fn a_waiting_push_leaves_half_the_queue_for_replies() {
        let connection = Arc::new(Connection::new(ConnectionId(1), 8));
        for _ in 0..4 {
            assert!(connection.push_waiting(frame()).await, "room for half the queue at once");
        }
        let waiting = tokio::spawn({
            let connection = Arc::clone(&connection);
            async move { connection.push_waiting(frame()).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a backfill waits once the queue is half full");
        for _ in 0..4 {
            assert!(connection.push(frame()), "a reply still fits");
        }
        assert!(!connection.is_closed(), "replies beside a waiting backfill close nothing");
        while connection.pop().is_some() {}
        assert!(waiting.await.expect("no panic"), "the backfill goes on once the writer drained");
    }

    #[tokio::test]
    async fn the_writer_is_woken_by_a_push_made_while_it_was_busy_and_its_end_is_announced() {
        let connection = Arc::new(Connection::new(ConnectionId(1), 8));
        assert!(connection.push(frame()), "queued before the writer waits");
        tokio::time::timeout(std::time::Duration::from_secs(5), connection.work())
            .await
            .expect("the push left a wake-up for the writer");
        let finished = tokio::spawn({
            let connection = Arc::clone(&connection);
            async move { connection.writer_finished().await }
        });
        tokio::task::yield_now().await;
        assert!(!finished.is_finished());
        connection.writer_stopped();
        finished.await.expect("no panic");
        assert_eq!(connection.queue_depth(), 0, "what was queued is dropped with the writer");
        assert!(!connection.push(frame()), "nothing is queued once the writer stopped");
    }
}
