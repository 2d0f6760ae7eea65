//! PostgreSQL's statements (cluster mode). Placeholders are `$n`; `RETURNING` and
//! `ON CONFLICT` are available.
//!
//! A batch of messages goes in as one statement ([`insert_batch`]): its rows as arrays, the
//! owners' lock, the fence check and the insert in one round trip, committed on its own
//! (an implicit transaction). Through an explicit transaction the same batch took four
//! (BEGIN, the lock, the insert, COMMIT), each a wake-up of the server process and of ours:
//! on a busy machine, most of a commit's time.

use sqlx::PgPool;

use super::batch::{Submission, Written};
use super::id_marks::marks_of;
use super::seq_lease::fence_of;
use super::{LeaseSql, Sql, StoreError, signed};
use crate::maps::{HashMap, HashSet};

/// The PostgreSQL dialect.
pub const SQL: Sql = Sql {
    insert_messages: "INSERT INTO messages (id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms) ",
    insert_messages_tail: " ON CONFLICT DO NOTHING",
    insert_count_is_exact: true,
    message_by_client_id: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE sender = $1 AND client_msg_id = $2",
    messages_after: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = $1 AND seq > $2 ORDER BY seq ASC LIMIT $3",
    messages_before: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
    latest_seq: "SELECT MAX(seq) FROM messages WHERE conversation = $1",
    changed_since: "SELECT conversation, MIN(seq), MAX(seq) FROM messages WHERE id >= $1 GROUP BY conversation",
    // The claim leases when the row is new, already its node's, or held at an older epoch
    // (the WHERE); refused, the statement returns no row. SET reads the row as it was.
    lease: LeaseSql::Returning {
        upsert: "INSERT INTO session_seq (conversation, max_seq, owner_node, owner_epoch) VALUES ($1, $2, $3, $4) ON CONFLICT (conversation) DO UPDATE SET max_seq = session_seq.max_seq + EXCLUDED.max_seq, owner_epoch = CASE WHEN session_seq.owner_node = EXCLUDED.owner_node THEN session_seq.owner_epoch ELSE EXCLUDED.owner_epoch END, owner_node = EXCLUDED.owner_node WHERE session_seq.owner_node = EXCLUDED.owner_node OR session_seq.owner_epoch < EXCLUDED.owner_epoch RETURNING max_seq, owner_node, owner_epoch",
        owner: "SELECT owner_node, owner_epoch FROM session_seq WHERE conversation = $1",
    },
    // Sorted in byte order (COLLATE "C"), as the batch sorts them, so two batches always
    // lock rows in the same order. FOR SHARE conflicts with the lease's row lock.
    // Not used on PostgreSQL, nor are `insert_messages*` and `insert_count_is_exact` above:
    // message batches go through `INSERT_BATCH` (which locks the same way), never through
    // `insert_batch_in_transaction`. Every dialect fills the whole table, so these stay
    // correct in case that path is ever taken here.
    lock_owners: Some((
        "SELECT conversation, owner_node, owner_epoch FROM session_seq WHERE conversation IN (",
        ") ORDER BY conversation COLLATE \"C\" FOR SHARE",
    )),
    raise_id_marks_tail: " ON CONFLICT (node_id, writer) DO UPDATE SET max_ms = GREATEST(id_marks.max_ms, EXCLUDED.max_ms)",
    id_mark: "SELECT MAX(max_ms) FROM id_marks WHERE node_id = $1",
    upsert_cursors_tail: " ON CONFLICT (user_id, device_id, conversation) DO UPDATE SET seq = GREATEST(device_cursors.seq, EXCLUDED.seq)",
    cursors_of_device: "SELECT conversation, seq FROM device_cursors WHERE user_id = $1 AND device_id = $2 ORDER BY conversation",
    insert_group: "INSERT INTO chat_groups (id, created_at_ms) VALUES ($1, $2)",
    add_member: "INSERT INTO group_members (group_id, user_id, joined_at_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    remove_member: "DELETE FROM group_members WHERE group_id = $1 AND user_id = $2",
    group_exists: "SELECT COUNT(*) FROM chat_groups WHERE id = $1",
    group_members: "SELECT user_id FROM group_members WHERE group_id = $1 ORDER BY user_id",
    groups_of_user: "SELECT group_id FROM group_members WHERE user_id = $1 ORDER BY group_id",
    add_user_conversation: "INSERT INTO user_conversations (user_id, conversation) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    user_conversations: "SELECT conversation FROM user_conversations WHERE user_id = $1 ORDER BY conversation",
};

