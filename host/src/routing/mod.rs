//! Who is connected where: the route table (user → device → node and connection) and the
//! room subscriptions of this node.
//!
//! The route table is a trait so that embedded mode keeps it in this process and cluster
//! mode in Redis (ARCHITECTURE.md §5), with the same three lookups: log a device in (and
//! learn which older connection it replaces, to kick it), list a user's devices, and drop
//! every route of a gateway that died.

pub mod ring;
pub mod rooms;

use std::collections::HashMap;

use async_trait::async_trait;
use dashmap::DashMap;

use crate::model::{DeviceId, UserId};

/// A connection's id, unique on its node for the life of the process.
pub type ConnectionId = u64;

/// Where one device of a user is connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub user: UserId,
    pub device: DeviceId,
    /// The gateway node holding the connection.
    pub node: u32,
    /// The connection on that node.
    pub connection: ConnectionId,
    /// When it connected, ms since the Unix epoch.
    pub connected_at_ms: u64,
}

/// A route table could not be read or written (cluster mode: Redis is down).
#[derive(Debug, thiserror::Error)]
#[error("route table unavailable: {0}")]
pub struct RouteError(pub String);

/// Where connected devices are. Embedded: a map in this process. Cluster: Redis hashes
/// shared by every node.
#[async_trait]
pub trait RouteTable: Send + Sync + 'static {
    /// Records `route`; returns the route it replaced (the same user and device on another
    /// connection), which the caller kicks.
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError>;
    /// Removes the route of `user`'s `device` if it is still `connection`.
    async fn logout(&self, user: &UserId, device: &DeviceId, connection: ConnectionId) -> Result<bool, RouteError>;
    /// Every connected device of `user`.
    async fn devices(&self, user: &UserId) -> Result<Vec<Route>, RouteError>;
    /// Removes every route held by `node` (its gateway died); returns how many.
    async fn drop_gateway(&self, node: u32) -> Result<usize, RouteError>;
}

/// The embedded route table: a concurrent map in this process.
#[derive(Default)]
pub struct MemoryRouteTable {
    users: DashMap<UserId, HashMap<DeviceId, Route>>,
}

#[async_trait]
impl RouteTable for MemoryRouteTable {
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
        let mut devices = self.users.entry(route.user.clone()).or_default();
        Ok(devices.insert(route.device.clone(), route))
    }

    async fn logout(&self, user: &UserId, device: &DeviceId, connection: ConnectionId) -> Result<bool, RouteError> {
        let Some(mut devices) = self.users.get_mut(user) else { return Ok(false) };
        let removed = match devices.get(device) {
            Some(route) if route.connection == connection => devices.remove(device).is_some(),
            _ => false,
        };
        let now_empty = devices.is_empty();
        drop(devices);
        if now_empty {
            self.users.remove_if(user, |_, devices| devices.is_empty());
        }
        Ok(removed)
    }

    async fn devices(&self, user: &UserId) -> Result<Vec<Route>, RouteError> {
        Ok(self.users.get(user).map(|devices| devices.values().cloned().collect()).unwrap_or_default())
    }

    async fn drop_gateway(&self, node: u32) -> Result<usize, RouteError> {
        let mut dropped = 0;
        self.users.retain(|_, devices| {
            let before = devices.len();
            devices.retain(|_, route| route.node != node);
            dropped += before - devices.len();
            !devices.is_empty()
        });
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(user: &str, device: &str, node: u32, connection: ConnectionId) -> Route {
        Route {
            user: UserId::parse(user).expect("valid"),
            device: DeviceId::parse(device).expect("valid"),
            node,
            connection,
            connected_at_ms: 0,
        }
    }

    #[tokio::test]
    async fn login_replaces_the_same_device_and_logout_needs_the_current_connection() {
        let table = MemoryRouteTable::default();
        assert_eq!(table.login(route("ann", "phone", 0, 1)).await.expect("login"), None);
        assert_eq!(table.login(route("ann", "laptop", 0, 2)).await.expect("login"), None);
        let replaced = table.login(route("ann", "phone", 0, 3)).await.expect("login");
        assert_eq!(replaced.map(|r| r.connection), Some(1));
        let ann = UserId::parse("ann").expect("valid");
        let phone = DeviceId::parse("phone").expect("valid");
        assert!(!table.logout(&ann, &phone, 1).await.expect("logout"), "a stale connection removes nothing");
        assert_eq!(table.devices(&ann).await.expect("devices").len(), 2);
        assert!(table.logout(&ann, &phone, 3).await.expect("logout"));
        assert_eq!(table.drop_gateway(0).await.expect("drop"), 1);
        assert!(table.devices(&ann).await.expect("devices").is_empty());
    }
}
