//! The message repository: batched inserts that report duplicates, and reads by seq.
//!
//! A message is stored once per (sender, client_msg_id): a second insert of the same pair
//! stores nothing and answers with the original row's ids. The unique index is the final
//! guard; the pipeline's dedup mark only spares the database the work.

use std::collections::HashSet;

use sqlx::{ColumnIndex, Decode, QueryBuilder, Row, Type};

use super::{Database, ROWS_PER_STATEMENT, StoreError, on_backend, signed, unsigned};
use crate::model::{ClientMsgId, ConversationId, DeviceId, UserId};

/// A message ready to be stored: ids allocated, content validated.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Snowflake id.
    pub id: u64,
    pub conversation: ConversationId,
    /// Seq within the conversation, from the segment allocator.
    pub seq: u64,
    pub sender: UserId,
    pub sender_device: DeviceId,
    /// The sender's idempotency key.
    pub client_msg_id: ClientMsgId,
    /// Application-defined kind.
    pub kind: u32,
    pub body: Vec<u8>,
    /// Wall time the owner accepted it, in ms since the Unix epoch.
    pub sent_at_ms: u64,
}

/// A message as read back from storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub id: u64,
    pub conversation: String,
    pub seq: u64,
    pub sender: String,
    pub sender_device: String,
    pub client_msg_id: String,
    pub kind: u32,
    pub body: Vec<u8>,
    pub sent_at_ms: u64,
}

/// What an insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// Stored now, durably, with the ids it was given.
    New { id: u64, seq: u64 },
    /// The (sender, client_msg_id) pair was stored before: nothing was written, and these
    /// are the original message's ids.
    Duplicate { id: u64, seq: u64, conversation: String },
}

/// Reads a [`StoredMessage`] from a row of any backend.
fn message_from_row<'r, R>(row: &'r R) -> Result<StoredMessage, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let kind: i64 = row.try_get("kind")?;
    Ok(StoredMessage {
        id: unsigned(row.try_get("id")?, "id")?,
        conversation: row.try_get("conversation")?,
        seq: unsigned(row.try_get("seq")?, "seq")?,
        sender: row.try_get("sender")?,
        sender_device: row.try_get("sender_device")?,
        client_msg_id: row.try_get("client_msg_id")?,
        kind: u32::try_from(kind).map_err(|_| StoreError::Corrupt(format!("kind {kind}")))?,
        body: row.try_get("body")?,
        sent_at_ms: unsigned(row.try_get("sent_at_ms")?, "sent_at_ms")?,
    })
}

impl Database {
    /// Inserts `messages` with one statement (one transaction), and says for each whether
    /// it was stored or was a duplicate. When this returns, every `Inserted::New` is durable.
    ///
    /// If the statement as a whole fails, each message is retried on its own, so one bad row
    /// cannot fail the others that shared its batch.
    ///
    /// A per-row [`StoreError::Conflict`] means the row's seq or id was already taken by a
    /// different message; any other per-row error is transient (the database failed).
    pub async fn insert_messages(
        &self,
        messages: &[NewMessage],
    ) -> Vec<Result<Inserted, StoreError>> {
        match self.insert_batch(messages).await {
            Ok(results) => results,
            Err(error) if messages.len() == 1 => vec![Err(error)],
            Err(error) => {
                tracing::warn!(%error, rows = messages.len(), "batch insert failed; retrying rows one by one");
                let mut results = Vec::with_capacity(messages.len());
                for message in messages {
                    results.push(match self.insert_batch(std::slice::from_ref(message)).await {
                        Ok(mut one) => one.pop().unwrap_or(Err(StoreError::Closed)),
                        Err(error) => Err(error),
                    });
                }
                results
            }
        }
    }

