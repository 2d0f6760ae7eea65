//! The consistent-hash ring of cluster mode (`host/src/routing/ring.rs`).
//!
//! `cargo bench -p herald-host --bench ring` (or `scripts/ring-bench.sh`)
//! - lookup: the owner of one conversation id (`dm:alice:bob`) on a 3-node and a 10-node
//!   ring with [`DEFAULT_VIRTUAL_NODES`] points per node (target ≤ 100 ns), and the same
//!   over 1,024 distinct ids taken in turn, so the binary search's branches cannot be
//!   learnt from one key; `crc32` alone is the hashing part of a lookup;
//! - moved keys (printed, not timed): of 100,000 conversation ids, how many change owner
//!   when a 4th node joins a 3-node ring, against the ideal 1/4 (target ≤ 1.1 × 1/4). The
//!   same property is a unit test of `ring.rs`.

#![allow(clippy::print_stdout, reason = "a benchmark reports its figures on stdout")]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use herald_host::routing::ring::{DEFAULT_VIRTUAL_NODES, Ring};

/// The conversation id of the target.
const KEY: &str = "dm:alice:bob";
/// Keys counted when a node joins.
const MOVED_KEYS: usize = 100_000;

/// `count` direct-conversation ids between distinct users, as a node routes them.
fn conversation_ids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("dm:user-{:06}:user-{:06}", 2 * i, 2 * i + 1)).collect()
}

fn lookup(c: &mut Criterion) {
    let varied = conversation_ids(1024);
    let mut group = c.benchmark_group("ring");
    group.throughput(Throughput::Elements(1));
    group.bench_function("crc32/dm:alice:bob", |b| b.iter(|| crc32fast::hash(black_box(KEY).as_bytes())));
    for nodes in [3u32, 10] {
        let members: Vec<u32> = (1..=nodes).collect();
        let ring = Ring::new(&members, DEFAULT_VIRTUAL_NODES);
        group.bench_function(format!("owner/{nodes}_nodes/dm:alice:bob"), |b| b.iter(|| ring.owner(black_box(KEY))));
        let mut next = 0usize;
        group.bench_function(format!("owner/{nodes}_nodes/1024_keys"), |b| {
            b.iter(|| {
                next = (next + 1) & 1023;
                ring.owner(black_box(&varied[next]))
            });
        });
    }
    group.finish();
}

/// Prints how many of [`MOVED_KEYS`] conversation ids change owner when node 4 joins
/// nodes 1–3; a consistent-hash ring should move about a quarter (only those the new node
/// takes), never more than 1.1 × 1/4.
fn moved_keys(_: &mut Criterion) {
    let keys = conversation_ids(MOVED_KEYS);
    let ideal = 0.25;
    for (before, after) in [(vec![1, 2, 3], vec![1, 2, 3, 4]), (vec![0, 1, 2], vec![0, 1, 2, 3])] {
        let three = Ring::new(&before, DEFAULT_VIRTUAL_NODES);
        let four = Ring::new(&after, DEFAULT_VIRTUAL_NODES);
        let joined = after[3];
        let mut moved = 0usize;
        let mut moved_elsewhere = 0usize;
        for key in &keys {
            let (old, new) = (three.owner(key), four.owner(key));
            if old != new {
                moved += 1;
                if new != Some(joined) {
                    moved_elsewhere += 1;
                }
            }
        }
        let share = moved as f64 / MOVED_KEYS as f64;
        println!(
            "ring/moved_keys: node {joined} joins nodes {before:?} ({DEFAULT_VIRTUAL_NODES} points each): \
             {moved} of {MOVED_KEYS} keys moved = {share:.4} (ideal {ideal:.4}, {ratio:.3} x ideal, \
             target <= 1.1 x); {moved_elsewhere} moved to a node other than the new one",
            ratio = share / ideal,
        );
    }
}

criterion_group!(benches, moved_keys, lookup);
criterion_main!(benches);
