//! The message repository: batched inserts that report duplicates, and reads by seq.
//!
//! A message is stored once per (sender, client_msg_id): a second insert of the same pair
//! stores nothing and answers with the original row's ids. The unique index is the final
//! guard; the pipeline's dedup mark only spares the database the work.
//!
//! A message may carry the [`Fence`] of the lease its seq came from. On the server backends
//! a batch holding fenced messages first takes the shared lock of their conversations'
//! `session_seq` rows, in sorted order, and stores a fenced message only while the row still
//! names that owner ([`StoreError::Fenced`] otherwise); the lock holds a new owner's lease
//! back until the batch has committed (see `seq_lease.rs`). SQLite, one node, does not check.
//!
//! The commit of a batch also raises the id high-water marks of the nodes that issued its
//! ids (`id_marks.rs`; on SQLite a small batch raises them just before, see `sqlite.rs`), so
//! that a restart never issues ids below the stored ones.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, QueryBuilder, Row, Type};

use super::batch::{Submission, Written, insert_statement, stored_ids};
use super::id_marks::{marks_of, raise_statement};
use super::seq_lease::{Fence, fence_of};
use super::{
    Database, Inserted, MessageStore, Pool, ROWS_PER_STATEMENT, SeqSpan, StoreError, SyncFailure, on_backend,
    parse_stored, signed, unsigned,
};
use crate::maps::{HashMap, HashSet};
use crate::model::{ClientMsgId, ConversationId, DeviceId, Message, UserId};

/// Reads a [`Message`] from a row of any backend.
///
/// # Errors
/// [`StoreError::Corrupt`] when a column does not hold a valid value (an id that does not
/// parse, a negative number), naming the column.
fn message_from_row<'r, R>(row: &'r R) -> Result<Message, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    &'r str: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let text = |column: &'static str| row.try_get::<&str, _>(column);
    let kind: i64 = row.try_get("kind")?;
    let body: Vec<u8> = row.try_get("body")?;
    Ok(Message {
        id: unsigned(row.try_get("id")?, "id")?,
        conversation: parse_stored(text("conversation")?, "messages.conversation", ConversationId::parse)?,
        seq: unsigned(row.try_get("seq")?, "seq")?,
        sender: parse_stored(text("sender")?, "messages.sender", UserId::parse)?,
        sender_device: parse_stored(text("sender_device")?, "messages.sender_device", DeviceId::parse)?,
        client_msg_id: parse_stored(text("client_msg_id")?, "messages.client_msg_id", ClientMsgId::parse)?,
        kind: u32::try_from(kind).map_err(|_| StoreError::Corrupt(format!("kind {kind}")))?,
        body: body.into(),
        sent_at_ms: unsigned(row.try_get("sent_at_ms")?, "sent_at_ms")?,
    })
}

/// Outcomes of a batch insert that is committed but, on SQLite, perhaps not durable yet:
/// see [`Database::make_durable`].
#[derive(Debug)]
pub struct Committed {
    /// One outcome per message, in the order given.
    pub results: Vec<Result<Inserted, StoreError>>,
    /// The commit to make durable before any outcome is reported.
    sync: Option<u64>,
}

impl Committed {
    /// `count` rows that were not stored because the database did not answer (`why`).
    pub fn failed(count: usize, why: &str) -> Self {
        Self { results: (0..count).map(|_| Err(StoreError::Unavailable(why.to_owned()))).collect(), sync: None }
    }

    /// Whether the outcomes may be reported only after [`Database::make_durable`].
    pub fn needs_sync(&self) -> bool {
        self.sync.is_some()
    }
}

/// The newest commit among `batches` still to be made durable.
fn last_commit(batches: &[Committed]) -> Option<u64> {
    batches.iter().filter_map(|batch| batch.sync).max()
}

/// Each batch's outcomes once its commit was (`Ok`) or could not be (`Err`) made durable.
fn outcomes(batches: Vec<Committed>, synced: Result<(), SyncFailure>) -> Vec<Vec<Result<Inserted, StoreError>>> {
    batches
        .into_iter()
        .map(|batch| match &synced {
            Ok(()) => batch.results,
            Err(failure) => batch
                .results
                .into_iter()
                .map(|result| result.and_then(|_| Err(StoreError::Sync(failure.clone()))))
                .collect(),
        })
        .collect()
}

