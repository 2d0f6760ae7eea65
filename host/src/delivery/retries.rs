//! Retry timers: every pushed message waiting for its ack sits in one timer queue, run by
//! one task, instead of a task (and a tokio timer) per push.
//!
//! A push schedules its check with [`RetryTimers::schedule`]; when the wait is over the
//! queue's task calls [`Delivery::retry_due`](super::Delivery), which pushes again or
//! settles the push (acked, closed, given up, shed). An ack takes the pushes it covers out
//! of the queue at once ([`RetryTimers::acked`]), and a closed connection all of its own
//! ([`RetryTimers::closed`]): a push holds its message and its session only while its ack
//! is awaited, not for the whole ack timeout. An ack that overtakes its push's timer (the
//! push was written before its timer was queued) is still caught when the timer is due:
//! `retry_due` checks the session's acks first. The task ends when the timers are dropped
//! and nothing is pending any more.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use herald_proto::v1;
use tokio::sync::mpsc;
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key;

use super::Delivery;
use super::session::Session;
use crate::maps::HashMap;
use crate::model::{ConnectionId, ConversationId};

/// One pushed message whose ack is awaited.
pub(super) struct Pending {
    pub delivery: Arc<Delivery>,
    pub session: Arc<Session>,
    pub conversation: ConversationId,
    pub message: v1::Message,
    /// The push it waits on (1 for the first).
    pub attempt: u32,
}

/// What the timer task is told.
enum Command {
    /// Check on a push after a wait.
    Wait(Duration, Pending),
    /// A connection acked a conversation through a seq.
    Acked { connection: ConnectionId, conversation: ConversationId, through: u64 },
    /// A connection closed.
    Closed(ConnectionId),
}

/// The handle to the timer task.
pub(super) struct RetryTimers {
    commands: mpsc::UnboundedSender<Command>,
    /// Pushes waiting, for `herald_map_entries{map="retry_timers"}`.
    pending: Arc<AtomicUsize>,
}

impl RetryTimers {
    /// Starts the timer task (on the current tokio runtime).
    pub fn start() -> Self {
        let (commands, mut received) = mpsc::unbounded_channel::<Command>();
        let pending = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&pending);
        tokio::spawn(async move {
            let mut timers = Timers::default();
            let mut open = true;
            while open || !timers.queue.is_empty() {
                tokio::select! {
                    command = received.recv(), if open => match command {
                        Some(Command::Wait(after, pending)) => timers.insert(after, pending),
                        Some(Command::Acked { connection, conversation, through }) => {
                            let settled = timers.settle(connection, Some((&conversation, through)));
                            metrics::counter!("herald_delivery_settled_total", "outcome" => "acked").increment(settled);
                        }
                        Some(Command::Closed(connection)) => {
                            let settled = timers.settle(connection, None);
                            metrics::counter!("herald_delivery_settled_total", "outcome" => "closed").increment(settled);
                        }
                        None => open = false,
                    },
                    Some(due) = timers.queue.next(), if !timers.queue.is_empty() => {
                        let due = timers.forget(due.into_inner());
                        Arc::clone(&due.delivery).retry_due(due);
                    }
                    else => break,
                }
                count.store(timers.queue.len(), Ordering::Relaxed);
            }
        });
        Self { commands, pending }
    }

    /// Checks on `pending` after `after`.
    pub fn schedule(&self, after: Duration, pending: Pending) {
        // The task ends only once these timers are dropped: it is there to take this.
        let _ = self.commands.send(Command::Wait(after, pending));
    }

    /// `connection` acked `conversation` through `through`: its pushes up to there are
    /// settled.
    pub fn acked(&self, connection: ConnectionId, conversation: ConversationId, through: u64) {
        let _ = self.commands.send(Command::Acked { connection, conversation, through });
    }

    /// `connection` closed: its pushes are settled.
    pub fn closed(&self, connection: ConnectionId) {
        let _ = self.commands.send(Command::Closed(connection));
    }

    /// Pushes waiting for their ack.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

/// The pushes of one conversation to one connection that wait, by (seq, number).
type Waiting = BTreeMap<(u64, u64), Key>;

/// The queue, and where each push sits in it by connection, conversation and seq (so an
/// ack or a close finds its pushes without a scan).
#[derive(Default)]
struct Timers {
    /// Each push with its number (two pushes of one seq may wait at once: a backfill's and
    /// a live one's).
    queue: DelayQueue<(u64, Pending)>,
    index: HashMap<ConnectionId, HashMap<ConversationId, Waiting>>,
    numbered: u64,
}

impl Timers {
    fn insert(&mut self, after: Duration, pending: Pending) {
        self.numbered += 1;
        let number = self.numbered;
        let (connection, conversation, seq) = (pending.session.id, pending.conversation.clone(), pending.message.seq);
        let key = self.queue.insert((number, pending), after);
        self.index.entry(connection).or_default().entry(conversation).or_default().insert((seq, number), key);
    }

    /// Takes a push that is due out of the index.
    fn forget(&mut self, (number, pending): (u64, Pending)) -> Pending {
        let connection = pending.session.id;
        if let Some(conversations) = self.index.get_mut(&connection) {
            if let Some(pushes) = conversations.get_mut(&pending.conversation) {
                pushes.remove(&(pending.message.seq, number));
                if pushes.is_empty() {
                    conversations.remove(&pending.conversation);
                }
            }
            if conversations.is_empty() {
                self.index.remove(&connection);
            }
        }
        pending
    }

    /// Takes the pushes of `connection` out of the queue — those of one conversation up to
    /// a seq, or all of them — and returns how many.
    fn settle(&mut self, connection: ConnectionId, acked: Option<(&ConversationId, u64)>) -> u64 {
        let Some(conversations) = self.index.get_mut(&connection) else { return 0 };
        let keys: Vec<Key> = match acked {
            Some((conversation, through)) => {
                let Some(pushes) = conversations.get_mut(conversation) else { return 0 };
                let later = match through.checked_add(1) {
                    Some(next) => pushes.split_off(&(next, 0)),
                    None => BTreeMap::new(),
                };
                let covered = std::mem::replace(pushes, later);
                if pushes.is_empty() {
                    conversations.remove(conversation);
                }
                covered.into_values().collect()
            }
            None => conversations.drain().flat_map(|(_, pushes)| pushes.into_values()).collect(),
        };
        if conversations.is_empty() {
            self.index.remove(&connection);
        }
        // Every key in the index is in the queue (a due push leaves both at once).
        keys.iter().filter(|key| self.queue.try_remove(key).is_some()).count() as u64
    }
}
