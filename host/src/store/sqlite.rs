//! SQLite's statements (embedded mode). Placeholders are `?`; `RETURNING` and
//! `ON CONFLICT` are available (SQLite ≥ 3.35).

use super::{LeaseSql, Sql};

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
    changed_since: "SELECT conversation, MIN(seq) FROM messages WHERE id >= ? GROUP BY conversation",
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
