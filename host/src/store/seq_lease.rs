//! Segment leases for the seq allocator, from the `session_seq` table.
//!
//! One transaction moves the conversation's `max_seq` up by the step; the range between the
//! old and new value belongs to the caller alone. Because `max_seq` only ever grows and is
//! committed before any seq of the range is used, a crash can waste seqs but never reissue one.

use async_trait::async_trait;

use super::{Database, StoreError, on_backend, signed, unsigned};
use crate::ids::{LeaseError, SegmentLeaser, SeqRange};
use crate::model::ConversationId;

impl Database {
    /// Leases the next `step` seqs of `conversation`.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the transaction fails; nothing was leased.
    pub async fn lease_seqs(&self, conversation: &ConversationId, step: u64) -> Result<SeqRange, StoreError> {
        let high: i64 = on_backend!(self.writer, |pool, sql| {
            match sql.lease_select {
                Some(select) => {
                    let mut transaction = pool.begin().await?;
                    sqlx::query(sql.lease_upsert)
                        .bind(conversation.as_str())
                        .bind(signed(step))
                        .execute(&mut *transaction)
                        .await?;
                    let high =
                        sqlx::query_scalar(select).bind(conversation.as_str()).fetch_one(&mut *transaction).await?;
                    transaction.commit().await?;
                    high
                }
                None => {
                    sqlx::query_scalar(sql.lease_upsert)
                        .bind(conversation.as_str())
                        .bind(signed(step))
                        .fetch_one(pool)
                        .await?
                }
            }
        });
        let last = unsigned(high, "max_seq")?;
        Ok(SeqRange { first: last + 1 - step, last })
    }
}

#[async_trait]
impl SegmentLeaser for Database {
    async fn lease(&self, conversation: &ConversationId, step: u64) -> Result<SeqRange, LeaseError> {
        self.lease_seqs(conversation, step)
            .await
            .map_err(|error| LeaseError { conversation: conversation.to_string(), reason: error.to_string() })
    }
}
