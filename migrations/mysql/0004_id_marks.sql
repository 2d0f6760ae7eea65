-- The id high-water mark: the millisecond (since the Unix epoch) of the newest message id
-- each node id has committed, so that a node restarted with its clock behind it never
-- issues ids below ones already stored (it waits for its clock, or refuses to start).
-- Raised by the commit that stores the messages, never written on its own. One row per
-- node id and group-commit writer, so that concurrent writers never wait on each other's
-- row lock; a node id's mark is the largest of its rows.
CREATE TABLE id_marks (
    node_id BIGINT NOT NULL,
    writer  BIGINT NOT NULL,
    max_ms  BIGINT NOT NULL,
    PRIMARY KEY (node_id, writer)
) ENGINE = InnoDB;

-- A database from before this table: the newest stored id gives its node's mark (in
-- embedded mode, the one node's). Message ids lay out 41 bits of ms since 2026-01-01
-- (1767225600000), 10 bits of node id, 12 bits of sequence.
INSERT INTO id_marks (node_id, writer, max_ms)
SELECT (newest.top >> 12) & 1023, 0, (newest.top >> 22) + 1767225600000
FROM (SELECT MAX(id) AS top FROM messages) AS newest
WHERE newest.top IS NOT NULL;
