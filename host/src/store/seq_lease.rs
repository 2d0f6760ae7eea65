//! Segment leases for the seq allocator, from the `session_seq` table.
//!
//! One transaction moves the conversation's `max_seq` up by the step; the range between the
//! old and new value belongs to the caller alone. Because `max_seq` only ever grows and is
//! committed before any seq of the range is used, a crash can waste seqs but never reissue one.

use async_trait::async_trait;

use super::{Database, StoreError, on_backend, signed, unsigned};
use crate::model::ConversationId;

/// An inclusive range of seqs reserved for one allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRange {
    /// The first seq of the range.
    pub first: u64,
    /// The last seq of the range (inclusive).
    pub last: u64,
}

/// A lease could not be taken from the database.
#[derive(Debug, thiserror::Error)]
#[error("could not lease seqs for {conversation}: {reason}")]
pub struct LeaseError {
    /// The conversation whose segment was wanted.
    pub conversation: String,
    /// What the database said.
    pub reason: String,
}

/// Where the seq allocator's segments come from: the `session_seq` table of whichever
/// backend is configured, shared by every node.
#[async_trait]
pub trait SeqLeases: Send + Sync + 'static {
    /// Atomically moves `conversation`'s high-water mark up by `step` and returns the range
    /// in between, which no other caller, on any node, can ever be given.
    ///
    /// # Errors
    /// [`LeaseError`] when the database cannot be reached or the transaction fails; nothing
    /// was leased.
    async fn lease(&self, conversation: &ConversationId, step: u64) -> Result<SeqRange, LeaseError>;
}

#[async_trait]
impl SeqLeases for Database {
    async fn lease(&self, conversation: &ConversationId, step: u64) -> Result<SeqRange, LeaseError> {
        self.lease_range(conversation, step)
            .await
            .map_err(|error| LeaseError { conversation: conversation.to_string(), reason: error.to_string() })
    }
}

impl Database {
    /// The lease itself, in the store's own error type.
    async fn lease_range(&self, conversation: &ConversationId, step: u64) -> Result<SeqRange, StoreError> {
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
