//! The segment seq allocator against real `session_seq` tables: several allocators (as if
//! several nodes) sharing one database never hand out the same seq, each hands out strictly
//! increasing seqs per conversation, and a dropped allocator's unused seqs are never reissued.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use herald_host::ids::{OwnerClaim, SeqAllocator, SeqConfig};
use herald_host::model::{ConversationId, NodeId};
use herald_host::store::Backend;

use crate::on_every_backend;
use crate::support::TestDb;

on_every_backend!(four_nodes_eight_tasks_twenty_conversations, dropped_allocator_never_reissues);

const NODES: usize = 4;
const TASKS: usize = 8;
const CONVERSATIONS: usize = 20;
const SEQS_PER_TASK: usize = 150;

/// Every allocator claims as one node: these tests are about seqs, not owners (see
/// `fencing.rs`), and pools standing in for nodes share the conversations here.
const CLAIM: OwnerClaim = OwnerClaim { node: NodeId(1), epoch: 1 };

fn conversation(i: usize) -> ConversationId {
    ConversationId::parse(&format!("grp:c{i}")).expect("valid conversation")
}

/// Small steps, so segments run out and renew (in the background and in the foreground)
/// many times during the test.
fn small_steps() -> SeqConfig {
    SeqConfig { min_step: 4, max_step: 64, ..SeqConfig::default() }
}

async fn four_nodes_eight_tasks_twenty_conversations(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.database.migrate().await.expect("migrate");
    let mut nodes = Vec::new();
    for _ in 0..NODES {
        nodes.push(Arc::new(SeqAllocator::new(Arc::new(db.another_node().await), small_steps())));
    }

    let mut tasks = Vec::new();
    for (node, allocator) in nodes.iter().enumerate() {
        for task in 0..TASKS {
            let allocator = Arc::clone(allocator);
            tasks.push(tokio::spawn(async move {
                // Each task walks the conversations in its own order.
                let mut got: Vec<(usize, u64)> = Vec::with_capacity(SEQS_PER_TASK);
                for i in 0..SEQS_PER_TASK {
                    let c = (i * (task + 3) + node * 7) % CONVERSATIONS;
                    got.push((c, allocator.next(&conversation(c), CLAIM).await.expect("seq").seq));
                }
                (node, got)
            }));
        }
    }

    let mut everything: HashSet<(usize, u64)> = HashSet::new();
    let mut per_node: HashMap<(usize, usize), Vec<u64>> = HashMap::new();
    for task in tasks {
        let (node, got) = task.await.expect("task finished");
        let mut last_in_task: HashMap<usize, u64> = HashMap::new();
        for (c, seq) in got {
            assert!(everything.insert((c, seq)), "seq {seq} of conversation {c} was handed out twice");
            // One task's calls are sequential, so they must see increasing seqs.
            if let Some(previous) = last_in_task.insert(c, seq) {
                assert!(seq > previous, "node {node}: conversation {c} went from {previous} to {seq}");
            }
            per_node.entry((node, c)).or_default().push(seq);
        }
    }
    assert_eq!(everything.len(), NODES * TASKS * SEQS_PER_TASK);

    // Calls serialised through one lock per conversation observe each node's true issue
    // order: it must be strictly increasing.
    for allocator in &nodes {
        let mut last = HashMap::new();
        for round in 0..200 {
            let c = round % CONVERSATIONS;
            let seq = allocator.next(&conversation(c), CLAIM).await.expect("seq").seq;
            if let Some(previous) = last.insert(c, seq) {
                assert!(seq > previous);
            }
            assert!(everything.insert((c, seq)), "reissued {seq} in conversation {c}");
        }
    }
    drop(nodes);
    db.drop_database().await;
}

async fn dropped_allocator_never_reissues(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.database.migrate().await.expect("migrate");
    let room = conversation(0);
    let config = SeqConfig { min_step: 100, max_step: 100, ..SeqConfig::default() };

    let mut issued = HashSet::new();
    let mut highest = 0;
    for _crash in 0..3 {
        let allocator = Arc::new(SeqAllocator::new(Arc::new(db.another_node().await), config.clone()));
        // Use a few seqs of the segment, then "crash" mid-segment.
        for _ in 0..7 {
            let seq = allocator.next(&room, CLAIM).await.expect("seq").seq;
            assert!(issued.insert(seq), "seq {seq} reissued after a crash");
            assert!(seq > highest, "seq {seq} not above {highest} from before the crash");
            highest = seq;
        }
        drop(allocator);
    }
    // Gaps are allowed (a crash wastes its segment), reissue is not.
    assert!(highest > 7 * 3, "each restart starts from a fresh segment, got {highest}");
    db.drop_database().await;
}
