//! Group commit: concurrent message inserts share one transaction.
//!
//! Callers [`submit`](MessageWriter::submit) a message and wait on its [`Ticket`]; writer
//! tasks take whatever is queued (up to `max_batch` rows), write it in one transaction, and
//! tell each caller its own outcome. Under load a commit carries hundreds of rows, so the
//! cost of a durable commit (an fsync) is shared; when idle a lone insert goes out at once,
//! with no timer to wait on.
//!
//! A caller learns `Inserted::New` only after the transaction holding its row has committed:
//! that is what lets the pipeline's `SendAck OK` mean "durable".
//!
//! On SQLite the writer runs on a thread of its own (with a single-threaded tokio runtime).
//! A batch takes a dozen awaits (a connection, each statement, the commit); on the server's
//! runtime each of them would queue behind the thousands of tasks its last commit just woke,
//! and SQLite's one writer would sit idle meanwhile (measured: a sixth more rows a second on
//! a thread of its own). Server backends keep theirs on the shared runtime: there the time
//! goes to the network round trip, and their sockets belong to that runtime's reactor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::AbortHandle;

use super::batch::Submission;
use super::latency::LatencyWindow;
use super::messages::Committed;
use super::seq_lease::Fence;
use super::{Backend, Database, Inserted, MessageWriter, StoreError, Ticket};
use crate::breaker::Breaker;
use crate::config::GroupCommitConfig;
use crate::model::Message;

/// One insert waiting for its batch.
struct Pending {
    submission: Submission,
    done: Waiter,
}

/// The front door to batched message inserts. [`close`](Self::close) waits until what is
/// queued is written, then stops the writers.
#[derive(Clone)]
pub struct GroupCommitter {
    /// Where inserts queue for the writers.
    queue: mpsc::Sender<Pending>,
    /// The writer tasks, stopped on close.
    writers: Arc<std::sync::Mutex<Vec<AbortHandle>>>,
    /// Inserts submitted and not yet answered: `close` waits for none.
    outstanding: Arc<AtomicUsize>,
    /// How long batch writes took, for the health snapshot.
    latency: Arc<LatencyWindow>,
    /// Batches and rows written so far.
    totals: Arc<BatchTotals>,
    /// Open while the database fails or does not answer: inserts are refused at once.
    breaker: Breaker,
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
            // PostgreSQL writes a batch in one round trip (`postgres.rs`): a second writer
            // would only split the same rows into twice the commits, and a commit costs the
            // server CPU however few rows it holds (3 nodes at 5k msgs/s on 2 cores: p99
            // 70–85 ms with one writer a node, 160–240 ms with two).
            Backend::Sqlite | Backend::Postgres => 1,
            // A batch takes several round trips there (`messages.rs`); two writers overlap them.
            Backend::MySql => 2,
        });
        let outstanding = Arc::new(AtomicUsize::new(0));
        let latency = Arc::new(LatencyWindow::default());
        let totals = Arc::new(BatchTotals::default());
        let breaker = Breaker::new("store", config.breaker());
        let handles = (0..writers)
            .map(|n| {
                let writer = write_batches(
                    database.clone(),
                    // Past u32::MAX writers (never configured) would share the last rows.
                    u32::try_from(n).unwrap_or(u32::MAX),
                    Arc::clone(&receiver),
                    config.max_batch,
                    Duration::from_millis(config.commit_timeout_ms),
                    Shared {
                        outstanding: Arc::clone(&outstanding),
                        latency: Arc::clone(&latency),
                        totals: Arc::clone(&totals),
                        breaker: breaker.clone(),
                    },
                );
                match database.backend() {
                    Backend::Sqlite => on_own_thread(format!("herald-commit-{n}"), writer),
                    Backend::MySql | Backend::Postgres => tokio::spawn(writer).abort_handle(),
                }
            })
            .collect();
        Self { queue, writers: Arc::new(std::sync::Mutex::new(handles)), outstanding, latency, totals, breaker }
    }

    /// The store's circuit breaker (`herald_breaker_state{breaker="store"}`).
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Batches and rows written since start.
    pub fn totals(&self) -> &BatchTotals {
        &self.totals
    }

    /// How long batch writes took since the last look.
    pub fn write_latency(&self) -> &LatencyWindow {
        &self.latency
    }

    /// Waits (up to 30 s) until every submitted insert is answered, then stops the writers.
    /// Call it once nothing submits any more (the server stopped accepting sends).
    pub async fn close(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.outstanding.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for handle in std::mem::take(&mut *self.writers.lock().unwrap_or_else(|p| p.into_inner())) {
            handle.abort();
        }
    }
}

#[async_trait]
impl MessageWriter for GroupCommitter {
    async fn submit(&self, message: Message, fence: Option<Fence>) -> Result<Ticket, StoreError> {
        if !self.breaker.permits() {
            return Err(StoreError::Unavailable("the store's circuit breaker is open".into()));
        }
        let (done, outcome) = oneshot::channel();
        // Counted only once a place in the queue is had: a caller that gives up waiting for
        // one leaves nothing behind.
        let place = self.queue.reserve().await.map_err(|_| StoreError::Closed)?;
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        place.send(Pending { submission: Submission { message, fence }, done });
        Ok(Ticket(outcome))
    }

    fn available(&self) -> bool {
        self.breaker.permits()
    }
}

/// Runs `writer` on a new thread with a single-threaded runtime of its own; the thread ends
/// when the writer does (its queue closed) or is aborted. Should no thread be had, it runs on
/// the caller's runtime instead.
fn on_own_thread(name: String, writer: impl Future<Output = ()> + Send + 'static) -> AbortHandle {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::warn!(%error, "no runtime for the commit writer; it shares the server's");
            return tokio::spawn(writer).abort_handle();
        }
    };
    let task = runtime.spawn(writer);
    let abort = task.abort_handle();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        // Err only when aborted (by `close`): nothing left to do either way.
        let _ = runtime.block_on(task);
    });
    if let Err(error) = spawned {
        // The closure (and with it the runtime and the writer) was dropped unrun.
        tracing::error!(%error, "could not start the commit writer's thread");
    }
    abort
}

