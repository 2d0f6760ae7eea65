//! MySQL/MariaDB's statements (cluster mode). Placeholders are `?`. There is no
//! `UPDATE … RETURNING` in MySQL, so the seq lease reads its new high-water mark with a
//! second statement inside the same transaction, and message inserts learn which rows went
//! in by reading their ids back.

use super::Sql;

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
    // Takes the row's exclusive lock at once (no shared-then-exclusive upgrade, so two
    // nodes leasing the same conversation cannot deadlock).
    lease_upsert: "INSERT INTO session_seq (conversation, max_seq) VALUES (?, ?) ON DUPLICATE KEY UPDATE max_seq = max_seq + VALUES(max_seq)",
    lease_select: Some("SELECT max_seq FROM session_seq WHERE conversation = ?"),
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
