//! Which direct conversations a user takes part in (groups are in `group_members`), so a
//! device can be backfilled on conversations it has never acked.

use async_trait::async_trait;

use super::{ConversationStore, Database, StoreError, on_backend, parse_each};
use crate::model::{ConversationId, UserId};

#[async_trait]
impl ConversationStore for Database {
    async fn add_user_conversation(&self, users: &[&UserId], conversation: &ConversationId) -> Result<(), StoreError> {
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

    async fn user_conversations(&self, user: &UserId) -> Result<Vec<ConversationId>, StoreError> {
        let conversations = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.user_conversations).bind(user.as_str()).fetch_all(pool).await?
        });
        Ok(parse_each(conversations, "user_conversations.conversation", ConversationId::parse))
    }
}
