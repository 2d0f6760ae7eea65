//! PostgreSQL's statements (cluster mode). Placeholders are `$n`; `RETURNING` and
//! `ON CONFLICT` are available.

use super::{LeaseSql, Sql};

/// The PostgreSQL dialect.
pub const SQL: Sql = Sql {
    insert_messages: "INSERT INTO messages (id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms) ",
    insert_messages_tail: " ON CONFLICT DO NOTHING",
    insert_count_is_exact: true,
    message_by_client_id: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE sender = $1 AND client_msg_id = $2",
    messages_after: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = $1 AND seq > $2 ORDER BY seq ASC LIMIT $3",
    messages_before: "SELECT id, conversation, seq, sender, sender_device, client_msg_id, kind, body, sent_at_ms FROM messages WHERE conversation = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
    latest_seq: "SELECT MAX(seq) FROM messages WHERE conversation = $1",
    // The claim leases when the row is new, already its node's, or held at an older epoch
    // (the WHERE); refused, the statement returns no row. SET reads the row as it was.
    lease: LeaseSql::Returning {
        upsert: "INSERT INTO session_seq (conversation, max_seq, owner_node, owner_epoch) VALUES ($1, $2, $3, $4) ON CONFLICT (conversation) DO UPDATE SET max_seq = session_seq.max_seq + EXCLUDED.max_seq, owner_epoch = CASE WHEN session_seq.owner_node = EXCLUDED.owner_node THEN session_seq.owner_epoch ELSE EXCLUDED.owner_epoch END, owner_node = EXCLUDED.owner_node WHERE session_seq.owner_node = EXCLUDED.owner_node OR session_seq.owner_epoch < EXCLUDED.owner_epoch RETURNING max_seq, owner_node, owner_epoch",
        owner: "SELECT owner_node, owner_epoch FROM session_seq WHERE conversation = $1",
    },
    // Sorted in byte order (COLLATE "C"), as the batch sorts them, so two batches always
    // lock rows in the same order. FOR SHARE conflicts with the lease's row lock.
    lock_owners: Some((
        "SELECT conversation, owner_node, owner_epoch FROM session_seq WHERE conversation IN (",
        ") ORDER BY conversation COLLATE \"C\" FOR SHARE",
    )),
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
