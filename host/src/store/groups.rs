//! Groups and their members (`grp:` conversations).

use async_trait::async_trait;

use super::{Database, GroupStore, StoreError, on_backend, parse_each, signed};
use crate::model::{GroupId, UserId};

#[async_trait]
impl GroupStore for Database {
    async fn create_group(&self, group: &GroupId, members: &[UserId], now_ms: u64) -> Result<(), StoreError> {
        let result: Result<(), sqlx::Error> = on_backend!(self.writer, |pool, sql| {
            async {
                let mut transaction = pool.begin().await?;
                sqlx::query(sql.insert_group)
                    .bind(group.as_str())
                    .bind(signed(now_ms))
                    .execute(&mut *transaction)
                    .await?;
                for member in members {
                    sqlx::query(sql.add_member)
                        .bind(group.as_str())
                        .bind(member.as_str())
                        .bind(signed(now_ms))
                        .execute(&mut *transaction)
                        .await?;
                }
                transaction.commit().await
            }
            .await
        });
        result.map_err(|error| match error.as_database_error() {
            Some(db) if db.is_unique_violation() => StoreError::GroupExists(group.to_string()),
            _ => StoreError::Database(error),
        })
    }

    async fn add_member(&self, group: &GroupId, user: &UserId, now_ms: u64) -> Result<(), StoreError> {
        if !self.group_exists(group).await? {
            return Err(StoreError::NoSuchGroup(group.to_string()));
        }
        let result = on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.add_member)
                .bind(group.as_str())
                .bind(user.as_str())
                .bind(signed(now_ms))
                .execute(pool)
                .await
                .map(|_| ())
        });
        // A group removed between the check and the insert leaves it without its parent row.
        result.map_err(|error| match error.as_database_error() {
            Some(db) if db.is_foreign_key_violation() => StoreError::NoSuchGroup(group.to_string()),
            _ => StoreError::Database(error),
        })
    }

    async fn remove_member(&self, group: &GroupId, user: &UserId) -> Result<bool, StoreError> {
        let done = on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.remove_member).bind(group.as_str()).bind(user.as_str()).execute(pool).await?.rows_affected()
        });
        Ok(done > 0)
    }

    async fn group_members(&self, group: &GroupId) -> Result<Option<Vec<UserId>>, StoreError> {
        if !self.group_exists(group).await? {
            return Ok(None);
        }
        let members = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.group_members).bind(group.as_str()).fetch_all(pool).await?
        });
        Ok(Some(parse_each(members, "group_members.user_id", UserId::parse)))
    }

    async fn groups_of(&self, user: &UserId) -> Result<Vec<GroupId>, StoreError> {
        let groups = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.groups_of_user).bind(user.as_str()).fetch_all(pool).await?
        });
        Ok(parse_each(groups, "group_members.group_id", GroupId::parse))
    }
}

impl Database {
    /// Whether `group` exists: a group with no members left still does.
    async fn group_exists(&self, group: &GroupId) -> Result<bool, StoreError> {
        let count: i64 = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.group_exists).bind(group.as_str()).fetch_one(pool).await?
        });
        Ok(count > 0)
    }
}
