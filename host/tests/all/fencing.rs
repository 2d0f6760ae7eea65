//! Owner fencing of seq leases and commits (cluster mode), against real
//! `session_seq` tables: two pools on one database play two nodes.
//!
//! A lease succeeds for the node the row names, or at a newer ring epoch than the row's;
//! it hands back the row's fence, and a commit on MariaDB or PostgreSQL stores a message only
//! while its fence is still the row's. The commit's shared lock on the row makes a new
//! owner's lease wait for a stale owner's commit under way, so nothing of the stale owner's
//! lands after the new owner's lease. SQLite (embedded mode, one node) applies the lease
//! rule but does not check commits.

use std::sync::Arc;
use std::time::Duration;

use herald_host::config::{GroupCommitConfig, SeqConfig};
use herald_host::ids::SeqAllocator;
use herald_host::model::{ClientMsgId, ConversationId, DeviceId, Message, NodeId, UserId};
use herald_host::store::{
    Backend, Database, Fence, GroupCommitter, Inserted, LeaseError, MessageStore, MessageWriter, OwnerClaim, Pool,
    SeqLeases, StoreError, Submission,
};

use crate::on_every_backend;
use crate::support::TestDb;
use crate::support::poll::poll;

on_every_backend!(
    a_newer_epoch_takes_over_above_the_old_range_and_fences_the_old_owner,
    the_old_owner_takes_it_back_at_a_later_epoch_and_fences_the_interim_one,
    the_same_node_at_a_newer_epoch_keeps_its_fence_so_its_messages_in_flight_commit,
    allocators_of_two_nodes_hand_a_conversation_over,
    the_highest_owner_epoch_is_read_from_every_row,
);

/// The scenarios only the server backends can run: commits checked under a shared lock.
mod servers {
    macro_rules! on_server_backends {
        ($($scenario:ident),* $(,)?) => {
            mod mysql {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() { super::super::$scenario(herald_host::store::Backend::MySql).await }
                )*
            }
            mod postgres {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() { super::super::$scenario(herald_host::store::Backend::Postgres).await }
                )*
            }
        };
    }
    on_server_backends!(
        a_takeover_lease_waits_for_a_stale_owners_commit_under_way,
        nothing_of_a_stale_owner_lands_after_a_racing_takeover,
        a_batch_stores_its_current_messages_and_refuses_only_the_fenced_ones,
        the_row_by_row_fallback_keeps_the_fence_check,
    );
}

const CONVERSATION: &str = "grp:fenced";
const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);

fn conversation() -> ConversationId {
    ConversationId::parse(CONVERSATION).expect("valid conversation")
}

fn claim(node: NodeId, epoch: u64) -> OwnerClaim {
    OwnerClaim { node, epoch }
}

/// Message `n` (id `n`, its own client_msg_id) of `conversation` at `seq`.
fn message(n: u64, conversation: &str, seq: u64) -> Message {
    Message {
        id: n,
        conversation: ConversationId::parse(conversation).expect("valid conversation"),
        seq,
        sender: UserId::parse("sam").expect("valid user"),
        sender_device: DeviceId::parse("phone").expect("valid device"),
        client_msg_id: ClientMsgId::parse(&format!("00000000-0000-4000-8000-{n:012x}")).expect("valid uuid"),
        kind: 1,
        body: format!("message {n}").into_bytes().into(),
        sent_at_ms: 1_780_000_000_000 + n,
    }
}

/// Commits message `n` at `seq` under `fence`, alone.
async fn commit(database: &Database, n: u64, seq: u64, fence: Fence) -> Result<Inserted, StoreError> {
    let submission = Submission { message: message(n, CONVERSATION, seq), fence: Some(fence) };
    database.insert_submissions(&[submission]).await.pop().expect("one outcome per message")
}

/// The seqs stored in `conversation`, ascending.
async fn stored_seqs(database: &Database, conversation: &str) -> Vec<u64> {
    let conversation = ConversationId::parse(conversation).expect("valid conversation");
    let stored = database.messages_after(&conversation, 0, 10_000).await.expect("read");
    stored.iter().map(|m| m.seq).collect()
}

