//! Device cursors: how far each device has acknowledged each conversation.
//!
//! A cursor only moves forward: writing an older seq than the stored one changes nothing, so
//! acks that arrive out of order (or are replayed) are harmless. Writes come in batches —
//! the delivery layer coalesces acks and flushes them together, never one transaction per ack.

use async_trait::async_trait;
use sqlx::QueryBuilder;

use super::{
    CursorStore, CursorUpdate, Database, ROWS_PER_STATEMENT, StoreError, on_backend, parse_stored, signed, unsigned,
};
use crate::maps::HashMap;
use crate::model::{ConversationId, DeviceId, UserId};

#[async_trait]
impl CursorStore for Database {
    async fn advance_cursors(&self, updates: &[CursorUpdate]) -> Result<(), StoreError> {
        // All in one transaction, in statements of at most `ROWS_PER_STATEMENT` rows: a flush
        // after a burst of acks can hold more cursors than one statement may bind.
        // One row per key (the highest seq), since a statement may not touch a row twice.
        let mut highest: HashMap<(&str, &str, &str), u64> =
            HashMap::with_capacity_and_hasher(updates.len(), Default::default());
        for u in updates {
            let seq = highest.entry((u.user.as_str(), u.device.as_str(), u.conversation.as_str())).or_default();
            *seq = (*seq).max(u.seq);
        }
        if highest.is_empty() {
            return Ok(());
        }
        // In key order: concurrent flushes then lock rows in one order (no deadlock).
        let mut rows: Vec<_> = highest.into_iter().collect();
        rows.sort_unstable();
        on_backend!(self.writer, |pool, sql| {
            let mut transaction = pool.begin().await?;
            for chunk in rows.chunks(ROWS_PER_STATEMENT) {
                let mut upsert =
                    QueryBuilder::new("INSERT INTO device_cursors (user_id, device_id, conversation, seq) ");
                upsert.push_values(chunk, |mut row, ((user, device, conversation), seq)| {
                    row.push_bind(*user).push_bind(*device).push_bind(*conversation).push_bind(signed(*seq));
                });
                upsert.push(sql.upsert_cursors_tail);
                upsert.build().execute(&mut *transaction).await?;
            }
            transaction.commit().await?;
        });
        Ok(())
    }

    async fn cursors(&self, user: &UserId, device: &DeviceId) -> Result<Vec<(ConversationId, u64)>, StoreError> {
        let rows: Vec<(String, i64)> = on_backend!(self.reader, |pool, sql| {
            sqlx::query_as(sql.cursors_of_device).bind(user.as_str()).bind(device.as_str()).fetch_all(pool).await?
        });
        let mut cursors = Vec::with_capacity(rows.len());
        for (conversation, seq) in rows {
            let seq = unsigned(seq, "seq")?;
            match parse_stored(&conversation, "device_cursors.conversation", ConversationId::parse) {
                Ok(conversation) => cursors.push((conversation, seq)),
                // One bad row must not cost the device every other cursor.
                Err(error) => tracing::warn!(%user, %device, %error, "skipping a stored cursor"),
            }
        }
        Ok(cursors)
    }
}
