//! The message repository: batched inserts that report duplicates, and reads by seq.
//!
//! A message is stored once per (sender, client_msg_id): a second insert of the same pair
//! stores nothing and answers with the original row's ids. The unique index is the final
//! guard; the pipeline's dedup mark only spares the database the work.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, QueryBuilder, Row, Type};

use super::{Database, MessageStore, ROWS_PER_STATEMENT, StoreError, on_backend, parse_stored, signed, unsigned};
use crate::model::{ClientMsgId, ConversationId, DeviceId, Message, UserId};

/// What an insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// Stored now, durably, with the ids it was given.
    New { id: u64, seq: u64 },
    /// The (sender, client_msg_id) pair was stored before: nothing was written, and these
    /// are the original message's ids.
    Duplicate { id: u64, seq: u64, conversation: ConversationId },
}

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
    /// Whether the outcomes may be reported only after [`Database::make_durable`].
    pub fn needs_sync(&self) -> bool {
        self.sync.is_some()
    }
}

impl Database {
    /// Inserts `messages` in one transaction, and says for each whether it was stored or
    /// was a duplicate. When this returns, every `Inserted::New` is durable. The server
    /// inserts through the [`GroupCommitter`](super::GroupCommitter) instead, which batches
    /// concurrent sends and overlaps durability with the next batch.
    ///
    /// If the statement as a whole fails, each message is retried on its own, so one bad row
    /// cannot fail the others that shared its batch.
    ///
    /// A per-row [`StoreError::Conflict`] means the row's seq or id was already taken by a
    /// different message; any other per-row error is transient (the database failed).
    pub async fn insert_messages(&self, messages: &[Message]) -> Vec<Result<Inserted, StoreError>> {
        let committed = self.insert_messages_committed(messages).await;
        self.make_durable(vec![committed]).await.pop().unwrap_or_default()
    }

    /// As [`insert_messages`](Self::insert_messages), but returns once committed: on SQLite
    /// the commit is not durable until [`make_durable`](Self::make_durable) says so, which
    /// the group committer does off its writer's path.
    pub async fn insert_messages_committed(&self, messages: &[Message]) -> Committed {
        match self.insert_batch(messages).await {
            Ok(committed) => committed,
            Err(error) if messages.len() == 1 => Committed { results: vec![Err(error)], sync: None },
            Err(error) => {
                tracing::warn!(%error, rows = messages.len(), "batch insert failed; retrying rows one by one");
                let mut all = Committed { results: Vec::with_capacity(messages.len()), sync: None };
                for message in messages {
                    all.results.push(match self.insert_batch(std::slice::from_ref(message)).await {
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
        let last = batches.iter().filter_map(|batch| batch.sync).max();
        let (Some(wal), Some(last)) = (&self.wal, last) else {
            return batches.into_iter().map(|batch| batch.results).collect();
        };
        let synced = wal.sync(last).await;
        batches
            .into_iter()
            .map(|batch| match &synced {
                Ok(()) => batch.results,
                Err(error) => batch
                    .results
                    .into_iter()
                    .map(|result| result.and_then(|_| Err(StoreError::Sync(error.to_string()))))
                    .collect(),
            })
            .collect()
    }

    async fn insert_batch<'m>(&self, messages: &'m [Message]) -> Result<Committed, StoreError> {
        if messages.is_empty() {
            return Ok(Committed { results: Vec::new(), sync: None });
        }
        // One transaction for the whole batch (one commit, one fsync), split into
        // statements small enough for every driver's limit on bound parameters.
        let mut inserted: HashSet<i64> = HashSet::with_capacity(messages.len());
        // Rows in (conversation, seq) order: each conversation's index entries then go in
        // one after another, onto pages just touched, instead of jumping between them; and
        // concurrent batches take row locks in one order (no deadlock between writers).
        let mut rows: Vec<&'m Message> = messages.iter().collect();
        rows.sort_unstable_by(|a, b| (a.conversation.as_str(), a.seq).cmp(&(b.conversation.as_str(), b.seq)));
        let sync = on_backend!(self.writer, |pool, sql| {
            let mut connection = pool.acquire().await?;
            let statement = |chunk: &[&'m Message]| {
                let mut insert = QueryBuilder::new(sql.insert_messages);
                insert.push_values(chunk, |mut row, m| {
                    row.push_bind(signed(m.id))
                        .push_bind(m.conversation.as_str())
                        .push_bind(signed(m.seq))
                        .push_bind(m.sender.as_str())
                        .push_bind(m.sender_device.as_str())
                        .push_bind(m.client_msg_id.as_str())
                        .push_bind(i64::from(m.kind))
                        .push_bind(m.body.as_ref())
                        .push_bind(signed(m.sent_at_ms));
                });
                insert.push(sql.insert_messages_tail);
                insert
            };
            let chunks: Vec<&[&Message]> = rows.chunks(ROWS_PER_STATEMENT).collect();
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let mut insert = statement(chunks.first().copied().unwrap_or_default());
            for (n, &chunk) in chunks.iter().enumerate() {
                // The next statement is built while the database runs this one: `join` polls
                // the execution first (which hands the statement over), then builds.
                let execute = insert.build().execute(&mut *transaction);
                let (done, next) =
                    futures_util::future::join(execute, async { chunks.get(n + 1).map(|c| statement(c)) }).await;
                let done = done?;
                if let Some(next) = next {
                    insert = next;
                }
                if sql.insert_count_is_exact && done.rows_affected() == chunk.len() as u64 {
                    inserted.extend(chunk.iter().map(|m| signed(m.id)));
                } else {
                    // Some rows were skipped (or the driver cannot say how many were
                    // inserted): read back which of our ids are there.
                    let mut read_back = QueryBuilder::new("SELECT id FROM messages WHERE id IN (");
                    let mut ids = read_back.separated(", ");
                    for m in chunk {
                        ids.push_bind(signed(m.id));
                    }
                    read_back.push(")");
                    inserted.extend(read_back.build_query_scalar::<i64>().fetch_all(&mut *transaction).await?);
                }
            }
            let sync = self.wal.as_ref().map(|wal| wal.announce());
            let commit = transaction.commit().await;
            if let (Some(wal), Some(number)) = (&self.wal, sync) {
                wal.returned(number);
                if commit.is_err() {
                    // Nothing of it is visible, but readers that saw its number wait for it
                    // to be durable, and no later commit may come to cover it.
                    let _ = wal.sync(number).await;
                }
            }
            commit?;
            sync
        });

        let mut results = Vec::with_capacity(messages.len());
        for m in messages {
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
}
