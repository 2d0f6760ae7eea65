//! Storage on every backend: migrations, message inserts (dedup, conflicts, group commit),
//! reads by seq, cursors, groups, and what a read does with a stored id that is not valid.

use herald_host::config::GroupCommitConfig;
use herald_host::model::NodeId;
use herald_host::model::{ClientMsgId, ConversationId, DeviceId, GroupId, Message, UserId};
use herald_host::store::plugin_registry::NodeReport;
use herald_host::store::{
    Backend, ConversationStore, CursorStore, CursorUpdate, Database, GroupCommitter, GroupStore, Inserted,
    MessageStore, MessageWriter, PluginRegistryStore, Pool, SeqSpan, StoreError,
};

use crate::on_every_backend;
use crate::support::TestDb;

on_every_backend!(
    migrations_apply_on_empty_database_and_again_as_noop,
    a_database_that_applied_a_migration_since_reworded_still_opens,
    second_insert_of_same_client_msg_id_returns_original_ids,
    concurrent_duplicates_through_group_commit_store_one_row,
    closing_the_group_committer_answers_every_queued_insert,
    seq_conflict_fails_only_its_own_row,
    messages_read_back_in_seq_order,
    what_changed_from_an_id_on,
    cursors_only_move_forward,
    groups_and_members,
    direct_conversations_of_a_user,
    invalid_stored_ids_are_skipped_in_lists_and_reported_in_messages,
    nodes_writing_their_plugin_reports_at_once_all_succeed_and_the_last_stays,
);

fn client_msg_id(n: u32) -> ClientMsgId {
    ClientMsgId::parse(&format!("00000000-0000-4000-8000-{n:012x}")).expect("valid uuid")
}

fn conversation(name: &str) -> ConversationId {
    ConversationId::parse(name).expect("valid conversation")
}

fn message(id: u64, conversation: &str, seq: u64, sender: &str, n: u32) -> Message {
    Message {
        id,
        conversation: ConversationId::parse(conversation).expect("valid conversation"),
        seq,
        sender: UserId::parse(sender).expect("valid user"),
        sender_device: DeviceId::parse("phone").expect("valid device"),
        client_msg_id: client_msg_id(n),
        kind: 7,
        body: format!("body {n} \u{1F600}").into_bytes().into(),
        sent_at_ms: 1_780_000_000_000 + u64::from(n),
    }
}

async fn migrated(backend: Backend) -> TestDb {
    let db = TestDb::new(backend).await;
    db.database.migrate().await.expect("migrations apply");
    db
}

async fn migrations_apply_on_empty_database_and_again_as_noop(backend: Backend) {
    let db = TestDb::new(backend).await;
    let applied = db.database.migrate().await.expect("first run applies");
    assert!(applied >= 1);
    // Something stored survives a second run, which must change nothing.
    let stored = db.database.insert_messages(&[message(10, "dm:a:b", 1, "a", 1)]).await;
    assert!(matches!(stored[0], Ok(Inserted::New { .. })));
    assert_eq!(db.database.migrate().await.expect("second run is a no-op"), applied);
    let after = db.database.messages_after(&ConversationId::parse("dm:a:b").expect("valid"), 0, 10).await;
    assert_eq!(after.expect("read").len(), 1);
    db.drop_database().await;
}

/// Three nodes starting at once on a database nothing has migrated: each migrates (the
/// migrations apply once, under a lock), none fails. Cluster backends only: an SQLite file
/// belongs to one embedded node.
async fn nodes_starting_together_on_a_new_database_each_migrate_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (second, third) = (db.another_node().await, db.another_node().await);
    let (a, b, c) = tokio::join!(db.database.migrate(), second.migrate(), third.migrate());
    let applied = a.expect("the first node migrates");
    assert_eq!(b.expect("the second node migrates"), applied);
    assert_eq!(c.expect("the third node migrates"), applied);
    second.close().await;
    third.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn nodes_starting_together_on_a_new_postgres_database_each_migrate_it() {
    nodes_starting_together_on_a_new_database_each_migrate_it(Backend::Postgres).await;
}