/// Asserts `outcome` is the refusal of a commit under `fence` while `owner` owns it.
#[track_caller]
fn assert_fenced(outcome: &Result<Inserted, StoreError>, fence: Fence, owner: Fence) {
    match outcome {
        Err(StoreError::Fenced { fence: refused, owner: found, .. }) => {
            assert_eq!((*refused, *found), (fence, Some(owner)));
        }
        other => panic!("a commit under {fence:?} while {owner:?} owns the conversation was not fenced: {other:?}"),
    }
}

/// Asserts `leased` is a refusal naming `owner`.
#[track_caller]
fn assert_superseded<T: std::fmt::Debug>(leased: &Result<T, LeaseError>, owner: Fence) {
    match leased {
        Err(LeaseError::Superseded { conversation: refused, node, epoch }) => {
            assert_eq!((refused, *node, *epoch), (&conversation(), owner.node, owner.epoch));
        }
        other => panic!("a lease was not refused while {owner:?} owns the conversation: {other:?}"),
    }
}

async fn migrated(backend: Backend) -> (TestDb, Database) {
    let db = TestDb::new(backend).await;
    db.database.migrate().await.expect("migrate");
    let other = db.another_node().await;
    (db, other)
}

/// (a) Node A leases at epoch 1, node B at epoch 2: B's range is above A's, A's lease at
/// epoch 1 is refused, A's commit under its old fence is refused and not stored, B's stored.
async fn a_newer_epoch_takes_over_above_the_old_range_and_fences_the_old_owner(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let node_a = &db.database;
    let a = node_a.lease(&conversation(), 10, claim(A, 1)).await.expect("A leases first");
    assert_eq!(a.fence, Fence { node: A, epoch: 1 });
    let b = node_b.lease(&conversation(), 10, claim(B, 2)).await.expect("B takes over at a newer epoch");
    assert_eq!(b.fence, Fence { node: B, epoch: 2 });
    assert!(b.range.first > a.range.last, "B's range {:?} is above A's {:?}", b.range, a.range);

    assert_superseded(&node_a.lease(&conversation(), 10, claim(A, 1)).await, b.fence);
    assert_superseded(&node_a.lease(&conversation(), 10, claim(A, 2)).await, b.fence);
    let refused_leases_took_nothing = node_b.lease(&conversation(), 1, claim(B, 2)).await.expect("B leases on");
    assert_eq!(refused_leases_took_nothing.range.first, b.range.last + 1);

    let stale = commit(node_a, 1, a.range.first, a.fence).await;
    let current = commit(&node_b, 2, b.range.first, b.fence).await;
    assert_eq!(current.expect("B's commit"), Inserted::New { id: 2, seq: b.range.first });
    if backend == Backend::Sqlite {
        // Embedded mode is one node: nothing to fence against, nothing checked.
        assert_eq!(stale.expect("stored unchecked"), Inserted::New { id: 1, seq: a.range.first });
    } else {
        assert_fenced(&stale, a.fence, b.fence);
        let error = stale.expect_err("fenced").to_string();
        assert!(error.contains("node 1 at ring epoch 1") && error.contains("node 2 (since ring epoch 2)"), "{error}");
        assert_eq!(stored_seqs(node_a, CONVERSATION).await, vec![b.range.first], "only B's message is stored");
    }
    node_b.close().await;
    db.drop_database().await;
}

/// The highest owner epoch of `session_seq` (where a cluster counts epochs from after its
/// Redis lost them): 0 with no row, then the highest any row names, whichever node holds it.
async fn the_highest_owner_epoch_is_read_from_every_row(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    assert_eq!(db.database.highest_owner_epoch().await.expect("read"), 0, "no row yet");
    let other = ConversationId::parse("grp:other").expect("valid conversation");
    db.database.lease(&conversation(), 10, claim(A, 3)).await.expect("A leases at epoch 3");
    node_b.lease(&other, 10, claim(B, 7)).await.expect("B leases another at epoch 7");
    db.database.lease(&conversation(), 10, claim(A, 5)).await.expect("A leases on at epoch 5");
    assert_eq!(db.database.highest_owner_epoch().await.expect("read"), 7);
    node_b.close().await;
    db.drop_database().await;
}

