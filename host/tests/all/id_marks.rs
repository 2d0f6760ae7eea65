//! Message ids across a restart, on every backend: each commit raises its node id's
//! high-water mark, and a node restarted with its clock behind that mark waits for the clock
//! or refuses to start, never issuing ids below the stored ones. The clocks are the test's
//! own; the last two tests start a whole node (SQLite) to show `serve` does this at start.
//! Where the mark is raised by a statement of its own it may lead the newest id by up to
//! `MARK_LEAD_MS`, never lag it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_host::clock::{ManualClock, TokioClock, WallClock};
use herald_host::config::{Config, GroupCommitConfig};
use herald_host::ids::{ClockBehind, ResumeError, SnowflakeGenerator, decompose, resume};
use herald_host::model::{ClientMsgId, ConversationId, DeviceId, Message, NodeId, UserId};
use herald_host::store::id_marks::MARK_LEAD_MS;
use herald_host::store::{Backend, Database, GroupCommitter, IdMarks, Inserted, MessageWriter, Pool};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::on_every_backend;
use crate::support::TestDb;

on_every_backend!(
    commits_raise_the_mark_of_the_node_that_issued_the_ids,
    a_restarted_node_waits_for_its_clock_and_issues_ids_above_the_stored_ones,
    a_restarted_node_whose_clock_is_far_behind_is_refused,
    the_migration_marks_the_node_of_the_newest_stored_message,
);

/// How long the wait for a clock a little behind may be.
const MAX_WAIT: Duration = Duration::from_secs(5);

fn now_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis()).expect("fits")
}

/// A message of `dm:a:b` with id `id`, its seq and client id taken from `n`.
fn message(id: u64, n: u32) -> Message {
    Message {
        id,
        conversation: ConversationId::parse("dm:a:b").expect("valid conversation"),
        seq: u64::from(n),
        sender: UserId::parse("a").expect("valid user"),
        sender_device: DeviceId::parse("phone").expect("valid device"),
        client_msg_id: ClientMsgId::parse(&format!("00000000-0000-4000-8000-{n:012x}")).expect("valid uuid"),
        kind: 1,
        body: b"hello".to_vec().into(),
        sent_at_ms: decompose(id).unix_ms,
    }
}

/// Asserts `node`'s mark covers `newest_ms` and leads it by no more than a raise does.
async fn assert_marked(database: &Database, node: NodeId, newest_ms: u64) {
    let mark = database.id_mark(node).await.expect("read").unwrap_or_else(|| panic!("node {node} has no mark"));
    assert!(
        (newest_ms..=newest_ms + MARK_LEAD_MS).contains(&mark),
        "node {node}'s mark {mark} does not cover {newest_ms} within the lead"
    );
}

/// Stores `messages` in one commit, each as new.
async fn store(database: &Database, messages: &[Message]) {
    for result in database.insert_messages(messages).await {
        assert!(matches!(result, Ok(Inserted::New { .. })), "not stored: {result:?}");
    }
}

async fn migrated(backend: Backend) -> TestDb {
    let db = TestDb::new(backend).await;
    db.database.migrate().await.expect("migrations apply");
    db
}

async fn commits_raise_the_mark_of_the_node_that_issued_the_ids(backend: Backend) {
    let db = migrated(backend).await;
    let (three, four) = (NodeId(3), NodeId(4));
    assert_eq!(db.database.id_mark(three).await.expect("read"), None, "nothing committed yet");

    // Two writers, so the batches land in both writers' rows: the mark is the newest of them.
    let committer = GroupCommitter::start(
        db.database.clone(),
        &GroupCommitConfig { writers: Some(2), max_batch: 4, ..GroupCommitConfig::default() },
    );
    let t = now_ms();
    let clock = ManualClock::new(t);
    let ids = SnowflakeGenerator::with_clock(three.0, clock.clone()).expect("node in range");
    let mut tickets = Vec::new();
    for n in 1..=20 {
        clock.advance(1);
        tickets.push(committer.submit(message(ids.next_id(), n), None).await.expect("queued"));
    }
    for ticket in tickets {
        assert!(matches!(ticket.wait().await, Ok(Inserted::New { .. })));
    }
    committer.close().await;
    assert_marked(&db.database, three, t + 20).await;
    assert_eq!(db.database.id_mark(four).await.expect("read"), None, "another node id's mark is its own");
    let before = db.database.id_mark(three).await.expect("read");

    // Older ids committed later (a clock stepped back) do not lower it.
    let behind = SnowflakeGenerator::with_clock(three.0, ManualClock::new(t - 10_000)).expect("node in range");
    store(&db.database, &[message(behind.next_id(), 21)]).await;
    assert_eq!(db.database.id_mark(three).await.expect("read"), before);

    // One commit holding two nodes' ids raises each node's mark to its own newest.
    let other = SnowflakeGenerator::with_clock(four.0, ManualClock::new(t + 500)).expect("node in range");
    let newer = SnowflakeGenerator::with_clock(three.0, ManualClock::new(t + 30)).expect("node in range");
    store(&db.database, &[message(other.next_id(), 22), message(newer.next_id(), 23)]).await;
    assert_marked(&db.database, four, t + 500).await;
    assert_marked(&db.database, three, t + 30).await;
    db.drop_database().await;
}