impl Database {
    /// Inserts `messages` in one transaction (on SQLite a batch of up to 256 is one
    /// statement, its id marks raised just before), and says for each whether it was stored or
    /// was a duplicate. When this returns, every `Inserted::New` is durable. The server
    /// inserts through the [`GroupCommitter`](super::GroupCommitter) instead, which batches
    /// concurrent sends and overlaps durability with the next batch.
    ///
    /// If the statement as a whole fails, each message is retried on its own, so one bad row
    /// cannot fail the others that shared its batch.
    ///
    /// A per-row [`StoreError::Conflict`] means the row's seq or id was already taken by a
    /// different message, [`StoreError::Fenced`] (only from
    /// [`insert_submissions`](Self::insert_submissions)) that the conversation changed owner
    /// since its seq was leased; any other per-row error is transient (the database failed).
    pub async fn insert_messages(&self, messages: &[Message]) -> Vec<Result<Inserted, StoreError>> {
        let unfenced: Vec<Submission> = messages.iter().cloned().map(Submission::from).collect();
        self.insert_submissions(&unfenced).await
    }

    /// As [`insert_messages`](Self::insert_messages), for messages that may carry a fence: a
    /// fenced message whose conversation is owned under another fence by now is not stored
    /// and answers [`StoreError::Fenced`] (server backends only). The id marks are raised
    /// in the rows of the group committer's first writer.
    pub async fn insert_submissions(&self, batch: &[Submission]) -> Vec<Result<Inserted, StoreError>> {
        let committed = self.insert_messages_committed(batch, 0).await;
        self.make_durable(vec![committed]).await.pop().unwrap_or_default()
    }

    /// As [`insert_submissions`](Self::insert_submissions), but returns once committed: on
    /// SQLite the commit is not durable until [`make_durable`](Self::make_durable) says so,
    /// which the group committer does off its writer's path. The same commit raises the
    /// id high-water marks of the nodes that issued the batch's ids, in the rows of
    /// `writer` (the committer's writer that commits it: see [`super::id_marks`]).
    pub async fn insert_messages_committed(&self, batch: &[Submission], writer: u32) -> Committed {
        match self.insert_batch(batch, writer).await {
            Ok(committed) => committed,
            Err(error) if batch.len() == 1 => Committed { results: vec![Err(error)], sync: None },
            Err(error) => {
                tracing::warn!(%error, rows = batch.len(), "batch insert failed; retrying rows one by one");
                let mut all = Committed { results: Vec::with_capacity(batch.len()), sync: None };
                for submission in batch {
                    all.results.push(match self.insert_batch(std::slice::from_ref(submission), writer).await {
                        Ok(mut one) => {
                            all.sync = all.sync.max(one.sync);
                            one.results.pop().unwrap_or(Err(StoreError::Closed))
                        }
                        Err(error) => Err(error),
                    });
                }
                all
            }
        }
    }

    /// Makes the commits of `batches` durable (one fsync covers them all) and returns their
    /// outcomes. Should that fail, no row is reported stored: each would-be success becomes
    /// [`StoreError::Sync`] (a retry then finds the row, or stores it).
    pub async fn make_durable(&self, batches: Vec<Committed>) -> Vec<Vec<Result<Inserted, StoreError>>> {
        let synced = match (&self.wal, last_commit(&batches)) {
            (Some(wal), Some(last)) => wal.sync(last).await,
            _ => Ok(()),
        };
        outcomes(batches, synced)
    }

    /// As [`make_durable`](Self::make_durable), with the fsync on the caller's thread, which
    /// it may block (see [`WalSync::sync_here`](super::wal_sync::WalSync::sync_here)).
    pub fn make_durable_here(&self, batches: Vec<Committed>) -> Vec<Vec<Result<Inserted, StoreError>>> {
        let synced = match (&self.wal, last_commit(&batches)) {
            (Some(wal), Some(last)) => wal.sync_here(last),
            _ => Ok(()),
        };
        outcomes(batches, synced)
    }

