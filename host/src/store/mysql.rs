//! MySQL/MariaDB's statements (cluster mode). Placeholders are `?`. There is no
//! `RETURNING` on an upsert in MySQL, so the seq lease locks the row and decides in a
//! transaction, and message inserts learn which rows went in by reading their ids back.

use super::{LeaseSql, Sql};

/// The MySQL/MariaDB dialect.
pub const SQL: Sql = Sql {
    insert_messages: "INSERT INTO messages (id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms) ",
    // A no-op update instead of INSERT IGNORE, which would also swallow data errors.
    insert_messages_tail: " ON DUPLICATE KEY UPDATE id = id",
    insert_count_is_exact: false,
    message_by_client_id: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE sender = ? AND client_msg_id = ?",
    messages_after: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = ? AND seq > ? ORDER BY seq ASC LIMIT ?",
    messages_before: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
    latest_seq: "SELECT MAX(seq) FROM messages WHERE conversation = ?",
    changed_since: "SELECT conversation, MIN(seq), MAX(seq) FROM messages WHERE id >= ? GROUP BY conversation",
    // No RETURNING on an upsert: lock the row, apply the rule in Rust, update, commit. A
    // conversation's first lease creates its row first (a no-op when it exists), outside
    // the transaction: a locking read of a missing row takes a gap lock, and two nodes
    // inserting under gap locks would deadlock.
    lease: LeaseSql::Locking {
        lock: "SELECT max_seq, owner_node, owner_epoch FROM session_seq WHERE conversation = ? FOR UPDATE",
        update: "UPDATE session_seq SET max_seq = ?, owner_node = ?, owner_epoch = ? WHERE conversation = ?",
        create: "INSERT INTO session_seq (conversation, max_seq, owner_node, owner_epoch) VALUES (?, 0, ?, ?) ON DUPLICATE KEY UPDATE conversation = conversation",
    },
    // ascii_bin sorts in byte order, as the batch does. A shared lock conflicts with the
    // lease's exclusive one.
    lock_owners: Some((
        "SELECT conversation, owner_node, owner_epoch FROM session_seq WHERE conversation IN (",
        ") ORDER BY conversation LOCK IN SHARE MODE",
    )),
    raise_id_marks_tail: " ON DUPLICATE KEY UPDATE max_ms = GREATEST(max_ms, VALUES(max_ms))",
    id_mark: "SELECT MAX(max_ms) FROM id_marks WHERE node_id = ?",
    upsert_cursors_tail: " ON DUPLICATE KEY UPDATE seq = GREATEST(seq, VALUES(seq))",
    cursors_of_device: "SELECT conversation, seq FROM device_cursors WHERE user_id = ? AND device_id = ? ORDER BY conversation",
    insert_group: "INSERT INTO chat_groups (id, created_at_ms) VALUES (?, ?)",
    add_member: "INSERT INTO group_members (group_id, user_id, joined_at_ms) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE group_id = group_id",
    remove_member: "DELETE FROM group_members WHERE group_id = ? AND user_id = ?",
    group_exists: "SELECT COUNT(*) FROM chat_groups WHERE id = ?",
    group_members: "SELECT user_id FROM group_members WHERE group_id = ? ORDER BY user_id",
    groups_of_user: "SELECT group_id FROM group_members WHERE user_id = ? ORDER BY group_id",
    add_user_conversation: "INSERT INTO user_conversations (user_id, conversation) VALUES (?, ?) ON DUPLICATE KEY UPDATE user_id = user_id",
    user_conversations: "SELECT conversation FROM user_conversations WHERE user_id = ? ORDER BY conversation",
};
