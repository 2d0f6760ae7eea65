//! Which direct conversations a user takes part in (groups are in `group_members`), so a
//! device can be backfilled on conversations it has never acked.

use super::{Database, StoreError, on_backend};
use crate::model::{ConversationId, UserId};

impl Database {
    /// Records that each of `users` takes part in `conversation`; repeating it is harmless.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    pub async fn add_user_conversation(
        &self,
        users: &[&UserId],
        conversation: &ConversationId,
    ) -> Result<(), StoreError> {
        on_backend!(self.writer, |pool, sql| {
            let mut transaction = pool.begin().await?;
            for user in users {
                sqlx::query(sql.add_user_conversation)
                    .bind(user.as_str())
                    .bind(conversation.as_str())
                    .execute(&mut *transaction)
                    .await?;
            }
            transaction.commit().await?;
        });
        Ok(())
    }

    /// The direct conversations `user` takes part in.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn user_conversations(&self, user: &UserId) -> Result<Vec<String>, StoreError> {
        Ok(on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.user_conversations).bind(user.as_str()).fetch_all(pool).await?
        }))
    }
}
