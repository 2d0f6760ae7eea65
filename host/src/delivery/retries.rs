//! Retry timers: every pushed message waiting for its ack timeout sits in one timer queue,
//! run by one task, instead of a task (and a tokio timer) per push.
//!
//! A push schedules its check with [`RetryTimers::schedule`]; when the wait is over the
//! queue's task calls [`Delivery::retry_due`](super::Delivery), which pushes again or
//! settles the push (acked, closed, given up, shed). The task holds the pending pushes; it
//! ends when the timers are dropped and nothing is pending any more.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use herald_proto::v1;
use tokio::sync::mpsc;
use tokio_util::time::DelayQueue;

use super::Delivery;
use super::session::Session;
use crate::model::ConversationId;

/// One pushed message whose ack is awaited.
pub(super) struct Pending {
    pub delivery: Arc<Delivery>,
    pub session: Arc<Session>,
    pub conversation: ConversationId,
    pub message: v1::Message,
    /// The push it waits on (1 for the first).
    pub attempt: u32,
}

/// The handle to the timer task.
pub(super) struct RetryTimers {
    queue: mpsc::UnboundedSender<(Duration, Pending)>,
    /// Pushes waiting, for `herald_map_entries{map="retry_timers"}`.
    pending: Arc<AtomicUsize>,
}

impl RetryTimers {
    /// Starts the timer task (on the current tokio runtime).
    pub fn start() -> Self {
        let (queue, mut arrivals) = mpsc::unbounded_channel::<(Duration, Pending)>();
        let pending = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&pending);
        tokio::spawn(async move {
            let mut timers = DelayQueue::new();
            let mut open = true;
            while open || !timers.is_empty() {
                tokio::select! {
                    arrival = arrivals.recv(), if open => match arrival {
                        Some((after, pending)) => {
                            timers.insert(pending, after);
                        }
                        None => open = false,
                    },
                    Some(due) = timers.next(), if !timers.is_empty() => {
                        let due: Pending = due.into_inner();
                        Arc::clone(&due.delivery).retry_due(due);
                    }
                    else => break,
                }
                count.store(timers.len(), Ordering::Relaxed);
            }
        });
        Self { queue, pending }
    }

    /// Checks on `pending` after `after`.
    pub fn schedule(&self, after: Duration, pending: Pending) {
        // The task ends only once these timers are dropped: it is there to take this.
        let _ = self.queue.send((after, pending));
    }

    /// Pushes waiting for their ack timeout.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}