/// (b) A takes the conversation back at epoch 3: its range is above B's, and B's fence, the
/// current one a moment ago, now fails.
async fn the_old_owner_takes_it_back_at_a_later_epoch_and_fences_the_interim_one(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let node_a = &db.database;
    node_a.lease(&conversation(), 10, claim(A, 1)).await.expect("A leases first");
    let b = node_b.lease(&conversation(), 10, claim(B, 2)).await.expect("B takes over");
    let back = node_a.lease(&conversation(), 10, claim(A, 3)).await.expect("A takes it back at epoch 3");
    assert_eq!(back.fence, Fence { node: A, epoch: 3 });
    assert!(back.range.first > b.range.last);
    assert_superseded(&node_b.lease(&conversation(), 10, claim(B, 2)).await, back.fence);

    let stale = commit(&node_b, 1, b.range.first, b.fence).await;
    let current = commit(node_a, 2, back.range.first, back.fence).await;
    assert_eq!(current.expect("A's commit"), Inserted::New { id: 2, seq: back.range.first });
    if backend != Backend::Sqlite {
        assert_fenced(&stale, b.fence, back.fence);
        assert_eq!(stored_seqs(node_a, CONVERSATION).await, vec![back.range.first]);
    }
    node_b.close().await;
    db.drop_database().await;
}

/// (c) The owner re-leasing after a ring change that left it the owner keeps its fence: what
/// it has in flight under the first lease still commits.
async fn the_same_node_at_a_newer_epoch_keeps_its_fence_so_its_messages_in_flight_commit(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let node_a = &db.database;
    let first = node_a.lease(&conversation(), 10, claim(A, 1)).await.expect("A leases at epoch 1");
    let again = node_a.lease(&conversation(), 10, claim(A, 5)).await.expect("A re-leases at epoch 5");
    assert_eq!(again.fence, first.fence, "the fence is kept across the owner's own ring changes");
    assert_eq!(again.range.first, first.range.last + 1);
    // Even a claim at an older epoch of the same node leases (its own row).
    let older = node_a.lease(&conversation(), 10, claim(A, 1)).await.expect("A at epoch 1 again");
    assert_eq!(older.fence, first.fence);

    let in_flight = commit(node_a, 1, first.range.first, first.fence).await;
    let later = commit(node_a, 2, again.range.first, again.fence).await;
    assert_eq!(in_flight.expect("in flight commits"), Inserted::New { id: 1, seq: first.range.first });
    assert_eq!(later.expect("later commits"), Inserted::New { id: 2, seq: again.range.first });
    assert_eq!(stored_seqs(node_a, CONVERSATION).await, vec![first.range.first, again.range.first]);
    node_b.close().await;
    db.drop_database().await;
}