#[tokio::test]
async fn nodes_starting_together_on_a_new_mariadb_database_each_migrate_it() {
    nodes_starting_together_on_a_new_database_each_migrate_it(Backend::MySql).await;
}

/// A migration whose comments were reworded after it shipped: a database that applied the
/// old text opens (and records the new text's checksum); one whose recorded checksum is
/// anything else is refused, as it was.
async fn a_database_that_applied_a_migration_since_reworded_still_opens(backend: Backend) {
    let db = migrated(backend).await;
    let shipped: Vec<_> = herald_host::store::reworded::shipped(backend).collect();
    assert!(!shipped.is_empty(), "a reworded migration is listed");
    let recorded = |checksum: Vec<u8>, version: i64| {
        let pool = db.database.writer.clone();
        async move {
            // The same statement on each driver; only PostgreSQL numbers its placeholders.
            macro_rules! update {
                ($pool:expr, $sql:literal) => {
                    sqlx::query($sql).bind(checksum).bind(version).execute($pool).await.map(|done| done.rows_affected())
                };
            }
            let done = match &pool {
                Pool::Sqlite(pool) => update!(pool, "UPDATE _sqlx_migrations SET checksum = ? WHERE version = ?"),
                Pool::MySql(pool) => update!(pool, "UPDATE _sqlx_migrations SET checksum = ? WHERE version = ?"),
                Pool::Postgres(pool) => update!(pool, "UPDATE _sqlx_migrations SET checksum = $1 WHERE version = $2"),
            };
            assert_eq!(done.expect("the migrations table is written"), 1, "version {version} was applied");
        }
    };
    for (version, checksum) in &shipped {
        recorded(checksum.clone(), *version).await;
    }
    let applied = db.database.migrate().await.expect("a database from before the rewording opens");
    assert_eq!(db.database.migrate().await.expect("and again, now on the current text"), applied);

    let (version, mut tampered) = shipped[0].clone();
    tampered[0] ^= 0xff;
    recorded(tampered, version).await;
    let refused = db.database.migrate().await.expect_err("any other checksum is refused");
    assert!(matches!(refused, StoreError::Migrate(_)), "{refused}");
    db.drop_database().await;
}

async fn second_insert_of_same_client_msg_id_returns_original_ids(backend: Backend) {
    let db = migrated(backend).await;
    let first = db.database.insert_messages(&[message(100, "dm:alice:bob", 1, "alice", 1)]).await;
    assert_eq!(first[0].as_ref().expect("stored"), &Inserted::New { id: 100, seq: 1 });

    // A retry arrives with fresh ids (as if the dedup mark had expired): nothing is stored,
    // and the answer names the original.
    let retry = db.database.insert_messages(&[message(200, "dm:alice:bob", 2, "alice", 1)]).await;
    assert_eq!(
        retry[0].as_ref().expect("answered"),
        &Inserted::Duplicate { id: 100, seq: 1, conversation: conversation("dm:alice:bob") }
    );
    // The same client_msg_id from another sender is a different message.
    let other = db.database.insert_messages(&[message(300, "dm:alice:bob", 3, "bob", 1)]).await;
    assert_eq!(other[0].as_ref().expect("stored"), &Inserted::New { id: 300, seq: 3 });

    let stored =
        db.database.messages_after(&ConversationId::parse("dm:alice:bob").expect("valid"), 0, 100).await.expect("read");
    assert_eq!(stored.iter().map(|m| m.id).collect::<Vec<_>>(), vec![100, 300]);
    db.drop_database().await;
}

