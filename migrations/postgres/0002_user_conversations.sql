-- Which direct conversations each user takes part in, so a device that connects can be
-- backfilled on conversations it has never acked. Groups come from group_members.
CREATE TABLE user_conversations (
    user_id      TEXT NOT NULL,
    conversation TEXT NOT NULL,
    PRIMARY KEY (user_id, conversation)
);
