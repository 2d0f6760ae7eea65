//! `route_info`: the durable fallback of the route table (design note 002) — which node
//! holds each connected device, readable when the in-memory or Redis table is cold.

use super::{Database, StoreError, on_backend, signed, unsigned};
use crate::model::{DeviceId, UserId};

/// Where one device of a user is connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub user: String,
    pub device: String,
    /// The gateway node holding the connection.
    pub node_id: u32,
    /// The connection on that node, so a stale disconnect cannot remove a newer route.
    pub connection_id: String,
    pub connected_at_ms: u64,
}

impl Database {
    /// Records that `user`'s `device` is connected through `connection_id` on `node_id`,
    /// replacing any older route of that device.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    pub async fn upsert_route(
        &self,
        user: &UserId,
        device: &DeviceId,
        node_id: u32,
        connection_id: &str,
        connected_at_ms: u64,
    ) -> Result<(), StoreError> {
        on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.upsert_route)
                .bind(user.as_str())
                .bind(device.as_str())
                .bind(i64::from(node_id))
                .bind(connection_id)
                .bind(signed(connected_at_ms))
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// Removes the route of `device` if it is still `connection_id` (a newer connection of
    /// the same device keeps its route). Returns whether a route was removed.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    pub async fn remove_route(
        &self,
        user: &UserId,
        device: &DeviceId,
        connection_id: &str,
    ) -> Result<bool, StoreError> {
        let done = on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.remove_route)
                .bind(user.as_str())
                .bind(device.as_str())
                .bind(connection_id)
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(done > 0)
    }

    /// Every route of `user`, by device.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    pub async fn routes_of(&self, user: &UserId) -> Result<Vec<RouteInfo>, StoreError> {
        let rows: Vec<(String, String, i64, String, i64)> = on_backend!(self.reader, |pool, sql| {
            sqlx::query_as(sql.routes_of_user).bind(user.as_str()).fetch_all(pool).await?
        });
        rows.into_iter()
            .map(|(user, device, node_id, connection_id, connected_at_ms)| {
                Ok(RouteInfo {
                    user,
                    device,
                    node_id: u32::try_from(node_id).map_err(|_| StoreError::Corrupt(format!("node_id {node_id}")))?,
                    connection_id,
                    connected_at_ms: unsigned(connected_at_ms, "connected_at_ms")?,
                })
            })
            .collect()
    }

    /// Removes every route held by `node_id` (its gateway died). Returns how many.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the write fails.
    pub async fn drop_node_routes(&self, node_id: u32) -> Result<u64, StoreError> {
        Ok(on_backend!(self.writer, |pool, sql| {
            sqlx::query(sql.drop_node_routes).bind(i64::from(node_id)).execute(pool).await?.rows_affected()
        }))
    }
}