async fn concurrent_duplicates_through_group_commit_store_one_row(backend: Backend) {
    let db = migrated(backend).await;
    let committer = GroupCommitter::start(db.database.clone(), &GroupCommitConfig::default());
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let committer = committer.clone();
            // Same (sender, client_msg_id), different ids and seqs: one may win.
            tokio::spawn(async move {
                let ticket =
                    committer.submit(message(1000 + i, "grp:g1", 1 + i, "carol", 9), None).await.expect("queued");
                ticket.wait().await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("task").expect("insert answered"));
    }
    let winners: Vec<_> = outcomes.iter().filter(|o| matches!(o, Inserted::New { .. })).collect();
    assert_eq!(winners.len(), 1, "exactly one insert stores the message: {outcomes:?}");
    let Inserted::New { id, seq } = winners[0] else { unreachable!() };
    for outcome in &outcomes {
        match outcome {
            Inserted::New { .. } => {}
            Inserted::Duplicate { id: dup_id, seq: dup_seq, .. } => assert_eq!((dup_id, dup_seq), (id, seq)),
        }
    }
    let stored =
        db.database.messages_after(&ConversationId::parse("grp:g1").expect("valid"), 0, 100).await.expect("read");
    assert_eq!(stored.len(), 1);
    committer.close().await;
    db.drop_database().await;
}

async fn closing_the_group_committer_answers_every_queued_insert(backend: Backend) {
    let db = migrated(backend).await;
    // Small batches, so several are committed, and on SQLite several wait for the WAL's
    // fsync, when `close` is called: none may be dropped unanswered.
    let config = GroupCommitConfig { max_batch: 64, ..GroupCommitConfig::default() };
    let committer = GroupCommitter::start(db.database.clone(), &config);
    let mut tickets = Vec::new();
    for n in 0..3000u32 {
        let conversation = format!("grp:g{}", n % 30);
        let seq = u64::from(n / 30 + 1);
        tickets.push(
            committer.submit(message(u64::from(n) + 1, &conversation, seq, "dana", n), None).await.expect("queued"),
        );
    }
    committer.close().await;
    for (n, ticket) in tickets.into_iter().enumerate() {
        let outcome = ticket.wait().await.unwrap_or_else(|error| panic!("insert {n} unanswered: {error}"));
        assert_eq!(outcome, Inserted::New { id: n as u64 + 1, seq: n as u64 / 30 + 1 });
    }
    for g in 0..30 {
        let conversation = ConversationId::parse(&format!("grp:g{g}")).expect("valid");
        let stored = db.database.messages_after(&conversation, 0, 1000).await.expect("read");
        assert_eq!(stored.iter().map(|m| m.seq).collect::<Vec<_>>(), (1..=100).collect::<Vec<_>>());
    }
    db.drop_database().await;
}

async fn seq_conflict_fails_only_its_own_row(backend: Backend) {
    let db = migrated(backend).await;
    db.database.insert_messages(&[message(1, "room:r", 5, "dave", 1)]).await[0].as_ref().expect("stored");
    // Row 2 reuses (room:r, 5) with a new client_msg_id: a reissued seq, which must never be
    // stored, and must not take the batch's other rows down with it.
    let batch =
        [message(2, "room:r", 5, "dave", 2), message(3, "room:r", 6, "dave", 3), message(4, "room:r", 7, "erin", 4)];
    let results = db.database.insert_messages(&batch).await;
    assert!(matches!(results[0], Err(StoreError::Conflict { id: 2 })), "{:?}", results[0]);
    assert_eq!(results[1].as_ref().expect("stored"), &Inserted::New { id: 3, seq: 6 });
    assert_eq!(results[2].as_ref().expect("stored"), &Inserted::New { id: 4, seq: 7 });
    db.drop_database().await;
}

