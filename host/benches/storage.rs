//! Storage benchmarks that need wall-clock runs rather than criterion's sampling.
//!
//! `cargo bench -p herald-host --bench storage [-- renewals|sqlite|sqlite-v4|sqlite-normal|mysql|postgres ...]`
//!
//! - `renewals`: the seq allocator against SQLite at step 1000 for 10 s, one caller in a
//!   tight loop (segments renew constantly, faster than any lease), then 10 s paced at
//!   1 M seqs/s (a renewal every ms); prints percentiles of a single call and the worst
//!   (target: worst < 1 ms — prefetch must hide renewals), how long the thread waited for
//!   a CPU around each call over 1 ms, and one lease's round trip. Each
//!   run's first seq, which must wait for the conversation's first lease, is timed apart.
//! - `sqlite` / `mysql` / `postgres`: group-committed inserts of ~200-byte messages from many
//!   concurrent writers for 10 s, with time-ordered (UUIDv7) client_msg_ids; `sqlite-v4`:
//!   the same with random UUIDv4 ids (each lands on a random index page: the worst case);
//!   `sqlite-normal`: `synchronous = normal`, durable across a process crash but not a power
//!   loss. Each message carries its conversation's owner fence, as a node's do (checked on
//!   MariaDB and PostgreSQL). Prints rows/s (targets: SQLite ≥ 100k, MariaDB and
//!   PostgreSQL ≥ 30k on a 2-core machine).
//!
//! MariaDB and PostgreSQL are the machine's local servers (or `HERALD_TEST_MYSQL_URL` /
//! `HERALD_TEST_POSTGRES_URL`); each run uses a scratch database it drops afterwards.

#![allow(clippy::print_stdout, reason = "a benchmark reports its figures on stdout")]

#[path = "../tests/scratch/mod.rs"]
mod scratch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use herald_host::config::{GroupCommitConfig, SqliteSynchronous, StorageConfig};
use herald_host::ids::{OwnerClaim, SeqAllocator, SeqConfig, SnowflakeGenerator};
use herald_host::model::{ClientMsgId, ConversationId, DeviceId, Message, NodeId, UserId};
use herald_host::store::{Backend, Database, GroupCommitter, MessageWriter, SeqLeases};
use scratch::ScratchDatabase;

const RUN: Duration = Duration::from_secs(10);
/// Sends in flight at once (a loaded node has thousands).
const WRITERS: usize = 4096;
/// Distinct senders and conversations, as with 1,000 users chatting in 500 pairs.
const SENDERS: usize = 1000;
const CONVERSATIONS: usize = 500;
/// What the benchmark's node claims its conversations with.
const CLAIM: OwnerClaim = OwnerClaim { node: NodeId(3), epoch: 1 };

fn main() {
    let selected: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wants = |name: &str| selected.is_empty() || selected.iter().any(|s| s == name);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        if wants("renewals") {
            renewals().await;
        }
        for (name, backend, sync, ids) in [
            ("sqlite", Backend::Sqlite, SqliteSynchronous::Full, ClientIds::TimeOrdered),
            ("sqlite-v4", Backend::Sqlite, SqliteSynchronous::Full, ClientIds::Random),
            ("sqlite-normal", Backend::Sqlite, SqliteSynchronous::Normal, ClientIds::TimeOrdered),
            ("mysql", Backend::MySql, SqliteSynchronous::Full, ClientIds::TimeOrdered),
            ("postgres", Backend::Postgres, SqliteSynchronous::Full, ClientIds::TimeOrdered),
        ] {
            if wants(name) {
                inserts(name, backend, sync, ids).await;
            }
        }
    });
}

/// A scratch database set up as `herald serve` sets it up, background WAL checkpoints
/// included; `close` it when done.
struct Bench {
    scratch: ScratchDatabase,
    database: Database,
    checkpoints: tokio::task::JoinHandle<()>,
}