/// The allocators and group committers of two nodes: A's held segments cannot commit once B
/// took over, and A, having forgotten them, is refused a lease at its old epoch.
async fn allocators_of_two_nodes_hand_a_conversation_over(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let config = SeqConfig { min_step: 10, max_step: 10, ..SeqConfig::default() };
    let allocator_a = Arc::new(SeqAllocator::new(Arc::new(db.database.clone()), config.clone()));
    let allocator_b = Arc::new(SeqAllocator::new(Arc::new(node_b.clone()), config));
    let committer_a = GroupCommitter::start(db.database.clone(), &GroupCommitConfig::default());
    let committer_b = GroupCommitter::start(node_b.clone(), &GroupCommitConfig::default());
    let submit = |committer: &GroupCommitter, n: u64, seq: u64, fence: Fence| {
        let committer = committer.clone();
        async move { committer.submit(message(n, CONVERSATION, seq), Some(fence)).await.expect("queued").wait().await }
    };

    let a1 = allocator_a.next(&conversation(), claim(A, 1)).await.expect("A's first seq");
    assert_eq!(submit(&committer_a, 1, a1.seq, a1.fence).await.expect("stored"), Inserted::New { id: 1, seq: a1.seq });
    let b1 = allocator_b.next(&conversation(), claim(B, 2)).await.expect("B takes over");
    assert_eq!(b1.fence, Fence { node: B, epoch: 2 });
    let a2 = allocator_a.next(&conversation(), claim(A, 1)).await.expect("A still holds segments");
    assert!(b1.seq > a2.seq, "B's seqs are above every seq A holds: {b1:?} vs {a2:?}");
    assert_eq!(a2.fence, a1.fence);
    let stale = submit(&committer_a, 2, a2.seq, a2.fence).await;
    assert_eq!(submit(&committer_b, 3, b1.seq, b1.fence).await.expect("stored"), Inserted::New { id: 3, seq: b1.seq });
    if backend != Backend::Sqlite {
        assert_fenced(&stale, a1.fence, b1.fence);
        assert_eq!(stored_seqs(&db.database, CONVERSATION).await, vec![a1.seq, b1.seq]);
        // As the pipeline does on a fenced commit: forget, and lease afresh — refused.
        allocator_a.forget(&conversation());
        assert_superseded(&allocator_a.next(&conversation(), claim(A, 1)).await, b1.fence);
    }
    committer_a.close().await;
    committer_b.close().await;
    node_b.close().await;
    db.drop_database().await;
}

/// Transactions of this test's database waiting for a lock.
async fn lock_waits(database: &Database) -> i64 {
    match &database.reader {
        Pool::Postgres(pool) => sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .expect("read pg_stat_activity"),
        Pool::MySql(pool) => sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p \
             ON p.id = t.trx_mysql_thread_id WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()",
        )
        .fetch_one(pool)
        .await
        .expect("read innodb_trx"),
        Pool::Sqlite(_) => unreachable!("SQLite does not check commits"),
    }
}

/// Waits until `count` transactions of the database wait for a lock. Polled no faster than
/// every 100 ms: MariaDB serves `innodb_trx` from a cache it refreshes only when it was not
/// read for that long.
async fn until_lock_waits(database: &Database, count: i64) {
    let what = format!("{count} transactions to wait for a lock");
    poll()
        .within(Duration::from_secs(9))
        .every(Duration::from_millis(150))
        .until(&what, async || match lock_waits(database).await {
            waiting if waiting >= count => Ok(()),
            waiting => Err(format!("{waiting} waiting")),
        })
        .await;
}

/// A row of `messages` at (grp:fenced, 1), inserted by a transaction left open: an insert of
/// the same (conversation, seq) waits until it ends.
const BLOCKING_ROW: &str = "INSERT INTO messages (id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms) \
     VALUES (999, 'grp:fenced', 1, 'blocker', 'phone', '00000000-0000-4000-8000-0000000003e7', 0, 'x', 0)";