    async fn insert_batch(&self, batch: &[Submission], writer: u32) -> Result<Committed, StoreError> {
        if batch.is_empty() {
            return Ok(Committed { results: Vec::new(), sync: None });
        }
        let Written { inserted, mut fenced, sync } = match &self.writer {
            // One statement, one round trip (see `postgres::insert_batch`).
            Pool::Postgres(pool) => super::postgres::insert_batch(pool, batch, writer).await?,
            // Two hand-offs to SQLite's connection thread rather than four (see
            // `sqlite::insert_batch`).
            Pool::Sqlite(pool) if batch.len() <= ROWS_PER_STATEMENT => {
                super::sqlite::insert_batch(pool, batch, writer, self.wal.as_ref(), &self.raised_marks).await?
            }
            _ => self.insert_batch_in_transaction(batch, writer).await?,
        };

        let mut results = Vec::with_capacity(batch.len());
        for (at, Submission { message: m, fence }) in batch.iter().enumerate() {
            if let (Some(owner), Some(fence)) = (fenced.remove(&at), *fence) {
                let (id, seq, conversation) = (m.id, m.seq, m.conversation.clone());
                results.push(Err(StoreError::Fenced { id, seq, conversation, fence, owner }));
                continue;
            }
            if inserted.contains(&signed(m.id)) {
                results.push(Ok(Inserted::New { id: m.id, seq: m.seq }));
                continue;
            }
            // Not settled: the original may be in this very commit, and the caller hears of
            // it only once the commit is durable anyway.
            results.push(match self.find_by_client_id(&m.sender, &m.client_msg_id).await? {
                Some(original) => {
                    Ok(Inserted::Duplicate { id: original.id, seq: original.seq, conversation: original.conversation })
                }
                None => Err(StoreError::Conflict { id: m.id }),
            });
        }
        Ok(Committed { results, sync })
    }