async fn open(backend: Backend, sqlite_synchronous: SqliteSynchronous) -> Bench {
    let scratch = ScratchDatabase::create(backend, "herald_bench").await.unwrap_or_else(|error| panic!("{error}"));
    let config = StorageConfig { max_connections: 8, sqlite_synchronous, ..StorageConfig::default() };
    let database = Database::connect(&scratch.url, &config).await.expect("connect");
    database.migrate().await.expect("migrate");
    let checkpoints =
        tokio::spawn(database.clone().checkpoint_periodically(Duration::from_millis(config.sqlite_checkpoint_ms)));
    Bench { scratch, database, checkpoints }
}

impl Bench {
    async fn close(self) {
        self.checkpoints.abort();
        self.database.close().await;
        self.scratch.drop_database().await.expect("drop");
    }
}

async fn renewals() {
    let bench = open(Backend::Sqlite, SqliteSynchronous::Full).await;
    let database = bench.database.clone();
    let conversation = ConversationId::parse("room:renewals").expect("valid");
    // A caller in a tight loop (~50 ns a call: a segment of 1000 lasts ~50 µs, shorter than
    // one lease round trip, so only leasing many segments at once keeps up), then one paced
    // at 1 M seqs/s (a renewal every millisecond, still ~50x what a node sends).
    // Control: what the machine alone does to a loop that only reads the clock, while
    // another thread is busy too (as the allocator's lease thread is). On a 2-core VM the
    // kernel and hypervisor take the CPU away for milliseconds now and then; a call that
    // happens to span such a gap looks slow however little it does.
    let busy = tokio::task::spawn_blocking(|| {
        let started = Instant::now();
        let mut spins = 0u64;
        while started.elapsed() < RUN {
            spins = std::hint::black_box(spins + 1);
        }
    });
    let started = Instant::now();
    let (mut previous, mut worst, mut gaps_over_1ms) = (started, Duration::ZERO, 0u64);
    while started.elapsed() < RUN {
        let now = Instant::now();
        let gap = now - previous;
        worst = worst.max(gap);
        gaps_over_1ms += u64::from(gap > Duration::from_millis(1));
        previous = now;
    }
    busy.await.expect("busy thread");
    println!(
        "renewals: control, a loop that only reads the clock with the other core busy, {} s: worst gap {:.3} ms, {gaps_over_1ms} gaps over 1 ms",
        RUN.as_secs(),
        worst.as_secs_f64() * 1e3
    );
    for (label, per_ms) in [("tight loop", None), ("1 M seqs/s", Some(1000u64))] {
        let config = SeqConfig { min_step: 1000, max_step: 1000, ..SeqConfig::default() };
        let allocator = Arc::new(SeqAllocator::new(Arc::new(database.clone()), config));
        let conversation = ConversationId::parse(&format!("room:renewals-{}", per_ms.unwrap_or(0))).expect("valid");
        let mut latencies = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
        eprintln!("renewals ({label}): SQLite, step 1000, one caller, {} s ...", RUN.as_secs());
        // The conversation's first seq waits for its first lease (nothing to prefetch from
        // yet): timed apart, since the target is about renewals.
        let first = Instant::now();
        let mut last = allocator.next(&conversation, CLAIM).await.expect("seq").seq;
        let first = first.elapsed();
        let (waited_before, leases_before) = (allocator.foreground_leases(), allocator.leases());
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let started = Instant::now();
        let (mut calls, mut over_1ms) = (0u64, 0u64);
        // Each call over 1 ms, with how long this thread waited for a CPU in the window of
        // 1000 calls around it (read between calls, never inside a timed one).
        let mut slow = SlowCalls::of_this_thread();
        while started.elapsed() < RUN {
            calls += 1;
            if calls % 1000 == 0 {
                slow.end_window();
            }
            if per_ms.is_some_and(|per_ms| calls % per_ms == 0) {
                tick.tick().await;
            }
            let call = Instant::now();
            let seq = allocator.next(&conversation, CLAIM).await.expect("seq").seq;
            let took = call.elapsed();
            latencies.saturating_record(took.as_nanos() as u64);
            if took > Duration::from_millis(1) {
                over_1ms += 1;
                slow.push(took);
            }
            assert!(seq > last, "seqs must increase");
            last = seq;
        }
        println!(
            "renewals ({label}): first seq (first lease) {:.3} ms; then {calls} seqs in {:.1} s ({} segments of 1000 in {} leases, {} waited for), per call p50 {} ns, p99 {} ns, p99.99 {} ns, worst {:.3} ms, {over_1ms} calls over 1 ms (target: worst < 1 ms)",
            first.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64(),
            last / 1000,
            allocator.leases() - leases_before,
            allocator.foreground_leases() - waited_before,
            latencies.value_at_quantile(0.5),
            latencies.value_at_quantile(0.99),
            latencies.value_at_quantile(0.9999),
            latencies.max() as f64 / 1e6,
        );
        for (took, waited) in slow.finish() {
            let waited = waited.map_or("unknown".to_owned(), |w| format!("{:.3} ms", w.as_secs_f64() * 1e3));
            println!(
                "  a call took {:.3} ms; this thread waited for a CPU {waited} in those 1000 calls",
                took.as_secs_f64() * 1e3
            );
        }
    }
    // What a caller that outruns the prefetch waits for: one lease, start to end.
    let mut leases = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let call = Instant::now();
        database.lease(&conversation, 1000, CLAIM).await.expect("lease");
        leases.saturating_record(call.elapsed().as_micros() as u64);
    }
    println!(
        "renewals: one SQLite lease round trip: p50 {} µs, p99 {} µs, p99.9 {} µs, worst {} µs",
        leases.value_at_quantile(0.5),
        leases.value_at_quantile(0.99),
        leases.value_at_quantile(0.999),
        leases.max()
    );
    bench.close().await;
}