async fn a_restarted_node_waits_for_its_clock_and_issues_ids_above_the_stored_ones(backend: Backend) {
    let db = migrated(backend).await;
    let node = NodeId(7);
    // The node's earlier life stored messages up to `t`.
    let t = now_ms();
    let earlier = SnowflakeGenerator::with_clock(node.0, ManualClock::new(t)).expect("node in range");
    let stored: Vec<Message> = (1..=3).map(|n| message(earlier.next_id(), n)).collect();
    store(&db.database, &stored).await;
    let newest = stored.iter().map(|m| m.id).max().expect("three ids");

    // Restarted with its clock 300 ms behind, in real time from there.
    let clock = TokioClock::new(t - 300);
    let unguarded = SnowflakeGenerator::with_clock(node.0, clock.clone()).expect("node in range");
    assert!(unguarded.next_id() < newest, "the clock alone would go back: the case the mark is for");

    let resumed = resume(&db.database, node, clock.clone(), MAX_WAIT).await.expect("resumes after a short wait");
    assert!(clock.now_ms() > t, "returned before the clock passed the mark");
    let first = resumed.next_id();
    assert!(first > newest, "{:?} is not above the stored {:?}", decompose(first), decompose(newest));
    store(&db.database, &[message(first, 4)]).await;
    assert_marked(&db.database, node, decompose(first).unix_ms).await;
    db.drop_database().await;
}

async fn a_restarted_node_whose_clock_is_far_behind_is_refused(backend: Backend) {
    let db = migrated(backend).await;
    let node = NodeId(9);
    let t = now_ms();
    let earlier = SnowflakeGenerator::with_clock(node.0, ManualClock::new(t)).expect("node in range");
    store(&db.database, &[message(earlier.next_id(), 1)]).await;

    let clock = ManualClock::new(t - 60_000);
    let refused = resume(&db.database, node, clock, MAX_WAIT).await.err().expect("refused");
    let ResumeError::Clock(ClockBehind::TooFar { node: said, mark_ms, behind, max_wait }) = &refused else {
        panic!("{refused}")
    };
    assert_eq!((*said, *max_wait), (node, MAX_WAIT));
    assert!((t..=t + MARK_LEAD_MS).contains(mark_ms), "mark {mark_ms}, stored {t}");
    assert_eq!(*behind, Duration::from_millis(mark_ms + 1 + 60_000 - t), "from the clock to just past the mark");
    let told = refused.to_string();
    let amount = format!("{:.3} s behind", behind.as_secs_f64());
    assert!(told.contains(&amount) && told.contains("ids.max_clock_wait_ms"), "{told}");
    db.drop_database().await;
}

async fn the_migration_marks_the_node_of_the_newest_stored_message(backend: Backend) {
    let db = migrated(backend).await;
    let t = now_ms();
    let older = SnowflakeGenerator::with_clock(5, ManualClock::new(t + 1_000)).expect("node in range");
    let newest = SnowflakeGenerator::with_clock(6, ManualClock::new(t + 2_000)).expect("node in range");
    store(&db.database, &[message(older.next_id(), 1), message(newest.next_id(), 2)]).await;

    // As a database from before the marks: no table, the migration not applied.
    for statement in ["DROP TABLE id_marks", "DELETE FROM _sqlx_migrations WHERE version = 4"] {
        execute(&db.database, statement).await;
    }
    db.database.migrate().await.expect("the migration applies to stored messages");
    assert_eq!(db.database.id_mark(NodeId(6)).await.expect("read"), Some(t + 2_000));
    assert_eq!(db.database.id_mark(NodeId(5)).await.expect("read"), None, "only the newest message's node");
    db.drop_database().await;
}