/// An open transaction on either server backend.
enum Open {
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl Open {
    async fn holding_the_blocking_row(database: &Database) -> Self {
        match &database.writer {
            Pool::MySql(pool) => {
                let mut transaction = pool.begin().await.expect("begin");
                sqlx::query(BLOCKING_ROW).execute(&mut *transaction).await.expect("insert");
                Self::MySql(transaction)
            }
            Pool::Postgres(pool) => {
                let mut transaction = pool.begin().await.expect("begin");
                sqlx::query(BLOCKING_ROW).execute(&mut *transaction).await.expect("insert");
                Self::Postgres(transaction)
            }
            Pool::Sqlite(_) => unreachable!("SQLite does not check commits"),
        }
    }

    async fn rollback(self) {
        match self {
            Self::MySql(transaction) => transaction.rollback().await.expect("rollback"),
            Self::Postgres(transaction) => transaction.rollback().await.expect("rollback"),
        }
    }
}

/// (d) A's commit has checked its fence under the shared lock when B leases: B's lease waits
/// until that commit is done, so A's message is stored, below B's range, before B's lease
/// returns. A commit A begins after B's lease is refused.
async fn a_takeover_lease_waits_for_a_stale_owners_commit_under_way(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let node_a = db.database.clone();
    let a = node_a.lease(&conversation(), 10, claim(A, 1)).await.expect("A leases");
    assert_eq!(a.range.first, 1, "the blocking row takes A's first seq");

    // A's commit takes the shared lock, then waits on a row another transaction holds.
    let blocking = db.another_node().await;
    let blocker = Open::holding_the_blocking_row(&blocking).await;
    let committing = tokio::spawn({
        let node_a = node_a.clone();
        async move { commit(&node_a, 1, 1, a.fence).await }
    });
    until_lock_waits(&node_a, 1).await;

    // B's lease must wait for A's commit to end.
    let leasing = tokio::spawn({
        let node_b = node_b.clone();
        async move { node_b.lease(&conversation(), 10, claim(B, 2)).await }
    });
    until_lock_waits(&node_a, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!leasing.is_finished(), "B's lease went ahead of A's commit under way");
    assert!(!committing.is_finished());

    blocker.rollback().await;
    let b = leasing.await.expect("lease task").expect("B takes over once A's commit is done");
    let stored_when_b_leased = stored_seqs(&node_a, CONVERSATION).await;
    let a_outcome = committing.await.expect("commit task");
    assert_eq!(a_outcome.expect("A's commit under way is stored"), Inserted::New { id: 1, seq: 1 });
    assert_eq!(stored_when_b_leased, vec![1], "A's message was stored before B's lease returned");
    assert!(b.range.first > a.range.last);

    // Any commit A begins now is refused.
    assert_fenced(&commit(&node_a, 2, 2, a.fence).await, a.fence, b.fence);
    assert_eq!(stored_seqs(&node_a, CONVERSATION).await, vec![1]);
    blocking.close().await;
    node_b.close().await;
    db.drop_database().await;
}

/// (d) A's committers keep committing under A's fence while B takes over: whatever of A's is
/// stored is stored by the time B's lease returns; nothing of A's lands after.
async fn nothing_of_a_stale_owner_lands_after_a_racing_takeover(backend: Backend) {
    const TASKS: u64 = 8;
    const PER_TASK: u64 = 120;
    let (db, node_b) = migrated(backend).await;
    let node_a = db.database.clone();
    let a = node_a.lease(&conversation(), TASKS * PER_TASK, claim(A, 1)).await.expect("A leases");
    let committer = GroupCommitter::start(node_a.clone(), &GroupCommitConfig::default());
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let committer = committer.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for i in 0..PER_TASK {
                    let n = task * PER_TASK + i;
                    let seq = a.range.first + n;
                    let ticket = committer.submit(message(n + 1, CONVERSATION, seq), Some(a.fence)).await;
                    outcomes.push((seq, ticket.expect("queued").wait().await));
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
                outcomes
            })
        })
        .collect();

    // B takes over once A's commits are under way: some stored, most still to come.
    poll()
        .every(Duration::from_millis(5))
        .until("A's first commit", async || !stored_seqs(&node_b, CONVERSATION).await.is_empty())
        .await;
    let b = node_b.lease(&conversation(), 10, claim(B, 2)).await.expect("B takes over");
    let stored_when_b_leased = stored_seqs(&node_b, CONVERSATION).await;

    let mut stored_by_a = Vec::new();
    let mut fenced = 0;
    for task in tasks {
        for (seq, outcome) in task.await.expect("task") {
            match outcome {
                Ok(Inserted::New { seq: stored, .. }) => {
                    assert_eq!(stored, seq);
                    stored_by_a.push(seq);
                }
                Err(StoreError::Fenced { fence, owner, .. }) => {
                    assert_eq!((fence, owner), (a.fence, Some(b.fence)));
                    fenced += 1;
                }
                other => panic!("seq {seq}: {other:?}"),
            }
        }
    }
    stored_by_a.sort_unstable();
    assert_eq!(stored_by_a, stored_when_b_leased, "every message of A's that is stored was stored before B's lease");
    assert_eq!(stored_seqs(&node_b, CONVERSATION).await, stored_when_b_leased, "and none after");
    assert!(stored_by_a.iter().all(|&seq| seq < b.range.first));
    assert!(fenced > 0, "the takeover came before A was done");
    eprintln!("{backend:?}: {} of A's messages stored before B's lease, {fenced} fenced after", stored_by_a.len());
    committer.close().await;
    node_b.close().await;
    db.drop_database().await;
}

