//! Group commit: concurrent message inserts share one statement and one transaction.
//!
//! Callers hand a message to [`GroupCommitter::insert`] and wait; writer tasks take whatever
//! is queued (up to `max_batch` rows), write it in one statement, and tell each caller its
//! own outcome. Under load a commit carries hundreds of rows, so the cost of a durable commit
//! (an fsync) is shared; when idle a lone insert goes out at once, with no timer to wait on.
//!
//! A caller learns `Inserted::New` only after the transaction holding its row has committed:
//! that is what lets the pipeline's `SendAck OK` mean "durable".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{Backend, Database, Inserted, NewMessage, StoreError};
use crate::config::GroupCommitConfig;
use crate::health::LatencyWindow;

/// A submitted insert: wait on it to learn the outcome once its batch is committed.
pub struct Ticket(oneshot::Receiver<Result<Inserted, StoreError>>);

impl Ticket {
    /// The outcome of the insert, once durable (or failed).
    ///
    /// # Errors
    /// As [`GroupCommitter::insert`].
    pub async fn wait(self) -> Result<Inserted, StoreError> {
        self.0.await.map_err(|_| StoreError::Closed)?
    }
}

/// One insert waiting for its batch.
struct Pending {
    message: NewMessage,
    done: oneshot::Sender<Result<Inserted, StoreError>>,
}

/// The front door to batched message inserts. [`close`](Self::close) waits until what is
/// queued is written, then stops the writers.
#[derive(Clone)]
pub struct GroupCommitter {
    /// Where inserts queue for the writers.
    queue: mpsc::Sender<Pending>,
    /// The writer tasks, stopped on close.
    writers: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    /// Batches being written right now.
    busy: Arc<AtomicUsize>,
    /// How long batch writes took, for the health snapshot.
    latency: Arc<LatencyWindow>,
    /// Batches and rows written so far.
    totals: Arc<BatchTotals>,
}

/// Batches and rows written since start: rows per batch is how well commits are shared.
#[derive(Debug, Default)]
pub struct BatchTotals {
    pub batches: AtomicU64,
    pub rows: AtomicU64,
}

impl GroupCommitter {
    /// Starts the writer tasks on the current tokio runtime.
    pub fn start(database: Database, config: &GroupCommitConfig) -> Self {
        let (queue, receiver) = mpsc::channel(config.queue);
        let receiver = Arc::new(Mutex::new(receiver));
        let writers = config.writers.unwrap_or(match database.backend() {
            // SQLite has one writer at a time anyway; a second would only wait on its lock.
            Backend::Sqlite => 1,
            Backend::MySql | Backend::Postgres => 2,
        });
        let busy = Arc::new(AtomicUsize::new(0));
        let latency = Arc::new(LatencyWindow::default());
        let totals = Arc::new(BatchTotals::default());
        let handles = (0..writers)
            .map(|_| {
                let (busy, latency, totals) = (Arc::clone(&busy), Arc::clone(&latency), Arc::clone(&totals));
                let receiver = Arc::clone(&receiver);
                tokio::spawn(write_batches(database.clone(), receiver, config.max_batch, busy, latency, totals))
            })
            .collect();
        Self { queue, writers: Arc::new(std::sync::Mutex::new(handles)), busy, latency, totals }
    }

    /// Batches and rows written since start.
    pub fn totals(&self) -> &BatchTotals {
        &self.totals
    }

    /// How long batch writes took since the last look.
    pub fn write_latency(&self) -> &LatencyWindow {
        &self.latency
    }

    /// Stores `message` in the next batch and returns once that batch is committed.
    ///
    /// # Errors
    /// [`StoreError::Closed`] when the writers have stopped; otherwise what the database
    /// said about this row (see [`Database::insert_messages`]).
    pub async fn insert(&self, message: NewMessage) -> Result<Inserted, StoreError> {
        self.submit(message).await?.wait().await
    }

    /// Queues `message` for the next batch and returns at once with a ticket to wait on.
    /// Messages submitted one after another are committed in that order.
    ///
    /// # Errors
    /// [`StoreError::Closed`] when the writers have stopped.
    pub async fn submit(&self, message: NewMessage) -> Result<Ticket, StoreError> {
        let (done, outcome) = oneshot::channel();
        self.queue.send(Pending { message, done }).await.map_err(|_| StoreError::Closed)?;
        Ok(Ticket(outcome))
    }

    /// Waits (up to 30 s) until every queued insert is written, then stops the writers.
    /// Call it once nothing submits any more (the server stopped accepting sends).
    pub async fn close(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while (self.queue.capacity() < self.queue.max_capacity() || self.busy.load(Ordering::SeqCst) > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for handle in std::mem::take(&mut *self.writers.lock().unwrap_or_else(|p| p.into_inner())) {
            handle.abort();
        }
    }
}

/// One writer: take what is queued, write it in one statement, report, repeat.
async fn write_batches(
    database: Database,
    receiver: Arc<Mutex<mpsc::Receiver<Pending>>>,
    max_batch: usize,
    busy: Arc<AtomicUsize>,
    latency: Arc<LatencyWindow>,
    totals: Arc<BatchTotals>,
) {
    let mut batch = Vec::with_capacity(max_batch);
    loop {
        // While this writer holds the receiver, the other writers are writing their batches;
        // whatever arrives meanwhile is gathered into the next one.
        let received = {
            let mut receiver = receiver.lock().await;
            let received = receiver.recv_many(&mut batch, max_batch).await;
            busy.fetch_add(1, Ordering::SeqCst); // before the queue looks empty to close()
            received
        };
        if received == 0 {
            busy.fetch_sub(1, Ordering::SeqCst);
            return; // every sender is gone and the queue is drained
        }
        let (messages, waiters): (Vec<NewMessage>, Vec<_>) =
            batch.drain(..).map(|pending| (pending.message, pending.done)).unzip();
        metrics::histogram!("herald_store_batch_rows").record(messages.len() as f64);
        totals.batches.fetch_add(1, Ordering::Relaxed);
        totals.rows.fetch_add(messages.len() as u64, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let results = database.insert_messages(&messages).await;
        let took = started.elapsed();
        latency.record(took);
        metrics::histogram!("herald_store_batch_seconds").record(took.as_secs_f64());
        for (waiter, result) in waiters.into_iter().zip(results) {
            // A caller that gave up waiting does not undo the write.
            let _ = waiter.send(result);
        }
        busy.fetch_sub(1, Ordering::SeqCst);
    }
}