/// A batch of messages in one statement. `$1`..`$9` are the columns of `messages` as arrays,
/// `$10`/`$11` each row's fence (NULL: unfenced), `$12` the fenced conversations, each once
/// (a list the planner looks up in the primary key; derived from `v` inside the statement,
/// it chose a hash join over a scan of the whole table). `owners` takes the shared lock of the
/// fenced conversations' `session_seq` rows in byte order (the lock sits above the sort, so
/// every batch locks in one order) and reads their owners; a fenced row is inserted only
/// while its conversation's row names its fence. The insert's sort consumes all of `owners`
/// before the first row goes in. Read committed: a row locked after a concurrent lease
/// committed is read as that lease left it. `marked` raises the id high-water marks
/// (`$13`/`$14`: node ids and their newest millisecond, `$15` the writer: see `id_marks.rs`)
/// in the same statement, so in the same commit; PostgreSQL runs a data-modifying `WITH`
/// whether or not the query reads it. The result: one row per inserted id, then one per
/// locked owner.
const INSERT_BATCH: &str = r#"WITH v AS (
    SELECT * FROM UNNEST($1::int8[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::bytea[], $9::int8[], $10::int8[], $11::int8[])
        AS v(id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms, fence_node, fence_epoch)
), owners AS (
    SELECT s.conversation, s.owner_node, s.owner_epoch FROM session_seq s
    WHERE s.conversation = ANY($12::text[])
    ORDER BY s.conversation COLLATE "C" FOR SHARE OF s
), stored AS (
    INSERT INTO messages (id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms)
    SELECT v.id, v.conversation, v.seq, v.sender, v.sender_device, v.client_msg_id, v.kind, v.body, v.sent_at_ms
    FROM v LEFT JOIN owners o ON o.conversation = v.conversation
    WHERE v.fence_node IS NULL OR (o.owner_node = v.fence_node AND o.owner_epoch = v.fence_epoch)
    ORDER BY v.conversation COLLATE "C", v.seq
    ON CONFLICT DO NOTHING
    RETURNING id
), marked AS (
    INSERT INTO id_marks (node_id, writer, max_ms)
    SELECT m.node_id, $15::int8, m.max_ms FROM UNNEST($13::int8[], $14::int8[]) AS m(node_id, max_ms)
    ON CONFLICT (node_id, writer) DO UPDATE SET max_ms = GREATEST(id_marks.max_ms, EXCLUDED.max_ms)
)
SELECT id, NULL::text AS conversation, NULL::int8 AS owner_node, NULL::int8 AS owner_epoch FROM stored
UNION ALL
SELECT NULL, conversation, owner_node, owner_epoch FROM owners"#;

/// A row of [`INSERT_BATCH`]'s result: `(id, None, None, None)` for an inserted row,
/// `(None, conversation, owner_node, owner_epoch)` for a locked owner.
type BatchRow = (Option<i64>, Option<String>, Option<i64>, Option<i64>);

/// Writes `batch` with [`INSERT_BATCH`]: which rows went in, and which were refused by the
/// fence check (with the owner found, `None` when the conversation has no row).
pub(super) async fn insert_batch(pool: &PgPool, batch: &[Submission], writer: u32) -> Result<Written, StoreError> {
    let column = |field: fn(&Submission) -> i64| batch.iter().map(field).collect::<Vec<i64>>();
    let text = |field: for<'a> fn(&'a Submission) -> &'a str| batch.iter().map(field).collect::<Vec<&str>>();
    let fenced_conversations: Vec<&str> = batch
        .iter()
        .filter(|s| s.fence.is_some())
        .map(|s| s.message.conversation.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let marks = marks_of(batch.iter().map(|s| s.message.id), writer);
    let rows: Vec<BatchRow> = sqlx::query_as(INSERT_BATCH)
        .bind(column(|s| signed(s.message.id)))
        .bind(text(|s| s.message.conversation.as_str()))
        .bind(column(|s| signed(s.message.seq)))
        .bind(text(|s| s.message.sender.as_str()))
        .bind(text(|s| s.message.sender_device.as_str()))
        .bind(text(|s| s.message.client_msg_id.as_str()))
        .bind(column(|s| i64::from(s.message.kind)))
        .bind(batch.iter().map(|s| s.message.body.as_ref()).collect::<Vec<&[u8]>>())
        .bind(column(|s| signed(s.message.sent_at_ms)))
        .bind(batch.iter().map(|s| s.fence.map(|f| i64::from(f.node.0))).collect::<Vec<Option<i64>>>())
        .bind(batch.iter().map(|s| s.fence.map(|f| signed(f.epoch))).collect::<Vec<Option<i64>>>())
        .bind(fenced_conversations)
        .bind(marks.iter().map(|&(node, _, _)| node).collect::<Vec<i64>>())
        .bind(marks.iter().map(|&(_, _, ms)| ms).collect::<Vec<i64>>())
        .bind(i64::from(writer))
        .fetch_all(pool)
        .await?;
    let mut inserted = HashSet::with_capacity_and_hasher(batch.len(), Default::default());
    let mut owners = HashMap::default();
    for row in rows {
        match row {
            (Some(id), ..) => {
                inserted.insert(id);
            }
            (None, Some(conversation), Some(node), Some(epoch)) => {
                owners.insert(conversation, fence_of(node, epoch)?);
            }
            other => return Err(StoreError::Corrupt(format!("unexpected row from the batch insert: {other:?}"))),
        }
    }
    let fenced = batch
        .iter()
        .enumerate()
        .filter_map(|(at, submission)| {
            let fence = submission.fence?;
            let owner = owners.get(submission.message.conversation.as_str()).copied();
            (owner != Some(fence)).then_some((at, owner))
        })
        .collect();
    Ok(Written { inserted, fenced, sync: None })
}