async fn messages_read_back_in_seq_order(backend: Backend) {
    let db = migrated(backend).await;
    let conversation = ConversationId::parse("dm:x:y").expect("valid");
    let batch: Vec<_> =
        [9u64, 3, 7, 1, 5].iter().map(|&seq| message(100 + seq, "dm:x:y", seq, "x", seq as u32)).collect();
    for result in db.database.insert_messages(&batch).await {
        result.expect("stored");
    }
    let seqs = |ms: Vec<Message>| ms.iter().map(|m| m.seq).collect::<Vec<_>>();
    assert_eq!(seqs(db.database.messages_after(&conversation, 3, 10).await.expect("read")), vec![5, 7, 9]);
    assert_eq!(seqs(db.database.messages_after(&conversation, 0, 2).await.expect("read")), vec![1, 3]);
    assert_eq!(seqs(db.database.messages_before(&conversation, 0, 2).await.expect("read")), vec![7, 9]);
    assert_eq!(seqs(db.database.messages_before(&conversation, 7, 10).await.expect("read")), vec![1, 3, 5]);
    assert_eq!(db.database.latest_seq(&conversation).await.expect("read"), 9);
    assert_eq!(db.database.latest_seq(&ConversationId::parse("dm:x:z").expect("valid")).await.expect("read"), 0);

    // Every field comes back as it was stored.
    let read = db.database.messages_after(&conversation, 8, 1).await.expect("read");
    assert_eq!(read, vec![batch[0].clone()]);
    db.drop_database().await;
}

async fn cursors_only_move_forward(backend: Backend) {
    let db = migrated(backend).await;
    let user = UserId::parse("u1").expect("valid");
    let device = DeviceId::parse("d1").expect("valid");
    let update = |conversation: &str, seq| CursorUpdate {
        user: user.clone(),
        device: device.clone(),
        conversation: ConversationId::parse(conversation).expect("valid"),
        seq,
    };
    // One batch, with two acks of the same conversation: the higher wins.
    db.database
        .advance_cursors(&[update("dm:u1:u2", 4), update("dm:u1:u2", 9), update("grp:g", 2)])
        .await
        .expect("write");
    db.database.advance_cursors(&[update("dm:u1:u2", 3), update("grp:g", 5)]).await.expect("write");
    let cursors = db.database.cursors(&user, &device).await.expect("read");
    assert_eq!(cursors, vec![(conversation("dm:u1:u2"), 9), (conversation("grp:g"), 5)]);
    db.database.advance_cursors(&[]).await.expect("empty batch is fine");

    // A flush after a burst of acks: more cursors than one statement may bind on any
    // backend (4 parameters a cursor; SQLite takes 32,766, the others 65,535), written all
    // the same.
    let burst: Vec<CursorUpdate> = (0..20_000).map(|n| update(&format!("grp:g{n}"), n + 1)).collect();
    db.database.advance_cursors(&burst).await.expect("a burst of cursors is written");
    let cursors = db.database.cursors(&user, &device).await.expect("read");
    assert_eq!(cursors.len(), 20_002, "every cursor of the burst, and the two before");
    assert!(cursors.contains(&(conversation("grp:g19999"), 20_000)), "{:?}", cursors.last());
    db.drop_database().await;
}

async fn groups_and_members(backend: Backend) {
    let db = migrated(backend).await;
    let group = GroupId::parse("team").expect("valid");
    let user = |name: &str| UserId::parse(name).expect("valid");
    db.database.create_group(&group, &[user("bo"), user("al")], 1).await.expect("created");
    assert!(matches!(db.database.create_group(&group, &[], 2).await, Err(StoreError::GroupExists(_))));
    db.database.add_member(&group, &user("cy"), 3).await.expect("added");
    db.database.add_member(&group, &user("cy"), 4).await.expect("adding twice is fine");
    assert_eq!(db.database.group_members(&group).await.expect("read"), Some(vec![user("al"), user("bo"), user("cy")]));
    assert!(db.database.remove_member(&group, &user("al")).await.expect("removed"));
    assert!(!db.database.remove_member(&group, &user("al")).await.expect("already gone"));
    assert_eq!(db.database.group_members(&group).await.expect("read"), Some(vec![user("bo"), user("cy")]));
    assert_eq!(db.database.groups_of(&user("cy")).await.expect("read"), vec![group.clone()]);
    assert_eq!(db.database.groups_of(&user("al")).await.expect("read"), Vec::<GroupId>::new());

    let missing = GroupId::parse("nope").expect("valid");
    assert!(matches!(db.database.add_member(&missing, &user("al"), 5).await, Err(StoreError::NoSuchGroup(_))));
    assert_eq!(db.database.group_members(&missing).await.expect("read"), None);
    db.drop_database().await;
}

