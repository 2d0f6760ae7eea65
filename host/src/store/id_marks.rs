//! The id high-water mark: for each node id, the millisecond of the newest message id
//! committed (`id_marks`), so that a node restarted with its clock behind can start its
//! ids above it (`ids::resume`).
//!
//! The mark is raised by the commit that stores the messages, in the same transaction
//! (`messages.rs`, and the batch statement of `postgres.rs`), or on SQLite by the statement
//! just before it (`sqlite.rs`): never a write of its own, and never behind what is stored,
//! since it becomes visible with the rows or before them. It covers every id
//! the batch carried, stored or not (a duplicate, a fenced row): a mark a little high costs
//! at most a short wait at start. Each writer of the group committer raises rows of its own
//! (`writer`), so two writers of one node never queue on one row's lock; a node id's mark
//! is the largest of its rows. It only ever grows (`GREATEST`/`MAX` on conflict).
//!
//! Where the raise is a statement of its own (SQLite, and the transactional path of MariaDB
//! and MySQL), a raise sets the mark [`MARK_LEAD_MS`] ahead of the batch's newest id, and
//! the commits whose ids it already covers skip the statement ([`RaisedMarks`]): when
//! messages come one at a time, a raise per commit would be a second statement for each
//! message. The lead costs a node restarted within it a wait of at most that long.

use std::sync::Mutex;

use async_trait::async_trait;

use sqlx::{Encode, QueryBuilder, Type};

use super::{Database, Sql, StoreError, on_backend, signed, unsigned};
use crate::maps::HashMap;
use crate::model::{NodeId, id_origin};

/// How far ahead of the newest id it covers a raise sets the mark, in ms: a statement saved
/// for each commit within it, and at most this long a wait for a node restarted within it.
pub const MARK_LEAD_MS: u64 = 20;

/// Where a node reads its id high-water mark at start.
#[async_trait]
pub trait IdMarks: Send + Sync + 'static {
    /// The millisecond (since the Unix epoch) of the newest message id `node` committed,
    /// or `None` when it has committed none (or none since the mark was kept).
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be read or holds a negative mark.
    async fn id_mark(&self, node: NodeId) -> Result<Option<u64>, StoreError>;
}

#[async_trait]
impl IdMarks for Database {
    async fn id_mark(&self, node: NodeId) -> Result<Option<u64>, StoreError> {
        let mark: Option<i64> = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.id_mark).bind(i64::from(node.0)).fetch_one(pool).await?
        });
        mark.map(|ms| unsigned(ms, "id_marks.max_ms")).transpose()
    }
}

/// The rows a commit of `ids` raises by `writer`: `(node_id, writer, max_ms)`, one per node
/// id among them (normally one: a node commits the ids it issued), as the database stores
/// them.
pub(super) fn marks_of(ids: impl IntoIterator<Item = u64>, writer: u32) -> Vec<(i64, i64, i64)> {
    let mut newest: Vec<(NodeId, u64)> = Vec::with_capacity(1);
    for id in ids {
        let (node, ms) = id_origin(id);
        match newest.iter_mut().find(|(seen, _)| *seen == node) {
            Some((_, max)) => *max = (*max).max(ms),
            None => newest.push((node, ms)),
        }
    }
    newest.into_iter().map(|(node, ms)| (i64::from(node.0), i64::from(writer), signed(ms))).collect()
}

/// The marks this process has committed, per `(node_id, writer)`: a commit whose ids they
/// cover need not raise them again, since the stored mark only grows. Shared by the clones
/// of one [`Database`]; a mark is noted only once the commit that raised it succeeded.
#[derive(Debug, Default)]
pub(crate) struct RaisedMarks(Mutex<HashMap<(i64, i64), i64>>);

