-- Herald's schema, PostgreSQL dialect. Same logical schema as ../sqlite and ../mysql.

CREATE TABLE messages (
    id            BIGINT  PRIMARY KEY,       -- snowflake (time-ordered, unique cluster-wide)
    conversation  TEXT    NOT NULL,
    seq           BIGINT  NOT NULL,          -- per-conversation, strictly increasing, gaps allowed
    sender        TEXT    NOT NULL,
    sender_device TEXT    NOT NULL,
    client_msg_id TEXT    NOT NULL,          -- the sender's idempotency key
    kind          BIGINT  NOT NULL,
    body          BYTEA   NOT NULL,
    sent_at_ms    BIGINT  NOT NULL,
    CONSTRAINT messages_conversation_seq UNIQUE (conversation, seq),
    -- client_msg_id first: time-ordered ids (UUIDv7) then append to one end of the index.
    CONSTRAINT messages_client_msg_id_sender UNIQUE (client_msg_id, sender)
);

CREATE TABLE session_seq (
    conversation TEXT   PRIMARY KEY,
    max_seq      BIGINT NOT NULL
);

CREATE TABLE device_cursors (
    user_id       TEXT   NOT NULL,
    device_id     TEXT   NOT NULL,
    conversation  TEXT   NOT NULL,
    seq           BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, conversation)
);

CREATE TABLE chat_groups (
    id            TEXT   PRIMARY KEY,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE group_members (
    group_id      TEXT   NOT NULL REFERENCES chat_groups (id) ON DELETE CASCADE,
    user_id       TEXT   NOT NULL,
    joined_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX group_members_by_user ON group_members (user_id);

CREATE TABLE route_info (
    user_id         TEXT   NOT NULL,
    device_id       TEXT   NOT NULL,
    node_id         BIGINT NOT NULL,
    connection_id   TEXT   NOT NULL,
    connected_at_ms BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);
CREATE INDEX route_info_by_node ON route_info (node_id);