async fn direct_conversations_of_a_user(backend: Backend) {
    let db = migrated(backend).await;
    let user = |name: &str| UserId::parse(name).expect("valid");
    let (al, bo, cy) = (user("al"), user("bo"), user("cy"));
    db.database.add_user_conversation(&[&al, &bo], &conversation("dm:al:bo")).await.expect("write");
    db.database.add_user_conversation(&[&al, &bo], &conversation("dm:al:bo")).await.expect("repeating is harmless");
    db.database.add_user_conversation(&[&al, &cy], &conversation("dm:al:cy")).await.expect("write");
    assert_eq!(
        db.database.user_conversations(&al).await.expect("read"),
        vec![conversation("dm:al:bo"), conversation("dm:al:cy")]
    );
    assert_eq!(db.database.user_conversations(&cy).await.expect("read"), vec![conversation("dm:al:cy")]);
    db.drop_database().await;
}

/// Runs one statement of literal SQL (the same text on every backend).
async fn execute(database: &Database, statement: &'static str) {
    match &database.writer {
        Pool::Sqlite(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
        Pool::MySql(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
        Pool::Postgres(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
    }
    .unwrap_or_else(|error| panic!("{statement}: {error}"));
}

async fn invalid_stored_ids_are_skipped_in_lists_and_reported_in_messages(backend: Backend) {
    let db = migrated(backend).await;
    let user = |name: &str| UserId::parse(name).expect("valid");
    let group = GroupId::parse("team").expect("valid");
    db.database.create_group(&group, &[user("al")], 1).await.expect("created");
    // Rows no Herald would write (names outside the protocol's alphabet), as another tool
    // editing the tables by hand might leave them.
    for statement in [
        "INSERT INTO chat_groups (id, created_at_ms) VALUES ('no good', 1)",
        "INSERT INTO group_members (group_id, user_id, joined_at_ms) VALUES ('no good', 'al', 1)",
        "INSERT INTO group_members (group_id, user_id, joined_at_ms) VALUES ('team', 'b o', 1)",
        "INSERT INTO user_conversations (user_id, conversation) VALUES ('al', 'dm:zz:aa')",
        "INSERT INTO user_conversations (user_id, conversation) VALUES ('al', 'dm:al:bo')",
        "INSERT INTO device_cursors (user_id, device_id, conversation, seq) VALUES ('al', 'phone', 'chan:x', 3)",
        "INSERT INTO device_cursors (user_id, device_id, conversation, seq) VALUES ('al', 'phone', 'room:r', 4)",
    ] {
        execute(&db.database, statement).await;
    }

    // A list is still useful without the bad entry: it is left out.
    assert_eq!(db.database.group_members(&group).await.expect("read"), Some(vec![user("al")]));
    assert_eq!(db.database.groups_of(&user("al")).await.expect("read"), vec![group.clone()]);
    assert_eq!(db.database.user_conversations(&user("al")).await.expect("read"), vec![conversation("dm:al:bo")]);
    let phone = DeviceId::parse("phone").expect("valid");
    assert_eq!(db.database.cursors(&user("al"), &phone).await.expect("read"), vec![(conversation("room:r"), 4)]);

    // A message is not: reading it fails, naming the column and the value.
    db.database.insert_messages(&[message(1, "dm:al:bo", 1, "al", 1)]).await[0].as_ref().expect("stored");
    execute(&db.database, "UPDATE messages SET sender = 'a l' WHERE id = 1").await;
    match db.database.messages_after(&conversation("dm:al:bo"), 0, 10).await {
        Err(StoreError::Corrupt(what)) => assert!(what.contains("sender") && what.contains("a l"), "{what}"),
        other => panic!("a message with an invalid sender was read: {other:?}"),
    }
    db.drop_database().await;
}

/// Each conversation with a message from an id on, with its lowest and highest seq since:
/// what a restarted node reads to learn what it missed.
async fn what_changed_from_an_id_on(backend: Backend) {
    let db = migrated(backend).await;
    let batch = [
        message(10, "dm:x:y", 1, "x", 1),
        message(20, "dm:x:y", 2, "x", 2),
        message(30, "grp:crew", 1, "x", 3),
        message(40, "dm:x:y", 3, "y", 4),
        message(50, "dm:x:z", 1, "z", 5),
    ];
    for result in db.database.insert_messages(&batch).await {
        result.expect("stored");
    }
    let mut changed = db.database.changed_since(20).await.expect("read");
    changed.sort();
    let span = |lowest, highest| SeqSpan { lowest, highest };
    let expected = [
        (conversation("dm:x:y"), span(2, 3)),
        (conversation("dm:x:z"), span(1, 1)),
        (conversation("grp:crew"), span(1, 1)),
    ];
    assert_eq!(changed, expected);
    assert_eq!(db.database.changed_since(41).await.expect("read"), [(conversation("dm:x:z"), span(1, 1))]);
    assert!(db.database.changed_since(51).await.expect("read").is_empty());
    db.drop_database().await;
}

/// An in-memory SQLite database has no WAL to sync: its inserts must not fail for want of one.
#[tokio::test]
async fn an_in_memory_sqlite_database_stores_and_reads_messages() {
    let database =
        herald_host::store::Database::connect("sqlite::memory:", &herald_host::config::StorageConfig::default())
            .await
            .expect("connect");
    database.migrate().await.expect("migrate");
    let stored = database.insert_messages(&[message(1, "dm:a:b", 1, "a", 1)]).await;
    assert_eq!(stored[0].as_ref().expect("stored"), &Inserted::New { id: 1, seq: 1 });
    let read = database.messages_after(&ConversationId::parse("dm:a:b").expect("valid"), 0, 10).await.expect("read");
    assert_eq!(read.iter().map(|m| m.id).collect::<Vec<_>>(), vec![1]);
}

/// Every node rewrites its report row of each plugin it serves, often, and at the same
/// moments as the others (a deploy's notice wakes them all): none of those writes may fail,
/// and each row ends as its node last wrote it. A delete and an insert in a transaction,
/// as the first version wrote them, deadlocked on MariaDB's gap locks.
async fn nodes_writing_their_plugin_reports_at_once_all_succeed_and_the_last_stays(backend: Backend) {
    let db = migrated(backend).await;
    let nodes: Vec<Database> = match backend {
        // An SQLite file belongs to one embedded node: its writers share the one pool.
        Backend::Sqlite => Vec::new(),
        _ => vec![db.another_node().await, db.another_node().await],
    };
    const PLUGINS: [&str; 4] = ["echo", "wf", "limit", "archive"];
    const ROUNDS: u64 = 15;
    let write = |database: &Database, node: u32, round: u64| {
        let database = database.clone();
        async move {
            for name in PLUGINS {
                let report = NodeReport {
                    node: NodeId(node),
                    name: name.to_owned(),
                    report: format!("{{\"round\":{round}}}"),
                    updated_ms: 1_780_000_000_000 + round,
                };
                database.report(&report).await.unwrap_or_else(|e| panic!("node {node} round {round} {name}: {e}"));
            }
        }
    };
    for round in 0..ROUNDS {
        let writers: Vec<&Database> = std::iter::once(&db.database).chain(&nodes).collect();
        let all = writers.iter().enumerate().map(|(node, database)| write(database, node as u32, round));
        futures_util::future::join_all(all).await;
    }
    let reports = db.database.reports().await.expect("read the reports");
    let writers = 1 + nodes.len();
    assert_eq!(reports.len(), writers * PLUGINS.len(), "one row per node and plugin: {reports:?}");
    for report in &reports {
        assert_eq!(report.report, format!("{{\"round\":{}}}", ROUNDS - 1), "{report:?}");
        assert_eq!(report.updated_ms, 1_780_000_000_000 + ROUNDS - 1);
    }
    for node in nodes {
        node.close().await;
    }
    db.drop_database().await;
}
