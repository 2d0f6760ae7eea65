//! Hot-path cost of the two id allocators.
//!
//! `cargo bench -p herald-host --bench ids`
//! - snowflake: ids per second on one thread (target ≥ 4.0 M/s; the format's ceiling is
//!   4.096 M/s, so the mean per id must be ≤ 250 ns including the waits at millisecond ends);
//! - seq hot path: a seq from a segment already in memory (target ≤ 50 ns), against a real
//!   SQLite `session_seq` table with a step so large that renewals are negligible;
//! - machine: one atomic read-modify-write and one clock read, the primitives the two are
//!   made of, so figures from different (virtual) machines can be compared.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use herald_host::config::StorageConfig;
use herald_host::ids::{OwnerClaim, SeqAllocator, SeqConfig, SnowflakeGenerator};
use herald_host::model::{ConversationId, NodeId};
use herald_host::store::Database;

fn snowflake(c: &mut Criterion) {
    let generator = SnowflakeGenerator::new(1).expect("node id in range");
    let mut group = c.benchmark_group("snowflake");
    group.throughput(Throughput::Elements(1));
    group.bench_function("next_id", |b| b.iter(|| black_box(generator.next_id())));
    group.finish();
}

/// The claim of the one node of embedded mode, as its pipeline makes it.
const CLAIM: OwnerClaim = OwnerClaim { node: NodeId(0), epoch: 1 };

fn seq_hot_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let allocator = runtime.block_on(async {
        let database = Database::connect(&url, &StorageConfig::default()).await.expect("open sqlite");
        database.migrate().await.expect("migrate");
        let config = SeqConfig { min_step: 1_000_000, max_step: 1_000_000, ..SeqConfig::default() };
        Arc::new(SeqAllocator::new(Arc::new(database), config))
    });
    // A few conversations in the map, as on a real node.
    let conversations: Vec<ConversationId> =
        (0..64).map(|i| ConversationId::parse(&format!("grp:bench-{i}")).expect("valid")).collect();
    runtime.block_on(async {
        for conversation in &conversations {
            allocator.next(conversation, CLAIM).await.expect("first lease");
        }
    });
    let hot = conversations[17].clone();
    let mut group = c.benchmark_group("seq");
    group.throughput(Throughput::Elements(1));
    // Borrowed, not cloned, per call: a caller holds its allocator and conversation id.
    let (allocator, hot) = (&allocator, &hot);
    group.bench_function("next_in_memory", |b| {
        b.to_async(&runtime).iter(|| async move { black_box(allocator.next(hot, CLAIM).await.expect("seq")) });
    });
    group.finish();
}

/// What this machine's primitives cost, to compare figures taken on different machines:
/// the two allocators are made of atomic read-modify-writes and clock reads.
fn machine(c: &mut Criterion) {
    let mut group = c.benchmark_group("machine");
    let counter = std::sync::atomic::AtomicU64::new(0);
    group.bench_function("atomic_fetch_add", |b| {
        b.iter(|| black_box(&counter).fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    });
    group.bench_function("clock_read", |b| b.iter(std::time::Instant::now));
    group.finish();
}

criterion_group!(benches, machine, snowflake, seq_hot_path);
criterion_main!(benches);