async fn execute(database: &Database, statement: &'static str) {
    match &database.writer {
        Pool::Sqlite(pool) => sqlx::query(statement).execute(pool).await.map(drop),
        Pool::MySql(pool) => sqlx::query(statement).execute(pool).await.map(drop),
        Pool::Postgres(pool) => sqlx::query(statement).execute(pool).await.map(drop),
    }
    .unwrap_or_else(|error| panic!("{statement}: {error}"));
}

/// A node's earlier life, whose clock ran `ahead_ms` ahead of this one's: one message of
/// node 0 (embedded mode's) stored in `config`'s database.
async fn earlier_life(config: &Config, ahead_ms: u64) -> u64 {
    let database = Database::connect(&config.database_url(), &config.storage).await.expect("open the SQLite file");
    database.migrate().await.expect("migrate");
    let clock = ManualClock::new(now_ms() + ahead_ms);
    let id = SnowflakeGenerator::with_clock(0, clock).expect("node in range").next_id();
    store(&database, &[message(id, 1)]).await;
    database.close().await;
    id
}

fn embedded_config(root: &tempfile::TempDir) -> Config {
    let plugins = root.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("an empty plugins folder");
    Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        data_dir: root.path().join("data"),
        plugins: Some(plugins),
        dev: true,
        ..Config::default()
    }
}

#[tokio::test]
async fn a_node_whose_clock_is_an_hour_behind_its_stored_ids_refuses_to_start() {
    let root = tempfile::tempdir().expect("a temporary folder");
    let config = embedded_config(&root);
    earlier_life(&config, 3_600_000).await;
    let refused = herald_host::server::start(&config).await.err().expect("refused to start");
    let told = format!("{:#}", anyhow::Error::from(refused));
    for part in ["behind the newest message id node 0 committed", "HERALD_IDS__MAX_CLOCK_WAIT_MS"] {
        assert!(told.contains(part), "{part:?} missing from: {told}");
    }
    // By how much: an hour, less the time the earlier life and the start took.
    let seconds: f64 = told
        .split_once("this node's clock is ")
        .and_then(|(_, rest)| rest.split_once(" s behind"))
        .and_then(|(seconds, _)| seconds.parse().ok())
        .unwrap_or_else(|| panic!("no amount in: {told}"));
    let most = 3_600.001 + Duration::from_millis(MARK_LEAD_MS).as_secs_f64();
    assert!((3_540.0..=most).contains(&seconds), "{seconds} s in: {told}");
}

#[tokio::test]
async fn a_node_whose_clock_is_a_little_behind_its_stored_ids_waits_then_issues_ids_above_them() {
    let root = tempfile::tempdir().expect("a temporary folder");
    let config = embedded_config(&root);
    let stored = earlier_life(&config, 1_500).await;
    let server = tokio::time::timeout(Duration::from_secs(30), herald_host::server::start(&config))
        .await
        .expect("started in time")
        .expect("starts once its clock has passed the stored id");
    assert!(now_ms() > decompose(stored).unix_ms, "serving before the clock passed the stored id");

    // An announcement takes an id from the node's generator.
    let body = r#"{"content":"doors open"}"#;
    let request = format!(
        "POST /v1/rooms/lobby/announcements HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer \
         dev-key\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len(),
        addr = server.addr,
    );
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write the request");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(15), stream.read_to_string(&mut answer))
        .await
        .expect("answered in time")
        .expect("read the answer");
    let (_, json) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no body: {answer}"));
    let json: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|error| panic!("{answer}: {error}"));
    let id: u64 = json["message_id"].as_str().and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    assert!(id > stored, "{:?} is not above the stored {:?}", decompose(id), decompose(stored));
    tokio::time::timeout(Duration::from_secs(30), server.shutdown()).await.expect("shutdown hung");
}
