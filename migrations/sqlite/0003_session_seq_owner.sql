-- The owner fence of a conversation's seqs (cluster mode): the node that last
-- leased them and the ring epoch it claimed them at. A lease by another node succeeds only
-- at a newer epoch; a commit is checked against it. Rows from before start unowned (node 0
-- at epoch 0: any claim at a ring epoch of 1 or more takes them).
ALTER TABLE session_seq ADD COLUMN owner_node INTEGER NOT NULL DEFAULT 0;
ALTER TABLE session_seq ADD COLUMN owner_epoch INTEGER NOT NULL DEFAULT 0;
