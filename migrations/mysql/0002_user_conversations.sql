-- Which direct conversations each user takes part in, so a device that connects can be
-- backfilled on conversations it has never acked. Groups come from group_members.
CREATE TABLE user_conversations (
    user_id      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    conversation VARCHAR(300) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    PRIMARY KEY (user_id, conversation)
) ENGINE = InnoDB;