/// One batch holding A's stale messages, B's current ones and unfenced ones: only the stale
/// ones are refused.
async fn a_batch_stores_its_current_messages_and_refuses_only_the_fenced_ones(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let a = db.database.lease(&conversation(), 10, claim(A, 1)).await.expect("A leases");
    let b = node_b.lease(&conversation(), 10, claim(B, 2)).await.expect("B takes over");
    let other = db.database.lease(&ConversationId::parse("dm:x:y").expect("valid"), 10, claim(A, 1)).await;
    let other = other.expect("A leases another conversation");
    let batch = [
        Submission { message: message(1, CONVERSATION, b.range.first), fence: Some(b.fence) },
        Submission { message: message(2, CONVERSATION, a.range.first), fence: Some(a.fence) },
        Submission { message: message(3, "dm:x:y", other.range.first), fence: Some(other.fence) },
        Submission { message: message(4, "room:free", 1), fence: None },
        Submission { message: message(5, CONVERSATION, a.range.first + 1), fence: Some(a.fence) },
    ];
    let results = db.database.insert_submissions(&batch).await;
    assert_eq!(results[0].as_ref().expect("B's"), &Inserted::New { id: 1, seq: b.range.first });
    assert_fenced(&results[1], a.fence, b.fence);
    assert_eq!(results[2].as_ref().expect("current fence"), &Inserted::New { id: 3, seq: other.range.first });
    assert_eq!(results[3].as_ref().expect("unfenced"), &Inserted::New { id: 4, seq: 1 });
    assert_fenced(&results[4], a.fence, b.fence);
    assert_eq!(stored_seqs(&db.database, CONVERSATION).await, vec![b.range.first]);
    node_b.close().await;
    db.drop_database().await;
}

/// A batch that fails as a whole is retried row by row, each row checked against its fence.
async fn the_row_by_row_fallback_keeps_the_fence_check(backend: Backend) {
    let (db, node_b) = migrated(backend).await;
    let a = db.database.lease(&conversation(), 10, claim(A, 1)).await.expect("A leases");
    let b = node_b.lease(&conversation(), 10, claim(B, 2)).await.expect("B takes over");
    // A row no statement may store, so the batch's statement fails as a whole.
    let bad_seq = b.range.first + 1;
    let constraint = format!("ALTER TABLE messages ADD CONSTRAINT no_bad_seq CHECK (seq <> {bad_seq})");
    match &db.database.writer {
        Pool::MySql(pool) => sqlx::raw_sql(sqlx::AssertSqlSafe(constraint)).execute(pool).await.map(drop),
        Pool::Postgres(pool) => sqlx::raw_sql(sqlx::AssertSqlSafe(constraint)).execute(pool).await.map(drop),
        Pool::Sqlite(_) => unreachable!("SQLite does not check commits"),
    }
    .expect("add the constraint");
    let batch = [
        Submission { message: message(1, CONVERSATION, b.range.first), fence: Some(b.fence) },
        Submission { message: message(2, CONVERSATION, bad_seq), fence: Some(b.fence) },
        Submission { message: message(3, CONVERSATION, a.range.first), fence: Some(a.fence) },
        Submission { message: message(4, "room:free", 1), fence: None },
    ];
    let results = db.database.insert_submissions(&batch).await;
    assert_eq!(results[0].as_ref().expect("stored"), &Inserted::New { id: 1, seq: b.range.first });
    assert!(matches!(results[1], Err(StoreError::Database(_))), "{:?}", results[1]);
    assert_fenced(&results[2], a.fence, b.fence);
    assert_eq!(results[3].as_ref().expect("stored"), &Inserted::New { id: 4, seq: 1 });
    assert_eq!(stored_seqs(&db.database, CONVERSATION).await, vec![b.range.first]);
    node_b.close().await;
    db.drop_database().await;
}