    async fn insert_batch(
        &self,
        messages: &[NewMessage],
    ) -> Result<Vec<Result<Inserted, StoreError>>, StoreError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        // One transaction for the whole batch (one commit, one fsync), split into
        // statements small enough for every driver's limit on bound parameters.
        let mut inserted: HashSet<i64> = HashSet::with_capacity(messages.len());
        // Rows in (conversation, seq) order: each conversation's index entries then go in
        // one after another, onto pages just touched, instead of jumping between them; and
        // concurrent batches take row locks in one order (no deadlock between writers).
        let mut rows: Vec<&NewMessage> = messages.iter().collect();
        rows.sort_unstable_by(|a, b| (a.conversation.as_str(), a.seq).cmp(&(b.conversation.as_str(), b.seq)));
        on_backend!(self.writer, |pool, sql| {
            let mut connection = pool.acquire().await?;
            let durable = self.durable_commits.then_some(()).and(sql.durable_commit_on.zip(sql.durable_commit_off));
            if let Some((on, _)) = durable {
                sqlx::query(on).execute(&mut *connection).await?;
            }
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            for chunk in rows.chunks(ROWS_PER_STATEMENT) {
                let mut insert = QueryBuilder::new(sql.insert_messages);
                insert.push_values(chunk, |mut row, m| {
                    row.push_bind(signed(m.id))
                        .push_bind(m.conversation.as_str())
                        .push_bind(signed(m.seq))
                        .push_bind(m.sender.as_str())
                        .push_bind(m.sender_device.as_str())
                        .push_bind(m.client_msg_id.as_str())
                        .push_bind(i64::from(m.kind))
                        .push_bind(m.body.as_slice())
                        .push_bind(signed(m.sent_at_ms));
                });
                insert.push(sql.insert_messages_tail);
                let done = insert.build().execute(&mut *transaction).await?;
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
            transaction.commit().await?;
            if let Some((_, off)) = durable {
                sqlx::query(off).execute(&mut *connection).await?;
            }
        });

        let mut results = Vec::with_capacity(messages.len());
        for m in messages {
            if inserted.contains(&signed(m.id)) {
                results.push(Ok(Inserted::New { id: m.id, seq: m.seq }));
                continue;
            }
            results.push(match self.message_by_client_id(&m.sender, &m.client_msg_id).await? {
                Some(original) => Ok(Inserted::Duplicate {
                    id: original.id,
                    seq: original.seq,
                    conversation: original.conversation,
                }),
                None => Err(StoreError::Conflict { id: m.id }),
            });
        }
        Ok(results)
    }

    /// The message `sender` sent with `client_msg_id`, if stored.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn message_by_client_id(
        &self,
        sender: &UserId,
        client_msg_id: &ClientMsgId,
    ) -> Result<Option<StoredMessage>, StoreError> {
        on_backend!(self.reader, |pool, sql| {
            let row = sqlx::query(sql.message_by_client_id)
                .bind(sender.as_str())
                .bind(client_msg_id.as_str())
                .fetch_optional(pool)
                .await?;
            row.as_ref().map(message_from_row).transpose()
        })
    }

    /// Up to `limit` messages of `conversation` with seq > `after_seq`, ascending.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn messages_after(
        &self,
        conversation: &ConversationId,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        on_backend!(self.reader, |pool, sql| {
            let rows = sqlx::query(sql.messages_after)
                .bind(conversation.as_str())
                .bind(signed(after_seq))
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(message_from_row).collect()
        })
    }

    /// Up to `limit` messages of `conversation` with seq < `before_seq`, newest of those
    /// first is what is fetched, returned in ascending seq order. `before_seq == 0` means
    /// "the latest".
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn messages_before(
        &self,
        conversation: &ConversationId,
        before_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let before = if before_seq == 0 { i64::MAX } else { signed(before_seq) };
        let mut messages: Vec<StoredMessage> = on_backend!(self.reader, |pool, sql| {
            let rows = sqlx::query(sql.messages_before)
                .bind(conversation.as_str())
                .bind(before)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(message_from_row).collect::<Result<_, _>>()?
        });
        messages.reverse();
        Ok(messages)
    }

    /// The highest stored seq of `conversation`, or 0 when it has no messages.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn latest_seq(&self, conversation: &ConversationId) -> Result<u64, StoreError> {
        let latest: Option<i64> = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.latest_seq).bind(conversation.as_str()).fetch_one(pool).await?
        });
        latest.map_or(Ok(0), |seq| unsigned(seq, "seq"))
    }
}
