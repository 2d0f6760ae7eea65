-- Herald's schema, SQLite dialect. Same logical schema as ../mysql and ../postgres.

-- Every message, once. Snowflake id as the key keeps inserts appending.
CREATE TABLE messages (
    id            INTEGER PRIMARY KEY,      -- snowflake (time-ordered, unique cluster-wide)
    conversation  TEXT    NOT NULL,          -- dm:a:b, grp:id or room:name
    seq           INTEGER NOT NULL,          -- per-conversation, strictly increasing, gaps allowed
    sender        TEXT    NOT NULL,
    sender_device TEXT    NOT NULL,
    client_msg_id TEXT    NOT NULL,          -- the sender's idempotency key
    kind          INTEGER NOT NULL,
    body          BLOB    NOT NULL,
    sent_at_ms    INTEGER NOT NULL,
    UNIQUE (conversation, seq),
    -- client_msg_id first: time-ordered ids (UUIDv7) then append to one end of the index
    -- instead of landing on a random page per row.
    UNIQUE (client_msg_id, sender)
);

-- High-water mark of seqs leased per conversation (segment allocator).
CREATE TABLE session_seq (
    conversation TEXT    PRIMARY KEY,
    max_seq      INTEGER NOT NULL
);

-- How far each device has acknowledged each conversation.
CREATE TABLE device_cursors (
    user_id       TEXT    NOT NULL,
    device_id     TEXT    NOT NULL,
    conversation  TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    PRIMARY KEY (user_id, device_id, conversation)
);

CREATE TABLE chat_groups (
    id            TEXT    PRIMARY KEY,
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE group_members (
    group_id      TEXT    NOT NULL REFERENCES chat_groups (id) ON DELETE CASCADE,
    user_id       TEXT    NOT NULL,
    joined_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX group_members_by_user ON group_members (user_id);

-- Durable fallback of the route table: which node holds each connected device.
CREATE TABLE route_info (
    user_id         TEXT    NOT NULL,
    device_id       TEXT    NOT NULL,
    node_id         INTEGER NOT NULL,
    connection_id   TEXT    NOT NULL,
    connected_at_ms INTEGER NOT NULL,
    PRIMARY KEY (user_id, device_id)
);
CREATE INDEX route_info_by_node ON route_info (node_id);
