-- Herald's schema, MySQL/MariaDB dialect. Same logical schema as ../sqlite and ../postgres.
-- Ids are ASCII ([A-Za-z0-9._@:-]) and compared byte-wise (ascii_bin): "Bob" and "bob" are
-- different users, as on the other backends.

CREATE TABLE messages (
    id            BIGINT       NOT NULL PRIMARY KEY,   -- snowflake
    conversation  VARCHAR(300) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq           BIGINT       NOT NULL,
    sender        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sender_device VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    client_msg_id VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind          BIGINT       NOT NULL,
    body          LONGBLOB     NOT NULL,
    sent_at_ms    BIGINT       NOT NULL,
    UNIQUE KEY messages_conversation_seq (conversation, seq),
    -- client_msg_id first: time-ordered ids (UUIDv7) then append to one end of the index.
    UNIQUE KEY messages_client_msg_id_sender (client_msg_id, sender)
) ENGINE = InnoDB;

CREATE TABLE session_seq (
    conversation VARCHAR(300) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    max_seq      BIGINT NOT NULL
) ENGINE = InnoDB;

CREATE TABLE device_cursors (
    user_id       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    device_id     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    conversation  VARCHAR(300) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq           BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, conversation)
) ENGINE = InnoDB;

CREATE TABLE chat_groups (
    id            VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    created_at_ms BIGINT NOT NULL
) ENGINE = InnoDB;

CREATE TABLE group_members (
    group_id      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    joined_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (group_id, user_id),
    KEY group_members_by_user (user_id),
    CONSTRAINT group_members_group FOREIGN KEY (group_id) REFERENCES chat_groups (id) ON DELETE CASCADE
) ENGINE = InnoDB;

CREATE TABLE route_info (
    user_id         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    device_id       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    node_id         BIGINT NOT NULL,
    connection_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    connected_at_ms BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id),
    KEY route_info_by_node (node_id)
) ENGINE = InnoDB;
