//! SQLite's statements (embedded mode), and its write of a small message batch
//! ([`insert_batch`]). Placeholders are `?`; `RETURNING` and `ON CONFLICT` are available
//! (SQLite ≥ 3.35).

use std::sync::Arc;

use sqlx::sqlite::SqlitePool;

use super::batch::{Submission, Written, insert_statement, stored_ids};
use super::id_marks::{RaisedMarks, marks_of, raise_statement};
use super::wal_sync::WalSync;
use super::{LeaseSql, Sql, StoreError, signed};
use crate::maps::HashSet;

/// The SQLite dialect.
pub const SQL: Sql = Sql {
    // `OR IGNORE` rather than `ON CONFLICT DO NOTHING`: the same for the unique indexes, but
    // no constraint is left that could abort the statement halfway, so SQLite keeps no
    // statement journal (a copy of every page a multi-row insert touches, a tenth of the
    // writer's time).
    insert_messages: "INSERT OR IGNORE INTO messages (id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms) ",
    insert_messages_tail: "",
    insert_count_is_exact: true,
    message_by_client_id: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE sender = ? AND client_msg_id = ?",
    messages_after: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = ? AND seq > ? ORDER BY seq ASC LIMIT ?",
    messages_before: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
    latest_seq: "SELECT MAX(seq) FROM messages WHERE conversation = ?",
    changed_since: "SELECT conversation, MIN(seq), MAX(seq) FROM messages WHERE id >= ? GROUP BY conversation",
    // The claim leases when the row is new, already its node's, or held at an older epoch
    // (the WHERE); refused, the statement returns no row. SET reads the row as it was.
    lease: LeaseSql::Returning {
        upsert: "INSERT INTO session_seq (conversation, max_seq, owner_node, owner_epoch) VALUES (?, ?, ?, ?) ON CONFLICT (conversation) DO UPDATE SET max_seq = session_seq.max_seq + excluded.max_seq, owner_epoch = CASE WHEN session_seq.owner_node = excluded.owner_node THEN session_seq.owner_epoch ELSE excluded.owner_epoch END, owner_node = excluded.owner_node WHERE session_seq.owner_node = excluded.owner_node OR session_seq.owner_epoch < excluded.owner_epoch RETURNING max_seq, owner_node, owner_epoch",
        owner: "SELECT owner_node, owner_epoch FROM session_seq WHERE conversation = ?",
    },
    // One node, one writer: nothing to fence against.
    lock_owners: None,
    raise_id_marks_tail: " ON CONFLICT (node_id, writer) DO UPDATE SET max_ms = MAX(id_marks.max_ms, excluded.max_ms)",
    id_mark: "SELECT MAX(max_ms) FROM id_marks WHERE node_id = ?",
    upsert_cursors_tail: " ON CONFLICT (user_id, device_id, conversation) DO UPDATE SET seq = MAX(device_cursors.seq, excluded.seq)",
    cursors_of_device: "SELECT conversation, seq FROM device_cursors WHERE user_id = ? AND device_id = ? ORDER BY conversation",
    insert_group: "INSERT INTO chat_groups (id, created_at_ms) VALUES (?, ?)",
    add_member: "INSERT INTO group_members (group_id, user_id, joined_at_ms) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
    remove_member: "DELETE FROM group_members WHERE group_id = ? AND user_id = ?",
    group_exists: "SELECT COUNT(*) FROM chat_groups WHERE id = ?",
    group_members: "SELECT user_id FROM group_members WHERE group_id = ? ORDER BY user_id",
    groups_of_user: "SELECT group_id FROM group_members WHERE user_id = ? ORDER BY group_id",
    add_user_conversation: "INSERT INTO user_conversations (user_id, conversation) VALUES (?, ?) ON CONFLICT DO NOTHING",
    user_conversations: "SELECT conversation FROM user_conversations WHERE user_id = ? ORDER BY conversation",
};

/// Writes a batch that fits one statement (at most `ROWS_PER_STATEMENT` rows) as two
/// statements, each its own transaction: first the id marks of `writer` (unless `raised`
/// says the ones committed before cover the batch), then the rows.
///
/// The driver runs each SQLite connection on a thread of its own, and every statement,
/// `BEGIN` and `COMMIT` is a hand-off to that thread and back. When messages come one at a
/// time, those hand-offs are most of what a message costs; a transaction around the two
/// statements would double them. Without one, the order keeps the marks' promise (never
/// behind a stored id): should the insert fail, or the node stop between the two, the mark
/// is only ahead, which costs at most a short wait at the next start. A multi-row insert is
/// atomic on its own, and an fsync of the WAL that covers the rows' commit covers the
/// marks' before it.
pub(super) async fn insert_batch(
    pool: &SqlitePool,
    batch: &[Submission],
    writer: u32,
    wal: Option<&Arc<WalSync>>,
    raised: &RaisedMarks,
) -> Result<Written, StoreError> {
    let mut messages: Vec<_> = batch.iter().map(|submission| &submission.message).collect();
    // As in the generic path: each conversation's index entries go in one after another.
    messages.sort_unstable_by(|a, b| (a.conversation.as_str(), a.seq).cmp(&(b.conversation.as_str(), b.seq)));
    let mut connection = pool.acquire().await?;
    let marks = raised.to_raise(&marks_of(messages.iter().map(|m| m.id), writer));
    if !marks.is_empty() {
        raise_statement(&SQL, &marks).build().execute(&mut *connection).await?;
        raised.committed(&marks);
    }

    let sync = wal.map(|wal| wal.announce());
    let insert = insert_statement(&SQL, messages.iter().copied()).build().execute(&mut *connection).await;
    if let (Some(wal), Some(number)) = (wal, sync) {
        wal.finished(number, insert.is_err()).await;
    }
    let inserted: HashSet<i64> = if insert?.rows_affected() == messages.len() as u64 {
        messages.iter().map(|m| signed(m.id)).collect()
    } else {
        // Some were duplicates: which of our ids are there (only this connection writes).
        let mut read_back = stored_ids(messages.iter().map(|m| m.id));
        read_back.build_query_scalar::<i64>().fetch_all(&mut *connection).await?.into_iter().collect()
    };
    Ok(Written { inserted, fenced: Default::default(), sync })
}