    /// The batch in one explicit transaction: the owners' lock, the inserts, the id marks,
    /// the commit.
    async fn insert_batch_in_transaction<'m>(
        &self,
        batch: &'m [Submission],
        writer: u32,
    ) -> Result<Written, StoreError> {
        let marks = self.raised_marks.to_raise(&marks_of(batch.iter().map(|submission| submission.message.id), writer));
        // One transaction for the whole batch (one commit, one fsync), split into
        // statements small enough for every driver's limit on bound parameters.
        let mut inserted: HashSet<i64> = HashSet::with_capacity_and_hasher(batch.len(), Default::default());
        // Rows in (conversation, seq) order: each conversation's index entries then go in
        // one after another, onto pages just touched, instead of jumping between them; and
        // concurrent batches take row locks in one order (no deadlock between writers).
        let mut rows: Vec<(usize, &'m Submission)> = batch.iter().enumerate().collect();
        rows.sort_unstable_by(|(_, a), (_, b)| {
            (a.message.conversation.as_str(), a.message.seq).cmp(&(b.message.conversation.as_str(), b.message.seq))
        });
        // Rows refused by the fence check, by their place in `batch`, with the owner found.
        let mut fenced: HashMap<usize, Option<Fence>> = HashMap::default();
        let sync = on_backend!(self.writer, |pool, sql| {
            let mut connection = pool.acquire().await?;
            let statement = |chunk: &[(usize, &'m Submission)]| {
                insert_statement(sql, chunk.iter().map(|(_, submission)| &submission.message))
            };
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            if let Some((head, tail)) = sql.lock_owners
                && rows.iter().any(|(_, row)| row.fence.is_some())
            {
                // The batch's fenced conversations, in sorted order (as `rows` is), each once.
                let mut conversations: Vec<&str> = rows
                    .iter()
                    .filter(|(_, row)| row.fence.is_some())
                    .map(|(_, row)| row.message.conversation.as_str())
                    .collect();
                conversations.dedup();
                let mut lock = QueryBuilder::new(head);
                let mut list = lock.separated(", ");
                for conversation in conversations {
                    list.push_bind(conversation);
                }
                lock.push(tail);
                let owners: Vec<(String, i64, i64)> = lock.build_query_as().fetch_all(&mut *transaction).await?;
                let owners = owners
                    .into_iter()
                    .map(|(conversation, node, epoch)| Ok((conversation, fence_of(node, epoch)?)))
                    .collect::<Result<HashMap<String, Fence>, StoreError>>()?;
                rows.retain(|&(at, row)| {
                    let Some(fence) = row.fence else { return true };
                    let owner = owners.get(row.message.conversation.as_str()).copied();
                    if owner == Some(fence) {
                        return true;
                    }
                    fenced.insert(at, owner);
                    false
                });
            }
            let chunks: Vec<&[(usize, &Submission)]> = rows.chunks(ROWS_PER_STATEMENT).collect();
            // None when the fence check refused every row: nothing to insert.
            let mut next_insert = chunks.first().map(|chunk| statement(chunk));
            for (n, &chunk) in chunks.iter().enumerate() {
                let Some(mut insert) = next_insert.take() else { break };
                // The next statement is built while the database runs this one: `join` polls
                // the execution first (which hands the statement over), then builds.
                let execute = insert.build().execute(&mut *transaction);
                let (done, next) =
                    futures_util::future::join(execute, async { chunks.get(n + 1).map(|c| statement(c)) }).await;
                let done = done?;
                next_insert = next;
                if sql.insert_count_is_exact && done.rows_affected() == chunk.len() as u64 {
                    inserted.extend(chunk.iter().map(|(_, row)| signed(row.message.id)));
                } else {
                    // Some rows were skipped (or the driver cannot say how many were
                    // inserted): read back which of our ids are there.
                    let mut read_back = stored_ids(chunk.iter().map(|(_, row)| row.message.id));
                    inserted.extend(read_back.build_query_scalar::<i64>().fetch_all(&mut *transaction).await?);
                }
            }
            // Last before the commit, so the mark's row is locked no longer than it takes.
            if !marks.is_empty() {
                raise_statement(sql, &marks).build().execute(&mut *transaction).await?;
            }
            let sync = self.wal.as_ref().map(|wal| wal.announce());
            let commit = transaction.commit().await;
            if let (Some(wal), Some(number)) = (&self.wal, sync) {
                wal.finished(number, commit.is_err()).await;
            }
            commit?;
            self.raised_marks.committed(&marks);
            sync
        });
        Ok(Written { inserted, fenced, sync })
    }

    /// Waits until every message commit a read that just finished could have seen is
    /// durable (SQLite only; see [`super::wal_sync`]).
    async fn settle(&self) -> Result<(), StoreError> {
        match &self.wal {
            Some(wal) => wal.settle().await,
            None => Ok(()),
        }
    }

    /// The message `sender` sent with `client_msg_id`, if stored: the original a duplicate
    /// insert answers with. Not settled (see [`insert_batch`](Self::insert_batch)).
    async fn find_by_client_id(
        &self,
        sender: &UserId,
        client_msg_id: &ClientMsgId,
    ) -> Result<Option<Message>, StoreError> {
        on_backend!(self.reader, |pool, sql| {
            let row = sqlx::query(sql.message_by_client_id)
                .bind(sender.as_str())
                .bind(client_msg_id.as_str())
                .fetch_optional(pool)
                .await?;
            row.as_ref().map(message_from_row).transpose()
        })
    }
}

#[async_trait]
impl MessageStore for Database {
    async fn messages_after(
        &self,
        conversation: &ConversationId,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<Message>, StoreError> {
        let messages = on_backend!(self.reader, |pool, sql| {
            let rows = sqlx::query(sql.messages_after)
                .bind(conversation.as_str())
                .bind(signed(after_seq))
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(message_from_row).collect::<Result<Vec<_>, _>>()?
        });
        self.settle().await?;
        Ok(messages)
    }

    async fn messages_before(
        &self,
        conversation: &ConversationId,
        before_seq: u64,
        limit: u32,
    ) -> Result<Vec<Message>, StoreError> {
        let before = if before_seq == 0 { i64::MAX } else { signed(before_seq) };
        // Fetched newest first, so the limit keeps the newest; returned oldest first.
        let mut messages: Vec<Message> = on_backend!(self.reader, |pool, sql| {
            let rows = sqlx::query(sql.messages_before)
                .bind(conversation.as_str())
                .bind(before)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(message_from_row).collect::<Result<_, _>>()?
        });
        messages.reverse();
        self.settle().await?;
        Ok(messages)
    }

    async fn latest_seq(&self, conversation: &ConversationId) -> Result<u64, StoreError> {
        let latest: Option<i64> = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.latest_seq).bind(conversation.as_str()).fetch_one(pool).await?
        });
        self.settle().await?;
        latest.map_or(Ok(0), |seq| unsigned(seq, "seq"))
    }

    async fn changed_since(&self, since_id: u64) -> Result<Vec<(ConversationId, SeqSpan)>, StoreError> {
        let rows: Vec<(String, i64, i64)> = on_backend!(self.reader, |pool, sql| {
            sqlx::query_as(sql.changed_since).bind(signed(since_id)).fetch_all(pool).await?
        });
        self.settle().await?;
        rows.into_iter()
            .map(|(conversation, lowest, highest)| {
                let span = SeqSpan { lowest: unsigned(lowest, "seq")?, highest: unsigned(highest, "seq")? };
                Ok((parse_stored(&conversation, "conversation", ConversationId::parse)?, span))
            })
            .collect()
    }

    async fn message_by_client_id(
        &self,
        sender: &UserId,
        client_msg_id: &ClientMsgId,
    ) -> Result<Option<Message>, StoreError> {
        let message = self.find_by_client_id(sender, client_msg_id).await?;
        self.settle().await?;
        Ok(message)
    }
}
