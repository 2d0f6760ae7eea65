//! Groups and their members (`grp:` conversations).

use super::{Database, StoreError, on_backend, signed};
use crate::model::{GroupId, UserId};

impl Database {
    /// Creates a group with its first members, atomically.
    ///
    /// # Errors
    /// [`StoreError::GroupExists`] when the id is taken; nothing changed.
    pub async fn create_group(&self, group: &GroupId, members: &[UserId], now_ms: u64) -> Result<(), StoreError> {
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

    /// Deletes a group and its memberships. Returns whether it existed.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    pub async fn delete_group(&self, group: &GroupId) -> Result<bool, StoreError> {
        let done = on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.delete_group).bind(group.as_str()).execute(pool).await?.rows_affected()
        });
        Ok(done > 0)
    }

    /// Adds `user` to `group`; adding a member twice is not an error.
    ///
    /// # Errors
    /// [`StoreError::NoSuchGroup`] when the group does not exist.
    pub async fn add_member(&self, group: &GroupId, user: &UserId, now_ms: u64) -> Result<(), StoreError> {
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
        // A concurrent delete of the group leaves the insert without its parent row.
        result.map_err(|error| match error.as_database_error() {
            Some(db) if db.is_foreign_key_violation() => StoreError::NoSuchGroup(group.to_string()),
            _ => StoreError::Database(error),
        })
    }

    /// Removes `user` from `group`. Returns whether they were a member.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    pub async fn remove_member(&self, group: &GroupId, user: &UserId) -> Result<bool, StoreError> {
        let done = on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.remove_member).bind(group.as_str()).bind(user.as_str()).execute(pool).await?.rows_affected()
        });
        Ok(done > 0)
    }

    /// Whether `group` exists.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn group_exists(&self, group: &GroupId) -> Result<bool, StoreError> {
        let count: i64 = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.group_exists).bind(group.as_str()).fetch_one(pool).await?
        });
        Ok(count > 0)
    }

    /// The members of `group`, sorted; `None` when there is no such group.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn group_members(&self, group: &GroupId) -> Result<Option<Vec<String>>, StoreError> {
        if !self.group_exists(group).await? {
            return Ok(None);
        }
        let members = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.group_members).bind(group.as_str()).fetch_all(pool).await?
        });
        Ok(Some(members))
    }

    /// Whether `user` is a member of `group`.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn is_member(&self, group: &GroupId, user: &UserId) -> Result<bool, StoreError> {
        let count: i64 = on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.is_member).bind(group.as_str()).bind(user.as_str()).fetch_one(pool).await?
        });
        Ok(count > 0)
    }

    /// The groups `user` belongs to, sorted.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn groups_of(&self, user: &UserId) -> Result<Vec<String>, StoreError> {
        Ok(on_backend!(self.reader, |pool, sql| {
            sqlx::query_scalar(sql.groups_of_user).bind(user.as_str()).fetch_all(pool).await?
        }))
    }
}