async fn inserts(name: &str, backend: Backend, sqlite_synchronous: SqliteSynchronous, client_ids: ClientIds) {
    let bench = open(backend, sqlite_synchronous).await;
    let database = bench.database.clone();
    let group_commit = GroupCommitConfig::default();
    let committer = GroupCommitter::start(database.clone(), &group_commit);
    let ids = Arc::new(SnowflakeGenerator::new(3).expect("node id"));
    let stop = Arc::new(AtomicBool::new(false));
    let stored = Arc::new(AtomicU64::new(0));
    let device = DeviceId::parse("bench").expect("valid");
    let body = bytes::Bytes::from(vec![b'x'; 120]); // with ids and names the row is ~200 bytes
    eprintln!(
        "{name}: {WRITERS} inserts in flight from {SENDERS} senders in {CONVERSATIONS} conversations, {client_ids:?} client_msg_ids, {} s ...",
        RUN.as_secs()
    );

    // Each message carries its conversation's fence, as the pipeline's do: on MariaDB and
    // PostgreSQL every batch checks them under a shared lock (SQLite does not check).
    let mut fences = Vec::with_capacity(CONVERSATIONS);
    for c in 0..CONVERSATIONS {
        let conversation = ConversationId::parse(&format!("grp:bench-{c}")).expect("valid");
        fences.push(database.lease(&conversation, 1, CLAIM).await.expect("lease").fence);
    }

    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (committer, ids, stop, stored, device, body) = (
                committer.clone(),
                Arc::clone(&ids),
                Arc::clone(&stop),
                Arc::clone(&stored),
                device.clone(),
                body.clone(),
            );
            let fence = fences[writer % CONVERSATIONS];
            tokio::spawn(async move {
                let sender = UserId::parse(&format!("user-{}", writer % SENDERS)).expect("valid");
                let conversation =
                    ConversationId::parse(&format!("grp:bench-{}", writer % CONVERSATIONS)).expect("valid");
                let mut n: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let message = Message {
                        id: ids.next_id(),
                        conversation: conversation.clone(),
                        // Unique per writer; a real node takes these from the allocator.
                        seq: n * WRITERS as u64 + writer as u64,
                        sender: sender.clone(),
                        sender_device: device.clone(),
                        client_msg_id: client_ids.next(),
                        kind: 1,
                        body: body.clone(),
                        sent_at_ms: 1_780_000_000_000,
                    };
                    committer.submit(message, Some(fence)).await.expect("queued").wait().await.expect("insert");
                    stored.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let mut previous = 0;
    for second in 1..=RUN.as_secs() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = stored.load(Ordering::Relaxed);
        eprintln!("  {name} {second:>2}s: {} rows/s", now - previous);
        previous = now;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("writer");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = stored.load(Ordering::Relaxed);
    let batches = committer.totals().batches.load(Ordering::Relaxed).max(1);
    println!(
        "inserts {name}: {total} rows in {elapsed:.1} s = {:.0} rows/s (group commit: {batches} batches of {:.0} rows on average, max {})",
        total as f64 / elapsed,
        committer.totals().rows.load(Ordering::Relaxed) as f64 / batches as f64,
        group_commit.max_batch
    );
    committer.close().await;
    bench.close().await;
}

/// A thread's calls over 1 ms, each with how long the thread was runnable but waiting for
/// a CPU (time the scheduler gave the core to another thread or process) in the window of
/// calls around it: slow calls are noted as they come and given their window's wait when
/// it ends.
struct SlowCalls {
    schedstat: Option<std::fs::File>,
    window_began: Option<u64>,
    in_window: Vec<Duration>,
    /// Each slow call, and how long the thread waited for a CPU in its window.
    noted: Vec<(Duration, Option<Duration>)>,
}

impl SlowCalls {
    fn of_this_thread() -> Self {
        let schedstat = std::fs::File::open("/proc/thread-self/schedstat").ok();
        let mut calls = Self { schedstat, window_began: None, in_window: Vec::new(), noted: Vec::new() };
        calls.window_began = calls.run_queue_wait();
        calls
    }

    fn push(&mut self, took: Duration) {
        self.in_window.push(took);
    }

    /// Closes the window: its slow calls get its wait, and a new one begins.
    fn end_window(&mut self) {
        let now = self.run_queue_wait();
        let waited = now.zip(self.window_began).map(|(now, began)| Duration::from_nanos(now - began));
        self.noted.extend(self.in_window.drain(..).map(|took| (took, waited)));
        self.window_began = now;
    }

    fn finish(mut self) -> Vec<(Duration, Option<Duration>)> {
        self.end_window();
        self.noted
    }

    /// The second field of Linux's `/proc/thread-self/schedstat`, in ns; `None` where the
    /// kernel does not keep it.
    fn run_queue_wait(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut text = [0u8; 128];
        let read = self.schedstat.as_ref()?.read_at(&mut text, 0).ok()?;
        std::str::from_utf8(&text[..read]).ok()?.split_whitespace().nth(1)?.parse().ok()
    }
}

/// How the benchmark's clients make their `client_msg_id`s.
#[derive(Debug, Clone, Copy)]
enum ClientIds {
    /// UUIDv7 (time first, then random): consecutive ids land together in the unique index.
    TimeOrdered,
    /// UUIDv4: every id lands on a random page of the index — the worst case.
    Random,
}

impl ClientIds {
    fn next(self) -> ClientMsgId {
        let random: u128 = rand::random();
        let bits = match self {
            ClientIds::Random => random,
            ClientIds::TimeOrdered => {
                let ms =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
                (ms << 80) | (random & ((1 << 80) - 1))
            }
        };
        let hex = format!("{bits:032x}");
        let version = match self {
            ClientIds::Random => '4',
            ClientIds::TimeOrdered => '7',
        };
        let text =
            format!("{}-{}-{version}{}-a{}-{}", &hex[0..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32]);
        ClientMsgId::parse(&text).expect("uuid")
    }
}