/// What the writers of one committer share.
struct Shared {
    /// Inserts submitted and not yet answered.
    outstanding: Arc<AtomicUsize>,
    latency: Arc<LatencyWindow>,
    totals: Arc<BatchTotals>,
    breaker: Breaker,
}

/// One writer (number `writer`, whose rows of the id marks it raises): take what is queued,
/// write it in one statement (failing it when it takes longer than `commit_timeout`),
/// report, repeat. Each batch tells the breaker how the database did: a row that failed for
/// the database's sake (an error of its own, or no answer in time) is a failure, any other
/// outcome a success.
async fn write_batches(
    database: Database,
    writer: u32,
    receiver: Arc<Mutex<mpsc::Receiver<Pending>>>,
    max_batch: usize,
    commit_timeout: Duration,
    shared: Shared,
) {
    let Shared { outstanding, latency, totals, breaker } = shared;
    // Commits that must still be made durable go to a task of their own, so this one
    // starts the next batch meanwhile (see `wal_sync`).
    let (to_sync, synced) = mpsc::unbounded_channel();
    let syncer = tokio::spawn(sync_and_report(database.clone(), synced, Arc::clone(&outstanding)));
    // SQLite's writer has a thread of its own (`on_own_thread`), which may block on an fsync.
    let in_place = database.backend() == Backend::Sqlite;
    let mut batch = Vec::with_capacity(max_batch);
    loop {
        // While this writer holds the receiver, the other writers are writing their batches;
        // whatever arrives meanwhile is gathered into the next one.
        let received = {
            let mut receiver = receiver.lock().await;
            receiver.recv_many(&mut batch, max_batch).await
        };
        if received == 0 {
            break; // every sender is gone and the queue is drained
        }
        let (messages, waiters): (Vec<Submission>, Vec<_>) =
            batch.drain(..).map(|pending| (pending.submission, pending.done)).unzip();
        metrics::histogram!("herald_store_batch_rows").record(messages.len() as f64);
        totals.batches.fetch_add(1, Ordering::Relaxed);
        totals.rows.fetch_add(messages.len() as u64, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let commit = database.insert_messages_committed(&messages, writer);
        let committed = match tokio::time::timeout(commit_timeout, commit).await {
            Ok(committed) => committed,
            Err(_) => Committed::failed(messages.len(), &format!("no commit within {} ms", commit_timeout.as_millis())),
        };
        let took = started.elapsed();
        latency.record(took);
        metrics::histogram!("herald_store_batch_seconds").record(took.as_secs_f64());
        tell_breaker(&breaker, &committed.results);
        // Nothing waits to be written (or another writer, holding the queue, takes what
        // comes), so there is nothing to overlap the fsync with: done here, it saves handing
        // it to another thread and back.
        let nothing_waits = || receiver.try_lock().map_or(true, |queue| queue.is_empty());
        if committed.needs_sync() && in_place && nothing_waits() {
            let results = database.make_durable_here(vec![committed]).pop().unwrap_or_default();
            report(waiters, results, &outstanding);
        } else if committed.needs_sync() {
            if let Err(unsent) = to_sync.send((committed, waiters)) {
                let (committed, waiters) = unsent.0;
                let closed = committed.results.into_iter().map(|r| r.and(Err(StoreError::Closed))).collect();
                report(waiters, closed, &outstanding);
            }
        } else {
            report(waiters, committed.results, &outstanding);
        }
    }
    drop(to_sync);
    let _ = syncer.await; // report what is still being synced before the writer's thread ends
}

/// One failure per row the database failed (so a batch of many rows that timed out opens
/// the breaker sooner than one row would), or one success.
fn tell_breaker(breaker: &Breaker, results: &[Result<Inserted, StoreError>]) {
    let failed = results
        .iter()
        .filter(|result| matches!(result, Err(StoreError::Database(_) | StoreError::Unavailable(_))))
        .count();
    if failed == 0 {
        breaker.success();
    }
    for _ in 0..failed {
        breaker.failure();
    }
}

/// Makes committed batches durable, as many per fsync as are waiting, then tells each
/// caller its outcome.
async fn sync_and_report(
    database: Database,
    mut committed: mpsc::UnboundedReceiver<(Committed, Vec<Waiter>)>,
    outstanding: Arc<AtomicUsize>,
) {
    let mut waiting = Vec::new();
    while committed.recv_many(&mut waiting, usize::MAX).await > 0 {
        let (batches, waiters): (Vec<Committed>, Vec<Vec<Waiter>>) = waiting.drain(..).unzip();
        let started = std::time::Instant::now();
        let outcomes = database.make_durable(batches).await;
        metrics::histogram!("herald_store_sync_seconds").record(started.elapsed().as_secs_f64());
        for (waiters, results) in waiters.into_iter().zip(outcomes) {
            report(waiters, results, &outstanding);
        }
    }
}

/// Where a caller waits for its insert's outcome.
type Waiter = oneshot::Sender<Result<Inserted, StoreError>>;

/// Tells each caller its outcome; a caller that gave up waiting does not undo the write.
fn report(waiters: Vec<Waiter>, results: Vec<Result<Inserted, StoreError>>, outstanding: &AtomicUsize) {
    let answered = waiters.len();
    for (waiter, result) in waiters.into_iter().zip(results) {
        let _ = waiter.send(result);
    }
    outstanding.fetch_sub(answered, Ordering::SeqCst);
}