impl RaisedMarks {
    /// Of `marks` (as [`marks_of`] gives them), those not covered by a mark committed
    /// before, each set [`MARK_LEAD_MS`] ahead. Empty when all are covered.
    pub(super) fn to_raise(&self, marks: &[(i64, i64, i64)]) -> Vec<(i64, i64, i64)> {
        let raised = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        marks
            .iter()
            .filter(|&&(node, writer, ms)| raised.get(&(node, writer)).is_none_or(|&covered| covered < ms))
            .map(|&(node, writer, ms)| (node, writer, ms.saturating_add(signed(MARK_LEAD_MS))))
            .collect()
    }

    /// `marks` (as [`to_raise`](Self::to_raise) gave them) were committed.
    pub(super) fn committed(&self, marks: &[(i64, i64, i64)]) {
        let mut raised = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for &(node, writer, ms) in marks {
            let covered = raised.entry((node, writer)).or_insert(ms);
            *covered = (*covered).max(ms);
        }
    }
}

/// The head of the statement that raises marks: rows `(node_id, writer, max_ms)` follow,
/// then the dialect's [`raise_id_marks_tail`](super::Sql::raise_id_marks_tail).
pub(super) const RAISE_ID_MARKS: &str = "INSERT INTO id_marks (node_id, writer, max_ms) ";

/// The statement that raises `marks` (as [`marks_of`] gives them) in the dialect `sql`.
pub(super) fn raise_statement<DB>(sql: &Sql, marks: &[(i64, i64, i64)]) -> QueryBuilder<DB>
where
    DB: sqlx::Database,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut raise = QueryBuilder::new(RAISE_ID_MARKS);
    raise.push_values(marks, |mut row, &(node, writer, ms)| {
        row.push_bind(node).push_bind(writer).push_bind(ms);
    });
    raise.push(sql.raise_id_marks_tail);
    raise
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HERALD_EPOCH_MS, NODE_BITS, SEQUENCE_BITS};

    fn id(unix_ms: u64, node: u64, sequence: u64) -> u64 {
        ((unix_ms - HERALD_EPOCH_MS) << (NODE_BITS + SEQUENCE_BITS)) | (node << SEQUENCE_BITS) | sequence
    }

    #[test]
    fn a_batch_marks_the_newest_millisecond_of_each_node_that_issued_its_ids() {
        let t = HERALD_EPOCH_MS + 50_000;
        let ids = [id(t + 7, 3, 4095), id(t + 9, 3, 0), id(t + 2, 3, 12), id(t + 30, 5, 1), id(t + 1, 5, 0)];
        let mut marks = marks_of(ids, 1);
        marks.sort_unstable();
        assert_eq!(marks, vec![(3, 1, signed(t + 9)), (5, 1, signed(t + 30))]);
        assert!(marks_of([], 0).is_empty());
    }

    #[test]
    fn a_commit_covered_by_a_committed_mark_raises_nothing() {
        let raised = RaisedMarks::default();
        let lead = signed(MARK_LEAD_MS);
        let first = raised.to_raise(&[(3, 0, 1_000)]);
        assert_eq!(first, vec![(3, 0, 1_000 + lead)], "a first raise leads the batch");
        assert_eq!(raised.to_raise(&[(3, 0, 1_001)]), vec![(3, 0, 1_001 + lead)], "nothing noted before the commit");
        raised.committed(&first);
        assert!(raised.to_raise(&[(3, 0, 1_001)]).is_empty(), "covered by the lead");
        assert!(raised.to_raise(&[(3, 0, 1_000 + lead)]).is_empty(), "the lead's own millisecond is covered");
        assert_eq!(raised.to_raise(&[(3, 0, 1_001 + lead)]), vec![(3, 0, 1_001 + 2 * lead)], "past the lead");
        assert_eq!(raised.to_raise(&[(3, 1, 1_001)]), vec![(3, 1, 1_001 + lead)], "each writer's rows are its own");
        assert_eq!(
            raised.to_raise(&[(3, 0, 999), (4, 0, 999)]),
            vec![(4, 0, 999 + lead)],
            "only the node ids not covered"
        );
        raised.committed(&[(3, 0, 500)]);
        assert!(raised.to_raise(&[(3, 0, 1_000 + lead)]).is_empty(), "an older commit noted later lowers nothing");
    }
}
